"""Allocation-tracking chunks: REAE, REAQ and REAL (recent allocations with their string
tables, and the resolved view of one entry)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Final, Self

from ddmd.protocol.ddm.base import (
    Chunk,
    ChunkType,
    _check_bool,
    _check_signed,
    _check_tuple,
    _check_unsigned,
    _EmptyChunk,
    _flag,
    _Reader,
    _str16,
)
from ddmd.protocol.errors import LocalProtocolError

_REAL_HEAD = struct.Struct(">BBBHIHHH")  # 15 bytes
_REAL_ENTRY = struct.Struct(">IHHB")  # 9 bytes
_REAL_FRAME = struct.Struct(">HHHh")  # 8 bytes


@dataclass(frozen=True, slots=True)
class AllocTrackingEnable(Chunk):
    """REAE: u1 enable. Decodes ``byte != 0``."""

    TYPE: ClassVar[ChunkType] = ChunkType.REAE
    enable: bool

    def __post_init__(self) -> None:
        _check_bool(self, "enable", self.enable)

    def encode_data(self) -> bytes:
        return _flag(self.enable)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("enable") != 0)


@dataclass(frozen=True, slots=True)
class AllocTrackingQuery(_EmptyChunk):
    """REAQ to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.REAQ


@dataclass(frozen=True, slots=True)
class AllocTrackingStatus(Chunk):
    """REAQ from the VM: u1, tracking on when nonzero."""

    TYPE: ClassVar[ChunkType] = ChunkType.REAQ
    enabled: bool

    def __post_init__(self) -> None:
        _check_bool(self, "enabled", self.enabled)

    def encode_data(self) -> bytes:
        return _flag(self.enabled)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("enabled") != 0)


