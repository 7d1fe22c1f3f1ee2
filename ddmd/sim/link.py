"""`SimLink`: a simulated VM's end of the wire: the listening socket, one JDWP connection at a
time, the handshake, the read loop, replies and pushes. `SimVm` owns one and decides what each
command means (the ``dispatch`` it passes in); the link only moves packets and counts them.

Layer: imports ``ddmd.protocol`` (JDWP framing), `sim.config`, `sim.connection`, `sim.jdwp`
(the ``Halt`` a handler raises), trio and structlog; used by `sim.vm`.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import trio
from structlog.typing import FilteringBoundLogger

from ddmd.protocol.errors import ProtocolError
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
from ddmd.sim.config import SimConfig
from ddmd.sim.connection import Connection, ConnectionBrokenError, read_handshake, receive
from ddmd.sim.jdwp import Halt

__all__ = ["CHUNK_HEADER", "DDM_SET", "Dispatch", "SimLink"]

_PUSH_HEADER = struct.Struct(">IIBBB")
#: A DDM chunk's header: type, data length.
CHUNK_HEADER = struct.Struct(">II")

DDM_SET: Final = int(CommandSet.DDM)
_VM_ID_BIT: Final = 0x80000000
_MAX_PACKET: Final = 1 << 20  # commands a debugger sends are small; reject absurd lengths

#: Answer one command from the client (reply, push, or nothing); raise ``Halt`` to end the VM.
Dispatch = Callable[[Connection, CommandPacket], Awaitable[None]]


class SimLink:
    """The listening socket and the one open connection of a `SimVm`.

    ``serve`` runs until a command halts the VM (``exited``, ``exit_status``). ``log`` is the
    VM's logger, bound to the port once it is known; the counters are read by
    ``SimVm.statistics()``.
    """

    def __init__(
        self,
        config: SimConfig,
        log: FilteringBoundLogger,
        dispatch: Dispatch,
        on_closed: Callable[[], None],
    ) -> None:
        self.config = config
        self.log = log
        self._dispatch = dispatch
        self._on_closed = on_closed  # after every connection, whatever ended it
        self.port: int | None = None
        self.listening = False
        self.conn: Connection | None = None
        self.exited = False
        self.exit_status: int | None = None
        self._push_serial = 0
        # counters
        self.connections_accepted = 0
        self.packets_received = 0
        self.replies_sent = 0
        self.replies_received = 0
        self.duplicate_ids = 0
        self.pushes_sent = 0

    # ----------------------------------------------------------------------------- listening

    async def _open_listener(self) -> trio.SocketListener:
        port = self.port if self.port is not None else self.config.port
        delay = 0.01
        for attempt in range(60):
            try:
                listeners = await trio.open_tcp_listeners(port, host=self.config.host, backlog=4)
            except OSError:
                if self.port is None or attempt == 59:  # first bind: report at once
                    raise
                # our own port, briefly taken (e.g. by an outgoing connection): retry
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            listener = listeners[0]
            for extra in listeners[1:]:
                await extra.aclose()
            return listener
        raise AssertionError("unreachable")  # pragma: no cover

    async def serve(self, app_name: Callable[[], str], task_status: trio.TaskStatus[int]) -> None:
        """Listen, serve one connection at a time, until a command halts the VM.

        Reports the real port with ``task_status.started(port)`` once listening, and logs
        it with the VM's name at that moment (``app_name()``).
        """
        reported = False
        while not self.exited:
            listener = await self._open_listener()
            self.listening = True
            if self.port is None:
                self.port = listener.socket.getsockname()[1]
                self.log = self.log.bind(port=self.port)
            if not reported:
                self.log.info("sim.listening", host=self.config.host, app=app_name())
                task_status.started(self.port)
                reported = True
            try:
                stream = await listener.accept()
            finally:
                # A VM admits one JDWP connection at a time: stop listening while it is open,
                # so a second connect is refused (what HotSpot does).
                self.listening = False
                await listener.aclose()
            self.connections_accepted += 1
            self.log.info("sim.connection_accepted", n=self.connections_accepted)
            try:
                await self._handle(stream)
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
            self.log.info("sim.connection_closed")

    # ----------------------------------------------------------------------------- connection

    async def _handle(self, stream: trio.SocketStream) -> None:
        decoder = PacketDecoder(expect_handshake=True, max_length=_MAX_PACKET)
        conn = Connection(stream, self.config.send_timeout)
        with trio.move_on_after(self.config.handshake_timeout) as scope:
            error = await read_handshake(stream, decoder)
            if error is not None:
                self.log.info("sim.handshake_failed", error=error)
                return
        if scope.cancelled_caught:
            self.log.info("sim.handshake_timed_out")
            return
        try:
            async with conn.lock:
                # Publish the connection while holding its send lock: a push from another
                # task (GC, churn, APNM, a test hook) queues up behind the echo.
                self.conn = conn
                await conn.send_locked(HANDSHAKE)
            with conn.cancel_scope:
                await self._read_loop(conn, decoder)
        except ConnectionBrokenError:
            self.log.info("sim.send_failed")
        finally:
            # Thread notification and heap pushes end with the connection, and (as on every
            # real VM) a debugger's suspensions are released when its connection closes.
            self.conn = None
            self._on_closed()

    async def _read_loop(self, conn: Connection, decoder: PacketDecoder) -> None:
        # No read deadline here on purpose: a VM waits for its debugger's next command for
        # as long as the connection stays open. Sends are bounded by ``send_timeout``.
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                self.log.info("sim.protocol_error", error=str(exc))
                return
            if event is NEED_DATA:
                decoder.receive_data(await receive(conn.stream))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, ReplyPacket):
                # The VM never expects replies (protocol.md 1.6): count it, then drop it.
                self.replies_received += 1
                self.log.info("sim.reply_received", id=event.id)
                continue
            if not isinstance(event, CommandPacket):  # pragma: no cover - no streaming here
                continue
            self.packets_received += 1
            if conn.note_id(event.id):
                self.duplicate_ids += 1
                self.log.info("sim.duplicate_id", id=event.id)
            try:
                await self._dispatch(conn, event)
            except Halt as halt:
                self._halt(halt.status)
                return
            if conn.close_after_reply:
                return

    async def reply(self, conn: Connection, packet_id: int, data: bytes, error: int = 0) -> None:
        await conn.send(encode(ReplyPacket(packet_id, error, data)))
        self.replies_sent += 1

    def _halt(self, status: int) -> None:
        self.exited = True
        self.exit_status = status
        self.log.info("sim.exited", status=status)

    # ----------------------------------------------------------------------------- pushes

    def _next_push_id(self) -> int:
        self._push_serial = (self._push_serial % 0x7FFFFFFF) + 1
        return _VM_ID_BIT | self._push_serial

    def _push_packet(self, chunk: bytes) -> bytes:
        return _PUSH_HEADER.pack(11 + len(chunk), self._next_push_id(), 0, DDM_SET, 1) + chunk

    async def push(self, chunk: bytes, conn: Connection | None = None) -> bool:
        """Push one chunk on ``conn`` (default: the current connection). False if none."""
        conn = conn or self.conn
        if conn is None or conn.broken:
            return False
        try:
            await conn.send(self._push_packet(chunk))
        except ConnectionBrokenError:
            return False
        self.pushes_sent += 1
        return True

    async def push_stream(
        self, chunk_type: int, length: int, pieces: Iterable[bytes], conn: Connection
    ) -> bool:
        """Push one chunk whose ``length`` data bytes come as ``pieces``, never joined: the
        packet and chunk headers first, then each piece, all under the send lock. False if
        it could not be sent; a wrong total (a sim bug) breaks the connection."""
        if conn.broken:
            return False
        head = _PUSH_HEADER.pack(
            11 + CHUNK_HEADER.size + length, self._next_push_id(), 0, DDM_SET, 1
        ) + CHUNK_HEADER.pack(chunk_type, length)
        sent = 0

        def counted() -> Iterable[bytes]:
            nonlocal sent
            for piece in pieces:
                sent += len(piece)
                if sent > length:
                    break
                yield piece

        try:
            await conn.send_pieces(itertools.chain((head,), counted()))
        except ConnectionBrokenError:
            return False
        if sent != length:
            self.log.error("sim.stream_length_mismatch", declared=length, sent=sent)
            conn.broken = True
            conn.cancel_scope.cancel()
            return False
        self.pushes_sent += 1
        return True
