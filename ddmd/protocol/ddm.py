"""DDM chunks inside JDWP command set 0xC7 (199), command 1: one frozen dataclass per chunk.

Layer rule: protocol/ is SANS-IO. stdlib only; mypy --strict. No trio, no structlog, no
sockets, no time, no threads. Unknown chunk types decode to an opaque chunk, never a crash.

Wire facts are in ../shared/docs/protocol.md, sections 2 (framing, FAIL, ZLIB, strings) and 3
(the chunk catalogue). A chunk is ``u4 type, u4 length, data``; the layout of *data* depends on
the type **and** on the direction, so every decoder takes a ``Direction``:

- ``Direction.TO_VM``: chunks in a command ddmd (or a debugger) sends to the VM: requests.
- ``Direction.FROM_VM``: chunks in a reply from the VM, or pushed by it in a command.

Classes by chunk type (TO_VM / FROM_VM; one name = the same class both ways):

    HELO  HeloRequest / HeloReply            FEAT  FeatRequest / FeatReply
    WAIT  WaitForDebugger                    APNM  AppName
    EXIT  ExitRequest                        DBGD  Dbgd
    ZLIB  Zlib (see inflate_chunk)           FAIL  Fail
    THEN  ThreadNotify                       THCR  ThreadCreated
    THDE  ThreadDied                         THNM  ThreadRenamed
    THST  ThreadStatusRequest / ThreadStatus or ThreadStatusDraft (rule T, protocol.md 3.9)
    STKL  StackTraceRequest / StackTrace     HPIF  HeapInfoRequest / HeapInfo
    HPSG  HeapSegmentRequest / HeapSegment   HPSO  HeapSegmentObjects
    NHSG  NativeHeapSegmentRequest / NativeHeapSegment
    HPST  HeapStart     HPEN  HeapEnd        NHST  NativeHeapStart    NHEN  NativeHeapEnd
    HPGC  GcRequest                          HPDU  HeapDumpRequest / HeapDumpResult
    HPDS  HeapDumpStreamRequest / HeapDumpStream
    REAE  AllocTrackingEnable                REAQ  AllocTrackingQuery / AllocTrackingStatus
    REAL  AllocationsRequest / Allocations   NHGT  NativeHeapRequest / NativeHeapSnapshot
    MPRS  MethodTraceStart                   MPRE  MethodTraceEnd / MethodTraceEndResult
    MPSS  MethodTraceStreamStart             MPSE  MethodTraceStreamEnd / MethodTraceData
    SPSS  SamplingStart                      SPSE  SamplingEnd
    MPRQ  ProfilingQuery / ProfilingStatus
    VULW VURT VUOP VUGL  ViewDebug (raw data, both directions)
    TEST DTRC and every type not listed      UnknownChunk (raw data, byte-exact)

A type that only has one layout (WAIT, APNM, THCR, HPSO, HPGC, SPSE, ...) is decoded with that
layout in both directions: the direction only picks between two layouts where two exist.

Decoding rules:

- Malformed data raises ``RemoteProtocolError`` naming the chunk type, the field and the offset.
- Fixed layouts reject trailing bytes. Extensible layouts do not: HELO and APNM parse each
  trailer only while bytes remain and keep whatever follows the last known trailer in
  ``extra``; a trailer cut short (two bytes where the s4 user id would be) is rejected. THST
  and REAL honour their length bytes and skip unknown extra bytes (re-encoded as zeros, or
  canonically for REAL).
- ``str16`` strings decode with ``surrogatepass``, so unpaired surrogates round-trip
  byte-exact. A Python string holding a surrogate *pair* as two separate code points
  encodes fine but decodes back as one code point: build strings from real characters.
- Booleans: ``HeloReply.native_debuggable`` is ``byte == 1`` (protocol.md: 1 = true, anything
  else false); every other flag is ``byte != 0``, as the VMs and ddmlib read them. Flag bytes
  other than 0 and 1 therefore do not re-encode byte-exact; apart from these and the skipped
  THST/REAL bytes, encode(decode(data)) == data for every chunk.
- ZLIB chunks decode to ``Zlib``; nothing is inflated until ``inflate_chunk`` is called with
  a size limit.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Final, Self

from .errors import LocalProtocolError, RemoteProtocolError
from .jdwp import DDM_COMMAND, CommandPacket, CommandSet, ReplyPacket

__all__ = [
    "CHUNK_HEADER_SIZE",
    "VIEW_DEBUG_TYPES",
    "AllocTrackingEnable",
    "AllocTrackingQuery",
    "AllocTrackingStatus",
    "AllocationEntry",
    "AllocationFrame",
    "Allocations",
    "AllocationsRequest",
    "AppName",
    "Chunk",
    "ChunkType",
    "Dbgd",
    "Direction",
    "DraftThreadInfo",
    "ExitRequest",
    "Fail",
    "FeatReply",
    "FeatRequest",
    "GcRequest",
    "HeapDumpRequest",
    "HeapDumpResult",
    "HeapDumpStream",
    "HeapDumpStreamRequest",
    "HeapEnd",
    "HeapInfo",
    "HeapInfoEntry",
    "HeapInfoRequest",
    "HeapSegment",
    "HeapSegmentObjects",
    "HeapSegmentRequest",
    "HeapStart",
    "HeloReply",
    "HeloRequest",
    "MethodTraceData",
    "MethodTraceEnd",
    "MethodTraceEndResult",
    "MethodTraceStart",
    "MethodTraceStreamEnd",
    "MethodTraceStreamStart",
    "NativeHeapEnd",
    "NativeHeapRequest",
    "NativeHeapSegment",
    "NativeHeapSegmentRequest",
    "NativeHeapSnapshot",
    "NativeHeapStart",
    "ProfilingQuery",
    "ProfilingStatus",
    "ResolvedAllocation",
    "ResolvedFrame",
    "SamplingEnd",
    "SamplingStart",
    "SegmentChunk",
    "StackFrame",
    "StackTrace",
    "StackTraceRequest",
    "ThreadCreated",
    "ThreadDied",
    "ThreadInfo",
    "ThreadNotify",
    "ThreadRenamed",
    "ThreadState",
    "ThreadStatus",
    "ThreadStatusDraft",
    "ThreadStatusRequest",
    "UnknownChunk",
    "ViewDebug",
    "Zlib",
    "chunk_type_code",
    "chunks_of",
    "compress_chunk",
    "ddm_command",
    "decode_chunk",
    "decode_chunks",
    "encode_chunk",
    "encode_chunks",
    "inflate_chunk",
    "is_ddm",
    "raw_chunk",
    "split_chunks",
    "thread_info",
    "thread_state",
    "thread_state_label",
    "thread_status_rows",
    "type_name",
]

CHUNK_HEADER_SIZE: Final = 8

_U1 = struct.Struct(">B")
_U2 = struct.Struct(">H")
_S2 = struct.Struct(">h")
_U4 = struct.Struct(">I")
_S4 = struct.Struct(">i")
_U8 = struct.Struct(">Q")
_CHUNK_HEADER = struct.Struct(">II")
_HELO_HEAD = struct.Struct(">IIII")
_THST_HEAD = struct.Struct(">BBH")
_THST_ENTRY = struct.Struct(">IBIIIB")  # 18 bytes
_THST_DRAFT_ENTRY = struct.Struct(">IBB")  # 6 bytes
_HPIF_ENTRY = struct.Struct(">IQBIIII")  # 29 bytes
_SEGMENT_HEAD = struct.Struct(">IBIII")  # 17 bytes
_REAL_HEAD = struct.Struct(">BBBHIHHH")  # 15 bytes
_REAL_ENTRY = struct.Struct(">IHHB")  # 9 bytes
_REAL_FRAME = struct.Struct(">HHHh")  # 8 bytes

_UNSIGNED_MAX: Final = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFFFFFFFFFF}


class Direction(enum.Enum):
    """Which way a chunk travels; picks the layout for types that have two."""

    TO_VM = "to_vm"
    """In a command sent to the VM (by ddmd or a debugger): requests."""
    FROM_VM = "from_vm"
    """In a reply from the VM, or pushed by it as a command."""


class ChunkType(enum.IntEnum):
    """Every chunk type of protocol.md 3.1: four ASCII bytes read as a big-endian u4."""

    HELO = 0x48454C4F
    FEAT = 0x46454154
    WAIT = 0x57414954
    APNM = 0x41504E4D
    EXIT = 0x45584954
    DBGD = 0x44424744
    DTRC = 0x44545243
    ZLIB = 0x5A4C4942
    FAIL = 0x4641494C
    TEST = 0x54455354
    THEN = 0x5448454E
    THCR = 0x54484352
    THDE = 0x54484445
    THNM = 0x54484E4D
    THST = 0x54485354
    STKL = 0x53544B4C
    HPIF = 0x48504946
    HPSG = 0x48505347
    HPSO = 0x4850534F
    HPST = 0x48505354
    HPEN = 0x4850454E
    NHSG = 0x4E485347
    NHST = 0x4E485354
    NHEN = 0x4E48454E
    NHGT = 0x4E484754
    HPGC = 0x48504743
    HPDU = 0x48504455
    HPDS = 0x48504453
    REAE = 0x52454145
    REAQ = 0x52454151
    REAL = 0x5245414C
    MPRS = 0x4D505253
    MPRE = 0x4D505245
    MPSS = 0x4D505353
    MPSE = 0x4D505345
    SPSS = 0x53505353
    SPSE = 0x53505345
    MPRQ = 0x4D505251
    VULW = 0x56554C57
    VURT = 0x56555254
    VUOP = 0x56554F50
    VUGL = 0x5655474C


VIEW_DEBUG_TYPES: Final = frozenset(
    {ChunkType.VULW, ChunkType.VURT, ChunkType.VUOP, ChunkType.VUGL}
)


def type_name(value: int) -> str:
    """The four ASCII characters of a chunk type, or its hex value if they are not printable."""
    if 0 <= value <= 0xFFFFFFFF:
        raw = value.to_bytes(4, "big")
        if all(0x20 <= b < 0x7F for b in raw):
            return raw.decode("ascii")
        return f"0x{value:08X}"
    return hex(value)


class ThreadState(enum.IntEnum):
    """THST status values (protocol.md 3.3). Values outside this table are kept as plain ints."""

    ZOMBIE = 0
    RUNNING = 1
    TIMED_WAIT = 2
    MONITOR = 3
    WAIT = 4
    INIT = 5
    START = 6
    NATIVE = 7
    VMWAIT = 8
    SUSPENDED = 9

    @property
    def label(self) -> str:
        """The label DDMS shows for this state."""
        return _STATE_LABELS[self]


_STATE_LABELS: Final = (
    "zombie",
    "running",
    "timed-wait",
    "monitor",
    "wait",
    "init",
    "start",
    "native",
    "vmwait",
    "suspended",
)


def thread_state(value: int) -> int:
    """``ThreadState(value)`` when the value is known, else ``value`` unchanged."""
    try:
        return ThreadState(value)
    except ValueError:
        return value


def thread_state_label(value: int) -> str:
    """The DDMS label for a status value; unknown values give their decimal string."""
    if 0 <= value < len(_STATE_LABELS):
        return _STATE_LABELS[value]
    return str(value)


# --------------------------------------------------------------------------------------------
# Validation of locally built messages (LocalProtocolError) and string helpers


def _owner(obj: object) -> str:
    return type(obj).__name__


def _check_unsigned(obj: object, name: str, value: object, size: int) -> None:
    if not isinstance(value, int):
        raise LocalProtocolError(f"{_owner(obj)}.{name} must be an int, not {value!r}")
    if not 0 <= value <= _UNSIGNED_MAX[size]:
        raise LocalProtocolError(
            f"{_owner(obj)}.{name} {value} is outside the u{size} range 0..{_UNSIGNED_MAX[size]}"
        )


def _check_signed(obj: object, name: str, value: object, size: int) -> None:
    if not isinstance(value, int):
        raise LocalProtocolError(f"{_owner(obj)}.{name} must be an int, not {value!r}")
    bound = 1 << (8 * size - 1)
    if not -bound <= value < bound:
        raise LocalProtocolError(
            f"{_owner(obj)}.{name} {value} is outside the s{size} range {-bound}..{bound - 1}"
        )


def _check_str(obj: object, name: str, value: object) -> None:
    if not isinstance(value, str):
        raise LocalProtocolError(f"{_owner(obj)}.{name} must be a str, not {value!r}")


def _check_bytes(obj: object, name: str, value: object) -> None:
    if type(value) is not bytes:
        raise LocalProtocolError(f"{_owner(obj)}.{name} must be bytes, not {type(value).__name__}")


def _check_bool(obj: object, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise LocalProtocolError(f"{_owner(obj)}.{name} must be a bool, not {value!r}")


def _check_tuple(obj: object, name: str, value: object, item: type, max_len: int) -> None:
    if type(value) is not tuple:
        raise LocalProtocolError(
            f"{_owner(obj)}.{name} must be a tuple, not {type(value).__name__}"
        )
    if len(value) > max_len:
        raise LocalProtocolError(
            f"{_owner(obj)}.{name} has {len(value)} items; the wire count allows {max_len}"
        )
    for i, x in enumerate(value):
        if not isinstance(x, item):
            raise LocalProtocolError(
                f"{_owner(obj)}.{name}[{i}] must be {item.__name__}, not {type(x).__name__}"
            )


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _str16(text: str) -> bytes:
    raw = _utf16(text)
    return _U4.pack(len(raw) // 2) + raw


def _flag(value: bool) -> bytes:
    return b"\x01" if value else b"\x00"


# --------------------------------------------------------------------------------------------
# Reading chunk data: one cursor over a memoryview, never a copy of the remaining buffer


class _Reader:
    """Cursor over one chunk's data; every failure is a RemoteProtocolError naming the chunk."""

    __slots__ = ("_data", "_pos", "chunk_type", "name")

    def __init__(self, chunk_type: int, data: memoryview) -> None:
        self.chunk_type = chunk_type
        self.name = type_name(chunk_type)
        self._data = data
        self._pos = 0

    @property
    def size(self) -> int:
        return len(self._data)

    @property
    def pos(self) -> int:
        return self._pos

    @property
    def remaining(self) -> int:
        return len(self._data) - self._pos

    def error(self, message: str) -> RemoteProtocolError:
        return RemoteProtocolError(f"{self.name}: {message}")

    def peek_u1(self, offset: int) -> int:
        return self._data[offset]

    def peek(self, fmt: struct.Struct, offset: int) -> tuple[int, ...]:
        """Values at a fixed offset the caller has already checked, without moving."""
        values: tuple[int, ...] = fmt.unpack_from(self._data, offset)
        return values

    def skip_to(self, offset: int, what: str) -> None:
        """Move forward to ``offset``, skipping unknown bytes of a longer-than-known field."""
        if offset > len(self._data):
            raise self.error(
                f"{what} ends at offset {offset}, past the end of the {len(self._data)}-byte data"
            )
        self._pos = offset

    def seek(self, offset: int) -> None:
        if not 0 <= offset <= len(self._data):
            raise self.error(f"offset {offset} is outside the {len(self._data)}-byte data")
        self._pos = offset

    def _take(self, size: int, what: str) -> int:
        pos = self._pos
        if len(self._data) - pos < size:
            raise self.error(
                f"{what} ({size} bytes) at offset {pos} runs past the end of the "
                f"{len(self._data)}-byte data"
            )
        self._pos = pos + size
        return pos

    def u1(self, what: str) -> int:
        return self._data[self._take(1, what)]

    def u2(self, what: str) -> int:
        value: int = _U2.unpack_from(self._data, self._take(2, what))[0]
        return value

    def s2(self, what: str) -> int:
        value: int = _S2.unpack_from(self._data, self._take(2, what))[0]
        return value

    def u4(self, what: str) -> int:
        value: int = _U4.unpack_from(self._data, self._take(4, what))[0]
        return value

    def s4(self, what: str) -> int:
        value: int = _S4.unpack_from(self._data, self._take(4, what))[0]
        return value

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        values: tuple[int, ...] = fmt.unpack_from(self._data, self._take(fmt.size, what))
        return values

    def utf16(self, count: int, what: str) -> str:
        if count > self.remaining // 2:
            raise self.error(
                f"{what}: {count} UTF-16 units at offset {self._pos} run past the end of the "
                f"{len(self._data)}-byte data"
            )
        pos = self._take(2 * count, what)
        try:
            return str(self._data[pos : pos + 2 * count], "utf-16-be", "surrogatepass")
        except UnicodeDecodeError as exc:  # surrogatepass accepts every unit sequence
            raise self.error(f"{what}: undecodable UTF-16 at offset {pos}") from exc

    def str16(self, what: str) -> str:
        start = self._pos
        count = self.u4(f"{what} length")
        if count > self.remaining // 2:
            raise self.error(
                f"{what}: string length {count} (UTF-16 units) at offset {start} runs past the "
                f"end of the {len(self._data)}-byte data"
            )
        return self.utf16(count, what)

    def rest(self) -> bytes:
        pos = self._pos
        self._pos = len(self._data)
        return bytes(self._data[pos:])

    def require_count(self, count: int, min_item_size: int, what: str) -> None:
        """Reject a count that cannot fit before doing any per-item work."""
        if count * min_item_size > self.remaining:
            raise self.error(
                f"{what} {count} needs at least {count * min_item_size} bytes at offset "
                f"{self._pos}, only {self.remaining} remain"
            )

    def finish(self) -> None:
        if self._pos != len(self._data):
            raise self.error(
                f"{len(self._data) - self._pos} unexpected bytes after offset {self._pos} "
                f"(data is {len(self._data)} bytes)"
            )


