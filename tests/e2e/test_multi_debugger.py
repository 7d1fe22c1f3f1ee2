"""Acceptance tests of several debuggers on one VM (issue 11), with real peers: a HotSpot JVM,
the real ``jdb`` and a small JDI program (``java/HoldBreakpoint.java``), all through a real
``ddmd.daemon.run`` (``tests.actors.rawpeers.monitor``, ``[debugger] max_per_vm = 4``).

The debuggee is ``Prog`` of ``test_bridge_jvm.py``: ``main`` loops ``counter++; tick(counter)``
every 20 ms and ``tick(n)`` prints ``tick N ...``. Two breakpoints on that loop never fire at the
same time: one in ``main`` (the call of ``tick``, local ``counter``) and one in ``tick`` (before
the print, local ``n``); with both set, the thread stops at each in turn.

Every wait is bounded (``CAP`` for a whole test, ``WAIT`` for one condition); nothing is timed.
"The program runs" means its printed counter advances; "a thread is held" means the counter
stays where the held thread stopped it, read twice with other debugging work in between.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.actors.rawpeers import Harness, free_port_range, monitor
from tests.e2e.conftest import Jdk, require_tool
from tests.e2e.jdbdriver import THREAD_PROMPT, Jdb
from tests.e2e.lines import ProcessLines
from tests.e2e.test_bridge_jvm import (
    BREAK_LINE,
    BREAKPOINT_HIT,
    MAIN_CALL_LINE,
    MAIN_THREAD,
    PROG,
    WAIT,
    clean_second_session,
    jdb_session,
    run_jvm,
    select,
    vm_id,
    wait_ready,
)

pytestmark = pytest.mark.jvm

CAP = 90  # seconds: absolute cap on every test (several jdb sessions, a JDI program)
HOLD_MS = 2000  # how long the JDI program holds its thread at least
JAVA_DIR = Path(__file__).resolve().parent / "java"

# jdb's report of the breakpoint in main (the call of tick), as BREAKPOINT_HIT is for tick's.
MAIN_HIT = ("Breakpoint hit:", rf'"thread=main", Prog\.main\(\), line={MAIN_CALL_LINE} bci')
# "(java.lang.Thread)1 main running": the thread's id as jdb takes it in commands.
MAIN_THREAD_ID = re.compile(r"\(java\.lang\.Thread\)(\w+) +main +\S")


def debugger_config() -> dict[str, Any]:
    return {"max_per_vm": 4}


# --------------------------------------------------------------------------------------------
# The Java side


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prog (with -g: locals for ``print``) and the JDI program, compiled once per module."""
    javac = require_tool("javac")
    out = tmp_path_factory.mktemp("multi")
    (out / "Prog.java").write_text(PROG)
    sources = [str(out / "Prog.java"), str(JAVA_DIR / "HoldBreakpoint.java")]
    subprocess.run(
        [javac, "-g", "-d", str(out), *sources], check=True, capture_output=True, timeout=120
    )
    return out


class LineProcess(ProcessLines):
    """A child process driven over stdin, its stdout (stderr merged) read line by line."""

    def __init__(self, process: trio.Process, name: str) -> None:
        super().__init__(process)
        self.name = name

    async def expect(self, pattern: str) -> re.Match[str]:
        """The first line matching ``pattern`` (an ``ERR`` line fails at once)."""
        regex = re.compile(pattern)
        try:
            with trio.fail_after(WAIT):
                while True:
                    for line in self.lines:
                        if line.startswith("ERR "):
                            raise AssertionError(f"{self.name}: {line}\n{self.lines}")
                        match = regex.search(line)
                        if match:
                            return match
                    if self.process.returncode is not None:
                        raise AssertionError(
                            f"{self.name} exited ({self.process.returncode}) before a line "
                            f"matching {pattern!r}: {self.lines}"
                        )
                    await self._changed.wait()
        except trio.TooSlowError:
            raise AssertionError(
                f"{self.name}: no line matching {pattern!r} within {WAIT} s: {self.lines}"
            ) from None

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    async def wait_exit(self) -> int:
        with trio.fail_after(WAIT):
            return await self.process.wait()


@asynccontextmanager
async def hold_breakpoint(
    jdk: Jdk, classes: Path, port: int, line: int, variable: str
) -> AsyncIterator[LineProcess]:
    """Run HoldBreakpoint against ``port`` (see its class comment); killed on the way out."""
    argv = [jdk.java, "-cp", str(classes), "HoldBreakpoint", "127.0.0.1", str(port)]
    argv += ["Prog", str(line), variable, str(HOLD_MS)]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    program = LineProcess(process, "HoldBreakpoint")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(program._read)
            try:
                yield program
            finally:
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with trio.move_on_after(1) as scope:
                    scope.shield = True
                    await stream.aclose()


# --------------------------------------------------------------------------------------------
# jdb helpers


async def hit(jdb: Jdb, *patterns: str) -> None:
    """Wait for an event jdb reports (``patterns``) and then for the thread prompt after it
    (only then do ``print`` and ``where`` work)."""
    await jdb.expect(*patterns)
    await jdb.expect(THREAD_PROMPT)


