"""JDWP framing: handshake, the 11-byte header, command and reply packets, an incremental decoder.

Layer rule: protocol/ is SANS-IO. Standard library only; no trio, structlog, sockets or clock.

Wire facts (protocol.md section 1): every packet starts with an 11-byte header, big-endian:
u4 length (header included), u4 id, u1 flags (0x00 command, 0x80 reply), then either u1 command
set + u1 command (command) or u2 error code (reply). The connection opens with the 14 ASCII bytes
``JDWP-Handshake`` in each direction.

``PacketDecoder`` takes bytes in any split and hands out events: an optional ``Handshake`` first,
then whole ``CommandPacket``/``ReplyPacket`` objects, or, for packets longer than a configured
threshold, a ``PacketStart`` (the header, available before the body has arrived) followed by
``PacketPiece`` chunks of the body, so a relay can forward very large packets with bounded memory.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from .errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "DDM_COMMAND",
    "DEFAULT_MAX_PACKET",
    "EOF",
    "HANDSHAKE",
    "HEADER_SIZE",
    "MAX_LENGTH",
    "NEED_DATA",
    "CommandPacket",
    "CommandSet",
    "ConnectionClosed",
    "ErrorCode",
    "EventCommand",
    "EventKind",
    "Flag",
    "Handshake",
    "IdSizes",
    "Packet",
    "PacketDecoder",
    "PacketEvent",
    "PacketHeader",
    "PacketPiece",
    "PacketStart",
    "ReplyPacket",
    "SuspendPolicy",
    "VirtualMachineCommand",
    "decode_packet",
    "encode",
    "encode_header",
]

HANDSHAKE: Final = b"JDWP-Handshake"
HEADER_SIZE: Final = 11
DEFAULT_MAX_PACKET: Final = 1 << 30  # 1 GiB; HPDS/MPSE chunks carry whole files in one packet
DDM_COMMAND: Final = 1  # DDM is command set 199, command 1
MAX_LENGTH: Final = 0xFFFF_FFFF  # the length field's own bound: 4 GiB - 1

_U4_MAX: Final = MAX_LENGTH
_COMMAND_HEADER = struct.Struct(">IIBBB")
_REPLY_HEADER = struct.Struct(">IIBH")
_ID_SIZES = struct.Struct(">iiiii")


class Flag(enum.IntFlag):
    """Header flag bits. A command has no bit set."""

    REPLY = 0x80


class CommandSet(enum.IntEnum):
    """JDWP command sets (jdwp.spec), plus the vendor set Android uses for DDM."""

    VIRTUAL_MACHINE = 1
    REFERENCE_TYPE = 2
    CLASS_TYPE = 3
    ARRAY_TYPE = 4
    INTERFACE_TYPE = 5
    METHOD = 6
    FIELD = 8
    OBJECT_REFERENCE = 9
    STRING_REFERENCE = 10
    THREAD_REFERENCE = 11
    THREAD_GROUP_REFERENCE = 12
    ARRAY_REFERENCE = 13
    CLASS_LOADER_REFERENCE = 14
    EVENT_REQUEST = 15
    STACK_FRAME = 16
    CLASS_OBJECT_REFERENCE = 17
    MODULE_REFERENCE = 18
    EVENT = 64
    DDM = 199


class VirtualMachineCommand(enum.IntEnum):
    """Commands of the VirtualMachine command set (1)."""

    VERSION = 1
    CLASSES_BY_SIGNATURE = 2
    ALL_CLASSES = 3
    ALL_THREADS = 4
    TOP_LEVEL_THREAD_GROUPS = 5
    DISPOSE = 6
    ID_SIZES = 7
    SUSPEND = 8
    RESUME = 9
    EXIT = 10
    CREATE_STRING = 11
    CAPABILITIES = 12
    CLASS_PATHS = 13
    DISPOSE_OBJECTS = 14
    HOLD_EVENTS = 15
    RELEASE_EVENTS = 16
    CAPABILITIES_NEW = 17
    REDEFINE_CLASSES = 18
    SET_DEFAULT_STRATUM = 19
    ALL_CLASSES_WITH_GENERIC = 20
    INSTANCE_COUNTS = 21
    ALL_MODULES = 22


class EventCommand(enum.IntEnum):
    """Commands of the Event command set (64)."""

    COMPOSITE = 100


class EventKind(enum.IntEnum):
    """Event kinds carried in Event.Composite."""

    SINGLE_STEP = 1
    BREAKPOINT = 2
    FRAME_POP = 3
    EXCEPTION = 4
    USER_DEFINED = 5
    THREAD_START = 6
    THREAD_DEATH = 7
    CLASS_PREPARE = 8
    CLASS_UNLOAD = 9
    CLASS_LOAD = 10
    FIELD_ACCESS = 20
    FIELD_MODIFICATION = 21
    EXCEPTION_CATCH = 30
    METHOD_ENTRY = 40
    METHOD_EXIT = 41
    METHOD_EXIT_WITH_RETURN_VALUE = 42
    MONITOR_CONTENDED_ENTER = 43
    MONITOR_CONTENDED_ENTERED = 44
    MONITOR_WAIT = 45
    MONITOR_WAITED = 46
    VM_START = 90
    VM_DEATH = 99
    VM_DISCONNECTED = 100


class SuspendPolicy(enum.IntEnum):
    NONE = 0
    EVENT_THREAD = 1
    ALL = 2


class ErrorCode(enum.IntEnum):
    """JDWP error codes (jdwp.spec). Values we do not list are carried as plain ints."""

    NONE = 0
    INVALID_THREAD = 10
    INVALID_THREAD_GROUP = 11
    INVALID_PRIORITY = 12
    THREAD_NOT_SUSPENDED = 13
    THREAD_SUSPENDED = 14
    THREAD_NOT_ALIVE = 15
    INVALID_OBJECT = 20
    INVALID_CLASS = 21
    CLASS_NOT_PREPARED = 22
    INVALID_METHODID = 23
    INVALID_LOCATION = 24
    INVALID_FIELDID = 25
    INVALID_FRAMEID = 30
    NO_MORE_FRAMES = 31
    OPAQUE_FRAME = 32
    NOT_CURRENT_FRAME = 33
    TYPE_MISMATCH = 34
    INVALID_SLOT = 35
    DUPLICATE = 40
    NOT_FOUND = 41
    INVALID_MODULE = 42
    INVALID_MONITOR = 50
    NOT_MONITOR_OWNER = 51
    INTERRUPT = 52
    INVALID_CLASS_FORMAT = 60
    CIRCULAR_CLASS_DEFINITION = 61
    FAILS_VERIFICATION = 62
    ADD_METHOD_NOT_IMPLEMENTED = 63
    SCHEMA_CHANGE_NOT_IMPLEMENTED = 64
    INVALID_TYPESTATE = 65
    HIERARCHY_CHANGE_NOT_IMPLEMENTED = 66
    DELETE_METHOD_NOT_IMPLEMENTED = 67
    UNSUPPORTED_VERSION = 68
    NAMES_DONT_MATCH = 69
    CLASS_MODIFIERS_CHANGE_NOT_IMPLEMENTED = 70
    METHOD_MODIFIERS_CHANGE_NOT_IMPLEMENTED = 71
    CLASS_ATTRIBUTE_CHANGE_NOT_IMPLEMENTED = 72
    NOT_IMPLEMENTED = 99
    NULL_POINTER = 100
    ABSENT_INFORMATION = 101
    INVALID_EVENT_TYPE = 102
    ILLEGAL_ARGUMENT = 103
    OUT_OF_MEMORY = 110
    ACCESS_DENIED = 111
    VM_DEAD = 112
    INTERNAL = 113
    UNATTACHED_THREAD = 115
    INVALID_TAG = 500
    ALREADY_INVOKING = 502
    INVALID_INDEX = 503
    INVALID_LENGTH = 504
    INVALID_STRING = 506
    INVALID_CLASS_LOADER = 507
    INVALID_ARRAY = 508
    TRANSPORT_LOAD = 509
    TRANSPORT_INIT = 510
    NATIVE_METHOD = 511
    INVALID_COUNT = 512


def _check_u4(name: str, value: int) -> None:
    if not 0 <= value <= _U4_MAX:
        raise LocalProtocolError(f"JDWP {name} {value!r} is outside u4 range")


def _check_data(data: object) -> None:
    if type(data) is not bytes:
        raise LocalProtocolError(f"JDWP packet data must be bytes, not {type(data).__name__}")


@dataclass(frozen=True, slots=True)
class CommandPacket:
    """A JDWP command (flags 0x00). ``id`` is chosen by its sender."""

    id: int
    command_set: int
    command: int
    data: bytes = b""

    def __post_init__(self) -> None:
        # The checks are written out, not called: a packet is made per command relayed on the
        # general path, and a call each costs more than the check.
        if not 0 <= self.id <= _U4_MAX:
            _check_u4("id", self.id)
        if not 0 <= self.command_set <= 0xFF:
            raise LocalProtocolError(f"JDWP command set {self.command_set!r} is not a u1")
        if not 0 <= self.command <= 0xFF:
            raise LocalProtocolError(f"JDWP command {self.command!r} is not a u1")
        if type(self.data) is not bytes:
            _check_data(self.data)
        if len(self.data) > _U4_MAX - HEADER_SIZE:
            raise LocalProtocolError(f"JDWP packet data of {len(self.data)} bytes is too long")

    @property
    def length(self) -> int:
        return HEADER_SIZE + len(self.data)


@dataclass(frozen=True, slots=True)
class ReplyPacket:
    """A JDWP reply (flags 0x80). ``id`` repeats the command's id; data is empty when error != 0."""

    id: int
    error_code: int = 0
    data: bytes = b""

    def __post_init__(self) -> None:
        if not 0 <= self.id <= _U4_MAX:  # written out, as in CommandPacket
            _check_u4("id", self.id)
        if not 0 <= self.error_code <= 0xFFFF:
            raise LocalProtocolError(f"JDWP error code {self.error_code!r} is not a u2")
        if type(self.data) is not bytes:
            _check_data(self.data)
        if len(self.data) > _U4_MAX - HEADER_SIZE:
            raise LocalProtocolError(f"JDWP packet data of {len(self.data)} bytes is too long")

    @property
    def length(self) -> int:
        return HEADER_SIZE + len(self.data)


