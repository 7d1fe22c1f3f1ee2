"""Serving the control API: hypercorn's HTTP machinery on listeners ddmd opens itself.

Layer: imports trio, hypercorn, `ddmd.peers` (the peer-uid rule), `ddmd.instance` (the private
runtime directory), errors, logs and netaddr; used by `control.app.serve` and `daemon`.

Why not ``hypercorn.trio.serve``: it opens its own listeners and hands every accepted connection
straight to its HTTP handler, with no hook in between. The peer-uid rule must close a
connection from another user before any HTTP byte is answered, and an ASGI middleware only
runs once a request has been read, when all it can do is answer (hypercorn answers 500 for an
app that returns without a response). So this module does what ``hypercorn.trio.run.
worker_serve`` does (lifespan, one handler per connection, graceful stop: the handlers get
``graceful_timeout`` seconds once accepting stops), on listeners wrapped in
`peers.GuardedListener`, using hypercorn's connection handler (``TCPServer``, which serves unix
sockets too) and its lifespan and worker-context classes, unchanged since hypercorn 0.17.

The unix socket (``[control] socket``): created 0600 in a directory that only its owner may
write to (created 0700 when missing, `instance.private_dir`). A socket file left by a daemon
that died is removed (nothing accepts on it: logged as ``control.socket_stale_removed``); one
that something still listens on stops the start with `ControlSocketError`. The file is removed
when the server stops, if it is still the one this server created.

Who asks over the unix socket: every connection accepted there has its peer's credentials read
once (``SO_PEERCRED``: the pid, uid and gid of the process that connected, as ``ddmd.peers``
reads them for the peer check), and every request on it carries them in the ASGI scope's
extensions (`PEER_CREDENTIALS`; `scope_peer` reads them), so a route can name the asker, e.g.
``vm.kill_requested``. A TCP request has the scope's ``client`` (host, port) instead.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import hypercorn.config
import trio
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, Framework, LifespanState
from hypercorn.utils import wrap_app
from starlette.types import ASGIApp

from ddmd.errors import DdmdError
from ddmd.instance import private_dir
from ddmd.logs import Event, get_logger
from ddmd.peers import GuardedListener, PeerGuard, user_name

__all__ = [
    "PEER_CREDENTIALS",
    "ControlBound",
    "ControlSocketError",
    "PeerCredentials",
    "open_unix_listener",
    "peer_credentials",
    "scope_peer",
    "serve_control",
]

log = get_logger("ddmd.control")

#: Seconds to find out whether something still listens on an existing socket file.
STALE_PROBE_TIMEOUT = 1.0
_BACKLOG = 128


@dataclass(frozen=True, slots=True)
class ControlBound:
    """Where the control API listens: TCP (host, port) and the unix socket, each None when off."""

    tcp: tuple[str, int] | None
    unix: Path | None


class ControlSocketError(DdmdError):
    """The control socket cannot be used: something listens there, the path is not a socket,
    or it cannot be created."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"the control socket {path} {why}; stop that program, or set [control] socket in "
            'the config file to another path ("" for none)'
        )
        self.path = path


