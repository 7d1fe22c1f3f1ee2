"""Who gets each packet: the routing table of one VM connection, for N debuggers.

Layer: standard library and ``ddmd.protocol`` only (sans-IO: no sockets, no clock, no logging;
log lines are ``Log`` commands).

From the VM:

    reply ──IdRewriter.resolve──▶ a debugger's id ─▶ SendToDebugger (its own id restored)
                               └▶ anyone else (ddmd's own calls, chunk handlers) ─▶ owner.on_reply
    DDM command (a push) ──────▶ owner.on_push
    Event.Composite ───────────▶ bridge: each attached debugger gets its own events; with none
                                 attached, a VM_START that suspends the VM is kept for the
                                 first one, the rest dropped

From a debugger (``bridge.py`` holds the per-debugger rules):

    handshake ─▶ answered here, once the VM connection is ready
    command ───▶ the fast lane (``relay_from_debugger``, which the driver tries first, then
                 commits with ``relayed_from_debugger``) unless ``lanes.SLOW_LANE`` lists it:
                 Dispose answered here; IDSizes and Version from the cache; event requests,
                 suspend and resume, hold and release of events through the bridge's rules;
                 DDM through ddmshare; otherwise a fresh VM-side id from the one IdRewriter
                 and SendToVm. A reply takes the fast lane (``relay_from_vm``) unless the
                 router reads it (``lanes.READ_REPLIES``, ids the bridge watches)
    reply ─────▶ dropped (a VM never expects replies)

Foresight (``foresight.py``, ``[debugger] speculate``): while it is on, the relay lanes consult
tables that also keep its commands off them (``off_lane``, ``read_replies``: ``lanes``' own tables
while it is off, so the lane costs what it did). It sees a debugger's storable command before it
is forwarded (``Intake``), every command written to the VM (``bridge_forward``, ``send_own``:
those that end validity, and round trips), the replies, and every Event.Composite.

Every id written to the VM comes from the one ``IdRewriter``: it is the only reply matcher.
Large packets (over ``stream_threshold``) are relayed in pieces: ``SendToDebugger(more=True)``
until the last piece, and nothing else goes to that debugger in between. Large events, and
replies the bridge must read, are gathered whole first (bounded by ``max_packet``, which
``Pieces`` checks); a packet only streamed is bounded by its length field alone (4 GiB).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.idmap import IdRewriter, Pending
from ddmd.protocol.jdwp import (
    EOF,
    MAX_LENGTH,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    EventCommand,
    EventKind,
    IdSizes,
    PacketDecoder,
    PacketPiece,
    PacketStart,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)
from ddmd.session.bridge import BRIDGE_ORIGIN, Bridge
from ddmd.session.commands import Command, Log, SendToDebugger, SendToVm
from ddmd.session.consumers import DEBUGGER, Consumer, ConsumerKind, ConsumerTable, DebuggerOrigin
from ddmd.session.ddmshare import DdmShare
from ddmd.session.foresight import FORESIGHT_ORIGIN, Foresight
from ddmd.session.intake import Intake
from ddmd.session.lanes import OFF_LANE, READ_REPLIES, RECORDED, SLOW
from ddmd.session.pieces import Pieces
from ddmd.session.stability import CACHEABLE_KEYS, ENDING_KEYS

__all__ = ["DebuggerLane", "DebuggerOrigin", "Router", "RouterStatistics", "VmLane"]

# Headers packed directly on the relay path (the packets themselves were validated when the
# decoder built them; building and validating them again would double the cost).
_COMMAND_HEADER = struct.Struct(">IIBBB")
_REPLY_HEADER = struct.Struct(">IIBH")

_EVENT_COMPOSITE = EventCommand.COMPOSITE
_DDM = CommandSet.DDM


#: The relay lane's decision for a reply (``Router.relay_from_vm``): the consumer's number and
#: the packet to write to it, then what ``Router.relayed_from_vm`` needs (consumer, id-map entry,
#: whether the bridge watched its id). A plain tuple: one is made per packet.
VmLane = tuple[int, bytes, Consumer, Pending, bool]
#: The relay lane's decision for a command (``Router.relay_from_debugger``): the packet to write
#: to the VM, then what ``Router.relayed_from_debugger`` needs (consumer, VM-side id, its own
#: id, command set, command, its ``lanes.OFF_LANE`` value).
DebuggerLane = tuple[bytes, Consumer, int, int, int, int, int | None]


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    packets_to_vm: int
    packets_to_debuggers: int
    bytes_to_vm: int
    bytes_to_debuggers: int
    outstanding: int
    debuggers: int


def _discarded(first: bool) -> list[Command]:
    return [Log("ddm.push_discarded")] if first else []


def _is_suspending_vm_start(packet: CommandPacket) -> bool:
    data = packet.data
    return (
        packet.command_set == CommandSet.EVENT
        and packet.command == _EVENT_COMPOSITE
        and len(data) >= 6
        and data[5] == EventKind.VM_START
        and data[0] != 0  # suspend policy: a suspend=y VM waits for whoever resumes it
    )


@dataclass
class Router:
    """The routing table of one VM connection. ``on_reply`` gets replies to commands of ddmd
    and its chunk handlers; ``on_push`` gets every DDM command the VM sends (consumers that
    speak DDM get it too)."""

    on_reply: Callable[[Pending, ReplyPacket], list[Command]]
    on_push: Callable[[CommandPacket], list[Command]]
    # Pieces of a DDM push too large to hold: (data, first, last). The default drops them.
    on_push_piece: Callable[[bytes, bool, bool], list[Command]] = field(
        default=lambda data, first, last: _discarded(first)
    )
    max_packet: int = 1 << 30
    stream_threshold: int = 1 << 20
    ids: IdRewriter = field(default_factory=IdRewriter)
    share: DdmShare = field(default_factory=lambda: DdmShare(lambda switch: False))
    max_debuggers: int = 1 << 30  # [debugger] max_per_vm, for front sockets that start debugging
    ddm_timeout: float = 30.0  # how long a consumer's DDM request may stay unanswered
    now: float = 0.0  # the session's clock, set with every input
    ready: bool = False  # the VM connection is open and not being released
    # The connection outlives its debuggers (a VM without DDM, release.py): an event that
    # arrives with nobody attached goes through the bridge, which resumes what it suspended.
    kept: bool = False
    _decoder: PacketDecoder = field(init=False)
    consumers: ConsumerTable = field(init=False)
    pieces: Pieces = field(init=False)
    intake: Intake = field(init=False)
    held_vm_start: bytes | None = None
    id_sizes: bytes | None = None
    version_reply: bytes | None = None  # VirtualMachine.Version reply, cached like IDSizes
    # VM-side ids of commands whose consumer left before the reply came: their replies are
    # dropped without a log line each (a dropped slow reader may leave thousands). Bounded.
    orphans: dict[int, None] = field(default_factory=dict)
    bridge: Bridge = field(init=False)
    packets_to_vm: int = 0
    packets_to_debuggers: int = 0
    bytes_to_vm: int = 0
    bytes_to_debuggers: int = 0
    handshakes: int = 0  # handshakes completed, ever (the session notices new consumers)
    # [debugger] speculate and its bounds (foresight.py): mode, auto threshold (s), bounds.
    speculate: tuple[str, float, int, int] = ("off", 0.002, 64, 4 << 20)
    foresight: Foresight = field(init=False)
    # What the relay lanes consult: ``lanes``' tables, or with foresight on, tables that also
    # keep its commands and replies off the lanes (``foresight_switched``).
    off_lane: Mapping[int, int] = field(default_factory=lambda: OFF_LANE, init=False)
    read_replies: frozenset[int] = field(default=READ_REPLIES, init=False)

    def __post_init__(self) -> None:
        self._decoder = self._new_decoder()
        self.consumers = ConsumerTable(self.max_packet)
        self.pieces = Pieces(self)
        self.intake = Intake(self)
        self.bridge = Bridge(self)
        mode, threshold, inflight, held = self.speculate
        link = ForesightLink(self)
        self.foresight = Foresight(
            link, mode=mode, threshold=threshold, max_inflight=inflight, max_bytes=held
        )
        if self.foresight.on:
            link.foresight_switched(True)

    def _new_decoder(self) -> PacketDecoder:
        return PacketDecoder(
            max_length=self.max_packet,
            stream_threshold=self.stream_threshold,
            max_streamed=MAX_LENGTH,  # what is gathered whole is capped in Pieces.start
        )

    # ------------------------------------------------------------------ queries

    @property
    def attached_count(self) -> int:
        """Consumers that count as debuggers now."""
        return self.consumers.debugging_count

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            self.packets_to_vm,
            self.packets_to_debuggers,
            self.bytes_to_vm,
            self.bytes_to_debuggers,
            len(self.ids),
            len(self.consumers.by_id),
        )

    def attached(self) -> tuple[int, ...]:
        """The consumers that count as debuggers (events, suspensions, the release)."""
        return self.consumers.debugging()

    def connected_consumers(self) -> tuple[int, ...]:
        """Every consumer whose handshake is done, debugging or DDM only."""
        return tuple(c.id for c in self.consumers.by_id.values() if c.attached)

    def debugger_count(self) -> int:
        return self.consumers.counted()

    def is_attached(self, number: int) -> bool:
        consumer = self.consumers.by_id.get(number)
        return consumer is not None and consumer.attached

    def debugger_statistics(self, number: int) -> tuple[int, int, int, int] | None:
        """(packets in, packets out, bytes in, bytes out) of one consumer."""
        return self.consumers.statistics(number)

    # ------------------------------------------------------------------ the VM connection

    def connected(self, leftover: bytes = b"") -> list[Command]:
        """A new VM connection: a fresh decoder; held handshakes complete now."""
        self._decoder = self._new_decoder()
        self.pieces.reset()
        self.share.reset()
        self.bridge.requests.unhide()  # request ids restart with the connection
        out = self.connected_again()
        if leftover:
            out += self.vm_data(leftover)
        return out

    def connected_again(self, *, kept: bool = False) -> list[Command]:
        """The connection is usable for debuggers again (a new one, or the VM acknowledged a
        release): held handshakes complete now. ``kept``: the same connection, released by
        ddmd's own commands (release.py), so the bridge keeps what it knows of it (the
        requests it cleared, whose late events are dropped)."""
        self.ready = True
        out: list[Command] = []
        if not kept:  # the VM dropped every debugger's state, ddmd's own requests too
            self.bridge.reset()
            self.foresight.reset()
            out += self.foresight.ask_unload()
        for number in self.consumers.waiting:
            out += self.intake.complete_handshake(number)
        self.consumers.waiting.clear()
        return out

    def disconnected(self) -> list[Pending]:
        """The VM connection ended: every pending command of every origin fails at once (the
        caller tells their owners)."""
        self.ready = False
        self.pieces.reset()
        self.orphans.clear()
        self.bridge.reset()
        self.foresight.reset()
        return list(self.ids.drop_all())

    def relay_from_vm(self, data: bytes) -> VmLane | None:
        """The relay lane's decision for bytes from the VM, which changes nothing: when ``data``
        is exactly one whole reply to a consumer's command that nothing here reads, what to
        write (``(consumer number, packet, token...)``: the packet with the consumer's own id
        restored); otherwise None (``vm_data`` takes it). The driver writes the packet, then
        hands the whole tuple to ``relayed_from_vm``, which does the bookkeeping."""
        if self.pieces.relay is not None or self._decoder.held or len(data) < 11:
            return None
        length, vm_id, flags, b9, b10 = _COMMAND_HEADER.unpack_from(data)
        if flags != 0x80 or length != len(data) or length > self.stream_threshold:
            return None
        pending = self.ids.get(vm_id)
        if pending is None or type(pending.origin) is not DebuggerOrigin:
            return None
        watched = vm_id in self.bridge.watch
        if (pending.command_set << 8) | pending.command in self.read_replies or (
            watched and not self.bridge.lane_reply(vm_id, b9 | b10)
        ):
            return None
        consumer = self.consumers.by_id.get(pending.origin.debugger)
        if consumer is None or consumer.streaming:
            return None
        head = _REPLY_HEADER.pack(length, pending.original_id, 0x80, (b9 << 8) | b10)
        return consumer.id, head + data[11:], consumer, pending, watched

    def relayed_from_vm(self, lane: VmLane) -> None:
        """The bookkeeping of a reply the relay lane passed on (``relay_from_vm``'s tuple,
        written or queued by now): its id forgotten, the counters."""
        _, packet, consumer, pending, watched = lane
        self.ids.forget(pending)
        if watched:
            self.bridge.lane_replied(pending.vm_id)
        length = len(packet)
        consumer.packets_out += 1
        consumer.bytes_out += length
        self.packets_to_debuggers += 1
        self.bytes_to_debuggers += length

    def vm_data(self, data: bytes) -> list[Command]:
        """Bytes from the VM: route every complete packet (or piece) they finish. The general
        path: the driver has tried the relay lane (``relay_from_vm``) first, which takes a
        packet exactly as this path would have, faster."""
        decoder = self._decoder
        if self.pieces.relay is None and not decoder.held and len(data) >= 11:
            # The common case on the relay path: exactly one whole small packet.
            length, packet_id, flags, b9, b10 = _COMMAND_HEADER.unpack_from(data)
            if length == len(data) <= self.stream_threshold:
                if flags == 0x80:
                    return self.vm_reply(ReplyPacket(packet_id, (b9 << 8) | b10, data[11:]))
                if flags == 0 and b9 != _DDM:
                    return self.vm_command(CommandPacket(packet_id, b9, b10, data[11:]), data)
        decoder.receive_data(data)
        out: list[Command] = []
        while True:
            # A RemoteProtocolError escapes: the session ends the connection (nothing after a
            # broken header can be read).
            event = decoder.next_event()
            if event is NEED_DATA or event is EOF or isinstance(event, ConnectionClosed):
                return out
            if isinstance(event, ReplyPacket):
                out += self.vm_reply(event)
            elif isinstance(event, CommandPacket):
                out += self.vm_command(event)
            elif isinstance(event, PacketStart):
                out += self.pieces.start(event.header)
            elif isinstance(event, PacketPiece):
                out += self.pieces.piece(event)

    # ------------------------------------------------------------------ owners of replies

    def consumer_of(self, pending: Pending) -> Consumer | None:
        origin = pending.origin
        if type(origin) is DebuggerOrigin:
            return self.consumers.by_id.get(origin.debugger)
        return None

    @staticmethod
    def is_consumer_origin(pending: Pending) -> bool:
        return type(pending.origin) is DebuggerOrigin

    def was_orphan(self, vm_id: int) -> bool:
        """True for the reply to a departed consumer's command (forgotten now: it came)."""
        return self.orphans.pop(vm_id, 0) is None

    def vm_reply(self, packet: ReplyPacket) -> list[Command]:
        pending = self.ids.resolve(packet.id)
        watched = packet.id in self.bridge.watch
        if pending is None:
            if watched:  # a departed debugger's event request: the bridge clears it
                return self.bridge.reply(None, packet)[1]
            if self.was_orphan(packet.id):
                # Its consumer left (logged once, when it left); others may wait on it (twins).
                return self.foresight.replied(packet.id, packet)
            return [Log("ddm.reply_unknown", fields={"id": packet.id, "error": packet.error_code})]
        origin = pending.origin
        if type(origin) is not DebuggerOrigin:
            own = self.foresight.own_replied(packet.id)  # timed (foresight's "auto")
            if origin is BRIDGE_ORIGIN:
                return own + self.bridge.reply(pending, packet)[1]
            if origin is FORESIGHT_ORIGIN:
                return own + self.foresight.reply(packet.id, packet)
            return own + self.on_reply(pending, packet)
        out: list[Command] = []
        if self.foresight.on:
            out = self.foresight.replied(packet.id, packet)
        if watched:
            passed, more = self.bridge.reply(pending, packet)
            out += more
            if passed is None:
                return out
            packet = passed
        elif pending.command_set == CommandSet.VIRTUAL_MACHINE and not packet.error_code:
            if pending.command == VirtualMachineCommand.ID_SIZES:
                out += self._learn_id_sizes(packet.data)
            elif pending.command == VirtualMachineCommand.VERSION:
                self.version_reply = packet.data  # the same for every debugger: asked once
        consumer = self.consumers.by_id.get(origin.debugger)
        if consumer is None:
            return out
        body = packet.data
        data = _REPLY_HEADER.pack(11 + len(body), pending.original_id, 0x80, packet.error_code)
        return out + self.deliver(consumer, data + body)

    def _learn_id_sizes(self, data: bytes) -> list[Command]:
        self.id_sizes = data
        try:
            self.bridge.sizes = IdSizes.decode(data)
        except ProtocolError as exc:
            return [Log("vm.protocol_error", "warning", {"error": str(exc)})]
        return self.foresight.ask_unload()

    def vm_command(self, packet: CommandPacket, raw: bytes | None = None) -> list[Command]:
        if packet.command_set == _DDM:
            out = self.on_push(packet)
            speakers = self.consumers.ddm_speakers()
            if speakers:
                data = encode(packet) if raw is None else raw
                for consumer in speakers:
                    out += self.deliver(consumer, data)
            return out
        composite = packet.command_set == CommandSet.EVENT and packet.command == _EVENT_COMPOSITE
        if composite:
            self.foresight.event(packet.data)  # something ran
        if self.attached_count:
            data = encode(packet) if raw is None else raw
            if composite:
                return self.bridge.composite(packet, data) + self.foresight.speculate()
            return [
                c
                for d in self.consumers.by_id.values()
                if d.debugging
                for c in self.deliver(d, data)
            ]
        if _is_suspending_vm_start(packet):
            self.held_vm_start = encode(packet)
            return [Log("vm.start_held")]
        if self.kept and (packet.command_set, packet.command) == (
            CommandSet.EVENT,
            _EVENT_COMPOSITE,
        ):
            return self.bridge.composite(packet, encode(packet) if raw is None else raw)
        return [
            Log(
                "vm.event_dropped",
                level="debug",
                fields={"command_set": packet.command_set, "command": packet.command},
            )
        ]

    def to_consumer(self, consumer: Consumer, data: bytes, *, more: bool = False) -> Command:
        consumer.packets_out += not more
        consumer.bytes_out += len(data)
        self.packets_to_debuggers += not more
        self.bytes_to_debuggers += len(data)
        return SendToDebugger(consumer.id, data, more)

    def deliver(self, consumer: Consumer, data: bytes) -> list[Command]:
        """A whole packet for ``consumer``, or kept until its streamed packet has ended."""
        if consumer.streaming:
            consumer.deferred.append(data)
            return []
        return [self.to_consumer(consumer, data)]

    # ------------------------------------------------------------------ ddmd's own commands

    def send_own(
        self, origin: Hashable, command_set: int, command: int, data: bytes, deadline: float
    ) -> tuple[int, SendToVm]:
        """A command of ddmd's own (or a chunk handler's): its VM-side id and the bytes."""
        vm_id = self.ids.allocate(origin, 0, command_set, command, deadline)
        self.foresight.own_sent(vm_id, command_set, command)
        packet = encode(CommandPacket(vm_id, command_set, command, data))
        self.packets_to_vm += 1
        self.bytes_to_vm += len(packet)
        return vm_id, SendToVm(packet)

    # ------------------------------------------------------------------ the bridge's host

    def bridge_send(
        self,
        command_set: int,
        command: int,
        data: bytes,
        origin: Hashable = BRIDGE_ORIGIN,
        deadline: float = math.inf,
    ) -> tuple[int, list[Command]]:
        vm_id, send = self.send_own(origin, command_set, command, data, deadline)
        return vm_id, [send]

    def bridge_forward(
        self, debugger: int, packet: CommandPacket, deadline: float = math.inf
    ) -> tuple[int, list[Command]]:
        d = self.consumers.by_id[debugger]
        vm_id = self.ids.allocate(d.origin, packet.id, packet.command_set, packet.command, deadline)
        if self.foresight.on:
            self.foresight.forwarded(vm_id, packet)
        body = packet.data
        head = _COMMAND_HEADER.pack(11 + len(body), vm_id, 0, packet.command_set, packet.command)
        self.packets_to_vm += 1
        self.bytes_to_vm += 11 + len(body)
        return vm_id, [SendToVm(head + body)]

    def bridge_to_debugger(self, debugger: int, data: bytes) -> list[Command]:
        d = self.consumers.by_id.get(debugger)
        return [] if d is None else self.deliver(d, data)

    def bridge_describe(self, debugger: int) -> dict[str, object]:
        d = self.consumers.by_id.get(debugger)
        return {} if d is None else {"peer": d.peer, "via": d.via}

    # ------------------------------------------------------------------ consumers

    def debugger_joined(
        self,
        debugger: int,
        via: str,
        peer: str,
        *,
        kind: ConsumerKind = DEBUGGER,
        tool: str | None = None,
    ) -> list[Command]:
        self.consumers.join(debugger, via, peer, kind, tool)
        return []

    def debugger_data(self, number: int, data: bytes) -> tuple[list[Command], str | None]:
        """Bytes from a consumer: the commands, and the reason it leaves (None while it stays).
        The general path: the driver has tried the relay lane (``relay_from_debugger``) first."""
        return self.intake.debugger_data(number, data)

    def debugger_left(self, number: int) -> tuple[bool, bool, list[Command]]:
        """Forget a consumer (``Intake.debugger_left``): whether its handshake was done, whether
        it was debugging, and the commands; with foresight, how many of its commands were
        answered here (a log line), and the last one leaving drops method data."""
        attached, debugging, out = self.intake.debugger_left(number)
        if debugging:
            out += self.foresight.left(number, not self.attached_count)
        return attached, debugging, out

    def relay_from_debugger(self, number: int, data: bytes) -> DebuggerLane | None:
        """The relay lane's decision for bytes from a consumer, which changes nothing: when
        ``data`` is exactly one whole command of a debugging consumer that no rule here answers
        or reads, what to write to the VM (``(packet, token...)``: the packet under the fresh
        id the one IdRewriter will record for it); otherwise None (``debugger_data`` takes it).
        The driver writes the packet, then hands the tuple to ``relayed_from_debugger``."""
        consumer = self.consumers.by_id.get(number)
        if (
            consumer is None
            or not consumer.debugging
            or not self.ready
            or len(data) < 11
            or consumer.decoder.held
        ):
            return None
        length, packet_id, flags, command_set, command = _COMMAND_HEADER.unpack_from(data)
        if length != len(data) or length > self.max_packet or flags != 0:
            return None
        off = self.off_lane.get((command_set << 8) | command)
        if off is not None and (off == SLOW or self.attached_count != 1):
            return None
        vm_id = self.ids.next_free()
        packet = _COMMAND_HEADER.pack(length, vm_id, 0, command_set, command) + data[11:]
        return packet, consumer, vm_id, packet_id, command_set, command, off

    def relayed_from_debugger(self, lane: DebuggerLane) -> None:
        """The bookkeeping of a command the relay lane passed on (``relay_from_debugger``'s
        tuple, written or queued by now): its id recorded, the bridge's ledger, the counters."""
        packet, consumer, vm_id, packet_id, command_set, command, off = lane
        self.ids.record_relayed(vm_id, consumer.origin, packet_id, command_set, command)
        if off == RECORDED:  # a debugger alone: the bridge's ledger sees it all the same
            self.bridge.lane_record(consumer.id, command, vm_id)
        length = len(packet)
        consumer.packets_in += 1
        consumer.bytes_in += length
        self.packets_to_vm += 1
        self.bytes_to_vm += length