async def same_line(jdb: Jdb, line: str, prompt: str) -> None:
    """A command that prints nothing but its prompt, right after the previous one ("> > ",
    "> main[1] "): jdb's driver only takes a prompt at the start of a line."""
    jdb.mark = len(jdb.transcript)
    await jdb.send(line)
    await jdb.expect(prompt)


async def local(jdb: Jdb, name: str) -> int:
    text = await jdb.command(f"print {name}", rf"\b{name} = (-?\d+)")
    match = re.search(rf"\b{name} = (-?\d+)", text)
    assert match is not None, text
    return int(match.group(1))


async def two_debuggers(h: Harness, port: int) -> dict[str, Any]:
    """Wait until the VM lists two attached debuggers, one per kind of port."""
    snapshot = await h.wait_vm(vm_id(port), lambda v: len(v["debuggers"]) == 2, timeout=WAIT)
    assert sorted(d["via"] for d in snapshot["debuggers"]) == ["current", "vm-port"], snapshot
    return snapshot


# --------------------------------------------------------------------------------------------
# 1. Two jdb sessions with a breakpoint each; one quits at its breakpoint; a third one after


async def test_two_jdb_sessions_each_hit_their_own_breakpoint(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=debugger_config()) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            await select(h, vm_id(port))
            async with (
                jdb_session(jdk, vm["debugger_port"], "A") as a,
                jdb_session(jdk, h.started.current_port, "B") as b,
            ):
                await a.attached()
                await b.attached()
                await two_debuggers(h, port)
                await a.until_stopped(
                    f"stop at Prog:{BREAK_LINE}",
                    rf"Set breakpoint Prog:{BREAK_LINE}",
                    *BREAKPOINT_HIT,
                )
                n = await local(a, "n")
                assert jvm.counter < n  # stopped before printing tick n
                # B's breakpoint is set while A holds the VM; it fires once A lets go.
                await b.command(
                    f"stop at Prog:{MAIN_CALL_LINE}", rf"Set breakpoint Prog:{MAIN_CALL_LINE}"
                )
                for _ in range(3):
                    await a.send("cont")
                    await hit(b, *MAIN_HIT)
                    counter = await local(b, "counter")
                    assert counter == n + 1, (counter, n)
                    await b.send("cont")
                    await hit(a, *BREAKPOINT_HIT)
                    n = await local(a, "n")
                    assert n == counter, (n, counter)

                # A quits while stopped at its breakpoint: its breakpoint and its stop go,
                # and B keeps hitting its own, once per round of the loop.
                assert await a.quit() == 0, a.transcript
                released = await h.wait_event("debugger.released", timeout=WAIT, vm=vm_id(port))
                assert released["suspensions"] == 1, released
                assert released["requests"] >= 1, released
                await hit(b, *MAIN_HIT)
                counter = await local(b, "counter")
                assert counter == n + 1, (counter, n)
                for _ in range(3):
                    await b.until_stopped("cont", *MAIN_HIT)
                    following = await local(b, "counter")
                    assert following == counter + 1, (following, counter)
                    counter = following
                text = await b.command("where", r"\[1\] Prog\.main")
                assert f"[1] Prog.main (Prog.java:{MAIN_CALL_LINE})" in text, text
                # Each saw only its own events; the VM connection stayed open for B.
                assert "Prog.main()" not in a.transcript, a.transcript
                assert "Prog.tick()" not in b.transcript, b.transcript
                assert not h.events("vm.reconnected")
                assert not h.events("debugger.rejected")
                assert await b.quit() == 0, b.transcript

            # Both left: the program runs freely again, and a third jdb finds it running with
            # no breakpoint left.
            await jvm.wait_counter_above(counter + 10)
            async with jdb_session(jdk, vm["debugger_port"], "C") as c:
                await clean_second_session(c, jvm)


# --------------------------------------------------------------------------------------------
# 2. A JDI program holds a thread; another debugger's resumes do not release it


