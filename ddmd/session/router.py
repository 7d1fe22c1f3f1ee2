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
    command ───▶ Dispose answered here; IDSizes from the cache; event requests, suspend and
                 resume, hold and release of events through the bridge's rules; otherwise a
                 fresh VM-side id from the one IdRewriter and SendToVm
    reply ─────▶ dropped (a VM never expects replies)

Every id written to the VM comes from the one ``IdRewriter``: it is the only reply matcher.
Large packets (over ``stream_threshold``) are relayed in pieces: ``SendToDebugger(more=True)``
until the last piece, and nothing else goes to that debugger in between. Large events, and
replies the bridge must read, are gathered whole first (bounded by ``max_packet``).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.idmap import IdRewriter, Pending
from ddmd.protocol.jdwp import (
    EOF,
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    EventCommand,
    EventKind,
    Handshake,
    IdSizes,
    PacketDecoder,
    PacketHeader,
    PacketPiece,
    PacketStart,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
    encode_header,
)
from ddmd.session.bridge import BRIDGE_ORIGIN, BRIDGED, SHARED_VIEW, Bridge
from ddmd.session.commands import CloseDebugger, Command, Log, SendToDebugger, SendToVm

__all__ = ["DebuggerOrigin", "Router", "RouterStatistics"]

# Headers packed directly on the relay path (the packets themselves were validated when the
# decoder built them; building and validating them again would double the cost).
_COMMAND_HEADER = struct.Struct(">IIBBB")
_REPLY_HEADER = struct.Struct(">IIBH")

_EVENT_COMPOSITE = EventCommand.COMPOSITE


@dataclass(frozen=True, slots=True, eq=False)
class DebuggerOrigin:
    """The id-map origin of a debugger's commands: one per debugger, compared by identity (the
    id map hashes it for every relayed command; identity hashing is done in C)."""

    debugger: int


@dataclass(slots=True)
class _Debugger:
    id: int
    via: str
    peer: str
    decoder: PacketDecoder
    origin: DebuggerOrigin
    attached: bool = False
    # While a packet is relayed to it in pieces nothing else may be written to it: what the
    # router has for it meanwhile (a locally answered command, an event) waits here.
    streaming: bool = False
    deferred: list[bytes] = field(default_factory=list)
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    packets_to_vm: int
    packets_to_debuggers: int
    bytes_to_vm: int
    bytes_to_debuggers: int
    outstanding: int
    debuggers: int


@dataclass(slots=True)
class _Relay:
    """Where the pieces of a packet too large to buffer go."""

    debuggers: tuple[int, ...] = ()
    push: bool = False  # a large DDM push: its pieces go to on_push_piece
    owner_header: PacketHeader | None = None
    buffer: bytearray | None = None
    pending: Pending | None = None
    whole: PacketHeader | None = None  # gathered, then routed as one packet


