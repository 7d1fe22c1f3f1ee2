"""Issue 19 acceptance, end to end: the real adb server, the fake device daemon replaying THE
recorded log (tests/logcat/recording.py) and a simulated com.example.mail VM as its device pid
4301, ddmd following them; `ddmd logcat` (the CLI, through the daemon's API) shows exactly the
app's lines, before and after its restart, with one separator; a different app that reuses
the old pid is not shown; the crash gives one app.crashed event; --json fields are stable;
colours only on a terminal; bad input is logged once and the stream reopened, other devices
and VMs untouched; a workstation JVM says it has no logcat.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import Harness, wait_until
from tests.e2e.frontrig import FrontRig, front_rig
from tests.logcat import recording as rec

CAP = 60
WAIT = 15
JSON_FIELDS = {
    "line": {"kind", "seq", "device", "time", "pid", "tid", "level", "tag", "message", "app",
             "buffer", "crash"},
    "restart": {"kind", "seq", "device", "app", "old_pid", "new_pid", "text"},
}  # fmt: skip


@dataclass
class LogRig:
    rig: FrontRig
    device: FakeDevice
    sim: SimVm

    @property
    def h(self) -> Harness:
        return self.rig.h


@asynccontextmanager
async def log_rig(tmp_path: Path) -> AsyncIterator[LogRig]:
    """mail's second process (pid 4301) is a simulated VM ddmd holds; the device's log is the
    recording."""
    sim = SimVm(SimConfig(pid=rec.MAIL_PID_2, app_name=rec.MAIL, package_name=rec.MAIL))
    async with trio.open_nursery() as nursery:
        sim_port = await nursery.start(sim.run)
        device = FakeDevice({rec.MAIL_PID_2: ("127.0.0.1", sim_port)}, logcat=rec.STREAM)
        async with front_rig(tmp_path, device) as rig:
            await rig.wait_vm(rec.MAIL_PID_2)
            yield LogRig(rig, device, sim)
        nursery.cancel_scope.cancel()


async def logcat_json(h: Harness, *args: str) -> list[dict]:
    result = await h.cli("logcat", *args, "--json", "-d")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.strip()]


def entry_index(item: dict) -> int:
    """The recording's index of a line item (by pid, tag and message)."""
    for i, entry in enumerate(rec.ENTRIES):
        if (entry.pid, entry.tag, entry.message) == (item["pid"], item["tag"], item["message"]):
            return i
    raise AssertionError(f"not in the recording: {item}")


async def test_an_apps_lines_across_its_restart_and_nothing_of_the_app_that_reuses_its_pid(
    tmp_path,
):
    with trio.fail_after(CAP):
        async with log_rig(tmp_path) as lr:
            items = await logcat_json(lr.h, rec.MAIL)
            lines = [i for i in items if i["kind"] == "line"]
            restarts = [i for i in items if i["kind"] == "restart"]
            shown = {entry_index(item) for item in lines}
            assert set(rec.lines_of(rec.MAIL)) <= shown, sorted(set(rec.lines_of(rec.MAIL)) - shown)
            assert shown <= set(rec.lines_about(rec.MAIL)), sorted(
                shown - set(rec.lines_about(rec.MAIL))
            )
            assert not set(rec.lines_of(rec.OTHER)) & shown  # pid 4242, reused
            assert [(r["old_pid"], r["new_pid"]) for r in restarts] == [
                (rec.MAIL_PID, rec.MAIL_PID_2)
            ]
            assert restarts[0]["text"] == "com.example.mail restarted (pid 4242 \u2192 4301)"
            # The separator sits between the two processes' lines.
            order = [(i["kind"], i.get("pid")) for i in items]
            cut = order.index(("restart", None))
            assert all(pid != rec.MAIL_PID_2 for kind, pid in order[:cut] if kind == "line")
            # --json fields are stable.
            for item in items:
                assert set(item) == JSON_FIELDS[item["kind"]], item
            # The tombstone (written by crash_dump64) is shown with mail, marked native.
            native = [i for i in lines if i["crash"] == "native"]
            assert {entry_index(i) for i in native} == set(rec.crash_lines("native", rec.MAIL))


