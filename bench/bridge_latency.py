"""JDWP bridge benchmark: JDI round-trip latency and CPU, jdb attach time, 1 GiB relay memory.

Run: ``.venv/bin/python bench/bridge_latency.py [--quick] [--phases 4] [--rounds 2]
[--count 2000] [--skip-big] [--profile]``

Everything runs as separate processes on 127.0.0.1; the Java side (``bench/java/``) is compiled
with javac into a temp dir at start. ``--quick`` is a smoke run (two phases, one round, 300 timed
calls per session, under a minute in all); its figures are rough.

Round trips. ``RoundTrip.java`` is one long-lived JDI client (so every path is measured by the
same warmed-up JVM): per session it attaches with ``com.sun.jdi.SocketAttach``, calls
``ThreadReference.status()`` on the target's sleeping ``main`` thread WARMUP times untimed and
COUNT times timed, then ``dispose()``. The paths, all measured in one interleaved run (the order
rotates every round, so drift and order effects hit all paths alike):

- direct:             JDI -> the JVM's JDWP port;
- trio relay:         JDI -> a plain trio byte relay (this script in ``--relay`` mode, its own
  process: ``receive_some``/``send_all`` both ways) -> the JVM;
- socat:              JDI -> ``socat TCP-LISTEN:..,reuseaddr,fork TCP:..`` -> the JVM (when
  installed);
- ddmd:               JDI -> ddmd's current-VM port -> the JVM, found by ddmd's port scan and
  selected through ``POST /api/v1/vms/{target}/select`` ("the scan path");
- adb forward:        the plain adb stream. JDI -> the adb server's forward listener -> the JVM,
  set up with the real ``adb -P PORT forward tcp:X jdwp:PID`` (Debian's adb client) against a
  stand-in adb server (``fake_adb.py``, see below), which then relays every connection to the
  pid as the real server relays it to the device. This is what a debugger gets from adb alone;
- trio relay via adb: JDI -> the trio relay (``--relay-adb`` mode), which opens ``jdwp:PID``
  through the stand-in adb server for each connection -> the JVM: a plain relay on the adb
  path, the counterpart of "trio relay" on the scan path;
- ddmd via adb:       JDI -> ddmd's per-VM debugger port -> ddmd's ``jdwp:PID`` stream through
  the stand-in adb server -> the JVM. ddmd runs with ``[adb] enabled = "on"`` and that server's
  port, and finds the VM by ``track-jdwp`` as it finds a phone's apps;
- ddmlib via adb:     the reference. JDI -> the old ddmlib's per-VM debugger port -> ddmlib's
  ``jdwp:PID`` stream through the stand-in adb server -> the JVM. ddmlib is Debian's
  ``libandroid-ddms-java`` (ddmlib 25.x, what DDMS and Android Studio 2 used), driven by
  ``java/DdmlibDriver.java`` (``AndroidDebugBridge`` with client support, per-VM port base and
  "selected client" port set to free ports). Skipped, with a note, when its jars are missing.
  ddmlib reopens its VM connection after each debugger leaves (about a second), so its attach
  time includes that wait when the previous session on it was recent. BENCH_DDMLIB_LOG=debug
  (or verbose) in the environment makes ddmlib log more, to its stderr.

There is no Android device here. ``fake_adb.py`` (a child process, one per owner so that ddmd
and ddmlib each see only their own VM) speaks the adb host protocol and plays the device too:
its device's ``jdwp:PID`` leads to a local JVM, the pid being the JVM's real pid. So on the adb
paths the stand-in server's relay replaces the adb server + USB + adbd of a real phone; only
differences between adb paths (ddmd's own hop = "ddmd via adb" - "adb forward") carry over to a
real device, not the absolute figures.

A JVM takes one JDWP connection at a time and ddmd and ddmlib keep theirs, so four identical
JVMs (same program, same flags) are used, in four roles: "free" (direct, trio relay, socat,
adb forward, trio relay via adb: one session at a time), "scan" (owned by ddmd through its
scan), "adb" (owned by ddmd through adb) and "ddmlib" (owned by ddmlib). One ddmd process serves
both the scan and the adb path. Each phase starts fresh ddmd, ddmlib and stand-in servers; the
roles rotate over the JVMs from phase to phase (``--phases 4``: every JVM takes every role
once), so a difference between the JVMs cancels out. Before timing, in the first phase, two
sessions through ddmd that differ by 1000 calls are compared with ddmd's own packet counters
(``debugger.detached`` log event), on the scan and on the adb path: each ``status()`` must be
exactly one command and one reply.

CPU per round trip: for every session, the utime+stime of every process on its path (relays,
socat, ddmd, the stand-in adb server, ddmlib's JVM; and, for reference, the target JVM and the
JDI client) is read from /proc/PID/stat right before and right after the timed calls (the JDI
client waits at both marks), summed over all sessions of the path and divided by their round
trips. /proc counts in clock ticks (10 ms), so short runs (``--quick``) give coarse figures;
the tick counts are printed.

jdb attach: the time from starting ``jdb -attach 127.0.0.1:PORT`` to its first ``>`` prompt
(then ``quit``), direct vs through ddmd (scan path), one of each per round, interleaved.

1 GiB packet: a fake VM (``--fake-vm`` mode: JDWP handshake, HELO -> error 99, Version, and a
reply of exactly 2**30 bytes, header included, to VirtualMachine.AllClasses, streamed from one
reusable buffer) behind a fresh ddmd, and a fake debugger here that sends AllClasses through the
current-VM port and reads and discards the reply, checking its length and restored id. ddmd's
VmHWM (/proc/PID/status) before and after, its VmRSS sampled meanwhile, and the throughput. When
the relay fails with the default config, it runs once more with [debugger] queue_packets raised
so that the debugger is never dropped, to show what then bounds ddmd's memory.

Targets, as ratios within the run: on the scan path, ddmd's added median latency (over direct)
at most 1.1x the trio relay's, and ddmd's CPU per round trip at most 1.1x the trio relay's; on
the adb path, ddmd's own hop ("ddmd via adb" - "adb forward", medians) no more than ddmd's added
latency on the scan path; attach through ddmd at most 1.5x direct; ddmd's RSS under 100 MB
(10**6 bytes) while the 1 GiB packet is relayed. Comparisons with ddmlib and with the trio relay
on the adb path are printed as information. Prints figures and PASS/MISS; asserts nothing.
``--profile`` then measures ddmd and the trio relay once more over many round trips and, when
py-spy is installed (``.venv/bin/pip install py-spy``), samples ddmd meanwhile and prints its
hot spots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

from children import Child

ROOT = Path(__file__).resolve().parent.parent
JAVA_DIR = Path(__file__).resolve().parent / "java"
FAKE_ADB = Path(__file__).resolve().parent / "fake_adb.py"
HOST = "127.0.0.1"
# ddmlib 25.x from Debian's libandroid-ddms-java and what it needs at run time
DDMLIB_JARS = tuple(
    f"/usr/share/java/{jar}.jar"
    for jar in ("com.android.tools.ddms.ddmlib", "com.android.tools.common", "guava", "kxml2")
)
DDMLIB_LOG = os.environ.get("BENCH_DDMLIB_LOG", "warn")  # ddmlib's log level (to its stderr)

LATENCY_TARGET = 1.1  # added(ddmd) / added(trio relay), medians
CPU_TARGET = 1.1  # CPU per round trip: ddmd / trio relay, scan path
HOP_TARGET = 1.0  # ddmd's own hop on the adb path / ddmd's added latency on the scan path
ATTACH_TARGET = 1.5  # jdb attach through ddmd / direct, medians
RSS_TARGET_MB = 100.0  # ddmd's peak RSS while a 1 GiB packet is relayed
MB = 1_000_000
BIG = 1 << 30  # the big reply's JDWP length, header included: ddmd's default max_packet_bytes
BIG_QUEUE = 1 << 20  # [debugger] queue_packets for the retry: more pieces than 1 GiB can make
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAUSE = 0.15  # between two measurements: the JVM (or ddmd) reopens after a debugger leaves

HANDSHAKE = b"JDWP-Handshake"
HEADER = struct.Struct(">IIBBB")
REPLY_HEADER = struct.Struct(">IIBH")


# --------------------------------------------------------------------------------------------
# Child processes


class Children:
    """Every process started, stopped in reverse order however the run ends."""

    def __init__(self) -> None:
        self.items: list[Child] = []

    def start(self, name: str, argv: Sequence[str], *, stdout: IO[str] | None = None) -> Child:
        child = Child(name, argv, stdout=stdout)
        self.items.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self.items:
            self.items.remove(child)

    def stop_all(self) -> None:
        while self.items:
            child = self.items.pop()
            with contextlib.suppress(Exception):
                child.stop()


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB (10**6 bytes)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024 / MB
    return values["VmRSS"], values["VmHWM"]


# --------------------------------------------------------------------------------------------
# Ports


class Ports:
    """Free loopback ports below the ephemeral range, never the same one twice in a run."""

    def __init__(self) -> None:
        self._next = random.randrange(20000, 30000)
        self._given: set[int] = set()

    def take(self) -> int:
        while self._next < 32768:
            port = self._next
            self._next += 1
            if port not in self._given and _bindable(port):
                self._given.add(port)
                return port
        raise RuntimeError("no free port left below 32768")

    def take_range(self, n: int) -> tuple[int, int]:
        """``n`` consecutive free ports: (first, last)."""
        while self._next + n <= 32768:
            first = self._next
            span = range(first, first + n)
            self._next += 1
            if all(p not in self._given and _bindable(p) for p in span):
                self._given.update(span)
                self._next = first + n
                return first, first + n - 1
        raise RuntimeError(f"no {n} consecutive free ports left below 32768")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def wait_listening(port: int, child: Child, timeout: float = 10.0) -> None:
    """Wait until something listens on ``port`` (seen as "cannot bind"; never connects)."""
    deadline = time.monotonic() + timeout
    while _bindable(port):
        child.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} does not listen on {port} after {timeout:g} s")
        time.sleep(0.02)


# --------------------------------------------------------------------------------------------
# Java: target JVMs and the JDI round-trip client


DDMLIB_DRIVER = "DdmlibDriver.java"


def compile_java(out: Path, ddmlib_jars: Sequence[str]) -> str | None:
    """Compile bench/java into ``out``; DdmlibDriver only when ddmlib's jars are all there.
    Returns why the ddmlib path cannot run, or None."""
    sources = sorted(str(p) for p in JAVA_DIR.glob("*.java") if p.name != DDMLIB_DRIVER)
    subprocess.run(["javac", "-d", str(out), *sources], check=True)
    missing = [jar for jar in ddmlib_jars if not Path(jar).is_file()]
    if missing:
        return (
            f"ddmlib via adb: skipped, {', '.join(missing)} not found (Debian: apt install "
            "libandroid-ddms-java, or --ddmlib-classpath)"
        )
    classpath = os.pathsep.join(ddmlib_jars)
    done = subprocess.run(
        ["javac", "-d", str(out), "-cp", classpath, str(JAVA_DIR / DDMLIB_DRIVER)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return f"ddmlib via adb: skipped, DdmlibDriver does not compile: {done.stderr[-500:]}"
    return None


def java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    match = re.search(r'version "([^"]+)"', done.stderr)
    return match.group(1) if match else "?"


@dataclass
class Jvm:
    name: str
    port: int
    child: Child

    @property
    def pid(self) -> int:
        return self.child.pid


def start_jvms(children: Children, n: int, ports: Ports, classes: Path) -> list[Jvm]:
    """``n`` identical target JVMs (JVM#1...), started together."""
    jvms = []
    for i in range(n):
        port = ports.take()
        agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address={HOST}:{port}"
        argv = ["java", agent, "-Xmx64m", "-XX:+UseSerialGC", "-cp", str(classes), "Target"]
        jvms.append(Jvm(f"JVM#{i + 1}", port, children.start(f"JVM#{i + 1}", argv)))
    for jvm in jvms:
        jvm.child.wait_match(rf"Listening for transport dt_socket at address: {jvm.port}\b", 20)
    return jvms


@dataclass
class Session:
    attach_ms: float
    samples_us: list[float]
    # CPU clock ticks (utime, stime) of each watched process over the timed calls
    cpu: dict[str, tuple[int, int]] = field(default_factory=dict)


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of a process, all its threads, in clock ticks (/proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]), int(fields[12])