async def test_jdi_hold_is_not_released_by_another_debuggers_resume(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=debugger_config()) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            await select(h, vm_id(port))
            async with (
                jdb_session(jdk, h.started.current_port, "jdb") as jdb,
                hold_breakpoint(jdk, classes, vm["debugger_port"], BREAK_LINE, "n") as jdi,
            ):
                await jdb.attached()
                text = await jdb.command("threads", MAIN_THREAD_ID)
                main_id = MAIN_THREAD_ID.search(text).group(1)  # type: ignore[union-attr]
                await jdi.expect(r"^SET$")
                held = await jdi.expect(r"^HIT n=(\d+) count=(\d+)$")
                n, count = int(held.group(1)), int(held.group(2))
                assert count == 1, held.string
                await two_debuggers(h, port)
                # Held at the breakpoint in tick(n): the program printed up to n - 1.
                await jvm.wait_line(lambda line: line.startswith(f"tick {n - 1} "), "tick n-1")
                first = jvm.counter
                assert first == n - 1, (first, n)

                # jdb, not stopped itself, lets "everything" go in every way it has: cont
                # (with a current thread, so that it sends VM.Resume), resume, resume of the
                # held thread, and a suspend of its own balanced by its resume.
                await same_line(jdb, f"thread {main_id}", r"main\[1\] ")
                await same_line(jdb, "cont", "> ")
                await jdb.command("resume", r"All threads resumed\.")
                await same_line(jdb, f"resume {main_id}", "> ")
                await jdb.command("suspend", r"All threads suspended\.")
                await jdb.command("resume", r"All threads resumed\.")
                text = await jdb.command("threads", MAIN_THREAD)
                await trio.sleep(0.5)  # room for a released thread to print (~25 ticks)
                second = jvm.counter
                assert second == first, (first, second, jvm.lines[-5:])
                assert "Breakpoint hit" not in jdb.transcript, jdb.transcript

                # The JDI program ends its hold: its thread runs on.
                await jdi.send("release")
                end = await jdi.expect(r"^HOLD_END count=(\d+) suspended=(\w+)$")
                assert end.groups() == ("1", "true"), end.string
                await jdi.expect(r"^RESUMED count=0$")
                await jvm.wait_counter_above(n + 5)
                await jdi.send("quit")
                await jdi.expect(r"^BYE$")
                assert await jdi.wait_exit() == 0, jdi.lines
                await jdb.command("threads", MAIN_THREAD)
                assert await jdb.quit() == 0, jdb.transcript
            await jvm.wait_counter_above(jvm.counter + 5)
            assert not h.events("debugger.rejected")


# --------------------------------------------------------------------------------------------
# 3. A debugger killed while it holds a SUSPEND_ALL breakpoint


async def test_killed_holder_releases_only_its_own_and_the_other_works_on(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=debugger_config()) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            await select(h, vm_id(port))
            async with (
                jdb_session(jdk, vm["debugger_port"], "killed") as a,
                jdb_session(jdk, h.started.current_port, "other") as b,
            ):
                await a.attached()
                await b.attached()
                await two_debuggers(h, port)
                # jdb's breakpoints suspend all threads.
                await a.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                n = await local(a, "n")
                assert jvm.counter < n
                await a.kill()

                # The VM runs on: A's stop and A's breakpoint are gone.
                await jvm.wait_counter_above(n + 5)
                detached = await h.wait_event("debugger.detached", timeout=WAIT, vm=vm_id(port))
                assert "closed" in detached["reason"] or "error" in detached["reason"], detached
                released = await h.wait_event("debugger.released", timeout=WAIT, vm=vm_id(port))
                assert released["suspensions"] == 1, released
                assert not h.events("debugger.dispose")

                # B stayed attached and works: threads, its own breakpoint, where, cont.
                await b.command("threads", MAIN_THREAD)
                await b.until_stopped(
                    f"stop at Prog:{MAIN_CALL_LINE}",
                    rf"Set breakpoint Prog:{MAIN_CALL_LINE}",
                    *MAIN_HIT,
                )
                text = await b.command("where", r"\[1\] Prog\.main")
                assert f"[1] Prog.main (Prog.java:{MAIN_CALL_LINE})" in text, text
                counter = await local(b, "counter")
                assert counter > n + 5, (counter, n)
                await b.until_stopped("cont", *MAIN_HIT)
                assert await local(b, "counter") == counter + 1
                assert "Prog.tick()" not in b.transcript, b.transcript
                assert not h.events("vm.reconnected")
                assert await b.quit() == 0, b.transcript
            await jvm.wait_counter_above(jvm.counter + 5)


# --------------------------------------------------------------------------------------------
# 4. What one debugger reads of a thread another one holds must not outlive the hold


async def test_reading_a_thread_another_debugger_holds_leaves_no_stale_view(jdk, classes, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=debugger_config()) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            await select(h, vm_id(port))
            async with (
                jdb_session(jdk, vm["debugger_port"], "A") as a,
                jdb_session(jdk, h.started.current_port, "B") as b,
            ):
                await a.attached()
                await b.attached()
                await a.until_stopped(f"stop at Prog:{BREAK_LINE}", *BREAKPOINT_HIT)
                n = await local(a, "n")
                # B lists the threads while A holds main in tick(): jdb asks JDI whether each
                # thread is at a breakpoint, which reads its top frame.
                await b.command("threads", MAIN_THREAD)
                assert await a.quit() == 0, a.transcript
                await jvm.wait_counter_above(n + 5)
                # B's own breakpoint in main: B must see main stopped there, not in tick().
                # The hit can come before jdb has finished printing "Set breakpoint" (the two
                # interleave), so both are awaited together, in any order.
                await b.until_stopped(
                    f"stop at Prog:{MAIN_CALL_LINE}",
                    rf"Set breakpoint Prog:{MAIN_CALL_LINE}",
                    "Breakpoint hit:",
                )
                # jdb prints where the thread stands (JDI's top frame): main, not tick().
                reported = b.transcript[b.transcript.rindex("Breakpoint hit:") :]
                assert re.search(MAIN_HIT[1], reported), b.transcript
                text = await b.command("print counter", r"\bcounter = ")
                assert re.search(r"\bcounter = \d+", text), b.transcript
                assert await b.quit() == 0, b.transcript
