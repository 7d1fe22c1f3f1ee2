"""Real-peer fixtures: the JDK tools, and a small real Java program with the JDWP agent.

``jdk`` gives the paths of java, javac and jdb. Without them the test is skipped with a
reason, except in CI (``CI=true``), where a missing JDK is a failure, never a skip.

``counter_jvm`` compiles ``Counter.java`` (written into ``tmp_path``) and starts it with
``-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:PORT`` on a free
port below the ephemeral range (so a ddmd scan range can hold it). The program prints
``count N`` every 100 ms; ``CounterJvm.count`` is the last number read from its stdout. The
process is killed at the end of the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range

COUNTER_SOURCE = """\
public class Counter {
    public static void main(String[] args) throws Exception {
        long n = 0;
        while (true) {
            System.out.println("count " + n);
            System.out.flush();
            n++;
            Thread.sleep(100);
        }
    }
}
"""

START_CAP = 30  # seconds: compile + start + listening, on a slow machine


@dataclass(frozen=True, slots=True)
class Jdk:
    java: str
    javac: str
    jdb: str


def require_tool(name: str) -> str:
    """Path of ``name``; skip when missing, but fail in CI (CI=true) where the JDK is required."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name!r} is not on PATH (install a JDK 17 to run the jvm tests)"
        skip_or_fail(reason)
    return path


@pytest.fixture
def jdk() -> Jdk:
    # A plain (sync) fixture: skip/fail reach pytest directly, not through a nursery.
    return Jdk(require_tool("java"), require_tool("javac"), require_tool("jdb"))


_COUNT = re.compile(rb"^count (\d+)$", re.MULTILINE)
_LISTENING = b"Listening for transport dt_socket at address:"


@dataclass
class CounterJvm:
    """The running Counter program: its JDWP port, process and what it printed."""

    port: int
    process: trio.Process
    output: bytearray = field(default_factory=bytearray)
    count: int | None = None
    listening: trio.Event = field(default_factory=trio.Event)

    async def read_output(self) -> None:
        assert self.process.stdout is not None
        async for data in self.process.stdout:
            self.output += data
            if _LISTENING in self.output:
                self.listening.set()
            counts = _COUNT.findall(self.output[-4096:])
            if counts:
                self.count = int(counts[-1])

    def text(self) -> str:
        return self.output.decode("utf-8", "replace")


async def _compile(jdk: Jdk, src_dir: Path) -> Path:
    source = src_dir / "Counter.java"
    source.write_text(COUNTER_SOURCE)
    classes = src_dir / "classes"
    result = await trio.run_process(
        [jdk.javac, "-d", str(classes), str(source)], capture_stdout=True, capture_stderr=True
    )
    assert result.returncode == 0, result.stderr.decode()
    return classes


@pytest.fixture
async def counter_jvm(jdk: Jdk, tmp_path: Path) -> AsyncIterator[CounterJvm]:
    (port,) = free_port_range(1)
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
    async with trio.open_nursery() as nursery:
        with trio.fail_after(START_CAP):
            classes = await _compile(jdk, tmp_path)
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [jdk.java, agent, "-cp", str(classes), "Counter"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            )
            jvm = CounterJvm(port, process)
            nursery.start_soon(jvm.read_output)
            await jvm.listening.wait()  # the agent prints this once its port is open
        try:
            yield jvm
        finally:
            process.kill()
            nursery.cancel_scope.cancel()
