"""`DdmClient`: the listening socket, one DDM server connection at a time, request dispatch,
pushes and the connect/disconnect callbacks. The package docstring (`ddmd.client`) is the
user's guide; this module documents the mechanics.

Layer: ``ddmd.protocol`` (JDWP framing, DDM chunks), `ddmd.client.identity`, trio and structlog;
nothing of the daemon.
"""

from __future__ import annotations

import inspect
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeAlias, TypeVar

import structlog
import trio

from ddmd.client.identity import (
    BUILT_IN_TYPES,
    VM_IDENT,
    Identity,
    chunk_type_code,
    outgoing_chunk,
)
from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    ConnectionClosed,
    ErrorCode,
    Handshake,
    PacketDecoder,
    ReplyPacket,
    encode,
)

__all__ = ["ChunkReply", "ClientStatistics", "DdmClient", "NotConnectedError", "RequestHandler"]

logger = structlog.get_logger("ddmd.client")

#: What a request handler returns: ``(chunk type, chunk data)`` for the reply chunk, or None
#: for an empty reply ("done, nothing to say").
ChunkReply: TypeAlias = tuple[str, bytes] | None
#: A request handler: gets the request's chunk data. Plain functions and coroutine functions
#: are both accepted.
RequestHandler: TypeAlias = Callable[[bytes], ChunkReply | Awaitable[ChunkReply]]
#: A connect or disconnect callback: a plain function, or a coroutine function.
Callback: TypeAlias = Callable[[], object]

H = TypeVar("H", bound=RequestHandler)
C = TypeVar("C", bound=Callback)

# VMs number the commands they send themselves (pushes) apart from the server's ids; this is
# ART 9+'s scheme (protocol.md 1.3): a counter with bit 31 forced on, first id 0x80000001.
_PUSH_ID_BIT: Final = 0x80000000
_PUSH_ID_MASK: Final = 0x7FFFFFFF
_FAIL_CODE: Final = 1  # the generic failure code of Android's framework handlers (2.5)
_FAIL_MESSAGE_MAX: Final = 300  # characters of an exception message carried in a FAIL chunk
_RECEIVE_SIZE: Final = 65536


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """Counters since the client was made (`DdmClient.statistics`)."""

    connections: int  # DDM servers that completed the handshake
    connected: bool
    ddm_requests: int  # DDM requests answered, HELO and FEAT included
    unhandled_requests: int  # ... of them: no handler (an empty reply)
    failed_requests: int  # ... of them: the handler failed (a FAIL reply)
    malformed_requests: int  # ... of them: chunks that do not parse (an empty reply)
    refused_commands: int  # non-DDM JDWP commands (NOT_IMPLEMENTED)
    pushes: int  # chunks sent with send_chunk


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


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


