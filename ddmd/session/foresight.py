"""Foresight: answer what ddmd can foresee, so that a debugger on a slow link waits less.

Layer: standard library and ``ddmd.protocol`` only (sans-IO: no sockets, no clock, no logging;
time arrives as the router's ``now``). A part of ``Router``, which it sees as ``ForesightHost``
(like ``Bridge``/``BridgeHost``).

The store is keyed by the exact bytes of a command after its header (command set, command,
data); it holds the VM's reply (error code and data) with the validity class of the command
(``stability.STABILITY``) and the stamp it was asked under. A stored reply is byte for byte
what the VM answered; it is served only while nothing can have changed it:

- serving: a debugger's read-only command whose key is stored and still valid is answered here
  under the debugger's own id ("answered locally"); one whose twin is in flight (asked by ddmd,
  or by another debugger, in the same suspension) waits for that reply; otherwise it goes to the
  VM, and its reply is stored on the way back. A debugger waiting on a twin gets the twin's
  reply even when a resume was sent after it joined: its command came before the resume, and
  the VM answers in order, so it would have been answered before the resume too.
- suspension-scoped (and object-immutable) replies hold within one suspension, numbered by
  ``epoch``: any event from the VM (something ran) and any command of ``stability.ENDS`` from
  any debugger or from ddmd (seen before it is written) start a new one. Only a composite that
  suspends starts a suspension in which anything is stored: ALL (everything), EVENT_THREAD
  (only the event thread's frames and frame values; other threads run). A VM.Suspend ends the
  suspension and starts none (conservative). Object-immutable replies are kept as
  suspension-scoped under ALL only: an object may be collected between stops (the VM would then
  answer INVALID_OBJECT), and under EVENT_THREAD other threads allocate.
- class structure and method data: until a ClassUnload event (ddmd holds its own
  EventRequest.Set of CLASS_UNLOAD, suspend policy NONE, whose events reach no debugger), a
  RedefineClasses (both: a redefinition with ``canUnrestrictedlyRedefineClasses`` may change
  structure), or the last debugger leaving: method data (and class structure) are never kept
  across debugger sessions, because an agent may redefine a class while no debugger is attached
  (Android Studio's Apply Changes, ART's structural redefinition) and JDWP never shows it.
- VM constants: until the connection ends; a new connection drops everything (ids restart).

Speculation: when a composite suspends (``speculate``), ddmd asks on its own ids what debuggers
ask at a stop (``plan.PLAN``), pipelined, at most ``max_inflight`` at once and ``max_bytes``
held. A refused speculative command is stored (the VM would refuse the debugger alike) but
nothing is asked from it. A speculative reply never used before it was invalidated is counted
as wasted.

"auto" turns foresight on once the round trip of ddmd's own requests (every one the router
sends: Version, the thread poll, DDM requests, foresight's own) is over ``threshold`` in each
of the last few samples (their least: a link's delay is in every sample, while a moment's load,
a slow command or a pipelined burst inflates only some), and off again, at the start of a
debugger session (never in the middle of one), once that least is under half the threshold.
``rtt`` (smoothed, as TCP's SRTT) is what users are shown.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import CommandPacket, EventKind, IdSizes, ReplyPacket, SuspendPolicy
from ddmd.protocol.jdwpevents import EventRequestSet, decode_composite, decode_int
from ddmd.session.commands import Command, Log
from ddmd.session.follow import Context, next_asks, stop_asks
from ddmd.session.learned import BY_COUNT, Learned
from ddmd.session.roundtrip import RoundTrip
from ddmd.session.split import first_thread
from ddmd.session.stability import ENDING_KEYS, FRAME_KEYS, REDEFINES, STABILITY, Validity

__all__ = ["FORESIGHT_ORIGIN", "MODES", "Foresight", "ForesightHost", "ForesightStatistics"]

MODES: Final = ("auto", "on", "off")
_VALIDITY: Final = {(cs << 8) | c: s.validity for (cs, c), s in STABILITY.items()}
_SCOPED: Final = frozenset({Validity.SUSPENSION, Validity.OBJECT_IMMUTABLE})
_LASTING_CLASS: Final = frozenset({Validity.CLASS_STRUCTURE, Validity.METHOD_DATA})
_NOT_SUSPENDED, _ALL, _THREAD = 0, 2, 1
_FRAMES_KEY: Final = 0x0B06
_OBJECT_VALUES: Final = 0x0902  # ObjectReference.GetValues
_VALUES: Final = frozenset({b"\x09\x02", b"\x10\x01"})  # replies of tagged values


class _ForesightOrigin:
    """The id-map origin of the commands ddmd asks on its own to foresee a debugger's."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd-foresight"


