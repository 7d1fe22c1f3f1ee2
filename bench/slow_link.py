"""Slow link: a debugger's session over a link with a round-trip time, direct and through ddmd.

Run: ``.venv/bin/python bench/slow_link.py [--quick] [--rtt 0,5,20,50] [--rounds 3]
[--steps 5] [--skip-adb] [--skip-jdb] [--keep DIR]``

Everything runs as separate processes on 127.0.0.1. A delay line (``rig/delay.py``) holds every
chunk for RTT/2 in each direction and logs each JDWP command that crosses it; it sits at the
same place on both paths of a pair, right in front of the VM:

- scan pair: direct = client -> delay -> JVM A; ddmd = client -> ddmd's per-VM port -> delay
  -> JVM B (ddmd scans only the delay line's port, never the JVM's own);
- adb pair (the wireless-debugging shape): a private real adb server (Debian's ``adb``) adopts
  ddmd's fake device (``ddmd.sim.adbd``) through a delay line (``adb connect`` to the delay
  line's port, so the server-to-device transport is the slow link) and the device relays
  ``jdwp:PID`` to a HotSpot JVM. direct = ``adb forward tcp:0 jdwp:PID`` + the client; ddmd =
  client -> ddmd's per-VM port -> ddmd's ``jdwp:PID`` stream through its own server. Each
  side of this pair has its own server, device, delay line and JVM (a HotSpot JVM takes one
  debugger, and ddmd opens every pid its server lists), built alike.

Clients, each a new process per session:

- the IDE-like JDI client ``java/IdeClient.java`` (target ``java/SlowTarget.java``, 10
  threads): attach, breakpoint (suspend all) at the line marked BREAKPOINT, the stop shown as
  an IDE shows it, ``--steps`` steps over, each shown, dispose; run twice on the same VM (first
  and second session). Its phases (wall clock): attach, bp (breakpoint set until its event
  arrives), stop (event to stop shown), step (step request to stop shown), detach (dispose);
- jdb: ``jdb -attach``, ``stop at``, wait for the hit, ``where``, ``locals``, ``step`` x3,
  ``quit``, through pipes, each wait bounded; timed from start to exit.

A stop's time runs from the event's arrival at the client (it crossed half the link before) to
the stop shown; a step's from the step request to the new stop shown (ER.Set, VM.Resume, the
event, ER.Clear, then the stop). jdb's session includes jdb's own start-up (about 0.4 s). A new
connection over the link costs its TCP handshake (the delay line holds the first bytes one
RTT) and the JDWP handshake: the direct paths pay both on every attach; through ddmd the
client's connection ends at ddmd, which answers the handshake, and ddmd's own reconnection after
a session (its release) crosses the link instead.

A round measures, for every RTT in turn (a fresh ddmd each time, so the first session is
ddmd's first on that VM connection): IDE first session, IDE second session, jdb, each on every
path, the paths' order reversed every other round. Round trips over the link: the commands the
delay line logged in each phase's window (on ddmd's paths ddmd's own commands count too;
"release" is what crossed after the client's dispose returned, until ddmd shows the VM free;
"ddmd's own" what crossed between sessions). CPU: ddmd's whole process tree (schedstat) per
session. Figures are medians over rounds (min-max); a ratio is the median of the per-round
paired ratios ddmd / direct. Targets (from the issue) get PASS/MISS only when every round
agrees. The views (threads, frames, locations, values) of the two paths of a pair are
compared: "same view".
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rig import HOST, JAVA_DIR, jvm, proc
from rig.adb import AdbServer
from rig.children import Child, Children
from rig.daemon import Scanning, start_scanning
from rig.delay import DelayLine, Taken
from rig.ports import Ports
from rig.rounds import agreed, print_report, span

TARGET_CLASS = "SlowTarget$Model"
WAIT = 30.0  # seconds for anything to start or settle
SESSION_TIMEOUT = 240.0  # one client session, at the largest RTT
JDB_WAIT = 60.0  # one jdb command's answer
SETTLE = 0.3  # after a session, before the next: the JVM listens again

#: (RTT, what, target): the issue's targets (ratios ddmd / direct, or seconds through ddmd)
TARGETS = {
    20: [
        ("ide1", "IDE session, first attach: ddmd / direct", 0.30),
        ("ide2", "IDE session, second attach: ddmd / direct", 0.25),
        ("step", "IDE step through ddmd (s)", 0.15),
        ("stop", "IDE breakpoint stop through ddmd (s)", 0.35),
        ("jdb", "jdb session: ddmd / direct", 0.65),
    ],
    0: [
        ("ide1", "IDE session, first attach: ddmd / direct", 1.0),
        ("ide2", "IDE session, second attach: ddmd / direct", 1.0),
        ("jdb", "jdb session: ddmd / direct", 1.0),
    ],
}


# --------------------------------------------------------------------------------------------
# One session


@dataclass
class Run:
    """One client session on one path: its phases (name -> (start, end), wall clock s), what
    crossed the link in each phase, ddmd's CPU and the view file."""

    seconds: float
    phases: dict[str, tuple[float, float]]
    trips: dict[str, int] = field(default_factory=dict)
    connects: dict[str, int] = field(default_factory=dict)
    adb: dict[str, int] = field(default_factory=dict)  # adb messages over the link, by kind
    cpu_ms: float | None = None
    view: str = ""

    def phase(self, name: str) -> float:
        start, end = self.phases[name]
        return end - start

    def steps(self) -> list[float]:
        return [self.phase(p) for p in self.phases if p.startswith("step")]

    def step_trips(self) -> list[int]:
        return [n for p, n in self.trips.items() if p.startswith("step")]


