"""The adb front's forward against ddmd's per-VM port and plain ``adb forward``: jdb attach time,
JDWP connection set-up and round trips to ONE HotSpot JVM exposed as a device pid.

Run: ``.venv/bin/python bench/front.py [--rounds 3] [--trips 3000] [--mix 150] [--attaches 15]
[--handshakes 20] [--ref HEAD]``  (the defaults take about 1.5-2.5 minutes)

Set-up, every piece its own process on 127.0.0.1 (the bench process only runs the clients):

- a HotSpot JVM (``bench/java/Target.java``, ``-agentlib:jdwp=...,server=y,suspend=n`` on a
  FIXED port: the agent closes its listening socket while a debugger is attached and listens
  again on the same port a few ms after the session ends, which is how the bench knows the VM
  is free again: that port in LISTEN state in /proc/net/tcp);
- a private real adb server (``adb -P PORT start-server``, HOME a temp dir and no adb port
  variables, as ``tests/adb/device.py`` does) and the fake device daemon
  (``python -m ddmd.sim.adbd``) adopted by it, whose ``jdwp:PID`` is relayed to that JVM
  (PID = the JVM's own pid);
- ``ddmd run`` (``.venv/bin/ddmd``) with ``[scan] enabled = false``, ``[adb] enabled = "on"`` on
  that server (its ``path`` a missing program: ddmd never starts a server) and its adb front on
  a free port; it holds the VM as SERIAL/PID through the server.

Paths, each to the same VM:

- a. front forward: ``adb -P FRONT -s SERIAL forward tcp:0 jdwp:PID`` made at ddmd's front;
  the client connects to that port, ddmd hands the socket to the VM it holds;
- b. per-VM port: ddmd's own debugger port of SERIAL/PID;
- c. adb forward: ``adb -P SERVER -s SERIAL forward tcp:0 jdwp:PID`` on the real server, with
  ddmd STOPPED (the device's jdwp:PID is free only then): client -> adb server -> fake device
  -> JVM, what a debugger gets from adb alone.

Rounds. The machine's speed drifts (by a third between minutes here), so the samples of the
paths are taken as close together in time as the set-up allows. A round has two halves; each
half is a block of a and b and a block of c (c first in odd rounds):

- the a+b block starts a FRESH ddmd (new process, new front forward), warms both paths up
  untimed (a handshake, a session of TRIPS/20 round trips and 3 mix iterations each), then
  takes its samples alternately, a b b a a b ... (the first path alternating by block): each
  handshake, each jdb attach and each raw session in turn, one at a time (never two
  debuggers at once, which would change ddmd's rules), so the target ratio front / per-VM
  port compares samples taken seconds apart;
- the c block stops ddmd (the device's jdwp:PID is free only then), warms up the same way and
  takes its samples.

So every round measures a, b and c, in an order that rotates, and ddmd is started twice a round.

What is measured, per path and round:

- jdb attach: ``jdb -attach 127.0.0.1:PORT`` from start to its first prompt, then ``quit``
  (``rig.jvm.jdb_attach_ms``); ATTACHES per round, their median is the round's figure.
  On a and b the attach is also split at ddmd's ``debugger.attached`` log event (JSON log,
  µs timestamps): jdb start -> its handshake answered | the rest, to the prompt;
- handshake: a raw socket's connect() to the ``JDWP-Handshake`` echo, then close: the
  connection set-up alone, without jdb's own start-up; HANDSHAKES per round (median). On a and
  b, ddmd's log also gives when the socket was handed to the VM (``front.forward_connected``)
  and when its handshake was answered (``debugger.attached``), from the client's connect();
- round trip: a raw JDWP client (this process, TCP_NODELAY) attaches, sends 50 commands and
  one mix untimed, then ``ThreadReference.Name(main)`` one at a time, timing each command to
  its reply; TRIPS per round over 4 sessions; the round's figure is the median. (Name, not
  VirtualMachine.Version: ddmd answers Version and IDSizes from its cache, so they never reach
  the VM through ddmd but do through adb forward.)
- mix: the same sessions then run (MIX per round) what a debugger does to show the threads
  view and a paused stack: AllThreads; Name, Status and ThreadGroup of each thread;
  VM.Suspend; FrameCount and Frames of main; Signature, SourceFile and Method.LineTable of each
  frame's location; VM.Resume (29 commands on JDK 17); the round's figure is the median
  iteration.

Each figure is reported as the median over rounds of the rounds' medians (min-max); each ratio
(front / per-VM port, front / adb forward, per-VM port / adb forward) as the median of the
per-round paired ratios (min-max over rounds). The target: the front path within 10 % of the
per-VM port's figure, i.e. the median paired ratio <= 1.10, for jdb attach and for the round
trip (PASS/FAIL; PASS* when some round's ratio was over; the handshake and mix rows carry a
verdict in brackets, for information).

CPU: sum_exec_runtime of every thread of every process of a tree (``/proc/PID/task/*/
schedstat``, children through ``/proc/PID/task/*/children``), read right before and right after
each timed part (for a handshake and a jdb attach: 50 ms after the close, so that ddmd's
handling of the detach counts): ddmd's tree, and the adb server's + fake device's trees ("adb
side", on every path, since ddmd's own VM connection also goes through them). A thread that
ends within a window loses its time after the first read (trio's idle worker threads end after
10 s idle, with nothing to lose). The control API is polled only between timed parts. Reported
per round trip (µs), per mix iteration, per jdb attach and per handshake (ms), as medians over
rounds, with ddmd's front / per-VM port paired ratios.

The front's extra step: a front forward's connection is handed to the VM only after ddmd looked
up the process at the other end (``ddmd.toolnames.peer_process``, for the tool name in logs and
the API: the kernel's socket table, then the fd tables of the user's processes, newest pids
last). The per-VM port hands its connection over at once (since 70623be it runs the same lookup
too, beside the session rather than before it). So the bench also times that lookup in this
process, while the rig runs, on LOOKUPS connections from a new process (like jdb, the newest
pid): whole, and its two parts with the number of fd links read. After the handshake both
paths run the same code (``adopt_debugger``), except that a front socket becomes a debugger at
its first non-DDM command rather than at its handshake.

``--ref REV`` runs ddmd, the fake device and the lookup from a ``git archive`` snapshot of REV
(e.g. HEAD) instead of the working tree, which others may be editing during the run (ddmd is
started twice a round). The header says which code ran.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rig import HOST, jvm, proc
from rig.adb import ADB_ENV, AdbServer
from rig.children import Child, Children
from rig.daemon import Daemon, json_log, start_ddmd, use_tree, write_config
from rig.jdwp import Closed
from rig.jdwp import RawJdwp as Jdwp
from rig.jvm import java_version, jdb_attach_ms
from rig.ports import Ports
from rig.rounds import alternating, by_median, print_report, ratios, span

TARGET = 1.10  # front / per-VM port, medians of paired ratios
PATHS = ("front", "vm-port", "adb-fwd")
TITLES = {
    "front": "a. front forward",
    "vm-port": "b. per-VM port",
    "adb-fwd": "c. adb forward, no ddmd",
}
WAIT = 30.0  # seconds: one condition (ddmd ready, the VM free again, ...)
LOOKUPS = 30  # timed peer-process lookups
SESSIONS = 4  # raw JDWP sessions per path and round (round trips and mix split over them)
SHORT = {"front": "a", "vm-port": "b", "adb-fwd": "c"}

# --------------------------------------------------------------------------------------------
# The mix


def mix_once(client: Jdwp, main: bytes) -> int:
    """One threads-view refresh and paused-stack look; returns the number of commands."""
    obj, ref, meth, frame = client.sizes[2], client.sizes[3], client.sizes[1], client.sizes[4]
    sent = 1
    threads = client.ids(client.ok(1, 4), obj)  # VM.AllThreads
    for tid in threads:
        client.command(11, 1, tid)  # Name
        client.command(11, 4, tid)  # Status
        client.command(11, 5, tid)  # ThreadGroup
        sent += 3
    client.ok(1, 8)  # VM.Suspend
    client.command(11, 7, main)  # FrameCount
    err, body = client.command(11, 6, main + struct.pack(">ii", 0, -1))  # Frames
    sent += 3
    if not err:
        (n,) = struct.unpack_from(">i", body)
        at = 4
        for _ in range(n):
            at += frame + 1  # frame id, type tag
            cls, mid = body[at : at + ref], body[at + ref : at + ref + meth]
            at += ref + meth + 8
            client.command(2, 1, cls)  # ReferenceType.Signature
            client.command(2, 7, cls)  # ReferenceType.SourceFile
            client.command(6, 1, cls + mid)  # Method.LineTable
            sent += 3
    client.ok(1, 9)  # VM.Resume
    return sent + 1


# --------------------------------------------------------------------------------------------
# The processes


@dataclass
class Ddmd:
    """One ``ddmd run`` process and what the bench needs of it."""

    daemon: Daemon
    front_forward: int = 0
    vm_port: int = 0


@dataclass
class Rig:
    work: Path
    children: Children
    ports: Ports
    jvm: Child
    jvm_port: int
    adb: AdbServer
    serial: str
    config: Path
    control_port: int
    front_port: int
    adb_forward: int  # the real server's forward tcp:N jdwp:PID (path c)
    cpu: dict[str, list[int]]  # label -> the roots of its process trees
    ddmd: Ddmd | None = None
    starts: int = 0

    @property
    def pid(self) -> int:
        return self.jvm.pid

    @property
    def vm_id(self) -> str:
        return f"{self.serial}/{self.pid}"

    # -------------------------------------------------------------- the VM free again

    def wait_jvm_listening(self) -> None:
        """Until the JVM's agent listens again: its last JDWP session ended (HotSpot closes
        its listening socket while a debugger is attached and reopens it a few ms after)."""
        deadline = time.monotonic() + WAIT
        while not proc.listening([self.jvm_port]):
            self.jvm.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the JVM does not listen on {self.jvm_port} again")
            time.sleep(0.005)

    # -------------------------------------------------------------- ddmd

    def start_ddmd(self) -> Ddmd:
        self.starts += 1
        log_path = self.work / f"ddmd-{self.starts}.log"
        daemon = start_ddmd(self.config, log_path, self.control_port, children=self.children)
        self.ddmd = Ddmd(daemon)
        self.cpu["ddmd"] = [daemon.child.pid]
        vm = self.wait_vm(lambda vm: vm["state"] == "ready" and bool(vm.get("debugger_port")))
        self.ddmd.vm_port = int(str(vm["debugger_port"]))
        self.ddmd.front_forward = AdbServer(self.front_port).forward(self.serial, self.pid)
        return self.ddmd

    def stop_ddmd(self) -> None:
        if self.ddmd is None:
            return
        self.ddmd.daemon.stop(self.children)
        self.ddmd = None
        self.cpu.pop("ddmd", None)
        self.wait_jvm_listening()  # ddmd's VM connection has ended

    def wait_vm(self, good: Callable[[dict[str, object]], bool]) -> dict[str, object]:
        assert self.ddmd is not None
        return self.ddmd.daemon.wait_vm(self.vm_id, good, timeout=WAIT, interval=0.03)

    # -------------------------------------------------------------- paths

    def tail(self, lines: int = 12) -> str:
        """The end of the running ddmd's log, for an error message ("" without ddmd)."""
        if self.ddmd is None:
            return " (ddmd stopped)"
        return self.ddmd.daemon.tail(lines)

    def ddmd_times(self, after: float, peer: str | None = None) -> dict[str, float]:
        """Wall-clock times (time.time()) of ddmd's first log events since ``after`` about one
        connection (``peer``, or the first one seen): front.forward_connected (handed to the VM,
        after the peer lookup) and debugger.attached (its handshake answered)."""
        assert self.ddmd is not None
        log_path = self.ddmd.daemon.log_path
        wanted = ("front.forward_connected", "debugger.attached")
        found: dict[str, float] = {}
        for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if (peer is not None and f'"{peer}"' not in line) or not any(
                f'"{w}"' in line for w in wanted
            ):
                continue
            with contextlib.suppress(ValueError, KeyError):
                record = json.loads(line)
                stamp = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
                if stamp < after or record["event"] in found:
                    continue
                if peer is None:
                    peer = str(record["peer"])
                if record.get("peer") == peer:
                    found[record["event"]] = stamp
        return found

    def port(self, path: str) -> int:
        if path == "adb-fwd":
            return self.adb_forward
        assert self.ddmd is not None
        return self.ddmd.front_forward if path == "front" else self.ddmd.vm_port

    def settle(self, path: str) -> None:
        """After a session on ``path``: wait until the VM takes the next one."""
        if path == "adb-fwd":
            self.wait_jvm_listening()
        else:
            self.wait_vm(lambda vm: vm["state"] == "ready" and not vm.get("debuggers"))