# --------------------------------------------------------------------------------------------
# Base classes


@dataclass(frozen=True, slots=True)
class Chunk:
    """Base of every chunk. The class is the message type: dispatch on it, never on a tag.

    ``TYPE`` is the chunk type of classes bound to one type; ``chunk_type`` works on every
    chunk (``ViewDebug`` and ``UnknownChunk`` carry their type as a field instead).
    """

    TYPE: ClassVar[ChunkType]

    @property
    def chunk_type(self) -> int:
        return self.TYPE

    def encode_data(self) -> bytes:
        """The chunk data, without the 8-byte chunk header."""
        raise NotImplementedError

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _EmptyChunk(Chunk):
    """A chunk whose data is empty."""

    def encode_data(self) -> bytes:
        return b""

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls()


@dataclass(frozen=True, slots=True)
class _OpaqueChunk(Chunk):
    """A chunk whose data is a blob ddmd passes through (an HPROF file, a trace file, ...)."""

    data: bytes

    def __post_init__(self) -> None:
        _check_bytes(self, "data", self.data)

    def encode_data(self) -> bytes:
        return self.data

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.rest())


@dataclass(frozen=True, slots=True)
class _HeapIdChunk(Chunk):
    """HPST/HPEN/NHST/NHEN: a single u4 heap id."""

    heap_id: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "heap_id", self.heap_id, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.heap_id)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("heap id"))