FORESIGHT_ORIGIN: Final = _ForesightOrigin()


class ForesightHost(Protocol):
    """What foresight needs of the router."""

    @property
    def now(self) -> float: ...

    def foresight_sizes(self) -> IdSizes | None: ...

    def foresight_send(self, command_set: int, command: int, data: bytes) -> tuple[int, Command]:
        """Send a command of foresight's own (origin ``FORESIGHT_ORIGIN``)."""
        ...

    def foresight_reply(
        self, debugger: int, packet_id: int, error: int, data: bytes
    ) -> list[Command]:
        """Answer a debugger's command here (if it is still attached)."""
        ...

    def foresight_hidden(self, debugger: int, packet: CommandPacket) -> bool:
        """The bridge answers this command otherwise for this debugger (threads others hold)."""
        ...

    def foresight_switched(self, on: bool) -> None:
        """Foresight turned on or off: the router's lanes change."""
        ...

    def foresight_hide_request(self, request_id: int) -> None:
        """ddmd's own event request: its events reach no debugger."""
        ...


@dataclass(slots=True)
class _Entry:
    error: int
    data: bytes
    validity: Validity
    stamp: int
    speculative: bool
    used: bool = False


@dataclass(slots=True)
class _Flight:
    key: bytes
    validity: Validity
    stamp: int
    speculative: bool
    follow: tuple[object, ...] = ()
    waiters: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ForesightStatistics:
    on: bool
    rtt: float | None  # seconds, smoothed
    answered_cache: int
    answered_speculation: int
    speculated: int
    wasted: int
    held_bytes: int


