"""What the benches read in /proc: the CPU of whole process trees from
/proc/PID/task/*/schedstat (nanoseconds, every thread of the process and its descendants,
children found through /proc/PID/task/*/children), utime/stime ticks, VmRSS/VmHWM, the
machine's busy ticks, listening sockets, and the adb server's pid.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
MB = 1_000_000

#: (pid, tid) -> (run ns, run-queue wait ns): the first two fields of schedstat.
Threads = dict[tuple[int, int], tuple[int, int]]


def tree_tids(pid: int, tree: bool = True) -> Iterator[tuple[int, int]]:
    """(pid, tid) of every thread of ``pid`` and, with ``tree``, of its descendants."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            yield p, int(tid)
            if tree:
                with contextlib.suppress(OSError):
                    kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                    todo.extend(int(k) for k in kids)


def schedstat(pid: int, tree: bool = True) -> Threads:
    """(run, wait) in ns of every thread of ``pid`` (and its tree), by (pid, tid). The wait
    is time the thread was runnable but had no CPU."""
    out: Threads = {}
    for p, tid in tree_tids(pid, tree):
        with contextlib.suppress(OSError, ValueError, IndexError):
            run, wait = Path(f"/proc/{p}/task/{tid}/schedstat").read_text().split()[:2]
            out[(p, tid)] = (int(run), int(wait))
    return out


def trees(roots: Iterable[int], tree: bool = True) -> Threads:
    """``schedstat`` of several roots in one table."""
    out: Threads = {}
    for root in roots:
        out.update(schedstat(root, tree))
    return out


def snapshot(watch: Mapping[str, Sequence[int]], flat: Iterable[str] = ()) -> dict[str, Threads]:
    """Every label's threads: the whole trees of its pids (only the pids' own threads for a
    label in ``flat``)."""
    single = set(flat)
    return {label: trees(pids, label not in single) for label, pids in watch.items()}


def spent(before: Threads, after: Threads, field: int = 0) -> int:
    """ns of run time (``field`` 1: run-queue wait) over every thread in ``after``; a thread
    new since ``before`` counts from 0 (one that ended meanwhile is not counted)."""
    return sum(now[field] - before.get(key, (0, 0))[field] for key, now in after.items())


def spent_by_label(
    before: Mapping[str, Threads], after: Mapping[str, Threads], field: int = 0
) -> dict[str, int]:
    """``spent`` for every label of ``after``."""
    return {label: spent(before.get(label, {}), now, field) for label, now in after.items()}


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of a process, all its threads, in clock ticks (/proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]), int(fields[12])


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot (/proc/stat; idle = idle + iowait;
    guest time is already inside user)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


def status_kb(pid: int, key: str) -> int:
    """A field of /proc/PID/status in kB (VmRSS, VmHWM, RssAnon, ...); 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB (10**6 bytes)."""
    return status_kb(pid, "VmRSS") * 1024 / MB, status_kb(pid, "VmHWM") * 1024 / MB


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB (kB / 1024)."""
    return status_kb(pid, "VmRSS") / 1024, status_kb(pid, "VmHWM") / 1024


def listening(ports: Iterable[int]) -> set[int]:
    """Which of ``ports`` have a socket in LISTEN state on 127.0.0.1 (/proc/net/tcp)."""
    wanted = {f"0100007F:{p:04X}": p for p in ports}
    out = set()
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            f = line.split()
            if f[3] == "0A" and f[1] in wanted:
                out.add(wanted[f[1]])
    return out


def find_adb_server(port: int) -> int:
    """The pid of the adb server listening on tcp:``port`` (its command line says so)."""
    mark = f"tcp:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                text = [w.decode(errors="replace") for w in words]
                if "fork-server" in text and mark in text:
                    return int(entry)
        time.sleep(0.1)
    raise RuntimeError(f"no adb server process for {mark}")