class ForesightLink:
    """The router as ``ForesightHost`` (foresight.py): its public members, nothing more."""

    def __init__(self, router: Router) -> None:
        self.router = router

    @property
    def now(self) -> float:
        return self.router.now

    def foresight_sizes(self) -> IdSizes | None:
        return self.router.bridge.sizes

    def foresight_send(self, command_set: int, command: int, data: bytes) -> tuple[int, Command]:
        return self.router.send_own(FORESIGHT_ORIGIN, command_set, command, data, math.inf)

    def foresight_reply(
        self, debugger: int, packet_id: int, error: int, data: bytes
    ) -> list[Command]:
        d = self.router.consumers.by_id.get(debugger)
        if d is None:
            return []
        head = _REPLY_HEADER.pack(11 + len(data), packet_id, 0x80, error)
        return self.router.deliver(d, head + data)

    def foresight_hidden(self, debugger: int, packet: CommandPacket) -> bool:
        return self.router.bridge.hidden_from(debugger, packet)

    def foresight_hide_request(self, request_id: int) -> None:
        self.router.bridge.requests.hide(request_id)  # its events reach no debugger

    def foresight_switched(self, on: bool) -> None:
        """Foresight's commands leave the relay lanes while it is on (``lanes`` when off)."""
        r = self.router
        if on:
            keys = CACHEABLE_KEYS | ENDING_KEYS
            r.off_lane = MappingProxyType(dict(OFF_LANE) | dict.fromkeys(keys, SLOW))
            r.read_replies = READ_REPLIES | CACHEABLE_KEYS
        else:
            r.off_lane, r.read_replies = OFF_LANE, READ_REPLIES
