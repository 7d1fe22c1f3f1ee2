"""JDWP event requests and event packets: what a proxy for several debuggers must read and write.

Layer rule: protocol/ is SANS-IO. Standard library only; no trio, structlog, sockets or clock.

Layouts (OpenJDK ``src/java.se/share/data/jdwp/jdwp.spec``; ``o``, ``r``, ``m``, ``f`` are the
object, reference type, method and field id sizes of the VM's IDSizes reply):

    EventRequest.Set (15/1)    u1 eventKind, u1 suspendPolicy, s4 modifiers, modifiers...
                     reply     s4 requestID
    EventRequest.Clear (15/2)  u1 eventKind, s4 requestID; empty reply
    ClearAllBreakpoints (15/3) no data; empty reply
    Event.Composite (64/100)   u1 suspendPolicy, s4 events, then per event:
                               u1 eventKind, s4 requestID, kind-specific data:

    location       u1 type tag, r class, m method, u8 index
    tagged object  u1 tag, o object
    value          u1 tag, then as many bytes as the tag says (``VALUE_SIZES``)

    SINGLE_STEP, BREAKPOINT, METHOD_ENTRY, METHOD_EXIT   o thread, location
    METHOD_EXIT_WITH_RETURN_VALUE                        o thread, location, value
    MONITOR_CONTENDED_ENTER, MONITOR_CONTENDED_ENTERED   o thread, tagged object, location
    MONITOR_WAIT                                         ... the same, s8 timeout
    MONITOR_WAITED                                       ... the same, u1 timed_out
    EXCEPTION            o thread, location, tagged object, location (catch)
    THREAD_START, THREAD_DEATH, VM_START                 o thread
    CLASS_PREPARE        o thread, u1 refTypeTag, r type, string signature, s4 status
    CLASS_UNLOAD         string signature
    FIELD_ACCESS         o thread, location, u1 refTypeTag, r type, f field, tagged object
    FIELD_MODIFICATION   ... the same, value
    VM_DEATH             nothing

A composite can only be split into its events when the length of every event is known: a kind
not listed here (the spec sends no others), or a value tag it does not define, raises
``UnknownEventKind``. The one event of a single-event composite needs no sizing at all.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from .errors import LocalProtocolError, RemoteProtocolError
from .jdwp import EventKind, IdSizes, SuspendPolicy

__all__ = [
    "CLEARABLE_KINDS",
    "THREAD_FIRST_KINDS",
    "VALUE_SIZES",
    "Composite",
    "Event",
    "EventRequestClear",
    "EventRequestSet",
    "UnknownEventKind",
    "decode_composite",
    "decode_int",
    "decode_object_id",
    "encode_composite",
    "encode_int",
    "encode_object_id",
    "event_thread",
    "peek_composite",
    "strongest",
]

_S4 = struct.Struct(">i")
_HEAD = struct.Struct(">Bi")  # suspendPolicy, event count
_EVENT_HEAD = struct.Struct(">Bi")  # eventKind, requestID
_SET_HEAD = struct.Struct(">BBi")
_CLEAR = struct.Struct(">Bi")

#: Bytes of a value after its tag, by tag (jdwp.spec, ConstantSet Tag). None: an object id.
VALUE_SIZES: Final[dict[int, int | None]] = {
    ord("["): None,  # array
    ord("B"): 1,  # byte
    ord("C"): 2,  # char
    ord("L"): None,  # object
    ord("D"): 8,  # double
    ord("F"): 4,  # float
    ord("I"): 4,  # int
    ord("J"): 8,  # long
    ord("S"): 2,  # short
    ord("V"): 0,  # void
    ord("Z"): 1,  # boolean
    ord("s"): None,  # string
    ord("t"): None,  # thread
    ord("g"): None,  # thread group
    ord("l"): None,  # class loader
    ord("c"): None,  # class object
}

#: Kinds whose data starts with the thread the event happened in.
THREAD_FIRST_KINDS: Final = frozenset(
    {
        EventKind.SINGLE_STEP,
        EventKind.BREAKPOINT,
        EventKind.EXCEPTION,
        EventKind.THREAD_START,
        EventKind.THREAD_DEATH,
        EventKind.CLASS_PREPARE,
        EventKind.FIELD_ACCESS,
        EventKind.FIELD_MODIFICATION,
        EventKind.METHOD_ENTRY,
        EventKind.METHOD_EXIT,
        EventKind.METHOD_EXIT_WITH_RETURN_VALUE,
        EventKind.MONITOR_CONTENDED_ENTER,
        EventKind.MONITOR_CONTENDED_ENTERED,
        EventKind.MONITOR_WAIT,
        EventKind.MONITOR_WAITED,
        EventKind.VM_START,
    }
)

#: Kinds OpenJDK's agent accepts in EventRequest.Set/Clear (``jdwp2EventIndex`` in libjdwp's
#: util.c); a Clear of any other kind is answered INVALID_EVENT_TYPE.
CLEARABLE_KINDS: Final = frozenset(
    {
        EventKind.SINGLE_STEP,
        EventKind.BREAKPOINT,
        EventKind.FRAME_POP,
        EventKind.EXCEPTION,
        EventKind.THREAD_START,
        EventKind.THREAD_DEATH,
        EventKind.CLASS_PREPARE,
        EventKind.CLASS_UNLOAD,
        EventKind.CLASS_LOAD,
        EventKind.FIELD_ACCESS,
        EventKind.FIELD_MODIFICATION,
        EventKind.EXCEPTION_CATCH,
        EventKind.METHOD_ENTRY,
        EventKind.METHOD_EXIT,
        EventKind.METHOD_EXIT_WITH_RETURN_VALUE,
        EventKind.MONITOR_CONTENDED_ENTER,
        EventKind.MONITOR_CONTENDED_ENTERED,
        EventKind.MONITOR_WAIT,
        EventKind.MONITOR_WAITED,
        EventKind.VM_START,
        EventKind.VM_DEATH,
    }
)


class UnknownEventKind(RemoteProtocolError):
    """An event whose length cannot be known (a kind or value tag the spec does not define),
    so the composite cannot be split into its events."""

    def __init__(self, message: str, kind: int) -> None:
        super().__init__(message)
        self.kind = kind


def _check_s4(name: str, value: int) -> None:
    if not -(1 << 31) <= value < (1 << 31):
        raise LocalProtocolError(f"JDWP {name} {value!r} is not an s4")


def _check_u1(name: str, value: int) -> None:
    if not 0 <= value <= 0xFF:
        raise LocalProtocolError(f"JDWP {name} {value!r} is not a u1")


# ---------------------------------------------------------------------------------- small values


def decode_int(data: bytes, offset: int = 0) -> int:
    """The s4 at ``offset`` (a requestID reply, a suspend count)."""
    if len(data) < offset + 4:
        raise RemoteProtocolError(f"JDWP int expected at {offset} of {len(data)} bytes")
    value: int = _S4.unpack_from(data, offset)[0]
    return value


def encode_int(value: int) -> bytes:
    _check_s4("int", value)
    return _S4.pack(value)


def decode_object_id(data: bytes, size: int, offset: int = 0) -> int:
    """An object id (a thread, say) of ``size`` bytes at ``offset``."""
    if len(data) < offset + size:
        raise RemoteProtocolError(
            f"JDWP object id of {size} bytes expected at {offset} of {len(data)} bytes"
        )
    return int.from_bytes(data[offset : offset + size], "big")


def encode_object_id(value: int, size: int) -> bytes:
    if not 0 <= value < (1 << (8 * size)):
        raise LocalProtocolError(f"object id {value!r} does not fit in {size} bytes")
    return value.to_bytes(size, "big")


# ---------------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class EventRequestSet:
    """EventRequest.Set: the modifiers are carried as bytes (a proxy never needs them)."""

    event_kind: int
    suspend_policy: int
    modifier_count: int = 0
    modifiers: bytes = b""

    def __post_init__(self) -> None:
        _check_u1("event kind", self.event_kind)
        _check_u1("suspend policy", self.suspend_policy)
        _check_s4("modifier count", self.modifier_count)

    @classmethod
    def decode(cls, data: bytes) -> EventRequestSet:
        if len(data) < _SET_HEAD.size:
            raise RemoteProtocolError(f"EventRequest.Set of {len(data)} bytes is too short")
        kind, policy, count = _SET_HEAD.unpack_from(data)
        return cls(kind, policy, count, bytes(data[_SET_HEAD.size :]))

    def encode(self) -> bytes:
        return (
            _SET_HEAD.pack(self.event_kind, self.suspend_policy, self.modifier_count)
            + self.modifiers
        )


@dataclass(frozen=True, slots=True)
class EventRequestClear:
    """EventRequest.Clear."""

    event_kind: int
    request_id: int

    def __post_init__(self) -> None:
        _check_u1("event kind", self.event_kind)
        _check_s4("request id", self.request_id)

    @classmethod
    def decode(cls, data: bytes) -> EventRequestClear:
        if len(data) != _CLEAR.size:
            raise RemoteProtocolError(f"EventRequest.Clear of {len(data)} bytes, expected 5")
        kind, request_id = _CLEAR.unpack(data)
        return cls(kind, request_id)

    def encode(self) -> bytes:
        return _CLEAR.pack(self.event_kind, self.request_id)


# ---------------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a composite: its kind, the request that caused it (0: an automatic event),
    and its kind-specific data, as bytes."""

    kind: int
    request_id: int
    body: bytes = b""

    def __post_init__(self) -> None:
        _check_u1("event kind", self.kind)
        _check_s4("request id", self.request_id)
        if type(self.body) is not bytes:
            raise LocalProtocolError("event data must be bytes")


