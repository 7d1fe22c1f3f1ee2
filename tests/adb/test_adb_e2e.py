"""End to end with real peers through adb: the real ``jdb`` -> ddmd (current-VM port or a
per-VM port) -> ddmd's VM connection -> the fake adb server's ``jdwp:PID`` -> a real HotSpot JVM.

The JVM program, its runner and the jdb breakpoint session come from
``tests/e2e/test_bridge_jvm.py`` (and the ``jdk`` fixture from ``tests/e2e/conftest.py``), so
both suites drive the same real peers the same way. The JVMs listen on free ports outside
ddmd's scan range: only the fake adb server reaches them. Device pids are the JVMs' real pids.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import trio

from tests.actors.rawpeers import free_port_range, wait_until
from tests.e2e.conftest import jdk  # noqa: F401 - a fixture, used by name
from tests.e2e.test_bridge_jvm import (
    BREAK_LINE,
    BREAKPOINT_HIT,
    breakpoint_session,
    classes,  # noqa: F401 - a fixture, used by name
    jdb_session,
    run_jvm,
)

from .fakeadb import Rig, adb_rig

pytestmark = pytest.mark.jvm

CAP = 45  # seconds: absolute cap on every test
PHONE = "emulator-5554"
TABLET = "R58M123ABC"


async def clients(rig: Rig) -> set[str]:
    result = await rig.h.cli("clients", "--json")
    assert result.exit_code == 0, result.output
    return {vm["id"] for vm in json.loads(result.output)}


async def select(rig: Rig, target: str, *extra: str) -> dict[str, Any]:
    result = await rig.h.cli("select", target, *extra, "--json")
    assert result.exit_code == 0, result.output
    body: dict[str, Any] = json.loads(result.output)
    return body


async def test_jdb_through_ddmd_and_adb_to_a_hotspot_jvm(jdk, classes, tmp_path):  # noqa: F811
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig, run_jvm(jdk, classes, port) as jvm:
            h = rig.h
            pid = jvm.process.pid
            vm_id = f"{PHONE}/{pid}"
            # Plugged in while ddmd runs: listed by `ddmd clients` within 2 s.
            rig.plug(PHONE, {pid: port}, model="Pixel_7")
            await wait_until(lambda: _has(rig, vm_id), 2.0, what=f"{vm_id} in `ddmd clients`")
            vm = await rig.wait_ready(vm_id, timeout=10)
            assert vm["ddm"] is False  # HotSpot answers DDM with error 99
            assert (await select(rig, str(pid), "--device", PHONE))["vm"]["id"] == vm_id

            async with jdb_session(jdk, h.started.current_port, "via-adb") as jdb:
                n = await breakpoint_session(jdb, jvm)
                assert await jdb.quit() == 0, jdb.transcript
            # The VM keeps running; ddmd released it on its kept jdwp:PID stream (a plain JVM).
            await jvm.wait_counter_above(n + 3)
            await h.wait_event("vm.released", vm=vm_id, timeout=10)
            assert not h.events("vm.reconnected", vm=vm_id)
            assert rig.fake.requested(f"{PHONE}:jdwp:{pid}") == 1
            await rig.wait_ready(vm_id, timeout=10)
            assert h.events("debugger.dispose", vm=vm_id)
            await rig.assert_desk_undisturbed()


async def _has(rig: Rig, vm_id: str) -> bool:
    return vm_id in await clients(rig)


async def test_unplugging_disconnects_an_attached_jdb_and_the_jvm_resumes(
    jdk,  # noqa: F811
    classes,  # noqa: F811
    tmp_path,
):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path) as rig, run_jvm(jdk, classes, port) as jvm:
            h = rig.h
            pid = jvm.process.pid
            vm_id = f"{PHONE}/{pid}"
            rig.plug(PHONE, {pid: port})
            vm = await rig.wait_ready(vm_id, timeout=10)
            async with jdb_session(jdk, int(vm["debugger_port"]), "unplugged") as jdb:
                await jdb.attached()
                await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                text = await jdb.command("print n", r"\bn = (\d+)")
                n = int(re.search(r"\bn = (\d+)", text).group(1))  # type: ignore[union-attr]
                # Unplugged; the fake keeps the streams open, so ddmd acts on the list alone.
                rig.fake.remove_device(PHONE, close_streams=False)
                await jdb.wait_exit()
                assert "disconnected" in jdb.transcript.lower(), jdb.transcript
            lost = await h.wait_event("vm.lost", vm=vm_id)
            assert "unplugged" in lost["reason"], lost
            assert lost["debugger"], lost
            await h.wait_event("debugger.detached", vm=vm_id)
            # ddmd's connection closed, so the JVM dropped the breakpoint and runs on.
            await jvm.wait_counter_above(n + 3)

            async def gone() -> bool:
                return vm_id not in await clients(rig)

            await wait_until(gone, 5, what=f"{vm_id} gone from `ddmd clients`")
            await rig.assert_desk_undisturbed()


async def test_two_devices_with_the_same_pid_are_debuggable_separately(
    jdk,  # noqa: F811
    classes,  # noqa: F811
    tmp_path,
):
    first_port, second_port = free_port_range(2)
    pid = 31337
    with trio.fail_after(CAP):
        async with (
            adb_rig(tmp_path, desk=False) as rig,
            run_jvm(jdk, classes, first_port) as on_phone,
            run_jvm(jdk, classes, second_port) as on_tablet,
        ):
            rig.plug(PHONE, {pid: first_port})
            rig.plug(TABLET, {pid: second_port})
            phone = await rig.wait_ready(f"{PHONE}/{pid}", timeout=10)
            tablet = await rig.wait_ready(f"{TABLET}/{pid}", timeout=10)
            assert await clients(rig) == {f"{PHONE}/{pid}", f"{TABLET}/{pid}"}
            for vm, jvm, other in ((phone, on_phone, on_tablet), (tablet, on_tablet, on_phone)):
                async with jdb_session(jdk, int(vm["debugger_port"]), str(vm["id"])) as jdb:
                    await jdb.attached()
                    await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                    text = await jdb.command("print n", r"\bn = (\d+)")
                    n = int(re.search(r"\bn = (\d+)", text).group(1))  # type: ignore[union-attr]
                    # Only this JVM is stopped: the other one keeps counting.
                    await other.wait_counter_above(other.counter + 3)
                    assert jvm.counter < n
                    assert await jdb.quit() == 0, jdb.transcript
                await jvm.wait_counter_above(n + 3)
