"""Several debuggers on one VM: per-debugger latency and ddmd CPU per JDI round trip.

Run: ``.venv/bin/python bench/multi_debugger.py [--quick] [--levels 1 2 4] [--rounds 3]
[--count 5000] [--warmup 2000]``

Everything runs as separate processes on 127.0.0.1; ``bench/java/`` (Target, RoundTrip) is
compiled with javac into a temp dir at start. ``--quick`` is a smoke run (levels 1 and 4, one
round, 1000 timed calls per debugger); its figures are rough.

Round trips are ``RoundTrip.java``'s (see bridge_latency.py): one long-lived JDI client process
per debugger; per session it attaches with ``com.sun.jdi.SocketAttach``, calls
``ThreadReference.status()`` on the target's sleeping ``main`` thread WARMUP times untimed and
COUNT times timed (one JDWP command and one reply each), then ``dispose()``. In "sync" mode
each client stops at a mark right before and right after its timed loop; the bench waits until
every client of a group stands at the first mark, reads the CPU time of the processes involved
(/proc/PID/stat), lets them all go at once, waits until all stand at the second mark and reads
again. So the N debuggers of a group issue their round trips at the same time, and the CPU
figures cover the timed calls only.

Paths, for each level N (number of debuggers at once), all measured in one run, the order
rotated every round:

- direct xN: N clients, each attached straight to its own JVM's JDWP port (a JVM takes one
  debugger): the same N clients competing for the same CPUs, without ddmd;
- ddmd xN:   N clients attached at the same time to one JVM through ddmd, alternately through
  its per-VM port and the current-VM port (``[debugger] max_per_vm`` = the largest level).

Figures: each debugger's median and 90th percentile latency; "added" = its median less the
median of direct x1 (one debugger, nothing in between) and less the mean median of direct xN
(same number of clients at once, each with a JVM of its own); ddmd's CPU per round trip
(utime+stime over the group's window / all its round trips), with the target JVM's and the JDI
clients' for reference. ddmd's own counters (control API: each debugger's packets in and out)
are read at both marks: each debugger must have sent exactly COUNT commands and received
exactly COUNT replies, i.e. no reply went to another debugger. /proc counts in clock ticks
(10 ms); the tick counts are printed.

Through ddmd the N debuggers share one JDWP connection, and the VM's agent answers its
commands one at a time: part of what N debuggers add is that queue, not ddmd. On a machine
with fewer CPUs than processes busy at once (N clients, ddmd, the target), the latencies
measure the scheduler as much as the paths. Prints figures; asserts nothing; no target.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rig import HOST, jvm, proc
from rig.children import Children
from rig.daemon import Scanning, start_scanning
from rig.jvm import Jvm, RoundTripClient, java_version, start_jvms
from rig.ports import Ports
from rig.rounds import pct, print_report, rotated

QUICK = {"levels": [1, 4], "rounds": 1, "count": 1000, "warmup": 500}
NORMAL = {"levels": [1, 2, 4], "rounds": 3, "count": 5000, "warmup": 2000}
MAX_LEVEL = 8
PAUSE = 0.15  # between two groups: the VM (ddmd) takes the next debugger


# --------------------------------------------------------------------------------------------
# ddmd


def attached_debuggers(api: httpx.Client, ddmd: Scanning) -> list[dict[str, object]]:
    """The control API's list of debuggers attached to ddmd's VM (live packet counters)."""
    reply = api.get(f"/api/v1/vms/{ddmd.vm_id}")
    reply.raise_for_status()
    return list(reply.json()["vm"]["debuggers"])


def wait_no_debugger(api: httpx.Client, ddmd: Scanning, timeout: float = 20.0) -> None:
    """Wait until every debugger of the last group has left and the VM is ready again."""
    deadline = time.monotonic() + timeout
    while True:
        ddmd.child.check_alive()
        reply = api.get(f"/api/v1/vms/{ddmd.vm_id}")
        if reply.status_code == 200:
            vm = reply.json()["vm"]
            if vm["state"] == "ready" and not vm["debuggers"]:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"ddmd still lists debuggers after {timeout:g} s")
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# One group of debuggers at once


@dataclass
class Slot:
    """Where one client of a group attaches."""

    port: int
    via: str  # "direct", "vm-port" or "current"


@dataclass
class GroupResult:
    samples: list[list[float]]  # per client, µs
    ticks: dict[str, int]  # label -> utime+stime ticks over the window
    window_s: float
    loops_s: list[float]  # per client: the sum of its timed calls
    packets: list[tuple[int, int]] | None = None  # per debugger: (in, out) over the window
    attached: list[str] = field(default_factory=list)  # via of each debugger seen at the mark


def run_group(
    clients: Sequence[RoundTripClient],
    slots: Sequence[Slot],
    watch: Sequence[tuple[str, int]],
    warmup: int,
    count: int,
    counters: tuple[httpx.Client, Scanning] | None = None,
) -> GroupResult:
    """One session per client, their timed loops started together; the CPU of ``watch``
    ((label, pid), ...) and, with ``counters``, ddmd's per-debugger packets around them."""
    for client, slot in zip(clients, slots, strict=True):
        client.child.send(f"{HOST} {slot.port} {warmup} {count} sync")
    for client, slot in zip(clients, slots, strict=True):
        client.mark(slot.port)
    before_packets = None if counters is None else attached_debuggers(*counters)
    before = [proc.cpu_ticks(pid) for _, pid in watch]
    started = time.monotonic()
    for client in clients:
        client.child.send("go")
    for client, slot in zip(clients, slots, strict=True):
        client.mark(slot.port)
    window = time.monotonic() - started
    after = [proc.cpu_ticks(pid) for _, pid in watch]
    after_packets = None if counters is None else attached_debuggers(*counters)
    for client in clients:
        client.child.send("go")
    samples = []
    for client, slot in zip(clients, slots, strict=True):
        samples.append([int(x) / 1000 for x in client.result(slot.port)[2:]])
    ticks: dict[str, int] = {}
    for (label, _), (u0, s0), (u1, s1) in zip(watch, before, after, strict=True):
        ticks[label] = ticks.get(label, 0) + (u1 - u0) + (s1 - s0)
    result = GroupResult(samples, ticks, window, [sum(s) / 1e6 for s in samples])
    if before_packets is not None and after_packets is not None:
        by_peer = {str(d["peer"]): d for d in before_packets}
        result.attached = [str(d["via"]) for d in after_packets]
        result.packets = [
            (
                int(str(d["packets_in"])) - int(str(by_peer[str(d["peer"])]["packets_in"])),
                int(str(d["packets_out"])) - int(str(by_peer[str(d["peer"])]["packets_out"])),
            )
            for d in after_packets
            if str(d["peer"]) in by_peer
        ]
    return result


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Route:
    """All sessions of one path (kind, level) over the rounds."""

    kind: str  # "direct" or "ddmd"
    level: int
    slots: list[Slot]
    samples: list[list[float]] = field(default_factory=list)  # per slot
    ticks: dict[str, int] = field(default_factory=dict)
    round_trips: int = 0
    windows: list[float] = field(default_factory=list)
    overlap: list[float] = field(default_factory=list)  # shortest loop / window, per group
    packets: list[tuple[int, int]] = field(default_factory=list)
    attached: list[list[str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind} x{self.level}"

    def add(self, result: GroupResult) -> None:
        if not self.samples:
            self.samples = [[] for _ in self.slots]
        for mine, new in zip(self.samples, result.samples, strict=True):
            mine.extend(new)
        for label, ticks in result.ticks.items():
            self.ticks[label] = self.ticks.get(label, 0) + ticks
        self.round_trips += sum(len(s) for s in result.samples)
        self.windows.append(result.window_s)
        self.overlap.append(min(result.loops_s) / result.window_s)
        if result.packets is not None:
            self.packets.extend(result.packets)
            self.attached.append(result.attached)

    def medians(self) -> list[float]:
        return [statistics.median(s) for s in self.samples]

    def cpu_us(self, label: str) -> float:
        return self.ticks.get(label, 0) / proc.CLK_TCK * 1e6 / max(1, self.round_trips)


def measure(args: argparse.Namespace, work: Path, children: Children) -> list[str]:
    ports = Ports()
    classes = work / "classes"
    jvm.compile_java(classes, ["Target.java", "RoundTrip.java"])
    top = max(args.levels)
    # JVM#1..#top: one each for the direct sessions; the last one is ddmd's.
    jvms = start_jvms(children, top + 1, ports, classes)
    free, shared = jvms[:top], jvms[top]
    clients = [RoundTripClient(children, classes) for _ in range(top)]
    ddmd = start_scanning(children, work, "ddmd", shared.port, ports, debugger={"max_per_vm": top})
    vm_port = ddmd.vm_port
    api = httpx.Client(base_url=f"http://{HOST}:{ddmd.control_port}", timeout=5.0)
    lines = [
        f"JVMs: {', '.join(f'{j.name} :{j.port}' for j in jvms)} (same program and flags); "
        f"{shared.name} is ddmd's (per-VM port {vm_port}, current-VM port {ddmd.current_port})"
    ]
    paths: list[Route] = []
    for level in args.levels:
        direct = [Slot(free[i].port, "direct") for i in range(level)]
        through = [
            Slot(vm_port, "vm-port") if i % 2 == 0 else Slot(ddmd.current_port, "current")
            for i in range(level)
        ]
        paths += [Route("direct", level, direct), Route("ddmd", level, through)]

    def watch_of(path: Route) -> list[tuple[str, int]]:
        targets: list[Jvm] = free[: path.level] if path.kind == "direct" else [shared]
        watch = [("target JVM", j.pid) for j in targets]
        watch += [("JDI clients", c.child.pid) for c in clients[: path.level]]
        if path.kind == "ddmd":
            watch.append(("ddmd", ddmd.child.pid))
        return watch

    try:
        for round_no in range(args.rounds):
            for path in rotated(paths, round_no):
                counters = (api, ddmd) if path.kind == "ddmd" else None
                result = run_group(
                    clients[: path.level],
                    path.slots,
                    watch_of(path),
                    args.warmup,
                    args.count,
                    counters,
                )
                path.add(result)
                time.sleep(PAUSE)
                if path.kind == "ddmd":
                    wait_no_debugger(api, ddmd)
            print(f"round {round_no + 1}/{args.rounds} done", flush=True)
        for client in clients:
            client.child.send("quit")
    finally:
        api.close()
        ddmd.daemon.stop(children)
    return lines + report(paths, args)


def report(paths: list[Route], args: argparse.Namespace) -> list[str]:
    by_name = {p.name: p for p in paths}
    base = statistics.median(by_name["direct x1"].samples[0])
    out: list[str] = [
        "",
        f"Latency of ThreadReference.status() per debugger, µs ({args.rounds} round(s) x "
        f"{args.count} calls per debugger)",
        f"{'path':<11} {'debugger':<13} {'median':>7} {'p90':>7} {'added vs':>9} {'added vs':>10}",
        f"{'':<11} {'':<13} {'':>7} {'':>7} {'direct x1':>9} {'direct xN':>10}",
    ]
    for path in paths:
        direct_n = statistics.mean(by_name[f"direct x{path.level}"].medians())
        for i, (slot, samples) in enumerate(zip(path.slots, path.samples, strict=True)):
            med = statistics.median(samples)
            versus_n = "" if path.kind == "direct" else f"{med - direct_n:>+10.1f}"
            out.append(
                f"{path.name:<11} #{i + 1} {slot.via:<10} {med:>7.1f} {pct(samples, 90):>7.1f} "
                f"{med - base:>+9.1f} {versus_n}"
            )
    out += [
        "",
        "CPU per round trip, µs (utime+stime over the timed window / round trips; ticks of "
        f"1/{proc.CLK_TCK} s in brackets)",
        f"{'path':<11} {'ddmd':>14} {'target JVM':>14} {'JDI clients':>14} {'round trips':>12} "
        f"{'window s':>9} {'overlap':>8} {'ddmd load':>10}",
    ]
    for path in paths:
        cells = []
        for label in ("ddmd", "target JVM", "JDI clients"):
            if label in path.ticks:
                cells.append(f"{path.cpu_us(label):>8.1f} ({path.ticks[label]:>3})")
            else:
                cells.append(f"{'-':>14}")
        load = (
            f"{path.ticks['ddmd'] / proc.CLK_TCK / sum(path.windows):>10.2f}"
            if "ddmd" in path.ticks
            else f"{'-':>10}"
        )
        out.append(
            f"{path.name:<11} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14} "
            f"{path.round_trips:>12} {sum(path.windows):>9.2f} {min(path.overlap):>8.2f} {load}"
        )
    out.append(
        "(overlap: the shortest client's timed loop / the group's window, worst group; "
        "1.00 = all ran the whole time. ddmd load: its CPU seconds / window seconds, in cores)"
    )

    one = by_name["ddmd x1"]
    one_added = statistics.median(one.samples[0]) - base
    one_cpu = one.cpu_us("ddmd")
    out += ["", "Summary"]
    out.append(
        f"  one debugger through ddmd: +{one_added:.1f} µs median over direct, "
        f"ddmd {one_cpu:.1f} µs CPU per round trip"
    )
    for path in paths:
        if path.kind != "ddmd" or path.level == 1:
            continue
        direct_n = statistics.mean(by_name[f"direct x{path.level}"].medians())
        added = [m - base for m in path.medians()]
        added_n = [m - direct_n for m in path.medians()]
        cpu = path.cpu_us("ddmd")
        ratio = cpu / one_cpu if one_cpu else float("nan")
        out.append(
            f"  {path.level} debuggers at once through ddmd: added per debugger "
            f"{' / '.join(f'{a:+.1f}' for a in added)} µs over direct x1 (mean "
            f"{statistics.mean(added):+.1f}; one debugger: {one_added:+.1f}), "
            f"{' / '.join(f'{a:+.1f}' for a in added_n)} µs over {path.level} direct "
            f"sessions at once; ddmd {cpu:.1f} µs CPU per round trip ({ratio:.2f}x one "
            "debugger's)"
        )
    for path in paths:
        if path.kind != "ddmd":
            continue
        expected = args.count
        exact = all(p == (expected, expected) for p in path.packets)
        complete = all(len(a) == path.level for a in path.attached)
        vias = sorted({v for a in path.attached for v in a})
        out.append(
            f"  check {path.name}: {len(path.packets)} debugger sessions, each "
            + (
                f"+{expected} commands and +{expected} replies in ddmd's counters"
                if exact
                else f"NOT {expected}/{expected}: {path.packets}"
            )
            + (
                f"; all {path.level} attached at once (via {', '.join(vias)})"
                if complete
                else f"; NOT all attached at once: {path.attached}"
            )
        )
    cpus = os.cpu_count() or 1
    top = max(args.levels)
    if cpus < top + 2:
        out.append(
            f"  note: {cpus} CPUs for {top} JDI clients + ddmd + the target at once: the "
            "latencies at the higher levels include waiting for a CPU"
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: levels 1 4, 1000 calls")
    parser.add_argument(
        "--levels",
        type=int,
        nargs="+",
        help="numbers of debuggers at once (default 1 2 4; 1 is always measured)",
    )
    parser.add_argument("--rounds", type=int, help="rounds, the path order rotated (default 3)")
    parser.add_argument("--count", type=int, help="timed round trips per debugger (default 5000)")
    parser.add_argument("--warmup", type=int, help="untimed round trips first (default 2000)")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else NORMAL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.levels = sorted({1, *args.levels})
    if not all(1 <= n <= MAX_LEVEL for n in args.levels):
        parser.error(f"--levels must be between 1 and {MAX_LEVEL}")
    if min(args.rounds, args.warmup) < 1 or args.count < 10:
        parser.error("--rounds and --warmup must be at least 1, --count at least 10")
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    if missing:
        print(f"multi_debugger: needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 1
    print(
        f"multi_debugger: JDK {java_version()}, {os.cpu_count()} CPUs; levels "
        f"{' '.join(map(str, args.levels))}; {args.rounds} round(s), {args.count} timed "
        f"ThreadReference.status() per debugger (+{args.warmup} warm-up)"
        + (" [--quick: rough figures]" if args.quick else ""),
        flush=True,
    )
    started = time.monotonic()
    children = Children()
    with tempfile.TemporaryDirectory(prefix="multi-debugger-") as tmp:
        try:
            lines = measure(args, Path(tmp), children)
        finally:
            children.stop_all()
    print_report(lines, started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
