"""A method trace's report as plain JSON data: what ``ddmd trace-report --json`` prints and the
control API sends after a trace (``POST /api/v1/vms/ID/trace/stop``).

Layer: ``ddmd.protocol.trace`` only (sans-IO).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ddmd.protocol.trace.profile import MethodStats, TraceProfile, top_methods

__all__ = ["report_json"]


def _times(values: Sequence[int], clocks: Sequence[str]) -> dict[str, int]:
    return dict(zip(clocks, values, strict=True))


def _method_json(stats: MethodStats, clocks: Sequence[str]) -> dict[str, Any]:
    method = stats.method
    return {
        "method": method.full_name,
        "class": method.class_name,
        "name": method.name,
        "signature": method.signature,
        "source": method.source,
        "calls": stats.calls,
        "recursive_calls": stats.recursive_calls,
        "inclusive_usec": _times(stats.inclusive, clocks),
        "exclusive_usec": _times(stats.exclusive, clocks),
    }


def _ranking(
    stats: Sequence[MethodStats], clock: int, top: int, clocks: Sequence[str]
) -> dict[str, Any]:
    limit = top or None  # 0: every method
    return {
        "methods": sum(1 for s in stats if s.calls or any(s.exclusive)),
        "by_inclusive": [
            _method_json(s, clocks) for s in top_methods(stats, "inclusive", clock, limit)
        ],
        "by_exclusive": [
            _method_json(s, clocks) for s in top_methods(stats, "exclusive", clock, limit)
        ],
    }


def report_json(profile: TraceProfile, *, top: int, file: str) -> dict[str, Any]:
    """The report as plain JSON data (what ``--json`` prints); ``top=0`` lists every method."""
    clocks = profile.clocks
    clock = profile.time_clock
    header = profile.header
    threads = sorted(profile.threads, key=lambda t: (-t.total[clock], t.thread.tid))
    return {
        "file": file,
        "format": {
            "version": profile.data.version,
            "streaming": profile.data.streaming,
            "clock": profile.clock,
            "clocks": list(clocks),
            "record_size": profile.data.record_size,
        },
        "vm": header.vm if header else None,
        "pid": header.pid if header else None,
        "start_usec": profile.data.start_usec,
        "elapsed_usec": header.elapsed_usec if header else None,
        "overflow": header.overflow if header else False,
        "records": profile.records,
        "sort_clock": clocks[clock],
        "top": top,
        "all_threads": {
            "total_usec": _times(profile.total, clocks),
            **_ranking(profile.methods, clock, top, clocks),
        },
        "threads": [
            {
                "tid": t.thread.tid,
                "name": t.thread.name,
                "records": t.records,
                "total_usec": _times(t.total, clocks),
                "unmatched_exits": t.unmatched_exits,
                "open_calls": t.open_calls,
                **_ranking(t.methods, clock, top, clocks),
            }
            for t in threads
        ],
    }
