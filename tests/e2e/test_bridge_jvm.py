"""Acceptance tests of the debugger bridge with real peers: HotSpot JVMs, the real ``jdb``,
and ``SimVm``s, all reached through a real ``ddmd.daemon.run`` on free loopback ports.

Every test runs the daemon with ``tests.actors.rawpeers.monitor`` (scan range of free ports,
scan interval 0.2 s, free control/current/per-VM ports, port book in ``tmp_path``, structlog
events captured) and drives jdb expect-style (``tests.e2e.jdbdriver``). Every wait is bounded;
nothing is timed: "the program runs" means its printed counter advances, "it is stopped"
is only ever read off jdb's own output.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from ddmd.sim import SimConfig, SimVm
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until
from tests.e2e.conftest import Jdk, require_tool
from tests.e2e.jdbdriver import THREAD_PROMPT, Jdb, open_jdb
from tests.e2e.lines import ProcessLines

pytestmark = pytest.mark.jvm

CAP = 40  # seconds: absolute cap on every test (a jdb session takes about 1 s)
WAIT = 10  # seconds: cap on one condition

PROG = """\
public class Prog {
    public static void main(String[] args) throws Exception {
        System.out.println("started");
        int counter = 0;
        while (true) {
            counter++;
            tick(counter);
            Thread.sleep(20);
        }
    }

