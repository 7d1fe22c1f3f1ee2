"""Android devices and emulators: debuggable VMs found through an adb server.

Layer: imports protocol/, config, logs and discovery; the only module that imports adbutils.
Every adbutils call runs in a worker thread (``trio.to_thread.run_sync``) under
``[timeouts] adb``. A call that is cancelled or times out shuts its socket down, so the
thread's blocked ``recv`` returns at once (``close()`` alone does not wake it); the socket also
carries the same timeout, so no thread outlives its deadline for long. Long-lived streams
(``host:track-devices-l``, ``track-jdwp``, ``jdwp:PID``) are set up in a thread and then handed
to trio: ``trio.SocketStream(trio.socket.from_stdlib_socket(sock))``.

    AdbDiscovery.run
    ├── make sure an adb server answers (``adb -P PORT start-server`` when allowed), then
    │   follow ``host:track-devices-l``. When the server goes away: adb.lost, every device VM
    │   is lost, back-off, again. Workstation VMs are never touched.
    └── per online device: ``host:transport:SERIAL`` + ``track-jdwp`` (pids of debuggable VMs)
        └── per pid: ``host:transport:SERIAL`` + ``jdwp:PID``, JDWP handshake -> VmFound
            (vm id ``SERIAL/PID``). The pid leaving track-jdwp, or its device going offline
            or away, -> VmLost: the supervisor ends that VM and its debugger is disconnected.

adbutils falls back to running ``adb start-server`` whenever a connect fails, on
``$ANDROID_ADB_SERVER_PORT`` rather than the port asked for (peers.md). ddmd switches that off:
it starts a server only on its configured port, only for a loopback host, only with a program
it can find, at most once per outage, and logs it.

Malformed input from the server (a length that is not 4 hex digits, a pid that is not a number,
a device line without a state) is logged as ``adb.protocol_error`` and never ends the daemon: a
bad pid is skipped, a broken stream is reopened after a back-off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

import adbutils
import structlog
import trio

from ddmd.config import Config, is_loopback_host
from ddmd.discovery import VmFound, VmLost
from ddmd.discovery.scan import NotJdwp
from ddmd.logs import Event
from ddmd.protocol.jdwp import HANDSHAKE

log = structlog.get_logger("ddmd.adb")

T = TypeVar("T")

ONLINE = "device"  # adb's state of a usable device or emulator
RETRY_FIRST = 0.25  # seconds: first pause before trying again (server, track-jdwp, jdwp:PID)
RETRY_MAX = 5.0  # cap of the back-off for the server and track-jdwp
VM_RETRY_MAX = 30.0  # cap of the back-off for reopening one pid
REOPEN_ATTEMPTS = 5  # the opener's own short retry (a VM refuses while the old connection closes)
REOPEN_FIRST_DELAY = 0.05
SHORT_SESSION = 2.0  # seconds: a VM connection that ended sooner counts as a failure
LOUD_EVERY = 12  # "on" mode: repeat adb.unavailable every this many failed attempts
_MAX_PID_DIGITS = 10
_DETAIL_KEYS = frozenset({"usb", "product", "model", "device", "transport_id", "features"})
_STATE_HINTS = {
    "unauthorized": "accept the 'Allow USB debugging?' prompt on the device",
    "no permissions": "fix the udev rules for the device (see the adb documentation)",
    "offline": "adb lost contact with the device; reconnect it or restart adbd",
}
FIX = (
    "start an adb server on {server} ('adb -P {port} start-server'), or install adb "
    "(Debian/Ubuntu: 'apt install adb'; or Android SDK platform-tools) and check [adb] path; "
    'set [adb] enabled = "off" to run without Android devices'
)


# ------------------------------------------------------------------------------ errors


class AdbProblem(Exception):
    """An exchange with the adb server did not work; the message says why."""


class AdbUnreachable(AdbProblem):
    """No adb server answers (connect failed, connection closed, or no answer in time)."""


class AdbRefused(AdbProblem):
    """The server answered FAIL (unknown device, transport refused, no such pid, ...)."""


class AdbMalformed(AdbProblem):
    """The server sent something that is not the adb host protocol."""


# ------------------------------------------------------------------------------ parsing (pure)


@dataclass(frozen=True, slots=True)
class DeviceLine:
    """One line of ``host:devices-l`` / ``host:track-devices(-l)``."""

    serial: str
    state: str
    model: str | None = None
    product: str | None = None


def parse_length(head: bytes) -> int:
    """The 4 hex digits that start every adb record; AdbMalformed otherwise."""
    if len(head) != 4 or not all(chr(b) in string.hexdigits for b in head):
        raise AdbMalformed(f"record length {head!r} is not 4 hex digits")
    return int(head, 16)


def parse_devices(payload: bytes) -> tuple[tuple[DeviceLine, ...], tuple[str, ...]]:
    """A device list record: the devices, and a problem text per line that made no sense.

    Short lines are ``SERIAL<TAB>STATE``; long (-l) lines are ``SERIAL  STATE key:value ...``
    where the state may have spaces ("no permissions (...)").
    """
    devices: dict[str, DeviceLine] = {}
    problems: list[str] = []
    for raw in payload.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line:
            continue
        sep = "\t" if "\t" in line else " "
        serial, _, rest = line.partition(sep)
        details: dict[str, str] = {}
        state_words: list[str] = []
        for word in rest.split():
            key, colon, value = word.partition(":")
            if colon and key in _DETAIL_KEYS:
                details[key] = value
            else:
                state_words.append(word)
        state = " ".join(state_words)
        if not serial.strip() or not state:
            problems.append(f"device line {raw!r} has no serial or no state")
            continue
        devices[serial.strip()] = DeviceLine(
            serial.strip(), state, details.get("model") or None, details.get("product") or None
        )
    return tuple(devices.values()), tuple(problems)


def parse_pids(payload: bytes) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """A track-jdwp record: the pids (decimal, one per line), and the entries that are not."""
    pids: list[int] = []
    problems: list[str] = []
    for raw in payload.decode("utf-8", "replace").split("\n"):
        word = raw.strip()
        if not word:
            continue
        if word.isascii() and word.isdigit() and len(word) <= _MAX_PID_DIGITS and int(word) > 0:
            if int(word) not in pids:
                pids.append(int(word))
        else:
            problems.append(word[:40])
    return tuple(pids), tuple(problems)


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
    size = parse_length(_read_exact(conn, 4, what))
    return _read_exact(conn, size, what) if size else b""


def _request(conn: adbutils.AdbConnection, request: str) -> None:
    """(thread) Send one request; OKAY returns, FAIL raises AdbRefused with the message."""
    conn.send_command(request)
    status: bytes = conn.read(4)
    if status == b"OKAY":
        return
    if status == b"FAIL":
        message = _read_block(conn, f"the FAIL message of {request!r}")
        text = message.decode("utf-8", "replace") or "no message"
        raise AdbRefused(f"{request}: {text}")
    if not status:
        raise AdbUnreachable(f"the adb server closed the connection after {request!r}")
    raise AdbMalformed(f"{request}: expected OKAY or FAIL, got {status!r}")


def _server_version(call: _Call) -> int:
    conn = call.connect()
    _request(conn, "host:version")
    block = _read_block(conn, "host:version")
    try:
        return int(block.decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        raise AdbMalformed(f"host:version: {block[:16]!r} is not a hex number") from None


def _open_service(call: _Call, serial: str | None, service: str) -> socket.socket:
    """(thread) ``host:transport:SERIAL`` (if a serial is given), then ``service``: the socket
    is then the service's stream."""
    conn = call.connect()
    if serial is not None:
        _request(conn, f"host:transport:{serial}")
    _request(conn, service)
    sock: socket.socket = conn.conn
    return sock