# --------------------------------------------------------------------------------------------
# Identity: HELO, FEAT, WAIT, APNM, EXIT, DBGD


@dataclass(frozen=True, slots=True)
class HeloRequest(Chunk):
    """HELO to the VM: u4 server protocol version (ddmd sends 1)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HELO
    version: int = 1

    def __post_init__(self) -> None:
        _check_unsigned(self, "version", self.version, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.version)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("server protocol version"))


_HELO_TRAILERS: Final = ("user_id", "abi", "jvm_flags", "native_debuggable", "package_name")


@dataclass(frozen=True, slots=True)
class HeloReply(Chunk):
    """HELO from the VM. The five trailers are present only while bytes remain, in order.

    ``extra`` keeps bytes after the last known trailer (only possible when all five are
    present). ``native_debuggable`` reads ``byte == 1``; a byte other than 0 or 1 re-encodes
    as 0 (the one lossy field of this chunk).
    """

    TYPE: ClassVar[ChunkType] = ChunkType.HELO
    client_version: int
    pid: int
    vm_ident: str
    app_name: str
    user_id: int | None = None
    abi: str | None = None
    jvm_flags: str | None = None
    native_debuggable: bool | None = None
    package_name: str | None = None
    extra: bytes = b""

    def __post_init__(self) -> None:
        _check_unsigned(self, "client_version", self.client_version, 4)
        _check_unsigned(self, "pid", self.pid, 4)
        _check_str(self, "vm_ident", self.vm_ident)
        _check_str(self, "app_name", self.app_name)
        if self.user_id is not None:
            _check_signed(self, "user_id", self.user_id, 4)
        for name in ("abi", "jvm_flags", "package_name"):
            value = getattr(self, name)
            if value is not None:
                _check_str(self, name, value)
        if self.native_debuggable is not None:
            _check_bool(self, "native_debuggable", self.native_debuggable)
        _check_bytes(self, "extra", self.extra)
        _check_trailer_order(self, _HELO_TRAILERS, self.extra)

    def encode_data(self) -> bytes:
        vm = _utf16(self.vm_ident)
        app = _utf16(self.app_name)
        parts = [
            _HELO_HEAD.pack(self.client_version, self.pid, len(vm) // 2, len(app) // 2),
            vm,
            app,
        ]
        if self.user_id is not None:
            parts.append(_S4.pack(self.user_id))
        if self.abi is not None:
            parts.append(_str16(self.abi))
        if self.jvm_flags is not None:
            parts.append(_str16(self.jvm_flags))
        if self.native_debuggable is not None:
            parts.append(_flag(self.native_debuggable))
        if self.package_name is not None:
            parts.append(_str16(self.package_name))
        parts.append(self.extra)
        return b"".join(parts)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        client_version, pid, n_vm, n_app = r.unpack(_HELO_HEAD, "fixed header")
        vm_ident = r.utf16(n_vm, "VM ident")
        app_name = r.utf16(n_app, "app name")
        user_id = r.s4("user id (trailer 1)") if r.remaining else None
        abi = r.str16("ABI (trailer 2)") if r.remaining else None
        jvm_flags = r.str16("JVM flags (trailer 3)") if r.remaining else None
        native = r.u1("native debuggable (trailer 4)") == 1 if r.remaining else None
        package = r.str16("package name (trailer 5)") if r.remaining else None
        extra = r.rest()
        return cls(
            client_version, pid, vm_ident, app_name, user_id, abi, jvm_flags, native, package, extra
        )


def _check_trailer_order(obj: object, names: tuple[str, ...], extra: bytes) -> None:
    """A trailer may be set only if every earlier one is; ``extra`` only after the last."""
    missing: str | None = None
    for name in names:
        if getattr(obj, name) is None:
            missing = missing or name
        elif missing is not None:
            raise LocalProtocolError(
                f"{_owner(obj)}.{name} is set but the earlier trailer {missing} is not"
            )
    if missing is not None and extra:
        raise LocalProtocolError(
            f"{_owner(obj)}.extra is set but the trailer {missing} is not; "
            "unknown bytes may only follow the last known trailer"
        )


@dataclass(frozen=True, slots=True)
class FeatRequest(_EmptyChunk):
    """FEAT to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.FEAT