    static void tick(int n) {
        int doubled = n * 2;
        System.out.println("tick " + n + " " + doubled); // BREAK
    }
}
"""
BREAK_LINE = next(i for i, line in enumerate(PROG.splitlines(), 1) if "// BREAK" in line)
NEXT_LINE = BREAK_LINE + 1
MAIN_CALL_LINE = next(i for i, line in enumerate(PROG.splitlines(), 1) if "tick(counter)" in line)
TICK = re.compile(r"^tick (\d+) (\d+)$")
# jdb prints "Breakpoint hit: " and the location with separate calls; other output may come
# between them, so they are two patterns.
BREAKPOINT_HIT = ("Breakpoint hit:", rf'"thread=main", Prog\.tick\(\), line={BREAK_LINE} bci')
MAIN_THREAD = re.compile(r"\(java\.lang\.Thread\)\d+ +main +(\S[^\n]*)")


# --------------------------------------------------------------------------------------------
# The Java program (``jdk`` and ``require_tool`` come from tests/e2e/conftest.py)


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    """Prog.java compiled with -g (local variables for ``print``), once per module."""
    javac = require_tool("javac")
    out = tmp_path_factory.mktemp("prog")
    (out / "Prog.java").write_text(PROG)
    subprocess.run(
        [javac, "-g", "-d", str(out), str(out / "Prog.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


class Jvm(ProcessLines):
    """A HotSpot JVM running Prog with the JDWP agent listening on ``port``."""

    def __init__(self, process: trio.Process, port: int) -> None:
        super().__init__(process)
        self.port = port

    @property
    def started(self) -> bool:
        return "started" in self.lines

    @property
    def counter(self) -> int:
        """The last ``tick N`` printed (0 before the first)."""
        for line in reversed(self.lines):
            match = TICK.match(line)
            if match:
                return int(match.group(1))
        return 0

    async def wait_line(self, predicate: Any, what: str) -> None:
        try:
            with trio.fail_after(WAIT):
                while not any(predicate(line) for line in self.lines):
                    if self.process.returncode is not None:
                        raise AssertionError(f"the JVM exited before {what}: {self.lines[-20:]}")
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(
                f"the JVM printed no {what} within {WAIT} s; last lines: {self.lines[-10:]}"
            ) from None

    async def wait_counter_above(self, value: int) -> int:
        """Wait until the program has printed a counter above ``value`` (it is running)."""
        await self.wait_line(
            lambda line: (m := TICK.match(line)) is not None and int(m.group(1)) > value,
            f"tick above {value}",
        )
        return self.counter

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        with trio.fail_after(WAIT):
            await self.process.wait()


@asynccontextmanager
async def run_jvm(
    jdk: Jdk, classes: Path, port: int, *, suspend: bool = False, main: str = "Prog"
) -> AsyncIterator[Jvm]:
    """Start ``java -agentlib:jdwp=...,address=127.0.0.1:PORT MAIN``; wait until it listens."""
    agent = (
        "-agentlib:jdwp=transport=dt_socket,server=y,"
        f"suspend={'y' if suspend else 'n'},address=127.0.0.1:{port}"
    )
    process = await trio.lowlevel.open_process(
        [jdk.java, "-Xshare:auto", agent, "-cp", str(classes), main],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    jvm = Jvm(process, port)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jvm._read)
            try:
                await jvm.wait_line(
                    lambda line: line.startswith("Listening for transport dt_socket"),
                    "'Listening for transport' line",
                )
                yield jvm
            finally:
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    await jvm.kill()
    finally:
        if process.returncode is None:
            process.kill()
        if process.stdout is not None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await process.stdout.aclose()


@asynccontextmanager
async def jdb_session(jdk: Jdk, port: int, name: str) -> AsyncIterator[Jdb]:
    async with open_jdb(jdk.jdb, port, name=name, patience=WAIT) as jdb:
        yield jdb


# --------------------------------------------------------------------------------------------
# Daemon helpers


def vm_id(port: int) -> str:
    return f"tcp:{port}"


async def wait_ready(h: Harness, port: int) -> dict[str, Any]:
    """Wait until ddmd knows the VM on ``port`` and has opened its per-VM debugger port."""
    return await h.wait_vm(
        vm_id(port),
        lambda v: v["state"] == "ready" and v["debugger_port"] is not None,
        timeout=WAIT,
    )


async def select(h: Harness, target: str) -> dict[str, Any]:
    response = await h.client.post(f"/api/v1/vms/{target}/select")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def current(h: Harness) -> dict[str, Any] | None:
    response = await h.client.get("/api/v1/current")
    assert response.status_code == 200, response.text
    vm: dict[str, Any] | None = response.json()["vm"]
    return vm


async def wait_released(h: Harness, port: int, count: int) -> None:
    """Wait until the VM was released ``count`` times (debugger state dropped: on its kept
    connection, by DBGD, or by a new connection)."""
    await wait_until(
        lambda: len(h.events("vm.released", vm=vm_id(port))) >= count,
        WAIT,
        what=f"vm.released x{count} for {vm_id(port)}",
    )
    await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready", timeout=WAIT)


async def breakpoint_session(jdb: Jdb, jvm: Jvm) -> int:
    """stop at, breakpoint hit, print, where, next, cont (hits again); returns the first n."""
    await jdb.attached()
    await jdb.until_stopped(
        f"stop at Prog:{BREAK_LINE}", rf"Set breakpoint Prog:{BREAK_LINE}", *BREAKPOINT_HIT
    )
    text = await jdb.command("print n", r"\bn = (\d+)")
    n = int(re.search(r"\bn = (\d+)", text).group(1))  # type: ignore[union-attr]
    text = await jdb.command("print doubled", r"\bdoubled = (\d+)")
    assert f"doubled = {2 * n}" in text, text
    text = await jdb.command("where", r"\[2\] Prog\.main")
    assert f"[1] Prog.tick (Prog.java:{BREAK_LINE})" in text, text
    assert f"[2] Prog.main (Prog.java:{MAIN_CALL_LINE})" in text, text
    # Stopped: the program has printed nothing for n yet.
    assert jvm.counter < n, (jvm.counter, n)
    await jdb.until_stopped("next", "Step completed:", rf"Prog\.tick\(\), line={NEXT_LINE} bci")
    # cont: the program runs one round and hits the breakpoint again, one tick later.
    await jdb.until_stopped("cont", *BREAKPOINT_HIT)
    text = await jdb.command("print n", r"\bn = (\d+)")
    assert f"n = {n + 1}" in text, text
    return n


async def clean_second_session(jdb: Jdb, jvm: Jvm) -> None:
    """A new jdb finds the VM running with no breakpoint left."""
    await jdb.attached()
    await jdb.command("clear", r"No breakpoints set\.")
    before = jvm.counter
    # Attached and the program keeps running: no breakpoint of the old session is left.
    await jvm.wait_counter_above(before + 5)
    text = await jdb.command("threads", MAIN_THREAD)
    state = MAIN_THREAD.search(text).group(1)  # type: ignore[union-attr]
    assert "breakpoint" not in state, text
    assert "Breakpoint hit" not in jdb.transcript, jdb.transcript
    assert await jdb.quit() == 0, jdb.transcript


# --------------------------------------------------------------------------------------------
# 1. A breakpoint session through the current-VM port and through the per-VM port


@pytest.mark.parametrize("via", ["current", "vm-port"])
async def test_breakpoint_session_then_clean_second_session(via, jdk, classes, tmp_path):
    (port, other) = free_port_range(2)
    with trio.fail_after(CAP):
        async with (
            monitor([port, other], tmp_path) as h,
            run_jvm(jdk, classes, port) as jvm,
            run_jvm(jdk, classes, other),
        ):
            vm = await wait_ready(h, port)
            await wait_ready(h, other)
            assert vm["ddm"] is False
            if via == "current":
                # Two VMs: nothing is current until one is selected.
                assert await current(h) is None
                chosen = await select(h, vm_id(port))
                assert chosen["selected"] == f"local|127.0.0.1:{port}"
                assert (await current(h))["id"] == vm_id(port)  # type: ignore[index]
                debugger_port = h.started.current_port
            else:
                debugger_port = vm["debugger_port"]

            async with jdb_session(jdk, debugger_port, "first") as jdb:
                n = await breakpoint_session(jdb, jvm)
                assert await jdb.quit() == 0, jdb.transcript
            # The debugger left: ddmd dropped its state (recycled the connection), and the
            # program runs again past the breakpoint it was stopped at.
            await jvm.wait_counter_above(n + 3)
            await wait_released(h, port, 1)
            attached = h.events("debugger.attached", vm=vm_id(port))
            assert [e["via"] for e in attached] == [via]
            assert h.events("debugger.dispose", vm=vm_id(port))

            async with jdb_session(jdk, debugger_port, "second") as jdb:
                await clean_second_session(jdb, jvm)
            await jvm.wait_counter_above(jvm.counter + 3)
            await wait_released(h, port, 2)
            vm = await wait_ready(h, port)
            assert vm["debugger"] is None
            assert not h.events("debugger.rejected")


# --------------------------------------------------------------------------------------------
# 2. jdb killed while stopped at a breakpoint


async def test_jdb_killed_at_breakpoint_vm_resumes(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h, run_jvm(jdk, classes, port) as jvm:
            vm = await wait_ready(h, port)
            async with jdb_session(jdk, h.started.current_port, "killed") as jdb:
                await jdb.attached()
                await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                text = await jdb.command("print n", r"\bn = (\d+)")
                n = int(re.search(r"\bn = (\d+)", text).group(1))  # type: ignore[union-attr]
                snapshot = await h.vm(vm_id(port))
                assert snapshot is not None
                assert snapshot["debugger"] is not None
                await jdb.kill()
            # No Dispose came: ddmd saw the debugger's socket close and released the VM all
            # the same (the JVM dropped the breakpoint and resumed).
            await jvm.wait_counter_above(n + 3)
            (detached,) = await wait_until(
                lambda: h.events("debugger.detached", vm=vm_id(port)), WAIT, what="detached"
            )
            assert "closed" in detached["reason"] or "error" in detached["reason"], detached
            assert not h.events("debugger.dispose")
            await wait_released(h, port, 1)

            # Attachable again through ddmd (its per-VM port this time).
            async with jdb_session(jdk, vm["debugger_port"], "again") as jdb:
                await clean_second_session(jdb, jvm)


# --------------------------------------------------------------------------------------------
# 3. A suspend=y JVM found before any debugger


async def test_suspended_jvm_starts_when_the_first_debugger_resumes_it(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path) as h,
            run_jvm(jdk, classes, port, suspend=True) as jvm,
        ):
            await wait_ready(h, port)
            # ddmd connected first and holds the VM_START event for the first debugger.
            await h.wait_event("vm.start_held", vm=vm_id(port), timeout=WAIT)
            assert not jvm.started
            async with jdb_session(jdk, h.started.current_port, "first") as jdb:
                # The held VM_START reaches jdb: it knows the VM is suspended.
                await jdb.expect(r"VM Started", THREAD_PROMPT)
                assert "Initializing jdb ..." in jdb.transcript, jdb.transcript
                assert not jvm.started
                await jdb.command("cont")
                await jvm.wait_line(lambda line: line == "started", "'started'")
                await jvm.wait_counter_above(3)
                assert await jdb.quit() == 0, jdb.transcript
            await jvm.wait_counter_above(jvm.counter + 3)


# --------------------------------------------------------------------------------------------
# 4. Sticky selection across restarts


class SimProcess:
    """A SimVm that can be stopped (like killing the app) independently of the others."""

    def __init__(self, nursery: trio.Nursery, config: SimConfig) -> None:
        self.nursery = nursery
        self.vm = SimVm(config)
        self.scope = trio.CancelScope()

    async def start(self) -> SimProcess:
        async def run(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
            with self.scope:
                await self.vm.run(task_status=task_status)

        await self.nursery.start(run)
        return self

    def stop(self) -> None:
        self.scope.cancel()


def sim_config(port: int, **kw: Any) -> SimConfig:
    if "app_name" in kw:
        kw.setdefault("package_name", kw["app_name"])
    return SimConfig(
        **{"port": port, "churn_interval": 0.0, "gc_interval": 0.0, "heap_mb": 1, **kw}
    )


async def wait_gone(h: Harness, port: int) -> None:
    async def absent() -> bool:
        return await h.vm(vm_id(port)) is None

    await wait_until(absent, WAIT, what=f"{vm_id(port)} gone")


async def jdb_threads(jdk: Jdk, port: int, expected: str, name: str) -> str:
    """Attach, list threads (expecting ``expected`` in the listing), quit."""
    async with jdb_session(jdk, port, name) as jdb:
        await jdb.attached()
        text = await jdb.command("threads", re.escape(expected))
        assert await jdb.quit() == 0, jdb.transcript
    return text


async def test_selection_sticks_to_the_app_across_restarts(jdk, classes, tmp_path):
    a1, other, a2, jvm_port = free_port_range(4)
    app = "com.example.sticky"
    with trio.fail_after(CAP):
        async with monitor([a1, other, a2, jvm_port], tmp_path) as h:
            sims = h.peers
            first = await SimProcess(sims, sim_config(a1, pid=1001, app_name=app)).start()
            await SimProcess(sims, sim_config(other, pid=2002, app_name="com.example.b")).start()
            before = await wait_ready(h, a1)
            await wait_ready(h, other)
            chosen = await select(h, app)  # by app name
            assert chosen["selected"] == f"local|{app}"

            # The app restarts with a new pid on another scan port: the current-VM port
            # follows it without any command, and its per-VM port stays the same.
            first.stop()
            await wait_gone(h, a1)
            second = await SimProcess(sims, sim_config(a2, pid=1003, app_name=app)).start()
            after = await wait_ready(h, a2)
            assert after["pid"] == 1003
            assert after["debugger_port"] == before["debugger_port"]
            assert (await current(h))["id"] == vm_id(a2)  # type: ignore[index]
            await h.wait_event("current.changed", vm=vm_id(a2))
            await jdb_threads(jdk, h.started.current_port, "Binder:1003_1", "after restart")
            await jdb_threads(jdk, after["debugger_port"], "Binder:1003_1", "per-VM port")
            # And again, back on its first port, with yet another pid.
            # (After both sessions ended: a VM stopped while ddmd reopens its connection
            # stays listed as reconnecting for up to [timeouts] reconnect.)
            await wait_released(h, a2, 2)
            second.stop()
            await wait_gone(h, a2)
            await SimProcess(sims, sim_config(a1, pid=1004, app_name=app)).start()
            back = await wait_ready(h, a1)
            assert (back["pid"], back["debugger_port"]) == (1004, before["debugger_port"])
            await jdb_threads(jdk, h.started.current_port, "Binder:1004_1", "same port")

            # A plain JVM (no app name) is known by its address: restarted on the same port,
            # it keeps its per-VM port and the selection.
            async with run_jvm(jdk, classes, jvm_port) as jvm:
                plain = await wait_ready(h, jvm_port)
                chosen = await select(h, vm_id(jvm_port))
                assert chosen["selected"] == f"local|127.0.0.1:{jvm_port}"
                await jvm.kill()
            await wait_gone(h, jvm_port)
            assert (await current(h)) is None
            async with run_jvm(jdk, classes, jvm_port) as jvm:
                again = await wait_ready(h, jvm_port)
                assert again["debugger_port"] == plain["debugger_port"]
                assert again["current"] is True
                # Listeners (the event stream) hear that it is current again.
                await wait_until(
                    lambda: len(h.events("current.changed", vm=vm_id(jvm_port))) == 2,
                    WAIT,
                    what="current.changed for the restarted JVM",
                )
                assert (await current(h))["id"] == vm_id(jvm_port)  # type: ignore[index]
                await jdb_threads(jdk, h.started.current_port, "Reference Handler", "jvm")
                await jvm.wait_counter_above(jvm.counter + 3)


@pytest.mark.parametrize("named_by", ["HELO", "APNM"])
async def test_current_vm_follows_a_waiting_app_through_its_naming(named_by, jdk, tmp_path):
    """A VM that reports WAIT before its name is known becomes current under a temporary key;
    when its name arrives (in the HELO reply, or later by APNM) it stays current."""
    waiting, other = free_port_range(2)
    app = "com.example.waits"
    delay = 1.0 if named_by == "APNM" else 0.0
    with trio.fail_after(CAP):
        async with monitor([waiting, other], tmp_path) as h:
            await SimProcess(h.peers, sim_config(other, pid=2002, app_name="com.example.b")).start()
            await wait_ready(h, other)
            await SimProcess(
                h.peers,
                sim_config(
                    waiting, pid=3003, app_name=app, wait_for_debugger=True, apnm_delay=delay
                ),
            ).start()
            await h.wait_vm(vm_id(waiting), lambda v: v["waiting_for_debugger"], timeout=WAIT)
            chosen = await current(h)
            assert chosen is not None
            assert chosen["id"] == vm_id(waiting)
            named = await h.wait_vm(vm_id(waiting), lambda v: v["app"] == app, timeout=WAIT)
            if named_by == "APNM":
                assert h.events("vm.renamed", vm=vm_id(waiting))
            after = await current(h)
            assert after is not None, "the current VM was lost when the VM got its name"
            assert after["id"] == vm_id(waiting)
            assert after["app"] == app
            response = await h.client.get("/api/v1/current")
            assert response.json()["selected"] == f"local|{app}"
            await wait_ready(h, waiting)
            assert named["pid"] == 3003
            await jdb_threads(jdk, h.started.current_port, "Binder:3003_1", "current after naming")


# --------------------------------------------------------------------------------------------
# 5. jdb on a DDM VM: ddmd's own DDM traffic runs alongside, then DBGD on the way out


@pytest.mark.parametrize("ack_dbgd", [False, True], ids=["no-ack", "ack"])
async def test_jdb_on_sim_multiplexes_and_releases(ack_dbgd, jdk, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, monitor={"always_poll_threads": True}) as h:
            sim = await SimProcess(
                h.peers, sim_config(port, pid=4321, threads=9, ack_dbgd=ack_dbgd)
            ).start()
            await wait_ready(h, port)
            accepted = sim.vm.statistics().connections_accepted
            async with jdb_session(jdk, h.started.current_port, "sim") as jdb:
                await jdb.attached()
                await jdb.command("threads", r"RenderThread")
                # ddmd keeps polling THST on the same connection while jdb works.
                polled = sim.vm.statistics().thst_requests
                await wait_until(
                    lambda: sim.vm.statistics().thst_requests >= polled + 3,
                    WAIT,
                    what="THST polls during the jdb session",
                )
                await jdb.command("threads", r"Binder:4321_1")
                stats = sim.vm.statistics()
                assert stats.jdwp_requests > 10  # jdb's traffic reached the VM
                assert stats.connections_accepted == accepted  # one connection, shared
                assert await jdb.quit() == 0, jdb.transcript
            await h.wait_event("ddm.dbgd_sent", vm=vm_id(port), timeout=WAIT)
            if ack_dbgd:
                await h.wait_event("ddm.dbgd_acknowledged", vm=vm_id(port), timeout=WAIT)
                assert not h.events("vm.reconnecting")
                assert sim.vm.statistics().connections_accepted == accepted
            else:
                await h.wait_event("vm.reconnecting", vm=vm_id(port), timeout=WAIT)
                await h.wait_event("vm.reconnected", vm=vm_id(port), timeout=WAIT)
                await wait_until(
                    lambda: sim.vm.statistics().connections_accepted == accepted + 1,
                    WAIT,
                    what="the sim sees the reopened connection",
                )
                assert not h.events("ddm.dbgd_acknowledged")
            # Attachable again, on whichever connection ddmd kept.
            await wait_ready(h, port)
            await jdb_threads(jdk, h.started.current_port, "RenderThread", "again")
            stats = sim.vm.statistics()
            assert stats.duplicate_outstanding_ids == 0
            assert stats.replies_received == 0
            assert not h.events("ddm.reply_unknown")


# --------------------------------------------------------------------------------------------
# 6. A second debugger on the same VM is refused, with the reason in the log


async def test_second_debugger_is_rejected_naming_the_holder(jdk, classes, tmp_path):
    """With [debugger] max_per_vm = 1 (one debugger per VM, as before several were allowed)."""
    (port,) = free_port_range(1)
    single = {"max_per_vm": 1}
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=single) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            async with jdb_session(jdk, vm["debugger_port"], "holder") as jdb:
                await jdb.attached()
                attached = await h.wait_event("debugger.attached", vm=vm_id(port))
                for n, second_port in enumerate((vm["debugger_port"], h.started.current_port)):
                    async with jdb_session(jdk, second_port, "second") as refused:
                        await refused.wait_exit()
                        assert "Unable to attach to target VM" in refused.transcript
                    rejected = await wait_until(
                        lambda n=n: h.events("debugger.rejected")[n:], WAIT, what="rejected"
                    )
                    assert rejected[0]["holder"] == attached["peer"], rejected
                    assert "already has a debugger" in rejected[0]["reason"], rejected
                # The first debugger keeps working.
                await jdb.command("threads", r"Group main:")
                await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                await jdb.command("where", r"\[1\] Prog\.tick")
                assert await jdb.quit() == 0, jdb.transcript
            await jvm.wait_counter_above(jvm.counter + 3)