_MAX_ORPHANS = 1 << 16


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
    """The routing table of one VM connection. ``on_reply`` gets replies to commands of every
    origin that is not a debugger; ``on_push`` gets every DDM command the VM sends."""

    on_reply: Callable[[Pending, ReplyPacket], list[Command]]
    on_push: Callable[[CommandPacket], list[Command]]
    # Pieces of a DDM push too large to hold: (data, first, last). The default drops them.
    on_push_piece: Callable[[bytes, bool, bool], list[Command]] = field(
        default=lambda data, first, last: _discarded(first)
    )
    max_packet: int = 1 << 30
    stream_threshold: int = 1 << 20
    ids: IdRewriter = field(default_factory=IdRewriter)
    ready: bool = False  # the VM connection is open and not being released
    _decoder: PacketDecoder = field(init=False)
    _debuggers: dict[int, _Debugger] = field(default_factory=dict)
    _waiting: list[int] = field(default_factory=list)  # handshakes held until ready
    _held_vm_start: bytes | None = None
    _id_sizes: bytes | None = None
    _version: bytes | None = None  # VirtualMachine.Version reply, cached like IDSizes
    _relay: _Relay | None = None
    # VM-side ids of commands whose debugger left before the reply came: their replies are
    # dropped without a log line each (a dropped slow reader may leave thousands). Bounded.
    _orphans: dict[int, None] = field(default_factory=dict)
    bridge: Bridge = field(init=False)
    attached_count: int = 0
    packets_to_vm: int = 0
    packets_to_debuggers: int = 0
    bytes_to_vm: int = 0
    bytes_to_debuggers: int = 0

    def __post_init__(self) -> None:
        self._decoder = self._new_decoder()
        self.bridge = Bridge(self)

    def _new_decoder(self) -> PacketDecoder:
        return PacketDecoder(max_length=self.max_packet, stream_threshold=self.stream_threshold)

    # ------------------------------------------------------------------ queries

    def statistics(self) -> RouterStatistics:
        return RouterStatistics(
            self.packets_to_vm,
            self.packets_to_debuggers,
            self.bytes_to_vm,
            self.bytes_to_debuggers,
            len(self.ids),
            len(self._debuggers),
        )

    def attached(self) -> tuple[int, ...]:
        return tuple(d.id for d in self._debuggers.values() if d.attached)

    def debugger_count(self) -> int:
        return len(self._debuggers)

    def is_attached(self, number: int) -> bool:
        debugger = self._debuggers.get(number)
        return debugger is not None and debugger.attached

    def is_waiting(self, number: int) -> bool:
        return number in self._waiting

    def waiting(self) -> tuple[int, ...]:
        """Debuggers whose handshake is held until the VM connection is ready."""
        return tuple(self._waiting)

    def holders(self) -> list[tuple[str, str]]:
        """(peer, via) of every debugger, attached or still in its handshake."""
        return [(d.peer, d.via) for d in self._debuggers.values()]

    def peers(self) -> list[str]:
        """``PEER via PORT-KIND`` of every attached debugger."""
        return [f"{d.peer} via {d.via}" for d in self._debuggers.values() if d.attached]

    def debugger_statistics(self, number: int) -> tuple[int, int, int, int] | None:
        """(packets in, packets out, bytes in, bytes out) of one debugger."""
        d = self._debuggers.get(number)
        if d is None:
            return None
        return d.packets_in, d.packets_out, d.bytes_in, d.bytes_out

    def cached_id_sizes(self) -> bytes | None:
        return self._id_sizes

    # ------------------------------------------------------------------ the VM connection

    def connected(self, leftover: bytes = b"") -> list[Command]:
        """A new VM connection: a fresh decoder; held handshakes complete now."""
        self._decoder = self._new_decoder()
        self._relay = None
        self.ready = True
        self.bridge.reset()
        out: list[Command] = []
        for debugger in self._waiting:
            out += self._complete_handshake(debugger)
        self._waiting.clear()
        if leftover:
            out += self.vm_data(leftover)
        return out

    def connected_again(self) -> list[Command]:
        """The same connection is usable for debuggers again (the VM acknowledged a release):
        held handshakes complete now."""
        self.ready = True
        self.bridge.reset()
        out: list[Command] = []
        for debugger in self._waiting:
            out += self._complete_handshake(debugger)
        self._waiting.clear()
        return out

    def disconnected(self) -> list[Pending]:
        """The VM connection ended: every pending command of every origin fails at once (the
        caller tells their owners); debugger entries are dropped (their debuggers are closed
        or wait for the reconnect)."""
        self.ready = False
        self._relay = None
        self._orphans.clear()
        self.bridge.reset()
        return list(self.ids.drop_all())

    def relay_from_vm(self, data: bytes) -> SendToDebugger | None:
        """The relay lane: when ``data`` is exactly one whole reply to a debugger's command
        that nothing here reads, the command that passes it on (counted, its id restored);
        otherwise None and nothing changed (``vm_data`` takes it)."""
        if self._relay is not None or self._decoder.buffered or len(data) < 11:
            return None
        length, vm_id, flags, b9, b10 = _COMMAND_HEADER.unpack_from(data)
        if flags != 0x80 or length != len(data) or length > self.stream_threshold:
            return None
        ids = self.ids
        pending = ids.get(vm_id)
        if (
            pending is None
            or type(pending.origin) is not DebuggerOrigin
            or pending.command_set == CommandSet.VIRTUAL_MACHINE
            or vm_id in self.bridge.watch
        ):
            return None
        debugger = self._debuggers.get(pending.origin.debugger)
        if debugger is None or debugger.streaming:
            return None
        ids.forget(pending)
        head = _REPLY_HEADER.pack(length, pending.original_id, 0x80, (b9 << 8) | b10)
        debugger.packets_out += 1
        debugger.bytes_out += length
        self.packets_to_debuggers += 1
        self.bytes_to_debuggers += length
        return SendToDebugger(debugger.id, head + data[11:])

    def vm_data(self, data: bytes) -> list[Command]:
        """Bytes from the VM: route every complete packet (or piece) they finish."""
        relayed = self.relay_from_vm(data)
        if relayed is not None:
            return [relayed]
        decoder = self._decoder
        if self._relay is None and not decoder.buffered and len(data) >= 11:
            # The common case on the relay path: exactly one whole small packet.
            length, packet_id, flags, b9, b10 = _COMMAND_HEADER.unpack_from(data)
            if length == len(data) <= self.stream_threshold:
                if flags == 0x80:
                    return self._vm_reply(ReplyPacket(packet_id, (b9 << 8) | b10, data[11:]))
                if flags == 0 and b9 != CommandSet.DDM:
                    return self._vm_command(CommandPacket(packet_id, b9, b10, data[11:]), data)
        decoder.receive_data(data)
        out: list[Command] = []
        while True:
            # A RemoteProtocolError escapes: the session ends the connection (nothing after a
            # broken header can be read).
            event = decoder.next_event()
            if event is NEED_DATA or event is EOF or isinstance(event, ConnectionClosed):
                return out
            if isinstance(event, ReplyPacket):
                out += self._vm_reply(event)
            elif isinstance(event, CommandPacket):
                out += self._vm_command(event)
            elif isinstance(event, PacketStart):
                out += self._relay_start(event.header)
            elif isinstance(event, PacketPiece):
                out += self._relay_piece(event)

    def _vm_reply(self, packet: ReplyPacket) -> list[Command]:
        pending = self.ids.resolve(packet.id)
        watched = packet.id in self.bridge.watch
        if pending is None:
            if watched:  # a departed debugger's event request: the bridge clears it
                return self.bridge.reply(None, packet)[1]
            if self._orphans.pop(packet.id, 0) is None:
                return []  # its debugger left (logged once, when it left)
            return [Log("ddm.reply_unknown", fields={"id": packet.id, "error": packet.error_code})]
        origin = pending.origin
        if not isinstance(origin, DebuggerOrigin):
            if origin is BRIDGE_ORIGIN:
                return self.bridge.reply(pending, packet)[1]
            return self.on_reply(pending, packet)
        out: list[Command] = []
        if watched:
            passed, out = self.bridge.reply(pending, packet)
            if passed is None:
                return out
            packet = passed
        elif (
            pending.command_set == CommandSet.VIRTUAL_MACHINE
            and pending.command == VirtualMachineCommand.ID_SIZES
            and not packet.error_code
        ):
            out = self._learn_id_sizes(packet.data)
        elif (
            pending.command_set == CommandSet.VIRTUAL_MACHINE
            and pending.command == VirtualMachineCommand.VERSION
            and not packet.error_code
        ):
            self._version = packet.data  # the same for every debugger: asked once
        debugger = self._debuggers.get(origin.debugger)
        if debugger is None:
            return out
        body = packet.data
        data = _REPLY_HEADER.pack(11 + len(body), pending.original_id, 0x80, packet.error_code)
        return out + self._send(debugger, data + body)

    def _learn_id_sizes(self, data: bytes) -> list[Command]:
        self._id_sizes = data
        try:
            self.bridge.sizes = IdSizes.decode(data)
        except ProtocolError as exc:
            return [Log("vm.protocol_error", "warning", {"error": str(exc)})]
        return []

    def _vm_command(self, packet: CommandPacket, raw: bytes | None = None) -> list[Command]:
        if packet.command_set == CommandSet.DDM:
            return self.on_push(packet)
        if self.attached_count:
            data = encode(packet) if raw is None else raw
            if packet.command_set == CommandSet.EVENT and packet.command == _EVENT_COMPOSITE:
                return self.bridge.composite(packet, data)
            return [c for d in self._debuggers.values() if d.attached for c in self._send(d, data)]
        if _is_suspending_vm_start(packet):
            self._held_vm_start = encode(packet)
            return [Log("vm.start_held")]
        return [
            Log(
                "vm.event_dropped",
                level="debug",
                fields={"command_set": packet.command_set, "command": packet.command},
            )
        ]

    def _to_debugger(self, debugger: _Debugger, data: bytes, *, more: bool = False) -> Command:
        debugger.packets_out += not more
        debugger.bytes_out += len(data)
        self.packets_to_debuggers += not more
        self.bytes_to_debuggers += len(data)
        return SendToDebugger(debugger.id, data, more)

    def _send(self, debugger: _Debugger, data: bytes) -> list[Command]:
        """A whole packet for ``debugger``, or kept until its streamed packet has ended."""
        if debugger.streaming:
            debugger.deferred.append(data)
            return []
        return [self._to_debugger(debugger, data)]

    def _relay_start(self, header: PacketHeader) -> list[Command]:
        relay = self._relay = _Relay()
        if (header.is_reply and header.id in self.bridge.watch) or (
            not header.is_reply and header.command_set != CommandSet.DDM
        ):
            relay.whole, relay.buffer = header, bytearray()  # the bridge reads it whole
            return []
        if header.is_reply:
            pending = self.ids.resolve(header.id)
            if pending is None:
                if self._orphans.pop(header.id, 0) is None:
                    return []  # its debugger left: the pieces go nowhere
                return [Log("ddm.reply_unknown", fields={"id": header.id, "length": header.length})]
            origin = pending.origin
            if isinstance(origin, DebuggerOrigin):
                debugger = self._debuggers.get(origin.debugger)
                if debugger is None:
                    return []
                relay.debuggers = (debugger.id,)
                debugger.streaming = True
                data = encode_header(header.with_id(pending.original_id))
                return [self._to_debugger(debugger, data, more=True)]
            relay.pending, relay.owner_header, relay.buffer = pending, header, bytearray()
            return []
        # A DDM push too large to hold (a heap dump, a trace): its pieces go to the session,
        # which passes on the file a call waits for and drops anything else.
        relay.push = True
        return self.on_push_piece(b"", True, False)

    def _relay_piece(self, piece: PacketPiece) -> list[Command]:
        relay = self._relay
        if relay is None:
            return []
        out: list[Command] = []
        if relay.push:
            out += self.on_push_piece(piece.data, False, piece.last)
            if piece.last:
                self._relay = None
            return out
        for number in relay.debuggers:
            debugger = self._debuggers.get(number)
            if debugger is not None:
                out.append(self._to_debugger(debugger, piece.data, more=not piece.last))
                if piece.last:
                    debugger.streaming = False
                    deferred, debugger.deferred = debugger.deferred, []
                    out += [self._to_debugger(debugger, d) for d in deferred]
        if relay.buffer is not None:
            relay.buffer += piece.data
        if piece.last:
            self._relay = None
            whole = relay.whole
            if whole is not None:
                body = bytes(relay.buffer or b"")
                if whole.is_reply:
                    out += self._vm_reply(ReplyPacket(whole.id, whole.error_code, body))
                else:
                    packet = CommandPacket(whole.id, whole.command_set, whole.command, body)
                    out += self._vm_command(packet)
            elif relay.pending is not None and relay.owner_header is not None:
                header = relay.owner_header
                reply = ReplyPacket(header.id, header.error_code, bytes(relay.buffer or b""))
                out += self.on_reply(relay.pending, reply)
        return out

    # ------------------------------------------------------------------ ddmd's own commands

    def send_own(
        self, origin: Hashable, command_set: int, command: int, data: bytes, deadline: float
    ) -> tuple[int, SendToVm]:
        """A command of ddmd's own (or a chunk handler's): its VM-side id and the bytes."""
        vm_id = self.ids.allocate(origin, 0, command_set, command, deadline)
        packet = encode(CommandPacket(vm_id, command_set, command, data))
        self.packets_to_vm += 1
        self.bytes_to_vm += len(packet)
        return vm_id, SendToVm(packet)

    # ------------------------------------------------------------------ the bridge's host

    def bridge_send(self, command_set: int, command: int, data: bytes) -> tuple[int, list[Command]]:
        vm_id, send = self.send_own(BRIDGE_ORIGIN, command_set, command, data, math.inf)
        return vm_id, [send]

    def bridge_forward(self, debugger: int, packet: CommandPacket) -> tuple[int, list[Command]]:
        d = self._debuggers[debugger]
        vm_id = self.ids.allocate(d.origin, packet.id, packet.command_set, packet.command, math.inf)
        body = packet.data
        head = _COMMAND_HEADER.pack(11 + len(body), vm_id, 0, packet.command_set, packet.command)
        self.packets_to_vm += 1
        self.bytes_to_vm += 11 + len(body)
        return vm_id, [SendToVm(head + body)]

    def bridge_to_debugger(self, debugger: int, data: bytes) -> list[Command]:
        d = self._debuggers.get(debugger)
        return [] if d is None else self._send(d, data)

    def bridge_describe(self, debugger: int) -> dict[str, object]:
        d = self._debuggers.get(debugger)
        return {} if d is None else {"peer": d.peer, "via": d.via}

    # ------------------------------------------------------------------ debuggers

    def debugger_joined(self, debugger: int, via: str, peer: str) -> list[Command]:
        self._debuggers[debugger] = _Debugger(
            debugger,
            via,
            peer,
            PacketDecoder(max_length=self.max_packet, expect_handshake=True),
            DebuggerOrigin(debugger),
        )
        return []

    def relay_from_debugger(self, number: int, data: bytes) -> SendToVm | None:
        """The relay lane: when ``data`` is exactly one whole command of an attached debugger
        that no rule here answers or reads, the command that writes it to the VM (under a fresh
        id from the one IdRewriter); otherwise None and nothing changed (``debugger_data``
        takes it)."""
        debugger = self._debuggers.get(number)
        if (
            debugger is None
            or not debugger.attached
            or not self.ready
            or len(data) < 11
            or debugger.decoder.buffered
        ):
            return None
        length, packet_id, flags, command_set, command = _COMMAND_HEADER.unpack_from(data)
        if (
            length != len(data)
            or length > self.max_packet
            or flags != 0
            or command_set == CommandSet.VIRTUAL_MACHINE
        ):
            return None
        key = (command_set << 8) | command
        if key in BRIDGED and not (key in SHARED_VIEW and self.attached_count == 1):
            return None
        debugger.packets_in += 1
        debugger.bytes_in += length
        vm_id = self.ids.allocate_relayed(debugger.origin, packet_id, command_set, command)
        self.packets_to_vm += 1
        self.bytes_to_vm += length
        return SendToVm(_COMMAND_HEADER.pack(length, vm_id, 0, command_set, command) + data[11:])

    def debugger_data(self, number: int, data: bytes) -> tuple[list[Command], str | None]:
        """Bytes from a debugger. Returns the commands, and the reason it leaves (None while it
        stays): Dispose, EOF, or a protocol error."""
        relayed = self.relay_from_debugger(number, data)
        if relayed is not None:
            return [relayed], None
        debugger = self._debuggers.get(number)
        if debugger is None:
            return [], None
        debugger.decoder.receive_data(data)
        out: list[Command] = []
        while True:
            try:
                event = debugger.decoder.next_event()
            except ProtocolError as exc:
                out.append(
                    Log(
                        "debugger.protocol_error",
                        "warning",
                        {"debugger": number, "error": str(exc)},
                    )
                )
                return out, f"protocol error: {exc}"
            if event is NEED_DATA:
                return out, None
            if event is EOF or isinstance(event, ConnectionClosed):
                return out, "debugger closed the connection"
            if isinstance(event, Handshake):
                if self.ready:
                    out += self._complete_handshake(number)
                else:
                    self._waiting.append(number)
            elif isinstance(event, CommandPacket):
                debugger.packets_in += 1
                debugger.bytes_in += event.length
                more, leaving = self._debugger_command(debugger, event)
                out += more
                if leaving is not None:
                    return out, leaving
            elif isinstance(event, ReplyPacket):
                out.append(
                    Log(
                        "debugger.reply_dropped",
                        fields={"debugger": number, "id": event.id, "error": event.error_code},
                    )
                )

    def _complete_handshake(self, number: int) -> list[Command]:
        debugger = self._debuggers.get(number)
        if debugger is None:
            return []
        debugger.attached = True
        self.attached_count += 1
        self.bridge.joined(number)
        out: list[Command] = [
            SendToDebugger(number, HANDSHAKE),
            Log(
                "debugger.attached",
                fields={"debugger": number, "peer": debugger.peer, "via": debugger.via},
            ),
        ]
        held, self._held_vm_start = self._held_vm_start, None
        if held is not None:
            packet = CommandPacket(int.from_bytes(held[4:8], "big"), held[9], held[10], held[11:])
            out += self.bridge.composite(packet, held)
        return out

    def _debugger_command(
        self, debugger: _Debugger, packet: CommandPacket
    ) -> tuple[list[Command], str | None]:
        if packet.command_set == CommandSet.VIRTUAL_MACHINE:
            if packet.command == VirtualMachineCommand.DISPOSE:
                # Answered here: the release procedure, not the VM, drops the debugger's state.
                reply = encode(ReplyPacket(packet.id, 0))
                out: list[Command] = [Log("debugger.dispose", fields={"debugger": debugger.id})]
                return out + self._send(debugger, reply), "VirtualMachine.Dispose"
            if packet.command == VirtualMachineCommand.ID_SIZES and self._id_sizes is not None:
                reply = encode(ReplyPacket(packet.id, 0, self._id_sizes))
                return self._send(debugger, reply), None
            if packet.command == VirtualMachineCommand.VERSION and self._version is not None:
                reply = encode(ReplyPacket(packet.id, 0, self._version))
                return self._send(debugger, reply), None
        if not self.ready:
            return [], "the VM is not connected"
        if (packet.command_set << 8) | packet.command in BRIDGED:
            return self.bridge.command(debugger.id, packet), None
        return self.bridge_forward(debugger.id, packet)[1], None

    def debugger_left(self, number: int) -> tuple[bool, list[Command]]:
        """Forget a debugger: its pending ids go, and nothing more is sent to it. Returns whether
        it had attached (the caller decides about releasing the VM)."""
        debugger = self._debuggers.pop(number, None)
        if number in self._waiting:
            self._waiting.remove(number)
        if debugger is None:
            return False, []
        dropped = self.ids.drop_origin(debugger.origin)
        out: list[Command] = [CloseDebugger(number, "left")]
        if dropped:
            orphans = self._orphans
            for entry in dropped:
                orphans[entry.vm_id] = None
            while len(orphans) > _MAX_ORPHANS:
                del orphans[next(iter(orphans))]
            out.append(
                Log(
                    "debugger.replies_abandoned",
                    "debug",
                    {"debugger": number, "outstanding": len(dropped)},
                )
            )
        if debugger.attached:
            self.attached_count -= 1
            if not self.attached_count:
                self.bridge.reset()  # the release (DBGD, or a new connection) drops it all
            elif self.ready:
                out += self.bridge.left(number, dropped)  # the others go on undisturbed
        if self._relay is not None and number in self._relay.debuggers:
            self._relay.debuggers = tuple(d for d in self._relay.debuggers if d != number)
        return debugger.attached, out