@dataclass(frozen=True, slots=True)
class FeatReply(Chunk):
    """FEAT from the VM: u4 count, count x str16 feature names (treat as a set)."""

    TYPE: ClassVar[ChunkType] = ChunkType.FEAT
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_tuple(self, "features", self.features, str, 0xFFFFFFFF)

    def encode_data(self) -> bytes:
        return _U4.pack(len(self.features)) + b"".join(_str16(f) for f in self.features)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        count = r.u4("feature count")
        r.require_count(count, 4, "feature count")
        return cls(tuple(r.str16(f"feature [{i}]") for i in range(count)))


@dataclass(frozen=True, slots=True)
class WaitForDebugger(Chunk):
    """WAIT pushed by the VM: u1 reason (0 = waiting for a debugger)."""

    TYPE: ClassVar[ChunkType] = ChunkType.WAIT
    reason: int = 0

    def __post_init__(self) -> None:
        _check_unsigned(self, "reason", self.reason, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.reason)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u1("reason"))


_APNM_TRAILERS: Final = ("user_id", "package_name")


@dataclass(frozen=True, slots=True)
class AppName(Chunk):
    """APNM pushed by the VM: str16 app (process) name, then s4 user id and str16 package
    name while bytes remain. ``extra`` keeps bytes after the package name."""

    TYPE: ClassVar[ChunkType] = ChunkType.APNM
    app_name: str
    user_id: int | None = None
    package_name: str | None = None
    extra: bytes = b""

    def __post_init__(self) -> None:
        _check_str(self, "app_name", self.app_name)
        if self.user_id is not None:
            _check_signed(self, "user_id", self.user_id, 4)
        if self.package_name is not None:
            _check_str(self, "package_name", self.package_name)
        _check_bytes(self, "extra", self.extra)
        _check_trailer_order(self, _APNM_TRAILERS, self.extra)

    def encode_data(self) -> bytes:
        parts = [_str16(self.app_name)]
        if self.user_id is not None:
            parts.append(_S4.pack(self.user_id))
        if self.package_name is not None:
            parts.append(_str16(self.package_name))
        parts.append(self.extra)
        return b"".join(parts)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        app_name = r.str16("app name")
        user_id = r.s4("user id") if r.remaining else None
        package = r.str16("package name") if r.remaining else None
        return cls(app_name, user_id, package, r.rest())