async def test_text_output_has_colours_only_when_asked_and_shows_the_separator(tmp_path):
    with trio.fail_after(CAP):
        async with log_rig(tmp_path) as lr:
            plain = await lr.h.cli("logcat", rec.MAIL, "-d")
            assert plain.exit_code == 0, plain.output
            assert "\x1b[" not in plain.output  # not a terminal: no colours
            assert "com.example.mail restarted (pid 4242 \u2192 4301)" in plain.output
            assert "!!" in plain.output  # the crash lines stand out
            coloured = await lr.h.cli("logcat", rec.MAIL, "-d", "--color")
            assert "\x1b[" in coloured.output


async def test_each_crash_is_one_app_crashed_event(tmp_path):
    with trio.fail_after(CAP):
        async with log_rig(tmp_path) as lr:
            await logcat_json(lr.h, "--all", "--device", lr.rig.serial)

            def crashes() -> list[dict]:
                return lr.h.events("app.crashed")

            found = await wait_until(lambda: len(crashes()) >= 3, WAIT, what="three crashes")
            assert found
            got = sorted((c["kind"], c["app"], c["pid"]) for c in crashes())
            assert got == [
                ("anr", rec.MAPS, rec.MAPS_PID),
                ("java", rec.MAPS, rec.MAPS_PID),
                ("native", rec.MAIL, rec.MAIL_PID_2),
            ]
            java = next(c for c in crashes() if c["kind"] == "java")
            assert java["lines"][0].startswith("FATAL EXCEPTION")


async def test_filters_are_applied_in_ddmd(tmp_path):
    with trio.fail_after(CAP):
        async with log_rig(tmp_path) as lr:
            warn = await logcat_json(lr.h, "--all", "--device", lr.rig.serial, "--level", "W")
            assert all(i["level"] in "WEF" or i["crash"] for i in warn if i["kind"] == "line"), warn
            tagged = await logcat_json(lr.h, rec.MAIL, "--tag", "Mail Sync")
            assert {i["tag"] for i in tagged if i["kind"] == "line"} == {"Mail Sync"}
            grep = await logcat_json(lr.h, rec.MAIL, "--grep", "restart")
            assert all("restart" in i["message"] for i in grep if i["kind"] == "line")


async def test_a_live_line_reaches_a_follower_and_bad_input_reopens_the_stream(tmp_path):
    with trio.fail_after(CAP):
        async with log_rig(tmp_path) as lr:
            await logcat_json(lr.h, rec.MAIL)  # the stream is open now
            # Garbage on the device's log: logged once, the stream reopened; the VM untouched.
            lr.device.log(b"\xff" * 64)
            await lr.h.wait_event("logcat.stream_problem", timeout=WAIT)
            problems = [
                e for e in lr.h.events("logcat.stream_problem") if e["problem"] == "malformed"
            ]
            assert len(problems) == 1, problems
            from tests.logcat.writer import Record, write_record

            later = Record(rec.BASE_SEC + 100, 5, rec.MAIL_PID_2, rec.MAIL_PID_2, 4, "MailApp",
                           b"after the garbage", 0, rec.MAIL_UID)  # fmt: skip
            lr.device.log(write_record(later))

            async def arrived() -> bool:
                items = await logcat_json(lr.h, rec.MAIL)
                return any(i.get("message") == "after the garbage" for i in items)

            await wait_until(arrived, WAIT, what="a line logged after the garbage")
            vm = await lr.h.vm(lr.rig.vm_id(rec.MAIL_PID_2))
            assert vm is not None
            assert vm["state"] == "ready"


async def test_a_workstation_jvm_has_no_logcat(tmp_path):
    from tests.actors.rawpeers import free_port_range, monitor
    from tests.actors.test_bridge_sim import start_sim, wait_ready

    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await start_sim(h, port)
            await wait_ready(h, port)
            result = await h.cli("logcat", f"tcp:{port}", "-d")
            assert result.exit_code == 1
            assert "not on an Android device: it has no device log" in result.output
