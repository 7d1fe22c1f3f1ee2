"""One connection of a simulated VM: the stream, its send lock, what the client enabled, and
the handshake.

Layer: imports `ddmd.protocol` (the packet decoder) and trio; used by `sim.link` and the
handlers (`sim.vm`, `sim.ddmhandlers`, `sim.ddms`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import trio

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import NEED_DATA, Handshake, PacketDecoder

__all__ = ["ID_WINDOW", "Connection", "ConnectionBrokenError", "read_handshake", "receive"]

# A command id seen again within this many commands of one connection counts as a
# duplicate: ids are only unique among outstanding commands, but a well-behaved multiplexer
# (one counter per VM connection) never comes back to an id that soon.
ID_WINDOW: Final = 4096


class ConnectionBrokenError(Exception):
    """A send failed or timed out; the connection is being torn down."""


class Connection:
    """Per-connection state: the stream, its send lock, and what the client enabled."""

    def __init__(self, stream: trio.SocketStream, send_timeout: float) -> None:
        self.stream = stream
        self.send_timeout = send_timeout
        self.lock = trio.StrictFIFOLock()
        self.cancel_scope = trio.CancelScope()
        self.broken = False
        self.close_after_reply = False
        self.thread_notify = False
        self.hpif_when = 0
        self.hpsg_when = 0
        self.hpsg_what = 0
        self.nhsg_when = 0
        self.suspend_count = 0  # VirtualMachine.Suspend minus Resume
        self.next_request_id = 1
        self.recent_ids: dict[int, None] = {}  # insertion-ordered, at most ID_WINDOW

    def note_id(self, packet_id: int) -> bool:
        """Remember a command id; True when it was already among the recent ones."""
        recent = self.recent_ids
        duplicate = packet_id in recent
        if duplicate:
            del recent[packet_id]
        recent[packet_id] = None
        if len(recent) > ID_WINDOW:
            del recent[next(iter(recent))]
        return duplicate

    async def send(self, data: bytes) -> None:
        """Write one whole packet; on failure mark the connection broken and cancel it."""
        if self.broken:
            raise ConnectionBrokenError
        async with self.lock:
            await self.send_locked(data)

    async def send_pieces(self, pieces: Iterable[bytes]) -> None:
        """Write one packet given in pieces (a large push), holding the send lock until the
        last piece so nothing lands in between; each piece gets ``send_timeout``."""
        if self.broken:
            raise ConnectionBrokenError
        async with self.lock:
            for piece in pieces:
                await self.send_locked(piece)

    async def send_locked(self, data: bytes) -> None:
        """``send`` for a caller that already holds ``lock``."""
        try:
            with trio.fail_after(self.send_timeout):
                await self.stream.send_all(data)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
            self.cancel_scope.cancel()
            raise ConnectionBrokenError from None


async def receive(stream: trio.SocketStream) -> bytes:
    """The next bytes from ``stream``; b"" once it is closed or broken."""
    try:
        return await stream.receive_some(65536)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


async def read_handshake(stream: trio.SocketStream, decoder: PacketDecoder) -> str | None:
    """Read the client's JDWP handshake into ``decoder``: None once it is complete, else why
    it failed (the caller bounds the wait)."""
    while True:
        try:
            event = decoder.next_event()
        except ProtocolError as exc:
            return str(exc)
        if isinstance(event, Handshake):
            return None
        if event is not NEED_DATA:  # EOF before the handshake
            return "connection closed"
        decoder.receive_data(await receive(stream))
