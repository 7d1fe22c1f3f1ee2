"""JDWP bridge benchmark: latency and CPU per operation of three workloads, jdb attach, 1 GiB.

Run: ``.venv/bin/python bench/bridge_latency.py [--quick] [--phases 4] [--rounds 3]
[--count 1000] [--mix 50] [--slices 20] [--skip-big] [--skip-jdb] [--relay-threads true|false]
[--profile]``

Everything runs as separate processes on 127.0.0.1; the Java side (``bench/java/``) is compiled
with ``javac -g`` into a temp dir at start. ``--quick`` is a smoke run (one phase of three rounds,
300 calls and 15 stops per path and round, well under a minute); its figures are rough.

Workloads (``jdwp_load.py``): a raw blocking JDWP client in this process, the same on every path,
one command at a time, times each operation: ``name()`` (ThreadReference.Name of the target's
``main`` thread), ``allThreads()`` (VirtualMachine.AllThreads), and an IDE-like mix, one
simulated breakpoint stop timed as a whole: VM.Suspend, AllThreads + Status of each thread,
Frames of the stopped thread, ``this`` object's fields (a static frame: the thread object stands
in), the locals with values (VariableTable + StackFrame.GetValues), one ClassesBySignature,
VM.Resume (17 commands on JDK 17).

Paths, all measured in every round:

- direct:             client -> the JVM's JDWP port;
- trio relay:         client -> a plain trio byte relay (``rig/trio_relay.py``) -> the JVM;
- socat:              client -> ``socat TCP-LISTEN:..,fork TCP:..`` -> the JVM (when installed);
- ddmd:               client -> ddmd's current-VM port -> the JVM, found by ddmd's port scan
  ("the scan path");
- adb forward:        the plain adb stream: ``adb -P PORT forward tcp:X jdwp:PID`` (Debian's adb
  client) on a stand-in adb server (``rig/fake_adb.py``) that relays to the pid as a real server
  relays to the device;
- trio relay via adb: the trio relay opening ``jdwp:PID`` through the stand-in server;
- ddmd via adb:       ddmd's per-VM debugger port -> ddmd's ``jdwp:PID`` stream through the
  stand-in server (``[adb] enabled = "on"``, found by ``track-jdwp``);
- epoll relay via adb, java relay via adb: the floors, for reference: a bare one-thread relay
  (``rig/bare_relay.py``: Python, plain epoll, no logic; ``java/BareRelay.java``: a java.nio
  Selector, as ddmlib relays) in front of the adb forward's port;
- ddmlib via adb:     the reference: Debian's ddmlib 25.x (``java/DdmlibDriver.java``) per-VM
  debugger port -> its ``jdwp:PID`` stream through its own stand-in server. Skipped, with a note,
  when its jars are missing.

There is no device: only differences between adb paths (a hop = added latency minus the plain
adb stream's) carry over to a real phone. Every path has an identical JVM of its own, the roles
rotated from phase to phase; the adb forward, the trio relay via adb and the bare relays share
one stand-in server, ddmd and ddmlib have one each (each opens every pid its server lists).
Each phase starts fresh ddmd, ddmlib, relays and stand-in servers and opens one session per
path, warmed up with ``--warmup`` calls of each workload and kept for the whole phase. Then
``--rounds`` rounds: a round times each workload on every path. Each path first runs an untimed
fifth of the warm-up; then its ``--count`` calls (or ``--mix`` stops) are cut into ``--slices``
slices, and slice after slice every path runs its share, in an order shuffled anew for every
slice. A path's figure for the round is over all its slices. So the paths compared with each
other (ddmd via adb, ddmlib via adb, adb forward) are timed within the same second or two,
slice by slice, not one block after the other: this machine's speed drifts by up to 30 %
between minutes, and a hop is a difference of two medians. It is also closer to how an IDE uses
a debugger: bursts of a few dozen commands at a stop, other processes running in between
(``--slices 1`` times one whole block per path instead, one path after the other). The
sessions close at the end of the phase; then jdb attach. In the first phase ddmd's own packet
counters check that each name() is one command and one reply.

CPU: for every timed slice of every path, sum_exec_runtime (ns) of each process on the
path, over its whole process tree: every /proc/PID/task/*/schedstat of the process and of its
descendants (found by the ppid in /proc/*/stat, so socat's per-connection children count), read
right before and after; divided by the operations. The target JVM's is printed for reference.

Figures: per round, each path's median latency per workload, its added latency (minus direct's
median in the same round) and its CPU per operation. Each is printed as the median over rounds
(min-max). Each ratio is the median of the per-round paired ratios (min-max); a round whose
reference figure is not positive (noise can make a hop so) counts as inf when ddmd's is. A
verdict (PASS or MISS) is printed only when every round agrees, otherwise "no verdict".
Targets, per workload: scan path, ddmd's added latency and its CPU per operation each <= 1.1x
the trio relay's; adb path, ddmd's hop <= 1.5x ddmlib's. Also jdb attach (``jdb -attach`` to
its first prompt, direct vs ddmd, once each per round) <= 1.5x, and ddmd's RSS < 100 MB while a
1 GiB reply (a fake VM, ``--fake-vm``) is relayed. Asserts nothing. ``--profile`` then measures
ddmd and the trio relay once more with the JDI client ``RoundTrip.java`` and, with py-spy
installed, samples ddmd.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jdwp_load import LABELS, WORKLOADS, Jdwp, run_ops
from rig import HOST, JAVA_DIR, jvm, proc
from rig.children import Child, Children
from rig.daemon import Scanning, start_scanning
from rig.jdwp import HANDSHAKE, HEADER, Closed, recv_exact
from rig.jvm import Jvm, RoundTripClient, java_version, jdb_attach_ms, start_jvms
from rig.ports import Ports
from rig.relays import (
    DDMLIB_JARS,
    adb_forward,
    start_bare_relay,
    start_ddmlib,
    start_fake_adb,
    start_relay,
    start_relay_adb,
    start_socat,
)
from rig.rounds import agreed, paired, pct, span

LATENCY_TARGET = 1.1  # added(ddmd) / added(trio relay), medians
CPU_TARGET = 1.1  # CPU per round trip: ddmd / trio relay, scan path
HOP_TARGET = 1.5  # adb path: ddmd's own hop / ddmlib's (each: added latency minus adb forward's)
ATTACH_TARGET = 1.5  # jdb attach through ddmd / direct, medians
RSS_TARGET_MB = 100.0  # ddmd's peak RSS while a 1 GiB packet is relayed
MB = 1_000_000
BIG = 1 << 30  # the big reply's JDWP length, header included: ddmd's default max_packet_bytes
BIG_QUEUE = 1 << 20  # [debugger] queue_packets for the retry: more pieces than 1 GiB can make
PAUSE = 0.15  # between two measurements: the JVM (or ddmd) reopens after a debugger leaves

REPLY_HEADER = struct.Struct(">IIBH")


# --------------------------------------------------------------------------------------------
# Java: the target JVMs' classes, the JDI round-trip client, ddmlib's driver


DDMLIB_DRIVER = "DdmlibDriver.java"


def compile_java(out: Path, ddmlib_jars: Sequence[str]) -> str | None:
    """Compile bench/java into ``out``; DdmlibDriver only when ddmlib's jars are all there.
    Returns why the ddmlib path cannot run, or None."""
    sources = sorted(p.name for p in JAVA_DIR.glob("*.java") if p.name != DDMLIB_DRIVER)
    jvm.compile_java(out, sources, debug=True)  # -g: locals
    missing = [jar for jar in ddmlib_jars if not Path(jar).is_file()]
    if missing:
        return (
            f"ddmlib via adb: skipped, {', '.join(missing)} not found (Debian: apt install "
            "libandroid-ddms-java, or --ddmlib-classpath)"
        )
    done = jvm.compile_java(out, [DDMLIB_DRIVER], classpath=os.pathsep.join(ddmlib_jars))
    if done.returncode:
        return f"ddmlib via adb: skipped, DdmlibDriver does not compile: {done.stderr[-500:]}"
    return None


# --------------------------------------------------------------------------------------------
# ddmd's own counters


def start_ddmd(
    children: Children,
    work: Path,
    name: str,
    scan_port: int,
    ports: Ports,
    *,
    queue_packets: int | None = None,
    adb: tuple[int, str, int] | None = None,
    relay_threads: str | None = None,
) -> Scanning:
    """ddmd scanning only ``scan_port`` (the rig's), with these [debugger] settings."""
    debugger: dict[str, object] = {}
    if queue_packets is not None:
        debugger["queue_packets"] = queue_packets
    if relay_threads is not None:
        debugger["relay_threads"] = relay_threads == "true"
    return start_scanning(children, work, name, scan_port, ports, debugger=debugger, adb=adb)


def detached_counters(ddmd: Scanning) -> list[tuple[int, int] | None]:
    """(packets_in, packets_out) of every debugger.detached event in ddmd's JSON log (None for
    an event without them)."""
    return [
        (int(str(r["packets_in"])), int(str(r["packets_out"])))
        if "packets_in" in r and "packets_out" in r
        else None
        for r in ddmd.daemon.events("debugger.detached")
    ]


def check_one_packet_per_call(ddmd: Scanning, port: int, path: str) -> str:
    """Two sessions through ddmd's ``port`` differing by 1000 name() calls, per ddmd's own
    counters."""
    counts = []
    for n in (200, 1200):
        before = len(detached_counters(ddmd))
        client = open_session(port)
        try:
            run_ops(client, "name", n)
        finally:
            client.close()
        deadline = time.monotonic() + 10
        while len(entries := detached_counters(ddmd)) == before:
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
        f"check ({path}): +1000 name() calls -> +{d_in} commands, +{d_out} replies in ddmd "
        f"({verdict})"
    )


