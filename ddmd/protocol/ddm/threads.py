"""Thread chunks: THEN, THCR, THDE, THNM, THST (both layouts, rule T) and STKL, plus the quick
read of a thread-state poll (``thread_status_rows``, ``thread_info``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Self

from ddmd.protocol.ddm.base import (
    _CHUNK_HEADER,
    _S4,
    _U2,
    _U4,
    Chunk,
    ChunkType,
    _check_bool,
    _check_signed,
    _check_str,
    _check_tuple,
    _check_unsigned,
    _flag,
    _Reader,
    _str16,
    thread_state,
)
from ddmd.protocol.errors import LocalProtocolError

_THST_HEAD = struct.Struct(">BBH")
_THST_ENTRY = struct.Struct(">IBIIIB")  # 18 bytes
_THST_DRAFT_ENTRY = struct.Struct(">IBB")  # 6 bytes


@dataclass(frozen=True, slots=True)
class ThreadNotify(Chunk):
    """THEN: u1 enable. Decodes ``byte != 0``."""

    TYPE: ClassVar[ChunkType] = ChunkType.THEN
    enable: bool

    def __post_init__(self) -> None:
        _check_bool(self, "enable", self.enable)

    def encode_data(self) -> bytes:
        return _flag(self.enable)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("enable") != 0)


@dataclass(frozen=True, slots=True)
class _ThreadNameChunk(Chunk):
    thread_id: int
    name: str

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)
        _check_str(self, "name", self.name)

    def encode_data(self) -> bytes:
        return _U4.pack(self.thread_id) + _str16(self.name)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("thread id"), r.str16("thread name"))


@dataclass(frozen=True, slots=True)
class ThreadCreated(_ThreadNameChunk):
    """THCR pushed by the VM: u4 thread id (VM-internal, not the Linux tid), str16 name."""

    TYPE: ClassVar[ChunkType] = ChunkType.THCR


@dataclass(frozen=True, slots=True)
class ThreadRenamed(_ThreadNameChunk):
    """THNM pushed by the VM: same layout as THCR."""

    TYPE: ClassVar[ChunkType] = ChunkType.THNM


@dataclass(frozen=True, slots=True)
class ThreadDied(Chunk):
    """THDE pushed by the VM: u4 thread id."""

    TYPE: ClassVar[ChunkType] = ChunkType.THDE
    thread_id: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.thread_id)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("thread id"))


@dataclass(frozen=True, slots=True)
class ThreadStatusRequest(Chunk):
    """THST to the VM: no data (shipped), or u4 interval (``interval`` set: the draft)."""

    TYPE: ClassVar[ChunkType] = ChunkType.THST
    interval: int | None = None

    def __post_init__(self) -> None:
        if self.interval is not None:
            _check_unsigned(self, "interval", self.interval, 4)

    def encode_data(self) -> bytes:
        return b"" if self.interval is None else _U4.pack(self.interval)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        if r.size == 0:
            return cls()
        if r.size == 4:
            return cls(r.u4("interval"))
        raise r.error(f"request data of {r.size} bytes is neither 0 (shipped) nor 4 (draft)")


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """One entry of a shipped THST reply. ``status`` is a ``ThreadState`` when known."""

    thread_id: int
    status: int
    tid: int
    utime: int
    stime: int
    daemon: bool

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)
        _check_unsigned(self, "status", self.status, 1)
        _check_unsigned(self, "tid", self.tid, 4)
        _check_unsigned(self, "utime", self.utime, 4)
        _check_unsigned(self, "stime", self.stime, 4)
        _check_bool(self, "daemon", self.daemon)
        object.__setattr__(self, "status", thread_state(self.status))


@dataclass(frozen=True, slots=True)
class ThreadStatus(Chunk):
    """THST from the VM, shipped layout: u1 header length, u1 bytes per entry, u2 count,
    entries of (u4 id, u1 status, u4 tid, u4 utime, u4 stime, u1 daemon).

    Extra header bytes and extra per-entry bytes are skipped on decode and re-encoded as
    zeros; bytes after the last entry are ignored (rule T only requires a minimum size).
    """

    TYPE: ClassVar[ChunkType] = ChunkType.THST
    threads: tuple[ThreadInfo, ...]
    header_length: int = 4
    entry_length: int = 18

    def __post_init__(self) -> None:
        _check_tuple(self, "threads", self.threads, ThreadInfo, 0xFFFF)
        _check_unsigned(self, "header_length", self.header_length, 1)
        _check_unsigned(self, "entry_length", self.entry_length, 1)
        if self.header_length < 4:
            raise LocalProtocolError(f"ThreadStatus.header_length {self.header_length} < 4")
        if self.entry_length < 18:
            raise LocalProtocolError(f"ThreadStatus.entry_length {self.entry_length} < 18")

    def encode_data(self) -> bytes:
        entry_pad = bytes(self.entry_length - _THST_ENTRY.size)
        parts = [
            _THST_HEAD.pack(self.header_length, self.entry_length, len(self.threads)),
            bytes(self.header_length - _THST_HEAD.size),
        ]
        for t in self.threads:
            parts.append(
                _THST_ENTRY.pack(t.thread_id, t.status, t.tid, t.utime, t.stime, int(t.daemon))
            )
            parts.append(entry_pad)
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        header_length, entry_length, count = r.unpack(_THST_HEAD, "header")
        threads = []
        for i in range(count):
            r.seek(header_length + i * entry_length)
            tid_, status, tid, utime, stime, daemon = r.unpack(_THST_ENTRY, f"entry [{i}]")
            threads.append(ThreadInfo(tid_, status, tid, utime, stime, daemon != 0))
        r.seek(r.size)
        return cls(tuple(threads), header_length, entry_length)


@dataclass(frozen=True, slots=True)
class DraftThreadInfo:
    """One entry of a draft-layout THST chunk."""

    thread_id: int
    state: int
    suspended: bool

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)
        _check_unsigned(self, "state", self.state, 1)
        _check_bool(self, "suspended", self.suspended)
        object.__setattr__(self, "state", thread_state(self.state))


@dataclass(frozen=True, slots=True)
class ThreadStatusDraft(Chunk):
    """THST, 2007 draft layout (never shipped): u4 count, entries (u4 id, u1 state,
    u1 suspended). Fewer than 2**24 threads, so rule T can tell it from the shipped form."""

    TYPE: ClassVar[ChunkType] = ChunkType.THST
    threads: tuple[DraftThreadInfo, ...]

    def __post_init__(self) -> None:
        _check_tuple(self, "threads", self.threads, DraftThreadInfo, 0xFFFFFF)

    def encode_data(self) -> bytes:
        parts = [_U4.pack(len(self.threads))]
        parts.extend(
            _THST_DRAFT_ENTRY.pack(t.thread_id, t.state, int(t.suspended)) for t in self.threads
        )
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        count = r.u4("thread count")
        threads = []
        for i in range(count):
            thread_id, state, suspended = r.unpack(_THST_DRAFT_ENTRY, f"entry [{i}]")
            threads.append(DraftThreadInfo(thread_id, state, suspended != 0))
        return cls(tuple(threads))


def thread_status_rows(data: bytes) -> list[tuple[int, bytes]] | None:
    """The quick read of a thread-state poll: when ``data`` (a reply's data) is exactly one
    THST chunk in the shipped layout, its entries as (thread id, the entry's 18 bytes);
    otherwise None, and the general decoder (rule T) takes it. A monitor polls every VM a few
    times a second and most entries repeat, so the caller compares the bytes and decodes only
    the entries that changed (``thread_info``)."""
    size = len(data)
    if size < 12:
        return None
    chunk_type, length = _CHUNK_HEADER.unpack_from(data)
    if chunk_type != ChunkType.THST or length != size - 8:
        return None
    header_length, entry_length, count = _THST_HEAD.unpack_from(data, 8)
    if header_length < 4 or entry_length < 18 or length < header_length + count * entry_length:
        return None
    start = 8 + header_length
    end = start + count * entry_length
    return [
        (int.from_bytes(data[at : at + 4], "big"), data[at : at + 18])
        for at in range(start, end, entry_length)
    ]


def thread_info(entry: bytes) -> ThreadInfo:
    """One shipped THST entry (18 bytes, from ``thread_status_rows``)."""
    thread_id, status, tid, utime, stime, daemon = _THST_ENTRY.unpack(entry)
    return ThreadInfo(thread_id, status, tid, utime, stime, daemon != 0)


def _decode_thst_from_vm(r: _Reader) -> Chunk:
    """Rule T of protocol.md 3.9: pick the draft or the shipped layout, or reject."""
    size = r.size
    if size < 4:
        raise r.error(f"{size} bytes of data; both THST layouts need at least 4")
    header_length = r.peek_u1(0)
    entry_length = r.peek_u1(1)
    if header_length == 0:
        (count,) = r.peek(_U4, 0)
        if size != 4 + 6 * count:
            raise r.error(
                f"draft layout: {size} bytes of data, but count {count} needs exactly "
                f"{4 + 6 * count}"
            )
        return ThreadStatusDraft.from_reader(r)
    if header_length >= 4 and entry_length >= 18:
        (count,) = r.peek(_U2, 2)
        needed = header_length + count * entry_length
        if size < needed:
            raise r.error(
                f"shipped layout: {size} bytes of data, but header length {header_length} + "
                f"count {count} x entry length {entry_length} needs {needed}"
            )
        return ThreadStatus.from_reader(r)
    raise r.error(
        f"header length {header_length} / entry length {entry_length} match neither layout "
        "(draft: first byte 0; shipped: header length >= 4, entry length >= 18)"
    )


@dataclass(frozen=True, slots=True)
class StackTraceRequest(Chunk):
    """STKL to the VM: u4 thread id."""

    TYPE: ClassVar[ChunkType] = ChunkType.STKL
    thread_id: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.thread_id)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("thread id"))


@dataclass(frozen=True, slots=True)
class StackFrame:
    """One STKL frame. ``file_name`` "" = unknown; ``line`` -2 = native, -1 = unknown."""

    class_name: str
    method_name: str
    file_name: str
    line: int

    def __post_init__(self) -> None:
        _check_str(self, "class_name", self.class_name)
        _check_str(self, "method_name", self.method_name)
        _check_str(self, "file_name", self.file_name)
        _check_signed(self, "line", self.line, 4)


@dataclass(frozen=True, slots=True)
class StackTrace(Chunk):
    """STKL from the VM: u4 reserved, u4 thread id, u4 frame count, frames."""

    TYPE: ClassVar[ChunkType] = ChunkType.STKL
    thread_id: int
    frames: tuple[StackFrame, ...]
    reserved: int = 0

    def __post_init__(self) -> None:
        _check_unsigned(self, "thread_id", self.thread_id, 4)
        _check_tuple(self, "frames", self.frames, StackFrame, 0xFFFFFFFF)
        _check_unsigned(self, "reserved", self.reserved, 4)

    def encode_data(self) -> bytes:
        parts = [_U4.pack(self.reserved), _U4.pack(self.thread_id), _U4.pack(len(self.frames))]
        for f in self.frames:
            parts += (_str16(f.class_name), _str16(f.method_name), _str16(f.file_name))
            parts.append(_S4.pack(f.line))
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        reserved = r.u4("reserved")
        thread_id = r.u4("thread id")
        count = r.u4("frame count")
        r.require_count(count, 16, "frame count")
        frames = tuple(
            StackFrame(
                r.str16(f"frame [{i}] class name"),
                r.str16(f"frame [{i}] method name"),
                r.str16(f"frame [{i}] file name"),
                r.s4(f"frame [{i}] line"),
            )
            for i in range(count)
        )
        return cls(thread_id, frames, reserved)
