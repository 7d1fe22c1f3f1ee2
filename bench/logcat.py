"""Logcat under load (issue 19): a device that logs 20,000 lines a second for 60 s, followed by
two ``ddmd logcat`` CLIs and one web page. ddmd's CPU and memory, lines lost, device -> viewer
latency.

Run: ``.venv/bin/python bench/logcat.py [--seconds 60] [--rate 20000] [--rounds 1]``
(``--rounds 3 --seconds 20`` for three shorter rounds; each round takes its load time plus
about 15 s of set-up). Needs ``adb`` (Debian's) and, for the page, /usr/bin/chromium and
Playwright (``--no-page`` leaves the page out).

Set-up, every piece its own process on 127.0.0.1 (this process only reads what the viewers
print and counts):

- a private real adb server (``adb -P PORT start-server``, HOME a temp dir, never 5037), for
  the whole run;
- the device (``bench/logcat_device.py``): a fake adbd (``ddmd.sim.adbd.FakeDevice``) adopted
  by that server, with one app VM (a ``ddmd sim`` VM, ``com.example.bench``, pid 4242), that
  logs lines stamped when it logs them (the message carries a counter over the whole run and
  the send time, ``time.time_ns()``); see its docstring. It logs at the given rate whatever
  the readers do, as logd does (a reader 16 MiB behind is closed);
- per round, a fresh ``ddmd run --config FILE`` (``[scan] enabled = false``, ``[adb] enabled
  = "on"`` on that server, no adb front, ``[logcat]`` defaults), so each round's RSS starts
  from a fresh daemon; the device's ring is emptied first, so ddmd gets no backlog;
- the viewers, opened before the load and read during it:

  - two CLI followers, ``ddmd logcat --all --device SERIAL --json --control HOST:PORT``
    (``--cli-socket``: ``--config FILE`` instead, i.e. through the control unix socket, the
    CLI's default way in), their stdout read by this process in chunks, each chunk stamped
    with ``time.time_ns()`` when read;
  - one web page: headless Chromium (Debian's, through Playwright, tests/web's flags) on
    ddmd's page, the app's VM selected, its Logcat panel showing the whole device (``Whole
    device`` checked: every line reaches the page, as it reaches the CLIs). The panel is
    ddmd's own app.js (working tree); a script added before the page loads listens on the
    same EventSource the panel opens and counts and times each ``logcat.lines`` item when
    the browser delivers the event (before the panel paints it).

  The bench logs a marker line until every viewer showed it (then all are connected), waits
  2 s, and starts the load.

Measured, per round:

- lines lost: for each viewer, the counters of the round's lines (first..last, told by the
  device) it never got (target: none); the CLIs' ``seq`` gaps (a gap: ddmd numbered the item
  but did not send it to that viewer: its queue overflowed); the device's readers closed for
  being too far behind; ddmd's logcat counters if /metrics has any, and ddmd's log events
  about the log stream (``logcat.*``);
- latency: for each viewer, from the line's send time to its arrival (a CLI: when this process
  read it from the CLI's stdout, i.e. after the CLI parsed the SSE batch and printed the line;
  the page: when Chromium delivered the event to the page), p50, p99 and max over every line
  of the round; and when each viewer got the last line, after the device logged it;
- CPU, as % of one core, from ``/proc/PID/task/*/schedstat`` (ns) of every thread of a process
  tree (children through ``/proc/PID/task/*/children``): ddmd's tree (and its main thread
  alone: trio runs the daemon on it), the adb server, the device, each CLI, the page's
  Chromium tree (also split by Chromium process type: renderer, gpu-process, ...), the
  Playwright driver and this process; over the window from the start of the load until every
  viewer had the last line (or a 15 s pause in progress, 120 s at most), and per 10 s of it
  (the timeline). Each figure comes with the run-queue wait (schedstat's second field: time
  runnable without a CPU): ddmd's main thread running + waiting near 100 % means ddmd had
  work all the time, and a large wait that it was short of CPU, not of work. The whole
  machine's busy time (/proc/stat) is shown beside the bench's own processes: what is left
  is other people's load (the figures then mean less);
- where a viewer's lag sits: per 10 s, the most bytes of ddmd's answers in the kernel on the
  way to each viewer (/proc/net/tcp: ddmd's send queue + the viewer's receive queue). Full
  buffers: the viewer reads too slowly; near empty while its latency grows: ddmd writes too
  late (its queue per viewer is in memory, see the RSS); and the most bytes of each CLI's
  output in its stdout pipe, unread by this process (FIONREAD): a full pipe (64 KiB) holds the
  CLI up, as a slow terminal would;
- memory: ddmd's VmRSS after start-up, right before the load (viewers connected) and after
  it, and its peak (VmHWM).

``--page-profile`` also profiles the page for PROFILE_SECONDS from the middle of the load
(DevTools' JavaScript profiler, self time per function, and a Chromium trace of the renderer's
main thread: script, style, layout, paint, ... as % of a core). Collecting the trace costs CPU
and stops this process for seconds: such a run's other figures are not the load's.
``--no-page`` and ``--followers N`` leave viewers out, to see what each costs.

The machine's speed drifts by a third between minutes: one round is one sample. With
``--rounds N`` every figure is shown per round and as the median over rounds (min-max).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import fcntl
import itertools
import json
import os
import platform
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import termios
import threading
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from logcat_device import APP, APP_PID
from rig import HOST, ROOT, proc
from rig.adb import AdbServer
from rig.children import Child
from rig.daemon import changed_files, ddmd_argv, git, json_log, start_ddmd, write_config
from rig.ports import Ports

WAIT = 60.0  # seconds: one set-up condition (ddmd ready, the VM named, viewers connected)
SETTLE = 2.0  # seconds between the viewers connected and the load
QUIET = 15.0  # seconds without progress after the load: the viewers are done
DRAIN_CAP = 120.0  # seconds after the load at most
WINDOW = 10.0  # seconds per timeline row
CHROMIUM = Path("/usr/bin/chromium")
PAGE_LABEL = "page (Chromium)"
PROFILE_SECONDS = 5.0  # --page-profile
CHROMIUM_ARGS = [  # tests/web/test_browser.py
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: What would send the adb client or server elsewhere (tests/adb/device.py's list).
LOAD_LINE = re.compile(rb'"seq":(\d+),[^\n]*?"message":"bench (\d+) (\d+) ')
MARK_LINE = re.compile(rb'"message":"benchmark-mark (\d+)"')

# --------------------------------------------------------------------------------------------
# CPU of process trees, /proc/PID/task/*/schedstat


@dataclass(frozen=True)
class Snapshot:
    threads: dict[str, dict[tuple[int, int], tuple[int, int]]]
    machine: tuple[int, int]


class CpuWatch:
    """Labelled processes (whole trees, or one process's threads); of two snapshots, `seconds`
    gives each label's CPU seconds and `waited` its seconds runnable without a CPU (a thread
    new at the second counts from 0); `machine` the whole machine's busy CPU seconds."""

    def __init__(self) -> None:
        self.roots: dict[str, tuple[int, bool]] = {}

    def snapshot(self) -> Snapshot:
        threads = {label: proc.schedstat(pid, tree) for label, (pid, tree) in self.roots.items()}
        return Snapshot(threads, proc.machine_ticks())

    @staticmethod
    def _sum(before: Snapshot, after: Snapshot, field: int) -> dict[str, float]:
        spent = proc.spent_by_label(before.threads, after.threads, field)
        return {label: ns / 1e9 for label, ns in spent.items()}

    @staticmethod
    def seconds(before: Snapshot, after: Snapshot) -> dict[str, float]:
        return CpuWatch._sum(before, after, 0)

    @staticmethod
    def waited(before: Snapshot, after: Snapshot) -> dict[str, float]:
        return CpuWatch._sum(before, after, 1)

    @staticmethod
    def machine(before: Snapshot, after: Snapshot) -> float:
        """Busy CPU seconds of the whole machine (every process, ours or not)."""
        return (after.machine[0] - before.machine[0]) / proc.CLK_TCK

    @staticmethod
    def main_thread(before: Snapshot, after: Snapshot, label: str, pid: int) -> tuple[float, float]:
        """(CPU seconds, run-queue wait seconds) of the thread ``pid`` of ``pid``."""
        key = (pid, pid)
        a = before.threads.get(label, {}).get(key, (0, 0))
        b = after.threads.get(label, {}).get(key, (0, 0))
        return (b[0] - a[0]) / 1e9, (b[1] - a[1]) / 1e9