class RoundTripClient:
    """The long-lived RoundTrip.java process."""

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
            self._mark(port)
            before = [cpu_ticks(pid) for _, pid in watch]
            self.child.send("go")
            self._mark(port)
            after = [cpu_ticks(pid) for _, pid in watch]
            self.child.send("go")
            for (label, _), (u0, s0), (u1, s1) in zip(watch, before, after, strict=True):
                cpu[label] = (u1 - u0, s1 - s0)
        else:
            self.child.send(f"{HOST} {port} {warmup} {count}")
        line = self.child.wait_match(r"^(RT|ERR) ", 60)[1].string
        if line.startswith("ERR"):
            raise RuntimeError(f"RoundTrip on port {port}: {line}")
        fields = line.split()
        return Session(int(fields[1]) / 1e6, [int(x) / 1000 for x in fields[2:]], cpu)

    def _mark(self, port: int) -> None:
        """Wait for the client's MARK; its ERR line raises."""
        line = self.child.wait_match(r"^(MARK$|ERR )", 60)[1].string
        if line.startswith("ERR"):
            raise RuntimeError(f"RoundTrip on port {port}: {line}")


# --------------------------------------------------------------------------------------------
# Relays: trio (this script, --relay), socat, ddmd


def relay_main(listen_port: int, target_port: int, adb: tuple[str, int] | None = None) -> None:
    """A plain trio byte relay: one upstream connection per accepted client, bytes both ways.
    With ``adb`` (serial, pid), ``target_port`` is an adb server's and each upstream connection
    is a ``jdwp:PID`` stream opened through it (selector, then service, each answered OKAY)."""
    import trio

    async def adb_request(stream: trio.SocketStream, service: str) -> None:
        await stream.send_all(b"%04x" % len(service) + service.encode())
        status = b""
        while len(status) < 4:
            data = await stream.receive_some(4 - len(status))
            if not data:
                raise OSError(f"the adb server closed the connection after {service!r}")
            status += data
        if status != b"OKAY":
            raise OSError(f"the adb server refused {service!r}: {status!r}")

    async def open_upstream() -> trio.SocketStream:
        with trio.fail_after(5):
            upstream = await trio.open_tcp_stream(HOST, target_port)
            if adb is not None:
                try:
                    await adb_request(upstream, f"host:transport:{adb[0]}")
                    await adb_request(upstream, f"jdwp:{adb[1]}")
                except BaseException:
                    await upstream.aclose()
                    raise
            return upstream

    async def pump(src: trio.SocketStream, dst: trio.SocketStream, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            done.cancel()

    async def handle(client: trio.SocketStream) -> None:
        async with client:
            try:
                upstream = await open_upstream()
            except (OSError, trio.TooSlowError) as exc:
                print(f"relay: no upstream: {exc!r}", file=sys.stderr, flush=True)
                return
            async with upstream, trio.open_nursery() as nursery:
                nursery.start_soon(pump, client, upstream, nursery.cancel_scope)
                nursery.start_soon(pump, upstream, client, nursery.cancel_scope)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, handle, listen_port, host=HOST))
            print("ready", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(serve)


def start_relay(children: Children, listen_port: int, target_port: int) -> Child:
    argv = [sys.executable, str(Path(__file__).resolve()), "--relay", str(listen_port)]
    child = children.start("trio relay", [*argv, str(target_port)])
    child.wait_match(r"^ready$", 20)
    return child


def start_relay_adb(
    children: Children, listen_port: int, adb_port: int, serial: str, pid: int
) -> Child:
    argv = [sys.executable, str(Path(__file__).resolve()), "--relay-adb", str(listen_port)]
    child = children.start("trio relay via adb", [*argv, str(adb_port), serial, str(pid)])
    child.wait_match(r"^ready$", 20)
    return child


# --------------------------------------------------------------------------------------------
# The adb side: stand-in adb servers (fake_adb.py), adb forward, ddmlib


@dataclass
class FakeAdb:
    child: Child
    port: int
    serial: str


def start_fake_adb(children: Children, serial: str, jvm: Jvm) -> FakeAdb:
    """A stand-in adb server whose one device has one debuggable pid: ``jvm``."""
    argv = [sys.executable, str(FAKE_ADB), "--serial", serial, "--pid", f"{jvm.pid}={jvm.port}"]
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


def start_socat(children: Children, listen_port: int, target_port: int) -> Child:
    listen = f"TCP-LISTEN:{listen_port},bind={HOST},reuseaddr,fork"
    child = children.start("socat", ["socat", listen, f"TCP:{HOST}:{target_port}"])
    wait_listening(listen_port, child)
    return child


@dataclass
class Ddmd:
    child: Child
    log_path: Path
    control_port: int
    current_port: int
    vm_id: str
    log_file: IO[str]
    adb_vm_id: str | None = None  # the VM found through adb, and its own debugger port
    adb_port: int | None = None


def write_config(
    path: Path, *, scan: int, ports: Ports, queue_packets: int | None, adb: int | None = None
) -> tuple[int, int]:
    """ddmd's config: scan only port ``scan``; with ``adb``, use the adb server on that port
    (and never start one: the adb program configured does not exist)."""
    control_port, current_port = ports.take(), ports.take()
    first, last = ports.take_range(2)  # a per-VM port for the scanned VM and the adb one
    queue = "" if queue_packets is None else f"queue_packets = {queue_packets}\n"
    if adb is None:
        adb_section = 'enabled = "off"'
    else:
        no_adb = path.parent / "no-adb-program"
        adb_section = f'enabled = "on"\nhost = "{HOST}"\nport = {adb}\npath = "{no_adb}"'
    path.write_text(
        f"""\
[scan]
host = "{HOST}"
ports = "{scan}"
interval = 0.5

[adb]
{adb_section}

[debugger]
host = "{HOST}"
ports = "{first}-{last}"
current_port = {current_port}
state_file = "{path.parent / (path.stem + "-ports.json")}"
{queue}
[control]
host = "{HOST}"
port = {control_port}

[log]
format = "json"
level = "info"
"""
    )
    return control_port, current_port


def start_ddmd(
    children: Children,
    work: Path,
    name: str,
    scan_port: int,
    ports: Ports,
    *,
    queue_packets: int | None = None,
    adb: tuple[FakeAdb, Jvm] | None = None,
) -> Ddmd:
    """``ddmd run`` scanning only ``scan_port``; returns once that VM is identified and selected.
    With ``adb`` (server, JVM behind it), also once the JVM is ready through adb."""
    config = work / f"{name}.toml"
    control_port, current_port = write_config(
        config,
        scan=scan_port,
        ports=ports,
        queue_packets=queue_packets,
        adb=None if adb is None else adb[0].port,
    )
    log_path = work / f"{name}.log"
    log_file = log_path.open("w", encoding="utf-8")
    argv = [sys.executable, "-m", "ddmd", "run", "--config", str(config), "--log-format", "json"]
    child = children.start(name, argv, stdout=log_file)
    ddmd = Ddmd(child, log_path, control_port, current_port, f"tcp:{scan_port}", log_file)
    try:
        wait_vm(ddmd, ddmd.vm_id)
        select_vm(ddmd, ddmd.vm_id)
        if adb is not None:
            ddmd.adb_vm_id = f"{adb[0].serial}/{adb[1].pid}"
            ddmd.adb_port = int(str(wait_vm(ddmd, ddmd.adb_vm_id)["debugger_port"]))
    except BaseException:
        stop_ddmd(children, ddmd)
        raise
    return ddmd


def wait_vm(ddmd: Ddmd, vm_id: str, timeout: float = 30.0) -> dict[str, object]:
    """The control API's entry of ``vm_id`` once it is ready (a plain JVM: no DDM) and has its
    own debugger port."""
    import httpx

    base = f"http://{HOST}:{ddmd.control_port}/api/v1"
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while True:
            ddmd.child.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"ddmd did not list {vm_id} as ready within {timeout:g} s")
            try:
                vms = client.get(f"{base}/vms").json()
            except (httpx.HTTPError, ValueError):
                vms = []
            for v in vms:
                ready = v["state"] == "ready" and v["ddm"] is False
                if v["id"] == vm_id and ready and v.get("debugger_port"):
                    return dict(v)
            time.sleep(0.1)


