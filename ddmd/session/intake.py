"""What consumers send: their handshake, their commands (debugger commands through the
bridge's rules, DDM requests through ``ddmshare``), their departure.

Layer: standard library and ``ddmd.protocol`` only (sans-IO). A part of ``Router``, which it
sees through ``IntakeHost``: the fast lane for plain commands (``Router.relay_from_debugger``,
which the driver tries first) stays there; everything else a
consumer sends comes here: the commands ``lanes.SLOW_LANE`` lists (each with its reason), and
any packet the fast lane does not take whole (split, during a handshake, before the VM is ready).

    handshake ─▶ answered once the VM connection is ready; a debugger counts from here on
    DDM request ─▶ ddmshare: answered here (HELO, FEAT, a switch others keep on) or relayed
                   under a fresh id with a deadline (an ART VM may never answer)
    debugger command ─▶ a front socket's first one makes it a debugger (within
                   ``[debugger] max_per_vm``); Dispose answered here; IDSizes and Version
                   from the cache; the bridge's commands to the bridge; the rest relayed
    leaving ─▶ its pending ids dropped, the switches only it wanted turned off, the bridge
                   told when it was debugging (the last debugger's release is release.py's)

Held commands (issue 31): a command of a consumer whose handshake is done (a front socket that
has not debugged yet, a DDM-only client) that arrives while the connection is not usable (the
VM being released, or reopened for it) is held, with every later one of that consumer, and
taken in order once the connection is usable again (``replay_held``), as held handshakes are;
if the VM goes away instead, each is answered with a JDWP error (``refuse_held``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.idmap import IdRewriter
from ddmd.protocol.jdwp import (
    DDM_COMMAND,
    EOF,
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    Handshake,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)
from ddmd.session.bridge import BRIDGED, Bridge
from ddmd.session.commands import CloseDebugger, Command, Log, SendToDebugger, SendToVm
from ddmd.session.consumers import Consumer, ConsumerTable
from ddmd.session.ddmshare import DdmShare
from ddmd.session.foresight import Foresight
from ddmd.session.pieces import Pieces

__all__ = ["SHARE_ORIGIN", "Intake", "IntakeHost"]

_DDM = CommandSet.DDM
_MAX_ORPHANS = 1 << 16


class _ShareOrigin:
    """The id-map origin of the requests ddmd sends for departed consumers (switches they
    left on): their replies are read by nobody."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd (for a departed client)"


SHARE_ORIGIN = _ShareOrigin()


class IntakeHost(Protocol):
    """What ``Intake`` needs of its router: its tables and caches, the connection's state, and
    how a packet goes to the VM or a consumer."""

    handshakes: int  # handshakes completed, ever
    held_vm_start: bytes | None  # a suspending VM_START kept for the first debugger

    @property
    def consumers(self) -> ConsumerTable: ...
    @property
    def ids(self) -> IdRewriter: ...
    @property
    def bridge(self) -> Bridge: ...
    @property
    def share(self) -> DdmShare: ...
    @property
    def foresight(self) -> Foresight: ...
    @property
    def pieces(self) -> Pieces: ...
    @property
    def orphans(self) -> dict[int, None]: ...
    @property
    def ready(self) -> bool: ...
    @property
    def now(self) -> float: ...
    @property
    def ddm_timeout(self) -> float: ...
    @property
    def max_debuggers(self) -> int: ...
    @property
    def id_sizes(self) -> bytes | None: ...
    @property
    def version_reply(self) -> bytes | None: ...
    @property
    def attached_count(self) -> int: ...

    def deliver(self, consumer: Consumer, data: bytes) -> list[Command]: ...
    def bridge_forward(
        self, debugger: int, packet: CommandPacket, deadline: float = ...
    ) -> tuple[int, list[Command]]: ...
    def send_own(
        self, origin: Hashable, command_set: int, command: int, data: bytes, deadline: float
    ) -> tuple[int, SendToVm]: ...


