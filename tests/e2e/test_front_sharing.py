"""Issue 18 acceptance, sharing: one HotSpot JVM, seen as a device pid through the real adb
server and the fake device daemon, is held by ddmd; at the same time two jdb through one
`adb forward` made at ddmd's adb front and a third jdb on ddmd's per-VM port each hit their own
breakpoint and print a local, while ddmd's monitoring goes on. The same forward made on the
real server fails: the front is what makes the sharing work.
"""

from __future__ import annotations

import pytest
import trio

from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import free_port_range, wait_until
from tests.e2e.conftest import jdk  # noqa: F401 - a fixture, used by name
from tests.e2e.frontrig import WAIT, front_rig
from tests.e2e.jdbdriver import open_jdb
from tests.e2e.test_bridge_jvm import BREAK_LINE, BREAKPOINT_HIT, MAIN_CALL_LINE, run_jvm
from tests.e2e.test_multi_debugger import (
    MAIN_HIT,
    classes,  # noqa: F401 - a fixture, used by name
    local,
)

pytestmark = pytest.mark.jvm

CAP = 120  # seconds: three jdb sessions, an adb server, a device


async def stop_once(jdb, line: int, pattern: tuple[str, str], variable: str) -> int:
    """Set a breakpoint, wait for the hit, read a local, clear it and let the program go."""
    # The hit may be printed before or inside "Set breakpoint": matched in any order.
    await jdb.until_stopped(f"stop at Prog:{line}", rf"Set breakpoint Prog:{line}", *pattern)
    value = await local(jdb, variable)
    await jdb.command(f"clear Prog:{line}", rf"Removed: breakpoint Prog:{line}")
    await jdb.send("cont")
    return value


async def test_two_jdb_through_a_front_forward_and_one_on_ddmds_port_share_one_vm(
    jdk,  # noqa: F811
    classes,  # noqa: F811
    tmp_path,
):
    (jvm_port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with run_jvm(jdk, classes, jvm_port) as jvm:
            pid = jvm.process.pid
            device = FakeDevice({pid: ("127.0.0.1", jvm_port)})
            async with front_rig(tmp_path, device) as rig:
                vm = await rig.wait_vm(pid)
                forward = await rig.forward(pid)  # through ddmd's front
                listed = await rig.adb_front("forward", "--list")
                assert f"{rig.serial} tcp:{forward} jdwp:{pid}" in listed.stdout.decode()

                async with (
                    open_jdb(jdk.jdb, forward, name="A") as a,
                    open_jdb(jdk.jdb, forward, name="B") as b,
                    open_jdb(jdk.jdb, vm["debugger_port"], name="C") as c,
                ):
                    for jdb in (a, b, c):
                        await jdb.attached()
                    n = await stop_once(a, BREAK_LINE, BREAKPOINT_HIT, "n")
                    counter = await stop_once(b, MAIN_CALL_LINE, MAIN_HIT, "counter")
                    assert counter > n
                    m = await stop_once(c, BREAK_LINE, BREAKPOINT_HIT, "n")
                    assert m > counter

                    # ddmd lists all three, each named by its program, and still monitors
                    # the VM.
                    async def named() -> list[dict[str, object]] | None:
                        found = await rig.h.vm(rig.vm_id(pid))
                        clients = (found or {}).get("debuggers") or []
                        return clients if [d["tool"] for d in clients] == ["jdb"] * 3 else None

                    clients = await wait_until(named, WAIT, what="three jdb clients")
                    vias = sorted(str(d["via"]) for d in clients)
                    assert vias == ["front-forward", "front-forward", "vm-port"], clients
                    assert all(d["debugging"] for d in clients), clients
                    for jdb in (a, b, c):
                        assert await jdb.quit() == 0, jdb.transcript
                await jvm.wait_counter_above(m + 5)
                assert not rig.h.events("debugger.rejected")

                # The control: the same forward on the real server, while ddmd holds the VM.
                direct = await rig.forward(pid, front=False)
                async with open_jdb(jdk.jdb, direct, name="D") as d:
                    await d.expect(r"handshake failed|Unable to attach")
