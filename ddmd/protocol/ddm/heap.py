"""Heap chunks: HPIF, HPSG/HPSO/NHSG, HPST/HPEN/NHST/NHEN, HPGC, HPDU, HPDS and NHGT. Run-length
decoding of segment data lives in ``ddmd.protocol.heap``."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Self

from ddmd.protocol.ddm.base import (
    _U1,
    _U4,
    Chunk,
    ChunkType,
    _check_bytes,
    _check_str,
    _check_tuple,
    _check_unsigned,
    _EmptyChunk,
    _HeapIdChunk,
    _OpaqueChunk,
    _Reader,
    _str16,
)

_HPIF_ENTRY = struct.Struct(">IQBIIII")  # 29 bytes
_SEGMENT_HEAD = struct.Struct(">IBIII")  # 17 bytes


@dataclass(frozen=True, slots=True)
class HeapInfoRequest(Chunk):
    """HPIF to the VM: u1 when (0 never, 1 now, 2 next GC, 3 every GC)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPIF
    when: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "when", self.when, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.when)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("when"))


@dataclass(frozen=True, slots=True)
class HeapInfoEntry:
    """One heap of an HPIF push. Sizes are u4 (the VM truncates them to 32 bits)."""

    heap_id: int
    timestamp_ms: int
    reason: int
    max_size: int
    size: int
    bytes_allocated: int
    objects_allocated: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "heap_id", self.heap_id, 4)
        _check_unsigned(self, "timestamp_ms", self.timestamp_ms, 8)
        _check_unsigned(self, "reason", self.reason, 1)
        _check_unsigned(self, "max_size", self.max_size, 4)
        _check_unsigned(self, "size", self.size, 4)
        _check_unsigned(self, "bytes_allocated", self.bytes_allocated, 4)
        _check_unsigned(self, "objects_allocated", self.objects_allocated, 4)


@dataclass(frozen=True, slots=True)
class HeapInfo(Chunk):
    """HPIF pushed by the VM: u4 heap count, count x 29-byte entries."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPIF
    heaps: tuple[HeapInfoEntry, ...]

    def __post_init__(self) -> None:
        _check_tuple(self, "heaps", self.heaps, HeapInfoEntry, 0xFFFFFFFF)

    def encode_data(self) -> bytes:
        parts = [_U4.pack(len(self.heaps))]
        parts.extend(
            _HPIF_ENTRY.pack(
                h.heap_id,
                h.timestamp_ms,
                h.reason,
                h.max_size,
                h.size,
                h.bytes_allocated,
                h.objects_allocated,
            )
            for h in self.heaps
        )
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        count = r.u4("heap count")
        if r.remaining != count * _HPIF_ENTRY.size:
            raise r.error(
                f"heap count {count} needs {count * _HPIF_ENTRY.size} bytes after offset 4, "
                f"got {r.remaining}"
            )
        return cls(
            tuple(HeapInfoEntry(*r.unpack(_HPIF_ENTRY, f"heap [{i}]")) for i in range(count))
        )


@dataclass(frozen=True, slots=True)
class _SegmentRequest(Chunk):
    when: int
    what: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "when", self.when, 1)
        _check_unsigned(self, "what", self.what, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.when) + _U1.pack(self.what)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("when"), r.u1("what"))


@dataclass(frozen=True, slots=True)
class HeapSegmentRequest(_SegmentRequest):
    """HPSG to the VM: u1 when (0 off, 1 every GC), u1 what (0 HPSG data, 1 HPSO data)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPSG


@dataclass(frozen=True, slots=True)
class NativeHeapSegmentRequest(_SegmentRequest):
    """NHSG to the VM: same layout as HPSG."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHSG


@dataclass(frozen=True, slots=True)
class SegmentChunk(Chunk):
    """Base of HPSG/HPSO/NHSG data: the 17-byte header parsed, the (state, n) pairs raw.

    Run-length decoding and its checks (odd usage data, unit counts, unit size 0) live in
    ``ddmd.protocol.heap``; this class only frames the header.
    """

    heap_id: int
    unit_size: int
    start: int
    offset: int
    units: int
    usage: bytes

    def __post_init__(self) -> None:
        _check_unsigned(self, "heap_id", self.heap_id, 4)
        _check_unsigned(self, "unit_size", self.unit_size, 1)
        _check_unsigned(self, "start", self.start, 4)
        _check_unsigned(self, "offset", self.offset, 4)
        _check_unsigned(self, "units", self.units, 4)
        _check_bytes(self, "usage", self.usage)

    def encode_data(self) -> bytes:
        head = _SEGMENT_HEAD.pack(self.heap_id, self.unit_size, self.start, self.offset, self.units)
        return head + self.usage

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        if r.size < _SEGMENT_HEAD.size:
            raise r.error(f"{r.size} bytes of data, shorter than the 17-byte segment header")
        heap_id, unit_size, start, offset, units = r.unpack(_SEGMENT_HEAD, "segment header")
        return cls(heap_id, unit_size, start, offset, units, r.rest())


@dataclass(frozen=True, slots=True)
class HeapSegment(SegmentChunk):
    """HPSG pushed by the VM (merged segment data)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPSG


@dataclass(frozen=True, slots=True)
class HeapSegmentObjects(SegmentChunk):
    """HPSO pushed by the VM (distinct-object segment data)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPSO


@dataclass(frozen=True, slots=True)
class NativeHeapSegment(SegmentChunk):
    """NHSG pushed by the VM (native heap segment data; ART never sends it)."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHSG


@dataclass(frozen=True, slots=True)
class HeapStart(_HeapIdChunk):
    """HPST: a managed-heap segment dump begins."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPST


@dataclass(frozen=True, slots=True)
class HeapEnd(_HeapIdChunk):
    """HPEN: a managed-heap segment dump ends."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPEN


@dataclass(frozen=True, slots=True)
class NativeHeapStart(_HeapIdChunk):
    """NHST: a native-heap segment dump begins."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHST


@dataclass(frozen=True, slots=True)
class NativeHeapEnd(_HeapIdChunk):
    """NHEN: a native-heap segment dump ends."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHEN


@dataclass(frozen=True, slots=True)
class GcRequest(_EmptyChunk):
    """HPGC to the VM: no data; the VM runs a GC."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPGC


@dataclass(frozen=True, slots=True)
class HeapDumpRequest(Chunk):
    """HPDU to the VM: str16 file name on the device."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPDU
    filename: str

    def __post_init__(self) -> None:
        _check_str(self, "filename", self.filename)

    def encode_data(self) -> bytes:
        return _str16(self.filename)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.str16("file name"))


@dataclass(frozen=True, slots=True)
class HeapDumpResult(Chunk):
    """HPDU from the VM: u1 result, 0 = written, 0xFF = failed."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPDU
    result: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "result", self.result, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.result)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("result"))


@dataclass(frozen=True, slots=True)
class HeapDumpStreamRequest(_EmptyChunk):
    """HPDS to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPDS


@dataclass(frozen=True, slots=True)
class HeapDumpStream(_OpaqueChunk):
    """HPDS pushed by the VM: a whole HPROF file, opaque."""

    TYPE: ClassVar[ChunkType] = ChunkType.HPDS


@dataclass(frozen=True, slots=True)
class NativeHeapRequest(_EmptyChunk):
    """NHGT to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHGT


@dataclass(frozen=True, slots=True)
class NativeHeapSnapshot(_OpaqueChunk):
    """NHGT from the VM: libc malloc-debug snapshot, little-endian, opaque."""

    TYPE: ClassVar[ChunkType] = ChunkType.NHGT
