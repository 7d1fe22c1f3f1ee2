"""The per-debugger rules of a VM shared by several debuggers: event ownership, the split of event
packets, suspension accounting, held events, and leaving without disturbing the others.

Layer: standard library and ``ddmd.protocol`` only (sans-IO: no sockets, no clock, no logging;
log lines are ``Log`` commands). The ``Router`` owns one ``Bridge`` and hands it the commands,
replies and events these rules are about; the bridge answers through the router (``BridgeHost``).

Event ownership (``requests.py``). A debugger's EventRequest.Set reply gives the requestID it owns
(with the suspend policy it asked for). Its Clear of its own request goes to the VM; a Clear of a
request it does not own is answered here as OpenJDK's agent answers a Clear of an unknown id: an
empty success reply (``eventHandler_freeByID`` returns NONE when nothing matches; an event kind the
agent does not know gets INVALID_EVENT_TYPE), and never reaches the VM. ClearAllBreakpoints becomes
one EventRequest.Clear per breakpoint request of the sender, answered when the VM has answered them
all (at once when it owns none).

Event split (``split.py``). Each debugger receives a composite with only its own events, under
the suspend policy it asked for; requestID 0 events go to every debugger; a debugger that gets
the whole composite under the VM's own policy gets the VM's bytes unchanged (always so with one
debugger). Dropped events are logged at debug level, and whatever they suspended ddmd releases.
A composite that cannot be split (an event of unknown length; several events before the VM's
id sizes are known) goes whole to every debugger, each then holding what it says, and is logged.

Suspensions (``suspensions.py``: the ledger and its rules). Each suspension the VM applies is
recorded with the debuggers that hold it. A debugger's resume lowers its own counts only; the VM
is told to release a thread only when no debugger holds it any more, by the debugger's own
command when that is exactly the release (so one debugger alone sees today's traffic), else by
ddmd's own commands and a success reply here. Two debuggers that receive the same all-thread
suspension in one composite share it: the VM was suspended once, and is resumed once, when the
last of them resumes. A resume that balances nothing of the sender's is answered here, unless
the sender is the only debugger attached: then it goes to the VM as today.

What cannot be hidden: a thread suspended by one debugger is suspended for all (ThreadReference
.Status says so, frames can be read). ThreadReference.SuspendCount answers the VM's count less
the suspensions that hold the thread for other debuggers only: the sender's own count, as if it
were alone, and never more than the VM's; a suspension ddmd never saw stays visible. JDWP has no
ThreadGroup suspend (JDI suspends a group thread by thread), so there is nothing more to count.
A method invocation (ClassType/ObjectReference.InvokeMethod without INVOKE_SINGLE_THREADED)
lets every suspended thread run until it returns, another debugger's held threads included: the
VM does that, and ddmd does not change a debugger's invoke options.
Commands that need a thread id (ThreadReference.Suspend/Resume/SuspendCount) are only accounted
once the VM's IDSizes reply has been seen (JDI asks for it first); before that they pass through
untracked, and the log says so.

HoldEvents/ReleaseEvents are per debugger: answered here; that debugger's events wait in a queue
(``holding.py``; bounded: past ``MAX_HELD_EVENTS`` it gets them at once, and the log says so).

Pins (``pins.py``): ObjectReference.DisableCollection/EnableCollection are counted per debugger
and object once the VM carried them out.

Leaving: when a debugger leaves and others stay, ddmd clears each request it owns, releases
exactly the suspensions it held and re-enables each object it pinned, as often as it pinned it
(ddmd's own commands; their replies are consumed), and a Set of its still in flight is cleared
when its reply arrives. The release part does the same for the last debugger of a VM without
DDM (``release``: the commands under an origin of its own, and the ids it waits for).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Protocol

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import (
    CommandPacket,
    CommandSet,
    ErrorCode,
    EventKind,
    IdSizes,
    ReplyPacket,
    SuspendPolicy,
    VirtualMachineCommand,
    encode,
)
from ddmd.protocol.jdwpevents import (
    CLEARABLE_KINDS,
    THREAD_FIRST_KINDS,
    Composite,
    EventRequestClear,
    EventRequestSet,
    decode_composite,
    decode_int,
    decode_object_id,
    encode_composite,
    encode_int,
    encode_object_id,
)
from ddmd.session.commands import Command, Log
from ddmd.session.holding import Holding
from ddmd.session.lanes import BRIDGE, keys_of
from ddmd.session.pins import Pins
from ddmd.session.requests import Requests
from ddmd.session.split import Request, split
from ddmd.session.suspensions import ALL_THREADS, RESUME_ALL, Ledger, Op, Suspension, ThreadSet

__all__ = ["BRIDGED", "BRIDGE_ORIGIN", "SHARED_VIEW", "Bridge", "BridgeHost"]

VM: Final = CommandSet.VIRTUAL_MACHINE
THREAD: Final = CommandSet.THREAD_REFERENCE
REQUEST: Final = CommandSet.EVENT_REQUEST
OBJECT: Final = CommandSet.OBJECT_REFERENCE
_O_DISABLE_COLLECTION: Final = 7
_O_ENABLE_COLLECTION: Final = 8
_T_SUSPEND: Final = 2
_T_RESUME: Final = 3
_T_SUSPEND_COUNT: Final = 12
_T_STATUS: Final = 4
#: ThreadReference commands that need the thread suspended (frames, monitors), and StackFrame's:
#: answered THREAD_NOT_SUSPENDED for a thread that only other debuggers hold (see ``_hidden``).
_T_NEED_SUSPENDED: Final = frozenset({6, 7, 8, 9, 13})
STACK_FRAME: Final = 16
_F_NEED_SUSPENDED: Final = frozenset({1, 2, 3, 4})
THREAD_NOT_SUSPENDED: Final = 13
_SET, _CLEAR, _CLEAR_ALL_BREAKPOINTS = 1, 2, 3

#: (command set << 8 | command) of every debugger command these rules look at: the ``bridge``
#: entries of the one slow-lane table (``lanes.SLOW_LANE``, each with its reason).
BRIDGED: Final = keys_of(BRIDGE)

#: Of those, the ones that matter only while several debuggers are attached (what a debugger
#: sees of threads others hold); with one debugger they go straight to the VM.
SHARED_VIEW: Final = keys_of(BRIDGE, several=True)


class _BridgeOrigin:
    """The id-map origin of the commands ddmd sends for these rules."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd-bridge"