# ------------------------------------------------------------------------------ trio side


def _wrap(sock: socket.socket) -> trio.SocketStream:
    try:
        return trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    except BaseException:
        sock.close()
        raise


async def _close_quietly(stream: trio.abc.AsyncResource) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except Exception:
            log.debug(Event.STREAM_CLOSE_FAILED)


class _Records:
    """Length-prefixed records (4 hex digits, then that many bytes) from a trio stream."""

    def __init__(self, stream: trio.abc.ReceiveStream, patience: float) -> None:
        self._stream = stream
        self._patience = patience
        self._buffer = bytearray()

    async def _fill(self) -> bool:
        try:
            data = await self._stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        self._buffer += data
        return bool(data)

    async def next(self) -> bytes | None:
        """The next record; None at EOF between records. AdbMalformed on a bad length,
        AdbUnreachable when the stream ends or stalls (``[timeouts] adb``) inside a record."""
        if not self._buffer and not await self._fill():
            return None
        with trio.move_on_after(self._patience) as scope:
            while len(self._buffer) < 4:
                if not await self._fill():
                    raise AdbUnreachable("the adb server closed the stream inside a record")
            size = parse_length(bytes(self._buffer[:4]))
            while len(self._buffer) < 4 + size:
                if not await self._fill():
                    raise AdbUnreachable("the adb server closed the stream inside a record")
        if scope.cancelled_caught:
            raise AdbUnreachable(f"a record stayed incomplete for {self._patience:g} s")
        record = bytes(self._buffer[4 : 4 + size])
        del self._buffer[: 4 + size]
        return record


