"""Closing a stream without waiting long or raising (shared by the drivers and discovery), and
the relay loops' reads (`Reader`).

Layer: trio, structlog, logs.
"""

from __future__ import annotations

import os

import structlog
import trio

from ddmd.logs import Event

log = structlog.get_logger("ddmd.drive")

#: Seconds a close may take before it is given up.
CLOSE_PATIENCE = 1.0


async def aclose_quietly(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` within `CLOSE_PATIENCE`, even while the caller is being cancelled; a
    failure to close is logged (debug) and otherwise ignored."""
    with trio.move_on_after(CLOSE_PATIENCE) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except Exception:
            log.debug(Event.STREAM_CLOSE_FAILED)


class Reader:
    """The reads of one relay loop. A socket is read with one ``os.read`` when bytes are
    waiting, and waits in epoll only when none are: what ``receive_some`` does, without its
    wrappers and without its yield after each read (about half its cost per read here). The
    caller yields once per packet instead, after passing it on (docs/design.md, the relay
    lane). Any other stream (tests' memory streams) is read with ``receive_some``.

    Errors are those of ``receive_some``: ClosedResourceError when the socket was closed (also
    by another task while this one waits), BrokenResourceError for a connection error."""

    __slots__ = ("_sock", "_stream")

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._sock = stream.socket if isinstance(stream, trio.SocketStream) else None

    async def receive(self, max_bytes: int) -> bytes:
        sock = self._sock
        if sock is None:
            return bytes(await self._stream.receive_some(max_bytes))
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the socket is closed")
            try:
                return os.read(fd, max_bytes)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            await trio.lowlevel.wait_readable(sock)
