"""Packets from the VM too large to hold whole (a heap dump, a trace, a large reply), relayed
piece by piece: where the pieces of the one packet under way go.

Layer: standard library and ``ddmd.protocol`` only (sans-IO). A part of ``Router``, which it
sees through ``PiecesHost``.

    reply to a consumer ──────────▶ that consumer, piece by piece (nothing else is written to
                                    it until the last piece: ``Consumer.streaming``)
    reply to ddmd / a handler ────▶ gathered whole, then ``on_reply`` (bounded by max_packet)
    reply or event the bridge reads ▶ gathered whole, then routed as one packet
    DDM push (a heap dump) ───────▶ ``on_push_piece`` (ddmd's capture) and every consumer that
                                    speaks DDM, piece by piece

``max_packet`` guards what ddmd buffers, not what it streams: a packet gathered whole (the
first two rows) longer than it is refused here (a ``RemoteProtocolError``: the session ends
the connection); one only relayed or written to disk may be as long as its length field
allows (4 GiB), and one nobody takes is dropped as it comes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ddmd.protocol.errors import RemoteProtocolError
from ddmd.protocol.idmap import IdRewriter, Pending
from ddmd.protocol.jdwp import (
    CommandPacket,
    CommandSet,
    PacketHeader,
    PacketPiece,
    ReplyPacket,
    encode_header,
)
from ddmd.session.bridge import Bridge
from ddmd.session.commands import Command, Log
from ddmd.session.consumers import Consumer, ConsumerTable

__all__ = ["Pieces", "PiecesHost"]


class PiecesHost(Protocol):
    """What ``Pieces`` needs of its router: the tables it reads, how a packet is delivered, and
    where a packet gathered whole is routed."""

    @property
    def max_packet(self) -> int: ...
    @property
    def ids(self) -> IdRewriter: ...
    @property
    def consumers(self) -> ConsumerTable: ...
    @property
    def bridge(self) -> Bridge: ...
    @property
    def on_reply(self) -> Callable[[Pending, ReplyPacket], list[Command]]: ...
    @property
    def on_push_piece(self) -> Callable[[bytes, bool, bool], list[Command]]: ...

    def was_orphan(self, vm_id: int) -> bool: ...
    def consumer_of(self, pending: Pending) -> Consumer | None: ...
    def is_consumer_origin(self, pending: Pending) -> bool: ...
    def to_consumer(self, consumer: Consumer, data: bytes, *, more: bool = False) -> Command: ...
    def vm_reply(self, packet: ReplyPacket) -> list[Command]: ...
    def vm_command(self, packet: CommandPacket, raw: bytes | None = None) -> list[Command]: ...


@dataclass(slots=True)
class _Relay:
    """Where the pieces of a packet too large to buffer go."""

    consumers: tuple[int, ...] = ()
    push: bool = False  # a large DDM push: its pieces go to on_push_piece too
    owner_header: PacketHeader | None = None
    buffer: bytearray | None = None
    pending: Pending | None = None
    whole: PacketHeader | None = None  # gathered, then routed as one packet


class Pieces:
    """The one large packet under way on a VM connection."""

    def __init__(self, router: PiecesHost) -> None:
        self._router = router
        # The packet under way (None: none); the relay lane tests it, one attribute read.
        self.relay: _Relay | None = None

    def reset(self) -> None:
        self.relay = None

    def forget(self, consumer: int) -> None:
        relay = self.relay
        if relay is not None and consumer in relay.consumers:
            relay.consumers = tuple(c for c in relay.consumers if c != consumer)

    def start(self, header: PacketHeader) -> list[Command]:
        router = self._router
        relay = self.relay = _Relay()
        if (header.is_reply and header.id in router.bridge.watch) or (
            not header.is_reply and header.command_set != CommandSet.DDM
        ):
            self._check_cap(header)
            relay.whole, relay.buffer = header, bytearray()  # the bridge reads it whole
            return []
        if header.is_reply:
            pending = router.ids.resolve(header.id)
            if pending is None:
                if router.was_orphan(header.id):
                    return []  # its consumer left: the pieces go nowhere
                return [Log("ddm.reply_unknown", fields={"id": header.id, "length": header.length})]
            consumer = router.consumer_of(pending)
            if consumer is not None:
                relay.consumers = (consumer.id,)
                consumer.streaming = True
                data = encode_header(header.with_id(pending.original_id))
                return [router.to_consumer(consumer, data, more=True)]
            if router.is_consumer_origin(pending):
                return []  # its consumer left
            self._check_cap(header)
            relay.pending, relay.owner_header, relay.buffer = pending, header, bytearray()
            return []
        # A DDM push too large to hold (a heap dump, a trace): its pieces go to the session,
        # which passes on the file a call waits for and drops anything else, and to every
        # consumer that speaks DDM.
        relay.push = True
        out: list[Command] = []
        head = encode_header(header)
        for consumer in router.consumers.ddm_speakers():
            if not consumer.streaming:
                consumer.streaming = True
                relay.consumers += (consumer.id,)
                out.append(router.to_consumer(consumer, head, more=True))
        return out + router.on_push_piece(b"", True, False)

    def _check_cap(self, header: PacketHeader) -> None:
        """A packet ddmd must hold whole: refused over ``max_packet``, in the decoder's words."""
        cap = self._router.max_packet
        if header.length > cap:
            self.relay = None
            length = header.length
            raise RemoteProtocolError(f"JDWP length {length} exceeds the configured cap {cap}")

    def piece(self, piece: PacketPiece) -> list[Command]:
        relay = self.relay
        if relay is None:
            return []
        router = self._router
        out: list[Command] = []
        for number in relay.consumers:
            consumer = router.consumers.by_id.get(number)
            if consumer is not None:
                out.append(router.to_consumer(consumer, piece.data, more=not piece.last))
                if piece.last:
                    consumer.streaming = False
                    deferred, consumer.deferred = consumer.deferred, []
                    out += [router.to_consumer(consumer, d) for d in deferred]
        if relay.push:
            out += router.on_push_piece(piece.data, False, piece.last)
            if piece.last:
                self.relay = None
            return out
        if relay.buffer is not None:
            relay.buffer += piece.data
        if piece.last:
            self.relay = None
            whole = relay.whole
            if whole is not None:
                body = bytes(relay.buffer or b"")
                if whole.is_reply:
                    out += router.vm_reply(ReplyPacket(whole.id, whole.error_code, body))
                else:
                    packet = CommandPacket(whole.id, whole.command_set, whole.command, body)
                    out += router.vm_command(packet)
            elif relay.pending is not None and relay.owner_header is not None:
                header = relay.owner_header
                reply = ReplyPacket(header.id, header.error_code, bytes(relay.buffer or b""))
                out += router.on_reply(relay.pending, reply)
        return out