def select_vm(ddmd: Ddmd, vm_id: str) -> None:
    import httpx

    base = f"http://{HOST}:{ddmd.control_port}/api/v1"
    with httpx.Client(timeout=5.0) as client:
        reply = client.post(f"{base}/vms/{vm_id}/select")
        reply.raise_for_status()


def stop_ddmd(children: Children, ddmd: Ddmd) -> None:
    children.stop(ddmd.child)
    ddmd.log_file.close()


def ddmd_events(log_path: Path, event: str) -> list[dict[str, object]]:
    """Every record of ``event`` in ddmd's JSON log."""
    found = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if f'"{event}"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == event:
                    found.append(record)
    return found


def detached_counters(log_path: Path) -> list[tuple[int, int] | None]:
    """(packets_in, packets_out) of every debugger.detached event in ddmd's JSON log (None for
    an event without them)."""
    return [
        (int(str(r["packets_in"])), int(str(r["packets_out"])))
        if "packets_in" in r and "packets_out" in r
        else None
        for r in ddmd_events(log_path, "debugger.detached")
    ]


def check_one_packet_per_call(rt: RoundTripClient, ddmd: Ddmd, port: int, path: str) -> str:
    """Two sessions through ddmd's ``port`` differing by 1000 status() calls, per ddmd's own
    counters."""
    counts = []
    for n in (200, 1200):
        before = len(detached_counters(ddmd.log_path))
        rt.measure(port, 0, n)
        deadline = time.monotonic() + 10
        while len(entries := detached_counters(ddmd.log_path)) == before:
            if time.monotonic() > deadline:
                raise TimeoutError("ddmd logged no debugger.detached")
            time.sleep(0.02)
        last = entries[-1]
        if last is None:
            return (
                f"check ({path}): skipped, ddmd's debugger.detached log event carries no "
                "packets_in/packets_out"
            )
        counts.append(last)
        time.sleep(PAUSE)
    d_in, d_out = counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]
    verdict = "one command + one reply per call" if d_in == d_out == 1000 else "NOT 1:1"
    return (
        f"check ({path}): +1000 status() calls -> +{d_in} commands, +{d_out} replies in ddmd "
        f"({verdict})"
    )