def make_rig(
    work: Path, children: Children, ports: Ports, stops: list[Callable[[], object]]
) -> Rig:
    """The JVM, the adb server with the fake device adopted, both forwards' prerequisites and
    ddmd's config; ``stops`` gets what must be undone at the end (the adb server)."""
    classes = work / "classes"
    jvm.compile_java(classes, ["Target.java"])
    jvm_port = ports.take()
    target = children.start("JVM", jvm.jvm_argv(jvm_port, classes, "Target"))
    jvm.wait_agent(target, jvm_port, WAIT)

    adb = AdbServer(ports.take())
    stops.append(adb.kill)
    cpu = {"adb side": [adb.start()]}
    device_port = ports.take()
    device = children.start(
        "fake device",
        [
            sys.executable,
            "-P",  # not the cwd (the working tree) first on sys.path: see use_tree
            "-m",
            "ddmd.sim.adbd",
            "--port",
            str(device_port),
            "--pid",
            f"{target.pid}={HOST}:{jvm_port}",
            "--adb-port",
            str(adb.port),
        ],
    )
    cpu["adb side"].append(device.pid)
    serial = adb.adopt(device, WAIT)
    adb_forward = adb.forward(serial, target.pid)

    control_port, front_port, current_port = ports.take(), ports.take(), ports.take()
    first, last = ports.take_range(2)
    no_adb = work / "no-adb-program"
    config = write_config(
        work / "ddmd.toml",
        {
            "scan": {"enabled": False},
            "adb": {"enabled": "on", "host": HOST, "port": adb.port, "path": no_adb},
            "front": {"host": HOST, "port": front_port},
            "debugger": {
                "host": HOST,
                "ports": f"{first}-{last}",
                "current_port": current_port,
                "state_file": work / "ddmd-ports.json",
            },
            "control": {"host": HOST, "port": control_port, "socket": ""},
            "log": json_log(),
        },
    )
    return Rig(
        work,
        children,
        ports,
        target,
        jvm_port,
        adb,
        serial,
        config,
        control_port,
        front_port,
        adb_forward,
        cpu,
    )


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass
class RoundFigures:
    """One path in one round."""

    attach_ms: list[float] = field(default_factory=list)
    handshake_ms: list[float] = field(default_factory=list)
    handed_ms: list[float] = field(default_factory=list)  # connect -> front.forward_connected
    answered_ms: list[float] = field(default_factory=list)  # connect -> debugger.attached
    jdb_answered_ms: list[float] = field(default_factory=list)  # jdb start -> debugger.attached
    jdb_rest_ms: list[float] = field(default_factory=list)  # debugger.attached -> its prompt
    trip_us: list[float] = field(default_factory=list)
    mix_ms: list[float] = field(default_factory=list)
    commands_per_mix: int = 0
    retries: int = 0  # samples taken again: the connection was dropped before the handshake
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)  # part -> label -> s