def attribute(run: Run, taken: Taken) -> None:
    """Each logged command to the phase whose window holds it: a phase runs to the next one's
    start; after the last, "release"; before the first, "before"."""
    bounds = sorted(run.phases.items(), key=lambda kv: kv[1][0])
    edges = [float("-inf"), *(b[1][0] for b in bounds), bounds[-1][1][1], float("inf")]
    names = ["before", *(b[0] for b in bounds), "release"]
    for i, name in enumerate(names):
        run.trips[name] = taken.between(edges[i], edges[i + 1])
        run.connects[name] = taken.connections(edges[i], edges[i + 1])
    run.adb = taken.adb


def ide_session(classes: Path, port: int, line: int, steps: int, view: Path) -> Run:
    argv = ["java", "-cp", str(classes), "IdeClient", HOST, str(port), TARGET_CLASS]
    done = subprocess.run(
        [*argv, str(line), str(steps), str(view)],
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    phases: dict[str, tuple[float, float]] = {}
    session = None
    for out in done.stdout.splitlines():
        words = out.split()
        if words[:1] == ["PHASE"]:
            phases[words[1]] = (int(words[2]) / 1e6, int(words[3]) / 1e6)
        elif words[:1] == ["SESSION"]:
            session = (int(words[1]) / 1e6, int(words[2]) / 1e6)
    if done.returncode or session is None:
        tail = (done.stdout + done.stderr)[-800:]
        raise RuntimeError(f"IdeClient on :{port} failed ({done.returncode}): {tail}")
    return Run(session[1] - session[0], phases, view=view.read_text(encoding="utf-8"))


class Jdb:
    """``jdb -attach`` driven through pipes; every wait bounded."""

    PROMPT = r"\n?main\[1\] $"

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            ["jdb", "-attach", f"{HOST}:{port}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.out = ""
        self.mark = 0

    def wait(self, pattern: str, timeout: float = JDB_WAIT) -> None:
        """Until the output since the last command matches ``pattern``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while not regex.search(self.out, self.mark):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"jdb: no {pattern!r} in {timeout:g} s: {self.out[-400:]!r}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 65536)
                if not data:
                    raise RuntimeError(f"jdb exited: {self.out[-400:]!r}")
                self.out += data.decode(errors="replace")

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.mark = len(self.out)
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def jdb_session(port: int, line: int) -> Run:
    """attach, stop at, the hit, where, locals, step x3, quit: phases and the whole."""
    phases: dict[str, tuple[float, float]] = {}
    t0 = t = time.time()
    jdb = Jdb(port)
    try:
        jdb.wait(r"Initializing jdb[\s\S]*\n> ")
        phases["attach"] = (t, t := time.time())
        jdb.send(f"stop at {TARGET_CLASS}:{line}")
        jdb.wait(r"Breakpoint hit:[\s\S]*" + Jdb.PROMPT)
        phases["bp"] = (t, t := time.time())
        jdb.send("where")
        jdb.wait(Jdb.PROMPT)
        jdb.send("locals")
        jdb.wait(Jdb.PROMPT)
        phases["stop"] = (t, t := time.time())
        for i in range(3):
            jdb.send("step")
            jdb.wait(r"Step completed:[\s\S]*" + Jdb.PROMPT)
            phases[f"step{i + 1}"] = (t, t := time.time())
        jdb.send("quit")
        jdb.proc.wait(JDB_WAIT)
        phases["detach"] = (t, t := time.time())
    finally:
        jdb.close()
    return Run(t - t0, phases, view=jdb.out)


# --------------------------------------------------------------------------------------------
# The paths


@dataclass
class Path_:
    """One path: where the client connects, the delay line in front of its VM, and the ddmd
    whose CPU and VM state count (None: direct)."""

    name: str
    port: Callable[[], int]
    line: DelayLine
    ddmd: Callable[[], Scanning | None]
    vm_id: Callable[[], str | None]

    def released(self) -> int:
        """How many times ddmd released this path's VM so far (0 direct)."""
        ddmd, vm_id = self.ddmd(), self.vm_id()
        if ddmd is None:
            return 0
        return sum(e.get("vm") == vm_id for e in ddmd.daemon.events("vm.released"))

    def settle(self, released: int | None = None) -> None:
        """After a session: ddmd released the VM (more than ``released`` times so far: it
        reopens its VM connection after a debugger leaves) and shows it free, or a pause."""
        ddmd, vm_id = self.ddmd(), self.vm_id()
        if ddmd is not None and vm_id is not None:
            deadline = time.monotonic() + WAIT
            while released is not None and self.released() <= released:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ddmd did not release {vm_id} within {WAIT:g} s")
                time.sleep(0.05)
            ddmd.daemon.wait_vm(
                vm_id, lambda vm: vm["state"] == "ready" and not vm.get("debuggers"), timeout=WAIT
            )
        time.sleep(SETTLE + self.line.rtt_ms / 1000)


def view_lines(run: Run, client: str) -> str:
    """What a session saw. jdb: the event locations, frames and locals in order, without its
    prompts (its event thread and command thread print at once, so lines can interleave)."""
    if client != "jdb":
        return run.view
    text = re.sub(r"(main\[1\]|>) ", "", run.view)
    facts = re.findall(
        r'"thread=[^"]*", [\w$.]+\(\), line=\d+ bci=\d+|\[\d+\] [\w$.]+ \([^)]*\)|^\s*\w+ = .*$',
        text,
        re.M,
    )
    return "\n".join(f.strip() for f in facts)


def measure(path: Path_, client: str, work: Path, line: int, steps: int) -> Run:
    path.line.take()  # clears: what crossed before this session is ddmd's own
    ddmd = path.ddmd()
    before = proc.schedstat(ddmd.child.pid) if ddmd is not None else None
    released = path.released()
    view = work / f"view-{path.name.replace(' ', '-')}-{client}.txt"
    if client == "jdb":
        run = jdb_session(path.port(), line)
        view.write_text(run.view, encoding="utf-8")
    else:
        run = ide_session(work / "classes", path.port(), line, steps, view)
    path.settle(released)
    if ddmd is not None and before is not None:
        run.cpu_ms = proc.spent(before, proc.schedstat(ddmd.child.pid)) / 1e6
    taken = path.line.take()
    attribute(run, taken)
    if TIMELINE is not None:
        write_timeline(TIMELINE, f"{path.name} {client}", run, taken)
    return run


TIMELINE: Path | None = None  # --timeline
SPECULATE = "auto"  # --speculate: ddmd's [debugger] speculate


def write_timeline(out: Path, title: str, run: Run, taken: Taken) -> None:
    """Appends one session's timeline: each command that crossed the link, in ms from the start
    of the phase it fell in (the critical path of a stop shows as its gaps of one RTT)."""
    starts = sorted((start, name) for name, (start, _) in run.phases.items())
    lines = [f"# {title} ({run.seconds:.3f} s)"]
    for t, cs, cmd in taken.commands:
        before = [(s, n) for s, n in starts if s <= t]
        start, name = before[-1] if before else (starts[0][0], "before")
        what = "connect" if cs == 0 else f"{cs}/{cmd}"
        lines.append(f"{name:8} {1000 * (t - start):8.1f} ms  {what}")
    with out.open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------------
# The rig


@dataclass
class Rig:
    children: Children
    ports: Ports
    work: Path
    classes: Path
    pairs: dict[str, tuple[Path_, Path_]] = field(default_factory=dict)
    lines: list[DelayLine] = field(default_factory=list)
    servers: list[AdbServer] = field(default_factory=list)
    ddmd: Scanning | None = None
    scan_port: int = 0
    adb_vm: tuple[int, str, int] | None = None  # ddmd's adb server port, serial, pid
    notes: list[str] = field(default_factory=list)

    def jvm(self, name: str) -> tuple[Child, int]:
        port = self.ports.take()
        child = self.children.start(name, jvm.jvm_argv(port, self.classes, "SlowTarget"))
        jvm.wait_agent(child, port, WAIT)
        return child, port

    def delay(self, target: int, rtt: float, *, adb: bool = False) -> DelayLine:
        line = DelayLine(self.children, self.ports.take(), target, rtt, adb=adb)
        self.lines.append(line)
        return line

    def restart_ddmd(self) -> None:
        if self.ddmd is not None:
            self.ddmd.daemon.stop(self.children)
            self.ddmd = None
        self.ddmd = start_scanning(
            self.children,
            self.work,
            "ddmd",
            self.scan_port,
            self.ports,
            adb=self.adb_vm,
            debugger={"speculate": SPECULATE},
        )


def adb_side(rig: Rig, name: str, rtt: float) -> tuple[AdbServer, str, int, DelayLine]:
    """A JVM behind a fake device, adopted by a private adb server through a delay line:
    (server, serial, the JVM's pid, the line)."""
    target, jvm_port = rig.jvm(f"JVM {name}")
    home = rig.work / f"adb-home-{name}"
    home.mkdir()
    server = AdbServer(rig.ports.take(), home)
    rig.servers.append(server)
    server.start()
    device_port = rig.ports.take()
    pid_arg = f"{target.pid}={HOST}:{jvm_port}"
    argv = [sys.executable, "-P", "-m", "ddmd.sim.adbd", "--port", str(device_port)]
    device = rig.children.start(f"fake device {name}", [*argv, "--pid", pid_arg])
    device.wait_match(r"^device \S+ ready", WAIT)
    line = rig.delay(device_port, rtt, adb=True)
    serial = f"{HOST}:{line.port}"
    said = server.run("connect", serial)
    if "connected" not in said:
        raise RuntimeError(f"adb connect {serial}: {said}")
    deadline = time.monotonic() + WAIT
    while f"{serial}\tdevice" not in server.run("devices"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{serial} not online in the adb server on :{server.port}")
        time.sleep(0.1)
    return server, serial, target.pid, line


def build(rig: Rig, rtt: float, adb: bool) -> None:
    _, port_a = rig.jvm("JVM direct")
    _, port_b = rig.jvm("JVM ddmd")
    line_a, line_b = rig.delay(port_a, rtt), rig.delay(port_b, rtt)
    rig.scan_port = line_b.port

    def ddmd() -> Scanning | None:
        return rig.ddmd

    def ddmd_port() -> int:
        assert rig.ddmd is not None
        return rig.ddmd.vm_port

    def ddmd_adb_port() -> int:
        assert rig.ddmd is not None
        assert rig.ddmd.adb_port is not None
        return rig.ddmd.adb_port

    def none() -> None:
        return None

    rig.pairs["scan"] = (
        Path_("direct", lambda: line_a.port, line_a, none, none),
        Path_("ddmd", ddmd_port, line_b, ddmd, lambda: rig.ddmd and rig.ddmd.vm_id),
    )
    if adb:
        server_c, serial_c, pid_c, line_c = adb_side(rig, "adb direct", rtt)
        forward = server_c.forward(serial_c, pid_c)
        server_d, serial_d, pid_d, line_d = adb_side(rig, "adb ddmd", rtt)
        rig.adb_vm = (server_d.port, serial_d, pid_d)
        rig.pairs["adb"] = (
            Path_("adb forward", lambda: forward, line_c, none, none),
            Path_(
                "ddmd via adb",
                ddmd_adb_port,
                line_d,
                ddmd,
                lambda: rig.ddmd and rig.ddmd.adb_vm_id,
            ),
        )
        rig.notes.append(
            f"adb: Debian's adb {server_c.run('version').splitlines()[0].split()[-1]}, "
            f"devices {serial_c} (direct) and {serial_d} (ddmd) = their delay lines' ports"
        )


# --------------------------------------------------------------------------------------------
# Rounds

#: (rtt, round, pair, client, path name) -> Run
Results = dict[tuple[float, int, str, str, str], Run]
CLIENTS = ("ide1", "ide2", "jdb")


def run_rounds(rig: Rig, args: argparse.Namespace, line: int, results: Results) -> None:
    clients = [c for c in CLIENTS if c != "jdb" or not args.skip_jdb]
    for r in range(args.rounds):
        for rtt in args.rtt:
            for each in rig.lines:
                each.set_rtt(rtt)
            t = time.monotonic()
            rig.restart_ddmd()
            ready = time.monotonic() - t
            for pair, (_, b) in rig.pairs.items():  # ddmd's own start: what it asks the VM
                got = b.line.take()
                end = float("inf")
                print(
                    f"DDMD_START rtt={rtt:g} round={r + 1} pair={pair} ready_s={ready:.2f} "
                    f"commands={got.between(0, end)} connects={got.connections(0, end)}",
                    flush=True,
                )
            for each in rig.lines:
                each.take()
            t = time.monotonic()
            for client in clients:
                for pair, paths in rig.pairs.items():
                    for path in paths if r % 2 == 0 else paths[::-1]:
                        try:
                            got = measure(path, client, rig.work, line, args.steps)
                            results[(rtt, r, pair, client, path.name)] = got
                            print(session_line(rtt, r, client, path.name, got), flush=True)
                        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
                            rig.notes.append(
                                f"round {r + 1}, RTT {rtt:g} ms, {path.name}, {client}: "
                                f"FAILED: {str(exc)[:600]}"
                            )
                            with contextlib.suppress(Exception):
                                path.settle()
            print(f"round {r + 1}, RTT {rtt:g} ms: {time.monotonic() - t:.0f} s", flush=True)


# --------------------------------------------------------------------------------------------
# Report


def session_line(rtt: float, r: int, client: str, path: str, run: Run) -> str:
    """One session, machine-readable: seconds per phase, then commands per phase."""
    phases = " ".join(f"{p}={run.phase(p):.3f}" for p in run.phases)
    trips = " ".join(f"{p}={n}" for p, n in run.trips.items())
    cpu = f" ddmd_cpu_ms={run.cpu_ms:.0f}" if run.cpu_ms is not None else ""
    return (
        f"SESSION rtt={rtt:g} round={r + 1} client={client} path={path.replace(' ', '_')} "
        f"s={run.seconds:.3f} {phases} | trips {trips} | connects="
        f"{sum(run.connects.values())}{cpu}"
    )


def report(rig: Rig, args: argparse.Namespace, results: Results) -> list[str]:
    lines = list(rig.notes)
    clients = [c for c in CLIENTS if c != "jdb" or not args.skip_jdb]
    label = {"ide1": "IDE, first session", "ide2": "IDE, second session", "jdb": "jdb session"}
    verdicts: list[str] = []
    for rtt in args.rtt:
        lines.append(f"=== RTT {rtt:g} ms")
        for pair, (a, b) in rig.pairs.items():
            lines.append(f"--- {pair} pair: {a.name} vs {b.name}")
            for client in clients:
                rounds = [
                    (
                        results[(rtt, r, pair, client, a.name)],
                        results[(rtt, r, pair, client, b.name)],
                    )
                    for r in range(args.rounds)
                    if (rtt, r, pair, client, a.name) in results
                    and (rtt, r, pair, client, b.name) in results
                ]
                if not rounds:
                    lines.append(f"  {label[client]}: no complete round")
                    continue
                lines += client_lines(label[client], client, rounds, a.name, b.name)
                for key, what, target in TARGETS.get(int(rtt), []) if rtt == int(rtt) else []:
                    values = target_values(key, client, rounds)
                    if values:
                        if key in ("step", "stop"):
                            what = f"{what}, {label[client]}"
                        verdicts.append(
                            f"  RTT {rtt:g} ms, {pair}: {what} <= {target:g}: "
                            f"{span(values, '.2f')}  -> {agreed(values, target)}"
                        )
    if verdicts:
        lines.append(
            "targets (ratios: median of per-round paired ratios (min-max); seconds: median "
            "(min-max) over rounds; PASS/MISS only when every round agrees):"
        )
        lines += verdicts
    return lines


def target_values(key: str, client: str, rounds: list[tuple[Run, Run]]) -> list[float]:
    if key in ("ide1", "ide2", "jdb") and key == client:
        return [b.seconds / a.seconds for a, b in rounds]
    if key == "step" and client in ("ide1", "ide2"):
        return [statistics.median(b.steps()) for _, b in rounds]
    if key == "stop" and client in ("ide1", "ide2"):
        return [b.phase("stop") for _, b in rounds]
    return []


def client_lines(
    title: str, client: str, rounds: list[tuple[Run, Run]], a: str, b: str
) -> list[str]:
    out = [f"  {title} ({len(rounds)} rounds):"]

    def row(what: str, fa: Callable[[Run], float], fmt: str = ".2f", unit: str = "s") -> None:
        va, vb = [fa(x) for x, _ in rounds], [fa(y) for _, y in rounds]
        ratio = [y / x if x else float("inf") for x, y in zip(va, vb, strict=True)]
        out.append(
            f"    {what:<22}{a} {span(va, fmt)} {unit}, {b} {span(vb, fmt)} {unit}, "
            f"ratio {span(ratio, '.2f')}x"
        )

    def trips(what: str, fa: Callable[[Run], float]) -> None:
        va, vb = [fa(x) for x, _ in rounds], [fa(y) for _, y in rounds]
        out.append(f"    {what:<22}{a} {span(va, '.0f')}, {b} {span(vb, '.0f')}")

    row("session", lambda r: r.seconds)
    for p in ("attach", "bp", "stop"):
        row(p, lambda r, p=p: r.phase(p))
    row("step (median)", lambda r: statistics.median(r.steps()))
    row("detach", lambda r: r.phase("detach"))
    out.append("    round trips over the link (commands crossing it), median (min-max):")
    trips("  session (all)", lambda r: sum(r.trips.values()) - r.trips.get("before", 0))
    for p in ("attach", "bp", "stop"):
        trips(f"  {p}", lambda r, p=p: r.trips.get(p, 0))
    trips("  step (median)", lambda r: statistics.median(r.step_trips()))
    trips("  detach", lambda r: r.trips.get("detach", 0))
    trips("  release (after)", lambda r: r.trips.get("release", 0))
    trips("  ddmd's own (before)", lambda r: r.trips.get("before", 0))
    out.append("    connections opened over the link (each: TCP connect + JDWP handshake):")
    trips("  session", lambda r: sum(r.connects.values()) - r.connects.get("before", 0))
    trips("  release (after)", lambda r: r.connects.get("release", 0))
    if rounds[0][0].adb:
        kinds = sorted({k for x, y in rounds for k in (*x.adb, *y.adb)})
        for k in kinds:
            trips(f"  adb {k}", lambda r, k=k: r.adb.get(k, 0))
    cpu = [y.cpu_ms for _, y in rounds if y.cpu_ms is not None]
    if cpu:
        out.append(f"    ddmd CPU per session (whole tree): {span(cpu, '.0f')} ms")
    same = [view_lines(x, client) == view_lines(y, client) for x, y in rounds]
    out.append(f"    same view: {'yes' if all(same) else 'no'} ({sum(same)} of {len(same)} rounds)")
    return out


# --------------------------------------------------------------------------------------------


def breakpoint_line() -> int:
    source = (JAVA_DIR / "SlowTarget.java").read_text(encoding="utf-8").splitlines()
    return next(i + 1 for i, text in enumerate(source) if "// BREAKPOINT" in text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: RTT 20 ms, one round")
    parser.add_argument("--rtt", help="round-trip times in ms, comma-separated (0,5,20,50)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    parser.add_argument("--steps", type=int, default=5, help="IDE steps per session (5)")
    parser.add_argument("--skip-adb", action="store_true", help="only the scan pair")
    parser.add_argument("--skip-jdb", action="store_true", help="only the IDE client")
    parser.add_argument("--keep", type=Path, help="copy the work dir (views, ddmd logs) here")
    parser.add_argument(
        "--speculate",
        choices=("auto", "on", "off"),
        default="auto",
        help="ddmd's [debugger] speculate (auto: the default config)",
    )
    parser.add_argument(
        "--timeline",
        type=Path,
        help="write each session's link commands (ms into each phase, set/command) to this file",
    )
    args = parser.parse_args(argv)
    global TIMELINE, SPECULATE
    TIMELINE, SPECULATE = args.timeline, args.speculate
    args.rtt = [float(x) for x in (args.rtt or ("20" if args.quick else "0,5,20,50")).split(",")]
    args.rounds = args.rounds or (1 if args.quick else 3)
    missing = [
        t
        for t in ("java", "javac", "jdb", *([] if args.skip_adb else ["adb"]))
        if not shutil.which(t)
    ]
    if missing:
        print(f"slow_link: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleans up as Ctrl-C does
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    started = time.monotonic()
    line = breakpoint_line()
    print(
        f"slow_link: JDK {jvm.java_version()}, {os.cpu_count()} CPUs (shared: figures are "
        f"noisy); RTT {', '.join(f'{r:g}' for r in args.rtt)} ms; {args.rounds} round(s); "
        f"IDE client: breakpoint at {TARGET_CLASS}:{line}, {args.steps} steps, two sessions; "
        f"ddmd speculate = {args.speculate}" + (" [--quick: rough figures]" if args.quick else ""),
        flush=True,
    )
    results: Results = {}
    children = Children()
    with tempfile.TemporaryDirectory(prefix="slow-link-") as tmp:
        work = Path(tmp)
        classes = work / "classes"
        jvm.compile_java(classes, ["SlowTarget.java", "IdeClient.java"], debug=True)
        rig = Rig(children, Ports(), work, classes)
        try:
            build(rig, args.rtt[0], not args.skip_adb)
            run_rounds(rig, args, line, results)
        finally:
            children.stop_all()
            for server in rig.servers:
                server.kill()
            if args.keep is not None:
                shutil.copytree(work, args.keep, dirs_exist_ok=True)
        print_report(report(rig, args, results), started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