BRIDGE_ORIGIN: Final = _BridgeOrigin()


class BridgeHost(Protocol):
    """What the bridge needs of the router."""

    def attached(self) -> tuple[int, ...]: ...

    def bridge_describe(self, debugger: int) -> dict[str, object]: ...

    def bridge_forward(self, debugger: int, packet: CommandPacket) -> tuple[int, list[Command]]:
        """Send a debugger's command on to the VM; its VM-side id and the commands."""
        ...

    def bridge_send(
        self,
        command_set: int,
        command: int,
        data: bytes,
        origin: Hashable = ...,
        deadline: float = ...,
    ) -> tuple[int, list[Command]]:
        """Send a command of ddmd's own (origin ``BRIDGE_ORIGIN`` unless given; no deadline
        unless given)."""
        ...

    def bridge_to_debugger(self, debugger: int, data: bytes) -> list[Command]: ...


@dataclass(slots=True)
class _Gate:
    """A ClearAllBreakpoints answered once the VM answered all its Clears."""

    debugger: int
    original_id: int
    remaining: int
    alive: bool = True


@dataclass(frozen=True, slots=True)
class _SetWatch:
    debugger: int
    kind: int
    policy: int


@dataclass(frozen=True, slots=True)
class _OrphanSet:
    kind: int


@dataclass(frozen=True, slots=True)
class _SuspendWatch:
    debugger: int
    suspension: Suspension


@dataclass(frozen=True, slots=True)
class _CountWatch:
    debugger: int
    thread: int


@dataclass(frozen=True, slots=True)
class _StatusWatch:
    """A ThreadReference.Status reply for a debugger to whom the thread looks running."""

    debugger: int
    thread: int


@dataclass(frozen=True, slots=True)
class _GateWatch:
    gate: _Gate


@dataclass(frozen=True, slots=True)
class _Quiet:
    what: str


@dataclass(frozen=True, slots=True)
class _PinWatch:
    """A DisableCollection (+1) or EnableCollection (-1) of ``debugger``, counted once done."""

    debugger: int
    obj: int
    delta: int