class Foresight:
    """The store, its invalidation rules and the speculation of one VM connection."""

    def __init__(
        self,
        host: ForesightHost,
        *,
        mode: str = "auto",
        threshold: float = 0.002,
        max_inflight: int = 64,
        max_bytes: int = 4 << 20,
    ) -> None:
        self.host = host
        self.mode = mode
        self.threshold = threshold
        self.max_inflight = max_inflight
        self.max_bytes = max_bytes
        self.on = False
        self.trip = RoundTrip(_VALIDITY)  # roundtrip.py: what "auto" decides on
        self.epoch = 0
        self.class_gen = 0
        self.suspended = _NOT_SUSPENDED
        self.thread = b""  # the event thread of an EVENT_THREAD suspension
        self.scoped: dict[bytes, _Entry] = {}
        self.lasting: dict[bytes, _Entry] = {}
        self.flights: dict[int, _Flight] = {}  # VM-side id -> its flight
        self.twins: dict[bytes, _Flight] = {}
        self.queue: deque[tuple[bytes, tuple[object, ...]]] = deque()
        self.own_inflight = 0
        self.held = 0
        self.learned = Learned()  # learned.py: Frames ranges, field lists, the next session
        self.unload_request: int | None = None
        self.unload_asked = False
        self.answered_cache = 0
        self.answered_speculation = 0
        self.speculated = 0
        self.wasted = 0
        self.by_debugger: dict[int, int] = {}
        if mode == "on":
            self.on = True

    # ------------------------------------------------------------------ the connection

    def reset(self) -> None:
        """A new connection (or the VM dropped every debugger's state): nothing is kept."""
        self._drop_scoped()
        self._drop(lambda v: True)
        self.flights.clear()
        self.twins.clear()
        self.queue.clear()
        self.own_inflight = 0
        self.trip.forget_sent()
        self.unload_request = None
        self.unload_asked = False
        self.suspended = _NOT_SUSPENDED
        self.learned.reset()

    def statistics(self) -> ForesightStatistics:
        return ForesightStatistics(
            self.on,
            self.trip.srtt,
            self.answered_cache,
            self.answered_speculation,
            self.speculated,
            self.wasted,
            self.held,
        )

    # ------------------------------------------------------------------ round trips

    @property
    def rtt(self) -> float | None:
        """The smoothed round trip of ddmd's own requests (seconds): what users are shown."""
        return self.trip.srtt

    def own_sent(self, vm_id: int, command_set: int, command: int) -> None:
        """ddmd sent a command of its own: timed (``roundtrip.py``); one that ends validity
        invalidates first."""
        self.trip.sent(vm_id, command_set, command, self.host.now)
        if (command_set << 8) | command in ENDING_KEYS:
            self._ended(command_set, command)

    def own_replied(self, vm_id: int) -> list[Command]:
        """The reply to a command of ddmd's own: a round trip measured. "auto" turns foresight
        on over the threshold (then asks for its CLASS_UNLOAD request)."""
        if not self.trip.replied(vm_id, self.host.now):
            return []
        least = self.trip.least()
        if self.mode == "auto" and not self.on and least is not None and least > self.threshold:
            self.on = True
            self.host.foresight_switched(True)
            return self.ask_unload()
        return []

    def ask_unload(self) -> list[Command]:
        """Ask for ddmd's own CLASS_UNLOAD request (suspend policy NONE) once foresight is on
        and a debugger made the VM's id sizes known. Until its reply, nothing needs it: the VM
        answers in order, so a class unloads after the request is in place or before anything
        asked later about it."""
        if not self.on or self.unload_asked or self.host.foresight_sizes() is None:
            return []
        self.unload_asked = True
        data = EventRequestSet(EventKind.CLASS_UNLOAD, SuspendPolicy.NONE).encode()
        vm_id, send = self.host.foresight_send(15, 1, data)
        self.flights[vm_id] = _Flight(b"", Validity.VM_CONSTANT, 0, True, ("unload",))
        return [send]

    # ------------------------------------------------------------------ debuggers' commands

    def command(self, debugger: int, packet: CommandPacket) -> list[Command] | None:
        """A debugger's command before it is forwarded: answered here (the commands), waiting
        for its twin (no commands), or None: it goes to the VM."""
        k = (packet.command_set << 8) | packet.command
        validity = _VALIDITY.get(k)
        if validity is None or self.host.foresight_hidden(debugger, packet):
            return None
        key = bytes((packet.command_set, packet.command)) + packet.data
        scoped = validity in _SCOPED
        if k == _FRAMES_KEY and self.thread:
            self._learn_shape(packet.data)
        elif k == _OBJECT_VALUES:
            self._learn_fields(packet.data)
        if validity is Validity.SUSPENSION:
            self.learned.asked_kind(k)
        if scoped and not self._servable(k, packet.data, validity):
            return None
        entry = (self.scoped if scoped else self.lasting).get(key)
        if entry is not None and entry.stamp == self._stamp(validity):
            if entry.speculative and not entry.used:
                self.answered_speculation += 1
            else:
                self.answered_cache += 1
            entry.used = True
            self.by_debugger[debugger] = self.by_debugger.get(debugger, 0) + 1
            return self.host.foresight_reply(debugger, packet.id, entry.error, entry.data)
        flight = self.twins.get(key)
        if flight is not None and flight.stamp == self._stamp(validity):
            flight.waiters.append((debugger, packet.id))
            return []
        return None

    def forwarded(self, vm_id: int, packet: CommandPacket) -> None:
        """A debugger's command written to the VM under ``vm_id``: one that ends validity
        invalidates first; a storable one is remembered until its reply."""
        cs, c = packet.command_set, packet.command
        k = (cs << 8) | c
        if k in ENDING_KEYS:
            self._ended(cs, c)
            return
        validity = _VALIDITY.get(k)
        if validity is None:
            return
        if validity in _SCOPED and not self._servable(k, packet.data, validity):
            return
        key = bytes((cs, c)) + packet.data
        flight = _Flight(key, validity, self._stamp(validity), False)
        self.flights[vm_id] = flight
        twin = self.twins.get(key)
        if twin is None or twin.stamp != flight.stamp:
            self.twins[key] = flight

    def replied(self, vm_id: int, packet: ReplyPacket) -> list[Command]:
        """The VM's reply to a debugger's command (before any rewrite for its asker)."""
        flight = self.flights.pop(vm_id, None)
        if flight is None:
            return []
        out, stored = self._landed(flight, packet)
        if stored and not packet.error_code and flight.key[:2] in _VALUES:
            self._follow(("values",), packet.data)  # the objects it shows: their types
            out += self._drain()
        return out

    def left(self, debugger: int, last: bool) -> list[Command]:
        """``debugger`` left; ``last``: no debugger is attached now. Returns the log line of
        how many of its commands were answered here (none when none were)."""
        for flight in self.flights.values():
            flight.waiters = [w for w in flight.waiters if w[0] != debugger]
        if last:
            self._drop_scoped()
            self.learned.keep_for_next_session(
                k for k, e in self.lasting.items() if e.validity in _LASTING_CLASS
            )
            self._classes_gone()
            self.suspended = _NOT_SUSPENDED
        answered = self.by_debugger.pop(debugger, 0)
        if not answered:
            return []
        fields = {"debugger": debugger, "answered": answered, "saved": answered * (self.rtt or 0.0)}
        return [Log("debugger.foresight", fields=fields)]

    def debugging_started(self) -> list[Command]:
        """A debugger starts debugging: the first of a session asks again the class data the
        last session used (``learned.py``), so that none of it is served from before."""
        keys = self.learned.take_rewarm()
        least = self.trip.least()
        near = least is not None and least < self.threshold / 2
        if self.mode == "auto" and self.on and near:  # near again: off, till it is not
            self._switch_off()
            return []
        if not self.on or self.host.foresight_sizes() is None:
            return []
        for key in keys:
            self._plan(key)
        return self._drain()

    def _switch_off(self) -> None:
        """ "auto" turns foresight off between debugger sessions once the round trip is well
        under the threshold (a moment of load turned it on): nothing kept is valid once it no
        longer watches the commands that end validity, so everything goes, and whatever is
        still in flight lands in a past epoch and class generation."""
        self.on = False
        self._new_epoch()
        self._classes_gone()
        self._drop(lambda v: True)
        self.queue.clear()
        self.host.foresight_switched(False)

    # ------------------------------------------------------------------ the VM's events

    def event(self, data: bytes) -> None:
        """An Event.Composite from the VM, before the bridge delivers it: something ran."""
        self._new_epoch()
        sizes = self.host.foresight_sizes()
        policy = data[0] if data else 0
        try:
            composite = decode_composite(data, sizes)
        except ProtocolError:
            return  # suspended stays off: nothing stored in this suspension
        if any(e.kind == EventKind.CLASS_UNLOAD for e in composite.events):
            self._classes_gone()
        if policy == SuspendPolicy.ALL:
            self.suspended = _ALL
        elif policy == SuspendPolicy.EVENT_THREAD and sizes is not None:
            thread = first_thread(composite.events, sizes)
            if thread:
                self.suspended = _THREAD
                self.thread = thread.to_bytes(sizes.object_id, "big")
                return
        if self.suspended == _ALL and sizes is not None:
            thread = first_thread(composite.events, sizes)
            self.thread = b"" if not thread else thread.to_bytes(sizes.object_id, "big")

    def speculate(self) -> list[Command]:
        """After a suspending composite was delivered: ask what debuggers will ask."""
        if not self.on or not self.suspended or self.host.foresight_sizes() is None:
            return []
        self.learned.stopped()
        for key, then in stop_asks(self.thread, self.suspended == _ALL, self.learned):
            self._plan(key, then)
        return self._drain()

    # ------------------------------------------------------------------ foresight's own

    def reply(self, vm_id: int, packet: ReplyPacket) -> list[Command]:
        """The VM's reply to one of foresight's own commands."""
        flight = self.flights.pop(vm_id, None)
        if flight is None:
            return []
        if flight.follow[:1] == ("unload",):
            if not packet.error_code and len(packet.data) >= 4:
                self.unload_request = decode_int(packet.data)
                self.host.foresight_hide_request(self.unload_request)
            return []
        self.own_inflight -= 1
        out, stored = self._landed(flight, packet)
        if stored and not packet.error_code and flight.follow:
            self._follow(flight.follow, packet.data)
        return out + self._drain()

    def _follow(self, follow: tuple[object, ...], data: bytes) -> None:
        """Ask what the reply ``data`` leads to (``follow.py``); keep what it teaches."""
        sizes = self.host.foresight_sizes()
        if sizes is None:
            return
        ctx = Context(
            sizes, self.thread, self.suspended == _ALL, self.epoch, self._variables, self.learned
        )
        self.learned.reply(follow, data, self.thread, sizes.reference_type_id)
        try:
            asks = next_asks(follow, data, ctx)
        except ProtocolError:
            return
        for key, then in asks:
            self._plan(key, then)

    def _variables(self, key: bytes) -> bytes | None:
        entry = self.lasting.get(key)
        return None if entry is None or entry.error else entry.data

    def _plan(self, key: bytes, follow: tuple[object, ...] = ()) -> None:
        """Ask ``key`` unless it is stored, in flight or queued already."""
        k = (key[0] << 8) | key[1]
        validity = _VALIDITY[k]
        if validity is Validity.SUSPENSION and not self.learned.wants(k):
            return  # not asked at the last stop (learned.py)
        stamp = self._stamp(validity)
        store = self.scoped if validity in _SCOPED else self.lasting
        entry = store.get(key)
        if entry is not None and entry.stamp == stamp:
            if follow and not entry.error:
                self._follow(follow, entry.data)
            return
        flight = self.twins.get(key)
        if flight is not None and flight.stamp == stamp:
            if follow and not flight.follow:
                flight.follow = follow
            return
        self.queue.append((key, follow))

    def _drain(self) -> list[Command]:
        out: list[Command] = []
        while self.queue and self.own_inflight < self.max_inflight and self.held < self.max_bytes:
            key, follow = self.queue.popleft()
            validity = _VALIDITY[(key[0] << 8) | key[1]]
            stamp = self._stamp(validity)
            twin = self.twins.get(key)
            if twin is not None and twin.stamp == stamp:
                continue
            vm_id, send = self.host.foresight_send(key[0], key[1], key[2:])
            flight = _Flight(key, validity, stamp, True, follow)
            self.flights[vm_id] = flight
            self.twins[key] = flight
            self.own_inflight += 1
            self.speculated += 1
            out.append(send)
        return out

    # ------------------------------------------------------------------ the store

    def _landed(self, flight: _Flight, packet: ReplyPacket) -> tuple[list[Command], bool]:
        """A reply to a flight: to whoever waits for it, and stored while still valid (and
        whether it was)."""
        if self.twins.get(flight.key) is flight:
            del self.twins[flight.key]
        out: list[Command] = []
        for debugger, packet_id in flight.waiters:
            if flight.speculative:
                self.answered_speculation += 1
            else:
                self.answered_cache += 1
            self.by_debugger[debugger] = self.by_debugger.get(debugger, 0) + 1
            out += self.host.foresight_reply(debugger, packet_id, packet.error_code, packet.data)
        current = flight.stamp == self._stamp(flight.validity)
        if not current or self.held + len(packet.data) > self.max_bytes:
            if flight.speculative and not flight.waiters:
                self.wasted += 1
            return out, False
        entry = _Entry(
            packet.error_code,
            packet.data,
            flight.validity,
            flight.stamp,
            flight.speculative,
            used=bool(flight.waiters),
        )
        store = self.scoped if flight.validity in _SCOPED else self.lasting
        old = store.get(flight.key)
        if old is not None:
            self.held -= len(old.data)
        store[flight.key] = entry
        self.held += len(packet.data)
        return out, True

    def _stamp(self, validity: Validity) -> int:
        if validity in _SCOPED:
            return self.epoch
        if validity in _LASTING_CLASS:
            return self.class_gen
        return 0

    def _servable(self, k: int, data: bytes, validity: Validity) -> bool:
        if self.suspended == _ALL:
            return True
        return (
            self.suspended == _THREAD
            and validity is Validity.SUSPENSION
            and k in FRAME_KEYS
            and data[: len(self.thread)] == self.thread
        )

    def _learn_shape(self, data: bytes) -> None:
        """A debugger asked Frames of the event thread: keep its (start, length) for the next
        stops (newest last, a few); (0, FrameCount) as such, asked once the count is known."""
        if data[: len(self.thread)] != self.thread or len(data) != len(self.thread) + 8:
            return
        shape = data[len(self.thread) :]
        count = self.scoped.get(b"\x0b\x07" + self.thread)
        counted = count is not None and count.stamp == self.epoch and not count.error
        if counted and count is not None and shape == bytes(4) + count.data[:4]:
            shape = BY_COUNT  # (0, FrameCount): an IDE's frames(0, min(N, count))
        self.learned.shape(shape)

    def _learn_fields(self, data: bytes) -> None:
        """A debugger reads fields of an object whose class this stop knows: the same fields
        are asked of a `this` of that class at the next stops."""
        sizes = self.host.foresight_sizes()
        if sizes is None:
            return
        obj, fields = data[: sizes.object_id], data[sizes.object_id :]
        kind = self.scoped.get(b"\x09\x01" + obj)
        if kind is not None and not kind.error and len(kind.data) > sizes.reference_type_id:
            self.learned.field_list(kind.data[1 : 1 + sizes.reference_type_id], fields)

    def _ended(self, command_set: int, command: int) -> None:
        """A command that ends validity is about to reach the VM."""
        self._new_epoch()
        if (command_set << 8) | command in REDEFINES:
            self._classes_gone()

    def _new_epoch(self) -> None:
        self.epoch += 1
        self.suspended = _NOT_SUSPENDED
        self.thread = b""
        self._drop_scoped()
        self._unqueue(_SCOPED)

    def _drop_scoped(self) -> None:
        for entry in self.scoped.values():
            self.held -= len(entry.data)
            if entry.speculative and not entry.used:
                self.wasted += 1
        self.scoped.clear()

    def _classes_gone(self) -> None:
        self.class_gen += 1
        self._drop(lambda v: v in _LASTING_CLASS)
        self._unqueue(_LASTING_CLASS)

    def _unqueue(self, kinds: frozenset[Validity]) -> None:
        self.queue = deque(
            q for q in self.queue if _VALIDITY[(q[0][0] << 8) | q[0][1]] not in kinds
        )

    def _drop(self, which: Callable[[Validity], bool]) -> None:
        kept: dict[bytes, _Entry] = {}
        for key, entry in self.lasting.items():
            if which(entry.validity):
                self.held -= len(entry.data)
                if entry.speculative and not entry.used:
                    self.wasted += 1
            else:
                kept[key] = entry
        self.lasting = kept


def _validity(key: bytes) -> Validity:
    return _VALIDITY[(key[0] << 8) | key[1]]


def saved_seconds(answered: int, rtt: float | None) -> float:
    """About how much time ``answered`` commands answered here saved a debugger."""
    return 0.0 if rtt is None or math.isnan(rtt) else answered * rtt
