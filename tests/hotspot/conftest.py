"""Real HotSpot JVMs for the attach tests: a quiet program, compiled once per session into a
directory every user can read (a JVM run as uid 65534 must load it), started with the JDWP
agent on a port of the test daemon's scan range.

``Quiet`` holds known numbers of instances of its own classes (for the heap dump's histogram),
runs a thread named "worker one", and a thread "gc watcher" that prints "collected" once the
garbage collector cleared a weak reference to an array nothing else holds (a GC ran: nothing
else allocates enough to cause one). It prints "ready", then waits forever; it never allocates
afterwards, so two heap histograms taken one after the other agree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.actors.needs import skip_or_fail
from tests.e2e.lines import ProcessLines

WAIT = 15  # seconds: cap on one condition (JVM start-up included)

QUIET = """\
import java.lang.ref.ReferenceQueue;
import java.lang.ref.WeakReference;
import java.util.ArrayList;
import java.util.List;

public class Quiet {
    static final class Apple { long weight; int seeds; }
    static final class Pear { Object stem; }
    static final class Crate { final Apple[] apples = new Apple[4]; }
    static final List<Object> KEEP = new ArrayList<>();
    static final ReferenceQueue<Object> QUEUE = new ReferenceQueue<>();
    static WeakReference<Object> weak;

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < 3000; i++) KEEP.add(new Apple());
        for (int i = 0; i < 1200; i++) KEEP.add(new Pear());
        for (int i = 0; i < 75; i++) KEEP.add(new Crate());
        weak = new WeakReference<>(new Object[1000], QUEUE);
        Thread watcher = new Thread(() -> {
            try {
                QUEUE.remove();
                System.out.println("collected");
                System.out.flush();
            } catch (InterruptedException e) { }
        }, "gc watcher");
        watcher.setDaemon(true);
        watcher.start();
        Thread worker = new Thread(() -> {
            try { Thread.sleep(Long.MAX_VALUE); } catch (InterruptedException e) { }
        }, "worker one");
        worker.setDaemon(true);
        worker.start();
        System.out.println("ready");
        System.out.flush();
        synchronized (Quiet.class) { Quiet.class.wait(); }
    }
}
"""
#: What Quiet holds of its own classes (``jmap -histo:live`` names, as ddmd's histogram).
OWN_CLASSES = {"Quiet$Apple": 3000, "Quiet$Pear": 1200, "Quiet$Crate": 75, "Quiet$Apple[]": 75}
MAIN_LINE = next(i for i, line in enumerate(QUIET.splitlines(), 1) if "Quiet.class.wait" in line)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"{name!r} is not on PATH (install a JDK 17 to run the attach tests)")
    return path


@pytest.fixture(scope="session")
def quiet_classes() -> Iterator[Path]:
    """Quiet.class in a fresh directory readable by every user."""
    javac = tool("javac")
    out = Path(tempfile.mkdtemp(prefix="ddmd-attach-"))
    try:
        out.chmod(0o755)
        (out / "Quiet.java").write_text(QUIET)
        subprocess.run(
            [javac, "-g", "-d", str(out), str(out / "Quiet.java")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        for path in out.iterdir():
            path.chmod(0o644)
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


class Jvm(ProcessLines):
    """A running Quiet with the JDWP agent on ``port``."""

    def __init__(self, process: trio.Process, port: int) -> None:
        super().__init__(process)
        self.port = port

    @property
    def vm_id(self) -> str:
        return f"tcp:{self.port}"

    async def wait_line(self, text: str) -> None:
        with trio.fail_after(WAIT):
            while text not in self.lines:
                if self.process.returncode is not None and not any(
                    text == line for line in self.lines
                ):
                    raise AssertionError(f"the JVM exited before {text!r}: {self.lines[-20:]}")
                await self._changed.wait()

    def printed(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def _forget_socket(pid: int) -> None:
    """A killed JVM leaves its attach socket in /tmp (a new JVM of that pid would replace it)."""
    Path(f"/tmp/.java_pid{pid}").unlink(missing_ok=True)


@asynccontextmanager
async def run_quiet(
    classes: Path,
    port: int,
    *,
    flags: Sequence[str] = (),
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> AsyncIterator[Jvm]:
    """``[PREFIX] java -Xshare:off -Xmx256m FLAGS -agentlib:jdwp=... -cp CLASSES Quiet``,
    until it printed "ready" and its agent listens. (-Xshare:off: no archived objects of the
    class-data-sharing heap, which heap dumps leave out, to tell the histograms apart.)"""
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
    command = [*prefix, tool("java"), "-Xshare:off", "-Xmx256m", *flags, agent,
               "-cp", str(classes), "Quiet"]  # fmt: skip
    environment: dict[str, Any] | None = None if env is None else {**os.environ, **env}
    process = await trio.lowlevel.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=str(classes),
        env=environment,
    )
    jvm = Jvm(process, port)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(jvm._read)
            try:
                await jvm.wait_line("ready")
                with trio.fail_after(WAIT):
                    while not jvm.printed("Listening for transport dt_socket"):
                        await jvm._changed.wait()
                yield jvm
            finally:
                if process.returncode is None:
                    process.kill()
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    await process.wait()
                nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        _forget_socket(process.pid)
