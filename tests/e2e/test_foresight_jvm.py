"""Foresight with a real peer: a HotSpot JVM through ddmd with ``[debugger] speculate = "on"``,
and a real ``jdb`` session (breakpoint, where, locals, print, step, cont) that prints the same as
the same session run directly against another JVM of the same program; ddmd answered some of
jdb's commands itself.

The JVMs start suspended (``suspend=y``), so both sessions stop at the same iterations. Object
ids are masked in the comparison: ddmd's own connection asked the thread list before jdb
attached, so the VM numbers some objects in another order (nothing else may differ).

The IDE-shaped JDI clients (tests/e2e/java/StopViews.java, bench/java/IdeClient.java) print what
an IDE shows at a stop: the same direct and through ddmd, and the same with foresight on as off
while a second debugger resumes the VM during the stop.
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

from ddmd.protocol.jdwp import CommandSet, ReplyPacket
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import free_port_range, monitor, wait_until
from tests.e2e.conftest import Jdk, require_tool
from tests.e2e.jdbdriver import THREAD_PROMPT, Jdb
from tests.e2e.lines import ProcessLines
from tests.e2e.test_bridge_jvm import (
    BREAK_LINE,
    BREAKPOINT_HIT,
    CAP,
    PROG,
    WAIT,
    classes,  # noqa: F401 (a fixture)
    jdb_session,
    run_jvm,
    vm_id,
    wait_ready,
)

pytestmark = pytest.mark.jvm

_IDS = re.compile(r"(id=|\([\w.$]+\))\d+")


async def _session(jdb: Jdb) -> list[str]:
    """What jdb prints for each command of the session (object ids masked)."""
    await jdb.expect(r"VM Started", THREAD_PROMPT)
    views: list[str] = []

    async def run(line: str, *patterns: str) -> None:
        text = await jdb.command(line, *patterns)
        # (and the spaces that align columns of ids of other widths)
        views.append(re.sub(r" +", " ", _IDS.sub(lambda m: m.group(1) + "#", text)))

    await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", r"Deferring breakpoint|Set breakpoint")
    await jdb.until_stopped("cont", *BREAKPOINT_HIT)
    for _ in range(3):
        await run("where", r"\[2\] Prog\.main")
        await run("locals", r"doubled = \d+")
        await run("print n", r"\bn = \d+")
        # Of the thread list, the main thread's line: what a JDK thread (Common-Cleaner) does at
        # the stop varies from run to run, direct too.
        text = await jdb.command("threads", r"main")
        main = [" ".join(line.split()[1:]) for line in text.splitlines() if " main " in line]
        views.append("\n".join(main))
        await jdb.until_stopped("next", "Step completed:")
        await run("where", r"\[2\] Prog\.main")
        await run("locals", r"doubled = \d+")
        await jdb.until_stopped("cont", *BREAKPOINT_HIT)
    assert await jdb.quit() == 0, jdb.transcript
    return views


async def test_a_jdb_session_through_foresight_prints_what_it_prints_direct(
    jdk: Jdk,
    classes,  # noqa: F811
    tmp_path,
) -> None:
    (port, direct) = free_port_range(2)
    with trio.fail_after(CAP * 2):
        async with (
            run_jvm(jdk, classes, direct, suspend=True),
            jdb_session(jdk, direct, "direct") as jdb,
        ):
            expected = await _session(jdb)
        async with (
            monitor([port], tmp_path, debugger={"speculate": "on"}) as h,
            run_jvm(jdk, classes, port, suspend=True),
        ):
            await wait_ready(h, port)
            async with jdb_session(jdk, h.started.current_port, "through") as jdb:
                seen = await _session(jdb)
            figures = (await h.vm(vm_id(port)))["foresight"]  # the API shows them per VM
            assert figures["on"], figures
            assert figures["answered_cache"] + figures["answered_speculation"] > 0, figures
            assert figures["round_trip"] is not None, figures
            (line,) = await wait_until(
                lambda: h.events("debugger.foresight", vm=vm_id(port)), WAIT, what="foresight"
            )
    assert seen == expected
    assert line["answered"] > 0, line


JAVA_DIR = Path(__file__).parent / "java"


@pytest.fixture(scope="module")
def views_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prog and the IDE-shaped JDI client ``java/StopViews.java``, compiled with -g."""
    out = tmp_path_factory.mktemp("views")
    (out / "Prog.java").write_text(PROG)
    sources = [str(out / "Prog.java"), str(JAVA_DIR / "StopViews.java")]
    subprocess.run(
        [require_tool("javac"), "-g", "-d", str(out), *sources],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


async def _views(jdk: Jdk, compiled: Path, port: int) -> str:
    argv = [jdk.java, "-cp", str(compiled), "StopViews", "127.0.0.1", str(port), "Prog"]
    result = await trio.run_process(
        [*argv, str(BREAK_LINE), "3"], capture_stdout=True, capture_stderr=True
    )
    return result.stdout.decode()


async def test_an_ide_client_through_foresight_sees_what_it_sees_direct(
    jdk: Jdk,
    views_classes: Path,
    tmp_path: Path,
) -> None:
    """Three stops (a breakpoint and a step over each) of a JDI client shaped like an IDE's:
    threads, frames, class data, locals; the same views direct and through ddmd."""
    (port, direct) = free_port_range(2)
    with trio.fail_after(CAP * 2):
        async with run_jvm(jdk, views_classes, direct, suspend=True):
            expected = await _views(jdk, views_classes, direct)
        assert expected.count("stop ") == 6, expected
        async with (
            monitor([port], tmp_path, debugger={"speculate": "on"}) as h,
            run_jvm(jdk, views_classes, port, suspend=True),
        ):
            await wait_ready(h, port)
            seen = await _views(jdk, views_classes, h.started.current_port)
            figures = (await h.vm(vm_id(port)))["foresight"]
    assert seen == expected
    assert figures["answered_speculation"] > 0, figures


# --------------------------------------------------------------------------------------------
# A second debugger resumes the VM while the IDE client is stopped (issue 30)
#
# Under ddmd a debugger's resume releases only the suspensions it holds itself (session/bridge.py):
# the second debugger's VirtualMachine.Resume is answered by ddmd and the VM stays stopped for the
# IDE client, whose questions then get what the VM says at that stop (answered ahead by foresight
# when it is on): the same as with foresight off. Were the resume to reach the VM, the program
# would run on (main waits on a lock for good, its frames refused) and the views would differ.

ONCE = """\
import java.io.BufferedReader;
import java.io.InputStreamReader;

public class Prog {
    static final Object LOCK = new Object();

    public static void main(String[] args) throws Exception {
        System.out.println("started");
        new BufferedReader(new InputStreamReader(System.in)).readLine();  // the test says go
        stop(21);
        synchronized (LOCK) {
            while (true) {
                LOCK.wait();
            }
        }
    }

    static void stop(int n) {
        int doubled = n * 2;
        System.out.println("stopped " + doubled); // BREAK
    }
}
"""
ONCE_LINE = next(i for i, line in enumerate(ONCE.splitlines(), 1) if "// BREAK" in line)
IDE_CLIENT = Path(__file__).resolve().parents[2] / "bench" / "java" / "IdeClient.java"
RESUME = 9  # VirtualMachine.Resume


@pytest.fixture(scope="module")
def once_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The program that stops once (``ONCE``) and bench/java/IdeClient.java, with -g."""
    out = tmp_path_factory.mktemp("once")
    (out / "Prog.java").write_text(ONCE)
    subprocess.run(
        [require_tool("javac"), "-g", "-d", str(out), str(out / "Prog.java"), str(IDE_CLIENT)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


class _Lines(ProcessLines):
    async def wait_line(self, wanted: str, what: str) -> None:
        """Wait until the process printed a line starting with ``wanted`` (``WAIT`` s at most)."""

        def seen() -> bool:
            return any(line.startswith(wanted) for line in self.lines)

        try:
            with trio.fail_after(WAIT):
                while not seen():
                    await self._changed.wait()
                    if self._changed.is_set() and not seen():  # its output ended
                        raise AssertionError(f"{what} ended before {wanted!r}: {self.lines[-20:]}")
        except trio.TooSlowError:
            raise AssertionError(
                f"{what} printed no {wanted!r} within {WAIT} s: {self.lines[-20:]}"
            ) from None


@asynccontextmanager
async def _process(argv: list[str]) -> AsyncIterator[tuple[trio.Process, _Lines]]:
    """``argv`` with a stdin pipe, its output collected as lines; killed at the end."""
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines = _Lines(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lines._read)
            try:
                yield process, lines
            finally:
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    if process.returncode is None:
                        process.kill()
                    await process.wait()
    finally:
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                with trio.move_on_after(1) as scope:
                    scope.shield = True
                    await pipe.aclose()


async def _resume(vm_port: int) -> None:
    """A second debugger (a raw JDWP client on the VM's own ddmd port) resumes the VM."""
    stream = await trio.open_tcp_stream("127.0.0.1", vm_port)
    debugger = FakeDebugger(stream)
    try:
        with trio.fail_after(WAIT):
            await debugger.handshake()
            await debugger.command(1, CommandSet.VIRTUAL_MACHINE, RESUME)
            while True:
                packet = await debugger.receive()
                assert packet is not None, "ddmd closed the second debugger's connection"
                if isinstance(packet, ReplyPacket):
                    assert packet == ReplyPacket(1, 0, b""), packet
                    return
    finally:
        await stream.aclose()


async def _resumed_during_the_stop(
    jdk: Jdk, compiled: Path, tmp_path: Path, speculate: str
) -> tuple[str, dict[str, Any]]:
    """The IDE client stops at the breakpoint through ddmd; while it holds, a second debugger
    resumes the VM; then the IDE client asks its stop's questions and detaches. Returns what it
    saw and ddmd's foresight figures."""
    (port,) = free_port_range(1)
    view = tmp_path / f"view-{speculate}.txt"
    (tmp_path / speculate).mkdir()
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
    java = [jdk.java, "-Xshare:auto", agent, "-cp", str(compiled), "Prog"]
    async with (
        _process(java) as (jvm, jvm_lines),
        monitor([port], tmp_path / speculate, debugger={"speculate": speculate}) as h,
    ):
        await jvm_lines.wait_line("started", "the JVM")
        vm_port = (await wait_ready(h, port))["debugger_port"]
        ide = [jdk.java, "-cp", str(compiled), "IdeClient", "127.0.0.1"]
        ide += [str(h.started.current_port), "Prog", str(ONCE_LINE), "0", str(view), "hold"]
        async with _process(ide) as (client, client_lines):
            await client_lines.wait_line("ARMED", "the IDE client")
            assert jvm.stdin is not None
            await jvm.stdin.send_all(b"go\n")  # main calls stop(): the breakpoint
            await client_lines.wait_line("HOLD breakpoint", "the IDE client")
            # Stopped; foresight (when on) is asking ahead or has its answers.
            await _resume(vm_port)
            assert client.stdin is not None
            await client.stdin.send_all(b"ask\n")
            with trio.fail_after(WAIT * 2):
                await client.wait()
            assert client.returncode == 0, client_lines.lines
        # The IDE client's detach let the VM go: only now does main get past the breakpoint.
        await jvm_lines.wait_line("stopped 42", "the JVM")
        figures = (await h.vm(vm_id(port)))["foresight"]
    return view.read_text(), figures


def _comparable(view: str) -> str:
    """The view with the status of threads other than main masked: what a JDK thread
    (Common-Cleaner) does at the stop varies from run to run, direct too."""
    return re.sub(r"(  thread (?!main )\S.* status=)\d+", r"\1#", view)


async def test_an_ide_client_stopped_while_another_debugger_resumes_prints_the_vms_answers(
    jdk: Jdk,
    once_classes: Path,
    tmp_path: Path,
) -> None:
    """Issue 30: while the IDE client is stopped, a second debugger through ddmd resumes the
    VM; the IDE client then prints the same threads, frames, locations and values with
    foresight on as with it off: the VM's own answers, still stopped for it."""
    with trio.fail_after(CAP * 2):
        expected, off = await _resumed_during_the_stop(jdk, once_classes, tmp_path, "off")
        seen, on = await _resumed_during_the_stop(jdk, once_classes, tmp_path, "on")
    # Still stopped for the IDE client: main suspended in stop(), its frames and locals there.
    assert "  thread main status=1 suspended=true\n" in expected, expected
    assert f"  at Prog.stop:{ONCE_LINE}\n" in expected, expected
    assert "  local n = 21\n" in expected, expected
    assert _comparable(seen) == _comparable(expected), (seen, expected)
    assert not off["on"], off
    assert on["on"], on
    assert on["speculated"] > 0, on  # it asked ahead at the stop
