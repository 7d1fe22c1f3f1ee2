"""The JSON shapes of the control API for values that are not snapshots: thread lists, stack
frames, heap images and their summaries (snapshots carry their own ``to_json``).

Layer: imports the value types of `protocol.ddm`, `protocol.heap` and `registry`; pure
functions, no I/O. Used by `control.app`.
"""

from __future__ import annotations

from typing import Any

from ddmd.protocol.ddm import StackFrame, StackTrace
from ddmd.protocol.heap import HeapImage, HeapSummary, Kind, Segment, Solidity
from ddmd.registry import VmSnapshot

__all__ = ["frame_json", "image_json", "segment_json", "stack_json", "summary_json", "threads_json"]


def threads_json(snapshot: VmSnapshot) -> list[dict[str, Any]] | None:
    if snapshot.threads is None:
        return None
    return [t.to_json() for t in snapshot.threads]


def frame_json(frame: StackFrame) -> dict[str, Any]:
    return {
        "class_name": frame.class_name,
        "method_name": frame.method_name,
        "file_name": frame.file_name,
        "line": frame.line,
    }


def stack_json(trace: StackTrace) -> list[dict[str, Any]]:
    return [frame_json(f) for f in trace.frames]


def _enum_name(value: int) -> str:
    """`Kind.ARRAY_1` -> "array_1"; an undefined value (solidity 7) -> "7"."""
    return value.name.lower() if isinstance(value, Kind | Solidity) else str(int(value))


def summary_json(summary: HeapSummary) -> dict[str, Any]:
    return {
        "heap_id": summary.heap_id,
        "unit_size": summary.unit_size,
        "segment_count": summary.segment_count,
        "bytes_used": summary.bytes_used,
        "bytes_free": summary.bytes_free,
        "bytes_by_kind": {_enum_name(k): n for k, n in summary.bytes_by_kind},
        "bytes_by_solidity": {_enum_name(s): n for s, n in summary.bytes_by_solidity},
        "object_count": summary.object_count,
        "largest_free_run": summary.largest_free_run,
        "free_run_count": summary.free_run_count,
        "fragmentation": summary.fragmentation,
        "span": None if summary.span is None else list(summary.span),
    }


def segment_json(segment: Segment) -> dict[str, Any]:
    return {
        "address": segment.address,
        "end": segment.end,
        "unit_size": segment.unit_size,
        "units": segment.units,
        "runs": [[r.address, r.units, int(r.kind), int(r.solidity)] for r in segment.runs()],
    }


def image_json(image: HeapImage, *, segments: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "heap_id": image.heap_id,
        "native": image.native,
        "complete": image.complete,
        "data_kind": None if image.data_kind is None else image.data_kind.name,
        "summary": summary_json(image.summary()),
        "problems": [{"code": p.code.value, "message": p.message} for p in image.problems],
    }
    if segments:
        out["segments"] = [segment_json(s) for s in image.segments]
    return out
