"""The Java side of the benches (sources in bench/java): compiling them, target JVMs with the
JDWP agent listening on a fixed port, the long-lived JDI client ``RoundTrip``, the JDK's
version, and the time ``jdb -attach`` takes to its first prompt.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import HOST, JAVA_DIR
from .children import Child, Children
from .ports import Ports
from .proc import cpu_ticks

#: The target JVMs' flags (bridge_latency, front, multi_debugger): small and predictable.
TARGET_OPTS = ("-Xmx64m", "-XX:+UseSerialGC")


def compile_java(
    out: Path, sources: Sequence[str], *, debug: bool = False, classpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``javac [-g] -d OUT [-cp CLASSPATH] bench/java/SOURCE...``; raises when it fails unless
    a classpath is given (the caller says why that one cannot run)."""
    argv = ["javac", *(["-g"] if debug else []), "-d", str(out)]
    argv += ["-cp", classpath] if classpath is not None else []
    argv += [str(JAVA_DIR / s) for s in sources]
    if classpath is None:
        return subprocess.run(argv, check=True, text=True)
    return subprocess.run(argv, capture_output=True, text=True)


def java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    match = re.search(r'version "([^"]+)"', done.stderr)
    return match.group(1) if match else "?"


def jvm_argv(port: int, classes: Path, main: str, opts: Sequence[str] = TARGET_OPTS) -> list[str]:
    """``java`` with the JDWP agent listening on 127.0.0.1:``port`` (suspend=n)."""
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address={HOST}:{port}"
    return ["java", agent, *opts, "-cp", str(classes), main]


def wait_agent(jvm: Child, port: int, timeout: float = 20.0) -> None:
    """Until the JVM's agent says it listens on ``port``."""
    jvm.wait_match(rf"Listening for transport dt_socket at address: {port}\b", timeout)


@dataclass
class Jvm:
    name: str
    port: int
    child: Child

    @property
    def pid(self) -> int:
        return self.child.pid


def start_jvms(
    children: Children, n: int, ports: Ports, classes: Path, timeout: float = 20.0
) -> list[Jvm]:
    """``n`` identical target JVMs (JVM#1...) running ``Target``, started together."""
    jvms = []
    for i in range(n):
        port = ports.take()
        name = f"JVM#{i + 1}"
        jvms.append(Jvm(name, port, children.start(name, jvm_argv(port, classes, "Target"))))
    for jvm in jvms:
        wait_agent(jvm.child, jvm.port, timeout)
    return jvms


@dataclass
class Session:
    attach_ms: float
    samples_us: list[float]
    # CPU clock ticks (utime, stime) of each watched process over the timed calls
    cpu: dict[str, tuple[int, int]] = field(default_factory=dict)


class RoundTripClient:
    """The long-lived RoundTrip.java process (a JDI client)."""

    def __init__(self, children: Children, classes: Path) -> None:
        self.child = children.start("RoundTrip", ["java", "-cp", str(classes), "RoundTrip"])
        self.child.wait_match(r"^READY$", 20)

    def measure(
        self, port: int, warmup: int, count: int, watch: Sequence[tuple[str, int]] = ()
    ) -> Session:
        """One session; with ``watch`` ((label, pid), ...), the CPU ticks each of those
        processes spent during the timed calls."""
        cpu: dict[str, tuple[int, int]] = {}
        if watch:
            self.child.send(f"{HOST} {port} {warmup} {count} sync")
            self.mark(port)
            before = [cpu_ticks(pid) for _, pid in watch]
            self.child.send("go")
            self.mark(port)
            after = [cpu_ticks(pid) for _, pid in watch]
            self.child.send("go")
            for (label, _), (u0, s0), (u1, s1) in zip(watch, before, after, strict=True):
                cpu[label] = (u1 - u0, s1 - s0)
        else:
            self.child.send(f"{HOST} {port} {warmup} {count}")
        fields = self.result(port)
        return Session(int(fields[1]) / 1e6, [int(x) / 1000 for x in fields[2:]], cpu)

    def mark(self, port: int) -> None:
        """Wait for the client's MARK; its ERR line raises."""
        line = self.child.wait_match(r"^(MARK$|ERR )", 60)[1].string
        if line.startswith("ERR"):
            raise RuntimeError(f"RoundTrip on port {port}: {line}")

    def result(self, port: int) -> list[str]:
        """The session's RT line, split; its ERR line raises."""
        line = self.child.wait_match(r"^(RT|ERR) ", 60)[1].string
        if line.startswith("ERR"):
            raise RuntimeError(f"RoundTrip on port {port}: {line}")
        return line.split()


def jdb_attach_ms(port: int, timeout: float = 30.0) -> float:
    """Milliseconds from starting ``jdb -attach`` to its first prompt; then ``quit``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        ["jdb", "-attach", f"{HOST}:{port}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        fd = proc.stdout.fileno()
        out = b""
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"jdb: no prompt within {timeout:g} s: {out[-300:]!r}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                raise RuntimeError(f"jdb exited before its prompt: {out[-300:]!r}")
            out += data
            start = out.find(b"Initializing jdb")
            if start >= 0 and re.search(rb"\n> ", out[start:]):
                took = (time.perf_counter() - t0) * 1000
                break
        proc.stdin.write(b"quit\n")
        proc.stdin.flush()
        proc.wait(10)
        return took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdin.close()
        proc.stdout.close()
