"""`DdmClient`: the public face of a DDM client that is not a VM: its settings, its handler and
callback registration, pushes, and serving. The package docstring (`ddmd.client`) is the
user's guide; the mechanics live in two parts the client owns and delegates to:
`ddmd.client.link` (`ClientLink`: the listening socket, one DDM server connection at a time,
the read loop, pushes and the connect/disconnect callbacks) and `ddmd.client.requests`
(`RequestAnswerer`: the handler table and the reply to each request).

Layer: ``ddmd.protocol`` (DDM chunks), `ddmd.client.identity`, trio and structlog; nothing of
the daemon.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import structlog
import trio

from ddmd.client.identity import (
    BUILT_IN_TYPES,
    VM_IDENT,
    Identity,
    chunk_type_code,
    outgoing_chunk,
)
from ddmd.client.link import Callback, ClientLink, NotConnectedError
from ddmd.client.requests import ChunkReply, RequestAnswerer, RequestHandler

__all__ = ["ChunkReply", "ClientStatistics", "DdmClient", "NotConnectedError", "RequestHandler"]

logger = structlog.get_logger("ddmd.client")

H = TypeVar("H", bound=RequestHandler)
C = TypeVar("C", bound=Callback)


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
        handshake_timeout = _positive("handshake_timeout", handshake_timeout)
        send_timeout = _positive("send_timeout", send_timeout)
        handler_timeout = _positive("handler_timeout", handler_timeout)
        self._requests = RequestAnswerer(self._identity, handler_timeout)
        self._link = ClientLink(
            host=host,
            port=port,
            handshake_timeout=handshake_timeout,
            send_timeout=send_timeout,
            handler_timeout=handler_timeout,
            max_packet=max_packet,
            requests=self._requests,
            log=logger.bind(app=app_name),
        )
        self._serving = False

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
        return self._link.host

    @property
    def port(self) -> int:
        """The listening port: the real one once `serve` listens (also when given as 0)."""
        return self._link.port

    @property
    def identity(self) -> Identity:
        """Everything the HELO reply says (app name, pid, VM ident, the trailers)."""
        return self._identity

    @property
    def chunk_types(self) -> tuple[str, ...]:
        """The request types with a handler, sorted: the FEAT reply lists them."""
        return self._requests.chunk_types

    @property
    def connected(self) -> bool:
        """True while a DDM server is connected (from the handshake to the end)."""
        return self._link.connected

    def statistics(self) -> ClientStatistics:
        """A snapshot of the client's counters."""
        requests = self._requests
        return ClientStatistics(
            connections=self._link.connections,
            connected=self.connected,
            ddm_requests=requests.ddm_requests,
            unhandled_requests=requests.unhandled,
            failed_requests=requests.failed,
            malformed_requests=requests.malformed,
            refused_commands=requests.refused,
            pushes=self._link.pushes,
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
        if self._requests.has_handler(code):
            raise ValueError(f"chunk type {chunk_type} already has a handler")

        def register(handler: H) -> H:
            if not callable(handler):
                raise ValueError(f"on_chunk({chunk_type!r}) needs a function, not {handler!r}")
            self._requests.add_handler(code, chunk_type, handler)
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
        self._link.on_connected.append(callback)
        return callback

    def on_disconnected(self, callback: C) -> C:
        """Decorator: call ``callback()`` once a connection has ended (for every connection
        that got its on_connected calls, also when `serve` is cancelled). A coroutine
        function is awaited, for at most ``handler_timeout`` seconds."""
        if not callable(callback):
            raise ValueError(f"on_disconnected needs a function, not {callback!r}")
        self._link.on_disconnected.append(callback)
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
        await self._link.push(outgoing_chunk(code, bytes(data)))

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
            await self._link.serve(task_status)
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
                    self._link.log.info("client.stopping", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return