@dataclass(frozen=True, slots=True)
class ExitRequest(Chunk):
    """EXIT to the VM: u4 exit status. The VM halts; expect EOF, not a reply."""

    TYPE: ClassVar[ChunkType] = ChunkType.EXIT
    status: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "status", self.status, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.status)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("exit status"))


@dataclass(frozen=True, slots=True)
class Dbgd(_EmptyChunk):
    """DBGD, no data, either direction (the draft's debugger-detach request and its ack)."""

    TYPE: ClassVar[ChunkType] = ChunkType.DBGD


# --------------------------------------------------------------------------------------------
# FAIL and ZLIB (protocol.md 2.5, 2.6)


@dataclass(frozen=True, slots=True)
class Fail(Chunk):
    """FAIL in a reply: s4 error code, str16 message (may be empty)."""

    TYPE: ClassVar[ChunkType] = ChunkType.FAIL
    code: int
    message: str

    def __post_init__(self) -> None:
        _check_signed(self, "code", self.code, 4)
        _check_str(self, "message", self.message)

    def encode_data(self) -> bytes:
        return _S4.pack(self.code) + _str16(self.message)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.s4("error code"), r.str16("message"))


@dataclass(frozen=True, slots=True)
class Zlib(Chunk):
    """ZLIB (ddmd's reading of the draft): u4 original type, u4 original length, zlib stream.

    The wrapped type must not itself be ZLIB. Use ``inflate_chunk`` to get the inner chunk.
    """

    TYPE: ClassVar[ChunkType] = ChunkType.ZLIB
    original_type: int
    original_length: int
    stream: bytes

    def __post_init__(self) -> None:
        _check_unsigned(self, "original_type", self.original_type, 4)
        _check_unsigned(self, "original_length", self.original_length, 4)
        _check_bytes(self, "stream", self.stream)
        if self.original_type == ChunkType.ZLIB:
            raise LocalProtocolError("Zlib.original_type is ZLIB: nested ZLIB is not allowed")

    def encode_data(self) -> bytes:
        return _U4.pack(self.original_type) + _U4.pack(self.original_length) + self.stream

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        original_type = r.u4("original type")
        if original_type == ChunkType.ZLIB:
            raise r.error("original type is ZLIB: nested ZLIB is not allowed")
        original_length = r.u4("original length")
        return cls(original_type, original_length, r.rest())


