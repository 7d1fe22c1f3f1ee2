"""JDWP bridge benchmark: JDI round-trip latency, jdb attach time and 1 GiB relay memory of ddmd.

Run: ``.venv/bin/python bench/bridge_latency.py [--rounds 4] [--count 2000] [--profile]``

Everything runs as separate processes on 127.0.0.1; the Java side (``bench/java/``) is compiled
with javac into a temp dir at start.

Round trips. ``RoundTrip.java`` is one long-lived JDI client (so every path is measured by the
same warmed-up JVM): per session it attaches with ``com.sun.jdi.SocketAttach``, calls
``ThreadReference.status()`` on the target's sleeping ``main`` thread WARMUP times untimed and
COUNT times timed, then ``dispose()``. The paths, measured in one interleaved run (the order
rotates every round, so drift and order effects hit all paths alike):

- direct:     JDI -> the JVM's JDWP port;
- trio relay: JDI -> a plain trio byte relay (this script in ``--relay`` mode, its own
  process: ``receive_some``/``send_all`` both ways) -> the JVM;
- socat:      JDI -> ``socat TCP-LISTEN:..,reuseaddr,fork TCP:..`` -> the JVM (when installed);
- ddmd:       JDI -> ddmd's current-VM port (``ddmd run --config TMP``, VM selected through
  ``POST /api/v1/vms/{target}/select``) -> the JVM.

A JVM takes one JDWP connection at a time and ddmd keeps its connection, so two identical
JVMs (same program, same flags) are used: in the first half ddmd owns JVM#2 while the other
paths use JVM#1; in the second half the roles are swapped (a new ddmd scans only JVM#1), so a
difference between the JVMs cancels out. Before timing, two sessions through ddmd that differ
by 1000 calls are compared with ddmd's own packet counters (``debugger.detached`` log event):
each ``status()`` must be exactly one command and one reply.

jdb attach: the time from starting ``jdb -attach 127.0.0.1:PORT`` to its first ``>`` prompt
(then ``quit``), direct vs through ddmd, one of each per round, interleaved.

1 GiB packet: a fake VM (``--fake-vm`` mode: JDWP handshake, HELO -> error 99, Version, and a
reply of exactly 2**30 bytes, header included, to VirtualMachine.AllClasses, streamed from one
reusable buffer) behind a fresh ddmd, and a fake debugger here that sends AllClasses through the
current-VM port and reads and discards the reply, checking its length and restored id. ddmd's
VmHWM (/proc/PID/status) before and after, its VmRSS sampled meanwhile, and the throughput. When
the relay fails with the default config, it runs once more with [debugger] queue_packets raised
so that the debugger is never dropped, to show what then bounds ddmd's memory.

Targets: ddmd's added median latency at most 1.1x the trio relay's; attach through ddmd at most
1.5x direct; ddmd's RSS under 100 MB (10**6 bytes) while the 1 GiB packet is relayed. Prints
figures and PASS/MISS; asserts nothing. ``--profile`` then measures the CPU time per round trip
of ddmd and of the trio relay (/proc/PID/stat) and, when py-spy is installed
(``.venv/bin/pip install py-spy``), samples ddmd meanwhile and prints its hot spots.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO

from children import Child

ROOT = Path(__file__).resolve().parent.parent
JAVA_DIR = Path(__file__).resolve().parent / "java"
HOST = "127.0.0.1"

LATENCY_TARGET = 1.1  # added(ddmd) / added(trio relay), medians
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


def compile_java(out: Path) -> None:
    sources = sorted(str(p) for p in JAVA_DIR.glob("*.java"))
    subprocess.run(["javac", "-d", str(out), *sources], check=True)


def java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True)
    match = re.search(r'version "([^"]+)"', done.stderr)
    return match.group(1) if match else "?"


@dataclass
class Jvm:
    name: str
    port: int
    child: Child


def start_jvm(children: Children, name: str, port: int, classes: Path) -> Jvm:
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address={HOST}:{port}"
    argv = ["java", agent, "-Xmx64m", "-XX:+UseSerialGC", "-cp", str(classes), "Target"]
    child = children.start(name, argv)
    child.wait_match(rf"Listening for transport dt_socket at address: {port}\b", 20)
    return Jvm(name, port, child)


@dataclass
class Session:
    attach_ms: float
    samples_us: list[float]


class RoundTripClient:
    """The long-lived RoundTrip.java process."""

    def __init__(self, children: Children, classes: Path) -> None:
        self.child = children.start("RoundTrip", ["java", "-cp", str(classes), "RoundTrip"])
        self.child.wait_match(r"^READY$", 20)

    def measure(self, port: int, warmup: int, count: int) -> Session:
        self.child.send(f"{HOST} {port} {warmup} {count}")
        line = self.child.wait_match(r"^(RT|ERR) ", 60)[1].string
        if line.startswith("ERR"):
            raise RuntimeError(f"RoundTrip on port {port}: {line}")
        fields = line.split()
        return Session(int(fields[1]) / 1e6, [int(x) / 1000 for x in fields[2:]])


# --------------------------------------------------------------------------------------------
# Relays: trio (this script, --relay), socat, ddmd


def relay_main(listen_port: int, target_port: int) -> None:
    """A plain trio byte relay: one upstream connection per accepted client, bytes both ways."""
    import trio

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
                upstream = await trio.open_tcp_stream(HOST, target_port)
            except OSError:
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


def write_config(
    path: Path, *, scan: int, ports: Ports, queue_packets: int | None
) -> tuple[int, int]:
    control_port, current_port, debugger_port = ports.take(), ports.take(), ports.take()
    queue = "" if queue_packets is None else f"queue_packets = {queue_packets}\n"
    path.write_text(
        f"""\