@dataclass(frozen=True, slots=True)
class AllocationsRequest(_EmptyChunk):
    """REAL to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.REAL


@dataclass(frozen=True, slots=True)
class AllocationFrame:
    """One REAL frame: indices into the string tables, s2 line (-1 unknown, -2 native)."""

    class_index: int
    method_index: int
    file_index: int
    line: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "class_index", self.class_index, 2)
        _check_unsigned(self, "method_index", self.method_index, 2)
        _check_unsigned(self, "file_index", self.file_index, 2)
        _check_signed(self, "line", self.line, 2)


@dataclass(frozen=True, slots=True)
class AllocationEntry:
    """One REAL entry: u4 size, u2 thread id, u2 class-name index, up to 255 frames."""

    size: int
    thread_id: int
    class_index: int
    frames: tuple[AllocationFrame, ...]

    def __post_init__(self) -> None:
        _check_unsigned(self, "size", self.size, 4)
        _check_unsigned(self, "thread_id", self.thread_id, 2)
        _check_unsigned(self, "class_index", self.class_index, 2)
        _check_tuple(self, "frames", self.frames, AllocationFrame, 0xFF)


@dataclass(frozen=True, slots=True)
class ResolvedFrame:
    class_name: str
    method_name: str
    file_name: str
    line: int


@dataclass(frozen=True, slots=True)
class ResolvedAllocation:
    size: int
    thread_id: int
    class_name: str
    frames: tuple[ResolvedFrame, ...]


_REAL_HEADER_LENGTH: Final = _REAL_HEAD.size  # 15
_REAL_ENTRY_LENGTH: Final = _REAL_ENTRY.size  # 9
_REAL_FRAME_LENGTH: Final = _REAL_FRAME.size  # 8


@dataclass(frozen=True, slots=True)
class Allocations(Chunk):
    """REAL from the VM: recent allocations, newest first, with three string tables.

    Entries keep their indices; ``resolve`` turns one into names. Encoding is canonical
    (header 15, entry header 9, frame 8 bytes, string tables right after the entries); on
    decode the three length bytes are honoured and unknown extra bytes, including any gap
    before the string tables, are skipped. Every index must be inside its table.
    """

    TYPE: ClassVar[ChunkType] = ChunkType.REAL
    entries: tuple[AllocationEntry, ...]
    class_names: tuple[str, ...]
    method_names: tuple[str, ...]
    file_names: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_tuple(self, "entries", self.entries, AllocationEntry, 0xFFFF)
        _check_tuple(self, "class_names", self.class_names, str, 0xFFFF)
        _check_tuple(self, "method_names", self.method_names, str, 0xFFFF)
        _check_tuple(self, "file_names", self.file_names, str, 0xFFFF)
        bad = _bad_allocation_index(
            self.entries, len(self.class_names), len(self.method_names), len(self.file_names)
        )
        if bad is not None:
            raise LocalProtocolError(f"Allocations: {bad}")

    def resolve(self, entry: AllocationEntry) -> ResolvedAllocation:
        """The entry with its indices replaced by names from this chunk's string tables."""
        bad = _bad_allocation_index(
            (entry,), len(self.class_names), len(self.method_names), len(self.file_names)
        )
        if bad is not None:
            raise LocalProtocolError(f"Allocations.resolve: {bad}")
        classes, methods, files = self.class_names, self.method_names, self.file_names
        frames = tuple(
            ResolvedFrame(
                classes[f.class_index], methods[f.method_index], files[f.file_index], f.line
            )
            for f in entry.frames
        )
        return ResolvedAllocation(entry.size, entry.thread_id, classes[entry.class_index], frames)

    def resolved(self) -> tuple[ResolvedAllocation, ...]:
        """Every entry resolved, newest first."""
        return tuple(self.resolve(e) for e in self.entries)

    def encode_data(self) -> bytes:
        body_size = sum(
            _REAL_ENTRY_LENGTH + len(e.frames) * _REAL_FRAME_LENGTH for e in self.entries
        )
        parts = [
            _REAL_HEAD.pack(
                _REAL_HEADER_LENGTH,
                _REAL_ENTRY_LENGTH,
                _REAL_FRAME_LENGTH,
                len(self.entries),
                _REAL_HEADER_LENGTH + body_size,
                len(self.class_names),
                len(self.method_names),
                len(self.file_names),
            )
        ]
        for e in self.entries:
            parts.append(_REAL_ENTRY.pack(e.size, e.thread_id, e.class_index, len(e.frames)))
            parts.extend(
                _REAL_FRAME.pack(f.class_index, f.method_index, f.file_index, f.line)
                for f in e.frames
            )
        for table in (self.class_names, self.method_names, self.file_names):
            parts.extend(_str16(s) for s in table)
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        (
            header_length,
            entry_header_length,
            frame_length,
            count,
            table_offset,
            n_classes,
            n_methods,
            n_files,
        ) = r.unpack(_REAL_HEAD, "header")
        if header_length < _REAL_HEADER_LENGTH:
            raise r.error(f"header length {header_length} < {_REAL_HEADER_LENGTH}")
        if entry_header_length < _REAL_ENTRY_LENGTH:
            raise r.error(f"entry header length {entry_header_length} < {_REAL_ENTRY_LENGTH}")
        if frame_length < _REAL_FRAME_LENGTH:
            raise r.error(f"frame length {frame_length} < {_REAL_FRAME_LENGTH}")
        if not header_length <= table_offset <= r.size:
            raise r.error(
                f"string table offset {table_offset} is outside {header_length}..{r.size}"
            )
        r.seek(header_length)
        entries = []
        for i in range(count):
            start = r.pos
            size, thread_id, class_index, n_frames = r.unpack(_REAL_ENTRY, f"entry [{i}]")
            _check_index(r, class_index, n_classes, f"entry [{i}] class-name index")
            r.skip_to(start + entry_header_length, f"entry [{i}] header")
            frames = []
            for j in range(n_frames):
                frame_start = r.pos
                fc, fm, ff, line = r.unpack(_REAL_FRAME, f"entry [{i}] frame [{j}]")
                _check_index(r, fc, n_classes, f"entry [{i}] frame [{j}] class-name index")
                _check_index(r, fm, n_methods, f"entry [{i}] frame [{j}] method-name index")
                _check_index(r, ff, n_files, f"entry [{i}] frame [{j}] file-name index")
                r.skip_to(frame_start + frame_length, f"entry [{i}] frame [{j}]")
                frames.append(AllocationFrame(fc, fm, ff, line))
            if r.pos > table_offset:
                raise r.error(
                    f"entry [{i}] ends at offset {r.pos}, past the string table offset "
                    f"{table_offset}"
                )
            entries.append(AllocationEntry(size, thread_id, class_index, tuple(frames)))
        r.seek(table_offset)
        r.require_count(n_classes + n_methods + n_files, 4, "string count")
        classes = tuple(r.str16(f"class name [{k}]") for k in range(n_classes))
        methods = tuple(r.str16(f"method name [{k}]") for k in range(n_methods))
        files = tuple(r.str16(f"file name [{k}]") for k in range(n_files))
        return cls(tuple(entries), classes, methods, files)


def _check_index(r: _Reader, index: int, size: int, what: str) -> None:
    if index >= size:
        raise r.error(f"{what} {index} is out of range (table has {size} strings)")


def _bad_allocation_index(
    entries: tuple[AllocationEntry, ...], n_classes: int, n_methods: int, n_files: int
) -> str | None:
    for i, e in enumerate(entries):
        if e.class_index >= n_classes:
            return f"entry [{i}] class index {e.class_index} >= {n_classes} class names"
        for j, f in enumerate(e.frames):
            if f.class_index >= n_classes:
                return f"entry [{i}] frame [{j}] class index {f.class_index} >= {n_classes}"
            if f.method_index >= n_methods:
                return f"entry [{i}] frame [{j}] method index {f.method_index} >= {n_methods}"
            if f.file_index >= n_files:
                return f"entry [{i}] frame [{j}] file index {f.file_index} >= {n_files}"
    return None