# --------------------------------------------------------------------------------------------
# jdb


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


# --------------------------------------------------------------------------------------------
# 1 GiB packet: fake VM (--fake-vm) and fake debugger


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += got
    return bytes(data)


def fake_vm_main() -> None:
    """A JDWP peer like a plain JVM, plus a 1 GiB reply to VirtualMachine.AllClasses (1/3)."""
    server = socket.create_server((HOST, 0))
    print(f"listening {server.getsockname()[1]}", flush=True)
    body = memoryview(bytes(4 << 20))  # every byte of the big body comes from this buffer
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn, contextlib.suppress(OSError, EOFError):
            _fake_vm_session(conn, body)


def _fake_vm_session(conn: socket.socket, body: memoryview) -> None:
    if recv_exact(conn, len(HANDSHAKE)) != HANDSHAKE:
        return
    conn.sendall(HANDSHAKE)
    while True:
        length, pid, flags, cmd_set, cmd = HEADER.unpack(recv_exact(conn, HEADER.size))
        recv_exact(conn, length - HEADER.size)
        if flags:
            continue
        if (cmd_set, cmd) == (1, 1):  # Version
            data = b"".join(
                [
                    _jstring("bench fake VM"),
                    struct.pack(">ii", 1, 8),
                    _jstring("17"),
                    _jstring("fake"),
                ]
            )
            conn.sendall(REPLY_HEADER.pack(HEADER.size + len(data), pid, 0x80, 0) + data)
        elif (cmd_set, cmd) == (1, 3):  # AllClasses: 2**30 bytes, header included
            conn.sendall(REPLY_HEADER.pack(BIG, pid, 0x80, 0))
            left = BIG - HEADER.size
            while left:
                n = min(left, len(body))
                conn.sendall(body[:n])
                left -= n
        elif (cmd_set, cmd) == (1, 6):  # Dispose
            conn.sendall(REPLY_HEADER.pack(HEADER.size, pid, 0x80, 0))
            return
        else:  # HELO (199/1) and everything else: NOT_IMPLEMENTED, as HotSpot answers
            conn.sendall(REPLY_HEADER.pack(HEADER.size, pid, 0x80, 99))