def inflate_chunk(z: Zlib, direction: Direction, *, max_length: int) -> Chunk:
    """Inflate a ZLIB chunk and decode the chunk it wraps.

    The declared original length is checked against ``max_length`` before any inflating, and
    the inflater never produces more than original length + 1 bytes, so a small stream that
    inflates to gigabytes costs nothing. Wrong size, a corrupt or truncated stream, or bytes
    after the end of the stream raise RemoteProtocolError.
    """
    if max_length < 0:
        raise LocalProtocolError(f"inflate_chunk max_length {max_length} is negative")
    inner = type_name(z.original_type)
    if z.original_length > max_length:
        raise RemoteProtocolError(
            f"ZLIB: original length {z.original_length} of {inner} exceeds the limit {max_length}"
        )
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(z.stream, z.original_length + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(f"ZLIB: bad zlib stream for {inner}: {exc}") from exc
    if len(out) > z.original_length:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} inflates to more than the declared {z.original_length} bytes"
        )
    if not inflater.eof:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} is truncated ({len(z.stream)} bytes, no end of stream)"
        )
    if inflater.unused_data:
        raise RemoteProtocolError(
            f"ZLIB: {len(inflater.unused_data)} bytes follow the end of the stream for {inner}"
        )
    if len(out) != z.original_length:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} inflates to {len(out)} bytes, declared {z.original_length}"
        )
    return decode_chunk(z.original_type, out, direction)


def compress_chunk(chunk: Chunk, *, level: int = 6) -> Zlib:
    """Wrap ``chunk`` in a ZLIB chunk. Compressed bytes depend on the zlib build."""
    if isinstance(chunk, Zlib):
        raise LocalProtocolError("compress_chunk: a ZLIB chunk cannot wrap another ZLIB chunk")
    if not -1 <= level <= 9:
        raise LocalProtocolError(f"compress_chunk: zlib level {level} is outside -1..9")
    data = chunk.encode_data()
    return Zlib(chunk.chunk_type, len(data), zlib.compress(data, level))


# --------------------------------------------------------------------------------------------
# Threads: THEN, THCR, THDE, THNM, THST, STKL


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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
        return ThreadStatusDraft._decode(r)
    if header_length >= 4 and entry_length >= 18:
        (count,) = r.peek(_U2, 2)
        needed = header_length + count * entry_length
        if size < needed:
            raise r.error(
                f"shipped layout: {size} bytes of data, but header length {header_length} + "
                f"count {count} x entry length {entry_length} needs {needed}"
            )
        return ThreadStatus._decode(r)
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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


# --------------------------------------------------------------------------------------------
# Heap: HPIF, HPSG/HPSO/NHSG, HPST/HPEN/NHST/NHEN, HPGC, HPDU, HPDS, NHGT


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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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


# --------------------------------------------------------------------------------------------
# Allocation tracking: REAE, REAQ, REAL


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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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
    def _decode(cls, r: _Reader) -> Self:
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


# --------------------------------------------------------------------------------------------
# Method profiling: MPRS, MPRE, MPSS, MPSE, SPSS, SPSE, MPRQ


@dataclass(frozen=True, slots=True)
class MethodTraceStart(Chunk):
    """MPRS to the VM: u4 buffer size, u4 flags, str16 trace file path on the device."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRS
    buffer_size: int
    flags: int
    path: str

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)
        _check_str(self, "path", self.path)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags) + _str16(self.path)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"), r.str16("trace path"))


@dataclass(frozen=True, slots=True)
class MethodTraceEnd(_EmptyChunk):
    """MPRE to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRE


@dataclass(frozen=True, slots=True)
class MethodTraceEndResult(Chunk):
    """MPRE from the VM: u1 result, 0 = file written, 1 = failed."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRE
    result: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "result", self.result, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.result)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u1("result"))


@dataclass(frozen=True, slots=True)
class MethodTraceStreamStart(Chunk):
    """MPSS to the VM: u4 buffer size, u4 flags."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSS
    buffer_size: int
    flags: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"))


@dataclass(frozen=True, slots=True)
class MethodTraceStreamEnd(_EmptyChunk):
    """MPSE to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSE


@dataclass(frozen=True, slots=True)
class MethodTraceData(_OpaqueChunk):
    """MPSE pushed by the VM (after MPSE or SPSE): a whole trace file, opaque."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSE


@dataclass(frozen=True, slots=True)
class SamplingStart(Chunk):
    """SPSS to the VM: u4 buffer size, u4 flags, u4 sampling interval in microseconds."""

    TYPE: ClassVar[ChunkType] = ChunkType.SPSS
    buffer_size: int
    flags: int
    interval_us: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)
        _check_unsigned(self, "interval_us", self.interval_us, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags) + _U4.pack(self.interval_us)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"), r.u4("sampling interval"))


@dataclass(frozen=True, slots=True)
class SamplingEnd(_EmptyChunk):
    """SPSE to the VM: no data (the VM answers with an MPSE push)."""

    TYPE: ClassVar[ChunkType] = ChunkType.SPSE


@dataclass(frozen=True, slots=True)
class ProfilingQuery(_EmptyChunk):
    """MPRQ to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRQ


@dataclass(frozen=True, slots=True)
class ProfilingStatus(Chunk):
    """MPRQ from the VM: u1 state, 0 = off, 1 = method tracing, 2 = sampling."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRQ
    state: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "state", self.state, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.state)

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.u1("state"))


# --------------------------------------------------------------------------------------------
# View debugging and unknown types: raw data, byte-exact


