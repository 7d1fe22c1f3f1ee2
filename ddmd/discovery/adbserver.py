"""One adb server as ddmd talks to it: blocking exchanges through adbutils in worker threads,
long-lived streams handed to trio, and the records on those streams.

Layer: imports `protocol.adbwire` (the host protocol's parsing), config, logs and netaddr; the
only module that imports adbutils; used by `discovery.adb`.

Every adbutils call runs in a worker thread (``trio.to_thread.run_sync``) under
``[timeouts] adb``. A call that is cancelled or times out shuts its socket down, so the
thread's blocked ``recv`` returns at once (``close()`` alone does not wake it); the socket also
carries the same timeout, so no thread outlives its deadline for long. Long-lived streams
(``host:track-devices-l``, ``track-jdwp``, ``jdwp:PID``) are set up in a thread and then handed
to trio: ``trio.SocketStream(trio.socket.from_stdlib_socket(sock))``.

adbutils falls back to running ``adb start-server`` whenever a connect fails, on
``$ANDROID_ADB_SERVER_PORT`` rather than the port asked for (peers.md). ddmd switches that off
(`_NoAutoStart`); `AdbServer.start` starts a server only on the configured port, only for a
loopback host, only with a program it can find, and logs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import adbutils
import structlog
import trio

from ddmd.config import AdbConfig, is_loopback_host
from ddmd.logs import Event
from ddmd.netaddr import host_port
from ddmd.protocol.adbwire import (
    AdbMalformed,
    RecordDecoder,
    parse_length,
    parse_status,
    parse_version,
)

__all__ = [
    "ADB_ERRORS",
    "AdbMalformed",
    "AdbProblem",
    "AdbRefused",
    "AdbServer",
    "AdbUnreachable",
    "Records",
]

log = structlog.get_logger("ddmd.adb")

T = TypeVar("T")


class AdbProblem(Exception):
    """An exchange with the adb server did not work; the message says why."""


class AdbUnreachable(AdbProblem):
    """No adb server answers (connect failed, connection closed, or no answer in time)."""


class AdbRefused(AdbProblem):
    """The server answered FAIL (unknown device, transport refused, no such pid, ...)."""


#: Whatever an exchange can raise: the problems above, and `AdbMalformed` (from
#: `protocol.adbwire`) when the server sent something that is not the adb host protocol.
ADB_ERRORS = (AdbProblem, AdbMalformed)


# ------------------------------------------------------------------------------ blocking side


class _NoAutoStart(adbutils.AdbConnection):  # type: ignore[misc]
    """adbutils' connection without its fallback of running ``adb start-server`` (on
    $ANDROID_ADB_SERVER_PORT, silently) when the connect fails."""

    def _safe_connect(self) -> socket.socket:
        sock: socket.socket = self._create_socket()
        return sock


class _Call:
    """One blocking exchange with the adb server, run in a worker thread.

    The thread registers its socket; ``abort()`` (trio side, on cancel or timeout) shuts it
    down so a blocked ``recv`` returns, and whichever side comes last closes it. A socket the
    thread returns belongs to the caller, unless the call was aborted.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False
        self._done = False

    def connect(self) -> adbutils.AdbConnection:
        """(thread) Connect to the server; never starts one."""
        try:
            conn = _NoAutoStart(self.host, self.port)
        except adbutils.AdbError as exc:  # AdbConnectionError, AdbTimeout
            raise AdbUnreachable(
                f"no adb server answers at {self.host}:{self.port}: {exc}"
            ) from exc
        sock: socket.socket = conn.conn
        sock.settimeout(self.timeout)
        with self._lock:
            self._sock = sock
            if self._aborted:
                sock.close()
                raise AdbUnreachable("cancelled")
        return conn

    def finish(self, *, handed_over: bool) -> None:
        """(thread) The work is over: close the socket unless the caller takes it."""
        with self._lock:
            self._done = True
            if self._sock is not None and (self._aborted or not handed_over):
                self._sock.close()

    def abort(self) -> None:
        """(trio) The caller gave up: unblock the thread; close the socket if it is done."""
        with self._lock:
            self._aborted = True
            sock = self._sock
            if sock is None:
                return
            if self._done:
                sock.close()
                return
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _in_thread(call: _Call, work: Callable[[_Call], T]) -> T:
    handed_over = False
    try:
        result = work(call)
        handed_over = isinstance(result, socket.socket)
        return result
    except adbutils.AdbTimeout as exc:
        raise AdbUnreachable(f"no answer from the adb server within {call.timeout:g} s") from exc
    except adbutils.AdbError as exc:
        raise AdbUnreachable(f"the adb connection failed: {exc}") from exc
    except OSError as exc:  # socket.timeout included
        raise AdbUnreachable(f"the adb connection failed: {exc or type(exc).__name__}") from exc
    finally:
        call.finish(handed_over=handed_over)


