"""Paired rounds and their report. The machine's speed drifts (by up to a third between
minutes), so the paths compared are measured in the same round, interleaved, and every ratio
is a per-round paired ratio; a figure is the median over rounds with its min-max, never one
round's value.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def span(values: Sequence[float], fmt: str = ".1f", sep: str = "-") -> str:
    """median (min-max)"""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}{sep}{max(values):{fmt}})"


def paired(a: float, b: float) -> float | None:
    """a / b. When b is not positive (noise: a reference's hop can be), inf if a is positive, a
    round that counts against the one measured, else None (the round has no ratio)."""
    if b > 0:
        return a / b
    return float("inf") if a > 0 else None


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """The per-round ratios a / b of two paths' figures, round by round."""
    return [x / y for x, y in zip(a, b, strict=True)]


def agreed(values: Sequence[float], target: float) -> str:
    """PASS / MISS when every round's ratio agrees (<= ``target``); otherwise no verdict."""
    within = sum(r <= target for r in values)
    if within == len(values):
        return "PASS"
    if within == 0:
        return "MISS"
    return f"no verdict ({within} of {len(values)} rounds within)"


def by_median(values: Sequence[float], target: float) -> str:
    """PASS when the median ratio is <= ``target`` (PASS*: some round's was over), else FAIL."""
    if statistics.median(values) > target:
        return "FAIL"
    return "PASS*" if max(values) > target else "PASS"


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (q in 10..90, a multiple of 10); the value itself when alone."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[q // 10 - 1]


def alternating(paths: Sequence[T], n: int) -> Iterator[T]:
    """``n`` turns of every path, the order reversed every other turn: A B B A A B ..."""
    for i in range(n):
        yield from paths if i % 2 == 0 else paths[::-1]


def rotated(items: Sequence[T], r: int) -> list[T]:
    """``items`` rotated by ``r``: round r starts with a different one."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


def print_report(lines: Sequence[str], started: float | None = None) -> None:
    """The report's lines, flushed one by one; with ``started`` (time.monotonic()), then the
    run's total time."""
    for line in lines:
        print(line, flush=True)
    if started is not None:
        print(f"total {time.monotonic() - started:.0f} s", flush=True)
