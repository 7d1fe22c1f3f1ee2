"""Android devices and emulators: debuggable VMs found through an adb server.

Layer: imports `protocol.adbwire` (device and pid lists), config, logs, `discovery` (VmFound,
VmLost), `discovery.adbserver` (every exchange with the server; the only adbutils user) and
`discovery.connect` (handshake, closing, back-off); used by `daemon`.

    AdbDiscovery.run
    ├── make sure an adb server answers (``adb -P PORT start-server`` when allowed), then
    │   follow ``host:track-devices-l``. When the server goes away: adb.lost, every device VM
    │   is lost, back-off, again. Workstation VMs are never touched.
    └── per online device: ``host:transport:SERIAL`` + ``track-jdwp`` (pids of debuggable VMs)
        └── per pid: ``host:transport:SERIAL`` + ``jdwp:PID``, JDWP handshake -> VmFound
            (vm id ``SERIAL/PID``). The pid leaving track-jdwp, or its device going offline
            or away, -> VmLost: the supervisor ends that VM and its debugger is disconnected.

ddmd starts an adb server itself only where `AdbServer.start` allows (its configured port, a
loopback host, a program it can find), at most once per outage, and logs it.

Malformed input from the server (a length that is not 4 hex digits, a pid that is not a number,
a device line without a state) is logged as ``adb.protocol_error`` and never ends the daemon: a
bad pid is skipped, a broken stream is reopened after a back-off.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import structlog
import trio

from ddmd.config import Config
from ddmd.discovery import VmFound, VmLost
from ddmd.discovery.adbserver import (
    ADB_ERRORS,
    AdbMalformed,
    AdbProblem,
    AdbRefused,
    AdbServer,
)
from ddmd.discovery.connect import NotJdwp, aclose_quietly, backoff, jdwp_handshake
from ddmd.logs import Event
from ddmd.protocol.adbwire import ONLINE, DeviceLine, parse_devices, parse_pids

log = structlog.get_logger("ddmd.adb")

RETRY_FIRST = 0.25  # seconds: first pause before trying again (server, track-jdwp, jdwp:PID)
RETRY_MAX = 5.0  # cap of the back-off for the server and track-jdwp
VM_RETRY_MAX = 30.0  # cap of the back-off for reopening one pid
REOPEN_ATTEMPTS = 5  # the opener's own short retry (a VM refuses while the old connection closes)
REOPEN_FIRST_DELAY = 0.05
REOPEN_MAX_DELAY = REOPEN_FIRST_DELAY * 2**REOPEN_ATTEMPTS  # never reached: doubling only
SHORT_SESSION = 2.0  # seconds: a VM connection that ended sooner counts as a failure
LOUD_EVERY = 12  # "on" mode: repeat adb.unavailable every this many failed attempts
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


class DeviceTable(Protocol):
    """Where the device list goes (the daemon passes its VmRegistry)."""

    def set_device(
        self, serial: str, state: str, model: str | None = None, product: str | None = None
    ) -> None: ...

    def remove_device(self, serial: str) -> None: ...

    def set_adb_server(self, address: str, *, connected: bool) -> None: ...


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


_OPEN_ERRORS = (*ADB_ERRORS, NotJdwp, trio.TooSlowError, trio.BrokenResourceError, OSError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "no JDWP handshake within [timeouts] handshake"
    return str(exc) or type(exc).__name__


@dataclass(frozen=True, slots=True)
class DeviceFileStore:
    """``DeviceFiles`` of one device: where a VM writes a trace or heap dump that it cannot
    stream (older VMs), and fetching it back through adb."""

    server: AdbServer
    serial: str

    def device_path(self, name: str) -> str:
        # Where DDMS put them: the shared storage every app may write to.
        return f"/sdcard/{name}"

    async def fetch(self, remote: str, local: Path) -> int:
        return await self.server.pull_and_remove(self.serial, remote, local)


class AdbDiscovery:
    """The adb discoverer: ``run(send)`` sends VmFound/VmLost for device VMs.

    ``vm_ended(key, protocol_error=, reason=)`` is told by the supervisor when a VM it handed
    over ended; its pid is then opened again (after a back-off) while it stays listed.
    """

    def __init__(self, config: Config, devices: DeviceTable | None = None) -> None:
        self._config = config
        self._adb = config.adb
        self._server = AdbServer(config.adb, config.timeouts.adb)
        self._table = devices
        self._devices: dict[str, _Device] = {}
        self._live: dict[tuple[str, int], _Live] = {}
        self._outage_logged = False
        self._start_tried = False
        self.server_version: int | None = None

    @property
    def server(self) -> str:
        """The server's address, ``host:port``."""
        return self._server.address

    @property
    def started_server(self) -> bool:
        """Whether ddmd ran ``adb start-server`` itself."""
        return self._server.started

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
                    self._server_reached(False)
                    failures += 1
                    await trio.sleep(backoff(failures, RETRY_FIRST, RETRY_MAX))
                    continue
                self._server_reached(False)
                await self._forget_all(send, f"the adb server went away: {reason}")
                self._outage_logged = False
                self._start_tried = False
                self.server_version = None
                failures = 1
                await trio.sleep(RETRY_FIRST)

    async def _reach_server(self, attempt: int) -> int | None:
        """The server's version once it answers (started if allowed); None if it does not."""
        try:
            return self._connected(await self._server.version())
        except ADB_ERRORS as exc:
            problem = str(exc)
        if not self._start_tried:
            self._start_tried = True
            started, why = await self._server.start()
            if started:
                try:
                    return self._connected(await self._server.version())
                except ADB_ERRORS as exc:
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

    def _server_reached(self, connected: bool) -> None:
        """Tell the device table whether the server answers (`ddmd devices` says which)."""
        if self._table is not None:
            self._table.set_adb_server(self.server, connected=connected)

    def _connected(self, version: int) -> int:
        self._server_reached(True)
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
                    await trio.sleep(backoff(malformed, RETRY_FIRST, RETRY_MAX))
            finally:
                nursery.cancel_scope.cancel()

    async def _follow_devices(
        self, nursery: trio.Nursery, send: trio.MemorySendChannel[VmFound | VmLost]
    ) -> None:
        try:
            stream = await self._server.open(None, "host:track-devices-l")
        except AdbRefused:  # an old server without the long form
            stream = await self._server.open(None, "host:track-devices")
        try:
            records = self._server.records(stream)
            while (record := await records.next()) is not None:
                devices, problems = parse_devices(record)
                for problem in problems:
                    log.warning(
                        Event.ADB_PROTOCOL_ERROR, stream="host:track-devices", error=problem
                    )
                await self._apply_devices(devices, nursery, send)
        finally:
            await aclose_quietly(stream)

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
                        stream = await self._server.open(serial, "track-jdwp")
                    except ADB_ERRORS as exc:
                        failures += 1
                        report = log.warning if failures == 1 else log.debug
                        report(Event.DEVICE_TRACK_FAILED, device=serial, error=str(exc))
                        await trio.sleep(backoff(failures, RETRY_FIRST, RETRY_MAX))
                        continue
                    try:
                        records = self._server.records(stream)
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
                        await aclose_quietly(stream)
                    failures += 1
                    await trio.sleep(backoff(failures, RETRY_FIRST, RETRY_MAX))

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
        stream = await self._server.open(serial, f"jdwp:{pid}")
        try:
            with trio.fail_after(self._config.timeouts.handshake):
                leftover = await jdwp_handshake(stream)
        except BaseException:
            await aclose_quietly(stream)
            raise
        return stream, leftover

    async def _reopen(self, serial: str, pid: int) -> tuple[trio.abc.Stream, bytes]:
        """The opener handed over with the VM: ``jdwp:PID`` again, retried briefly (the VM
        refuses a second connection while the old one is still closing)."""
        for attempt in range(1, REOPEN_ATTEMPTS + 1):
            try:
                return await self._open_vm(serial, pid)
            except _OPEN_ERRORS:
                if attempt == REOPEN_ATTEMPTS:
                    raise
            await trio.sleep(backoff(attempt, REOPEN_FIRST_DELAY, REOPEN_MAX_DELAY))
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
                    await trio.sleep(backoff(failures, RETRY_FIRST, VM_RETRY_MAX))
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
                    files=DeviceFileStore(self._server, serial),
                )
                try:
                    await send.send(found)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._live.pop(key, None)
                    await aclose_quietly(stream)
                    return
                except BaseException:
                    if self._live.get(key) is live:
                        del self._live[key]
                    await aclose_quietly(stream)
                    raise
                log.info(Event.DEVICE_VM_FOUND, vm=vm_id, device=serial, pid=pid)
                since = trio.current_time()
                await live.ended.wait()
                short = trio.current_time() - since < SHORT_SESSION
                failures = failures + 1 if live.protocol_error or short else 0
                await trio.sleep(backoff(max(failures, 1), RETRY_FIRST, VM_RETRY_MAX))

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