def _read_exact(conn: adbutils.AdbConnection, n: int, what: str) -> bytes:
    data: bytes = conn.read(n)
    if len(data) < n:
        raise AdbUnreachable(f"the adb server closed the connection during {what}")
    return data


def _read_block(conn: adbutils.AdbConnection, what: str) -> bytes:
    """(thread) One record: its length, then its payload."""
    size = parse_length(_read_exact(conn, 4, what))
    return _read_exact(conn, size, what) if size else b""


def _request(conn: adbutils.AdbConnection, request: str) -> None:
    """(thread) Send one request; OKAY returns, FAIL raises AdbRefused with the message."""
    conn.send_command(request)
    status: bytes = conn.read(4)
    if not status:
        raise AdbUnreachable(f"the adb server closed the connection after {request!r}")
    if parse_status(request, status):
        return
    message = _read_block(conn, f"the FAIL message of {request!r}")
    text = message.decode("utf-8", "replace") or "no message"
    raise AdbRefused(f"{request}: {text}")


def _server_version(call: _Call) -> int:
    conn = call.connect()
    _request(conn, "host:version")
    return parse_version(_read_block(conn, "host:version"))


def _open_service(call: _Call, serial: str | None, service: str) -> socket.socket:
    """(thread) ``host:transport:SERIAL`` (if a serial is given), then ``service``: the socket
    is then the service's stream."""
    conn = call.connect()
    if serial is not None:
        _request(conn, f"host:transport:{serial}")
    _request(conn, service)
    sock: socket.socket = conn.conn
    return sock