[scan]
host = "{HOST}"
ports = "{scan}"
interval = 0.5

[adb]
enabled = "off"

[debugger]
host = "{HOST}"
ports = "{debugger_port}"
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
) -> Ddmd:
    """``ddmd run`` scanning only ``scan_port``; returns once that VM is identified and selected."""
    config = work / f"{name}.toml"
    control_port, current_port = write_config(
        config, scan=scan_port, ports=ports, queue_packets=queue_packets
    )
    log_path = work / f"{name}.log"
    log_file = log_path.open("w", encoding="utf-8")
    argv = [sys.executable, "-m", "ddmd", "run", "--config", str(config), "--log-format", "json"]
    child = children.start(name, argv, stdout=log_file)
    vm_id = f"tcp:{scan_port}"
    select_vm(child, control_port, vm_id)
    return Ddmd(child, log_path, control_port, current_port, vm_id, log_file)


def select_vm(child: Child, control_port: int, vm_id: str, timeout: float = 30.0) -> None:
    import httpx

    base = f"http://{HOST}:{control_port}/api/v1"
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5.0) as client:
        while True:
            child.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"ddmd did not list {vm_id} as ready within {timeout:g} s")
            try:
                vms = client.get(f"{base}/vms").json()
            except (httpx.HTTPError, ValueError):
                vms = []
            if any(v["id"] == vm_id and v["state"] == "ready" and v["ddm"] is False for v in vms):
                break
            time.sleep(0.1)
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


def detached_counters(log_path: Path) -> list[tuple[int, int]]:
    """(packets_in, packets_out) of every debugger.detached event in ddmd's JSON log."""
    return [
        (int(str(r["packets_in"])), int(str(r["packets_out"])))
        for r in ddmd_events(log_path, "debugger.detached")
    ]


