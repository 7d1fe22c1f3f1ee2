"""Plain JVMs' thread lists (issue 20): the CPU that polling 20 JVMs of 50 threads each at 2 Hz
costs, ddmd's and the JVMs' own, against the same set-up without polling.

Run: ``.venv/bin/python bench/jvm_threads.py [--rounds 3] [--seconds 20] [--jvms 20]``
(about 3 minutes with the defaults). Needs ``java`` and ``javac`` (OpenJDK 17 here).

Set-up, every piece its own process on 127.0.0.1:

- ``--jvms`` JVMs (default 20), each ``java -agentlib:jdwp=transport=dt_socket,server=y,
  suspend=n,address=127.0.0.1:PORT -cp ... IdleThreads`` on consecutive free ports, JVM flags
  left at their defaults (G1, ergonomic heap; ``--jvm-opt`` adds one). ``bench/java/
  IdleThreads.java`` (compiled into a temp dir at start) is an idle app with 50 threads of its
  own: an event loop waking every 20 ms, 10 sleepers, 10 timed pollers, 10 pool workers, 15
  threads in Object.wait(), a lock holder and 3 threads blocked on its monitor (JDWP statuses
  sleeping, wait and monitor). With main and the JVM's own Java threads (Reference Handler,
  Finalizer, Signal Dispatcher, Common-Cleaner, Notification Thread) ddmd lists 56 threads per
  JVM (57 once something started its Attach Listener);
- ``ddmd run --config FILE --log-format json`` (``.venv/bin/ddmd``), scanning exactly the
  JVMs' ports every second, adb off, no adb front, no control socket, debugger and control
  ports free and outside the scan range, two configs that differ only in ``[monitor]``:
  *polling*: ``always_poll_threads = true``, ``thread_poll_interval = 0.5`` (2 Hz for every
  JVM, what a user with ``always_poll_threads`` has, or a page watching every JVM);
  *no polling*: ``always_poll_threads = false`` and nobody watching (ddmd holds every JVM's
  JDWP connection and does nothing on it).

The JVMs start once, for the whole run, and get ``--warmup`` seconds (10) before the first
round. A round measures one window with polling and one without, each with a fresh ddmd (the order
alternates from round to round: polling first in odd rounds). A phase: ddmd started; wait
until the control API lists every JVM identified (``ddm`` false, ``ready``; with polling, also
``--min-threads`` or more threads each, i.e. the first poll came back); ``--settle`` seconds;
the window (``--seconds``), during which this process only sleeps; the checks; ddmd stopped
(SIGTERM) and every JVM's agent listening again before the next phase.

Measured over each window:

- CPU, as % of one core, from ``/proc/PID/task/*/schedstat`` (ns) of every thread of a process
  tree (children through ``/proc/PID/task/*/children``): ddmd's tree, and the JVMs' summed;
  the JVMs' split by thread name: the JDWP agent's threads (``JDWP Transport Listener``,
  ``JDWP Event Helper``, ``JDWP Command Reader``), the runtime's (VM Thread, GC, JIT
  compilers, Service Thread, ...) and the app's (IdleThreads' threads and main). ddmd's
  run-queue wait (schedstat's second field) and the machine's busy time not ours (/proc/stat
  minus ddmd, the JVMs and this process) show a disturbed window;
- the polls that really happened: the bytes each JVM's JDWP socket received in the window
  (``ss -ti``, ``bytes_received`` of the established connection on the JVM's port; ddmd sends
  nothing else to a plain JVM). A poll is AllThreads (11 bytes) and one Status per thread
  (19 bytes with 8-byte object ids), so polls = bytes / (11 + 19 x threads); one JVM's rate is
  exact to +-1 poll per window (+-0.05 Hz over 20 s), the mean over the JVMs much closer;
- with polling, after the window: ``GET /api/v1/vms/ID/threads`` of every JVM, which must list
  ``--min-threads`` or more (the count used above); without polling, ``GET /api/v1/vms``, whose
  ``threads`` must be null for every JVM (never polled; ``/threads`` is not asked: it would
  start polls for a lease of 5 s).

Reported: per phase the figures above; per round the paired figures: the CPU that polling
adds (polling - no polling) for ddmd, the JVMs and both, in % of a core and per poll per thread
(µs: added CPU / (polls x threads listed)), and the ratios polling / no polling; then each as
the median over rounds (min..max). The machine's speed drifts by a third between minutes: one
round is one sample, never a result. Prints figures; asserts nothing.

``--ref REV`` runs ddmd from a ``git archive`` snapshot of REV (e.g. HEAD) instead of the
working tree, which others may be editing during the run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rig import jvm, proc
from rig.children import Child, Children
from rig.daemon import Daemon, Vm, log_problems, scan_config, start_ddmd, use_tree, write_config
from rig.ports import Layout
from rig.proc import Threads
from rig.rounds import span

FIRST_PORT = 21000  # below Linux's ephemeral range (32768-60999)
POLL_INTERVAL = 0.5  # [monitor] thread_poll_interval in the polling phase: 2 Hz
SCAN_INTERVAL = 1.0
WAIT = 90.0  # seconds for one set-up condition (JVMs up, all identified, agents listening)
#: JDWP bytes ddmd sends per poll of a JVM: AllThreads (header only) + Status per thread.
HEADER, OBJECT_ID = 11, 8
JDWP_THREADS = ("JDWP Transport", "JDWP Event Help", "JDWP Command Re")  # comm: 15 chars
APP_THREADS = re.compile(
    r"^(java|event-loop|lock-holder|(sleeper|timer|worker|waiter|blocked)-\d+)$"
)
SPLIT = ("jdwp", "runtime", "app")


def poll_bytes(threads: int) -> int:
    return HEADER + threads * (HEADER + OBJECT_ID)


# --------------------------------------------------------------------------------------------
# CPU of process trees, /proc/PID/task/*/schedstat


def thread_kind(pid: int, tid: int) -> str:
    try:
        comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
    except OSError:
        return "runtime"
    if comm.startswith(JDWP_THREADS):
        return "jdwp"
    return "app" if APP_THREADS.match(comm) else "runtime"


@dataclass
class Snapshot:
    at: float
    ddmd: Threads
    jvms: list[Threads]
    bench: Threads  # this process's own threads
    machine: float
    received: dict[int, dict[int, int]]  # JVM port -> ddmd's peer port -> bytes received


def snapshot(ddmd_pid: int, jvm_pids: Sequence[int], ports: range) -> Snapshot:
    received = jdwp_received(ports)
    snap = Snapshot(
        time.monotonic(),
        proc.schedstat(ddmd_pid),
        [proc.schedstat(p) for p in jvm_pids],
        proc.schedstat(os.getpid(), tree=False),  # its children are ddmd and the JVMs
        proc.machine_ticks()[0] / proc.CLK_TCK,
        received,
    )
    snap.at = (snap.at + time.monotonic()) / 2
    return snap


# --------------------------------------------------------------------------------------------
# Sockets: bytes per connection


_SS_ADDR = re.compile(r"127\.0\.0\.1:(\d+)\s+127\.0\.0\.1:(\d+)")
_SS_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def jdwp_received(ports: range) -> dict[int, dict[int, int]]:
    """Bytes received so far by each established connection on ``ports`` (the JVMs' side of
    ddmd's JDWP connections), from ``ss -tinH``."""
    done = subprocess.run(
        [
            "ss",
            "-tinH",
            "state",
            "established",
            f"( sport >= :{ports.start} and sport <= :{ports.stop - 1} )",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out: dict[int, dict[int, int]] = {}
    current: tuple[int, int] | None = None
    for line in done.stdout.splitlines():
        addr = _SS_ADDR.search(line)
        if addr:
            current = int(addr.group(1)), int(addr.group(2))
            out.setdefault(current[0], {})[current[1]] = 0
            continue
        got = _SS_RECEIVED.search(line)
        if got and current is not None:
            out[current[0]][current[1]] = int(got.group(1))
    return out


# --------------------------------------------------------------------------------------------
# ddmd


# --------------------------------------------------------------------------------------------
# Phases and rounds


@dataclass
class Phase:
    polling: bool
    window: float = 0.0
    ddmd: float = 0.0  # CPU seconds in the window
    ddmd_wait: float = 0.0  # run-queue wait seconds of ddmd's threads
    jvms: float = 0.0
    split: dict[str, float] = field(default_factory=dict)  # jdwp / runtime / app seconds
    bench: float = 0.0
    other: float = 0.0  # the machine's busy seconds not ours
    polls_hz: list[float] = field(default_factory=list)  # per JVM, from its bytes received
    thread_polls_hz: float = 0.0  # Status requests per second, all JVMs
    bytes_hz: float = 0.0  # JDWP bytes per second to the JVMs, all of them
    threads: list[int] = field(default_factory=list)  # per JVM, as ddmd lists them
    null_lists: int = 0  # no-polling phase: JVMs whose thread list is null (never polled)
    received: dict[int, int] = field(default_factory=dict)  # JVM port -> JDWP bytes in
    ready_s: float = 0.0
    rss_mb: float = 0.0
    problems: dict[str, int] = field(default_factory=dict)

    def pct(self, seconds: float) -> float:
        return 100 * seconds / self.window

    @property
    def total(self) -> float:
        return self.ddmd + self.jvms

    @property
    def name(self) -> str:
        return "polling" if self.polling else "no polling"


@dataclass
class Rig:
    args: argparse.Namespace
    work: Path
    jvms: list[Child]
    layout: Layout  # the scan range: the JVMs' ports
    starts: int = 0

    @property
    def ports(self) -> range:
        return self.layout.scan

    @property
    def vm_ids(self) -> list[str]:
        return [f"tcp:{p}" for p in self.ports]

    def config(self, polling: bool) -> Path:
        path = self.work / f"ddmd-{'polling' if polling else 'quiet'}.toml"
        if not path.exists():
            sections = scan_config(self.layout, path.parent / "ddmd-ports.json", SCAN_INTERVAL)
            sections["front"] = {"enabled": False}
            sections["control"]["socket"] = ""
            sections["monitor"] = {
                "thread_poll_interval": POLL_INTERVAL,
                "always_poll_threads": polling,
            }
            write_config(path, sections)
        return path

    def check_jvms(self) -> None:
        for child in self.jvms:
            child.check_alive()

    def wait_listening(self) -> None:
        """Every JVM's agent listens (again: HotSpot's agent goes back to listening when its
        debugger, here ddmd, disconnects)."""
        deadline = time.monotonic() + WAIT
        while missing := set(self.ports) - proc.listening(self.ports):
            self.check_jvms()
            if time.monotonic() > deadline:
                raise TimeoutError(f"JVM agents not listening on {sorted(missing)}")
            time.sleep(0.05)

    def wait_identified(self, ddmd: Daemon, polling: bool) -> None:
        want = set(self.vm_ids)

        def identified(vms: list[Vm]) -> bool | None:
            good: set[str] = set()
            for vm in vms:
                if vm["id"] not in want or vm["ddm"] is not False or vm["state"] != "ready":
                    continue
                if polling and (vm["threads"] or 0) < self.args.min_threads:
                    continue
                good.add(vm["id"])
            return True if good == want else None

        what = f"every JVM identified{' with its threads' if polling else ''}"
        ddmd.wait_vms(identified, what, timeout=WAIT, interval=0.2, alive=self.check_jvms)

    def phase(self, polling: bool, label: str) -> Phase:
        self.starts += 1
        log_path = self.work / f"ddmd-{self.starts}.log"
        out = Phase(polling)
        ddmd = start_ddmd(self.config(polling), log_path, self.layout.control)
        try:
            t0 = time.monotonic()
            self.wait_identified(ddmd, polling)
            out.ready_s = time.monotonic() - t0
            with httpx.Client(base_url=ddmd.base, timeout=10) as api:
                time.sleep(self.args.settle)
                pids = [j.pid for j in self.jvms]
                before = snapshot(ddmd.child.pid, pids, self.ports)
                time.sleep(self.args.seconds)
                after = snapshot(ddmd.child.pid, pids, self.ports)
                ddmd.child.check_alive()
                self.check_jvms()
                self._figures(out, before, after)
                out.rss_mb = proc.status_kb(ddmd.child.pid, "VmRSS") / 1024
                self._check_lists(out, api)
        finally:
            ddmd.stop()
        out.problems = log_problems(log_path)
        self.wait_listening()
        print(f"  {label:<12}  {line(out)}", flush=True)
        return out

    def _figures(self, out: Phase, before: Snapshot, after: Snapshot) -> None:
        out.window = after.at - before.at
        out.ddmd = proc.spent(before.ddmd, after.ddmd) / 1e9
        out.ddmd_wait = proc.spent(before.ddmd, after.ddmd, 1) / 1e9
        out.split = dict.fromkeys(SPLIT, 0.0)
        for b, a in zip(before.jvms, after.jvms, strict=True):
            for (pid, tid), (run, _) in a.items():
                spent = (run - b.get((pid, tid), (0, 0))[0]) / 1e9
                out.split[thread_kind(pid, tid)] += spent
        out.jvms = sum(out.split.values())
        out.bench = proc.spent(before.bench, after.bench) / 1e9
        out.other = max(0.0, after.machine - before.machine - out.ddmd - out.jvms - out.bench)
        for port in self.ports:
            now, then = after.received.get(port, {}), before.received.get(port, {})
            out.received[port] = sum(v - then.get(peer, 0) for peer, v in now.items())
        out.bytes_hz = sum(out.received.values()) / out.window

    def _check_lists(self, out: Phase, api: httpx.Client) -> None:
        if out.polling:
            for vm_id in self.vm_ids:
                body = api.get(f"/api/v1/vms/{vm_id}/threads").json()
                out.threads.append(len(body.get("threads") or ()))
            for port, threads in zip(self.ports, out.threads, strict=True):
                got = out.received[port]
                if threads:
                    out.polls_hz.append(got / poll_bytes(threads) / out.window)
                    out.thread_polls_hz += got * threads / poll_bytes(threads) / out.window
        else:
            vms = {vm["id"]: vm for vm in api.get("/api/v1/vms").json()}
            out.null_lists = sum(1 for v in self.vm_ids if v in vms and vms[v]["threads"] is None)


def line(p: Phase) -> str:
    """One phase in two lines: CPU, then what ddmd did and how quiet the machine was."""
    split = ", ".join(f"{k} {p.pct(p.split[k]):.2f}" for k in SPLIT)
    text = (
        f"ddmd {p.pct(p.ddmd):5.2f} %, JVMs {p.pct(p.jvms):5.2f} % ({split}), "
        f"sum {p.pct(p.total):5.2f} %\n{'':16}"
        f"JDWP to the JVMs {p.bytes_hz / 1000:.1f} kB/s; "
    )
    if p.polling:
        hz = p.polls_hz or [0.0]
        text += (
            f"polls {statistics.mean(hz):.3f} Hz/JVM ({min(hz):.3f}-{max(hz):.3f}), "
            f"{min(p.threads, default=0)}-{max(p.threads, default=0)} threads listed, "
            f"{p.thread_polls_hz:.0f} Status/s; "
        )
    else:
        text += f"JVMs with no thread list (never polled): {p.null_lists}; "
    text += (
        f"ddmd waited for a CPU {p.pct(p.ddmd_wait):.2f} %, others {p.pct(p.other):.1f} %, "
        f"ready after {p.ready_s:.1f} s, RSS {p.rss_mb:.0f} MB"
    )
    if p.problems:
        text += f"; log warnings {dict(p.problems)}"
    return text


@dataclass
class Pair:
    """One round: the polling phase and the no-polling one."""

    poll: Phase
    quiet: Phase

    def added_pct(self, part: str) -> float:
        return self.poll.pct(self._s(self.poll, part)) - self.quiet.pct(self._s(self.quiet, part))

    def ratio(self, part: str) -> float:
        q = self.quiet.pct(self._s(self.quiet, part))
        return self.poll.pct(self._s(self.poll, part)) / q if q > 0 else float("inf")

    def per_thread_us(self, part: str) -> float:
        """Added CPU per Status, i.e. per poll per thread listed, µs."""
        if not self.poll.thread_polls_hz:
            return float("nan")
        added = self.added_pct(part) / 100  # core-seconds per second
        return 1e6 * added / self.poll.thread_polls_hz

    @staticmethod
    def _s(p: Phase, part: str) -> float:
        if part == "ddmd":
            return p.ddmd
        if part == "JVMs":
            return p.jvms
        if part == "total":
            return p.total
        return p.split[part]  # jdwp / runtime / app


PARTS = ("ddmd", "JVMs", "total", "jdwp", "runtime", "app")
PART_TITLES = {
    "ddmd": "ddmd",
    "JVMs": "JVMs (all)",
    "total": "ddmd + JVMs",
    "jdwp": "  JVMs: JDWP agent threads",
    "runtime": "  JVMs: runtime threads",
    "app": "  JVMs: app threads",
}


def spread(values: Sequence[float], fmt: str) -> str:
    if any(v == float("inf") for v in values):
        return "-"
    return span(values, fmt, "..")


def report(pairs: Sequence[Pair], args: argparse.Namespace, code: str) -> None:
    print()
    print(
        f"jvm_threads: {args.jvms} JVMs (IdleThreads: 50 threads of its own), ddmd polling "
        f"every {POLL_INTERVAL:g} s vs not polling, {len(pairs)} round(s) of "
        f"{args.seconds:g} s windows; {os.cpu_count()} CPUs; ddmd from {code}"
    )
    print(
        "CPU in % of one core; µs/poll/thread = added CPU / Status requests (one per thread "
        "listed per poll); ratio = polling / no polling"
    )
    for i, pair in enumerate(pairs, 1):
        parts = []
        for part in ("ddmd", "JVMs", "total"):
            r = pair.ratio(part)
            parts.append(
                f"{part} {pair.added_pct(part):+5.2f} % = {pair.per_thread_us(part):4.1f} µs"
                + (f" (x{r:.{2 if r < 10 else 1}f})" if r != float("inf") else "")
            )
        print(f"round {i} added: " + ";  ".join(parts))
    print()
    cols = ("no polling", "polling", "added", "µs/poll/thread", "ratio")
    head = f"{'':27}" + "".join(f"{c:>23}" for c in cols)
    print(head)
    print("-" * len(head))
    for part in PARTS:
        quiet = [p.quiet.pct(Pair._s(p.quiet, part)) for p in pairs]
        poll = [p.poll.pct(Pair._s(p.poll, part)) for p in pairs]
        added = [p.added_pct(part) for p in pairs]
        us = [p.per_thread_us(part) for p in pairs]
        ratios = [p.ratio(part) for p in pairs]
        rfmt = ".1f" if max(ratios) >= 10 else ".2f"
        cells = (
            spread(quiet, ".2f"),
            spread(poll, ".2f"),
            spread(added, "+.2f"),
            spread(us, ".1f"),
            spread(ratios, rfmt),
        )
        print(f"{PART_TITLES[part]:27}" + "".join(f"{c:>23}" for c in cells))
    print("each cell: the median over rounds (min..max); added, µs and ratio: per-round pairs")
    polls = [statistics.mean(p.poll.polls_hz) for p in pairs if p.poll.polls_hz]
    status = [p.poll.thread_polls_hz for p in pairs]
    threads = sorted({t for p in pairs for t in p.poll.threads})
    if polls:
        print(
            f"polls the JVMs received: {spread(polls, '.3f')} Hz per JVM "
            f"(asked: {1 / POLL_INTERVAL:g}); {spread(status, '.0f')} Status/s in all; "
            f"threads listed per JVM: {threads[0]}-{threads[-1]}"
        )
    short = [p for p in pairs if min(p.poll.threads, default=0) < args.min_threads]
    if short:
        print(f"NOTE: in {len(short)} round(s) a JVM listed fewer than {args.min_threads} threads")
    polled_quiet = [p for p in pairs if p.quiet.bytes_hz > 0 or p.quiet.null_lists < args.jvms]
    if polled_quiet:
        print(f"NOTE: in {len(polled_quiet)} round(s) the no-polling phase saw polls")
    busy = [
        i
        for i, p in enumerate(pairs, 1)
        if max(p.poll.pct(p.poll.other), p.quiet.pct(p.quiet.other)) > 20
    ]
    if busy:
        print(f"NOTE: others used > 20 % of a core in round(s) {busy}: noisier pairs")


# --------------------------------------------------------------------------------------------


def start_jvms(args: argparse.Namespace, work: Path, base: int, children: Children) -> list[Child]:
    classes = work / "classes"
    jvm.compile_java(classes, ["IdleThreads.java"])
    jvms = []
    for port in range(base, base + args.jvms):
        argv = jvm.jvm_argv(port, classes, "IdleThreads", args.jvm_opt)
        jvms.append(children.start(f"JVM on {port}", argv))
    for port, child in zip(range(base, base + args.jvms), jvms, strict=True):
        jvm.wait_agent(child, port, WAIT)
        child.wait_match(r"^ready \d+", WAIT)
    return jvms


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="window per phase")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before a window")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after JVMs start")
    parser.add_argument("--jvms", type=int, default=20)
    parser.add_argument(
        "--min-threads", type=int, default=50, help="threads each JVM must list while polled"
    )
    parser.add_argument("--jvm-opt", action="append", default=[], help="one more JVM flag")
    parser.add_argument("--first-port", type=int, default=FIRST_PORT)
    parser.add_argument("--ref", default=None, help="run ddmd from a git archive of this rev")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.jvms < 1 or args.seconds <= 0:
        parser.error("--rounds, --jvms and --seconds must be positive")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    work = Path(tempfile.mkdtemp(prefix="ddmd-jvm-threads-"))
    children = Children()
    pairs: list[Pair] = []
    code = "?"
    try:
        code = use_tree(args.ref, work, "jvm_threads")
        layout = Layout.find(args.jvms, args.jvms, args.first_port)
        ports = layout.scan
        print(
            f"{args.jvms} JVMs on {ports.start}-{ports.stop - 1}, debugger ports from "
            f"{layout.debugger.start}, control {layout.control}; ddmd from {code}; work dir {work}",
            flush=True,
        )
        t0 = time.monotonic()
        jvms = start_jvms(args, work, ports.start, children)
        print(
            f"JVMs up after {time.monotonic() - t0:.1f} s; {args.warmup:g} s for their start-up "
            "work (JIT, GC) to end",
            flush=True,
        )
        time.sleep(args.warmup)
        rig = Rig(args, work, jvms, layout)
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            print(f"round {r + 1}/{args.rounds}", flush=True)
            done = {
                polling: rig.phase(polling, "polling" if polling else "no polling")
                for polling in order
            }
            pairs.append(Pair(done[True], done[False]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        children.stop_all()
        if args.keep:
            print(f"configs and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        if pairs:
            report(pairs, args, code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
