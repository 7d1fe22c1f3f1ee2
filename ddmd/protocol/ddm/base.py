"""Shared ground of the DDM chunk codecs: the chunk-type, direction and thread-state enums,
the checks that reject a badly built message (LocalProtocolError), string and flag encoding,
the ``_Reader`` cursor every decoder reads through, and the ``Chunk`` base classes."""

from __future__ import annotations

import enum
import functools
import struct
from dataclasses import dataclass
from typing import ClassVar, Final, Self

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError

CHUNK_HEADER_SIZE: Final = 8

_U1 = struct.Struct(">B")
_U2 = struct.Struct(">H")
_S2 = struct.Struct(">h")
_U4 = struct.Struct(">I")
_S4 = struct.Struct(">i")
_U8 = struct.Struct(">Q")
_CHUNK_HEADER = struct.Struct(">II")

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


@functools.lru_cache(maxsize=256)
def type_name(value: int) -> str:
    """The four ASCII characters of a chunk type, or its hex value if they are not printable.

    Cached (bounded: a VM may send any number of made-up types): every chunk read names its
    type, and a monitor reads thousands of chunks a second."""
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
    def from_reader(cls, r: _Reader) -> Self:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _EmptyChunk(Chunk):
    """A chunk whose data is empty."""

    def encode_data(self) -> bytes:
        return b""

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
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
    def from_reader(cls, r: _Reader) -> Self:
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
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("heap id"))