async def _jdwp_handshake(stream: trio.abc.Stream) -> bytes:
    """Send the JDWP handshake, read the echo; returns any bytes after it."""
    await stream.send_all(HANDSHAKE)
    got = b""
    while len(got) < len(HANDSHAKE):
        data = await stream.receive_some(4096)
        if not data:
            raise NotJdwp(f"the stream closed after {len(got)} bytes of the JDWP handshake")
        got += data
        if not HANDSHAKE.startswith(got[: len(HANDSHAKE)]):
            raise NotJdwp(f"answered {got[:32]!r} instead of the JDWP handshake")
    return got[len(HANDSHAKE) :]


class DeviceTable(Protocol):
    """Where the device list goes (the daemon passes its VmRegistry)."""

    def set_device(
        self, serial: str, state: str, model: str | None = None, product: str | None = None
    ) -> None: ...

    def remove_device(self, serial: str) -> None: ...


@dataclass(slots=True)
class _Device:
    serial: str
    state: str
    model: str | None = None
    product: str | None = None
    scope: trio.CancelScope | None = None  # its track-jdwp task while online
    pids: dict[int, trio.CancelScope] = field(default_factory=dict)


@dataclass(slots=True)
class _Live:
    """A VM handed to the supervisor; ``ended`` is set when the supervisor says it ended."""

    ended: trio.Event = field(default_factory=trio.Event)
    protocol_error: bool = False


