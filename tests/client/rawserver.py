"""The DDM server's side of a connection to a `DdmClient`, by hand: a raw JDWP socket built on
``ddmd.protocol``, for tests that check the bytes a client sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    PacketDecoder,
    ReplyPacket,
    encode,
)

WAIT = 5.0  # seconds: the longest any single wait of these helpers may take


def type_code(name: str) -> int:
    return int.from_bytes(name.encode("ascii"), "big")


class RawServer:
    """One connection to a client, past the handshake. Pushes that arrive while waiting for a
    reply are kept in ``pushes``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = PacketDecoder()
        self.pushes: list[CommandPacket] = []
        self._next_id = 0x40000001

    async def packet(self) -> CommandPacket | ReplyPacket | None:
        """The next packet from the client; None once it closed the connection."""
        with trio.fail_after(WAIT):
            while True:
                event = self.decoder.next_event()
                if event is NEED_DATA:
                    try:
                        data = await self.stream.receive_some(65536)
                    except trio.BrokenResourceError:
                        data = b""
                    self.decoder.receive_data(data)
                    continue
                if isinstance(event, ConnectionClosed):
                    return None
                assert isinstance(event, CommandPacket | ReplyPacket), event
                return event

    async def wait_closed(self) -> None:
        """Read until the client closes the connection (anything it sends is kept as pushes)."""
        while (packet := await self.packet()) is not None:
            if isinstance(packet, CommandPacket):
                self.pushes.append(packet)

    async def push(self) -> CommandPacket:
        """The next command packet the client sends of its own accord."""
        if self.pushes:
            return self.pushes.pop(0)
        packet = await self.packet()
        assert isinstance(packet, CommandPacket), packet
        return packet

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def command(self, command_set: int, command: int, data: bytes = b"") -> ReplyPacket:
        """Send a command; its reply (pushes on the way are kept)."""
        packet_id = self._next_id
        self._next_id += 1
        await self.send(encode(CommandPacket(packet_id, command_set, command, data)))
        while True:
            packet = await self.packet()
            assert packet is not None, "the client closed the connection instead of replying"
            if isinstance(packet, CommandPacket):
                self.pushes.append(packet)
                continue
            assert packet.id == packet_id, f"reply to {packet.id:#x}, expected {packet_id:#x}"
            return packet

    async def request(self, chunk_type: str, data: bytes = b"") -> ReplyPacket:
        """A DDM request of ``chunk_type`` carrying ``data``; the reply."""
        chunk_bytes = ddm.encode_chunk(
            ddm.decode_chunk(type_code(chunk_type), data, ddm.Direction.TO_VM)
        )
        return await self.command(CommandSet.DDM, 1, chunk_bytes)

    async def reply_chunks(self, chunk_type: str, data: bytes = b"") -> tuple[ddm.Chunk, ...]:
        """The chunks of the reply to a DDM request (the reply must carry no JDWP error)."""
        reply = await self.request(chunk_type, data)
        assert reply.error_code == 0, reply
        return ddm.chunks_of(reply, ddm.Direction.FROM_VM)


async def open_raw(port: int, *, handshake: bool = True) -> trio.SocketStream:
    """Connect to 127.0.0.1:port, retrying while it is refused: a client listens again a moment
    after its previous connection ended."""
    with trio.fail_after(WAIT):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                break
            except OSError:
                await trio.sleep(0.01)
        if handshake:
            await stream.send_all(HANDSHAKE)
            echo = b""
            while len(echo) < len(HANDSHAKE):
                data = await stream.receive_some(len(HANDSHAKE) - len(echo))
                assert data, f"the client closed the connection after {echo!r}"
                echo += data
            assert echo == HANDSHAKE
        return stream


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[RawServer]:
    """A handshaken connection to the client on ``port``, closed at the end."""
    stream = await open_raw(port)
    try:
        yield RawServer(stream)
    finally:
        await stream.aclose()
