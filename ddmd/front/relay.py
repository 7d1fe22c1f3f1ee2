"""The front's byte plumbing: requests read from a client under a deadline, exact reads of the
real server's replies, the two-way pipe of a relayed connection, and a gentle close.

Layer: trio and `protocol.adbwire` only; no decisions (those are in `front.conversation`).

Deadlines: a client must send each whole request within ``[front] request_timeout``; each
reply the front itself reads from the real server must come within ``[timeouts] adb``. A
relayed connection (a stream such as ``track-devices``, ``shell:``, ``logcat``) has no idle
deadline: it may be quiet for hours, and a reader that stops reading (a paused pager) holds
the server back exactly as it would without the front. It ends when either end closes.
"""

from __future__ import annotations

import contextlib
from typing import Final

import trio

from ddmd.protocol.adbrequests import NEED_DATA, Request, RequestDecoder, frame
from ddmd.protocol.adbwire import FAIL, OKAY, AdbMalformed, parse_length

__all__ = [
    "BUFFER",
    "ClientGone",
    "ClientRequests",
    "RequestTimedOut",
    "UpstreamReplies",
    "UpstreamSilent",
    "close_gently",
    "pipe",
]

#: Bytes per read of a relayed stream.
BUFFER: Final = 65536
#: Seconds a closing socket's unread input is drained before it is closed (adb's server does
#: the same: closing with unread input sends a reset, which can destroy the last reply).
DRAIN: Final = 1.0

_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class ClientGone(Exception):
    """The client closed its end inside a request (``received`` bytes of it had come)."""

    def __init__(self, received: int) -> None:
        super().__init__(f"the client closed the connection inside a request ({received} bytes)")
        self.received = received


class RequestTimedOut(Exception):
    """A whole request did not arrive within the deadline."""

    def __init__(self, patience: float, received: int) -> None:
        super().__init__(f"no whole request within {patience:g} s ({received} bytes came)")
        self.patience = patience
        self.received = received


class ClientRequests:
    """Requests from one client, never reading past the current one (so the bytes after a
    ``jdwp:PID`` stay in the socket for the VM that takes it over)."""

    def __init__(self, stream: trio.SocketStream, patience: float) -> None:
        self._stream = stream
        self._patience = patience
        self._decoder = RequestDecoder()

    async def next(self) -> Request | None:
        """The next request; None when the client closed between requests. `AdbBadRequest`
        (a length the server refuses), `ClientGone`, `RequestTimedOut`."""
        decoder = self._decoder
        with trio.move_on_after(self._patience):
            while (got := decoder.next_request()) is NEED_DATA:
                try:
                    data = await self._stream.receive_some(decoder.needed)
                except _BROKEN:
                    data = b""
                if not data:
                    if decoder.buffered:
                        raise ClientGone(decoder.buffered)
                    return None
                decoder.receive_data(data)
            return got
        raise RequestTimedOut(self._patience, decoder.buffered)

    def take_buffer(self) -> bytes:
        """Bytes read and not part of a request (none, as long as `next` reads)."""
        return self._decoder.take_buffer()


class UpstreamSilent(Exception):
    """The real server closed, or did not answer in time, where the front waited for it."""


class UpstreamReplies:
    """Exact reads of the real server's replies, each within ``patience`` seconds."""

    def __init__(self, stream: trio.SocketStream, patience: float) -> None:
        self._stream = stream
        self._patience = patience
        self._buffer = bytearray()

    async def exactly(self, size: int) -> bytes:
        """`size` bytes; `UpstreamSilent` if the server closes or stalls before them."""
        with trio.move_on_after(self._patience):
            while len(self._buffer) < size:
                try:
                    data = await self._stream.receive_some(BUFFER)
                except _BROKEN:
                    data = b""
                if not data:
                    raise UpstreamSilent("the adb server closed the connection")
                self._buffer += data
            out = bytes(self._buffer[:size])
            del self._buffer[:size]
            return out
        raise UpstreamSilent(f"no answer from the adb server within {self._patience:g} s")

    async def status(self) -> bytes:
        """``OKAY`` or ``FAIL`` (`AdbMalformed` for anything else)."""
        status = await self.exactly(4)
        if status not in (OKAY, FAIL):
            raise AdbMalformed(f"expected OKAY or FAIL, got {status!r}")
        return status

    async def record(self) -> bytes:
        """One protocol string's payload."""
        return await self.exactly(parse_length(await self.exactly(4)))

    async def fail_reply(self) -> bytes:
        """After a FAIL: the whole reply (``FAIL`` + its message) as the client gets it."""
        return FAIL + frame(await self.record())

    def take_buffer(self) -> bytes:
        """Bytes read past the replies (the start of a stream): the relay sends them on."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


async def pipe(
    client: trio.SocketStream,
    upstream: trio.SocketStream,
    *,
    to_client: bytes = b"",
    grace: float,
) -> int:
    """Relay both ways until the server's side ends; returns the bytes sent to the client.

    `to_client` (bytes already read from the server) goes first. When the client stops
    sending (EOF), the server is told (half-close; adb's server then closes), and what it
    still sends is relayed for at most `grace` seconds. When the server's side ends, or either
    side breaks, the pipe ends: the caller closes both.
    """
    sent = 0

    async def downstream(scope: trio.CancelScope) -> None:
        nonlocal sent
        try:
            if to_client:
                await client.send_all(to_client)
                sent += len(to_client)
            while data := await upstream.receive_some(BUFFER):
                await client.send_all(data)
                sent += len(data)
        except _BROKEN:
            pass
        scope.cancel()

    async def upstream_side(scope: trio.CancelScope) -> None:
        try:
            while data := await client.receive_some(BUFFER):
                await upstream.send_all(data)
        except _BROKEN:
            scope.cancel()
            return
        with contextlib.suppress(*_BROKEN):
            await upstream.send_eof()
        await trio.sleep(grace)
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(downstream, nursery.cancel_scope)
        nursery.start_soon(upstream_side, nursery.cancel_scope)
    return sent


async def close_gently(stream: trio.SocketStream) -> None:
    """Close after what was sent has left: shut the sending side, drain the client's unread
    input for a moment (so the close is no reset that could destroy the last reply), close."""
    with trio.CancelScope(shield=True):
        with contextlib.suppress(*_BROKEN):
            await stream.send_eof()
        with trio.move_on_after(DRAIN), contextlib.suppress(*_BROKEN):
            while await stream.receive_some(BUFFER):
                pass
        with contextlib.suppress(*_BROKEN):
            await stream.aclose()


async def close_now(stream: trio.abc.AsyncResource) -> None:
    """Close without waiting (nothing left to deliver)."""
    with trio.CancelScope(shield=True), contextlib.suppress(*_BROKEN):
        await stream.aclose()
