"""Issue 20, friction 3: `ddmd events` with ``ddmd sysmon`` running stays readable.

`ddmd events` runs (click's CliRunner) against a fake event stream: a canned
``text/event-stream`` body served by the control app through ``httpx.ASGITransport``
(``test_events.canned_stream``). Checked: an ``ext.updated`` of ``ddmd sysmon`` is one short
summary line (its five-minute history only in ``--json``); thread counts add up; a TARGET and
``--type`` patterns filter the stream, also for VMs that start or are named later.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ddmd.cli.events import EventFilter, event_line, target_matches, thread_states
from ddmd.control.events import make_event
from tests.control.fakes import FakeVm
from tests.control.test_events import canned_stream, invoke

HISTORY_POINTS = 300  # five minutes, one report a second


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))


def ts(second: int) -> str:
    return f"2024-05-01T12:00:{second:02d}.000001Z"


def snapshot(vm: str, pid: int, app: str | None, device: str | None = None) -> dict[str, Any]:
    return {"id": vm, "pid": pid, "app": app, "package": app, "device": device, "name": app}


def sysmon_value() -> dict[str, Any]:
    start = 1_714_564_800_000
    return {
        "kind": "system monitor",
        "latest": {
            "timestamp_ms": start + HISTORY_POINTS * 1000,
            "load": [0.52, 0.4, 0.35],
            "mem_total_kib": 16 * 1024 * 1024,
            "mem_available_kib": 9 * 1024 * 1024,
            "mem_free_kib": 2 * 1024 * 1024,
            "swap_total_kib": 0,
            "swap_free_kib": 0,
            "mem_used_share": 0.4375,
            "cpu_period_ms": 1000,
            "cpu_busy": [0.1, 0.2, 0.05, 0.13],
        },
        "history": [[start + i * 1000, 0.5, 0.43] for i in range(HISTORY_POINTS)],
    }


def threads(states: dict[str | None, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for state, n in states.items():
        out += [
            {"id": len(out) + i + 1, "name": f"t{len(out) + i}", "state": state} for i in range(n)
        ]
    return out


# ------------------------------------------------------------------------------ one line each


def test_sysmon_ext_updated_is_one_short_summary_line_and_json_keeps_the_history(monkeypatch):
    update = make_event("ext.updated", ts=ts(1), vm="tcp:8003", ext={"sysmon": sysmon_value()})
    assert len(json.dumps(update)) > 5000  # the several-KB line of the issue
    canned_stream(monkeypatch, [update, make_event("daemon.stopping", ts=ts(2))])

    human = invoke()
    assert human.exit_code == 0, human.output
    line, stopping = human.stdout.splitlines()
    assert stopping.startswith("12:00:02 daemon.stopping")
    assert line.startswith("12:00:01 ext.updated")
    assert len(line) < 200, line
    assert line.endswith(
        "tcp:8003: sysmon: system monitor: load 0.52 0.40 0.35, memory 44 % used of 16.0 GiB, "
        f"CPU 12 % (4 CPUs), {HISTORY_POINTS} history points (--json)"
    )

    as_json = invoke("--json")
    assert as_json.exit_code == 0, as_json.output
    first = json.loads(as_json.stdout.splitlines()[0])
    assert first == update
    assert len(first["ext"]["sysmon"]["history"]) == HISTORY_POINTS


def test_any_other_handlers_value_is_summarised_too():
    value = {"kind": "battery", "level": 87, "charging": True, "samples": list(range(900))}
    line = event_line(make_event("ext.updated", ts=ts(3), vm="tcp:8004", ext={"bat": value}))
    assert line.endswith("tcp:8004: bat: battery, level=87, charging=true, samples: 900 items")


def test_thread_counts_add_up():
    # The line: 12 threads, 8 with a state.
    twelve = threads({"running": 1, "timed-wait": 1, "wait": 6, None: 4})
    assert thread_states(twelve) == "12 threads (running 1, timed-wait 1, wait 6, 4 other)"
    assert thread_states(threads({"wait": 2, "native": 1})) == "3 threads (native 1, wait 2)"
    assert thread_states(threads({None: 5})) == "5 threads"
    assert thread_states(threads({"running": 1})) == "1 thread (running 1)"
    line = event_line(make_event("threads.updated", ts=ts(4), vm="tcp:8000", threads=twelve))
    assert line == (
        "12:00:04 threads.updated          tcp:8000: "
        "12 threads (running 1, timed-wait 1, wait 6, 4 other)"
    )
    # Every count in the parentheses is part of the total.
    counts = [int(p.split()[-2 if p.endswith("other") else -1]) for p in _inside(line).split(", ")]
    assert sum(counts) == 12


def _inside(line: str) -> str:
    return line[line.index("(") + 1 : line.rindex(")")]


# ------------------------------------------------------------------------------ filters

MAIL, NOTES = "com.example.mail", "com.example.notes"


def story() -> list[dict[str, Any]]:
    """Two VMs at the start; a third starts unnamed and is named (APNM) later."""
    return [
        make_event(
            "stream.opened",
            ts=ts(0),
            current=None,
            vms=[snapshot("tcp:8000", 3101, MAIL), snapshot("tcp:8001", 3102, NOTES)],
        ),
        make_event("debugger.attached", ts=ts(1), vm="tcp:8000", debugger="a via current"),
        make_event("debugger.attached", ts=ts(2), vm="tcp:8001", debugger="b via vm-port"),
        make_event("threads.updated", ts=ts(3), vm="tcp:8000", threads=threads({"wait": 2})),
        make_event("current.changed", ts=ts(4), vm=None, previous="tcp:8000"),
        make_event(
            "vm.found",
            ts=ts(5),
            vm="emulator-5554/4242",
            snapshot=snapshot("emulator-5554/4242", 4242, "<pre-initialized>", "emulator-5554"),
        ),
        make_event(
            "vm.renamed",
            ts=ts(6),
            vm="emulator-5554/4242",
            app="com.example.mail:sync",
            package=MAIL,
            previous_app="<pre-initialized>",
            previous_package="<pre-initialized>",
        ),
        make_event(
            "debugger.detached", ts=ts(7), vm="emulator-5554/4242", debugger="c via current"
        ),
        make_event("device.changed", ts=ts(8), device="emulator-5554", state="device"),
        make_event("debugger.detached", ts=ts(9), vm="tcp:8000", debugger="a via current"),
        make_event("vm.gone", ts=ts(10), vm="tcp:8000", snapshot=snapshot("tcp:8000", 3101, MAIL)),
        make_event("daemon.stopping", ts=ts(11)),
    ]


def running() -> tuple[FakeVm, ...]:
    """The VMs the daemon lists when the story starts (a TARGET is checked against them)."""
    return (
        FakeVm.plain_jvm("tcp:8000", pid=3101, app=MAIL, package=MAIL),
        FakeVm.plain_jvm("tcp:8001", pid=3102, app=NOTES, package=NOTES),
    )


def shown(*args: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    canned_stream(monkeypatch, story(), vms=running())
    result = invoke("--json", *args)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    return [(e["event"], e.get("vm")) for e in events]


def test_a_target_and_a_type_pattern(monkeypatch):
    # The example: the mail app's debuggers, also those of a mail VM that starts
    # (and is named) later. The stream's own events always pass a target, not a --type.
    assert shown("mail", "--type", "debugger.*", monkeypatch=monkeypatch) == [
        ("debugger.attached", "tcp:8000"),
        ("debugger.detached", "emulator-5554/4242"),
        ("debugger.detached", "tcp:8000"),
    ]


def test_a_target_alone_keeps_the_streams_own_events(monkeypatch):
    assert shown("tcp:8001", monkeypatch=monkeypatch) == [
        ("stream.opened", None),
        ("debugger.attached", "tcp:8001"),
        ("daemon.stopping", None),
    ]
    # current.changed counts for the previous current VM too; a pid is a target.
    assert ("current.changed", None) in shown("3101", monkeypatch=monkeypatch)


def test_type_patterns_repeat_or_use_commas(monkeypatch):
    by_comma = shown("--type", "vm.found,vm.gone", monkeypatch=monkeypatch)
    assert by_comma == [("vm.found", "emulator-5554/4242"), ("vm.gone", "tcp:8000")]
    repeated = shown("--type", "vm.found", "--type", "vm.gone", monkeypatch=monkeypatch)
    assert repeated == by_comma


def test_device_narrows_to_that_devices_vms(monkeypatch):
    names = shown("mail", "--device", "emulator-5554", monkeypatch=monkeypatch)
    # Its vm.found named no app yet ("<pre-initialized>"): the events from its rename on.
    assert names == [
        ("stream.opened", None),
        ("vm.renamed", "emulator-5554/4242"),
        ("debugger.detached", "emulator-5554/4242"),
        ("daemon.stopping", None),
    ]


def test_count_counts_only_the_events_shown(monkeypatch):
    canned_stream(monkeypatch, story())
    result = invoke("--json", "--type", "debugger.*", "--count", "2")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["vm"] for line in result.stdout.splitlines()] == [
        "tcp:8000",
        "tcp:8001",
    ]


def test_human_lines_are_filtered_the_same_way(monkeypatch):
    canned_stream(monkeypatch, story(), vms=running())
    result = invoke("notes")
    assert result.exit_code == 0, result.output
    assert [line.split()[1] for line in result.stdout.splitlines()] == [
        "stream.opened",
        "debugger.attached",
        "daemon.stopping",
    ]


@pytest.mark.parametrize(
    ("target", "matches"),
    [
        ("tcp:8000", True),
        ("3101", True),
        ("310", False),  # a pid matches whole
        (MAIL, True),
        ("mail", True),  # the end of a name at a dot
        (".MAIL", True),  # ignoring case
        ("exam", True),  # a part of a name
        ("notes", False),
        ("pre-init", False),  # never the placeholder name
    ],
)
def test_target_rules(target, matches):
    vm = snapshot("tcp:8000", 3101, MAIL)
    assert target_matches(target, vm) is matches
    assert target_matches("pre-init", snapshot("tcp:1", 1, "<pre-initialized>")) is False


def test_the_filter_forgets_a_vm_that_is_gone():
    wanted = EventFilter("mail")
    for event in story():
        wanted(event)
        wanted.forget_gone(event)
    late = make_event("debugger.attached", ts=ts(12), vm="tcp:8000", debugger="d via current")
    assert wanted(late) is False  # tcp:8000 is gone; a new VM there is named by its own events


def test_an_unknown_target_is_refused_with_the_candidates(monkeypatch):
    # As every command refuses a TARGET that names no VM: exit 2, the VMs one per line.
    canned_stream(monkeypatch, story(), vms=running())
    result = invoke("nosuch")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "ddmd events: no VM matches 'nosuch'; candidates:"
    assert [line.split()[0] for line in lines[1:]] == ["tcp:8000", "tcp:8001"]


def test_a_target_that_names_a_remembered_app_waits_for_it(monkeypatch):
    # An app not running now but with a remembered debugger port is one the daemon knows: its
    # events are shown when it starts (here: none before the stream ends).
    from ddmd.cli import client as cli_client

    canned_stream(monkeypatch, story(), vms=running())
    asked = []

    async def remembered(api, method, path, **kwargs):
        asked.append(path)
        if path.endswith("/ports"):
            return {"ports": [{"device": "emulator-5554", "app": "com.example.calendar"}]}
        return await real_call(api, method, path, **kwargs)

    real_call = cli_client.Api.call
    monkeypatch.setattr(cli_client.Api, "call", remembered)
    result = invoke("--json", "calendar")
    assert result.exit_code == 0, result.output
    assert asked[:2] == ["/api/v1/vms", "/api/v1/ports"]


def test_human_lines_name_the_app_next_to_the_vm_id(monkeypatch):
    canned_stream(monkeypatch, story(), vms=running())
    result = invoke("--type", "debugger.*")
    lines = result.stdout.splitlines()
    assert lines[0].endswith(" debugger.attached        tcp:8000 (com.example.mail): a via current")
    assert lines[1].endswith("tcp:8001 (com.example.notes): b via vm-port")
    # A VM is named once its name is known (vm.renamed), not by its placeholder.
    assert lines[2].endswith("emulator-5554/4242 (com.example.mail:sync): c via current")
