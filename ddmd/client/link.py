"""`ClientLink`: a `DdmClient`'s transport: the listening socket, one DDM server connection at a
time (handshake, read loop, sends under one lock), pushes, and the connect/disconnect
callbacks. What to reply to each command is the `RequestAnswerer`'s business
(`ddmd.client.requests`); the link reads commands, asks it, and writes the replies.

Layer: ``ddmd.protocol`` (JDWP framing, DDM chunks), `ddmd.client.requests`, trio and
structlog; nothing of the daemon.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Final, TypeAlias

import trio
from structlog.typing import FilteringBoundLogger

from ddmd.client.requests import RequestAnswerer
from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    ConnectionClosed,
    Handshake,
    PacketDecoder,
    ReplyPacket,
    encode,
)

__all__ = ["Callback", "ClientLink", "NotConnectedError"]

#: A connect or disconnect callback: a plain function, or a coroutine function.
Callback: TypeAlias = Callable[[], object]

# VMs number the commands they send themselves (pushes) apart from the server's ids; this is
# ART 9+'s scheme (protocol.md 1.3): a counter with bit 31 forced on, first id 0x80000001.
_PUSH_ID_BIT: Final = 0x80000000
_PUSH_ID_MASK: Final = 0x7FFFFFFF
_RECEIVE_SIZE: Final = 65536


class NotConnectedError(Exception):
    """`DdmClient.send_chunk` found no DDM server connected, or the connection broke (or a send
    timed out) while the chunk was being written."""


class _Connection:
    """One accepted connection: its stream, the send lock, and the scope that ends it."""

    def __init__(self, stream: trio.SocketStream, peer: str, send_timeout: float) -> None:
        self.stream = stream
        self.peer = peer
        self.send_timeout = send_timeout
        self.lock = trio.StrictFIFOLock()
        self.scope = trio.CancelScope()
        self.broken = False

    async def send(self, data: bytes) -> None:
        """Write one whole packet under the lock. A failed or timed-out send leaves an unknown
        part of the packet written: the connection is marked broken and ended."""
        if self.broken:
            raise NotConnectedError("the connection to the DDM server is closing")
        async with self.lock:
            try:
                with trio.fail_after(self.send_timeout):
                    await self.stream.send_all(data)
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.broken = True
                self.scope.cancel()
                why = (
                    f"the DDM server read nothing for {self.send_timeout:g} s"
                    if isinstance(exc, trio.TooSlowError)
                    else "the connection to the DDM server broke"
                )
                raise NotConnectedError(why) from None


async def _receive(stream: trio.SocketStream) -> bytes:
    """The next bytes from ``stream``; b"" once it is closed or broken."""
    try:
        return await stream.receive_some(_RECEIVE_SIZE)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return b""


class ClientLink:
    """The listening socket and the one connection of a `DdmClient`.

    ``port`` becomes the real port once `serve` listens; ``log`` is the client's logger,
    bound to that port from then on. ``on_connected`` and ``on_disconnected`` are the
    callbacks `DdmClient` registered, run in order.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        handshake_timeout: float,
        send_timeout: float,
        handler_timeout: float,
        max_packet: int,
        requests: RequestAnswerer,
        log: FilteringBoundLogger,
    ) -> None:
        self.host = host
        self.port = port
        self._handshake_timeout = handshake_timeout
        self._send_timeout = send_timeout
        self._handler_timeout = handler_timeout
        self._max_packet = max_packet
        self._requests = requests
        self.log = log
        self.on_connected: list[Callback] = []
        self.on_disconnected: list[Callback] = []
        self._conn: _Connection | None = None
        self._push_serial = 0
        # counters
        self.connections = 0
        self.pushes = 0

    @property
    def connected(self) -> bool:
        """True while a DDM server is connected (from the handshake to the end)."""
        return self._conn is not None and not self._conn.broken

    async def push(self, chunk: ddm.Chunk) -> None:
        """Send ``chunk`` to the connected server as a command with an id of our own
        (``0x80000000 | n``). Raises NotConnectedError when there is none, or it breaks."""
        conn = self._conn
        if conn is None:
            raise NotConnectedError("no DDM server is connected")
        self._push_serial = (self._push_serial % _PUSH_ID_MASK) + 1
        await conn.send(encode(ddm.ddm_command(_PUSH_ID_BIT | self._push_serial, chunk)))
        self.pushes += 1

    # ------------------------------------------------------------------------- serving

    async def serve(self, task_status: trio.TaskStatus[int]) -> None:
        """Listen and serve, one connection at a time, until cancelled (`DdmClient.serve`)."""
        listener = await self._listen()
        self.port = listener.socket.getsockname()[1]
        self.log = self.log.bind(port=self.port)
        self.log.info("client.listening", host=self.host)
        task_status.started(self.port)
        while True:
            stream = await self._accept(listener)
            try:
                await self._serve_connection(stream)
            except Exception:  # the edge: one connection's bug never stops the client
                self.log.exception("client.connection_failed")
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
            listener = await self._listen_again()

    async def _listen(self) -> trio.SocketListener:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host, backlog=4)
        for extra in listeners[1:]:
            await extra.aclose()
        return listeners[0]

    async def _accept(self, listener: trio.SocketListener) -> trio.SocketStream:
        """The next connection; the listener is closed once it is in (or on cancellation).
        Running out of file descriptors or memory is waited out, as trio's serve_listeners
        does."""
        try:
            while True:
                try:
                    return await listener.accept()
                except OSError as exc:
                    self.log.warning("client.accept_failed", error=str(exc))
                    await trio.sleep(0.1)
        finally:
            await listener.aclose()

    async def _listen_again(self) -> trio.SocketListener:
        """Rebind the port after a connection. It can be taken for a moment (an outgoing
        connection's local port, or someone else's listener): retry with back-off."""
        delay = 0.01
        warned = False
        while True:
            try:
                listener = await self._listen()
            except OSError as exc:
                if not warned:
                    self.log.warning("client.port_busy", error=str(exc))
                    warned = True
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if warned:
                self.log.info("client.listening", host=self.host)
            return listener

    # ------------------------------------------------------------------------- one connection

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            host, port, *_ = stream.socket.getpeername()
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        decoder = PacketDecoder(expect_handshake=True, max_length=self._max_packet)
        with trio.move_on_after(self._handshake_timeout) as waited:
            error = await self._read_handshake(stream, decoder)
        if waited.cancelled_caught:
            error = f"no handshake within {self._handshake_timeout:g} s"
        if error is not None:
            self.log.info("client.handshake_failed", peer=peer, error=error)
            return
        conn = _Connection(stream, peer, self._send_timeout)
        try:
            async with conn.lock:
                # Published under the send lock: a push from another task waits for the echo.
                self._conn = conn
                with trio.fail_after(self._send_timeout):
                    await stream.send_all(HANDSHAKE)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            self._conn = None
            self.log.info("client.handshake_failed", peer=peer, error="the echo was not sent")
            return
        self.connections += 1
        self._requests.new_connection()
        self.log.info("client.connected", peer=peer)
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    for callback in self.on_connected:
                        self._connected_callback(nursery, callback)
                    await self._read_loop(conn, decoder)
                    nursery.cancel_scope.cancel()
        finally:
            self._conn = None
            conn.broken = True
            self.log.info("client.disconnected", peer=peer)
            for callback in self.on_disconnected:
                await self._disconnected_callback(callback)

    @staticmethod
    async def _read_handshake(stream: trio.SocketStream, decoder: PacketDecoder) -> str | None:
        """None once the server's handshake is in, else why not (the caller bounds the wait)."""
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                return str(exc)
            if isinstance(event, Handshake):
                return None
            if event is not NEED_DATA:
                return "the connection closed before the handshake"
            decoder.receive_data(await _receive(stream))

    async def _read_loop(self, conn: _Connection, decoder: PacketDecoder) -> None:
        # No read deadline: a server may send nothing for hours (ddmd asks for nothing once it
        # knows who the client is); the connection lasts as long as the server keeps it.
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                # Framing is lost (a bad length or flags): nothing after it can be trusted.
                self.log.warning("client.protocol_error", peer=conn.peer, error=str(exc))
                return
            if event is NEED_DATA:
                decoder.receive_data(await _receive(conn.stream))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, ReplyPacket):
                # Nothing the client sends expects a reply (protocol.md 1.6): drop it.
                self.log.debug("client.reply_dropped", id=event.id)
                continue
            if not isinstance(event, CommandPacket):  # pragma: no cover - nothing is streamed
                continue
            reply = await self._requests.answer(event, self.log)
            try:
                await conn.send(encode(reply))
            except NotConnectedError:
                return

    # ------------------------------------------------------------------------- callbacks

    def _connected_callback(self, nursery: trio.Nursery, callback: Callback) -> None:
        name = getattr(callback, "__name__", repr(callback))
        try:
            result = callback()
        except Exception as exc:
            self.log.warning(
                "client.callback_failed", callback=name, error=repr(exc), exc_info=True
            )
            return
        if not inspect.isawaitable(result):
            return
        awaitable = result

        async def task() -> None:
            try:
                await awaitable
            except NotConnectedError:
                pass  # the connection ended under it: the task's natural end
            except Exception as exc:
                self.log.warning(
                    "client.callback_failed", callback=name, error=repr(exc), exc_info=True
                )

        nursery.start_soon(task, name=f"on_connected {name}")

    async def _disconnected_callback(self, callback: Callback) -> None:
        name = getattr(callback, "__name__", repr(callback))
        try:
            result = callback()
            if inspect.isawaitable(result):
                with trio.move_on_after(self._handler_timeout) as limit:
                    limit.shield = True  # also runs while serve() is being cancelled
                    await result
        except Exception as exc:
            self.log.warning(
                "client.callback_failed", callback=name, error=repr(exc), exc_info=True
            )
