"""Heap segments (HPSG/HPSO/NHSG): decoding (``segments``) and the assembly of one dump's
segments into an image (``images``). Everything is importable as ``ddmd.protocol.heap.NAME``.

Layer: ``protocol`` (sans-IO, standard library only).
"""

from ddmd.protocol.heap.images import HeapAssembler, HeapImage, HeapProblem, ProblemCode
from ddmd.protocol.heap.segments import (
    HEADER_SIZE,
    KIND_MASK,
    KIND_SHIFT,
    MAX_PAIR_UNITS,
    PARTIAL,
    SOLIDITY_MASK,
    UNUSED,
    HeapSummary,
    Kind,
    Run,
    Segment,
    SegmentKind,
    Solidity,
    decode_runs,
    parse_segment_data,
)

__all__ = [
    "HEADER_SIZE",
    "KIND_MASK",
    "KIND_SHIFT",
    "MAX_PAIR_UNITS",
    "PARTIAL",
    "SOLIDITY_MASK",
    "UNUSED",
    "HeapAssembler",
    "HeapImage",
    "HeapProblem",
    "HeapSummary",
    "Kind",
    "ProblemCode",
    "Run",
    "Segment",
    "SegmentKind",
    "Solidity",
    "decode_runs",
    "parse_segment_data",
]