@dataclass(frozen=True, slots=True)
class Composite:
    """Event.Composite: the suspend policy the VM applied, and its events."""

    suspend_policy: int
    events: tuple[Event, ...]

    def __post_init__(self) -> None:
        _check_u1("suspend policy", self.suspend_policy)


def peek_composite(data: bytes) -> tuple[int, int, int, int]:
    """(suspendPolicy, event count, first eventKind, first requestID) without any id sizes."""
    if len(data) < _HEAD.size + _EVENT_HEAD.size:
        raise RemoteProtocolError(f"Event.Composite of {len(data)} bytes is too short")
    policy, count = _HEAD.unpack_from(data)
    kind, request_id = _EVENT_HEAD.unpack_from(data, _HEAD.size)
    return policy, count, kind, request_id


def _value_size(data: bytes, offset: int, sizes: IdSizes, kind: int) -> int:
    if offset >= len(data):
        raise RemoteProtocolError("event value cut short before its tag")
    tag = data[offset]
    if tag not in VALUE_SIZES:
        raise UnknownEventKind(f"event kind {kind} carries a value with unknown tag {tag}", kind)
    size = VALUE_SIZES[tag]
    return 1 + (sizes.object_id if size is None else size)


def _string_size(data: bytes, offset: int) -> int:
    if offset + 4 > len(data):
        raise RemoteProtocolError("event string cut short before its length")
    n = int.from_bytes(data[offset : offset + 4], "big")
    return 4 + n


