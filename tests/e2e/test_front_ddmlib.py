"""Issue 18 acceptance, ddmlib: the classic ddmlib 25.2.2 of Debian's libandroid-ddms-java
(``tests/e2e/java/DdmlibProbe.java``, driven as DDMS does) pointed at ddmd's adb front instead
of the adb server, with its own debugger ports moved (``DdmPreferences.setDebugPortBase`` /
``setSelectedDebugPort``).

Behind the real Debian adb server (private port) the fake device exposes two VMs, both held
by ddmd: an in-process ``ddmd sim`` VM of the default ``art`` flavour (mapped under its own
pid, so the device pid and its HELO pid agree) and a real HotSpot JVM running ``Prog``. Through
the front ddmlib lists both clients with pid and name (the sim's app name; HotSpot has none),
the sim's threads and its heap info after a GC. While ddmlib stays connected, ``ddmd clients``
lists it as a DDM-only consumer, ``ddmd threads`` works and a jdb on ddmd's per-VM port of the
JVM hits a breakpoint and prints a local. After ddmlib disconnects, ddmd's thread list of the
sim still follows the VM's thread notices: a DDM-only consumer leaving did not turn THEN off,
and it never sent the ART VM a non-DDM packet (which would load ART's debugger agent).

Every wait is bounded (``CAP`` for the whole test, ``WAIT`` for one condition); nothing is
timed.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import free_port_range, wait_until
from tests.adb.test_ddmlib_probe import (
    SIM_APP,
    SIM_PID,
    SIM_THREADS,
    Probe,
    probe_classpath,  # noqa: F401 - a fixture, used by name
)
from tests.e2e.conftest import (
    Jdk,
    jdk,  # noqa: F401 - a fixture, used by name
    require_tool,
)
from tests.e2e.frontrig import FrontRig, front_rig
from tests.e2e.jdbdriver import open_jdb
from tests.e2e.test_bridge_jvm import BREAK_LINE, BREAKPOINT_HIT, Jvm, run_jvm
from tests.e2e.test_multi_debugger import (
    classes,  # noqa: F401 - a fixture, used by name
    local,
)

pytestmark = pytest.mark.jvm

CAP = 180  # seconds: an adb server, a device, two VMs, ddmlib's start-up, a jdb session
WAIT = 40  # seconds: one condition (ddmlib polls once a second at worst)
PROBE_TOOL = "java (ddmlib)"  # what ddmd/toolnames.py calls a java process running ddmlib


# --------------------------------------------------------------------------------------------
# Helpers


@asynccontextmanager
async def run_probe_at_front(rig: FrontRig, classpath: str) -> AsyncIterator[Probe]:
    """The probe with ``--stay``, its adb server port the FRONT's, given both ways ddmlib reads
    it (the system property first, then the environment variable); ddmlib's debugger ports
    moved to free ports. Killed on the way out if it is still running."""
    base, _, selected = free_port_range(3)
    argv = [
        require_tool("java"),
        f"-DANDROID_ADB_SERVER_PORT={rig.front_port}",
        "-cp",
        classpath,
        "DdmlibProbe",
        "--base",
        str(base),
        "--selected",
        str(selected),
        "--clients",
        "2",
        "--ddm-clients",
        "1",
        "--timeout",
        str(WAIT),
        "--stay",
    ]
    env = {**rig.adb.env, "ANDROID_ADB_SERVER_PORT": str(rig.front_port)}
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env
    )
    probe = Probe(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe._read)
            try:
                yield probe
            finally:
                with trio.move_on_after(10) as cleanup:
                    cleanup.shield = True
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
    finally:
        if process.returncode is None:
            process.kill()


async def cli_json(rig: FrontRig, *args: str) -> Any:
    result = await rig.h.cli(*args, "--json")
    assert result.exit_code == 0, (args, result.output, result.exception)
    return json.loads(result.output)


def thread_names(body: Any) -> list[str]:
    """The thread names in ``ddmd threads --json``, sorted."""
    assert body["threads"] is not None, body
    return sorted(str(t["name"]) for t in body["threads"])


async def churned(rig: FrontRig, sim: SimVm, sim_id: str, before: list[str]) -> list[str]:
    """One thread event in the sim (a thread starts, dies or is renamed); ddmd's thread names
    once its list shows it."""
    await sim.churn()

    async def changed() -> list[str] | None:
        names = thread_names(await cli_json(rig, "threads", sim_id))
        return names if names != before else None

    after: list[str] = await wait_until(changed, WAIT, what="ddmd's thread list after a churn")
    assert len(after) == sim.statistics().live_threads, (before, after)
    # A thread ddmd knows from a THST poll alone has no name: names come with THCR/THNM.
    assert all(set(after) - set(before)), (before, after)
    return after


def probe_consumers(vm: dict[str, Any]) -> list[dict[str, Any]]:
    """The consumers of ``vm`` that came through the front (here: ddmlib's sockets)."""
    return [d for d in vm["debuggers"] if d["via"] == "front"]


# --------------------------------------------------------------------------------------------
# The test


async def test_ddmlib_through_the_front_shares_an_art_sim_and_a_hotspot_jvm_with_ddmd(
    jdk: Jdk,  # noqa: F811
    classes: Path,  # noqa: F811
    probe_classpath: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    (jvm_port,) = free_port_range(1)
    sim = SimVm(SimConfig(pid=SIM_PID, app_name=SIM_APP, churn_interval=0, gc_interval=0))
    with trio.fail_after(CAP):
        async with trio.open_nursery() as sims:
            sim_port = await sims.start(sim.run)
            async with run_jvm(jdk, classes, jvm_port) as jvm:
                jvm_pid = jvm.process.pid
                device = FakeDevice(
                    {SIM_PID: ("127.0.0.1", sim_port), jvm_pid: ("127.0.0.1", jvm_port)},
                    process_names={SIM_PID: SIM_APP, jvm_pid: "Prog"},
                )
                async with front_rig(tmp_path, device) as rig:
                    await scenario(rig, sim, jvm, jvm_pid, jdk, probe_classpath)
            sims.cancel_scope.cancel()


async def scenario(
    rig: FrontRig, sim: SimVm, jvm: Jvm, jvm_pid: int, java: Jdk, classpath: str
) -> None:
    sim_id, jvm_id = rig.vm_id(SIM_PID), rig.vm_id(jvm_pid)
    await rig.wait_vm(SIM_PID)
    await rig.wait_vm(jvm_pid)
    # "ready" comes before the per-VM debugger port is open.
    jvm_vm = await rig.h.wait_vm(jvm_id, lambda v: v["debugger_port"] is not None, timeout=WAIT)
    device = rig.adb.device
    assert device.open_jdwp_streams(SIM_PID) == 1  # ddmd's
    assert device.open_jdwp_streams(jvm_pid) == 1
    jdwp_before = sim.statistics().jdwp_requests
    gcs_before = sim.statistics().gcs

    async with run_probe_at_front(rig, classpath) as probe:
        await probe.wait_for("done", lambda: probe.events("done"), patience=WAIT)

        # What ddmlib saw, all through the front.
        serial = rig.serial
        assert probe.events("device", serial=serial, state="ONLINE"), probe.lines
        clients = {e["pid"]: e for e in probe.events("client", serial=serial)}  # last of each
        assert set(clients) == {SIM_PID, jvm_pid}, probe.lines
        art = clients[SIM_PID]
        assert (art["name"], art["ddm"], art["vm"]) == (SIM_APP, True, "Dalvik v2.1.0"), art
        hotspot = clients[jvm_pid]
        assert (hotspot["name"], hotspot["ddm"]) == (None, False), hotspot
        assert art["debugPort"] != hotspot["debugPort"]
        threads = probe.events("threads", pid=SIM_PID)[-1]["threads"]
        assert threads[0] == "main", threads
        assert len(threads) == SIM_THREADS, threads
        (heap,) = probe.events("heap", pid=SIM_PID)[-1]["heaps"].values()
        assert heap["sizeInBytes"] == 4 * 1024 * 1024  # SimConfig.heap_mb
        assert 0 < heap["bytesAllocated"] <= heap["sizeInBytes"]
        assert heap["objectsAllocated"] > 0
        assert sim.statistics().gcs > gcs_before  # the GC ddmlib asked for
        assert not probe.events("threads", pid=jvm_pid)
        assert not probe.events("heap", pid=jvm_pid)
        # ddmd served ddmlib's jdwp:PID itself: the device still has one stream per VM.
        assert device.open_jdwp_streams(SIM_PID) == 1
        assert device.open_jdwp_streams(jvm_pid) == 1

        # Another GC on request: heap info again.
        heaps = len(probe.events("heap", pid=SIM_PID))
        gcs = sim.statistics().gcs
        assert probe.process.stdin is not None
        await probe.process.stdin.send_all(b"gc\n")
        await probe.wait_for(
            "heap info after the 'gc' command",
            lambda: len(probe.events("heap", pid=SIM_PID)) > heaps,
            patience=WAIT,
        )
        assert sim.statistics().gcs > gcs

        # Meanwhile ddmd: `clients` lists both VMs, ddmlib as a DDM-only consumer of each.
        async def both_consumed() -> list[dict[str, Any]] | None:
            vms: list[dict[str, Any]] = await cli_json(rig, "clients")
            by_id = {vm["id"]: vm for vm in vms}
            if not {sim_id, jvm_id} <= set(by_id):
                return None
            if not all(probe_consumers(by_id[i]) for i in (sim_id, jvm_id)):
                return None
            return vms

        vms = await wait_until(both_consumed, WAIT, what="ddmlib listed as a consumer")
        by_id = {vm["id"]: vm for vm in vms}
        for vm_id in (sim_id, jvm_id):
            (consumer,) = probe_consumers(by_id[vm_id])
            assert consumer["tool"] == PROBE_TOOL, consumer
            assert consumer["debugging"] is False, consumer  # DDM only: not a debugger
        assert by_id[sim_id]["pid"] == SIM_PID, by_id[sim_id]
        table = await rig.h.cli("clients")
        assert table.exit_code == 0, table.output
        # The tool, its pid and "(DDM only)" (issue 20: a client is its tool and pid).
        shown = re.search(rf"{re.escape(PROBE_TOOL)} pid \d+ \(DDM only\)", table.output)
        assert shown, table.output
        # `threads` works.
        listed = await cli_json(rig, "threads", sim_id)
        assert "main" in thread_names(listed), listed
        assert len(thread_names(listed)) == SIM_THREADS, listed
        # A thread event of the VM reaches both ddmd and ddmlib (the push is fanned out).
        after = await churned(rig, sim, sim_id, thread_names(listed))
        await probe.wait_for(
            "ddmlib's thread list after a churn",
            lambda: sorted(probe.events("threads", pid=SIM_PID)[-1]["threads"]) == after,
            patience=WAIT,
        )

        # A jdb on ddmd's per-VM port of the JVM hits a breakpoint and prints a local.
        async with open_jdb(java.jdb, jvm_vm["debugger_port"], name="jdb") as jdb:
            await jdb.attached()
            await jdb.until_stopped(
                f"stop at Prog:{BREAK_LINE}", rf"Set breakpoint Prog:{BREAK_LINE}", *BREAKPOINT_HIT
            )
            n = await local(jdb, "n")
            assert n > 0
            vm = await rig.wait_vm(jvm_pid)
            # (ddmd names the tool of front sockets only: jdb on its own port has none.)
            kinds = sorted((d["via"], d["debugging"]) for d in vm["debuggers"])
            assert kinds == [("front", False), ("vm-port", True)], vm["debuggers"]
            await jdb.command(f"clear Prog:{BREAK_LINE}", rf"Removed: breakpoint Prog:{BREAK_LINE}")
            await jdb.send("cont")
            assert await jdb.quit() == 0, jdb.transcript
        await jvm.wait_counter_above(n + 5)

        # ddmlib is still connected: the jdb session did not disturb it.
        assert probe.process.returncode is None, probe.lines

        # Closing stdin ends it cleanly: ddmlib lets go of both VMs.
        await probe.process.stdin.aclose()
        with trio.fail_after(WAIT):
            status = await probe.process.wait()
        await probe.wait_for("the bye line", lambda: probe.events("bye"))
        assert status == 0, probe.lines

    async def consumers_gone() -> bool:
        vms = await cli_json(rig, "clients")
        by_id = {vm["id"]: vm for vm in vms}
        return all(not probe_consumers(by_id[i]) for i in (sim_id, jvm_id))

    await wait_until(consumers_gone, WAIT, what="ddmlib's consumers gone from ddmd")

    # The DDM-only consumer never sent the ART VM a non-DDM packet.
    assert sim.statistics().jdwp_requests == jdwp_before, sim.statistics()
    # ddmd's own thread notices are still on, and its thread list still follows the VM.
    assert sim.statistics().thread_notify, sim.statistics()
    # Churn until a thread starts or is renamed (a death shows in a THST poll too): with no
    # more than two short-lived threads in the sim that takes three churns at most.
    names = thread_names(await cli_json(rig, "threads", sim_id))
    for _ in range(3):
        after = await churned(rig, sim, sim_id, names)
        if set(after) - set(names):
            break
        names = after
    else:
        raise AssertionError(f"no thread started or renamed in three churns: {after}")
    assert device.open_jdwp_streams(SIM_PID) == 1  # still ddmd's one connection
    assert device.open_jdwp_streams(jvm_pid) == 1
    assert not rig.h.events("debugger.rejected")
