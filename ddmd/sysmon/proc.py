"""This machine's load, memory and CPU use, read from ``/proc`` (Linux), as `SystemReport`s.

Layer: standard library and `ddmd.sysmon.chunk`. The ``parse_*`` functions take the files' text
(tested against fixed text and against this machine's files); `Sampler` reads the files, which
blocks for a moment: call it from a worker thread inside trio.

- ``/proc/loadavg``: "1.02 0.72 0.69 3/89 26416": the 1, 5 and 15 minute load averages first.
- ``/proc/meminfo``: "MemTotal:  24683656 kB" lines; the figures are in KiB.
- ``/proc/stat``: "cpu0 user nice system idle iowait irq softirq steal guest guest_nice", in
  clock ticks since boot. A CPU's busy share between two samples is 1 - (idle + iowait) / total
  of the tick increments, where total sums the first eight fields (guest time is already
  counted in user and nice). Offline CPUs have no line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ddmd.sysmon.chunk import SystemReport, thousandths

__all__ = [
    "CpuTimes",
    "Sampler",
    "busy_shares",
    "parse_loadavg",
    "parse_meminfo",
    "parse_stat",
]

PROC: Final = Path("/proc")
_STAT_FIELDS: Final = 8  # user nice system idle iowait irq softirq steal


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """The three load averages of ``/proc/loadavg``. Raises ValueError on other text."""
    fields = text.split()
    try:
        loads = tuple(float(f) for f in fields[:3])
    except ValueError:
        raise ValueError(f"/proc/loadavg: not three numbers: {text[:80]!r}") from None
    if len(loads) != 3 or any(not value >= 0 for value in loads):
        raise ValueError(f"/proc/loadavg: not three load averages: {text[:80]!r}")
    return (loads[0], loads[1], loads[2])


def parse_meminfo(text: str) -> dict[str, int]:
    """Every "Name: value [kB]" line of ``/proc/meminfo`` as name -> value (KiB where the line
    says kB). Lines that do not have that shape are skipped."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts or not parts[0].isdigit():
            continue
        out[name.strip()] = int(parts[0])
    return out


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One CPU's clock ticks since boot: all of them, and those spent idle (idle + iowait)."""

    total: int
    idle: int

    @property
    def busy(self) -> int:
        return self.total - self.idle


def parse_stat(text: str) -> dict[int, CpuTimes]:
    """The per-CPU lines (``cpu0``, ``cpu1``, ...) of ``/proc/stat``, by CPU number. The
    ``cpu`` line (all CPUs together) and malformed lines are left out."""
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        number = name[3:]
        if not number.isdigit() or len(fields) < 4:
            continue
        try:
            ticks = [int(f) for f in fields[:_STAT_FIELDS]]
        except ValueError:
            continue
        ticks += [0] * (_STAT_FIELDS - len(ticks))  # old kernels have fewer fields
        out[int(number)] = CpuTimes(total=sum(ticks), idle=ticks[3] + ticks[4])
    return out


def busy_shares(
    before: Mapping[int, CpuTimes], after: Mapping[int, CpuTimes]
) -> tuple[float | None, ...]:
    """Each CPU of ``after`` (in CPU number order): its busy share 0.0-1.0 since ``before``;
    None when ``before`` lacks it, no tick passed, or its counters went back."""
    shares: list[float | None] = []
    for number in sorted(after):
        old, new = before.get(number), after[number]
        if old is None:
            shares.append(None)
            continue
        total = new.total - old.total
        busy = new.busy - old.busy
        if total <= 0 or busy < 0 or busy > total:
            shares.append(None)
        else:
            shares.append(busy / total)
    return tuple(shares)


class Sampler:
    """Builds reports from ``/proc``, each CPU figure covering the time since the previous report
    (or since the sampler was made, for the first one).

    ``proc`` is the directory to read (a copy of ``/proc`` in tests); ``wall`` gives the report
    timestamp (seconds since the epoch) and ``monotonic`` measures the CPU sample period.
    Reading raises OSError when a file cannot be read and ValueError when loadavg is malformed.
    """

    def __init__(
        self,
        proc: Path = PROC,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = proc
        self._wall = wall
        self._monotonic = monotonic
        self._cpus = self._read_cpus()
        self._cpus_at = monotonic()

    def _read(self, name: str) -> str:
        return (self._proc / name).read_text(encoding="ascii", errors="replace")

    def _read_cpus(self) -> dict[int, CpuTimes]:
        return parse_stat(self._read("stat"))

    def report(self) -> SystemReport:
        """A report now; the CPU figures cover the time since the previous one."""
        loads = parse_loadavg(self._read("loadavg"))
        memory = parse_meminfo(self._read("meminfo"))
        cpus = self._read_cpus()
        now = self._monotonic()
        shares = busy_shares(self._cpus, cpus)
        period = max(0.0, now - self._cpus_at)
        self._cpus, self._cpus_at = cpus, now
        return SystemReport(
            timestamp_ms=max(0, int(self._wall() * 1000)),
            load1=thousandths(loads[0]),
            load5=thousandths(loads[1]),
            load15=thousandths(loads[2]),
            mem_total=memory.get("MemTotal"),
            mem_available=memory.get("MemAvailable"),
            mem_free=memory.get("MemFree"),
            swap_total=memory.get("SwapTotal"),
            swap_free=memory.get("SwapFree"),
            cpu_period_ms=thousandths(period),
            cpu_busy=tuple(None if s is None else thousandths(s, 1000) for s in shares),
        )
