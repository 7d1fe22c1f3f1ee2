"""The simulated VM's heap: a few MB of objects, class objects, arrays and free gaps, laid out
as heap segment pieces (protocol.md 3.4 / 4), mutated a little at every GC, and encoded as the
heap info (HPIF) and segment dump (HPST, HPSG/HPSO, HPEN) chunks.

Layer: imports `ddmd.protocol.ddm` and `sim.config`; no I/O (the caller pushes the chunks).
Heap figures agree with the layout: HPIF's *bytes allocated* is exactly the used bytes of the
pieces a dump would send, *objects allocated* their number of used logical runs.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.ddm import (
    ChunkType,
    HeapEnd,
    HeapInfo,
    HeapInfoEntry,
    HeapStart,
    NativeHeapEnd,
    NativeHeapStart,
    encode_chunk,
)
from ddmd.sim.config import U4_MASK

__all__ = [
    "HeapPiece",
    "build_heap",
    "dump_chunks",
    "heap_info_chunk",
    "mutate_piece",
    "native_dump_chunks",
]

# Heap geometry (protocol.md 3.4 / 4).
_SEGMENT_HEAD = struct.Struct(">IBIII")
_HEAP_BASE: Final = 0x12C00000
_UNIT: Final = 8
_HEAP_ID: Final = 1
_MAX_CHUNK: Final = 16368  # a whole HPSG chunk, 8-byte header included, stays within this
_MAX_PAIRS: Final = (_MAX_CHUNK - 8 - _SEGMENT_HEAD.size) // 2
_HARD: Final = 1
_PARTIAL: Final = 0x80
_CHUNK_HEADER = struct.Struct(">II")


@dataclass(slots=True)
class HeapPiece:
    start: int  # address of the piece (shipped) or of the whole heap (draft)
    offset: int  # in units; 0 in the shipped layout
    units: int
    usage: bytearray  # (state, n) pairs
    used_units: int = 0  # units of every non-free run
    objects: int = 0  # non-free logical runs (P pieces joined): one per object

    def __post_init__(self) -> None:
        self.recount()

    def recount(self) -> None:
        """Work out ``used_units`` and ``objects`` from the pairs (once, at build time)."""
        used = objects = 0
        continued = False  # the previous pair had P set: this pair continues its run
        usage = self.usage
        for state, n in zip(usage[0::2], usage[1::2], strict=True):
            if state & 0x07:
                used += n + 1
                if not continued:
                    objects += 1
            continued = bool(state & _PARTIAL)
        self.used_units, self.objects = used, objects

    def data(self) -> bytes:
        return _SEGMENT_HEAD.pack(_HEAP_ID, _UNIT, self.start, self.offset, self.units) + bytes(
            self.usage
        )


def _draw_allocation(rng: random.Random) -> tuple[int, int]:
    """One allocation: (state byte without P, units). Sizes in 8-byte units."""
    r = rng.random()
    if r < 0.50:  # plain objects: 16-128 bytes, a few bigger
        kind, units = 0, min(64, 2 + int(rng.expovariate(0.3)))
    elif r < 0.53:  # class objects
        kind, units = 1, rng.randint(12, 120)
    elif r < 0.65:  # byte[] / boolean[]: buffers, sometimes large (bitmaps, I/O buffers)
        kind = 2
        units = rng.randint(257, 2600) if rng.random() < 0.012 else rng.randint(2, 64)
    elif r < 0.82:  # char[] / short[]: string bodies
        kind = 3
        units = rng.randint(300, 1200) if rng.random() < 0.004 else rng.randint(3, 40)
    elif r < 0.96:  # int[] / float[] / Object[]
        kind = 4
        units = rng.randint(257, 1024) if rng.random() < 0.01 else rng.randint(2, 40)
    else:  # long[] / double[]
        kind = 5
        units = rng.randint(257, 700) if rng.random() < 0.01 else rng.randint(2, 24)
    return (kind << 3) | _HARD, units


def _append_run(out: bytearray, state: int, units: int) -> None:
    """Encode one run: 256-unit pieces with P set, then the rest without (protocol.md 4.2)."""
    while units > 256:
        out += bytes((state | _PARTIAL, 255))
        units -= 256
    out += bytes((state, units - 1))


def _pairs_for(units: int) -> int:
    return (units + 255) // 256


def build_heap(rng: random.Random, heap_bytes: int, *, draft: bool) -> list[HeapPiece]:
    """A few-MB heap of objects, class objects, arrays of each width and free gaps.

    Pieces are contiguous, each at most ``_MAX_CHUNK`` bytes as a whole chunk; every piece
    ends with an allocation (no free space at the end, no split run across pieces). The
    shipped layout gives each piece its own start address with offset 0; the draft layout
    gives them all the heap's start address and an offset in units.
    """
    total = heap_bytes // _UNIT
    pieces: list[HeapPiece] = []
    done = 0
    while done < total:
        usage = bytearray()
        units = 0
        budget = min(_MAX_PAIRS, 8192)
        while done + units < total:
            left = total - done - units
            gap = 0
            g = rng.random()
            if g < 0.05:
                gap = rng.randint(1, 48)
            elif g < 0.0515:
                gap = rng.randint(257, 2000)
            state, size = _draw_allocation(rng)
            if gap >= left:
                gap = 0
            size = min(size, left - gap)
            need = (_pairs_for(gap) if gap else 0) + _pairs_for(size)
            if len(usage) // 2 + need > budget:
                if gap:  # try without the gap
                    gap, need = 0, _pairs_for(size)
                    if len(usage) // 2 + need <= budget:
                        _append_run(usage, state, size)
                        units += size
                        continue
                break
            if gap:
                _append_run(usage, 0, gap)
            _append_run(usage, state, size)
            units += gap + size
        if draft:
            pieces.append(HeapPiece(_HEAP_BASE, done, units, usage))
        else:
            pieces.append(HeapPiece(_HEAP_BASE + done * _UNIT, 0, units, usage))
        done += units
    return pieces


def mutate_piece(rng: random.Random, piece: HeapPiece) -> None:
    """Light GC churn inside one piece: free ~1% of its runs, or reuse a gap.

    Only single-pair runs are touched (never a P piece or the pair after one), never the
    last pair (a piece ends with an allocation), and unit counts never change, so the
    piece always satisfies the parse rule of protocol.md 4.3. The piece's used units and
    object count follow every change.
    """
    usage = piece.usage
    pairs = len(usage) // 2
    if pairs < 3:
        return
    for _ in range(max(1, pairs // 100)):
        i = rng.randrange(1, pairs - 1)
        state = usage[2 * i]
        if state & _PARTIAL or usage[2 * i - 2] & _PARTIAL:
            continue
        units = usage[2 * i + 1] + 1
        if state & 0x07:
            usage[2 * i] = 0  # the object died: a free gap
            piece.used_units -= units
            piece.objects -= 1
        else:
            usage[2 * i] = (rng.choice((0, 0, 2, 3, 4)) << 3) | _HARD  # a new allocation
            piece.used_units += units
            piece.objects += 1


def heap_info_chunk(pieces: Sequence[HeapPiece], reason: int) -> bytes:
    """HPIF data for the heap as it is now: the very layout a segment dump would send."""
    size = sum(p.units for p in pieces) * _UNIT
    allocated = sum(p.used_units for p in pieces) * _UNIT
    entry = HeapInfoEntry(
        heap_id=_HEAP_ID,
        timestamp_ms=int(time.time() * 1000),
        reason=reason,
        max_size=min(max(256 << 20, size), U4_MASK),
        size=size & U4_MASK,
        bytes_allocated=allocated & U4_MASK,
        objects_allocated=sum(p.objects for p in pieces) & U4_MASK,
    )
    return encode_chunk(HeapInfo((entry,)))


def dump_chunks(pieces: Sequence[HeapPiece], *, objects: bool) -> Iterator[bytes]:
    """One heap segment dump: HPST, one HPSG chunk a piece (HPSO with ``objects``), HPEN."""
    seg_type = ChunkType.HPSO if objects else ChunkType.HPSG
    yield encode_chunk(HeapStart(_HEAP_ID))
    for piece in pieces:
        data = piece.data()
        yield _CHUNK_HEADER.pack(seg_type, len(data)) + data
    yield encode_chunk(HeapEnd(_HEAP_ID))


def native_dump_chunks() -> tuple[bytes, bytes]:
    """A native heap dump: ART never walks the native heap, so only its start and end."""
    return encode_chunk(NativeHeapStart(_HEAP_ID)), encode_chunk(NativeHeapEnd(_HEAP_ID))