def chromium_split(before: Snapshot, after: Snapshot, span: float) -> dict[str, float]:
    """The page's Chromium CPU (% of a core) by process type (its --type= argument)."""
    out: dict[str, float] = {}
    then = before.threads.get(PAGE_LABEL, {})
    for (pid, tid), (run, _) in after.threads.get(PAGE_LABEL, {}).items():
        try:
            # Chromium rewrites its children's command lines as one space-separated string
            raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            words = raw.decode(errors="replace").split()
        except OSError:
            words = []
        kind = next((w[7:] for w in words if w.startswith("--type=")), "browser")
        spent = 100 * (run - then.get((pid, tid), (0, 0))[0]) / 1e9 / span
        out[kind] = out.get(kind, 0.0) + spent
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "cc", "v8"]
#: Renderer main-thread work as DevTools' Performance panel names it.
TRACE_MAIN = (
    "EventDispatch",
    "FunctionCall",
    "FireAnimationFrame",
    "TimerFire",
    "UpdateLayoutTree",
    "Layout",
    "PrePaint",
    "Paint",
    "Layerize",
    "UpdateLayer",
    "Commit",
    "MinorGC",
    "MajorGC",
)


def trace_summary(trace: dict[str, Any], span: float) -> list[str]:
    """% of a core per kind of work on the renderer's main thread (RunTask: all of it), and
    raster tasks on every thread, from a Chromium trace."""
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    names = {
        (e.get("pid"), e.get("tid")): e.get("args", {}).get("name")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    main: Counter[str] = Counter()
    other: Counter[str] = Counter()
    on_main = []
    for e in events:
        if e.get("ph") != "X":
            continue
        thread = names.get((e.get("pid"), e.get("tid")))
        name, dur = e.get("name", ""), e.get("dur", 0)
        if thread == "CrRendererMain" and (name in TRACE_MAIN or name == "RunTask"):
            on_main.append((e.get("ts", 0), -dur, name))
        elif name in ("RasterTask", "DrawFrame"):
            other[f"{name} ({thread})"] += dur
    # Each kind counted where it is outermost (a FunctionCall inside FireAnimationFrame is the
    # animation frame's): a stack of the open intervals, outermost first.
    open_until: list[tuple[int, str]] = []
    for ts, minus_dur, name in sorted(on_main):
        while open_until and open_until[-1][0] <= ts:
            open_until.pop()
        if name == "RunTask" or not any(n in TRACE_MAIN for _, n in open_until):
            main[name] += -minus_dur
        open_until.append((ts - minus_dur, name))

    def share(us: int) -> str:
        return f"{100 * us / 1e6 / span:.1f}"

    run = main.pop("RunTask", 0)
    out = [
        f"  page trace: the renderer's main thread busy {share(run)} % of a core (RunTask), of it:"
    ]
    out.append(
        "    " + ", ".join(f"{k} {share(v)}" for k, v in main.most_common() if v >= 0.002 * run)
    )
    if other:
        out.append(
            "    elsewhere: " + ", ".join(f"{k} {share(v)}" for k, v in other.most_common(4))
        )
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (by the parent field of /proc/*/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------------------------
# Figures


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (nan when empty)."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def med(values: Sequence[float], fmt: str = ".1f") -> str:
    """The median over rounds and its range."""
    good = [v for v in values if v == v]
    if not good:
        return "-"
    if len(good) == 1:
        return f"{good[0]:{fmt}}"
    return f"{statistics.median(good):{fmt}} ({min(good):{fmt}}-{max(good):{fmt}})"


# --------------------------------------------------------------------------------------------
# The viewers


class CliFollower:
    """One ``ddmd logcat --all --json`` process; a thread reads its stdout in chunks, stamps
    each chunk when read and keeps, per load line, (seq, counter, latency ns, arrival ns)."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k != "NO_COLOR"},
        )
        self.seqs = array("q")
        self.counters = array("q")
        self.latency = array("q")
        self.arrival = array("q")
        self.mark = -1
        self.lines = 0
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for t in self._threads:
            t.start()
        self.pid = self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        tail = b""
        seqs, counters, latency, arrival = self.seqs, self.counters, self.latency, self.arrival
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            now = time.time_ns()
            data = tail + chunk
            cut = data.rfind(b"\n") + 1
            tail, data = data[cut:], data[:cut]
            self.lines += data.count(b"\n")
            for seq, n, sent in LOAD_LINE.findall(data):
                seqs.append(int(seq))
                counters.append(int(n))
                latency.append(now - int(sent))
                arrival.append(now)
            if b"benchmark-mark" in data:
                for k in MARK_LINE.findall(data):
                    self.mark = max(self.mark, int(k))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode(errors="replace").rstrip())

    def received(self) -> int:
        return len(self.counters)

    def pipe_unread(self) -> int:
        """Bytes the CLI wrote to its stdout that this process has not read yet (a full pipe,
        64 KiB, holds the CLI up)."""
        assert self.proc.stdout is not None
        size = array("i", [0])
        try:
            fcntl.ioctl(self.proc.stdout.fileno(), termios.FIONREAD, size)
        except OSError:
            return 0
        return size[0]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = "\n".join(self.stderr[-10:])
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for t in self._threads:
            t.join(5)


#: Added before the page's own scripts: counts and times what the Logcat panel's EventSource
#: receives (the same events, on the same connection) without touching app.js.
PAGE_SCRIPT = r"""
(() => {
  const S = { opened: 0, events: 0, items: 0, dups: 0, last: -1, mark: -1,
              lat: [], at: [] };
  window.__bench = S;
  const load = /"message":"bench (\d+) (\d+) /g;
  const mark = /"message":"benchmark-mark (\d+)"/g;
  const Native = window.EventSource;
  class Watched extends Native {
    constructor(url, init) {
      super(url, init);
      if (!String(url).includes("/logcat")) return;
      S.opened += 1;
      this.addEventListener("logcat.lines", (ev) => {
        const now = performance.timeOrigin + performance.now();
        S.events += 1;
        for (const m of ev.data.matchAll(load)) {
          const n = Number(m[1]);
          if (n <= S.last) { S.dups += 1; continue; }
          S.last = n;
          S.items += 1;
          S.lat.push(now - Number(m[2]) / 1e6);
          S.at.push(now);
        }
        if (ev.data.includes("benchmark-mark"))
          for (const m of ev.data.matchAll(mark)) S.mark = Math.max(S.mark, Number(m[1]));
      });
    }
  }
  window.EventSource = Watched;
  window.__benchProgress = () => ({ items: S.items, mark: S.mark, last: S.last });
  window.__benchSummary = (args) => {
    const [start, ends] = args;
    const q = (a, p) => a.length ? a[Math.min(a.length - 1, Math.floor(p / 100 * a.length))] : null;
    const all = Float64Array.from(S.lat).sort();
    const rows = ends.map(() => []);
    for (let i = 0; i < S.at.length; i++) {
      const t = (S.at[i] - start) / 1000;
      const k = ends.findIndex((end) => t < end);
      if (k >= 0) rows[k].push(S.lat[i]);
    }
    const timeline = rows.map((v) => {
      const a = Float64Array.from(v).sort();
      return [a.length, q(a, 50), q(a, 99)];
    });
    return { opened: S.opened, events: S.events, items: S.items, dups: S.dups, last: S.last,
             lastLat: S.lat.length ? S.lat[S.lat.length - 1] : null,
             p50: q(all, 50), p99: q(all, 99), max: all.length ? all[all.length - 1] : null,
             timeline };
  };
})();
"""


class Browser:
    """Chromium through Playwright (sync API, this thread only), launched once per run."""

    def __init__(self) -> None:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        self.version = self.browser.version
        roots = [p for p in descendants(os.getpid()) if comm(p).startswith("chrom")]
        self.pid = min(roots) if roots else 0  # the browser process: the first one started
        drivers = [p for p in descendants(os.getpid()) if comm(p).startswith("node")]
        self.driver_pid = drivers[0] if drivers else 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.browser.close()
        with contextlib.suppress(Exception):
            self._pw.stop()


class Page:
    """ddmd's page with the app VM's Logcat panel open on the whole device."""

    def __init__(self, browser: Browser, base: str, vm_id: str) -> None:
        self.context = browser.browser.new_context(viewport={"width": 1440, "height": 1000})
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT * 1000)
        self.problems: list[str] = []
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.add_init_script(PAGE_SCRIPT)
        self.page.goto(base + "/")
        self.page.locator(f'#vms tbody tr[data-vm-id="{vm_id}"] button.link').click()
        self.page.locator("#logcat-all").check()
        self.page.wait_for_function(
            "() => { const s = document.querySelector('#logcat-panel').dataset.stream;"
            " return s !== undefined && new URLSearchParams(s).get('all') === '1'; }"
        )

    def progress(self) -> dict[str, int]:
        out: dict[str, int] = self.page.evaluate("() => window.__benchProgress()")
        return out

    def summary(self, start_ms: float, ends: list[float]) -> dict[str, Any]:
        """Counts and latencies (ms) of the load's lines; per stretch of the load ending at
        ``ends`` (seconds from ``start_ms``, epoch ms): (lines, p50, p99)."""
        out: dict[str, Any] = self.page.evaluate(
            "args => window.__benchSummary(args)", [start_ms, ends]
        )
        out["status"] = self.page.locator("#logcat-status").inner_text()
        out["rows"] = self.page.locator("#logcat-rows .logcat-row").count()
        return out

    def start_profile(self, browser: Browser) -> None:
        """The page's JavaScript CPU profile (DevTools' Profiler) and a Chromium trace of
        its rendering, until `stop_profile`."""
        self._browser = browser
        browser.browser.start_tracing(page=self.page, categories=TRACE_CATEGORIES)
        self._cdp = self.context.new_cdp_session(self.page)
        self._cdp.send("Profiler.enable")
        self._cdp.send("Profiler.setSamplingInterval", {"interval": 500})
        self._cdp.send("Profiler.start")
        self._profile_start = time.monotonic()

    def stop_profile(self, top: int = 12) -> list[str]:
        """The profile's functions with the most self time: lines for the report."""
        profile = self._cdp.send("Profiler.stop")["profile"]
        span = time.monotonic() - self._profile_start
        self._cdp.detach()
        nodes = {node["id"]: node for node in profile["nodes"]}
        took: Counter[str] = Counter()
        deltas = profile.get("timeDeltas", [])
        for node_id, delta in zip(profile.get("samples", []), [*deltas[1:], 0], strict=False):
            frame = nodes[node_id]["callFrame"]
            url = frame.get("url", "").rsplit("/", 1)[-1]
            where = f" ({url}:{frame.get('lineNumber', -1) + 1})" if url else ""
            took[(frame.get("functionName") or "(anonymous)") + where] += delta
        total = sum(took.values()) or 1
        lines = [
            f"    {100 * t / total:5.1f} % of samples, {t / 1e4 / span:5.1f} % of a core: {name}"
            for name, t in took.most_common(top)
        ]
        head = f"  page profile ({span:.0f} s in the middle of the load): JavaScript, self time:"
        trace = json.loads(self._browser.browser.stop_tracing())
        return [head, *lines, *trace_summary(trace, span)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.context.close()


# --------------------------------------------------------------------------------------------
# Processes


def config(path: Path, adb_port: int, ports: Ports) -> int:
    """ddmd's config for one round; returns its control port."""
    control, current = ports.take(), ports.take()
    first = ports.take()
    no_adb = path.parent / "no-adb-program"
    sections: dict[str, dict[str, object]] = {
        "scan": {"enabled": False},
        "adb": {"enabled": "on", "host": HOST, "port": adb_port, "path": no_adb},
        "front": {"enabled": False},
        "debugger": {
            "host": HOST,
            "ports": f"{first}-{first}",
            "current_port": current,
            "state_file": path.with_suffix(".ports.json"),
        },
        "control": {"host": HOST, "port": control, "socket": path.parent / "control.sock"},
        "log": json_log(),
    }
    write_config(path, sections)
    return control


def code_state() -> str:
    files = ", ".join(changed_files())
    return f"working tree at {git('rev-parse', '--short', 'HEAD')}" + (
        f" + uncommitted changes in {files}" if files else ""
    )


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}"


# --------------------------------------------------------------------------------------------
# One round


@dataclass
class Viewer:
    name: str
    received: int = 0  # distinct lines of the round
    missing: int = 0
    dups: int = 0
    seq_gaps: int | None = None  # items ddmd numbered but did not send (CLI only)
    p50: float = float("nan")  # ms
    p99: float = float("nan")
    max: float = float("nan")
    last_after: float | None = None  # s after the device logged the last line; None: never
    timeline: list[tuple[int, float, float]] = field(default_factory=list)  # per CpuRow
    note: str = ""


@dataclass(frozen=True)
class CpuRow:
    """One stretch of the load: [start, end) seconds from its start, CPU % of a core."""

    start: float
    end: float
    cpu: dict[str, float]
    wait: dict[str, float]
    main: float
    main_wait: float
    machine: float
    queued: dict[str, int] = field(default_factory=dict)  # most bytes in the kernel, per viewer
    piped: dict[str, int] = field(default_factory=dict)  # most bytes in a CLI's stdout pipe


@dataclass
class Round:
    number: int
    sent: int = 0
    first: int = 0
    last: int = 0
    load_s: float = 0.0
    late_max_ms: float = 0.0
    queue_max: int = 0
    overflows: int = 0
    window_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # % of a core over the window
    ddmd_main: float = 0.0  # % of a core: its main thread (trio's)
    ddmd_main_wait: float = 0.0  # % of the window its main thread was runnable without a CPU
    wait: dict[str, float] = field(default_factory=dict)  # run-queue wait, % of a core
    machine: float = 0.0  # every process on the machine, ours or not: % of a core
    rss_startup: float = 0.0
    rss_before: float = 0.0
    rss_after: float = 0.0
    hwm: float = 0.0
    viewers: list[Viewer] = field(default_factory=list)
    cpu_timeline: list[CpuRow] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    log_events: Counter[str] = field(default_factory=Counter)
    page_status: str = ""
    page_rows: int = 0
    chromium: dict[str, float] = field(default_factory=dict)  # % of a core by process type
    page_profile: list[str] = field(default_factory=list)


def cpu_row(a: Snapshot, b: Snapshot, start: float, end: float, ddmd_pid: int) -> CpuRow:
    span = end - start
    run, wait = CpuWatch.main_thread(a, b, "ddmd", ddmd_pid)
    return CpuRow(
        start,
        end,
        {k: 100 * v / span for k, v in CpuWatch.seconds(a, b).items()},
        {k: 100 * v / span for k, v in CpuWatch.waited(a, b).items()},
        100 * run / span,
        100 * wait / span,
        100 * CpuWatch.machine(a, b) / span,
    )


def tcp_sockets() -> list[tuple[int, int, int, int, int]]:
    """(local port, remote port, tx_queue, rx_queue, inode) of every IPv4 TCP socket."""
    out = []
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            f = line.split()
            tx, rx = (int(x, 16) for x in f[4].split(":"))
            out.append(
                (int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16), tx, rx, int(f[9]))
            )
    return out


def socket_inodes(pid: int) -> set[int]:
    out = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def queued_toward(control: int, viewers: dict[str, int]) -> dict[str, int]:
    """Bytes of ddmd's answers in the kernel on their way to each viewer: ddmd's send queue
    (not yet acknowledged: the viewer's window is full) plus the viewer's receive queue (not
    yet read by it). Large: that viewer is not reading fast enough; near 0 while its latency
    grows: ddmd is late writing. Connections to the control port that no CLI holds are the
    page's (its log stream, its event stream, its polls): the most queued one is "page"."""
    rows = tcp_sockets()
    sent = {remote: tx for local, remote, tx, _, _ in rows if local == control}
    out: dict[str, int] = {}
    held: set[int] = set()
    for name, pid in viewers.items():
        inodes = socket_inodes(pid)
        mine = [
            (local, rx) for local, remote, _, rx, ino in rows if remote == control and ino in inodes
        ]
        held.update(local for local, _ in mine)
        out[name] = sum(rx + sent.get(local, 0) for local, rx in mine)
    rest = [
        rx + sent.get(local, 0)
        for local, remote, _, rx, _ in rows
        if remote == control and local not in held
    ]
    out["page"] = max(rest, default=0)
    return out


class Ticker:
    """During a load: the kernel queues toward each viewer (most in each row), and a CPU row
    every WINDOW seconds."""

    def __init__(
        self,
        bench: Bench,
        r: Round,
        t0: float,
        first: Snapshot,
        ddmd_pid: int,
        control: int,
        followers: list[CliFollower],
    ) -> None:
        self.bench, self.r, self.t0, self.ddmd_pid = bench, r, t0, ddmd_pid
        self.control, self.followers = control, followers
        self.viewers = {f.name: f.pid for f in followers}
        self.last, self.last_t = first, t0
        self.queued: dict[str, int] = {}
        self.piped: dict[str, int] = {}

    def tick(self) -> None:
        for name, size in queued_toward(self.control, self.viewers).items():
            self.queued[name] = max(self.queued.get(name, 0), size)
        for f in self.followers:
            self.piped[f.name] = max(self.piped.get(f.name, 0), f.pipe_unread())
        if time.monotonic() - self.last_t >= WINDOW:
            snap, now = self.bench.cpu.snapshot(), time.monotonic()
            self._row(snap, now)

    def finish(self, snap: Snapshot, now: float) -> None:
        if now - self.last_t > 1.0:
            self._row(snap, now)

    def _row(self, snap: Snapshot, now: float) -> None:
        row = cpu_row(self.last, snap, self.last_t - self.t0, now - self.t0, self.ddmd_pid)
        row.queued.update(self.queued)
        row.piped.update(self.piped)
        self.r.cpu_timeline.append(row)
        self.last, self.last_t, self.queued, self.piped = snap, now, {}, {}


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.home = work / "adb-home"
        self.home.mkdir()
        self.ports = Ports()
        self.adb = AdbServer(self.ports.take(), self.home)
        self.adb_pid = 0
        self.device: Child | None = None
        self.serial = ""
        self.browser: Browser | None = None
        self.cpu = CpuWatch()
        self.counter = 0  # the device's next counter

    # ---------------------------------------------------------------- the whole run

    def start(self) -> None:
        self.adb_pid = self.adb.start()
        self.device = Child(
            "device",
            [
                sys.executable,
                str(ROOT / "bench" / "logcat_device.py"),
                "--adb-port",
                str(self.adb.port),
            ],
        )
        self.serial = self.adb.adopt(self.device, WAIT)
        if not self.args.no_page:
            self.browser = Browser()

    def stop(self) -> None:
        if self.browser is not None:
            self.browser.close()
        if self.device is not None:
            self.device.stop()
        self.adb.kill()

    def tell(self, command: str, answer: str, timeout: float = WAIT) -> str:
        assert self.device is not None
        self.device.send(command)
        return self.device.wait_match(answer, timeout)[1].string

    # ---------------------------------------------------------------- one round

    def round(self, number: int) -> Round:
        args = self.args
        r = Round(number)
        self.tell("reset", r"^ok reset")
        config_path = self.work / f"ddmd-{number}.toml"
        control = config(config_path, self.adb.port, self.ports)
        log_path = self.work / f"ddmd-{number}.log"
        followers: list[CliFollower] = []
        page: Page | None = None
        daemon = start_ddmd(config_path, log_path, control)
        ddmd = daemon.child
        try:
            base = daemon.base
            vm_id = f"{self.serial}/{APP_PID}"
            daemon.wait_vm(vm_id, lambda vm: vm.get("app") == APP, timeout=WAIT)
            r.rss_startup = proc.memory_mb(ddmd.pid)[0]
            if self.browser is not None:
                page = Page(self.browser, base, vm_id)
            way = (
                ["--config", str(config_path)]
                if args.cli_socket
                else ["--control", f"{HOST}:{control}"]
            )
            for i in range(args.followers):
                argv = ddmd_argv("logcat", "--all", "--device", self.serial, "--json", *way)
                followers.append(CliFollower(f"cli {i + 1}", argv))
            self._connect(ddmd, followers, page)
            time.sleep(SETTLE)
            self._load(r, ddmd, base, followers, page)
            r.log_events = self._log_events(log_path)
        finally:
            for f in followers:
                f.stop()
            if page is not None:
                page.close()
            daemon.stop()
        return r

    def _connect(self, ddmd: Child, followers: list[CliFollower], page: Page | None) -> None:
        """Marker lines until every viewer showed one."""
        deadline = time.monotonic() + WAIT
        k = 0
        while True:
            ddmd.check_alive()
            for f in followers:
                f.check_alive()
            k += 1
            self.tell(f"mark {k}", rf"^ok mark {k}$")
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                marks = [f.mark for f in followers]
                if page is not None:
                    marks.append(page.progress()["mark"])
                if min(marks, default=k) >= 1:
                    return
                time.sleep(0.05)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the viewers did not all show a marker line (marks {marks})")

    def _roots(self, ddmd: Child, followers: list[CliFollower]) -> None:
        self.cpu.roots = {
            "ddmd": (ddmd.pid, True),
            "adb server": (self.adb_pid, True),
            "device": (self.device.pid if self.device else 0, True),
        }
        for f in followers:
            self.cpu.roots[f.name] = (f.pid, True)
        if self.browser is not None and self.browser.pid:
            self.cpu.roots[PAGE_LABEL] = (self.browser.pid, True)
        if self.browser is not None and self.browser.driver_pid:
            self.cpu.roots["Playwright driver"] = (self.browser.driver_pid, False)
        self.cpu.roots["bench (reader)"] = (os.getpid(), False)

    def _load(
        self,
        r: Round,
        ddmd: Child,
        base: str,
        followers: list[CliFollower],
        page: Page | None,
    ) -> None:
        args = self.args
        assert self.device is not None
        self._roots(ddmd, followers)
        r.rss_before = proc.memory_mb(ddmd.pid)[0]
        before = self.cpu.snapshot()
        t0 = time.monotonic()
        start_ns = time.time_ns()
        self.device.send(f"load {args.seconds:g} {args.rate:g}")
        # During the load: a CPU sample every WINDOW seconds, and the device's answer.
        control = int(base.rsplit(":", 1)[1])
        ticker = Ticker(self, r, t0, before, ddmd.pid, control, followers)
        done: str | None = None
        profiling = False
        while done is None:
            since = time.monotonic() - t0
            if page is not None and args.page_profile:
                if not profiling and not r.page_profile and since >= args.seconds / 2:
                    assert self.browser is not None
                    page.start_profile(self.browser)
                    profiling = True
                elif profiling and since >= args.seconds / 2 + PROFILE_SECONDS:
                    r.page_profile = page.stop_profile()
                    profiling = False
            with contextlib.suppress(queue.Empty):
                _, line = self.device.lines.get(timeout=0.2)
                if line.startswith("done "):
                    done = line
                    break
            self.device.check_alive()
            ddmd.check_alive()
            ticker.tick()
            if time.monotonic() - t0 > args.seconds + WAIT:
                raise TimeoutError("the device did not finish its load")
        sent_end = time.monotonic()
        fields = dict(word.split("=", 1) for word in done.split()[1:])
        r.sent, r.first, r.last = int(fields["sent"]), int(fields["first"]), int(fields["last"])
        r.load_s, r.late_max_ms = float(fields["seconds"]), float(fields["late_max"])
        r.queue_max, r.overflows = int(fields["queue_max"]), int(fields["overflows"])
        if r.first != self.counter:
            print(f"  (note: the device's counter starts at {r.first}, not {self.counter})")
        self.counter = r.last + 1

        # After it: until every viewer has the last line, or nothing moves for QUIET seconds.
        moved, counts = time.monotonic(), None
        while time.monotonic() - sent_end < DRAIN_CAP:
            now_counts = [f.received() for f in followers]
            lasts = [f.counters[-1] if f.counters else -1 for f in followers]
            if page is not None:
                p = page.progress()
                now_counts.append(p["items"])
                lasts.append(p["last"])
            if min(lasts, default=r.last) >= r.last:
                break
            if now_counts != counts:
                counts, moved = now_counts, time.monotonic()
            elif time.monotonic() - moved > QUIET:
                break
            ticker.tick()
            time.sleep(0.1)
        after = self.cpu.snapshot()
        t1 = time.monotonic()
        ticker.finish(after, t1)
        r.window_s = t1 - t0
        r.rss_after, r.hwm = proc.memory_mb(ddmd.pid)
        row = cpu_row(before, after, 0.0, r.window_s, ddmd.pid)
        r.cpu, r.wait, r.machine = row.cpu, row.wait, row.machine
        r.ddmd_main, r.ddmd_main_wait = row.main, row.main_wait
        r.chromium = chromium_split(before, after, r.window_s)
        for f in followers:
            r.viewers.append(self._cli_figures(f, r, start_ns))
        if page is not None:
            r.viewers.append(self._page_figures(page, r, start_ns))
        r.metrics = self._metrics(base)

    def _cli_figures(self, f: CliFollower, r: Round, start_ns: int) -> Viewer:
        v = Viewer(f.name)
        counters = f.counters
        inside = [i for i, n in enumerate(counters) if r.first <= n <= r.last]
        distinct = {counters[i] for i in inside}
        v.received = len(distinct)
        v.missing = (r.last - r.first + 1) - len(distinct)
        v.dups = len(inside) - len(distinct)
        seqs = [f.seqs[i] for i in inside]
        v.seq_gaps = sum(max(0, b - a - 1) for a, b in itertools.pairwise(seqs))
        lat = sorted(f.latency[i] / 1e6 for i in inside)
        v.p50, v.p99 = pct(lat, 50), pct(lat, 99)
        v.max = lat[-1] if lat else float("nan")
        got_last = [f.latency[i] for i in inside if counters[i] == r.last]
        v.last_after = got_last[0] / 1e9 if got_last else None
        ends = [row.end for row in r.cpu_timeline]
        rows: list[list[float]] = [[] for _ in ends]
        for i in inside:
            k = bisect.bisect_right(ends, (f.arrival[i] - start_ns) / 1e9)
            if k < len(rows):
                rows[k].append(f.latency[i] / 1e6)
        for values in rows:
            values.sort()
            v.timeline.append((len(values), pct(values, 50), pct(values, 99)))
        reconnects = [line for line in f.stderr if "reconnect" in line]
        if reconnects:
            v.note = f"{len(reconnects)} stderr line(s) about reconnecting: {reconnects[0][:120]}"
        return v

    def _page_figures(self, page: Page, r: Round, start_ns: int) -> Viewer:
        s = page.summary(start_ns / 1e6, [row.end for row in r.cpu_timeline])
        r.page_status, r.page_rows = s["status"], s["rows"]
        v = Viewer("page")
        v.received = int(s["items"])
        v.missing = (r.last - r.first + 1) - v.received
        v.dups = int(s["dups"])
        v.p50, v.p99, v.max = nan(s["p50"]), nan(s["p99"]), nan(s["max"])
        v.last_after = s["lastLat"] / 1e3 if s["last"] == r.last else None
        v.timeline = [(int(n), nan(a), nan(b)) for n, a, b in s["timeline"]]
        problems = page.problems
        notes = [f"EventSource opened {s['opened']}x"] if s["opened"] != 1 else []
        if problems:
            notes.append(f"{len(problems)} page error(s): {problems[0][:120]}")
        v.note = "; ".join(notes)
        return v

    def _metrics(self, base: str) -> dict[str, float]:
        """ddmd's logcat figures on /metrics, if it has any."""
        out: dict[str, float] = {}
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(base + "/metrics", timeout=10, trust_env=False).text
            for line in text.splitlines():
                if line.startswith("#") or "logcat" not in line:
                    continue
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
        return out

    @staticmethod
    def _log_events(path: Path) -> Counter[str]:
        """ddmd's log events about device logs (and any warning or error)."""
        found: Counter[str] = Counter()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                record = json.loads(line)
                event = str(record.get("event", ""))
                level = str(record.get("level", ""))
                if "logcat" in event or level in ("warning", "error", "critical"):
                    extra = record.get("problem") or ""
                    found[f"{event}{' ' + extra if extra else ''} ({level})"] += 1
        return found


# --------------------------------------------------------------------------------------------
# Report


def show_round(r: Round, args: argparse.Namespace) -> list[str]:
    out = [f"round {r.number}:"]
    rate = r.sent / r.load_s if r.load_s else 0
    out.append(
        f"  device: logged {r.sent:,} lines in {r.load_s:.2f} s ({rate:,.0f}/s); its own ticks "
        f"late by at most {r.late_max_ms:.1f} ms; most bytes waiting for the adb stream "
        f"{r.queue_max / 1e6:.2f} MB; readers closed for lagging: {r.overflows}"
    )
    out.append(
        f"  ddmd: CPU {r.cpu.get('ddmd', 0):.1f} % of a core (its main thread {r.ddmd_main:.1f} "
        f"%, which also waited for a CPU {r.ddmd_main_wait:.1f} % of the time) over "
        f"{r.window_s:.1f} s (load start -> every viewer done); RSS {r.rss_startup:.1f} MB after "
        f"start-up, {r.rss_before:.1f} MB before the load, {r.rss_after:.1f} MB after (peak "
        f"{r.hwm:.1f} MB)"
    )
    out.append(
        f"  {'viewer':<8}{'received':>11}{'lost':>9}{'dups':>6}{'seq gaps':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}  last line's latency"
    )
    for v in r.viewers:
        gaps = "-" if v.seq_gaps is None else f"{v.seq_gaps:,}"
        last = "never came" if v.last_after is None else f"{v.last_after:.2f} s"
        out.append(
            f"  {v.name:<8}{v.received:>11,}{v.missing:>9,}{v.dups:>6,}{gaps:>10}"
            f"{v.p50:>9.1f}{v.p99:>9.1f}{v.max:>9.1f}  {last}"
        )
        if v.note:
            out.append(f"    {v.name}: {v.note}")
    ours = sum(r.cpu.values())
    cores = 100 * (os.cpu_count() or 1)
    out.append(
        "  CPU, % of a core over the window (run-queue wait, i.e. runnable without a CPU, in "
        "brackets): " + ", ".join(f"{k} {v:.1f} ({r.wait.get(k, 0):.1f})" for k, v in r.cpu.items())
    )
    out.append(
        f"  the bench's processes {ours:.0f} % of {cores} %; the whole machine {r.machine:.0f} % "
        f"(so {max(0.0, r.machine - ours):.0f} % was others')"
    )
    if r.cpu_timeline:
        out.append(
            "  timeline: ddmd CPU % (its main thread's wait for a CPU), the machine's busy %, then "
            "per viewer: lines/s received, p50/p99 latency ms, q: most kB of ddmd's answers "
            "queued in the kernel toward it (sent by ddmd, not yet read by the viewer), p: most "
            "kB of a CLI's output not yet read by this bench (its pipe holds 64)"
        )
        for row, k in zip(r.cpu_timeline, range(len(r.cpu_timeline)), strict=True):
            span = row.end - row.start
            parts = []
            for v in r.viewers:
                n, p50, p99 = v.timeline[k] if k < len(v.timeline) else (0, nan(None), nan(None))
                q = row.queued.get(v.name, 0) / 1e3
                piped = row.piped.get(v.name)
                pipe = "" if piped is None else f" p{piped / 1e3:>3.0f}"
                parts.append(
                    f"{v.name} {n / span:>6,.0f}/s {p50:>6.0f}/{p99:>6.0f} q{q:>5.0f}{pipe}"
                )
            out.append(
                f"    {row.start:3.0f}-{row.end:3.0f} s  ddmd {row.cpu.get('ddmd', 0):3.0f} "
                f"({row.main_wait:2.0f})  machine {row.machine:3.0f}  " + "  ".join(parts)
            )
    if r.page_status:
        out.append(f"  page: the panel says {r.page_status!r}; {r.page_rows} row elements")
    if r.chromium:
        out.append(
            "  page's Chromium by process, % of a core: "
            + ", ".join(f"{k} {v:.1f}" for k, v in r.chromium.items())
        )
    out.extend(r.page_profile)
    if r.metrics:
        out.append("  ddmd /metrics: " + ", ".join(f"{k} {v:g}" for k, v in r.metrics.items()))
    else:
        out.append("  ddmd /metrics: no logcat figures (ddmd exposes none)")
    if r.log_events:
        out.append("  ddmd's log: " + ", ".join(f"{k} x{n}" for k, n in r.log_events.most_common()))
    else:
        out.append("  ddmd's log: no logcat event, no warning or error")
    del args
    return out


def show_summary(rounds: list[Round]) -> list[str]:
    out = [f"median over {len(rounds)} rounds (min-max):"]
    out.append(
        f"  ddmd CPU % of a core: {med([r.cpu.get('ddmd', 0) for r in rounds])}; its main thread "
        f"{med([r.ddmd_main for r in rounds])}, waiting for a CPU "
        f"{med([r.ddmd_main_wait for r in rounds])}; the machine busy "
        f"{med([r.machine for r in rounds], '.0f')} of {100 * (os.cpu_count() or 1)}"
    )
    out.append(
        f"  ddmd RSS MB: before {med([r.rss_before for r in rounds])}, after "
        f"{med([r.rss_after for r in rounds])}, peak {med([r.hwm for r in rounds])}"
    )
    names = [v.name for v in rounds[0].viewers]
    for name in names:
        vs = [v for r in rounds for v in r.viewers if v.name == name]
        out.append(
            f"  {name}: lost {med([v.missing for v in vs], ',.0f')}, p50 ms "
            f"{med([v.p50 for v in vs])}, "
            f"p99 ms {med([v.p99 for v in vs])}"
        )
    labels = list(rounds[0].cpu)
    out.append(
        "  CPU % of a core: "
        + "; ".join(f"{k} {med([r.cpu.get(k, 0) for r in rounds])}" for k in labels)
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="load per round (60)")
    parser.add_argument("--rate", type=float, default=20000.0, help="lines a second (20000)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (1; 3 with --seconds 20)")
    parser.add_argument("--followers", type=int, default=2, help="CLI followers (2)")
    parser.add_argument("--no-page", action="store_true", help="no web page")
    parser.add_argument(
        "--page-profile",
        action="store_true",
        help="profile the page for a few seconds in the middle of the load (DevTools)",
    )
    parser.add_argument(
        "--cli-socket",
        action="store_true",
        help="the CLIs reach ddmd by its control unix socket (--config) instead of --control",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.rate <= 0:
        parser.error("--rounds, --seconds and --rate must be positive")
    if shutil.which("adb") is None:
        raise SystemExit("logcat bench: needs adb (apt-get install adb)")
    if not args.no_page and not CHROMIUM.exists():
        raise SystemExit(f"logcat bench: needs {CHROMIUM} (or --no-page)")

    print(
        f"bench/logcat.py: {args.rate:,.0f} lines/s for {args.seconds:g} s x {args.rounds} "
        f"round(s); {args.followers} CLI follower(s) (ddmd logcat --all --json, "
        f"{'unix socket' if args.cli_socket else '--control TCP'})"
        + ("" if args.no_page else ", 1 web page (Logcat panel, whole device)")
    )
    print(f"  code: {code_state()}")
    print(f"  machine: {machine()}")
    rounds: list[Round] = []
    work = Path(tempfile.mkdtemp(prefix="ddmd-bench-logcat-"))
    bench = Bench(args, work)
    try:
        bench.start()
        print(
            f"  device {bench.serial} through adb server port {bench.adb.port}"
            + (f"; Chromium {bench.browser.version}" if bench.browser else "")
        )
        for n in range(1, args.rounds + 1):
            r = bench.round(n)
            rounds.append(r)
            print("\n".join(show_round(r, args)), flush=True)
        if len(rounds) > 1:
            print("\n".join(show_summary(rounds)))
    finally:
        bench.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