def open_session(port: int, timeout: float = 15.0) -> Jdwp:
    """A raw JDWP session on ``port``, ready (main thread and Target class found); retried while
    the far end is not ready yet (ddmlib reopens its VM connection after a debugger leaves)."""
    deadline = time.monotonic() + timeout
    while True:
        client = None
        try:
            client = Jdwp(port)
            client.prepare()
            return client
        except (OSError, Closed, RuntimeError, struct.error) as exc:
            if client is not None:
                with contextlib.suppress(OSError):
                    client.sock.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no JDWP session on :{port}: {exc!r}") from exc
            time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# 1 GiB packet: fake VM (--fake-vm) and fake debugger


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


def big_packet(ddmd: Scanning, label: str) -> BigResult:
    """The fake debugger: AllClasses through ddmd, read and discard the 1 GiB reply."""
    pid = ddmd.child.pid
    _, hwm_before = proc.memory_mb(pid)
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, KeyError):
                peak[0] = max(peak[0], proc.memory_mb(pid)[0])
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
        reasons = [r.get("reason") for r in ddmd.daemon.events("debugger.detached")]
        problems.append(f"{exc} (ddmd: {reasons[-1] if reasons else '?'})")
    finally:
        stop.set()
        sampler.join()
    _, hwm_after = proc.memory_mb(pid)
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
                ddmd.daemon.stop(children)
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
    assert rt is not None
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
                f"round trip: user {user / proc.CLK_TCK / count * 1e6:5.1f} us, "
                f"sys {system / proc.CLK_TCK / count * 1e6:5.1f} us"
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
        ddmd.daemon.stop(children)
    if spy is None:
        lines.append("  py-spy not installed (.venv/bin/pip install py-spy): no hot spots")
    elif raw.exists():
        lines += hot_spots(raw, 10)
    return lines