def connect(port: int) -> Jdwp:
    """An untimed session, retried while the VM is not there yet."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return Jdwp(port)
        except (OSError, Closed):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


GRACE = 0.05  # seconds after a session's close still counted: its detach in ddmd


def timed_cpu(
    rig: Rig, fig: RoundFigures, part: str, run: Callable[[], None], *, grace: float = 0.0
) -> None:
    """Add the CPU the watched trees spend in ``run()`` (and ``grace`` seconds after it) to
    ``fig.cpu[part]``."""
    before = proc.snapshot(rig.cpu)
    run()
    if grace:
        time.sleep(grace)
    spent = proc.spent_by_label(before, proc.snapshot(rig.cpu))
    mine = fig.cpu.setdefault(part, {})
    for label, ns in spent.items():
        mine[label] = mine.get(label, 0.0) + ns / 1e9


RETRIES = 5  # attempts of one sample whose connection the far end dropped at once


def retried(rig: Rig, path: str, fig: RoundFigures | None, attempt: Callable[[], None]) -> None:
    """``attempt()``, again (after settling) when the connection was dropped before the
    handshake; a failed attempt's time and CPU are not counted, the retries are
    (``fig.retries``). The fake device, like ART's adbconnection, accepts and drops a
    ``jdwp:PID`` while it still holds the previous one, and it lets that one go a moment
    after the JVM is listening again: under load a new adb-forward connection can come in
    between."""
    for left in range(RETRIES - 1, -1, -1):
        try:
            attempt()
            return
        except (OSError, Closed, JdbFailed) as exc:
            if not left:
                raise RuntimeError(
                    f"{TITLES[path]} (port {rig.port(path)}): {exc}{rig.tail()}"
                ) from exc
            if fig is not None:
                fig.retries += 1
            time.sleep(0.1)
            rig.settle(path)


class JdbFailed(Exception):
    pass


def shake_once(rig: Rig, path: str, fig: RoundFigures | None) -> None:
    """Connect, handshake, close; timed into ``fig`` (None: warm-up). On a and b, ddmd's log
    says when the socket was handed to the VM and when its handshake was answered."""
    port = rig.port(path)
    found: list[tuple[float, float, str]] = []

    def shake() -> None:
        wall = time.time()
        t0 = time.perf_counter()
        client = Jdwp(port)
        took = (time.perf_counter() - t0) * 1000
        peer = "{}:{}".format(*client.sock.getsockname()[:2])
        client.close()
        found.append((wall, took, peer))

    if fig is None:
        retried(rig, path, fig, shake)
        rig.settle(path)
        return
    retried(rig, path, fig, lambda: timed_cpu(rig, fig, "shake", shake, grace=GRACE))
    rig.settle(path)
    wall, took, peer = found[-1]
    fig.handshake_ms.append(took)
    if rig.ddmd is not None:
        times = rig.ddmd_times(wall, peer)
        if "front.forward_connected" in times:
            fig.handed_ms.append((times["front.forward_connected"] - wall) * 1000)
        if "debugger.attached" in times:
            fig.answered_ms.append((times["debugger.attached"] - wall) * 1000)


def session(rig: Rig, path: str, fig: RoundFigures | None, trips: int, mixes: int) -> None:
    """One raw JDWP session: a short untimed warm-up, then ``trips`` Name round trips and
    ``mixes`` mix iterations, timed into ``fig`` (None: all untimed); Dispose, close."""
    client = connect(rig.port(path))
    try:
        client.id_sizes()
        main = client.find_main()
        name = (11, 1, main)
        for _ in range(50):
            client.command(*name)
        mix_once(client, main)
        if fig is None:
            for _ in range(trips):
                client.command(*name)
            for _ in range(mixes):
                mix_once(client, main)
        else:
            samples, mix_samples = fig.trip_us, fig.mix_ms

            def run_trips() -> None:
                clock = time.perf_counter_ns
                for _ in range(trips):
                    t0 = clock()
                    client.command(*name)
                    samples.append((clock() - t0) / 1000)

            def run_mix() -> None:
                for _ in range(mixes):
                    t0 = time.perf_counter()
                    fig.commands_per_mix = mix_once(client, main)
                    mix_samples.append((time.perf_counter() - t0) * 1000)

            timed_cpu(rig, fig, "trip", run_trips)
            timed_cpu(rig, fig, "mix", run_mix)
        client.command(1, 6)  # VirtualMachine.Dispose, as a debugger leaving
    finally:
        client.close()
    rig.settle(path)


def attach_once(rig: Rig, path: str, fig: RoundFigures) -> None:
    """One timed jdb attach; on a and b, split at ddmd's debugger.attached."""
    port = rig.port(path)
    started: list[float] = []

    def attach() -> None:
        started.append(time.time())
        try:
            took = jdb_attach_ms(port)
        except RuntimeError as exc:
            if "before its prompt" in str(exc):  # jdb: handshake failed (dropped), exit 1
                raise JdbFailed(str(exc)) from exc
            raise
        fig.attach_ms.append(took)

    retried(rig, path, fig, lambda: timed_cpu(rig, fig, "attach", attach, grace=GRACE))
    rig.settle(path)
    if rig.ddmd is not None:
        times = rig.ddmd_times(started[-1])
        if "debugger.attached" in times:
            answered = (times["debugger.attached"] - started[-1]) * 1000
            fig.jdb_answered_ms.append(answered)
            fig.jdb_rest_ms.append(fig.attach_ms[-1] - answered)


