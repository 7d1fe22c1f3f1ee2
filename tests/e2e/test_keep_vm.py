"""Acceptance test of keeping a plain JVM's connection (issue 30, item 1), with real peers: a
HotSpot JVM running ``Prog`` (``test_bridge_jvm.py``), the real ``jdb``, a real
``ddmd.daemon.run`` (``tests.actors.rawpeers.monitor``).

Two jdb sessions back to back on one JVM: the first sets a breakpoint, hits it and quits while
stopped there (without clearing it); ddmd releases what it held on the same connection. The
second session finds one ddmd->JVM connection throughout (the same local port, counted with
``ss``), the JVM printed its "Listening" line once, no breakpoint of the first session is left
(the program runs past its line, ``clear`` lists none) and its own breakpoint hits.

Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import shutil

import pytest
import trio

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range, monitor
from tests.e2e.test_bridge_jvm import (
    BREAK_LINE,
    BREAKPOINT_HIT,
    MAIN_CALL_LINE,
    WAIT,
    classes,
    jdb_session,
    run_jvm,
    vm_id,
    wait_ready,
    wait_released,
)

__all__ = ["classes"]  # the module's fixture, shared with test_bridge_jvm

pytestmark = pytest.mark.jvm

CAP = 60  # seconds: absolute cap on the test (two jdb sessions)
MAIN_HIT = ("Breakpoint hit:", rf'"thread=main", Prog\.main\(\), line={MAIN_CALL_LINE} bci')
LISTENING = "Listening for transport dt_socket"


async def connections_to(port: int) -> list[str]:
    """The local ends (``ADDRESS:PORT``) of the established TCP connections to 127.0.0.1:PORT
    (``ss -tnH state established dst 127.0.0.1:PORT``)."""
    ss = shutil.which("ss")
    if ss is None:
        skip_or_fail("ss (iproute2) is not installed")
    with trio.fail_after(WAIT):
        result = await trio.run_process(
            [ss, "-tnH", "state", "established", "dst", f"127.0.0.1:{port}"],
            capture_stdout=True,
            capture_stderr=True,
        )
    # With a state filter ss leaves the State column out: Recv-Q Send-Q Local Peer.
    return sorted(line.split()[2] for line in result.stdout.decode().splitlines() if line.strip())


async def test_two_jdb_sessions_share_one_kept_connection(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h, run_jvm(jdk, classes, port) as jvm:
            vm = await wait_ready(h, port)
            assert vm["ddm"] is False
            before = await connections_to(port)
            assert len(before) == 1, before  # ddmd's one connection to the JVM

            # Session 1: a breakpoint, hit; quit while stopped there, the breakpoint left set.
            async with jdb_session(jdk, vm["debugger_port"], "first") as jdb:
                await jdb.attached()
                await jdb.until_stopped(
                    f"stop at Prog:{BREAK_LINE}",
                    rf"Set breakpoint Prog:{BREAK_LINE}",
                    *BREAKPOINT_HIT,
                )
                assert await jdb.quit() == 0, jdb.transcript
            await wait_released(h, port, 1)
            (released,) = h.events("vm.released", vm=vm_id(port))
            assert "connection is kept" in released["how"], released
            assert not h.events("vm.reconnecting")
            assert not h.events("vm.release_unconfirmed")
            assert await connections_to(port) == before  # the same connection, kept

            # Nobody attached: the program runs past the first session's breakpoint line.
            stopped_at = jvm.counter
            await jvm.wait_counter_above(stopped_at + 5)

            # Session 2: nothing of the first is left; its own breakpoint hits.
            async with jdb_session(jdk, vm["debugger_port"], "second") as jdb:
                await jdb.attached()
                assert await connections_to(port) == before
                await jdb.command("clear", r"No breakpoints set\.")
                running = jvm.counter
                await jvm.wait_counter_above(running + 5)  # not stopped at the old line
                await jdb.until_stopped(
                    f"stop at Prog:{MAIN_CALL_LINE}",
                    rf"Set breakpoint Prog:{MAIN_CALL_LINE}",
                    *MAIN_HIT,
                )
                assert f"line={BREAK_LINE} " not in jdb.transcript, jdb.transcript
                assert await jdb.quit() == 0, jdb.transcript
            await wait_released(h, port, 2)
            after = await connections_to(port)
            assert after == before
            print(f"ddmd -> JVM :{port} connections, before: {before}, after both: {after}")
            await jvm.wait_counter_above(jvm.counter + 5)  # released again: it runs
            assert sum(line.startswith(LISTENING) for line in jvm.lines) == 1, jvm.lines[:5]
            assert not h.events("vm.reconnected")
