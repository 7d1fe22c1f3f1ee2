"""The real adb server behind the front: connect (starting it when it is down), one-shot
queries on connections of their own, and stopping the one the front started.

Layer: trio, structlog, config, logs, `discovery.adbserver` (``adb -P PORT start-server``: a
server only on the configured port, only for a loopback host, only with a program it finds)
and `protocol.adbwire`.

When nothing answers at ``[adb] host:port`` (connection refused), the front starts the server
and tries again, one start at a time for all clients; a start that failed is not tried again
for `RETRY_START` seconds, so a missing adb program does not cost every connection a process.
If the server still cannot be reached the client is closed without a word (the adb CLI then
says "protocol fault", which is honest). One line is logged per outage, not per client.
"""

from __future__ import annotations

import contextlib
import errno
from typing import Final

import structlog
import trio

from ddmd.config import AdbConfig, TimeoutsConfig
from ddmd.discovery.adbserver import AdbServer
from ddmd.front.relay import UpstreamReplies, UpstreamSilent, close_now
from ddmd.logs import Event
from ddmd.netaddr import host_port
from ddmd.protocol.adbrequests import request
from ddmd.protocol.adbwire import OKAY

__all__ = ["RETRY_START", "Answer", "Upstream", "UpstreamUnavailable"]

log = structlog.get_logger("ddmd.front")

#: Seconds after a failed start before the front tries to start the server again.
RETRY_START: Final = 10.0


class UpstreamUnavailable(Exception):
    """The real adb server cannot be reached (and could not be started)."""


#: A one-shot query's answer: (True, payload) for OKAY + record, (False, message) for FAIL.
Answer = tuple[bool, bytes]


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps (trio's connect raises one OSError over an ExceptionGroup of
    the attempts' errors)."""
    found: list[BaseException] = []
    todo = [exc]
    while todo and len(found) < 32:
        current = todo.pop()
        found.append(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        if current.__cause__ is not None:
            todo.append(current.__cause__)
    return found


def _refused(exc: OSError) -> bool:
    """Nothing listens there (every attempt was refused)."""
    return any(isinstance(e, ConnectionRefusedError) for e in _causes(exc))


def _reason(exc: OSError) -> str:
    """The most specific message: "Connection refused" rather than "all attempts failed"."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.strerror:
            return str(cause.strerror)
    return str(exc)


class Upstream:
    """The real server at ``[adb] host:port``."""

    def __init__(self, adb: AdbConfig, timeouts: TimeoutsConfig) -> None:
        self.adb = adb
        self.address = host_port(adb.host, adb.port)
        self.connect_timeout = timeouts.connect
        self.reply_timeout = timeouts.adb
        self._server = AdbServer(adb, timeouts.adb)
        self._lock = trio.Lock()
        self._failed_start_at: float | None = None
        self._down_logged = False
        self.starts = 0  # servers the front started
        self.failures = 0  # clients closed because no server answered

    @property
    def started(self) -> bool:
        """The front started the server that runs now (or last ran)."""
        return self._server.started

    async def _open(self) -> trio.SocketStream:
        """One connection; OSError (refused, unreachable, timed out) when it fails."""
        with trio.move_on_after(self.connect_timeout):
            return await trio.open_tcp_stream(self.adb.host, self.adb.port)
        raise OSError(errno.ETIMEDOUT, f"no connection within {self.connect_timeout:g} s")

    async def connect(self, *, start: bool = True) -> trio.SocketStream:
        """A connection to the server, started first if it was down (unless `start` is
        false: the front's own bookkeeping never starts a server, nor logs its absence);
        `UpstreamUnavailable`."""
        try:
            stream = await self._open()
        except OSError as exc:
            first = exc
        else:
            self._server_up()
            return stream
        problem = _reason(first)
        if not start:
            raise UpstreamUnavailable(problem)
        if _refused(first):
            problem = await self._start()
            try:
                stream = await self._open()
            except OSError as exc:
                problem = f"{problem}; then: {_reason(exc)}" if problem else _reason(exc)
            else:
                self._server_up()
                return stream
        self.failures += 1
        if not self._down_logged:
            self._down_logged = True
            log.warning(
                Event.FRONT_UPSTREAM_UNAVAILABLE,
                server=self.address,
                reason=problem,
                effect="adb clients of the front are disconnected until the server answers",
            )
        raise UpstreamUnavailable(problem)

    def _server_up(self) -> None:
        self._down_logged = False

    async def _start(self) -> str:
        """Start the server unless another client just did, or a start failed lately; the
        problem ("" when it may answer now)."""
        async with self._lock:
            with contextlib.suppress(OSError):
                stream = await self._open()  # another client's start worked meanwhile
                await close_now(stream)
                return ""
            now = trio.current_time()
            if self._failed_start_at is not None and now - self._failed_start_at < RETRY_START:
                return "the adb server is down, and starting it failed a moment ago"
            started, why = await self._server.start()
            if started:
                self.starts += 1
                self._failed_start_at = None
                return ""
            self._failed_start_at = trio.current_time()
            return f"the adb server is down and was not started: {why}"

    async def ensure_running(self) -> bool:
        """Start the server now unless it runs (transparent mode starts it with ddmd)."""
        try:
            stream = await self.connect()
        except UpstreamUnavailable:
            return False
        await close_now(stream)
        return True

    async def query(self, service: str) -> Answer:
        """A one-shot host request on a connection of its own: (True, payload) for OKAY and
        its record, (False, message) for FAIL. `UpstreamUnavailable`, `UpstreamSilent`,
        `AdbMalformed`."""
        stream = await self.connect()
        try:
            with trio.move_on_after(self.reply_timeout):
                await stream.send_all(request(service))
            replies = UpstreamReplies(stream, self.reply_timeout)
            status = await replies.status()
            return status == OKAY, await replies.record()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise UpstreamSilent(f"the adb server connection broke: {exc}") from exc
        finally:
            await close_now(stream)

    async def stop_started(self) -> bool:
        """``adb -P PORT kill-server`` for a server the front started: ``host:kill``, what that
        command sends. True when the request went out."""
        if not self._server.started:
            return False
        self._server.started = False
        with trio.move_on_after(self.connect_timeout + self.reply_timeout):
            try:
                stream = await self._open()
            except OSError:
                return False
            status = b""
            try:
                await stream.send_all(request("host:kill"))
                status = await UpstreamReplies(stream, self.reply_timeout).exactly(4)
            except (UpstreamSilent, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                await close_now(stream)
            log.info(Event.FRONT_SERVER_STOPPED, server=self.address, answered=status == OKAY)
            return True
        return False