def _event_length(data: bytes, start: int, kind: int, sizes: IdSizes) -> int:
    """Bytes of the kind-specific data of one event starting at ``start``."""
    o = sizes.object_id
    loc = 1 + sizes.reference_type_id + sizes.method_id + 8
    tagged = 1 + o
    if kind in (
        EventKind.SINGLE_STEP,
        EventKind.BREAKPOINT,
        EventKind.METHOD_ENTRY,
        EventKind.METHOD_EXIT,
    ):
        return o + loc
    if kind == EventKind.METHOD_EXIT_WITH_RETURN_VALUE:
        return o + loc + _value_size(data, start + o + loc, sizes, kind)
    if kind in (EventKind.MONITOR_CONTENDED_ENTER, EventKind.MONITOR_CONTENDED_ENTERED):
        return o + tagged + loc
    if kind == EventKind.MONITOR_WAIT:
        return o + tagged + loc + 8
    if kind == EventKind.MONITOR_WAITED:
        return o + tagged + loc + 1
    if kind == EventKind.EXCEPTION:
        return o + loc + tagged + loc
    if kind in (EventKind.THREAD_START, EventKind.THREAD_DEATH, EventKind.VM_START):
        return o
    if kind == EventKind.CLASS_PREPARE:
        head = o + 1 + sizes.reference_type_id
        return head + _string_size(data, start + head) + 4
    if kind == EventKind.CLASS_UNLOAD:
        return _string_size(data, start)
    if kind in (EventKind.FIELD_ACCESS, EventKind.FIELD_MODIFICATION):
        head = o + loc + 1 + sizes.reference_type_id + sizes.field_id + tagged
        if kind == EventKind.FIELD_ACCESS:
            return head
        return head + _value_size(data, start + head, sizes, kind)
    if kind == EventKind.VM_DEATH:
        return 0
    raise UnknownEventKind(f"event kind {kind} has no known length", kind)