class Intake:
    """Everything a consumer sends, but the fast lane."""

    def __init__(self, router: IntakeHost) -> None:
        self._r = router
        # Commands held while the connection is not usable, in arrival order (issue 31).
        self._held: list[tuple[int, CommandPacket]] = []

    def debugger_data(self, number: int, data: bytes) -> tuple[list[Command], str | None]:
        """Bytes from a consumer. Returns the commands, and the reason it leaves (None while it
        stays): Dispose, EOF, a protocol error, or one debugger too many."""
        consumer = self._r.consumers.by_id.get(number)
        if consumer is None:
            return [], None
        consumer.decoder.receive_data(data)
        out: list[Command] = []
        while True:
            try:
                event = consumer.decoder.next_event()
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
                if self._r.ready:
                    out += self.complete_handshake(number)
                else:
                    self._r.consumers.waiting.append(number)
            elif isinstance(event, CommandPacket):
                consumer.packets_in += 1
                consumer.bytes_in += event.length
                if not self._r.ready or any(n == number for n, _ in self._held):
                    self._held.append((number, event))  # taken once the VM is usable
                    continue
                more, leaving = self._consumer_command(consumer, event)
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

    def replay_held(self) -> list[tuple[int, list[Command], str | None]]:
        """The held commands, taken in order now that the connection is usable: per consumer,
        the commands and why it leaves (None: it stays; its later commands are dropped)."""
        held, self._held = self._held, []
        out: list[tuple[int, list[Command], str | None]] = []
        gone: set[int] = set()
        for number, packet in held:
            consumer = self._r.consumers.by_id.get(number)
            if consumer is None or number in gone:
                continue
            more, leaving = self._consumer_command(consumer, packet)
            if leaving is not None:
                gone.add(number)
            out.append((number, more, leaving))
        return out

    def refuse_held(self, error: int) -> list[Command]:
        """The VM is gone: each held command answered with JDWP ``error``."""
        held, self._held = self._held, []
        out: list[Command] = []
        for number, packet in held:
            consumer = self._r.consumers.by_id.get(number)
            if consumer is not None:
                out += self._r.deliver(consumer, encode(ReplyPacket(packet.id, error)))
        return out

    def complete_handshake(self, number: int) -> list[Command]:
        """Answer a consumer's handshake (the router calls it for the handshakes held until the
        VM connection was ready)."""
        consumer = self._r.consumers.by_id.get(number)
        if consumer is None:
            return []
        consumer.attached = True
        self._r.handshakes += 1
        fields: dict[str, object] = {"debugger": number, "peer": consumer.peer, "via": consumer.via}
        if consumer.tool is not None:
            fields["tool"] = consumer.tool
        out: list[Command] = [
            SendToDebugger(number, HANDSHAKE),
            Log("debugger.attached", fields=fields),
        ]
        if consumer.kind.debugs_from_handshake:
            out += self._start_debugging(consumer)
        return out

    def _start_debugging(self, consumer: Consumer) -> list[Command]:
        self._r.consumers.start_debugging(consumer)
        self._r.bridge.joined(consumer.id)
        # The first debugger of a session: foresight asks the last session's class data again.
        out = self._r.foresight.debugging_started() if self._r.attached_count == 1 else []
        held, self._r.held_vm_start = self._r.held_vm_start, None
        if held is None:
            return out
        packet = CommandPacket(int.from_bytes(held[4:8], "big"), held[9], held[10], held[11:])
        return out + self._r.bridge.composite(packet, held)

    def _consumer_command(
        self, consumer: Consumer, packet: CommandPacket
    ) -> tuple[list[Command], str | None]:
        if packet.command_set == _DDM:
            return self._ddm_command(consumer, packet), None
        out: list[Command] = []
        if not consumer.debugging:
            # A front socket's first debugger command: from now on it is a debugger.
            if self._r.consumers.counted() >= self._r.max_debuggers:
                reason = f"one debugger too many ([debugger] max_per_vm is {self._r.max_debuggers})"
                fields = {"peer": consumer.peer, "via": consumer.via, "reason": reason}
                return [Log("debugger.rejected", "warning", fields)], reason
            out = self._start_debugging(consumer)
        more, leaving = self._debugger_command(consumer, packet)
        return out + more, leaving

    def _ddm_command(self, consumer: Consumer, packet: CommandPacket) -> list[Command]:
        """A DDM request of a consumer: answered here, or relayed under a fresh id (its reply
        goes to that consumer alone; a VM that never answers it lets it expire)."""
        consumer.speaks_ddm = True
        verdict = self._r.share.request(consumer.id, packet.data)
        if verdict.relay:
            if not self._r.ready:
                return []
            return self._r.bridge_forward(consumer.id, packet, self._r.now + self._r.ddm_timeout)[1]
        out: list[Command] = [
            Log(
                "debugger.ddm_answered",
                "debug",
                {
                    "debugger": consumer.id,
                    "chunk": ddm.type_name(_chunk_type(packet.data)),
                    "why": verdict.why,
                },
            )
        ]
        if verdict.answer is not None:
            out += self._r.deliver(consumer, encode(ReplyPacket(packet.id, 0, verdict.answer)))
        return out

    def _debugger_command(
        self, debugger: Consumer, packet: CommandPacket
    ) -> tuple[list[Command], str | None]:
        if packet.command_set == CommandSet.VIRTUAL_MACHINE:
            if packet.command == VirtualMachineCommand.DISPOSE:
                # Answered here: the release procedure, not the VM, drops the debugger's state.
                reply = encode(ReplyPacket(packet.id, 0))
                out: list[Command] = [Log("debugger.dispose", fields={"debugger": debugger.id})]
                return out + self._r.deliver(debugger, reply), "VirtualMachine.Dispose"
            if packet.command == VirtualMachineCommand.ID_SIZES and self._r.id_sizes is not None:
                reply = encode(ReplyPacket(packet.id, 0, self._r.id_sizes))
                return self._r.deliver(debugger, reply), None
            if (
                packet.command == VirtualMachineCommand.VERSION
                and self._r.version_reply is not None
            ):
                reply = encode(ReplyPacket(packet.id, 0, self._r.version_reply))
                return self._r.deliver(debugger, reply), None
        if not self._r.ready:
            return [], "the VM is not connected"
        if self._r.foresight.on:
            served = self._r.foresight.command(debugger.id, packet)  # foresight.py
            if served is not None:
                return served, None
        if (packet.command_set << 8) | packet.command in BRIDGED:
            return self._r.bridge.command(debugger.id, packet), None
        return self._r.bridge_forward(debugger.id, packet)[1], None

    def debugger_left(self, number: int) -> tuple[bool, bool, list[Command]]:
        """Forget a consumer: its pending ids go, nothing more is sent to it, and the DDM
        switches only it wanted are turned off. Returns whether its handshake was done and
        whether it was debugging (the caller decides about releasing the VM)."""
        consumer = self._r.consumers.remove(number)
        if consumer is None:
            return False, False, []
        dropped = self._r.ids.drop_origin(consumer.origin)
        out: list[Command] = [CloseDebugger(number, "left")]
        if dropped:
            orphans = self._r.orphans
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
        for chunk in self._r.share.left(number):
            if self._r.ready:
                data = ddm.encode_chunk(chunk)
                deadline = self._r.now + self._r.ddm_timeout
                out.append(self._r.send_own(SHARE_ORIGIN, _DDM, DDM_COMMAND, data, deadline)[1])
                out.append(
                    Log(
                        "debugger.ddm_switch_off",
                        fields={"debugger": number, "chunk": chunk.TYPE.name},
                    )
                )
        self._held = [(n, p) for n, p in self._held if n != number]
        if consumer.debugging:
            if not self._r.attached_count:
                # The last one: the release part releases what it holds, or drops it all
                # with the connection (DBGD, or a new connection).
                self._r.bridge.departed(number, dropped)
            elif self._r.ready:
                out += self._r.bridge.left(number, dropped)  # the others go on undisturbed
        self._r.pieces.forget(number)
        return consumer.attached, consumer.debugging, out


def _chunk_type(data: bytes) -> int:
    return int.from_bytes(data[:4], "big") if len(data) >= 4 else 0