class DdmClient:
    """A DDM client that is not a VM: it listens on ``host:port`` and a DDM server (ddmd's port
    scan) connects to it, as it connects to a VM started with ``-agentlib:jdwp=server=y``.

    Args:
        app_name: the name the server lists (the HELO "app name", a VM's process name).
        port: the TCP port to listen on; put it in the server's scan range (ddmd: 8000-8040).
            0 picks a free port (see `port` once `serve` has started).
        host: the address to listen on; keep it loopback.
        pid: the pid reported in HELO (default: this process's).
        package_name: the HELO package name (default: ``app_name``).
        vm_ident: the HELO VM identity string (default ``"ddmd.client <version>"``).
        handshake_timeout: seconds a new connection may take to send its JDWP handshake.
        send_timeout: seconds one packet may take to be written; a server that reads nothing
            for that long loses its connection.
        handler_timeout: seconds a coroutine request handler, or an async on_disconnected
            callback, may run before it is cancelled (a request then gets a FAIL reply).
        max_packet: the largest packet accepted from the server, in bytes; a longer one ends
            the connection.

    Raises ValueError for a bad argument, naming it.
    """

    def __init__(
        self,
        app_name: str,
        *,
        port: int,
        host: str = "127.0.0.1",
        pid: int | None = None,
        package_name: str | None = None,
        vm_ident: str = VM_IDENT,
        handshake_timeout: float = 5.0,
        send_timeout: float = 10.0,
        handler_timeout: float = 10.0,
        max_packet: int = 16 << 20,
    ) -> None:
        for name, text in (("app_name", app_name), ("host", host), ("vm_ident", vm_ident)):
            if not isinstance(text, str):
                raise ValueError(f"{name} must be a string, not {type(text).__name__}")
        if package_name is not None and not isinstance(package_name, str):
            raise ValueError(f"package_name must be a string, not {type(package_name).__name__}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 0xFFFF:
            raise ValueError(f"port must be a TCP port number (0-65535), not {port!r}")
        if pid is not None and (
            isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= 0xFFFFFFFF
        ):
            raise ValueError(f"pid must be a non-negative 32-bit integer, not {pid!r}")
        if isinstance(max_packet, bool) or not isinstance(max_packet, int) or max_packet < 19:
            raise ValueError(f"max_packet must be an integer of at least 19, not {max_packet!r}")
        self._identity = Identity.local(
            app_name, pid=pid, package_name=package_name, vm_ident=vm_ident
        )
        self._host = host
        self._port = port
        self._handshake_timeout = _positive("handshake_timeout", handshake_timeout)
        self._send_timeout = _positive("send_timeout", send_timeout)
        self._handler_timeout = _positive("handler_timeout", handler_timeout)
        self._max_packet = max_packet
        self._handlers: dict[int, tuple[str, RequestHandler]] = {}
        self._on_connected: list[Callback] = []
        self._on_disconnected: list[Callback] = []
        self._conn: _Connection | None = None
        self._serving = False
        self._push_serial = 0
        self._connections = 0
        self._ddm_requests = 0
        self._unhandled = 0
        self._failed = 0
        self._malformed = 0
        self._refused = 0
        self._pushes = 0
        self._seen: set[str] = set()  # what was logged once on this connection
        self._log = logger.bind(app=app_name)

    # ------------------------------------------------------------------------- properties

    @property
    def app_name(self) -> str:
        return self._identity.app_name

    @property
    def pid(self) -> int:
        """The pid reported in HELO."""
        return self._identity.pid

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        """The listening port: the real one once `serve` listens (also when given as 0)."""
        return self._port

    @property
    def identity(self) -> Identity:
        """Everything the HELO reply says (app name, pid, VM ident, the trailers)."""
        return self._identity

    @property
    def chunk_types(self) -> tuple[str, ...]:
        """The request types with a handler, sorted: the FEAT reply lists them."""
        return tuple(sorted(name for name, _ in self._handlers.values()))

    @property
    def connected(self) -> bool:
        """True while a DDM server is connected (from the handshake to the end)."""
        return self._conn is not None and not self._conn.broken

    def statistics(self) -> ClientStatistics:
        """A snapshot of the client's counters."""
        return ClientStatistics(
            connections=self._connections,
            connected=self.connected,
            ddm_requests=self._ddm_requests,
            unhandled_requests=self._unhandled,
            failed_requests=self._failed,
            malformed_requests=self._malformed,
            refused_commands=self._refused,
            pushes=self._pushes,
        )

    # ------------------------------------------------------------------------- registration

    def on_chunk(self, chunk_type: str) -> Callable[[H], H]:
        """Decorator: ``handler(data)`` answers requests of ``chunk_type`` (4 ASCII characters).

        ``data`` is the request's chunk data (bytes, possibly empty). The handler returns
        ``(type, data)``, the reply chunk (usually the request's own type), or None for an empty
        reply. It may be a coroutine function (cancelled after ``handler_timeout``); a plain
        function must not block. Requests are handled one at a time, in order; chunks a
        handler pushes with `send_chunk` reach the server before its reply. An exception
        is logged (``client.handler_failed``) and answered with a FAIL chunk (code 1, the
        exception's text); the client keeps serving.

        Raises ValueError for a malformed type, a built-in one (HELO, FEAT, DBGD, FAIL) or one
        that already has a handler.
        """
        code = chunk_type_code(chunk_type)
        if chunk_type in BUILT_IN_TYPES:
            raise ValueError(f"{chunk_type} is answered by DdmClient itself")
        if code in self._handlers:
            raise ValueError(f"chunk type {chunk_type} already has a handler")

        def register(handler: H) -> H:
            if not callable(handler):
                raise ValueError(f"on_chunk({chunk_type!r}) needs a function, not {handler!r}")
            self._handlers[code] = (chunk_type, handler)
            return handler

        return register

    def on_connected(self, callback: C) -> C:
        """Decorator: call ``callback()`` each time a DDM server has connected (after the JDWP
        handshake, before the first request is read).

        A plain function is called right away. A coroutine function runs as a task for as long
        as the connection lasts: it may loop, pushing chunks with `send_chunk`, and it is
        cancelled when the connection ends. Exceptions are logged (``client.callback_failed``)
        and do not end the connection.
        """
        if not callable(callback):
            raise ValueError(f"on_connected needs a function, not {callback!r}")
        self._on_connected.append(callback)
        return callback

    def on_disconnected(self, callback: C) -> C:
        """Decorator: call ``callback()`` once a connection has ended (for every connection
        that got its on_connected calls, also when `serve` is cancelled). A coroutine
        function is awaited, for at most ``handler_timeout`` seconds."""
        if not callable(callback):
            raise ValueError(f"on_disconnected needs a function, not {callback!r}")
        self._on_disconnected.append(callback)
        return callback

    # ------------------------------------------------------------------------- pushing

    async def send_chunk(self, chunk_type: str, data: bytes) -> None:
        """Push one chunk to the connected DDM server, unasked (a DDM command packet with an id
        of the client's own: ``0x80000000 | n``, as ART numbers its pushes).

        Raises ValueError for a malformed type or data that is not bytes (or, for a type
        Android defines, data without that type's layout), and NotConnectedError when no
        server is connected or the connection breaks during the send.
        """
        code = chunk_type_code(chunk_type)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"chunk data must be bytes, not {type(data).__name__}")
        chunk = outgoing_chunk(code, bytes(data))
        conn = self._conn
        if conn is None:
            raise NotConnectedError("no DDM server is connected")
        self._push_serial = (self._push_serial % _PUSH_ID_MASK) + 1
        await conn.send(encode(ddm.ddm_command(_PUSH_ID_BIT | self._push_serial, chunk)))
        self._pushes += 1

    # ------------------------------------------------------------------------- serving

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve DDM servers, one connection at a time, until cancelled.

        Reports the real port through ``task_status`` once listening, so
        ``port = await nursery.start(client.serve)`` works. While a server is connected the
        port is closed, as a VM's is (a second server is refused, not left hanging); it
        listens again when the connection ends. Raises OSError when the port cannot be bound
        at the start.
        """
        if self._serving:
            raise RuntimeError(f"{self.app_name}: serve() is already running")
        self._serving = True
        try:
            listener = await self._listen()
            self._port = listener.socket.getsockname()[1]
            self._log = self._log.bind(port=self._port)
            self._log.info("client.listening", host=self._host)
            task_status.started(self._port)
            while True:
                stream = await self._accept(listener)
                try:
                    await self._serve_connection(stream)
                except Exception:  # the edge: one connection's bug never stops the client
                    self._log.exception("client.connection_failed")
                finally:
                    with trio.move_on_after(1) as cleanup:
                        cleanup.shield = True
                        await stream.aclose()
                listener = await self._listen_again()
        finally:
            self._serving = False

    def run(self) -> None:
        """Serve until Ctrl-C or SIGTERM (then return): for a script whose only job this is.

        Runs its own trio loop; inside trio, use ``await client.serve()`` instead.
        """
        trio.run(self._run_until_signal)

    async def _run_until_signal(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.serve)
            if threading.current_thread() is not threading.main_thread():
                return  # signals reach only the main thread; serve until cancelled
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    self._log.info("client.stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

    async def _listen(self) -> trio.SocketListener:
        listeners = await trio.open_tcp_listeners(self._port, host=self._host, backlog=4)
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
                    self._log.warning("client.accept_failed", error=str(exc))
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
                    self._log.warning("client.port_busy", error=str(exc))
                    warned = True
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if warned:
                self._log.info("client.listening", host=self._host)
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
            self._log.info("client.handshake_failed", peer=peer, error=error)
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
            self._log.info("client.handshake_failed", peer=peer, error="the echo was not sent")
            return
        self._connections += 1
        self._seen.clear()
        self._log.info("client.connected", peer=peer)
        try:
            with conn.scope:
                async with trio.open_nursery() as nursery:
                    for callback in self._on_connected:
                        self._connected_callback(nursery, callback)
                    await self._read_loop(conn, decoder)
                    nursery.cancel_scope.cancel()
        finally:
            self._conn = None
            conn.broken = True
            self._log.info("client.disconnected", peer=peer)
            for callback in self._on_disconnected:
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
                self._log.warning("client.protocol_error", peer=conn.peer, error=str(exc))
                return
            if event is NEED_DATA:
                decoder.receive_data(await _receive(conn.stream))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, ReplyPacket):
                # Nothing the client sends expects a reply (protocol.md 1.6): drop it.
                self._log.debug("client.reply_dropped", id=event.id)
                continue
            if not isinstance(event, CommandPacket):  # pragma: no cover - nothing is streamed
                continue
            if ddm.is_ddm(event):
                self._ddm_requests += 1
                reply = await self._answer_ddm(event)
            else:
                self._refused += 1
                command = f"{event.command_set}/{event.command}"
                if self._first_time(command):
                    self._log.debug("client.command_refused", command=command)
                reply = ReplyPacket(event.id, ErrorCode.NOT_IMPLEMENTED)
            try:
                await conn.send(encode(reply))
            except NotConnectedError:
                return

    # ------------------------------------------------------------------------- DDM requests

    async def _answer_ddm(self, packet: CommandPacket) -> ReplyPacket:
        """The reply to one DDM request. Only the first chunk of a packet is handled (what
        Dalvik and ART 9+ do, protocol.md 2.4)."""
        try:
            chunks = ddm.decode_chunks(packet.data, ddm.Direction.TO_VM)
            if not chunks:
                raise ProtocolError("the packet carries no chunk")
        except ProtocolError as exc:
            # As Dalvik and ART 5-8 do: an empty reply, so the request still ends.
            self._malformed += 1
            self._log.warning("client.request_malformed", id=packet.id, error=str(exc))
            return ReplyPacket(packet.id)
        chunk = chunks[0]
        if isinstance(chunk, ddm.HeloRequest):
            return _reply(packet.id, self._identity.hello())
        if isinstance(chunk, ddm.FeatRequest):
            return _reply(packet.id, ddm.FeatReply(self.chunk_types))
        if isinstance(chunk, ddm.Dbgd):
            return _reply(packet.id, ddm.Dbgd())
        entry = self._handlers.get(chunk.chunk_type)
        if entry is None:
            # No handler: an empty reply, as the draft, Dalvik, ART 5-8 and ART with its agent
            # answer an unknown type (ART 9+ without the agent sends nothing at all).
            self._unhandled += 1
            name = ddm.type_name(chunk.chunk_type)
            if self._first_time(name):
                self._log.debug("client.request_unhandled", type=name)
            return ReplyPacket(packet.id)
        name, handler = entry
        return ReplyPacket(packet.id, 0, await self._call_handler(name, handler, chunk))

    async def _call_handler(self, name: str, handler: RequestHandler, chunk: ddm.Chunk) -> bytes:
        """The reply's data: the handler's chunk, nothing, or a FAIL chunk."""
        try:
            with trio.fail_after(self._handler_timeout):
                result = handler(chunk.encode_data())
                if inspect.isawaitable(result):
                    result = await result
            if result is None:
                return b""
            return _result_chunk(result)
        except trio.TooSlowError:
            why = f"the {name} handler did not finish within {self._handler_timeout:g} s"
            self._failed += 1
            self._log.warning("client.handler_failed", type=name, error=why)
            return ddm.encode_chunk(ddm.Fail(_FAIL_CODE, why))
        except Exception as exc:
            self._failed += 1
            self._log.warning("client.handler_failed", type=name, error=repr(exc), exc_info=True)
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return ddm.encode_chunk(ddm.Fail(_FAIL_CODE, message[:_FAIL_MESSAGE_MAX]))

    def _first_time(self, what: str) -> bool:
        """True the first time on this connection: a server polling a type the client does
        not serve (ddmd's thread-state polls) is logged once, not at every poll."""
        if what in self._seen:
            return False
        self._seen.add(what)
        return True

    # ------------------------------------------------------------------------- callbacks

    def _connected_callback(self, nursery: trio.Nursery, callback: Callback) -> None:
        name = getattr(callback, "__name__", repr(callback))
        try:
            result = callback()
        except Exception as exc:
            self._log.warning(
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
                self._log.warning(
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
            self._log.warning(
                "client.callback_failed", callback=name, error=repr(exc), exc_info=True
            )


def _reply(packet_id: int, chunk: ddm.Chunk) -> ReplyPacket:
    return ReplyPacket(packet_id, 0, ddm.encode_chunk(chunk))


def _result_chunk(result: object) -> bytes:
    """A handler's ``(type, data)`` as chunk bytes; anything else is the handler's bug."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"the handler returned {result!r}; expected (type, data) or None")
    chunk_type, data = result
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"the handler's reply data is {type(data).__name__}, not bytes")
    return ddm.encode_chunk(outgoing_chunk(chunk_type_code(chunk_type), bytes(data)))