def halves(n: int) -> tuple[int, int]:
    return (n + 1) // 2, n // 2


def block(
    rig: Rig,
    paths: Sequence[str],
    figs: dict[str, RoundFigures],
    half: int,
    args: argparse.Namespace,
) -> None:
    """Half a round's samples of ``paths``: a FRESH ddmd for ("front", "vm-port"), ddmd
    stopped for ("adb-fwd",). With two paths every kind of sample alternates between them
    A B B A A B ..., so that both are measured at the same moments."""
    rig.stop_ddmd()
    if paths != ("adb-fwd",):
        rig.start_ddmd()

    for path in paths:  # warm-up, untimed
        shake_once(rig, path, None)
        session(rig, path, None, max(10, args.trips // 20), 3)
    for path in alternating(paths, halves(args.handshakes)[half]):
        shake_once(rig, path, figs[path])
    sessions = SESSIONS // 2
    trips, mixes = -(-args.trips // SESSIONS), -(-args.mix // SESSIONS)
    for path in alternating(paths, sessions):
        session(rig, path, figs[path], trips, mixes)
    for path in alternating(paths, halves(args.attaches)[half]):
        attach_once(rig, path, figs[path])


def measure_round(
    rig: Rig, r: int, args: argparse.Namespace
) -> tuple[str, dict[str, RoundFigures]]:
    """One round: two halves, each a block of a and b (one fresh ddmd, the two alternating)
    and a block of c (ddmd stopped); c first in odd rounds, and a or b first in turn."""
    figs = {path: RoundFigures() for path in PATHS}
    done = []
    for half in (0, 1):
        ab = ("front", "vm-port") if (r + half) % 2 == 0 else ("vm-port", "front")
        order: list[tuple[str, ...]] = [ab, ("adb-fwd",)]
        if r % 2:
            order.reverse()
        for paths in order:
            block(rig, paths, figs, half, args)
            done.append("/".join(SHORT[p] for p in paths))
    return " ".join(done), figs


@dataclass
class Lookup:
    """The front's per-connection peer lookup, timed in this process."""

    whole_ms: list[float] = field(default_factory=list)  # peer_process, as the front calls it
    table_ms: list[float] = field(default_factory=list)  # the socket table (/proc/net/tcp*)
    scan_ms: list[float] = field(default_factory=list)  # the fd tables, up to the peer's
    processes: int = 0  # processes whose fd table is read before the peer's (and the peer's)
    fds: int = 0  # fd links read (readlink) on the way
    sockets: int = 0  # rows of /proc/net/tcp and tcp6 (TIME_WAIT ones too) at the end


def lookup_ms(count: int) -> Lookup:
    """The front's per-connection peer-process lookup (``ddmd.toolnames.peer_process``, before
    ``ddmd.front.tools``) on ``count`` loopback connections whose other end is a NEW process
    (as jdb is when it attaches: the newest pid, so its fd table comes last in the scan):
    whole (a trio worker thread, as the front runs it), and its two parts called directly."""
    import importlib

    import trio

    from ddmd.host import localproc

    try:  # where it lives moves with refactors: ddmd/toolnames.py, before ddmd/front/tools.py
        tools = importlib.import_module("ddmd.toolnames")
    except ImportError:
        tools = importlib.import_module("ddmd.front.tools")
    peer_process = tools.peer_process
    result = Lookup()

    def parts(ours: tuple[str, int], peer: tuple[str, int], pid: int) -> None:
        t0 = time.perf_counter()
        owner = localproc.connected_socket(peer, ours)
        t1 = time.perf_counter()
        assert owner is not None
        found = localproc.process_of_inode(owner.inode, uid=owner.uid)
        t2 = time.perf_counter()
        assert found == pid, (found, pid)
        result.table_ms.append((t1 - t0) * 1000)
        result.scan_ms.append((t2 - t1) * 1000)
        # What that scan read (untimed): the same order as process_of_inode's.
        pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
        pids.sort(key=lambda p: localproc._owner("/proc", p) != owner.uid)
        result.processes = result.fds = 0
        for p in pids:
            with contextlib.suppress(OSError):
                result.fds += len(os.listdir(f"/proc/{p}/fd"))
            result.processes += 1
            if p == pid:
                break

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host=HOST)
        port = listeners[0].socket.getsockname()[1]
        code = (
            "import socket, sys\n"
            f"s = [socket.create_connection(('{HOST}', {port})) for _ in range({count})]\n"
            "print('ok', flush=True)\n"
            "sys.stdin.read()\n"
        )
        async with listeners[0]:
            child = await trio.lowlevel.open_process(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            try:
                streams = [await listeners[0].accept() for _ in range(count)]
                assert child.stdout is not None
                await child.stdout.receive_some(16)
                for stream in streams:
                    t0 = time.perf_counter()
                    found = await peer_process(stream)
                    result.whole_ms.append((time.perf_counter() - t0) * 1000)
                    assert found is not None
                    assert found.pid == child.pid, (found, child.pid)
                    ours = stream.socket.getsockname()
                    peer = stream.socket.getpeername()
                    parts((ours[0], ours[1]), (peer[0], peer[1]), child.pid)
                for stream in streams:
                    await stream.aclose()
            finally:
                child.kill()
                await child.wait()

    trio.run(main)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as rows:
            result.sockets += sum(1 for _ in rows) - 1
    return result


# --------------------------------------------------------------------------------------------
# Report


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def report(rounds: list[dict[str, RoundFigures]], args: argparse.Namespace) -> list[str]:
    def per_round(path: str, metric: str) -> list[float]:
        return [med(getattr(r[path], metric)) for r in rounds]

    metrics = [
        ("attach_ms", "jdb attach, ms", ".0f", True),
        ("trip_us", "round trip, µs", ".1f", True),
        ("handshake_ms", "handshake, ms", ".2f", False),
        ("mix_ms", "mix, ms", ".2f", False),
    ]
    out = [
        "",
        f"Per path: median over {len(rounds)} rounds of each round's median (min-max over rounds)",
        f"{'path':<26}" + "".join(f"{title:>24}" for _, title, _, _ in metrics),
    ]
    for path in PATHS:
        row = "".join(f"{span(per_round(path, m), fmt):>24}" for m, _, fmt, _ in metrics)
        out.append(f"{TITLES[path]:<26}{row}")
    commands = {r[p].commands_per_mix for r in rounds for p in PATHS}
    first = rounds[0]["front"]
    out.append(
        f"(per path and round: {len(first.attach_ms)} jdb attaches, {len(first.handshake_ms)} "
        f"handshakes, {len(first.trip_us)} ThreadReference.Name round trips and "
        f"{len(first.mix_ms)} mix iterations of {'/'.join(map(str, sorted(commands)))} commands "
        f"in {SESSIONS} sessions)"
    )
    retries = {p: sum(r[p].retries for r in rounds) for p in PATHS}
    if any(retries.values()):
        out.append(
            "(samples taken again, the connection dropped before its handshake, all rounds: "
            + ", ".join(f"{SHORT[p]} {n}" for p, n in retries.items())
            + ")"
        )

    out += [
        "",
        "Ratios: median of the per-round paired ratios (min-max over rounds)",
        f"{'figure':<17}{'front / per-VM port':>28}{'front / adb forward':>22}"
        f"{'per-VM port / adb forward':>28}",
    ]
    verdicts = []
    for metric, title, _, target in metrics:
        a, b, c = (per_round(p, metric) for p in PATHS)
        fb, fc, bc = ratios(a, b), ratios(a, c), ratios(b, c)
        verdict = by_median(fb, TARGET)
        label = verdict if target else f"({verdict})"
        out.append(
            f"{title.split(',')[0]:<17}{span(fb, '.3f'):>22} {label:<6}{span(fc, '.3f'):>21}"
            f"{span(bc, '.3f'):>28}"
        )
        if target:
            verdicts.append(f"{title.split(',')[0]} {verdict}")
    out.append(
        f"Target: front within {round((TARGET - 1) * 100)} % of the per-VM port (median paired "
        f"ratio <= {TARGET:.2f}) on jdb attach and round trip: {', '.join(verdicts)}. "
        "PASS* = the median passes, some round did not; verdicts in brackets are information."
    )

    out += [
        "",
        "CPU (schedstat, process trees), median over rounds (min-max): per round trip µs, per mix "
        "iteration, per jdb attach and per handshake ms",
        f"{'path':<26}{'':<10}{'per round trip':>22}{'per mix':>22}{'per jdb attach':>22}"
        f"{'per handshake':>22}",
    ]
    parts = (  # CPU part, the samples it is divided by, scale, format
        ("trip", "trip_us", 1e6, ".1f"),
        ("mix", "mix_ms", 1e3, ".2f"),
        ("attach", "attach_ms", 1e3, ".1f"),
        ("shake", "handshake_ms", 1e3, ".2f"),
    )

    def cpu_of(path: str, label: str, part: str, samples: str, scale: float) -> list[float] | None:
        values = [(r[path].cpu[part].get(label), len(getattr(r[path], samples))) for r in rounds]
        if any(v is None or not n for v, n in values):
            return None
        return [float(v or 0.0) * scale / n for v, n in values]

    for path in PATHS:
        for label in ("ddmd", "adb side"):
            cells = []
            for part, samples, scale, fmt in parts:
                cpu = cpu_of(path, label, part, samples, scale)
                cells.append(f"{'-':>22}" if cpu is None else f"{span(cpu, fmt):>22}")
            name = TITLES[path] if label == "ddmd" else ""
            out.append(f"{name:<26}{label:<10}{''.join(cells)}")
    cells = []
    for part, samples, scale, _ in parts:
        mine = cpu_of("front", "ddmd", part, samples, scale)
        theirs = cpu_of("vm-port", "ddmd", part, samples, scale)
        if mine and theirs and all(theirs):
            cells.append(f"{span(ratios(mine, theirs), '.3f'):>22}")
        else:
            cells.append(f"{'-':>22}")
    out.append(f"{'ddmd CPU, front / per-VM':<36}{''.join(cells)}")
    out.append(
        "(adb side = the real adb server + the fake device: on every path, since ddmd's own VM "
        "connection goes through them too; ddmd is not running on path c)"
    )

    def round_medians(path: str, metric: str) -> list[float]:
        return [med(getattr(r[path], metric)) for r in rounds if getattr(r[path], metric)]

    handed = round_medians("front", "handed_ms")
    answered = {p: round_medians(p, "answered_ms") for p in ("front", "vm-port")}
    if handed and all(answered.values()):
        shake = {p: per_round(p, "handshake_ms") for p in PATHS}
        extra = [x - y for x, y in zip(shake["front"], shake["vm-port"], strict=True)]
        attach_extra = [
            x - y
            for x, y in zip(
                per_round("front", "attach_ms"), per_round("vm-port", "attach_ms"), strict=True
            )
        ]
        out += [
            "",
            "Connection set-up, ms from the client's connect() (ddmd's log times), median over "
            "rounds (min-max)",
            f"  a. front forward: handed to the VM after the peer lookup {span(handed, '.2f')}, "
            f"handshake answered {span(answered['front'], '.2f')}, echo received "
            f"{span(shake['front'], '.2f')}",
            f"  b. per-VM port:   handshake answered {span(answered['vm-port'], '.2f')}, echo "
            f"received {span(shake['vm-port'], '.2f')}",
            f"  c. adb forward:   echo received {span(shake['adb-fwd'], '.2f')}",
            f"  front - per-VM port, per round: handshake {span(extra, '+.2f')} ms; jdb attach "
            f"{span(attach_extra, '+.0f')} ms",
        ]
    jdb_answered = {p: round_medians(p, "jdb_answered_ms") for p in ("front", "vm-port")}
    if all(len(v) == len(rounds) for v in jdb_answered.values()):
        rest = {p: round_medians(p, "jdb_rest_ms") for p in jdb_answered}
        to_shake = [
            x - y for x, y in zip(jdb_answered["front"], jdb_answered["vm-port"], strict=True)
        ]
        after = [x - y for x, y in zip(rest["front"], rest["vm-port"], strict=True)]
        out += [
            "jdb attach split at ddmd's debugger.attached (jdb start -> its handshake answered | "
            "the rest, to the prompt), ms, median over rounds (min-max):",
            f"  a. front forward {span(jdb_answered['front'], '.1f')} | "
            f"{span(rest['front'], '.1f')}",
            f"  b. per-VM port   {span(jdb_answered['vm-port'], '.1f')} | "
            f"{span(rest['vm-port'], '.1f')}",
            f"  front - per-VM port, per round: {span(to_shake, '+.1f')} | {span(after, '+.1f')}",
        ]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the order rotated")
    parser.add_argument("--trips", type=int, default=3000, help="timed round trips per path+round")
    parser.add_argument("--mix", type=int, default=150, help="timed mix iterations per path+round")
    parser.add_argument("--attaches", type=int, default=15, help="jdb attaches per path+round")
    parser.add_argument(
        "--ref",
        help="run ddmd from a snapshot of this git revision (e.g. HEAD), not the working tree",
    )
    parser.add_argument("--handshakes", type=int, default=20, help="handshakes per path+round")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        print("front: fewer than 3 rounds: the ratios are rough", file=sys.stderr)
    if min(args.rounds, args.trips, args.mix, args.attaches, args.handshakes) < 1:
        parser.error("every count must be at least 1")
    missing = [t for t in ("java", "javac", "jdb", "adb") if shutil.which(t) is None]
    if missing:
        print(f"front: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    adb_version = subprocess.run(["adb", "version"], capture_output=True, text=True).stdout
    match = re.search(r"Version (\S+)", adb_version)
    print(
        f"front: JDK {java_version()}, adb {match.group(1) if match else '?'}, "
        f"{os.cpu_count()} CPUs; {args.rounds} rounds of a/b alternating and c, rotated",
        flush=True,
    )
    started = time.monotonic()
    children = Children()
    rounds: list[dict[str, RoundFigures]] = []
    with tempfile.TemporaryDirectory(prefix="bench-front-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        for name in ADB_ENV:  # every child: this HOME (adb's keys), no adb port variables
            os.environ.pop(name, None)
        os.environ["HOME"] = str(home)
        tree = use_tree(args.ref, work, "front", here=True)
        ports = Ports()
        rig: Rig | None = None
        stops: list[Callable[[], object]] = []
        try:
            print(f"ddmd: {tree}", flush=True)
            rig = make_rig(work, children, ports, stops)
            print(
                f"JVM pid {rig.pid} on :{rig.jvm_port}; adb server :{rig.adb.port}, device "
                f"{rig.serial}; ddmd front :{rig.front_port}; adb forward :{rig.adb_forward}",
                flush=True,
            )
            for r in range(args.rounds):
                order, figures = measure_round(rig, r, args)
                rounds.append(figures)
                summary = ", ".join(
                    f"{SHORT[p]} attach {med(figures[p].attach_ms):.0f} ms rt "
                    f"{med(figures[p].trip_us):.0f} µs"
                    for p in PATHS
                )
                print(f"round {r + 1}/{args.rounds} [{order}]: {summary}", flush=True)
            rig.stop_ddmd()
            lookups = lookup_ms(LOOKUPS)
        finally:
            if rig is not None:
                with contextlib.suppress(Exception):
                    rig.stop_ddmd()
            children.stop_all()
            for stop in stops:
                with contextlib.suppress(Exception):
                    stop()
    lines = report(rounds, args)
    lines += [
        "",
        "The front's extra step per connection, timed here (ddmd's peer-process lookup, "
        f"{LOOKUPS} connections from a new process), ms, median (min-max): whole "
        f"{span(lookups.whole_ms, '.2f')} (in a worker thread, as ddmd runs it); its parts "
        f"called directly: socket table {span(lookups.table_ms, '.2f')} ({lookups.sockets} "
        f"rows in /proc/net/tcp and tcp6), fd tables "
        f"{span(lookups.scan_ms, '.2f')} ({lookups.fds} fd links of {lookups.processes} "
        "processes read until the peer's was found: "
        f"{med(lookups.scan_ms) * 1000 / max(1, lookups.fds):.2f} µs each)",
        f"ddmd was started {rig.starts if rig else 0} times (a fresh process for each block "
        "of a and b).",
    ]
    print_report(lines, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