def _jstring(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw


@dataclass
class BigResult:
    label: str
    seconds: float
    received: int  # bytes of the reply read, header included
    hwm_before: float
    hwm_after: float
    rss_peak: float
    outcome: str  # "length and id restored OK", the checks that failed, or why it stopped

    @property
    def complete(self) -> bool:
        return self.received == BIG and self.outcome.endswith("OK")

    def describe(self) -> str:
        rate = self.received / self.seconds / MB if self.seconds else 0.0
        head = f"1 GiB reply via ddmd ({self.label}): "
        if self.complete:
            head += f"{self.outcome}; {self.seconds:.2f} s = {rate:.0f} MB/s"
        else:
            head += (
                f"FAILED after {self.received / MB:.0f} of {BIG / MB:.0f} MB "
                f"({self.seconds:.2f} s, {rate:.0f} MB/s): {self.outcome}"
            )
        return (
            f"{head}; ddmd VmHWM {self.hwm_before:.1f} -> {self.hwm_after:.1f} MB "
            f"(VmRSS peak sampled {self.rss_peak:.1f} MB)"
        )


def big_packet(ddmd: Ddmd, label: str) -> BigResult:
    """The fake debugger: AllClasses through ddmd, read and discard the 1 GiB reply."""
    pid = ddmd.child.pid
    _, hwm_before = memory_mb(pid)
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                peak[0] = max(peak[0], memory_mb(pid)[0])
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    request_id = 0x5EED0001
    problems: list[str] = []
    received = 0
    t0 = time.perf_counter()
    seconds = 0.0
    try:
        with socket.create_connection((HOST, ddmd.current_port), timeout=60) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(HANDSHAKE)
            if recv_exact(sock, len(HANDSHAKE)) != HANDSHAKE:
                raise RuntimeError("ddmd did not echo the JDWP handshake")
            t0 = time.perf_counter()
            sock.sendall(HEADER.pack(HEADER.size, request_id, 0, 1, 3))  # AllClasses
            length, got_id, flags, error = REPLY_HEADER.unpack(recv_exact(sock, HEADER.size))
            received = HEADER.size
            if length != BIG:
                problems.append(f"length {length} != {BIG}")
            if got_id != request_id:
                problems.append(f"id 0x{got_id:08x} != 0x{request_id:08x}")
            if flags != 0x80 or error:
                problems.append(f"flags 0x{flags:02x} error {error}")
            buf = memoryview(bytearray(4 << 20))
            while received < length:
                n = sock.recv_into(buf[: min(length - received, len(buf))])
                if not n:
                    raise EOFError("ddmd closed the connection")
                received += n
            seconds = time.perf_counter() - t0
            sock.sendall(HEADER.pack(HEADER.size, request_id + 2, 0, 1, 6))  # Dispose
            recv_exact(sock, HEADER.size)
    except (OSError, EOFError) as exc:
        seconds = seconds or time.perf_counter() - t0
        time.sleep(0.3)  # let ddmd log why
        reasons = [r.get("reason") for r in ddmd_events(ddmd.log_path, "debugger.detached")]
        problems.append(f"{exc} (ddmd: {reasons[-1] if reasons else '?'})")
    finally:
        stop.set()
        sampler.join()
    _, hwm_after = memory_mb(pid)
    outcome = "; ".join(problems) if problems else "length and id restored OK"
    return BigResult(label, seconds, received, hwm_before, hwm_after, peak[0], outcome)


def big_packet_phase(children: Children, work: Path, ports: Ports) -> list[BigResult]:
    """The default config first; if the relay fails, once more with a queue that cannot fill."""
    fake = children.start("fake VM", [sys.executable, str(Path(__file__).resolve()), "--fake-vm"])
    results: list[BigResult] = []
    try:
        fake_port = int(fake.wait_match(r"^listening (\d+)$", 20)[1].group(1))
        variants: list[tuple[str, int | None]] = [("default config", None)]
        variants.append((f"queue_packets = {BIG_QUEUE}", BIG_QUEUE))
        for i, (label, queue_packets) in enumerate(variants):
            ddmd = start_ddmd(
                children, work, f"ddmd-big{i}", fake_port, ports, queue_packets=queue_packets
            )
            try:
                results.append(big_packet(ddmd, label))
            finally:
                stop_ddmd(children, ddmd)
            if results[-1].complete:
                break
    finally:
        children.stop(fake)
    return results


# --------------------------------------------------------------------------------------------
# Profiling (--profile): CPU per round trip of ddmd and of the trio relay; py-spy hot spots


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def hot_spots(raw: Path, top: int) -> list[str]:
    """Self-time shares from py-spy's raw (collapsed) output, the idle epoll wait excluded."""
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r" \((.*?)(?::\d+)?\)$", r" (\1)", f) for f in stack.split(";")]
        if not frames or frames[-1].startswith("EpollIOManager.get_events"):
            continue  # the run loop waiting in epoll: idle
        n = int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    if not total:
        return ["  py-spy: no samples"]
    packages: dict[str, int] = {}
    for frame, n in own.items():
        match = re.search(r"\(([^/)]+)/", frame)
        package = match.group(1) if match else "other"
        packages[package] = packages.get(package, 0) + n
    shares = ", ".join(
        f"{name} {100 * n / total:.0f}%"
        for name, n in sorted(packages.items(), key=lambda kv: -kv[1])
    )
    lines = [f"  py-spy --gil, {total} samples; self time by package: {shares}"]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {100 * n / total:5.1f}%  {frame}")
    return lines