# --------------------------------------------------------------------------------------------
# Main


@dataclass
class Route:
    """One path from the client to a JVM."""

    name: str
    port: int  # where the client connects
    jvm: Jvm
    middle: list[tuple[str, Child]]  # the processes in between, (label, process)


TARGET = "target JVM"  # watched on every path, for reference


@dataclass
class Sample:
    """One path's figures for one workload in one round."""

    median_us: float
    p90_us: float
    ops: int
    commands: int
    cpu_ns: dict[str, int]  # label -> ns over the timed ops (process trees)

    def cpu_per_op_us(self, labels: Sequence[str]) -> float:
        return sum(self.cpu_ns[label] for label in labels) / self.ops / 1000


@dataclass
class Figures:
    # round -> path -> workload -> Sample
    rounds: list[dict[str, dict[str, Sample]]] = field(default_factory=list)
    jdb: list[dict[str, float]] = field(default_factory=list)  # per round: path -> ms
    middle: dict[str, list[str]] = field(default_factory=dict)  # path -> its processes' labels


@dataclass
class Bench:
    """What every phase of one run shares."""

    children: Children
    ports: Ports
    work: Path
    classes: Path
    rt: RoundTripClient | None  # the JDI client, for --profile only
    args: argparse.Namespace
    ddmlib_jars: Sequence[str]
    ddmlib_skipped: str | None  # why the ddmlib path does not run, or None
    figures: Figures = field(default_factory=Figures)
    notes: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # path -> why its session failed


def counts(args: argparse.Namespace, workload: str) -> tuple[int, int]:
    """(warm-up per session, timed per block) operations of ``workload``."""
    if workload == "mix":
        return args.mix_warmup, args.mix
    return args.warmup, args.count