@dataclass(frozen=True, slots=True)
class ViewDebug(Chunk):
    """VULW, VURT, VUOP or VUGL, either direction; the data is kept raw."""

    chunk_type: int = field()
    data: bytes

    def __post_init__(self) -> None:
        if self.chunk_type not in VIEW_DEBUG_TYPES:
            raise LocalProtocolError(
                f"ViewDebug.chunk_type {self.chunk_type!r} is not VULW, VURT, VUOP or VUGL"
            )
        object.__setattr__(self, "chunk_type", ChunkType(self.chunk_type))
        _check_bytes(self, "data", self.data)

    def encode_data(self) -> bytes:
        return self.data

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.chunk_type, r.rest())


@dataclass(frozen=True, slots=True)
class UnknownChunk(Chunk):
    """Any type without a class of its own (TEST, DTRC, types we have never heard of).

    Never an error on decode, and re-encodes byte-exact. Building one for a type that has a
    class of its own is a LocalProtocolError: decoding its bytes would give that class.
    """

    chunk_type: int = field()
    data: bytes

    def __post_init__(self) -> None:
        _check_unsigned(self, "chunk_type", self.chunk_type, 4)
        if self.chunk_type in _DECODERS[Direction.TO_VM]:
            raise LocalProtocolError(
                f"UnknownChunk.chunk_type {type_name(self.chunk_type)} has a class of its own"
            )
        _check_bytes(self, "data", self.data)

    def encode_data(self) -> bytes:
        return self.data

    @classmethod
    def _decode(cls, r: _Reader) -> Self:
        return cls(r.chunk_type, r.rest())


# --------------------------------------------------------------------------------------------
# Dispatch tables: (direction, type) -> decoder. Read-only after import.

_Decoder = Callable[[_Reader], Chunk]

_BOTH: Final[dict[int, _Decoder]] = {
    ChunkType.WAIT: WaitForDebugger._decode,
    ChunkType.APNM: AppName._decode,
    ChunkType.EXIT: ExitRequest._decode,
    ChunkType.DBGD: Dbgd._decode,
    ChunkType.ZLIB: Zlib._decode,
    ChunkType.FAIL: Fail._decode,
    ChunkType.THEN: ThreadNotify._decode,
    ChunkType.THCR: ThreadCreated._decode,
    ChunkType.THDE: ThreadDied._decode,
    ChunkType.THNM: ThreadRenamed._decode,
    ChunkType.HPSO: HeapSegmentObjects._decode,
    ChunkType.HPST: HeapStart._decode,
    ChunkType.HPEN: HeapEnd._decode,
    ChunkType.NHST: NativeHeapStart._decode,
    ChunkType.NHEN: NativeHeapEnd._decode,
    ChunkType.HPGC: GcRequest._decode,
    ChunkType.REAE: AllocTrackingEnable._decode,
    ChunkType.MPRS: MethodTraceStart._decode,
    ChunkType.MPSS: MethodTraceStreamStart._decode,
    ChunkType.SPSS: SamplingStart._decode,
    ChunkType.SPSE: SamplingEnd._decode,
    ChunkType.VULW: ViewDebug._decode,
    ChunkType.VURT: ViewDebug._decode,
    ChunkType.VUOP: ViewDebug._decode,
    ChunkType.VUGL: ViewDebug._decode,
}

_DECODERS: Final[Mapping[Direction, Mapping[int, _Decoder]]] = MappingProxyType(
    {
        Direction.TO_VM: MappingProxyType(
            {
                **_BOTH,
                ChunkType.HELO: HeloRequest._decode,
                ChunkType.FEAT: FeatRequest._decode,
                ChunkType.THST: ThreadStatusRequest._decode,
                ChunkType.STKL: StackTraceRequest._decode,
                ChunkType.HPIF: HeapInfoRequest._decode,
                ChunkType.HPSG: HeapSegmentRequest._decode,
                ChunkType.NHSG: NativeHeapSegmentRequest._decode,
                ChunkType.HPDU: HeapDumpRequest._decode,
                ChunkType.HPDS: HeapDumpStreamRequest._decode,
                ChunkType.REAQ: AllocTrackingQuery._decode,
                ChunkType.REAL: AllocationsRequest._decode,
                ChunkType.NHGT: NativeHeapRequest._decode,
                ChunkType.MPRE: MethodTraceEnd._decode,
                ChunkType.MPSE: MethodTraceStreamEnd._decode,
                ChunkType.MPRQ: ProfilingQuery._decode,
            }
        ),
        Direction.FROM_VM: MappingProxyType(
            {
                **_BOTH,
                ChunkType.HELO: HeloReply._decode,
                ChunkType.FEAT: FeatReply._decode,
                ChunkType.THST: _decode_thst_from_vm,
                ChunkType.STKL: StackTrace._decode,
                ChunkType.HPIF: HeapInfo._decode,
                ChunkType.HPSG: HeapSegment._decode,
                ChunkType.NHSG: NativeHeapSegment._decode,
                ChunkType.HPDU: HeapDumpResult._decode,
                ChunkType.HPDS: HeapDumpStream._decode,
                ChunkType.REAQ: AllocTrackingStatus._decode,
                ChunkType.REAL: Allocations._decode,
                ChunkType.NHGT: NativeHeapSnapshot._decode,
                ChunkType.MPRE: MethodTraceEndResult._decode,
                ChunkType.MPSE: MethodTraceData._decode,
                ChunkType.MPRQ: ProfilingStatus._decode,
            }
        ),
    }
)


# --------------------------------------------------------------------------------------------
# Framing


def _as_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _decode_view(chunk_type: int, data: memoryview, direction: Direction) -> Chunk:
    decoder = _DECODERS[direction].get(chunk_type)
    if decoder is None:
        return UnknownChunk(chunk_type, bytes(data))
    r = _Reader(chunk_type, data)
    try:
        chunk = decoder(r)
    except LocalProtocolError as exc:  # a value the wire can carry but a message cannot
        raise r.error(str(exc)) from exc
    r.finish()
    return chunk