def profile_round_trips(bench: Bench, relay_jvm: Jvm, ddmd_jvm: Jvm, count: int) -> list[str]:
    children, ports, rt = bench.children, bench.ports, bench.rt
    ddmd = start_ddmd(children, bench.work, "ddmd-profile", ddmd_jvm.port, ports)
    relay_port = ports.take()
    relay = start_relay(children, relay_port, relay_jvm.port)
    spy = py_spy()
    raw = bench.work / "ddmd.pyspy"
    lines = [f"profile: {count} round trips per process; CPU per round trip from /proc/PID/stat"]
    try:
        targets = (("ddmd", ddmd.child, ddmd.current_port), ("trio relay", relay, relay_port))
        for name, child, port in targets:
            rt.measure(port, bench.args.warmup, 100)
            time.sleep(PAUSE)
            session = rt.measure(port, 0, count, [(name, child.pid)])
            user, system = session.cpu[name]
            lines.append(
                f"  {name:<11} median {statistics.median(session.samples_us):6.1f} us; CPU per "
                f"round trip: user {user / CLK_TCK / count * 1e6:5.1f} us, "
                f"sys {system / CLK_TCK / count * 1e6:5.1f} us"
            )
            time.sleep(PAUSE)
        if spy is not None:  # a separate session, so the CPU figures above are py-spy free
            # --gil: only samples holding the GIL, i.e. Python work, not time inside syscalls
            argv = [spy, "record", "-p", str(ddmd.child.pid), "-r", "1000", "-f", "raw", "--gil"]
            recorder = subprocess.Popen(
                [*argv, "--nonblocking", "-o", str(raw)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(1.0)  # py-spy attaches
                rt.measure(ddmd.current_port, 0, count)
            finally:
                recorder.send_signal(signal.SIGINT)
                recorder.wait(30)
    finally:
        children.stop(relay)
        stop_ddmd(children, ddmd)
    if spy is None:
        lines.append("  py-spy not installed (.venv/bin/pip install py-spy): no hot spots")
    elif raw.exists():
        lines += hot_spots(raw, 10)
    return lines


# --------------------------------------------------------------------------------------------
# Main


@dataclass
class Route:
    """One path from the JDI client to a JVM."""

    name: str
    port: int  # where the JDI client connects
    jvm: Jvm
    middle: list[tuple[str, Child]]  # the processes in between, (label, process)


ENDS = ("target JVM", "JDI client")  # watched on every path, for reference


@dataclass
class Figures:
    sessions: dict[str, list[Session]] = field(default_factory=dict)
    by_phase: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    jdb: dict[str, list[float]] = field(default_factory=dict)
    middle: dict[str, list[str]] = field(default_factory=dict)  # path -> its processes' labels


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (q in 10..90, a multiple of 10); the value itself when alone."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[q // 10 - 1]


@dataclass
class Bench:
    """What every phase of one run shares."""

    children: Children
    ports: Ports
    work: Path
    classes: Path
    rt: RoundTripClient
    args: argparse.Namespace
    ddmlib_jars: Sequence[str]
    ddmlib_skipped: str | None  # why the ddmlib path does not run, or None
    figures: Figures = field(default_factory=Figures)
    notes: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # path -> why its session failed


def measure_route(bench: Bench, phase: int, route: Route, *, timed: bool = True) -> None:
    """One session on ``route``: timed, with the CPU of every process on it, or untimed (200
    calls after the warm-up). A failure is noted and the path left out from then on."""
    if route.name in bench.failed:
        return
    watch = [(label, child.pid) for label, child in route.middle]
    watch += [(ENDS[0], route.jvm.pid), (ENDS[1], bench.rt.child.pid)]
    try:
        if not timed:
            bench.rt.measure(route.port, bench.args.warmup, 200)
            return
        session = bench.rt.measure(route.port, bench.args.warmup, bench.args.count, watch)
    except (RuntimeError, TimeoutError) as exc:
        bench.failed[route.name] = f"phase {phase}: {exc}"
        print(f"bridge_latency: {route.name}: {exc}", file=sys.stderr, flush=True)
        return
    figures = bench.figures
    figures.sessions.setdefault(route.name, []).append(session)
    figures.by_phase.setdefault((phase, route.name), []).extend(session.samples_us)
    figures.middle.setdefault(route.name, [label for label, _ in route.middle])


def try_ddmlib(bench: Bench, stack: contextlib.ExitStack, jvm: Jvm) -> Route | None:
    """ddmlib behind its own stand-in adb server; None (and a note) when it cannot run."""
    if bench.ddmlib_skipped is not None:
        return None
    children = bench.children
    fake = start_fake_adb(children, "bench-ddmlib", jvm)
    stack.callback(children.stop, fake.child)
    try:
        ddmlib = start_ddmlib(children, bench.classes, bench.ddmlib_jars, fake, bench.ports)
    except (RuntimeError, TimeoutError) as exc:
        bench.ddmlib_skipped = f"ddmlib via adb: skipped, ddmlib did not start: {exc}"
        bench.notes.append(bench.ddmlib_skipped)
        return None
    stack.callback(children.stop, ddmlib.child)
    middle = [("ddmlib JVM", ddmlib.child), ("fake adb", fake.child)]
    return Route("ddmlib via adb", ddmlib.debugger_port, jvm, middle)


def run_phase(bench: Bench, phase: int, roles: dict[str, Jvm]) -> None:
    """One phase: fresh ddmd, ddmlib, relays and stand-in adb servers; ``roles`` says which JVM
    is free (direct, relays, adb forward), owned by ddmd's scan, by ddmd through adb, by ddmlib."""
    children, ports, rt, args = bench.children, bench.ports, bench.rt, bench.args
    free, scan, adb_jvm = roles["free"], roles["scan"], roles["adb"]
    with contextlib.ExitStack() as stack:
        fake_free = start_fake_adb(children, "bench-free", free)
        stack.callback(children.stop, fake_free.child)
        fake_ddmd = start_fake_adb(children, "bench-ddmd", adb_jvm)
        stack.callback(children.stop, fake_ddmd.child)
        ddmd = start_ddmd(
            children, bench.work, f"ddmd-phase{phase}", scan.port, ports, adb=(fake_ddmd, adb_jvm)
        )
        stack.callback(stop_ddmd, children, ddmd)
        assert ddmd.adb_port is not None
        relay_port, relay_adb_port, forward_port = ports.take(), ports.take(), ports.take()
        relay = start_relay(children, relay_port, free.port)
        stack.callback(children.stop, relay)
        relay_adb = start_relay_adb(
            children, relay_adb_port, fake_free.port, fake_free.serial, free.pid
        )
        stack.callback(children.stop, relay_adb)
        forwarded_by = adb_forward(fake_free, forward_port, free.pid)
        routes = [
            Route("direct", free.port, free, []),
            Route("trio relay", relay_port, free, [("trio relay", relay)]),
        ]
        if shutil.which("socat"):
            socat_port = ports.take()
            socat = start_socat(children, socat_port, free.port)
            stack.callback(children.stop, socat)
            routes.append(Route("socat", socat_port, free, [("socat", socat)]))
        adb_middle = [("fake adb", fake_free.child)]
        routes += [
            Route("ddmd", ddmd.current_port, scan, [("ddmd", ddmd.child)]),
            Route("adb forward", forward_port, free, adb_middle),
            Route(
                "trio relay via adb", relay_adb_port, free, [("trio relay", relay_adb), *adb_middle]
            ),
            Route(
                "ddmd via adb",
                ddmd.adb_port,
                adb_jvm,
                [("ddmd", ddmd.child), ("fake adb", fake_ddmd.child)],
            ),
        ]
        if "ddmlib" in roles and (ddmlib := try_ddmlib(bench, stack, roles["ddmlib"])):
            routes.append(ddmlib)
        owners = ", ".join(f"{r.name} -> {r.jvm.name}" for r in routes)
        bench.notes.append(f"phase {phase}: {owners}")
        if phase == 1:
            bench.notes.append(f"adb forward: {forwarded_by}")
            for port, path in ((ddmd.current_port, "scan"), (ddmd.adb_port, "via adb")):
                try:
                    bench.notes.append(check_one_packet_per_call(rt, ddmd, port, path))
                except (RuntimeError, TimeoutError) as exc:
                    bench.notes.append(f"check ({path}): failed: {exc}")
        for route in routes:  # one untimed session per path
            measure_route(bench, phase, route, timed=False)
            time.sleep(PAUSE)
        for r in range(args.rounds):
            k = ((phase - 1) * args.rounds + r) % len(routes)  # the order keeps rotating
            for route in routes[k:] + routes[:k]:
                measure_route(bench, phase, route)
                time.sleep(PAUSE)
            jdb_order = [("direct", free.port), ("ddmd", ddmd.current_port)]
            for name, port in jdb_order if r % 2 == 0 else jdb_order[::-1]:
                if f"jdb attach {name}" in bench.failed:
                    continue
                try:
                    bench.figures.jdb.setdefault(name, []).append(jdb_attach_ms(port))
                except (RuntimeError, TimeoutError) as exc:
                    bench.failed[f"jdb attach {name}"] = f"phase {phase}: {exc}"
                time.sleep(PAUSE)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def ratio_of(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def cpu_per_rt(figures: Figures, name: str) -> dict[str, tuple[float, float, int]]:
    """label -> (user us, sys us, ticks) per round trip over every session of path ``name``."""
    sessions = figures.sessions[name]
    round_trips = sum(len(s.samples_us) for s in sessions)
    out: dict[str, tuple[float, float, int]] = {}
    for label in sessions[0].cpu:
        user = sum(s.cpu[label][0] for s in sessions)
        system = sum(s.cpu[label][1] for s in sessions)
        per = 1e6 / CLK_TCK / round_trips
        out[label] = (user * per, system * per, user + system)
    return out


def report(bench: Bench, big: list[BigResult]) -> list[str]:
    figures = bench.figures
    lines = [*bench.notes]
    samples = {n: [s for ss in v for s in ss.samples_us] for n, v in figures.sessions.items()}
    failures = [
        f"{name}: FAILED, left out from then on: {why}" for name, why in bench.failed.items()
    ]
    if bench.ddmlib_skipped:
        failures.append(bench.ddmlib_skipped)
    if "socat" not in samples and "socat" not in bench.failed:
        failures.append("socat: not installed, skipped")
    if "direct" not in samples:
        return [*lines, *failures, "no figures: the direct path has none"]
    medians = {n: statistics.median(v) for n, v in samples.items()}
    cpu = {n: cpu_per_rt(figures, n) for n in samples}
    # CPU per round trip of the processes between the JDI client and the JVM, summed
    middle = {
        n: sum(u + s for label, (u, s, _) in cpu[n].items() if label not in ENDS) for n in cpu
    }
    # CPU per round trip of the path's own process (the relay, ddmd, ddmlib's JVM)
    own = {n: sum(cpu[n][figures.middle[n][0]][:2]) for n in cpu if figures.middle[n]}
    added = {n: medians[n] - medians["direct"] for n in samples}

    lines.append(
        f"{'JDI round trip (us)':<21}{'median':>8}{'p10':>8}{'p90':>8}{'added':>8}"
        f"{'attach ms':>11}{'n':>8}{'CPU/RT us':>11}"
    )
    for name, values in samples.items():
        attach = statistics.median(s.attach_ms for s in figures.sessions[name])
        extra = "-" if name == "direct" else f"{added[name]:.1f}"
        cpu_text = f"{middle[name]:.1f}" if figures.middle[name] else "-"
        lines.append(
            f"{name:<21}{medians[name]:>8.1f}{pct(values, 10):>8.1f}{pct(values, 90):>8.1f}"
            f"{extra:>8}{attach:>11.1f}{len(values):>8}{cpu_text:>11}"
        )
    lines += failures
    lines.append(
        "CPU per round trip (us, user+sys over the timed calls, /proc/PID/stat in "
        f"{1000 // CLK_TCK} ms ticks; CPU/RT above sums the processes before '|'):"
    )
    for name in samples:
        parts = [
            f"{label} {u + s:.1f} (u {u:.1f} s {s:.1f}, {ticks} ticks)"
            for label, (u, s, ticks) in cpu[name].items()
            if label not in ENDS
        ]
        ends = [f"{label} {sum(cpu[name][label][:2]):.1f}" for label in ENDS]
        lines.append(
            f"  {name:<19} {'; '.join(parts) or '(nothing in between)'} | {'; '.join(ends)}"
        )
    for phase in sorted({p for p, _ in figures.by_phase}):
        parts = [
            f"{n} {statistics.median(v):.1f}"
            for (p, n), v in figures.by_phase.items()
            if p == phase
        ]
        lines.append(f"  phase {phase} medians (us): " + ", ".join(parts))
    jdb = figures.jdb
    if "direct" in jdb and "ddmd" in jdb:
        lines.append(
            f"jdb attach to prompt (ms, {len(jdb['direct'])} runs each): direct median "
            f"{statistics.median(jdb['direct']):.0f} (p10 {pct(jdb['direct'], 10):.0f}, p90 "
            f"{pct(jdb['direct'], 90):.0f}), ddmd {statistics.median(jdb['ddmd']):.0f} (p10 "
            f"{pct(jdb['ddmd'], 10):.0f}, p90 {pct(jdb['ddmd'], 90):.0f})"
        )

    # The adb path: every hop on top of the plain adb stream
    hop = {}
    if "adb forward" in samples:
        hop = {n: medians[n] - medians["adb forward"] for n in samples if n.endswith(" via adb")}
        parts = [f"{n.removesuffix(' via adb')} {h:.1f}" for n, h in hop.items()]
        lines.append(
            f"adb path: the plain adb stream (adb forward) adds {added['adb forward']:.1f} us "
            "over direct (the stand-in server's relay); each hop on top of it (us): "
            + (", ".join(parts) or "-")
        )
    lines.append("for reference (no target):")
    for other, label in (("trio relay", "trio relay"), ("ddmlib", "ddmlib's JVM")):
        a, b = "ddmd via adb", f"{other} via adb"
        if a in hop and b in hop:
            lines.append(
                f"  ddmd / {other} via adb: hop {hop[a]:.1f}/{hop[b]:.1f} us = "
                f"{ratio_of(hop[a], hop[b]):.2f}x; own CPU per round trip (ddmd / {label}) "
                f"{own[a]:.1f}/{own[b]:.1f} us = {ratio_of(own[a], own[b]):.2f}x"
            )
    if "trio relay via adb" in hop and "trio relay" in added:
        via_hop, scan_hop = hop["trio relay via adb"], added["trio relay"]
        lines.append(
            "  the hop target's yardstick for a plain relay: trio relay's hop via adb / its added "
            f"latency on scan {via_hop:.1f}/{scan_hop:.1f} us = {ratio_of(via_hop, scan_hop):.2f}x"
        )
    if "ddmd via adb" in own and "ddmd" in own:
        via, scan = own["ddmd via adb"], own["ddmd"]
        lines.append(
            f"  ddmd's own CPU per round trip via adb / scan: {via:.1f}/{scan:.1f} us = "
            f"{ratio_of(via, scan):.2f}x"
        )

    rows: list[tuple[str, str, bool, str]] = []

    def row(
        names: Sequence[str],
        what: str,
        make: Callable[[], tuple[str, float, float, str]],
        source: Mapping[str, object] = samples,
    ) -> None:
        missing = [n for n in names if n not in source]
        if missing:
            rows.append((what, "-", False, f"no figures for {', '.join(missing)}"))
            return
        value, ratio, target, extra = make()
        margin = f"{abs(ratio - target):.2f}x " + ("to spare" if ratio <= target else "over")
        rows.append((what, value, ratio <= target, margin + extra))

    def latency() -> tuple[str, float, float, str]:
        d, r = added["ddmd"], added["trio relay"]
        extra = f" ({d - LATENCY_TARGET * r:+.1f} us vs target)"
        return f"{d:.1f}/{r:.1f} us = {ratio_of(d, r):.2f}x", ratio_of(d, r), LATENCY_TARGET, extra

    def cpu_scan() -> tuple[str, float, float, str]:
        d, r = middle["ddmd"], middle["trio relay"]
        extra = f" ({d - CPU_TARGET * r:+.1f} us vs target)"
        return f"{d:.1f}/{r:.1f} us = {ratio_of(d, r):.2f}x", ratio_of(d, r), CPU_TARGET, extra

    def hop_adb() -> tuple[str, float, float, str]:
        h, d = hop["ddmd via adb"], added["ddmd"]
        extra = f" ({h - HOP_TARGET * d:+.1f} us vs target)"
        return f"{h:.1f}/{d:.1f} us = {ratio_of(h, d):.2f}x", ratio_of(h, d), HOP_TARGET, extra

    def attach_time() -> tuple[str, float, float, str]:
        r = statistics.median(jdb["ddmd"]) / statistics.median(jdb["direct"])
        return f"{r:.2f}x", r, ATTACH_TARGET, ""

    row(["ddmd", "trio relay"], f"ddmd added latency <= {LATENCY_TARGET}x trio relay's", latency)
    row(["ddmd", "trio relay"], f"ddmd CPU/RT <= {CPU_TARGET}x trio relay's", cpu_scan)
    row(["ddmd via adb", "adb forward", "ddmd"], "ddmd's hop via adb <= its added on scan", hop_adb)
    row(["direct", "ddmd"], f"jdb attach via ddmd <= {ATTACH_TARGET}x direct", attach_time, jdb)
    if big:
        lines += [b.describe() for b in big]
        first = big[0]
        hwm = first.hwm_after
        ok = first.complete and hwm < RSS_TARGET_MB
        if first.complete:
            margin = f"{abs(RSS_TARGET_MB - hwm):.1f} MB " + ("under" if ok else "over")
        else:
            margin = "the relay itself failed (see above)"
        rows.append(
            (f"ddmd RSS < {RSS_TARGET_MB:.0f} MB relaying 1 GiB", f"VmHWM {hwm:.1f} MB", ok, margin)
        )
    lines.append("targets:")
    for what, value, ok, margin in rows:
        lines.append(f"  {verdict(ok)}  {what:<40} {value:<28} {margin}")
    return lines


ROLES = ("free", "scan", "adb", "ddmlib")
QUICK = {"phases": 2, "rounds": 1, "count": 300, "warmup": 300, "profile_count": 3000}
NORMAL = {"phases": 4, "rounds": 2, "count": 2000, "warmup": 2000, "profile_count": 20000}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 phases, 1 round, 300 calls"
    )
    parser.add_argument(
        "--phases",
        type=int,
        choices=range(1, len(ROLES) + 1),
        help="phases, each with the roles of the JVMs rotated (default 4)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per phase (default 2)")
    parser.add_argument("--count", type=int, help="timed round trips per session (default 2000)")
    parser.add_argument("--warmup", type=int, help="untimed round trips first (default 2000)")
    parser.add_argument("--skip-big", action="store_true", help="skip the 1 GiB packet")
    parser.add_argument(
        "--ddmlib-classpath",
        default=os.pathsep.join(DDMLIB_JARS),
        help="ddmlib and the jars it needs (default: Debian's libandroid-ddms-java)",
    )
    parser.add_argument("--profile", action="store_true", help="profile ddmd afterwards")
    parser.add_argument("--profile-count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--relay-adb", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--fake-vm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.relay:
        relay_main(*args.relay)
        return 0
    if args.relay_adb:
        listen, adb_port, serial, pid = args.relay_adb
        relay_main(int(listen), int(adb_port), (serial, int(pid)))
        return 0
    if args.fake_vm:
        with contextlib.suppress(KeyboardInterrupt):
            fake_vm_main()
        return 0
    for key, value in (QUICK if args.quick else NORMAL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.rounds, args.count, args.warmup) < 1 or args.count < 10:
        parser.error("--rounds and --warmup must be at least 1, --count at least 10")

    missing = [tool for tool in ("java", "javac", "jdb") if shutil.which(tool) is None]
    if missing:
        print(f"bridge_latency: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    print(
        f"bridge_latency: JDK {java_version()}, {os.cpu_count()} CPUs; {args.phases} phase(s) x "
        f"{args.rounds} round(s), {args.count} timed ThreadReference.status() per session "
        f"(+{args.warmup} warm-up)" + (" [--quick: rough figures]" if args.quick else ""),
        flush=True,
    )
    children = Children()
    ports = Ports()
    big: list[BigResult] = []
    started = time.monotonic()
    ddmlib_jars = [jar for jar in args.ddmlib_classpath.split(os.pathsep) if jar]
    with tempfile.TemporaryDirectory(prefix="bridge-latency-") as tmp:
        work = Path(tmp)
        classes = work / "classes"
        skipped = compile_java(classes, ddmlib_jars)
        try:
            roles = ROLES if skipped is None else ROLES[:-1]
            jvms = start_jvms(children, len(roles), ports, classes)
            rt = RoundTripClient(children, classes)
            bench = Bench(children, ports, work, classes, rt, args, ddmlib_jars, skipped)
            bench.notes.append(
                ", ".join(f"{j.name} on :{j.port} (pid {j.pid})" for j in jvms)
                + ": same program and flags"
            )
            for phase in range(args.phases):
                rotated = {role: jvms[(i + phase) % len(jvms)] for i, role in enumerate(roles)}
                run_phase(bench, phase + 1, rotated)
            if not args.skip_big:
                big = big_packet_phase(children, work, ports)
            for line in report(bench, big):
                print(line, flush=True)
            if args.profile:
                lines = profile_round_trips(bench, jvms[0], jvms[1], args.profile_count)
                for line in lines:
                    print(line, flush=True)
            rt.child.send("quit")
        finally:
            children.stop_all()
    print(f"total {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