class _Client(adbutils.AdbClient):  # type: ignore[misc]
    """adbutils' client for its device services (sync, shell), on ``_NoAutoStart``
    connections that carry ddmd's timeout."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, socket_timeout=timeout)
        self._timeout = timeout

    def make_connection(self, timeout: float | None = None) -> adbutils.AdbConnection:
        try:
            conn = _NoAutoStart(self.host, self.port)
        except adbutils.AdbError as exc:
            raise AdbUnreachable(
                f"no adb server answers at {self.host}:{self.port}: {exc}"
            ) from exc
        conn.conn.settimeout(timeout or self._timeout)
        return conn


def _pull_and_remove(
    host: str, port: int, timeout: float, serial: str, remote: str, local: Path
) -> int:
    """(thread) adbutils' sync pull of ``remote`` into ``local`` (owner-only), then ``rm -f``
    it on the device. Each socket wait is bounded by ``timeout``; returns the bytes written."""
    device = _Client(host, port, timeout).device(serial)
    size = 0
    fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            for piece in device.sync.iter_content(remote):
                out.write(piece)
                size += len(piece)
    except adbutils.AdbError as exc:
        raise AdbRefused(f"could not fetch {remote} from {serial}: {exc}") from exc
    with contextlib.suppress(adbutils.AdbError, OSError):
        device.shell(["rm", "-f", remote], timeout=timeout)
    return size


# ------------------------------------------------------------------------------ trio side


def _wrap(sock: socket.socket) -> trio.SocketStream:
    try:
        return trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    except BaseException:
        sock.close()
        raise


class Records:
    """Length-prefixed records from a trio stream (``host:track-devices``, ``track-jdwp``)."""

    def __init__(self, stream: trio.abc.ReceiveStream, patience: float) -> None:
        self._stream = stream
        self._patience = patience
        self._decoder = RecordDecoder()

    async def _fill(self) -> bool:
        try:
            data = await self._stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        self._decoder.receive_data(data)
        return bool(data)

    async def next(self) -> bytes | None:
        """The next record; None at EOF between records. AdbMalformed on a bad length,
        AdbUnreachable when the stream ends or stalls (``[timeouts] adb``) inside a record."""
        decoder = self._decoder
        if not decoder.buffered and not await self._fill():
            return None
        with trio.move_on_after(self._patience) as scope:
            while (record := decoder.next_record()) is None:
                if not await self._fill():
                    raise AdbUnreachable("the adb server closed the stream inside a record")
        if scope.cancelled_caught or record is None:
            raise AdbUnreachable(f"a record stayed incomplete for {self._patience:g} s")
        return record


class AdbServer:
    """The adb server at ``[adb] host:port``; every exchange is bounded by ``timeout``
    (``[timeouts] adb``)."""

    def __init__(self, adb: AdbConfig, timeout: float) -> None:
        self._adb = adb
        self.timeout = timeout
        self.address = host_port(adb.host, adb.port)
        self.started = False  # ddmd ran `adb start-server` itself

    async def call(self, work: Callable[[_Call], T]) -> T:
        """Run one blocking exchange in a thread, bounded by ``[timeouts] adb``."""
        call = _Call(self._adb.host, self._adb.port, self.timeout)
        try:
            with trio.fail_after(self.timeout):
                return await trio.to_thread.run_sync(_in_thread, call, work, abandon_on_cancel=True)
        except trio.TooSlowError:
            call.abort()
            raise AdbUnreachable(
                f"no answer from the adb server at {self.address} within {self.timeout:g} s "
                "([timeouts] adb)"
            ) from None
        except BaseException:
            call.abort()
            raise

    async def version(self) -> int:
        """``host:version``: the server's version."""
        return await self.call(_server_version)

    async def open(self, serial: str | None, service: str) -> trio.SocketStream:
        """A long-lived service stream: ``host:transport:SERIAL`` (when a serial is given),
        then ``service``."""
        sock = await self.call(partial(_open_service, serial=serial, service=service))
        return _wrap(sock)

    async def pull_and_remove(self, serial: str, remote: str, local: Path) -> int:
        """Fetch a file the VM wrote on the device (a trace, a heap dump) with adbutils' sync
        pull, then remove it there. Every socket wait is bounded by ``[timeouts] adb``; the
        whole transfer takes as long as the file needs."""
        work = partial(
            _pull_and_remove, self._adb.host, self._adb.port, self.timeout, serial, remote, local
        )
        try:
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except (TimeoutError, OSError) as exc:
            raise AdbUnreachable(f"fetching {remote} from {serial} failed: {exc}") from exc

    def records(self, stream: trio.abc.ReceiveStream) -> Records:
        """The records of a list stream; one that stalls inside a record gives up after
        ``timeout``."""
        return Records(stream, self.timeout)

    def _find_program(self) -> str | None:
        path = self._adb.path
        if os.sep in path:
            return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
        return shutil.which(path)

    async def start(self) -> tuple[bool, str]:
        """``adb -P PORT start-server``, where that is ours to do; returns (started, why not)."""
        if not is_loopback_host(self._adb.host):
            return False, f"not starting an adb server for the remote host {self._adb.host}"
        program = await trio.to_thread.run_sync(self._find_program)
        if program is None:
            return False, f"no adb program {self._adb.path!r} was found ([adb] path)"
        port = str(self._adb.port)
        log.info(Event.ADB_SERVER_STARTING, program=program, port=self._adb.port)
        try:
            with trio.fail_after(max(self.timeout, 1.0)):
                result = await trio.run_process(
                    [program, "-P", port, "start-server"],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env={**os.environ, "ANDROID_ADB_SERVER_PORT": port},
                )
        except trio.TooSlowError:
            return False, f"'{program} -P {port} start-server' did not finish within the timeout"
        except OSError as exc:
            return False, f"running {program} failed: {exc}"
        if result.returncode != 0:
            output = (result.stderr or result.stdout or b"").decode("utf-8", "replace").strip()
            last = output.splitlines()[-1] if output else "no output"
            return False, f"'{program} -P {port} start-server' failed ({result.returncode}): {last}"
        self.started = True
        return True, "started"