def check_one_packet_per_call(rt: RoundTripClient, ddmd: Ddmd) -> str:
    """Two sessions through ddmd differing by 1000 status() calls, per ddmd's own counters."""
    counts = []
    for n in (200, 1200):
        before = len(detached_counters(ddmd.log_path))
        rt.measure(ddmd.current_port, 0, n)
        deadline = time.monotonic() + 10
        while len(entries := detached_counters(ddmd.log_path)) == before:
            if time.monotonic() > deadline:
                raise TimeoutError("ddmd logged no debugger.detached")
            time.sleep(0.02)
        counts.append(entries[-1])
        time.sleep(PAUSE)
    d_in, d_out = counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]
    verdict = "one command + one reply per call" if d_in == d_out == 1000 else "NOT 1:1"
    return f"check: +1000 status() calls -> +{d_in} commands, +{d_out} replies in ddmd ({verdict})"


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


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


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
            user0, sys0 = cpu_seconds(child.pid)
            session = rt.measure(port, 0, count)
            user1, sys1 = cpu_seconds(child.pid)
            lines.append(
                f"  {name:<11} median {statistics.median(session.samples_us):6.1f} us; CPU per "
                f"round trip: user {(user1 - user0) / count * 1e6:5.1f} us, "
                f"sys {(sys1 - sys0) / count * 1e6:5.1f} us"
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
class Figures:
    sessions: dict[str, list[Session]] = field(default_factory=dict)
    by_half: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    jdb: dict[str, list[float]] = field(default_factory=dict)


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (q in 10..90, a multiple of 10)."""
    return statistics.quantiles(values, n=10, method="inclusive")[q // 10 - 1]


@dataclass
class Bench:
    """What every phase of one run shares."""

    children: Children
    ports: Ports
    work: Path
    rt: RoundTripClient
    args: argparse.Namespace
    figures: Figures = field(default_factory=Figures)
    notes: list[str] = field(default_factory=list)


def run_half(bench: Bench, half: int, abc: Jvm, dd: Jvm) -> None:
    """One half: direct, trio relay and socat to ``abc``; ddmd owning ``dd``."""
    children, ports, rt, args = bench.children, bench.ports, bench.rt, bench.args
    figures, notes = bench.figures, bench.notes
    ddmd = start_ddmd(children, bench.work, f"ddmd-half{half}", dd.port, ports)
    relay_port, socat_port = ports.take(), ports.take()
    relay = start_relay(children, relay_port, abc.port)
    socat = start_socat(children, socat_port, abc.port) if shutil.which("socat") else None
    try:
        paths = {"direct": abc.port, "trio relay": relay_port}
        if socat is not None:
            paths["socat"] = socat_port
        paths["ddmd"] = ddmd.current_port
        served = ", ".join(f"{p} -> {dd.name if p == 'ddmd' else abc.name}" for p in paths)
        notes.append(f"half {half}: {served}")
        if half == 1:
            notes.append(check_one_packet_per_call(rt, ddmd))
        for port in paths.values():  # one untimed session per path
            rt.measure(port, args.warmup, 200)
            time.sleep(PAUSE)
        names = list(paths)
        for r in range(args.rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                session = rt.measure(paths[name], args.warmup, args.count)
                figures.sessions.setdefault(name, []).append(session)
                figures.by_half.setdefault((half, name), []).extend(session.samples_us)
                time.sleep(PAUSE)
            jdb_order = [("direct", abc.port), ("ddmd", ddmd.current_port)]
            for name, port in jdb_order if r % 2 == 0 else jdb_order[::-1]:
                figures.jdb.setdefault(name, []).append(jdb_attach_ms(port))
                time.sleep(PAUSE)
    finally:
        if socat is not None:
            children.stop(socat)
        children.stop(relay)
        stop_ddmd(children, ddmd)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(figures: Figures, big: list[BigResult], notes: list[str]) -> list[str]:
    lines = [*notes]
    samples = {n: [s for ss in v for s in ss.samples_us] for n, v in figures.sessions.items()}
    direct = statistics.median(samples["direct"])
    lines.append(
        f"{'JDI round trip (us)':<21}{'median':>8}{'p10':>8}{'p90':>8}{'added':>8}"
        f"{'attach ms':>11}{'n':>8}"
    )
    added: dict[str, float] = {}
    for name, values in samples.items():
        median = statistics.median(values)
        added[name] = median - direct
        attach = statistics.median(s.attach_ms for s in figures.sessions[name])
        extra = "-" if name == "direct" else f"{added[name]:.1f}"
        lines.append(
            f"{name:<21}{median:>8.1f}{pct(values, 10):>8.1f}{pct(values, 90):>8.1f}"
            f"{extra:>8}{attach:>11.1f}{len(values):>8}"
        )
    if "socat" not in samples:
        lines.append("socat: not installed, skipped")
    halves = sorted({h for h, _ in figures.by_half})
    for half in halves:
        parts = [
            f"{n} {statistics.median(v):.1f}" for (h, n), v in figures.by_half.items() if h == half
        ]
        lines.append(f"  half {half} medians (us): " + ", ".join(parts))
    ratio = added["ddmd"] / added["trio relay"] if added["trio relay"] > 0 else float("inf")
    jdb_direct = statistics.median(figures.jdb["direct"])
    jdb_ddmd = statistics.median(figures.jdb["ddmd"])
    attach_ratio = jdb_ddmd / jdb_direct
    lines.append(
        f"jdb attach to prompt (ms, {len(figures.jdb['direct'])} runs each): direct median "
        f"{jdb_direct:.0f} (p10 {pct(figures.jdb['direct'], 10):.0f}, p90 "
        f"{pct(figures.jdb['direct'], 90):.0f}), ddmd {jdb_ddmd:.0f} (p10 "
        f"{pct(figures.jdb['ddmd'], 10):.0f}, p90 {pct(figures.jdb['ddmd'], 90):.0f})"
    )
    rows = [
        (
            f"ddmd added latency <= {LATENCY_TARGET}x trio relay's",
            f"{added['ddmd']:.1f}/{added['trio relay']:.1f} us = {ratio:.2f}x",
            ratio <= LATENCY_TARGET,
            f"{abs(ratio - LATENCY_TARGET):.2f}x "
            + ("to spare" if ratio <= LATENCY_TARGET else "over")
            + f" ({added['ddmd'] - LATENCY_TARGET * added['trio relay']:+.1f} us vs target)",
        ),
        (
            f"jdb attach via ddmd <= {ATTACH_TARGET}x direct",
            f"{attach_ratio:.2f}x",
            attach_ratio <= ATTACH_TARGET,
            f"{abs(attach_ratio - ATTACH_TARGET):.2f}x "
            + ("to spare" if attach_ratio <= ATTACH_TARGET else "over"),
        ),
    ]
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
        lines.append(f"  {verdict(ok)}  {what:<38} {value:<26} {margin}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per half (default 4)")
    parser.add_argument("--count", type=int, default=2000, help="timed round trips per session")
    parser.add_argument("--warmup", type=int, default=2000, help="untimed round trips first")
    parser.add_argument("--skip-big", action="store_true", help="skip the 1 GiB packet")
    parser.add_argument("--profile", action="store_true", help="profile ddmd afterwards")
    parser.add_argument("--profile-count", type=int, default=20000, help=argparse.SUPPRESS)
    parser.add_argument("--relay", nargs=2, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fake-vm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.relay:
        relay_main(*args.relay)
        return 0
    if args.fake_vm:
        with contextlib.suppress(KeyboardInterrupt):
            fake_vm_main()
        return 0

    missing = [tool for tool in ("java", "javac", "jdb") if shutil.which(tool) is None]
    if missing:
        print(f"bridge_latency: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    print(
        f"bridge_latency: JDK {java_version()}, {os.cpu_count()} CPUs; 2 halves x {args.rounds} "
        f"rounds, {args.count} timed ThreadReference.status() per session "
        f"(+{args.warmup} warm-up)",
        flush=True,
    )
    children = Children()
    ports = Ports()
    big: list[BigResult] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bridge-latency-") as tmp:
        work = Path(tmp)
        classes = work / "classes"
        compile_java(classes)
        try:
            jvm1 = start_jvm(children, "JVM#1", ports.take(), classes)
            jvm2 = start_jvm(children, "JVM#2", ports.take(), classes)
            rt = RoundTripClient(children, classes)
            bench = Bench(children, ports, work, rt, args)
            bench.notes.append(
                f"JVM#1 on :{jvm1.port}, JVM#2 on :{jvm2.port}, same program and flags"
            )
            run_half(bench, 1, jvm1, jvm2)
            run_half(bench, 2, jvm2, jvm1)
            if not args.skip_big:
                big = big_packet_phase(children, work, ports)
            for line in report(bench.figures, big, bench.notes):
                print(line, flush=True)
            if args.profile:
                for line in profile_round_trips(bench, jvm1, jvm2, args.profile_count):
                    print(line, flush=True)
            rt.child.send("quit")
        finally:
            children.stop_all()
    print(f"total {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