_OPEN_ERRORS = (AdbProblem, NotJdwp, trio.TooSlowError, trio.BrokenResourceError, OSError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no JDWP handshake within [timeouts] handshake"
    return str(exc) or type(exc).__name__


class AdbDiscovery:
    """The adb discoverer: ``run(send)`` sends VmFound/VmLost for device VMs.

    ``vm_ended(key, protocol_error=, reason=)`` is told by the supervisor when a VM it handed
    over ended; its pid is then opened again (after a back-off) while it stays listed.
    """

    def __init__(self, config: Config, devices: DeviceTable | None = None) -> None:
        self._config = config
        self._adb = config.adb
        self._timeout = config.timeouts.adb
        self._table = devices
        self._devices: dict[str, _Device] = {}
        self._live: dict[tuple[str, int], _Live] = {}
        self._outage_logged = False
        self._start_tried = False
        self.server_version: int | None = None
        self.started_server = False  # ddmd ran `adb start-server` itself

    @property
    def server(self) -> str:
        host = f"[{self._adb.host}]" if ":" in self._adb.host else self._adb.host
        return f"{host}:{self._adb.port}"

    # ------------------------------------------------------------------ the server

    async def run(self, send: trio.MemorySendChannel[VmFound | VmLost]) -> None:
        async with send:
            if self._adb.enabled == "off":
                return
            failures = 0
            while True:
                try:
                    connected = await self._reach_server(failures + 1) is not None
                    if connected:
                        reason = await self._session(send)
                        log.warning(Event.ADB_LOST, server=self.server, reason=reason)
                except Exception as exc:  # the edge: a bug in here must not end the daemon
                    connected = True
                    reason = f"internal error: {type(exc).__name__}: {exc}"
                    log.error(Event.ADB_LOST, server=self.server, reason=reason, exc_info=exc)
                if not connected:
                    failures += 1
                    await trio.sleep(_backoff(failures, RETRY_MAX))
                    continue
                await self._forget_all(send, f"the adb server went away: {reason}")
                self._outage_logged = False
                self._start_tried = False
                self.server_version = None
                failures = 1
                await trio.sleep(RETRY_FIRST)

    async def _call(self, work: Callable[[_Call], T]) -> T:
        """Run one blocking exchange in a thread, bounded by ``[timeouts] adb``."""
        call = _Call(self._adb.host, self._adb.port, self._timeout)
        try:
            with trio.fail_after(self._timeout):
                return await trio.to_thread.run_sync(_in_thread, call, work, abandon_on_cancel=True)
        except trio.TooSlowError:
            call.abort()
            raise AdbUnreachable(
                f"no answer from the adb server at {self.server} within {self._timeout:g} s "
                "([timeouts] adb)"
            ) from None
        except BaseException:
            call.abort()
            raise

    async def _reach_server(self, attempt: int) -> int | None:
        """The server's version once it answers (started if allowed); None if it does not."""
        try:
            return self._connected(await self._call(_server_version))
        except AdbProblem as exc:
            problem = str(exc)
        if not self._start_tried:
            self._start_tried = True
            started, why = await self._start_server()
            if started:
                try:
                    return self._connected(await self._call(_server_version))
                except AdbProblem as exc:
                    problem = f"started an adb server, but it does not answer: {exc}"
            else:
                problem = f"{problem}; {why}"
        loud = self._adb.enabled == "on"
        if not self._outage_logged or (loud and attempt % LOUD_EVERY == 0):
            self._outage_logged = True
            report = log.error if loud else log.warning
            report(
                Event.ADB_UNAVAILABLE,
                server=self.server,
                mode=self._adb.enabled,
                attempts=attempt,
                reason=problem,
                fix=FIX.format(server=self.server, port=self._adb.port),
            )
        else:
            log.debug(Event.ADB_UNAVAILABLE, server=self.server, reason=problem)
        return None

    def _connected(self, version: int) -> int:
        self._outage_logged = False
        self._start_tried = False
        self.server_version = version
        log.info(
            Event.ADB_CONNECTED,
            server=self.server,
            version=version,
            started_by_ddmd=self.started_server,
        )
        return version

    def _find_program(self) -> str | None:
        path = self._adb.path
        if os.sep in path:
            return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
        return shutil.which(path)

    async def _start_server(self) -> tuple[bool, str]:
        """``adb -P PORT start-server``, where that is ours to do; returns (started, why not)."""
        if not is_loopback_host(self._adb.host):
            return False, f"not starting an adb server for the remote host {self._adb.host}"
        program = await trio.to_thread.run_sync(self._find_program)
        if program is None:
            return False, f"no adb program {self._adb.path!r} was found ([adb] path)"
        port = str(self._adb.port)
        log.info(Event.ADB_SERVER_STARTING, program=program, port=self._adb.port)
        try:
            with trio.fail_after(max(self._timeout, 1.0)):
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
        self.started_server = True
        return True, "started"

    # ------------------------------------------------------------------ devices

    async def _session(self, send: trio.MemorySendChannel[VmFound | VmLost]) -> str:
        """Follow the device list while the server answers; returns why it stopped."""
        malformed = 0
        async with trio.open_nursery() as nursery:
            try:
                while True:
                    try:
                        await self._follow_devices(nursery, send)
                        return "the adb server closed the device list"
                    except AdbMalformed as exc:
                        malformed += 1
                        log.warning(
                            Event.ADB_PROTOCOL_ERROR, stream="host:track-devices", error=str(exc)
                        )
                    except AdbProblem as exc:
                        return str(exc)
                    await trio.sleep(_backoff(malformed, RETRY_MAX))
            finally:
                nursery.cancel_scope.cancel()

    async def _follow_devices(
        self, nursery: trio.Nursery, send: trio.MemorySendChannel[VmFound | VmLost]
    ) -> None:
        try:
            sock = await self._call(
                partial(_open_service, serial=None, service="host:track-devices-l")
            )
        except AdbRefused:  # an old server without the long form
            sock = await self._call(
                partial(_open_service, serial=None, service="host:track-devices")
            )
        stream = _wrap(sock)
        try:
            records = _Records(stream, self._timeout)
            while (record := await records.next()) is not None:
                devices, problems = parse_devices(record)
                for problem in problems:
                    log.warning(
                        Event.ADB_PROTOCOL_ERROR, stream="host:track-devices", error=problem
                    )
                await self._apply_devices(devices, nursery, send)
        finally:
            await _close_quietly(stream)

    async def _apply_devices(
        self,
        listed: tuple[DeviceLine, ...],
        nursery: trio.Nursery,
        send: trio.MemorySendChannel[VmFound | VmLost],
    ) -> None:
        for line in listed:
            device = self._devices.get(line.serial)
            was_online = device is not None and device.state == ONLINE
            if device is None:
                device = _Device(line.serial, line.state)
                self._devices[line.serial] = device
                changed = True
            else:
                changed = (device.state, device.model, device.product) != (
                    line.state,
                    line.model,
                    line.product,
                )
            device.state = line.state
            device.model = line.model or device.model
            device.product = line.product or device.product
            if changed and self._table is not None:
                self._table.set_device(line.serial, line.state, device.model, device.product)
            if line.state == ONLINE and not was_online:
                log.info(
                    Event.DEVICE_ONLINE,
                    device=line.serial,
                    model=device.model,
                    product=device.product,
                )
                device.scope = trio.CancelScope()
                nursery.start_soon(self._follow_device, device, device.scope, send)
            elif line.state != ONLINE and (was_online or changed):
                await self._device_down(device, f"state {line.state!r}", send)
        gone = {d.serial for d in listed}
        for serial in [s for s in self._devices if s not in gone]:
            device = self._devices.pop(serial)
            await self._device_down(device, "unplugged (no longer listed by adb)", send)
            if self._table is not None:
                self._table.remove_device(serial)

    async def _device_down(
        self, device: _Device, reason: str, send: trio.MemorySendChannel[VmFound | VmLost]
    ) -> None:
        """The device is not usable (any more): stop tracking it, its VMs are lost."""
        if device.scope is not None:
            device.scope.cancel()
            device.scope = None
        device.pids.clear()
        extra: dict[str, str] = {}
        for state, hint in _STATE_HINTS.items():
            if device.state.startswith(state):
                extra["hint"] = hint
        log.info(Event.DEVICE_OFFLINE, device=device.serial, reason=reason, **extra)
        for key in [k for k in self._live if k[0] == device.serial]:
            await self._lose(key, f"device {device.serial} went away: {reason}", send)

    async def _forget_all(
        self, send: trio.MemorySendChannel[VmFound | VmLost], reason: str
    ) -> None:
        for serial, device in list(self._devices.items()):
            device.scope = None
            device.pids.clear()
            log.info(Event.DEVICE_OFFLINE, device=serial, reason=reason)
            if self._table is not None:
                self._table.remove_device(serial)
        self._devices.clear()
        for key in list(self._live):
            await self._lose(key, reason, send)

    async def _lose(
        self, key: tuple[str, int], reason: str, send: trio.MemorySendChannel[VmFound | VmLost]
    ) -> None:
        if self._live.pop(key, None) is None:
            return
        vm_id = _vm_id(key)
        log.info(Event.DEVICE_VM_GONE, vm=vm_id, device=key[0], pid=key[1], reason=reason)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await send.send(VmLost(vm_id, reason))

    # ------------------------------------------------------------------ one device

    async def _follow_device(
        self,
        device: _Device,
        scope: trio.CancelScope,
        send: trio.MemorySendChannel[VmFound | VmLost],
    ) -> None:
        """track-jdwp on one online device, reopened after failures, until cancelled."""
        serial = device.serial
        with scope:
            async with trio.open_nursery() as pids:
                failures = 0
                while True:
                    try:
                        sock = await self._call(
                            partial(_open_service, serial=serial, service="track-jdwp")
                        )
                    except AdbProblem as exc:
                        failures += 1
                        report = log.warning if failures == 1 else log.debug
                        report(Event.DEVICE_TRACK_FAILED, device=serial, error=str(exc))
                        await trio.sleep(_backoff(failures, RETRY_MAX))
                        continue
                    stream = _wrap(sock)
                    try:
                        records = _Records(stream, self._timeout)
                        while (record := await records.next()) is not None:
                            failures = 0
                            await self._apply_pids(device, record, pids, send)
                        log.debug(Event.DEVICE_TRACK_FAILED, device=serial, error="closed")
                    except AdbMalformed as exc:
                        log.warning(
                            Event.ADB_PROTOCOL_ERROR,
                            device=serial,
                            stream="track-jdwp",
                            error=str(exc),
                        )
                    except AdbProblem as exc:
                        log.debug(Event.DEVICE_TRACK_FAILED, device=serial, error=str(exc))
                    finally:
                        await _close_quietly(stream)
                    failures += 1
                    await trio.sleep(_backoff(failures, RETRY_MAX))

    async def _apply_pids(
        self,
        device: _Device,
        record: bytes,
        nursery: trio.Nursery,
        send: trio.MemorySendChannel[VmFound | VmLost],
    ) -> None:
        pids, problems = parse_pids(record)
        for problem in problems:
            log.warning(
                Event.ADB_PROTOCOL_ERROR,
                device=device.serial,
                stream="track-jdwp",
                error=f"pid {problem!r} is not a number; skipped",
            )
        listed = set(pids)
        for pid in pids:
            if pid not in device.pids:
                scope = trio.CancelScope()
                device.pids[pid] = scope
                nursery.start_soon(self._follow_pid, device.serial, pid, scope, send)
        for pid in sorted(set(device.pids) - listed):
            device.pids.pop(pid).cancel()
            reason = f"pid {pid} is no longer debuggable on {device.serial} (left track-jdwp)"
            await self._lose((device.serial, pid), reason, send)

    # ------------------------------------------------------------------ one VM

    async def _open_vm(self, serial: str, pid: int) -> tuple[trio.abc.Stream, bytes]:
        """``jdwp:PID`` on the device and the JDWP handshake; the stream and what followed."""
        sock = await self._call(partial(_open_service, serial=serial, service=f"jdwp:{pid}"))
        stream = _wrap(sock)
        try:
            with trio.fail_after(self._config.timeouts.handshake):
                leftover = await _jdwp_handshake(stream)
        except BaseException:
            await _close_quietly(stream)
            raise
        return stream, leftover

    async def _reopen(self, serial: str, pid: int) -> tuple[trio.abc.Stream, bytes]:
        """The opener handed over with the VM: ``jdwp:PID`` again, retried briefly (the VM
        refuses a second connection while the old one is still closing)."""
        delay = REOPEN_FIRST_DELAY
        for attempt in range(1, REOPEN_ATTEMPTS + 1):
            try:
                return await self._open_vm(serial, pid)
            except _OPEN_ERRORS:
                if attempt == REOPEN_ATTEMPTS:
                    raise
            await trio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def _follow_pid(
        self,
        serial: str,
        pid: int,
        scope: trio.CancelScope,
        send: trio.MemorySendChannel[VmFound | VmLost],
    ) -> None:
        """Open the VM, hand it over, and open it again if it ends while still listed."""
        key = (serial, pid)
        vm_id = _vm_id(key)
        failures = 0
        with scope:
            while True:
                try:
                    stream, leftover = await self._open_vm(serial, pid)
                except _OPEN_ERRORS as exc:
                    failures += 1
                    report = log.warning if failures == 1 else log.debug
                    report(
                        Event.DEVICE_VM_OPEN_FAILED,
                        vm=vm_id,
                        device=serial,
                        pid=pid,
                        error=_describe(exc),
                    )
                    await trio.sleep(_backoff(failures, VM_RETRY_MAX))
                    continue
                live = _Live()
                self._live[key] = live
                found = VmFound(
                    vm_id=vm_id,
                    source="adb",
                    address=f"{serial} jdwp:{pid}",
                    stream=stream,
                    leftover=leftover,
                    opener=partial(self._reopen, serial, pid),
                    key=key,
                    device=serial,
                    pid=pid,
                )
                try:
                    await send.send(found)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._live.pop(key, None)
                    await _close_quietly(stream)
                    return
                except BaseException:
                    if self._live.get(key) is live:
                        del self._live[key]
                    await _close_quietly(stream)
                    raise
                log.info(Event.DEVICE_VM_FOUND, vm=vm_id, device=serial, pid=pid)
                since = trio.current_time()
                await live.ended.wait()
                short = trio.current_time() - since < SHORT_SESSION
                failures = failures + 1 if live.protocol_error or short else 0
                await trio.sleep(_backoff(max(failures, 1), VM_RETRY_MAX))

    def vm_ended(self, key: object, *, protocol_error: bool, reason: str) -> None:
        """The supervisor reports that the VM handed over under ``key`` ended (or was
        rejected); it is opened again after a back-off while its pid stays listed."""
        if not isinstance(key, tuple):
            return
        live = self._live.pop(key, None)
        if live is not None:
            live.protocol_error = protocol_error
            live.ended.set()


def _vm_id(key: tuple[str, int]) -> str:
    return f"{key[0]}/{key[1]}"


def _backoff(failures: int, cap: float) -> float:
    return float(min(RETRY_FIRST * 2 ** max(failures - 1, 0), cap))