def decode_chunk(
    chunk_type: int, data: bytes | bytearray | memoryview, direction: Direction
) -> Chunk:
    """Decode the data of one chunk whose type is ``chunk_type`` travelling ``direction``."""
    if not isinstance(direction, Direction):
        raise LocalProtocolError(f"decode_chunk: direction must be a Direction, not {direction!r}")
    if not isinstance(chunk_type, int) or not 0 <= chunk_type <= 0xFFFFFFFF:
        raise LocalProtocolError(f"decode_chunk: chunk type {chunk_type!r} is not a u4")
    return _decode_view(chunk_type, _as_view(data), direction)


def decode_chunks(data: bytes | bytearray | memoryview, direction: Direction) -> tuple[Chunk, ...]:
    """Decode every chunk of a DDM packet's data, in order (empty data gives no chunks).

    Rejects a chunk header or chunk data running past the end, and 1-7 bytes left over.
    """
    if not isinstance(direction, Direction):
        raise LocalProtocolError(f"decode_chunks: direction must be a Direction, not {direction!r}")
    view = _as_view(data)
    end = len(view)
    pos = 0
    chunks: list[Chunk] = []
    while pos < end:
        if end - pos < CHUNK_HEADER_SIZE:
            raise RemoteProtocolError(
                f"DDM: {end - pos} bytes left over at offset {pos} after {len(chunks)} chunks; "
                f"a chunk header needs {CHUNK_HEADER_SIZE}"
            )
        chunk_type, length = _CHUNK_HEADER.unpack_from(view, pos)
        start = pos + CHUNK_HEADER_SIZE
        if length > end - start:
            raise RemoteProtocolError(
                f"DDM: {type_name(chunk_type)} chunk at offset {pos} declares {length} bytes of "
                f"data, only {end - start} remain"
            )
        chunks.append(_decode_view(chunk_type, view[start : start + length], direction))
        pos = start + length
    return tuple(chunks)


def split_chunks(data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
    """The chunks of a DDM packet's data as (type, data) pairs, not decoded (what chunk
    handlers get); the same framing checks as ``decode_chunks``."""
    view = _as_view(data)
    end = len(view)
    pos = 0
    out: list[tuple[int, bytes]] = []
    while pos < end:
        if end - pos < CHUNK_HEADER_SIZE:
            raise RemoteProtocolError(
                f"DDM: {end - pos} bytes left over at offset {pos} after {len(out)} chunks; "
                f"a chunk header needs {CHUNK_HEADER_SIZE}"
            )
        chunk_type, length = _CHUNK_HEADER.unpack_from(view, pos)
        start = pos + CHUNK_HEADER_SIZE
        if length > end - start:
            raise RemoteProtocolError(
                f"DDM: {type_name(chunk_type)} chunk at offset {pos} declares {length} bytes of "
                f"data, only {end - start} remain"
            )
        out.append((chunk_type, bytes(view[start : start + length])))
        pos = start + length
    return out


def chunk_type_code(name: str) -> int:
    """The u4 of a four-character chunk type name ("THST" -> 0x54485354)."""
    raw = name.encode("ascii", "strict") if name.isascii() else b""
    if len(raw) != 4:
        raise LocalProtocolError(f"a chunk type is four ASCII characters, not {name!r}")
    return int.from_bytes(raw, "big")


def raw_chunk(chunk_type: int, data: bytes) -> bytes:
    """One chunk from its type and data, as they are (no class, no checks of the data)."""
    if len(data) > 0xFFFFFFFF:
        raise LocalProtocolError(f"chunk data of {len(data)} bytes does not fit a u4")
    return _CHUNK_HEADER.pack(chunk_type, len(data)) + data


def encode_chunk(chunk: Chunk) -> bytes:
    """One chunk: 8-byte header (type, data length) + data."""
    data = chunk.encode_data()
    if len(data) > 0xFFFFFFFF:
        raise LocalProtocolError(
            f"{type_name(chunk.chunk_type)} chunk data of {len(data)} bytes does not fit a u4"
        )
    return _CHUNK_HEADER.pack(chunk.chunk_type, len(data)) + data


def encode_chunks(chunks: Iterable[Chunk]) -> bytes:
    """Several chunks back to back (only ddmd's own tests use more than one per packet)."""
    return b"".join(encode_chunk(c) for c in chunks)


# --------------------------------------------------------------------------------------------
# Packet helpers


def ddm_command(packet_id: int, chunk: Chunk) -> CommandPacket:
    """A DDM command packet (set 199, command 1) carrying exactly one chunk."""
    return CommandPacket(packet_id, CommandSet.DDM, DDM_COMMAND, encode_chunk(chunk))


def is_ddm(packet: object) -> bool:
    """True for a command packet of command set 199, command 1."""
    return (
        isinstance(packet, CommandPacket)
        and packet.command_set == CommandSet.DDM
        and packet.command == DDM_COMMAND
    )


def chunks_of(packet: CommandPacket | ReplyPacket, direction: Direction) -> tuple[Chunk, ...]:
    """The chunks in a DDM command, or in the reply to one (an empty reply has none).

    A command packet that is not DDM is a LocalProtocolError; a reply carries no command
    set, so the caller vouches that it answers a DDM command.
    """
    if isinstance(packet, CommandPacket) and not is_ddm(packet):
        raise LocalProtocolError(
            f"chunks_of: command packet {packet.command_set}/{packet.command} is not DDM (199/1)"
        )
    return decode_chunks(packet.data, direction)
