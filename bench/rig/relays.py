"""The reference relays and the adb side of bridge_latency.py's paths, each its own process on
127.0.0.1: the plain trio relay (``trio_relay.py``), the bare one-thread relays (``bare_relay.py``
and ``java/BareRelay.java``), socat, the stand-in adb server (``fake_adb.py``), an
``adb forward`` made on it, and ddmlib's driver (``java/DdmlibDriver.java``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import HOST, RIG
from .children import Child, Children
from .jdwp import recv_exact
from .jvm import Jvm
from .ports import Ports, wait_listening

# ddmlib 25.x from Debian's libandroid-ddms-java and what it needs at run time
DDMLIB_JARS = tuple(
    f"/usr/share/java/{jar}.jar"
    for jar in ("com.android.tools.ddms.ddmlib", "com.android.tools.common", "guava", "kxml2")
)
DDMLIB_LOG = os.environ.get("BENCH_DDMLIB_LOG", "warn")  # ddmlib's log level (to its stderr)


def _start_ready(children: Children, name: str, argv: Sequence[str]) -> Child:
    child = children.start(name, argv)
    child.wait_match(r"^ready$", 20)
    return child


def start_relay(children: Children, listen_port: int, target_port: int) -> Child:
    """The trio relay from ``listen_port`` to ``target_port``."""
    argv = [sys.executable, str(RIG / "trio_relay.py"), str(listen_port), str(target_port)]
    return _start_ready(children, "trio relay", argv)


def start_relay_adb(
    children: Children, listen_port: int, adb_port: int, serial: str, pid: int
) -> Child:
    """The trio relay whose upstream is ``jdwp:PID`` through the adb server on ``adb_port``."""
    argv = [sys.executable, str(RIG / "trio_relay.py"), str(listen_port), str(adb_port)]
    return _start_ready(children, "trio relay via adb", [*argv, serial, str(pid)])


def start_bare_relay(
    children: Children, kind: str, classes: Path, listen_port: int, target_port: int
) -> Child:
    """A bare one-thread relay (``bare_relay.py``, or ``java/BareRelay.java``): the floor of
    what a relay in that language costs, with no logic at all."""
    if kind == "java":
        argv = ["java", "-cp", str(classes), "BareRelay"]
    else:
        argv = [sys.executable, str(RIG / "bare_relay.py")]
    return _start_ready(children, f"{kind} relay", [*argv, str(listen_port), str(target_port)])


def start_socat(children: Children, listen_port: int, target_port: int) -> Child:
    listen = f"TCP-LISTEN:{listen_port},bind={HOST},reuseaddr,fork"
    child = children.start("socat", ["socat", listen, f"TCP:{HOST}:{target_port}"])
    wait_listening(listen_port, child)
    return child


@dataclass
class FakeAdb:
    child: Child
    port: int
    serial: str


def start_fake_adb(children: Children, serial: str, *jvms: Jvm) -> FakeAdb:
    """A stand-in adb server whose one device has these debuggable pids."""
    argv = [sys.executable, str(RIG / "fake_adb.py"), "--serial", serial]
    for jvm in jvms:
        argv += ["--pid", f"{jvm.pid}={jvm.port}"]
    child = children.start(f"fake adb {serial}", argv)
    port = int(child.wait_match(r"^listening (\d+)$", 20)[1].group(1))
    return FakeAdb(child, port, serial)


def adb_forward(fake: FakeAdb, local_port: int, pid: int) -> str:
    """``adb -P PORT forward tcp:LOCAL jdwp:PID`` with the real adb client; how it was done."""
    adb = shutil.which("adb")
    spec = f"tcp:{local_port} jdwp:{pid}"
    if adb is not None:
        argv = [adb, "-P", str(fake.port), "-s", fake.serial, "forward", *spec.split()]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed: {(done.stdout + done.stderr).strip()}")
        return f"`adb forward {spec}` (the real adb client)"
    # No adb program: the same host request, sent from here.
    service = f"host-serial:{fake.serial}:forward:{spec.replace(' ', ';')}".encode()
    with socket.create_connection((HOST, fake.port), timeout=10) as sock:
        sock.sendall(b"%04x" % len(service) + service)
        if recv_exact(sock, 8) != b"OKAYOKAY":
            raise RuntimeError(f"the stand-in adb server refused forward {spec}")
    return f"forward {spec} requested directly (no adb program on PATH)"


@dataclass
class Ddmlib:
    child: Child
    debugger_port: int


def start_ddmlib(
    children: Children, classes: Path, jars: Sequence[str], fake: FakeAdb, ports: Ports
) -> Ddmlib:
    """DdmlibDriver on the stand-in server ``fake``; returns once its VM has a debugger port."""
    classpath = os.pathsep.join([str(classes), *jars])
    base, selected = ports.take(), ports.take()
    argv = ["java", "-cp", classpath, "DdmlibDriver", str(fake.port)]
    child = children.start("ddmlib", [*argv, str(base), str(selected), "30", DDMLIB_LOG])
    line = child.wait_match(r"^(CLIENT \S+ \d+ \d+|ERR .*)$", 40)[1].string
    if line.startswith("ERR"):
        raise RuntimeError(f"ddmlib: {line[4:]}")
    return Ddmlib(child, int(line.split()[3]))