async def _listening_there(path: Path) -> bool:
    """True when a server accepts connections on the unix socket `path`."""
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trio.fail_after(STALE_PROBE_TIMEOUT):
            await probe.connect(os.fspath(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except trio.TooSlowError:
        return True  # a listener with a full backlog: busy, but there
    finally:
        probe.close()
    return True


async def open_unix_listener(path: Path) -> tuple[trio.SocketListener, int]:
    """Listen on the unix socket `path` (0600, in a private directory); returns the listener
    and the socket file's inode (to remove only this file at the end)."""
    try:
        private_dir(path.parent)
    except OSError as exc:
        raise ControlSocketError(
            path, f"cannot be created: its directory {path.parent}: {exc.strerror or exc}"
        ) from None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise ControlSocketError(path, "exists and is not a socket")
        if await _listening_there(path):
            raise ControlSocketError(path, "is in use: another program (a running ddmd?) listens")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info(Event.CONTROL_SOCKET_STALE, socket=str(path))
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            await sock.bind(os.fspath(path))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ControlSocketError(path, "was created by another program meanwhile") from None
            raise ControlSocketError(path, f"cannot be created: {exc.strerror or exc}") from None
        # Before listen(): no connection can come in while the file still has the umask's mode
        # (connecting needs write permission on the file, and the directory is private anyway).
        os.chmod(path, 0o600)
        inode = os.lstat(path).st_ino
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock), inode


#: The ASGI scope extension with the `PeerCredentials` of a unix-socket connection's peer.
PEER_CREDENTIALS = "ddmd.peer_credentials"
#: struct ucred (pid_t pid; uid_t uid; gid_t gid), in the machine's byte order.
_UCRED = struct.Struct("=iII")


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The process at the other end of a unix socket, as the kernel saw it connect."""

    pid: int
    uid: int
    gid: int
    user: str | None  # None when the user database does not know the uid

    def describe(self) -> str:
        """``alice (uid 1000), pid 4242``: for a log line."""
        who = f"{self.user} (uid {self.uid})" if self.user else f"uid {self.uid}"
        return f"{who}, pid {self.pid}"


def peer_credentials(sock: trio.socket.SocketType) -> PeerCredentials | None:
    """``SO_PEERCRED`` of a connected unix socket; None for other sockets, on systems without
    it, or when the peer is gone already."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    except (OSError, struct.error):
        return None
    if pid <= 0:  # no process (a socketpair's peer may have none)
        return None
    return PeerCredentials(pid, uid, gid, user_name(uid))


def scope_peer(scope: Mapping[str, Any]) -> PeerCredentials | None:
    """The peer credentials `serve_control` put in a request's scope (unix socket only)."""
    peer = (scope.get("extensions") or {}).get(PEER_CREDENTIALS)
    return peer if isinstance(peer, PeerCredentials) else None


class _WithPeer:
    """Hypercorn's app wrapper for one connection: each request's scope gets the peer."""

    def __init__(self, inner: AppWrapper, peer: PeerCredentials) -> None:
        self._inner = inner
        self._peer = peer

    async def __call__(
        self,
        scope: Any,
        receive: Any,
        send: Any,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        if scope["type"] in ("http", "websocket"):
            extensions = {**(scope.get("extensions") or {}), PEER_CREDENTIALS: self._peer}
            scope = {**scope, "extensions": extensions}
        await self._inner(scope, receive, send, sync_spawn, call_soon)


def _remove_socket(path: Path, inode: int) -> None:
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)


def _hypercorn_config(graceful_timeout: float) -> hypercorn.config.Config:
    config = hypercorn.config.Config()
    config.accesslog = None
    # A Logger instance: hypercorn adds no handler of its own and the records go to the root
    # logger, which logs.configure() routes through structlog.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = graceful_timeout
    return config


async def _cancel_when(trigger: Callable[..., Awaitable[None]], scope: trio.CancelScope) -> None:
    await trigger()
    scope.cancel()


async def serve_control(
    app: ASGIApp,
    *,
    tcp: tuple[str, int] | None,
    unix: Path | None = None,
    guard: PeerGuard | None = None,
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    graceful_timeout: float = 3.0,
    listening: str = Event.CONTROL_LISTENING,
    task_status: trio.TaskStatus[ControlBound] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on TCP ``tcp`` (host, port) and/or the unix socket `unix` until cancelled
    or `shutdown_trigger` returns (then open requests get `graceful_timeout` seconds).
    ``listening``: the event logged once it listens (the metrics-only port logs its own).

    With a `guard`, every connection goes through the peer-uid rule first. Reports where it
    listens (`ControlBound`; port 0 gives the port the system picked) once every socket
    listens. A TCP bind failure is raised as the plain `OSError`; a unix socket that cannot be
    used as `ControlSocketError`.
    """
    listeners: list[trio.abc.Listener[trio.SocketStream]] = []
    plain: list[trio.SocketListener] = []
    bound_tcp: tuple[str, int] | None = None
    unix_inode: int | None = None
    try:
        if tcp is not None:
            host, port = tcp
            opened = await trio.open_tcp_listeners(port, host=host)
            plain.extend(opened)
            name = opened[0].socket.getsockname()
            bound_tcp = (str(name[0]), int(name[1]))
        if unix is not None:
            unix_listener, unix_inode = await open_unix_listener(unix)
            plain.append(unix_listener)
        listeners.extend(
            listener if guard is None else GuardedListener(listener, guard, "control")
            for listener in plain
        )
        await _serve(
            app,
            listeners,
            shutdown_trigger,
            graceful_timeout,
            task_status,
            bound_tcp,
            unix,
            listening,
        )
    finally:
        for listener in plain:
            with trio.CancelScope(shield=True):
                await listener.aclose()
        if unix is not None and unix_inode is not None:
            _remove_socket(unix, unix_inode)


def _starter(
    nursery: trio.Nursery, handle: Callable[[trio.SocketStream], Awaitable[None]]
) -> Callable[[trio.SocketStream], None]:
    def start(stream: trio.SocketStream) -> None:
        nursery.start_soon(handle, stream)

    return start


async def _serve(
    app: ASGIApp,
    listeners: Sequence[trio.abc.Listener[trio.SocketStream]],
    shutdown_trigger: Callable[..., Awaitable[None]] | None,
    graceful_timeout: float,
    task_status: trio.TaskStatus[ControlBound],
    bound_tcp: tuple[str, int] | None,
    unix: Path | None,
    listening: str,
) -> None:
    config = _hypercorn_config(graceful_timeout)
    wrapped = wrap_app(cast("Framework", app), config.wsgi_max_body_size, "asgi")
    state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)

    async def handle(stream: trio.SocketStream) -> None:
        # A unix-socket peer is named to the routes (PEER_CREDENTIALS); TCP peers by address.
        peer = peer_credentials(stream.socket)
        app_for_peer = wrapped if peer is None else _WithPeer(wrapped, peer)
        # hypercorn types the stream as its TLS stream; a plain one is what its own
        # worker passes for http:// binds too.
        server = TCPServer(
            app_for_peer, config, context, ConnectionState(state.copy()), cast("Any", stream)
        )
        await server.run()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as handlers:
            if bound_tcp is not None:
                log.info(listening, host=bound_tcp[0], port=bound_tcp[1])
            if unix is not None:
                log.info(Event.CONTROL_LISTENING, socket=str(unix))
            task_status.started(ControlBound(bound_tcp, unix))
            try:
                async with trio.open_nursery() as accepting:
                    if shutdown_trigger is not None:
                        accepting.start_soon(_cancel_when, shutdown_trigger, accepting.cancel_scope)
                    for listener in listeners:
                        if isinstance(listener, GuardedListener):
                            # Checked concurrently, never one accept at a time (peers.py).
                            accepting.start_soon(listener.serve, _starter(handlers, handle))
                            continue
                        accepting.start_soon(
                            partial(
                                trio.serve_listeners, handle, [listener], handler_nursery=handlers
                            )
                        )
            finally:
                # Idle keep-alive connections close now; busy ones get the grace period.
                await context.terminated.set()
                handlers.cancel_scope.deadline = trio.current_time() + graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