def decode_composite(data: bytes, sizes: IdSizes | None) -> Composite:
    """Split an Event.Composite body into its events. ``sizes`` may be None only for a
    composite of one event (its data is the rest of the packet)."""
    if len(data) < _HEAD.size:
        raise RemoteProtocolError(f"Event.Composite of {len(data)} bytes is too short")
    policy, count = _HEAD.unpack_from(data)
    if count < 1:
        raise RemoteProtocolError(f"Event.Composite with {count} events")
    offset = _HEAD.size
    events: list[Event] = []
    for i in range(count):
        if offset + _EVENT_HEAD.size > len(data):
            raise RemoteProtocolError(f"Event.Composite cut short in event {i + 1} of {count}")
        kind, request_id = _EVENT_HEAD.unpack_from(data, offset)
        offset += _EVENT_HEAD.size
        if count == 1:
            length = len(data) - offset
        elif sizes is None:
            raise UnknownEventKind("the VM's id sizes are not known yet", kind)
        else:
            length = _event_length(data, offset, kind, sizes)
        if offset + length > len(data):
            raise RemoteProtocolError(
                f"Event.Composite cut short in event {i + 1} of {count} (kind {kind})"
            )
        events.append(Event(kind, request_id, bytes(data[offset : offset + length])))
        offset += length
    if offset != len(data):
        raise RemoteProtocolError(
            f"Event.Composite has {len(data) - offset} bytes after its {count} events"
        )
    return Composite(policy, tuple(events))


def encode_composite(composite: Composite) -> bytes:
    parts = [_HEAD.pack(composite.suspend_policy, len(composite.events))]
    for event in composite.events:
        parts.append(_EVENT_HEAD.pack(event.kind, event.request_id))
        parts.append(event.body)
    return b"".join(parts)


def event_thread(event: Event, sizes: IdSizes | None) -> int | None:
    """The thread an event happened in (0: none, e.g. a class prepared by a debugger thread);
    None when the kind carries no thread or the sizes are unknown."""
    if sizes is None or event.kind not in THREAD_FIRST_KINDS:
        return None
    return decode_object_id(event.body, sizes.object_id)


def strongest(policies: list[int]) -> int:
    """The combined suspend policy of several events (what OpenJDK's agent applies: ALL beats
    EVENT_THREAD beats NONE)."""
    return max(policies, default=SuspendPolicy.NONE)