Packet = CommandPacket | ReplyPacket


@dataclass(frozen=True, slots=True)
class PacketHeader:
    """The 11-byte header on its own, as the decoder sees it before the body arrives.

    For a reply, ``command_set``/``command`` are the two bytes of the error code.
    """

    length: int
    id: int
    flags: int
    command_set: int
    command: int

    @property
    def is_reply(self) -> bool:
        return bool(self.flags & Flag.REPLY)

    @property
    def error_code(self) -> int:
        return (self.command_set << 8) | self.command

    def with_id(self, new_id: int) -> PacketHeader:
        _check_u4("id", new_id)
        return PacketHeader(self.length, new_id, self.flags, self.command_set, self.command)


@dataclass(frozen=True, slots=True)
class Handshake:
    """The peer's 14-byte ``JDWP-Handshake`` arrived."""


@dataclass(frozen=True, slots=True)
class PacketStart:
    """The header of a packet whose body is relayed in pieces (longer than the stream threshold)."""

    header: PacketHeader


@dataclass(frozen=True, slots=True)
class PacketPiece:
    """Part of a streamed packet's body; ``last`` marks the piece that completes the packet."""

    data: bytes
    last: bool


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed the stream at a packet boundary."""


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()
EOF: Final = ConnectionClosed()

PacketEvent = Handshake | CommandPacket | ReplyPacket | PacketStart | PacketPiece | ConnectionClosed


def encode_header(header: PacketHeader) -> bytes:
    """The 11 header bytes for ``header`` (used when relaying a streamed packet)."""
    return _COMMAND_HEADER.pack(
        header.length, header.id, header.flags, header.command_set, header.command
    )


def encode(packet: Packet) -> bytes:
    """Bytes of one whole packet, header included."""
    if isinstance(packet, CommandPacket):
        head = _COMMAND_HEADER.pack(
            HEADER_SIZE + len(packet.data), packet.id, 0, packet.command_set, packet.command
        )
    else:
        head = _REPLY_HEADER.pack(
            HEADER_SIZE + len(packet.data), packet.id, Flag.REPLY, packet.error_code
        )
    return head + packet.data


def _make_packet(flags: int, pid: int, b9: int, b10: int, body: bytes) -> Packet:
    if flags & Flag.REPLY:
        return ReplyPacket(pid, (b9 << 8) | b10, body)
    return CommandPacket(pid, b9, b10, body)


def decode_packet(data: bytes, *, max_length: int = DEFAULT_MAX_PACKET) -> Packet:
    """Decode exactly one whole packet; short, long or malformed input is a RemoteProtocolError."""
    if len(data) < HEADER_SIZE:
        raise RemoteProtocolError(f"JDWP packet of {len(data)} bytes is shorter than its header")
    length, pid, flags, b9, b10 = _COMMAND_HEADER.unpack_from(data)
    _check_length(length, max_length)
    _check_flags(flags)
    if length != len(data):
        raise RemoteProtocolError(
            f"JDWP length field {length} does not match the {len(data)} bytes given"
        )
    return _make_packet(flags, pid, b9, b10, bytes(data[HEADER_SIZE:]))


def _check_length(length: int, max_length: int) -> None:
    if length < HEADER_SIZE:
        raise RemoteProtocolError(f"JDWP length {length} < header size {HEADER_SIZE}")
    if length > max_length:
        raise RemoteProtocolError(f"JDWP length {length} exceeds the configured cap {max_length}")


def _check_flags(flags: int) -> None:
    if flags not in (0, Flag.REPLY):
        raise RemoteProtocolError(f"JDWP flags 0x{flags:02x} are neither command nor reply")


class PacketDecoder:
    """Incremental JDWP decoder: bytes in any split, events out.

    ``receive_data(b"")`` signals EOF. ``next_event()`` returns one event or ``NEED_DATA``.
    After a ``RemoteProtocolError`` the decoder stays broken and raises the same error again.

    With ``stream_threshold`` set, a packet whose length exceeds it is not buffered whole:
    ``next_event`` returns ``PacketStart`` as soon as its header is in, then ``PacketPiece``
    objects with whatever body bytes are buffered, the last one flagged ``last``.

    ``max_length`` caps what the decoder buffers whole. A streamed packet is never held, so it
    is capped by ``max_streamed`` instead (default: ``max_length``; a caller that decides per
    packet what it gathers, like the router, passes ``MAX_LENGTH`` and applies the cap itself).
    """

    __slots__ = (
        "_eof",
        "_error",
        "_expect_handshake",
        "_max_length",
        "_max_streamed",
        "_pos",
        "_remaining",
        "_stream_threshold",
        "held",
    )

    def __init__(
        self,
        *,
        max_length: int = DEFAULT_MAX_PACKET,
        expect_handshake: bool = False,
        stream_threshold: int | None = None,
        max_streamed: int | None = None,
    ) -> None:
        if max_length < HEADER_SIZE:
            raise LocalProtocolError(f"max_length {max_length} is below the header size")
        if stream_threshold is not None and stream_threshold < HEADER_SIZE:
            raise LocalProtocolError(f"stream_threshold {stream_threshold} is below header size")
        self.held = bytearray()
        self._pos = 0
        self._max_length = max_length
        self._expect_handshake = expect_handshake
        self._stream_threshold = stream_threshold
        self._max_streamed = max_length if max_streamed is None else max_streamed
        self._remaining = 0  # body bytes still to come of a streamed packet
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out."""
        return len(self.held) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes from the peer; empty bytes mean the peer closed its side."""
        if self._eof:
            if data:
                raise LocalProtocolError("data received after EOF")
            return
        if not data:
            self._eof = True
            return
        if self._pos and self._pos * 2 >= len(self.held):
            del self.held[: self._pos]
            self._pos = 0
        self.held += data

    def peek_header(self) -> PacketHeader | None:
        """The header of the next packet if its 11 bytes are buffered, without consuming it."""
        if self._expect_handshake or self._remaining or self.buffered < HEADER_SIZE:
            return None
        return PacketHeader(*_COMMAND_HEADER.unpack_from(self.held, self._pos))

    def next_event(self) -> PacketEvent | _NeedData:
        if self._error is not None:
            raise self._error
        try:
            return self._next_event()
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def next_packet(self) -> PacketEvent | _NeedData:
        """Alias of ``next_event`` for callers that only deal in packets."""
        return self.next_event()

    def _next_event(self) -> PacketEvent | _NeedData:
        buf = self.held
        pos = self._pos
        avail = len(buf) - pos
        if self._remaining:
            if not avail:
                return self._need_data()
            take = min(avail, self._remaining)
            piece = bytes(buf[pos : pos + take])
            self._consumed(pos + take)
            self._remaining -= take
            return PacketPiece(piece, self._remaining == 0)
        if self._expect_handshake:
            size = len(HANDSHAKE)
            if avail < size:
                if avail and buf[pos : pos + avail] != HANDSHAKE[:avail]:
                    raise RemoteProtocolError(
                        f"bad JDWP handshake: got {bytes(buf[pos : pos + avail])!r}"
                    )
                return self._need_data()
            got = bytes(buf[pos : pos + size])
            if got != HANDSHAKE:
                raise RemoteProtocolError(f"bad JDWP handshake: got {got!r}")
            self._consumed(pos + size)
            self._expect_handshake = False
            return Handshake()
        if avail < HEADER_SIZE:
            return self._need_data()
        length, pid, flags, b9, b10 = _COMMAND_HEADER.unpack_from(buf, pos)
        threshold = self._stream_threshold
        streamed = threshold is not None and length > threshold
        if length < HEADER_SIZE or length > self._max_length:
            _check_length(length, self._max_streamed if streamed else self._max_length)
        if flags and flags != Flag.REPLY:
            _check_flags(flags)
        if streamed:
            self._consumed(pos + HEADER_SIZE)
            self._remaining = length - HEADER_SIZE
            return PacketStart(PacketHeader(length, pid, flags, b9, b10))
        if avail < length:
            return self._need_data()
        body = bytes(buf[pos + HEADER_SIZE : pos + length])
        self._consumed(pos + length)
        if flags:
            return ReplyPacket(pid, (b9 << 8) | b10, body)
        return CommandPacket(pid, b9, b10, body)

    def _consumed(self, end: int) -> None:
        """Everything before ``end`` is handed out; an empty buffer is emptied (``held``)."""
        if end >= len(self.held):
            self.held.clear()
            self._pos = 0
        else:
            self._pos = end

    def _need_data(self) -> PacketEvent | _NeedData:
        if not self._eof:
            return NEED_DATA
        if self.buffered or self._remaining:
            what = "handshake" if self._expect_handshake else "packet"
            raise RemoteProtocolError(
                f"JDWP connection closed in the middle of a {what} ({self.buffered} bytes buffered)"
            )
        return EOF


@dataclass(frozen=True, slots=True)
class IdSizes:
    """The reply to VirtualMachine.IDSizes: sizes in bytes of the variable-size ids."""

    field_id: int
    method_id: int
    object_id: int
    reference_type_id: int
    frame_id: int

    @classmethod
    def decode(cls, data: bytes) -> IdSizes:
        if len(data) != 20:
            raise RemoteProtocolError(f"IDSizes reply of {len(data)} bytes, expected 20")
        values = _ID_SIZES.unpack(data)
        for v in values:
            if v not in (1, 2, 4, 8):
                raise RemoteProtocolError(f"IDSizes reply carries an id size of {v}")
        return cls(*values)

    def encode(self) -> bytes:
        return _ID_SIZES.pack(
            self.field_id, self.method_id, self.object_id, self.reference_type_id, self.frame_id
        )