_Watch = (
    _SetWatch
    | _OrphanSet
    | _SuspendWatch
    | _CountWatch
    | _StatusWatch
    | _GateWatch
    | _Quiet
    | _PinWatch
)
#: What one of ddmd's own commands of a release sends: (set, command, data, its watch).
_Send = tuple[int, int, bytes, _Quiet]


class Bridge:
    """The rules above for one VM connection. ``sizes`` comes from the VM's IDSizes reply."""

    def __init__(self, host: BridgeHost) -> None:
        self.host = host
        self.sizes: IdSizes | None = None
        self.requests = Requests()  # who owns each event request (requests.py)
        self.ledger = Ledger()
        self.watch: dict[int, _Watch] = {}  # VM-side id -> what its reply means here
        self.holding = Holding()  # HoldEvents/ReleaseEvents (holding.py)
        self.pins = Pins()

    def reset(self) -> None:
        """The VM dropped every debugger's state (a new connection, or a release)."""
        self.requests.reset()  # (ddmd's own stay: the VM keeps them)
        self.ledger.clear()
        self.watch.clear()
        self.holding.clear()
        self.pins.clear()

    def hidden_from(self, debugger: int, packet: CommandPacket) -> bool:
        """Whether ``command`` answers this otherwise than the VM would (a thread others hold)."""
        if (packet.command_set << 8) | packet.command not in SHARED_VIEW:
            return False
        thread = self._thread_of(packet)
        return thread is None or self._hidden(debugger, thread)

    # ------------------------------------------------------------------ queries

    def held_by(self, debugger: int) -> int:
        """How many suspensions ``debugger`` holds."""
        return self.ledger.held_by(debugger)

    # ------------------------------------------------------------------ debuggers

    def joined(self, debugger: int) -> None:
        self.holding.joined(debugger)

    def left(self, debugger: int, dropped: tuple[Pending, ...]) -> list[Command]:
        """``debugger`` left while others stay: ``departed``, then ``release``."""
        self.departed(debugger, dropped)
        return self.release(debugger)[0]

    def departed(self, debugger: int, dropped: tuple[Pending, ...]) -> None:
        """``debugger`` is gone (its events are held no more). ``dropped``: its commands still
        waiting for a reply (a Set among them is cleared once answered)."""
        for pending in dropped:
            watch = self.watch.get(pending.vm_id)
            if isinstance(watch, _SetWatch):
                self.watch[pending.vm_id] = _OrphanSet(watch.kind)  # cleared once answered
            elif watch is not None:
                del self.watch[pending.vm_id]
        for watch in self.watch.values():
            if isinstance(watch, _GateWatch) and watch.gate.debugger == debugger:
                watch.gate.alive = False
        self.holding.left(debugger)

    def release(
        self, debugger: int, origin: Hashable | None = None, deadline: float = math.inf
    ) -> tuple[list[Command], dict[int, str]]:
        """Release everything the departed ``debugger`` holds, even as the last one: each
        request it owns cleared, the suspensions only it held resumed, each pin re-enabled as
        often as it pinned. Returns the commands and, per VM-side id, what each is; with
        ``origin`` the commands carry it (its owner hears every reply, by ``deadline``),
        without, their replies are consumed here."""
        sends: list[_Send] = []
        mine = self.requests.retire_all(debugger)
        for rid, kind in mine:
            data = EventRequestClear(kind, rid).encode()
            sends.append((REQUEST, _CLEAR, data, _Quiet("clear of a departed debugger's request")))
        held, ops = self.ledger.release(debugger)
        sends += self._op_sends(ops)
        pins = self.pins.release(debugger)
        if self.sizes is not None:
            size = self.sizes.object_id
            for obj in pins:
                data = encode_object_id(obj, size)
                sends.append((OBJECT, _O_ENABLE_COLLECTION, data, _Quiet("enable collection")))
        fields = {"debugger": debugger, "requests": len(mine), "suspensions": held}
        # A step of the release (the one info line is vm.released, release.py).
        out: list[Command] = [Log("debugger.released", "debug", fields)]
        if pins:
            fields["pins"] = len(pins)
        sent: dict[int, str] = {}
        for command_set, command, data, watch in sends:
            if origin is None:
                vm_id, more = self.host.bridge_send(command_set, command, data)
                self.watch[vm_id] = watch
            else:
                vm_id, more = self.host.bridge_send(command_set, command, data, origin, deadline)
            sent[vm_id] = f"{command_set}/{command} ({watch.what})"
            out += more
        return out, sent

    # ------------------------------------------------------------------ debugger commands

    def command(self, debugger: int, packet: CommandPacket) -> list[Command]:
        """One command of ``debugger`` whose (set, command) is in ``BRIDGED``."""
        cs, c = packet.command_set, packet.command
        if cs == VM:
            if c == VirtualMachineCommand.SUSPEND:
                return self._suspend(debugger, packet, ALL_THREADS, "VM.Suspend")
            if c == VirtualMachineCommand.RESUME:
                return self._resume_all(debugger, packet)
            if c == VirtualMachineCommand.EXIT:
                # It ends every debugger's session: said louder when there are others.
                others = len(self.host.attached()) - 1
                fields = {"debugger": debugger, **self.host.bridge_describe(debugger)}
                log = Log("vm.exit_requested", "warning" if others else "info", fields)
                log.fields["others"] = others
                return [log, *self.host.bridge_forward(debugger, packet)[1]]
            if c == VirtualMachineCommand.HOLD_EVENTS:
                self.holding.hold(debugger)
                return self._reply(debugger, packet.id)
            if c == VirtualMachineCommand.RELEASE_EVENTS:
                out = self._reply(debugger, packet.id)
                return out + self._to(debugger, self.holding.release(debugger))
        elif cs == THREAD:
            thread = self._thread_of(packet)
            if thread is None:
                return self._untracked(debugger, packet)
            if c == _T_SUSPEND:
                return self._suspend(
                    debugger, packet, ThreadSet.one(thread), "ThreadReference.Suspend"
                )
            if c == _T_RESUME:
                return self._resume_thread(debugger, packet, thread)
            if c == _T_SUSPEND_COUNT:
                vm_id, out = self.host.bridge_forward(debugger, packet)
                self.watch[vm_id] = _CountWatch(debugger, thread)
                return out
            if c == _T_STATUS and self._hidden(debugger, thread):
                vm_id, out = self.host.bridge_forward(debugger, packet)
                self.watch[vm_id] = _StatusWatch(debugger, thread)
                return out
            if c in _T_NEED_SUSPENDED and self._hidden(debugger, thread):
                return self._reply(debugger, packet.id, THREAD_NOT_SUSPENDED)
        elif cs == OBJECT and c in (_O_DISABLE_COLLECTION, _O_ENABLE_COLLECTION):
            obj = self._thread_of(packet)  # an object id, read as a thread id is
            vm_id, out = self.host.bridge_forward(debugger, packet)
            if obj is not None:  # counted once done: +1 for a Disable, -1 for an Enable
                self.watch[vm_id] = _PinWatch(debugger, obj, 15 - 2 * c)
            return out
        elif cs == STACK_FRAME and c in _F_NEED_SUSPENDED:
            thread = self._thread_of(packet)
            if thread is not None and self._hidden(debugger, thread):
                return self._reply(debugger, packet.id, THREAD_NOT_SUSPENDED)
        elif cs == REQUEST:
            if c == _SET:
                return self._set(debugger, packet)
            if c == _CLEAR:
                return self._clear_one(debugger, packet)
            if c == _CLEAR_ALL_BREAKPOINTS:
                return self._clear_breakpoints(debugger, packet)
        return self.host.bridge_forward(debugger, packet)[1]

    def _alone(self, debugger: int) -> bool:
        return self.host.attached() == (debugger,)

    def _hidden(self, debugger: int, thread: int) -> bool:
        """``thread`` is suspended only for other debuggers: to ``debugger`` it looks running.
        JDI keeps the status and frames of a thread it sees suspended until it resumes that
        thread itself, which it never does for a suspension it does not hold; so showing it
        such a thread as suspended leaves it a stale view of the thread's frames."""
        return (
            not self._alone(debugger)
            and self.ledger.count(debugger, thread) == 0
            and self.ledger.others(debugger, thread) > 0
        )

    def _reply(
        self, debugger: int, packet_id: int, error: int = 0, data: bytes = b""
    ) -> list[Command]:
        return self.host.bridge_to_debugger(debugger, encode(ReplyPacket(packet_id, error, data)))

    def _thread_of(self, packet: CommandPacket) -> int | None:
        if self.sizes is None or len(packet.data) < self.sizes.object_id:
            return None
        return decode_object_id(packet.data, self.sizes.object_id)

    def _untracked(self, debugger: int, packet: CommandPacket) -> list[Command]:
        why = "the VM's id sizes are not known" if self.sizes is None else "no thread id in it"
        log = Log(
            "vm.suspension_untracked",
            "warning",
            {"debugger": debugger, "command": f"{packet.command_set}/{packet.command}", "why": why},
        )
        return [log, *self.host.bridge_forward(debugger, packet)[1]]

    # ------------------------------------------------------------------ event requests

    def _set(self, debugger: int, packet: CommandPacket) -> list[Command]:
        vm_id, out = self.host.bridge_forward(debugger, packet)
        try:
            request = EventRequestSet.decode(packet.data)
        except ProtocolError:
            return out  # the VM answers it with an error
        self.watch[vm_id] = _SetWatch(debugger, request.event_kind, request.suspend_policy)
        return out

    def _clear_one(self, debugger: int, packet: CommandPacket) -> list[Command]:
        if len(packet.data) < 5:
            return self.host.bridge_forward(debugger, packet)[1]  # the VM answers the error
        clear = EventRequestClear.decode(packet.data[:5])  # the agent reads these 5 bytes only
        if self.requests.clearing(debugger, clear.request_id, clear.event_kind):
            return self.host.bridge_forward(debugger, packet)[1]
        # Not the sender's: answered as the VM answers a Clear of an unknown request.
        error = 0 if clear.event_kind in CLEARABLE_KINDS else ErrorCode.INVALID_EVENT_TYPE
        return self._reply(debugger, packet.id, error)

    def _clear_breakpoints(self, debugger: int, packet: CommandPacket) -> list[Command]:
        mine = self.requests.retire_all(debugger, EventKind.BREAKPOINT)
        if not mine:
            return self._reply(debugger, packet.id)
        gate = _Gate(debugger, packet.id, len(mine))
        out: list[Command] = []
        for rid, kind in mine:
            out += self._clear(kind, rid, _GateWatch(gate))
        return out

    def _clear(self, kind: int, request_id: int, watch: _Watch) -> list[Command]:
        data = EventRequestClear(kind, request_id).encode()
        vm_id, out = self.host.bridge_send(REQUEST, _CLEAR, data)
        self.watch[vm_id] = watch
        return out

    # ------------------------------------------------------------------ replies

    def reply(
        self, pending: Pending | None, packet: ReplyPacket
    ) -> tuple[ReplyPacket | None, list[Command]]:
        """A reply whose id is watched here, or one to ddmd's own command (origin
        ``BRIDGE_ORIGIN``), or one to a departed debugger's watched command (``pending`` None).
        Returns the reply to pass on to the debugger that asked (None: nothing to pass on)."""
        watch = self.watch.pop(packet.id, None)
        error = packet.error_code
        if pending is None or pending.origin is BRIDGE_ORIGIN:
            return None, self._own_reply(watch, packet)
        if isinstance(watch, _SetWatch) and not error:
            try:
                request_id = decode_int(packet.data)
            except ProtocolError as exc:
                return packet, [Log("vm.protocol_error", "warning", {"error": str(exc)})]
            self.requests.add(request_id, Request(watch.debugger, watch.kind, watch.policy))
        elif isinstance(watch, _PinWatch) and not error:
            self.pins.change(watch.debugger, watch.obj, watch.delta)
        elif isinstance(watch, _SuspendWatch) and error:
            self.ledger.forget(watch.suspension)  # it never happened
        elif isinstance(watch, _StatusWatch) and not error and len(packet.data) >= 8:
            if self._hidden(watch.debugger, watch.thread):
                # threadStatus as the VM says; suspendStatus (SUSPEND_STATUS_SUSPENDED = 1) off.
                data = packet.data[:4] + encode_int(decode_int(packet.data[4:8]) & ~1)
                return ReplyPacket(packet.id, 0, data + packet.data[8:]), []
        elif isinstance(watch, _CountWatch) and not error and len(packet.data) >= 4:
            real = decode_int(packet.data)
            others = self.ledger.others(watch.debugger, watch.thread)
            if others and real > 0:
                data = encode_int(max(0, real - others)) + packet.data[4:]
                return ReplyPacket(packet.id, 0, data), []
        return packet, []

    def _own_reply(self, watch: _Watch | None, packet: ReplyPacket) -> list[Command]:
        out: list[Command] = []
        if isinstance(watch, _OrphanSet):
            if not packet.error_code and len(packet.data) >= 4:
                request_id = decode_int(packet.data)
                self.requests.retire(request_id)  # never owned: its sender left
                out += self._clear(watch.kind, request_id, _Quiet("clear of an orphaned request"))
        elif isinstance(watch, _GateWatch):
            gate = watch.gate
            gate.remaining -= 1
            if gate.remaining == 0 and gate.alive:
                out += self._reply(gate.debugger, gate.original_id)
        elif isinstance(watch, _Quiet) and packet.error_code:
            fields = {"what": watch.what, "error": packet.error_code}
            out.append(Log("vm.command_refused", "debug", fields))
        return out

    # ------------------------------------------------------------------ suspensions

    def _suspend(
        self, debugger: int, packet: CommandPacket, scope: ThreadSet, cause: str
    ) -> list[Command]:
        vm_id, out = self.host.bridge_forward(debugger, packet)
        suspension = self.ledger.add_own(debugger, scope, cause)
        self.watch[vm_id] = _SuspendWatch(debugger, suspension)
        return out

    def lane_record(self, debugger: int, command: int, vm_id: int) -> None:
        """A VM.Suspend or VM.Resume (``command``) of ``debugger``, the only debugger, that took
        the relay lane: written to the VM as it came, under ``vm_id``. The ledger records it
        as ``command`` does on the slow lane, where alone the debugger's own command is also
        what the VM is told."""
        if command == VirtualMachineCommand.SUSPEND:
            suspension = self.ledger.add_own(debugger, ALL_THREADS, "VM.Suspend")
            self.watch[vm_id] = _SuspendWatch(debugger, suspension)
        else:
            self.ledger.resume_all(debugger)  # alone, nothing else is to be told (_resumed)

    def lane_reply(self, vm_id: int, failed: int) -> bool:
        """Whether the reply to the watched command ``vm_id`` may take the relay lane (the
        router asks; ``failed``: its error code is not 0). Only a Suspend the VM carried out
        may (its watch is done with once it is passed on: ``lane_replied``). Any other watched
        reply is read by ``reply``. Changes nothing."""
        return type(self.watch.get(vm_id)) is _SuspendWatch and not failed

    def lane_replied(self, vm_id: int) -> None:
        """The reply to the watched Suspend ``vm_id`` took the relay lane: its watch is done."""
        del self.watch[vm_id]

    def _resume_all(self, debugger: int, packet: CommandPacket) -> list[Command]:
        ops = self.ledger.resume_all(debugger)
        if ops is None:
            return self._unbalanced(debugger, packet)
        return self._resumed(debugger, packet, ops, RESUME_ALL)

    def _resume_thread(self, debugger: int, packet: CommandPacket, thread: int) -> list[Command]:
        ops = self.ledger.resume_thread(debugger, thread)
        if ops is None:
            return self._unbalanced(debugger, packet)
        return self._resumed(debugger, packet, ops, ("resume", thread))

    def _unbalanced(self, debugger: int, packet: CommandPacket) -> list[Command]:
        """A resume that balances none of the sender's suspensions."""
        if self._alone(debugger):
            return self.host.bridge_forward(debugger, packet)[1]  # as today
        return self._reply(debugger, packet.id)

    def _resumed(
        self, debugger: int, packet: CommandPacket, ops: list[Op], same: Op
    ) -> list[Command]:
        if ops == [same] or self._alone(debugger):
            # The debugger's own command is the release (alone, it is exactly what the VM
            # would have been told without ddmd in between).
            return self.host.bridge_forward(debugger, packet)[1]
        return self._send_ops(ops) + self._reply(debugger, packet.id)

    def _send_ops(self, ops: list[Op]) -> list[Command]:
        out: list[Command] = []
        for command_set, command, data, watch in self._op_sends(ops):
            vm_id, sent = self.host.bridge_send(command_set, command, data)
            self.watch[vm_id] = watch
            out += sent
        return out

    def _op_sends(self, ops: list[Op]) -> list[_Send]:
        sends: list[_Send] = []
        for what, thread in ops:
            if what == "resume all":
                sends.append((VM, VirtualMachineCommand.RESUME, b"", _Quiet(what)))
            elif self.sizes is not None:  # always: threads are only known with the sizes
                command = _T_SUSPEND if what == "suspend" else _T_RESUME
                data = encode_object_id(thread, self.sizes.object_id)
                sends.append((THREAD, command, data, _Quiet(what)))
        return sends

    # ------------------------------------------------------------------ events

    def composite(self, packet: CommandPacket, raw: bytes) -> list[Command]:
        """An Event.Composite from the VM (``raw``: its bytes), with debuggers attached."""
        attached = self.host.attached()
        try:
            composite = decode_composite(packet.data, self.sizes)
        except ProtocolError as exc:
            return self._undivided(packet, raw, attached, str(exc))
        parts = split(
            composite, self.requests.by_id(), attached, self.requests.dropped(), self.sizes
        )
        out: list[Command] = [
            Log("vm.event_dropped", "debug", {"kind": e.kind, "request": e.request_id})
            for e in parts.dropped
        ]
        vm_policy = composite.suspend_policy
        for d, share in parts.shares.items():
            if len(share.events) == len(composite.events) and share.policy == vm_policy:
                data = raw
            else:
                body = encode_composite(Composite(share.policy, share.events))
                data = encode(CommandPacket(packet.id, CommandSet.EVENT, packet.command, body))
            out += self._deliver(d, data)
        grants = {d: (share.policy, share.thread) for d, share in parts.shares.items()}
        return out + self._suspended(vm_policy, parts.thread, grants)

    def _deliver(self, debugger: int, data: bytes) -> list[Command]:
        now, overflowed = self.holding.deliver(debugger, data)
        if not overflowed:
            return self._to(debugger, now)
        fields = {"debugger": debugger, "events": len(now)}
        return [Log("debugger.hold_overflowed", "warning", fields), *self._to(debugger, now)]

    def _to(self, debugger: int, packets: list[bytes]) -> list[Command]:
        return [c for data in packets for c in self.host.bridge_to_debugger(debugger, data)]

    def _suspended(
        self, vm_policy: int, vm_thread: int | None, grants: dict[int, tuple[int, int | None]]
    ) -> list[Command]:
        """Record the suspension the VM applied for a composite, and release at once what no
        debugger holds."""
        if vm_policy == SuspendPolicy.NONE:
            return []
        found = _claims(vm_policy, vm_thread, grants)
        if found is None:
            return [Log("vm.suspension_untracked", "warning", {"why": "no event thread"})]
        return self._send_ops(self.ledger.add(found[0], found[1], "event"))

    def _undivided(
        self, packet: CommandPacket, raw: bytes, attached: tuple[int, ...], why: str
    ) -> list[Command]:
        """A composite that cannot be split: whole to everyone, each holding what it says."""
        out: list[Command] = [Log("vm.event_unsplit", "warning", {"error": why})]
        for d in attached:
            out += self._deliver(d, raw)
        data = packet.data
        policy = data[0] if data else SuspendPolicy.NONE
        thread = _raw_thread(data, self.sizes)
        grants = {d: (policy, thread) for d in attached}
        return out + self._suspended(policy, thread, grants)


def _claims(
    vm_policy: int, vm_thread: int | None, grants: dict[int, tuple[int, int | None]]
) -> tuple[ThreadSet, dict[int, ThreadSet]] | None:
    """What a composite suspended (its scope) and what each debugger holds of it (None: a
    thread-only policy without an event thread)."""
    if vm_policy == SuspendPolicy.ALL:
        scope = ALL_THREADS
    elif vm_thread:
        scope = ThreadSet.one(vm_thread)
    else:
        return None
    holders: dict[int, ThreadSet] = {}
    for d, (policy, thread) in grants.items():
        if policy == SuspendPolicy.ALL:
            holders[d] = scope
        elif policy == SuspendPolicy.EVENT_THREAD and thread and scope.covers(thread):
            holders[d] = ThreadSet.one(thread)
    return scope, holders


def _raw_thread(data: bytes, sizes: IdSizes | None) -> int | None:
    """The thread of a composite's first event, read from its bytes (None: not readable)."""
    if sizes is None or len(data) < 10 + sizes.object_id or data[5] not in THREAD_FIRST_KINDS:
        return None
    return decode_object_id(data, sizes.object_id, 10)