@dataclass
class Live:
    """A route's session, open for the whole phase."""

    route: Route
    client: Jdwp


def open_routes(bench: Bench, routes: Sequence[Route]) -> list[Live]:
    """One session per route, each warmed up with every workload; a route whose session
    cannot open is noted and left out."""
    live = []
    for route in routes:
        if route.name in bench.failed:
            continue
        try:
            client = open_session(route.port)
            for workload in WORKLOADS:
                run_ops(client, workload, counts(bench.args, workload)[0])
        except (RuntimeError, OSError, Closed, struct.error) as exc:
            fail(bench, route, exc)
            continue
        live.append(Live(route, client))
    return live


def fail(bench: Bench, route: Route, exc: BaseException) -> None:
    bench.failed[route.name] = f"{exc!r}"
    print(f"bridge_latency: {route.name}: {exc!r}", file=sys.stderr, flush=True)


@dataclass
class _Block:
    """What one path's slices of a workload add up to in one round."""

    samples: list[float] = field(default_factory=list)
    sent: int = 0
    cpu: dict[str, int] = field(default_factory=dict)


def slice_sizes(n: int, slices: int) -> list[int]:
    """``n`` operations cut into ``slices`` slices (fewer when ``n`` is smaller), as even as
    can be."""
    k = max(1, min(slices, n))
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def measure_round(bench: Bench, live: Sequence[Live], workload: str) -> dict[str, Sample]:
    """One round of ``workload`` on every live path, in ``--slices`` interleaved slices: each
    path first runs an untimed fifth of the warm-up, then slice after slice every path runs its
    share of the timed operations, in an order shuffled anew for every slice (seeded: a run can
    be repeated). A path's figures are over all its slices (median and p90 of every operation,
    CPU of the process tree of everything on the path, read around each slice). So the paths
    compared with each other are timed within the same second or so, not one block after the
    other. A failure is noted and the path left out."""
    warm, n = counts(bench.args, workload)
    watch: dict[str, dict[str, list[int]]] = {}
    blocks: dict[str, _Block] = {}
    for each in live:
        route = each.route
        watch[route.name] = {label: [child.pid] for label, child in route.middle}
        watch[route.name][TARGET] = [route.jvm.pid]
        blocks[route.name] = _Block()
        bench.figures.middle.setdefault(route.name, [label for label, _ in route.middle])
    shuffle = random.Random(f"{len(bench.figures.rounds)} {workload}").shuffle
    for size in [0, *slice_sizes(n, bench.args.slices)]:
        order = list(live)
        shuffle(order)  # no path always runs right after the same other path
        for each in order:
            name = each.route.name
            if name in bench.failed:
                continue
            try:
                if not size:  # the lead-in: the path is as warm as in a session of its own
                    run_ops(each.client, workload, max(1, warm // 5))
                    continue
                before = proc.snapshot(watch[name])
                samples, sent = run_ops(each.client, workload, size)
                cpu = proc.spent_by_label(before, proc.snapshot(watch[name]))
            except (RuntimeError, OSError, Closed, struct.error) as exc:
                fail(bench, each.route, exc)
                continue
            block = blocks[name]
            block.samples += samples
            block.sent += sent
            for label, ns in cpu.items():
                block.cpu[label] = block.cpu.get(label, 0) + ns
    return {
        name: Sample(statistics.median(b.samples), pct(b.samples, 90), n, b.sent, b.cpu)
        for name, b in blocks.items()
        if name not in bench.failed and len(b.samples) == n
    }


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


def route_names(with_socat: bool, with_ddmlib: bool) -> list[str]:
    """Every path, in the order of the first round; each has a JVM of its own."""
    names = ["direct", "trio relay"] + (["socat"] if with_socat else [])
    names += ["epoll relay via adb", "java relay via adb", "ddmd", "adb forward"]
    names += ["trio relay via adb", "ddmd via adb"] + (["ddmlib via adb"] if with_ddmlib else [])
    return names


def run_phase(bench: Bench, phase: int, names: Sequence[str], jvms: Sequence[Jvm]) -> None:
    """One phase: fresh ddmd, ddmlib, relays and stand-in adb servers, each path on a JVM of its
    own (the JVMs' roles rotate from phase to phase). Every path's session is opened once and
    kept; then ``--rounds`` rounds. A round times each workload on every path, in interleaved
    slices (``measure_round``), so a path and the one it is compared with are timed within a
    second or two (the machine's speed drifts over minutes). Then jdb attach, per round."""
    children, ports, args = bench.children, bench.ports, bench.args
    jvm = {name: jvms[(i + phase - 1) % len(jvms)] for i, name in enumerate(names)}
    with contextlib.ExitStack() as stack:
        via_free = [jvm[n] for n in ("adb forward", "trio relay via adb")]
        via_free += [jvm[f"{kind} relay via adb"] for kind in ("epoll", "java")]
        fake_free = start_fake_adb(children, "bench-free", *via_free)
        stack.callback(children.stop, fake_free.child)
        fake_ddmd = start_fake_adb(children, "bench-ddmd", jvm["ddmd via adb"])
        stack.callback(children.stop, fake_ddmd.child)
        ddmd = start_ddmd(
            children,
            bench.work,
            f"ddmd-phase{phase}",
            jvm["ddmd"].port,
            ports,
            adb=(fake_ddmd.port, fake_ddmd.serial, jvm["ddmd via adb"].pid),
            relay_threads=args.relay_threads,
        )
        stack.callback(ddmd.daemon.stop, children)
        assert ddmd.adb_port is not None
        relay_port, relay_adb_port, forward_port = ports.take(), ports.take(), ports.take()
        relay = start_relay(children, relay_port, jvm["trio relay"].port)
        stack.callback(children.stop, relay)
        relay_adb = start_relay_adb(
            children,
            relay_adb_port,
            fake_free.port,
            fake_free.serial,
            jvm["trio relay via adb"].pid,
        )
        stack.callback(children.stop, relay_adb)
        forwarded_by = adb_forward(fake_free, forward_port, jvm["adb forward"].pid)
        adb_middle = [("fake adb", fake_free.child)]
        routes = {
            "direct": Route("direct", jvm["direct"].port, jvm["direct"], []),
            "trio relay": Route(
                "trio relay", relay_port, jvm["trio relay"], [("trio relay", relay)]
            ),
        }
        if "socat" in jvm:
            socat_port = ports.take()
            socat = start_socat(children, socat_port, jvm["socat"].port)
            stack.callback(children.stop, socat)
            routes["socat"] = Route("socat", socat_port, jvm["socat"], [("socat", socat)])
        for kind in ("epoll", "java"):  # the floors: bare relays in front of an adb forward
            name = f"{kind} relay via adb"
            bare_port, bare_forward = ports.take(), ports.take()
            adb_forward(fake_free, bare_forward, jvm[name].pid)
            bare = start_bare_relay(children, kind, bench.classes, bare_port, bare_forward)
            stack.callback(children.stop, bare)
            routes[name] = Route(name, bare_port, jvm[name], [(f"{kind} relay", bare), *adb_middle])
        routes["ddmd"] = Route("ddmd", ddmd.current_port, jvm["ddmd"], [("ddmd", ddmd.child)])
        routes["adb forward"] = Route("adb forward", forward_port, jvm["adb forward"], adb_middle)
        routes["trio relay via adb"] = Route(
            "trio relay via adb",
            relay_adb_port,
            jvm["trio relay via adb"],
            [("trio relay", relay_adb), *adb_middle],
        )
        routes["ddmd via adb"] = Route(
            "ddmd via adb",
            ddmd.adb_port,
            jvm["ddmd via adb"],
            [("ddmd", ddmd.child), ("fake adb", fake_ddmd.child)],
        )
        if "ddmlib via adb" in jvm and (ddmlib := try_ddmlib(bench, stack, jvm["ddmlib via adb"])):
            routes["ddmlib via adb"] = ddmlib
        order = [routes[n] for n in names if n in routes]
        owners = ", ".join(f"{r.name} -> {r.jvm.name}" for r in order)
        bench.notes.append(f"phase {phase}: {owners}")
        if phase == 1:
            bench.notes.append(f"adb forward: {forwarded_by}")
            for port, path in ((ddmd.current_port, "scan"), (ddmd.adb_port, "via adb")):
                try:
                    bench.notes.append(check_one_packet_per_call(ddmd, port, path))
                except (RuntimeError, TimeoutError, OSError) as exc:
                    bench.notes.append(f"check ({path}): failed: {exc}")
        live = open_routes(bench, order)
        try:
            for _ in range(args.rounds):
                figures: dict[str, dict[str, Sample]] = {}
                for workload in WORKLOADS:
                    for name, got in measure_round(bench, live, workload).items():
                        figures.setdefault(name, {})[workload] = got
                bench.figures.rounds.append(figures)
        finally:
            for each in live:
                with contextlib.suppress(OSError):
                    each.client.close()
        time.sleep(PAUSE)  # the JVMs and ddmd take the next debugger
        for i in range(args.rounds):
            jdb: dict[str, float] = {}
            if not args.skip_jdb:
                jdb_order = [("direct", jvm["direct"].port), ("ddmd", ddmd.current_port)]
                for name, port in jdb_order if i % 2 == 0 else jdb_order[::-1]:
                    try:
                        jdb[name] = jdb_attach_ms(port)
                    except (RuntimeError, TimeoutError) as exc:
                        bench.notes.append(f"jdb attach {name}: failed: {exc}")
                    time.sleep(PAUSE)
            bench.figures.jdb.append(jdb)


def report(bench: Bench, big: list[BigResult]) -> list[str]:
    figures = bench.figures
    rounds = figures.rounds
    lines = [*bench.notes]
    lines += [f"{name}: FAILED, left out from then on: {why}" for name, why in bench.failed.items()]
    if bench.ddmlib_skipped:
        lines.append(bench.ddmlib_skipped)
    if not shutil.which("socat"):
        lines.append("socat: not installed, skipped")
    paths = list(dict.fromkeys(p for r in rounds for p in r))

    def per_round(fn: Callable[..., float | None]) -> list[float]:
        """fn over every round where it has a figure (None: missing)."""
        out = []
        for r in rounds:
            with contextlib.suppress(KeyError, ZeroDivisionError):
                value = fn(r)
                if value is not None:
                    out.append(value)
        return out

    def middle_cpu(r: dict[str, dict[str, Sample]], path: str, w: str) -> float:
        return r[path][w].cpu_per_op_us(figures.middle[path])

    def added(r: dict[str, dict[str, Sample]], path: str, w: str) -> float:
        return r[path][w].median_us - r["direct"][w].median_us

    def hop(r: dict[str, dict[str, Sample]], path: str, w: str) -> float:
        return r[path][w].median_us - r["adb forward"][w].median_us

    lines.append(
        f"{len(rounds)} rounds; per path and workload, median over rounds (min-max) of the "
        "round's median latency, added latency over direct (same round), and CPU per operation "
        "of the processes between client and JVM (schedstat ns, whole process trees):"
    )
    for w in WORKLOADS:
        cmds = per_round(lambda r, w=w: r["direct"][w].commands / r["direct"][w].ops)
        per = f", {statistics.median(cmds):.0f} commands per stop" if w == "mix" and cmds else ""
        lines.append(f"{LABELS[w]} (us per {'stop' if w == 'mix' else 'call'}{per}):")
        lines.append(f"  {'path':<20}{'median':>24}{'added':>24}{'CPU/op':>24}{'JVM CPU/op':>14}")
        for path in paths:
            med = per_round(lambda r, p=path, w=w: r[p][w].median_us)
            add = per_round(lambda r, p=path, w=w: added(r, p, w)) if path != "direct" else []
            cpu = per_round(
                lambda r, p=path, w=w: middle_cpu(r, p, w) if figures.middle[p] else None
            )
            jvm = per_round(lambda r, p=path, w=w: r[p][w].cpu_per_op_us([TARGET]))
            if not med:
                continue
            lines.append(
                f"  {path:<20}{span(med):>24}{span(add) if add else '-':>24}"
                f"{span(cpu) if cpu else '-':>24}{statistics.median(jvm):>14.1f}"
            )
        parts = []
        for path in paths:
            if figures.middle.get(path):
                each = []
                for label in figures.middle[path]:
                    us = per_round(
                        lambda r, p=path, w=w, x=label: r[p][w].cpu_ns[x] / r[p][w].ops / 1000
                    )
                    each.append(f"{label} {statistics.median(us):.1f}")
                parts.append(f"{path}: " + ", ".join(each))
        lines.append("  CPU/op by process tree (us, median over rounds): " + "; ".join(parts))

    rows: list[tuple[str, str, str]] = []

    def row(what: str, ratios: list[float], target: float, detail: str) -> None:
        if len(ratios) < len(rounds) or not ratios:
            rows.append((what, f"figures in {len(ratios)} of {len(rounds)} rounds", "no verdict"))
            return
        rows.append((what, f"{span(ratios, '.2f')}x  {detail}", agreed(ratios, target)))

    Figure = Callable[[dict[str, dict[str, Sample]], str, str], float]
    scan = (("ddmd", "ddmd"), ("trio relay", "trio relay"))  # (path, its name in the text)
    adb = (("ddmd via adb", "ddmd"), ("ddmlib via adb", "ddmlib"))
    compared: list[tuple[str, Figure, str, str, tuple[str, str], tuple[str, str], float]] = [
        # where, the figure, what it is, its unit, the path measured and its reference, target
        ("scan", added, "added latency", "added us", *scan, LATENCY_TARGET),
        ("scan", middle_cpu, "CPU/op", "CPU/op us", *scan, CPU_TARGET),
        ("adb", hop, "hop", "hop us", *adb, HOP_TARGET),
    ]
    for where, fig, what, unit, (a, a_name), (b, b_name), target in compared:
        for w in WORKLOADS:
            ratios = per_round(lambda r, f=fig, a=a, b=b, w=w: paired(f(r, a, w), f(r, b, w)))
            d = per_round(lambda r, f=fig, a=a, w=w: f(r, a, w))
            t = per_round(lambda r, f=fig, b=b, w=w: f(r, b, w))
            detail = f"({unit}: {a_name} {span(d)}, {b_name} {span(t)})" if d and t else ""
            row(
                f"{where}, {LABELS[w]}: {what} {a_name} / {b_name} <= {target}",
                ratios,
                target,
                detail,
            )
    info: list[str] = []
    for w in WORKLOADS:
        # Is ddmlib's hop within a Python relay's reach at all, and how far is ddmd from one?
        # (what, per-round figure, unit): ratios of hops or added latencies, and single hops.
        refs: list[tuple[str, Callable[[dict[str, dict[str, Sample]]], float | None], str]] = [
            (
                "own CPU/op ddmd / ddmlib's JVM",
                lambda r, w=w: (
                    r["ddmd via adb"][w].cpu_ns["ddmd"]
                    / r["ddmlib via adb"][w].cpu_ns["ddmlib JVM"]
                ),
                "x",
            ),
            (
                "a plain trio relay's hop on the adb path",
                lambda r, w=w: hop(r, "trio relay via adb", w),
                " us",
            ),
            (
                "hop trio relay / ddmlib",
                lambda r, w=w: paired(hop(r, "trio relay via adb", w), hop(r, "ddmlib via adb", w)),
                "x",
            ),
            (
                "added latency ddmd via adb / trio relay via adb",
                lambda r, w=w: paired(
                    added(r, "ddmd via adb", w), added(r, "trio relay via adb", w)
                ),
                "x",
            ),
        ]
        refs += [
            (
                f"a bare {kind} relay's hop (one thread, no logic)",
                lambda r, w=w, k=kind: hop(r, f"{k} relay via adb", w),
                " us",
            )
            for kind in ("epoll", "java")
        ]
        for what, a, b in (
            ("bare epoll relay / ddmlib", "epoll relay via adb", "ddmlib via adb"),
            ("ddmd / bare epoll relay", "ddmd via adb", "epoll relay via adb"),
            ("bare epoll relay / bare java relay", "epoll relay via adb", "java relay via adb"),
        ):
            refs.append(
                (f"hop {what}", lambda r, w=w, a=a, b=b: paired(hop(r, a, w), hop(r, b, w)), "x")
            )
        for what, fn, unit in refs:
            if values := per_round(fn):
                shown = span(values, ".2f") if unit == "x" else span(values)
                info.append(f"  adb, {LABELS[w]}: {what} {shown}{unit}")
        socat = per_round(lambda r, w=w: paired(added(r, "socat", w), added(r, "trio relay", w)))
        if socat:
            info.append(
                f"  scan, {LABELS[w]}: added latency socat / trio relay {span(socat, '.2f')}x"
            )
    jdb = [j["ddmd"] / j["direct"] for j in figures.jdb if "ddmd" in j and "direct" in j]
    if jdb:
        ms = [j["ddmd"] for j in figures.jdb if "ddmd" in j]
        direct = [j["direct"] for j in figures.jdb if "direct" in j]
        rows.append(
            (
                f"jdb attach ddmd / direct <= {ATTACH_TARGET}",
                f"{span(jdb, '.2f')}x  (ms: direct {span(direct, '.0f')}, ddmd {span(ms, '.0f')})",
                agreed(jdb, ATTACH_TARGET),
            )
        )
    if big:
        lines += [b.describe() for b in big]
        first = big[0]
        ok = first.complete and first.hwm_after < RSS_TARGET_MB
        rows.append(
            (
                f"ddmd RSS < {RSS_TARGET_MB:.0f} MB relaying 1 GiB",
                f"VmHWM {first.hwm_after:.1f} MB",
                "PASS" if ok else "MISS",
            )
        )
    lines.append(
        "targets (each ratio: median of the per-round paired ratios (min-max); PASS/MISS only "
        "when every round agrees):"
    )
    for what, value, verdict in rows:
        lines.append(f"  {what}: {value}\n      -> {verdict}")
    if info:
        lines += ["for reference (no target):", *info]
    return lines


QUICK = {
    "phases": 1,
    "rounds": 3,
    "count": 300,
    "warmup": 200,
    "mix": 15,
    "mix_warmup": 5,
    "slices": 10,
    "profile_count": 3000,
}
NORMAL = {
    "phases": 4,
    "rounds": 3,
    "count": 1000,
    "warmup": 1000,
    "mix": 50,
    "mix_warmup": 20,
    "slices": 20,
    "profile_count": 20000,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 phase, 3 rounds, 300 calls, 15 stops"
    )
    parser.add_argument(
        "--phases",
        type=int,
        choices=range(1, 11),
        help="phases, each with fresh processes and the JVMs' roles rotated (default 4)",
    )
    parser.add_argument("--rounds", type=int, help="rounds per phase (default 3)")
    parser.add_argument(
        "--count", type=int, help="timed name()/allThreads() per path and round (1000)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        help="untimed calls of each per session (1000; a fifth before each timed block)",
    )
    parser.add_argument("--mix", type=int, help="timed IDE-mix stops per path and round (50)")
    parser.add_argument(
        "--slices",
        type=int,
        help="interleaved slices a round's timed operations are cut into (default 20)",
    )
    parser.add_argument("--mix-warmup", type=int, help="untimed stops first (default 20)")
    parser.add_argument("--skip-big", action="store_true", help="skip the 1 GiB packet")
    parser.add_argument("--skip-jdb", action="store_true", help="skip the jdb attach times")
    parser.add_argument(
        "--ddmlib-classpath",
        default=os.pathsep.join(DDMLIB_JARS),
        help="ddmlib and the jars it needs (default: Debian's libandroid-ddms-java)",
    )
    parser.add_argument(
        "--relay-threads",
        choices=("true", "false"),
        help="ddmd's [debugger] relay_threads (default: ddmd's default, true)",
    )
    parser.add_argument("--profile", action="store_true", help="profile ddmd afterwards")
    parser.add_argument("--profile-count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--fake-vm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fake_vm:
        with contextlib.suppress(KeyboardInterrupt):
            fake_vm_main()
        return 0
    for key, value in (QUICK if args.quick else NORMAL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.phases * args.rounds < 3:
        parser.error("at least three rounds in all (--phases x --rounds)")
    if min(args.warmup, args.mix_warmup) < 1 or args.count < 10 or args.mix < 3:
        parser.error("--warmup, --mix-warmup >= 1, --count >= 10, --mix >= 3")
    if args.slices < 1:
        parser.error("--slices >= 1 (1: each path's block in one piece, one path after another)")

    missing = [tool for tool in ("java", "javac", "jdb") if shutil.which(tool) is None]
    if missing:
        print(f"bridge_latency: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    print(
        f"bridge_latency: JDK {java_version()}, {os.cpu_count()} CPUs; {args.phases} phase(s) x "
        f"{args.rounds} round(s); per path and round {args.count} name() and {args.count} "
        f"allThreads(), {args.mix} IDE-mix stops, in {args.slices} interleaved slice(s) (warm-up: "
        f"{args.warmup} calls and {args.mix_warmup} stops per session, a fifth in each round)"
        + (" [--quick: rough figures]" if args.quick else ""),
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
            names = route_names(shutil.which("socat") is not None, skipped is None)
            jvms = start_jvms(children, len(names), ports, classes)
            rt = RoundTripClient(children, classes) if args.profile else None
            bench = Bench(children, ports, work, classes, rt, args, ddmlib_jars, skipped)
            bench.notes.append(
                ", ".join(f"{j.name} on :{j.port} (pid {j.pid})" for j in jvms)
                + ": same program and flags"
            )
            for phase in range(args.phases):
                run_phase(bench, phase + 1, names, jvms)
            if not args.skip_big:
                big = big_packet_phase(children, work, ports)
            for line in report(bench, big):
                print(line, flush=True)
            if rt is not None:
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
