"""A fake adb server speaking the adb host protocol (protocol.md Appendix A), for tests.

    adb = FakeAdb()
    await nursery.start(adb.run)                  # listens on a free loopback port: adb.port
    phone = adb.add_device("emulator-5554", model="Pixel_7")
    phone.add_pid(1234, ("127.0.0.1", sim.port))  # jdwp:1234 is bridged to that TCP address
    ...
    adb.remove_device("emulator-5554")            # "unplugged"
    await adb.kill(); await nursery.start(adb.run)  # the server dies, then comes back

Every request is 4 hex digits of length and the service name; answers are ``OKAY`` or
``FAIL`` + a length-prefixed message. Host services: ``host:version``, ``host:devices(-l)``,
``host:track-devices(-l)`` (the list now and after every change), ``host:kill``, and the
device selectors ``host:transport:SERIAL``, ``host:transport-any``, ``host:tport:serial:SERIAL``.
After a selector, on the same socket: ``track-jdwp`` (the pids now and after every change;
``jdwp``, which the ``adb jdwp`` command uses, gives the same without length prefixes) or
``jdwp:PID`` (OKAY, then the socket is relayed byte for byte to the pid's TCP address, which
may be a ``ddmd sim`` VM or a real HotSpot JVM).

Faults, per device: ``refuse_transport(message)`` (FAIL for the selector),
``inject_track_jdwp(raw)`` (raw bytes sent on the open track-jdwp streams, e.g. a malformed
length or a non-numeric pid), ``fail_jdwp(pid, message)`` (FAIL for ``jdwp:PID``). Removing a
device or a pid closes its streams (as unplugging does) unless ``close_streams=False``, which
leaves ddmd to act on the lists alone. ``kill()`` closes the listener and every connection;
``run`` again listens on the same port. ``FakeAdb(long_listing=False)`` refuses
``host:track-devices-l`` as servers older than the long form do.

``adb_rig(tmp_path)`` runs a fake server and the real daemon wired to it (through
``tests.actors.rawpeers.monitor``) plus a workstation sim VM in the scan range; its ``Rig``
plugs devices in, restarts the server and checks that the workstation VM was not disturbed.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ddmd.sim import SimVm
from tests.actors.rawpeers import Harness, free_port_range, monitor

VERSION = 41  # adb 1.0.41 (Debian's adb 29.0.6 answers the same)


def record(payload: bytes) -> bytes:
    """4 hex digits of length, then the payload."""
    return b"%04x" % len(payload) + payload


def okay() -> bytes:
    return b"OKAY"


def fail(message: str) -> bytes:
    return b"FAIL" + record(message.encode())


class _Closed(Exception):
    """The client closed the connection."""


class _Reader:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            data = await self.stream.receive_some(65536)
            if not data:
                raise _Closed
            self.buffer += data
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    async def request(self) -> str:
        size = int(await self.exactly(4), 16)
        return (await self.exactly(size)).decode()


@dataclass
class FakeDevice:
    """One device or emulator of the fake server."""

    server: FakeAdb
    serial: str
    state: str = "device"
    model: str | None = None
    product: str | None = None
    transport_id: int = 1
    pids: dict[int, tuple[str, int]] = field(default_factory=dict)
    refused: str | None = None
    jdwp_failures: dict[int, str] = field(default_factory=dict)
    injected: list[bytes] = field(default_factory=list)
    # Its files (``sync:`` RECV/STAT, ``shell:rm -f``): give it a SimVm's ``device_files`` to
    # serve the traces and heap dumps the sim "wrote on the device".
    files: dict[str, bytes] = field(default_factory=dict)

    def add_pid(self, pid: int, address: tuple[str, int]) -> None:
        self.pids[pid] = address
        self.server.changed()

    def remove_pid(self, pid: int, *, close_streams: bool = True) -> None:
        del self.pids[pid]
        if close_streams:
            self.server.close_streams(self.serial, pid)
        self.server.changed()

    def refuse_transport(self, message: str | None) -> None:
        """FAIL ``host:transport:SERIAL`` with ``message`` (None: accept again)."""
        self.refused = message

    def fail_jdwp(self, pid: int, message: str | None) -> None:
        """FAIL ``jdwp:PID`` with ``message`` (None: open it again)."""
        if message is None:
            self.jdwp_failures.pop(pid, None)
        else:
            self.jdwp_failures[pid] = message

    def inject_track_jdwp(self, raw: bytes) -> None:
        """Send ``raw`` as is on the open track-jdwp streams of this device."""
        self.injected.append(raw)
        self.server.changed()

    def line(self, *, long: bool) -> str:
        if not long:
            return f"{self.serial}\t{self.state}\n"
        details = "".join(
            f" {key}:{value}"
            for key, value in (("product", self.product), ("model", self.model))
            if value
        )
        return f"{self.serial:<22} {self.state}{details} transport_id:{self.transport_id}\n"


class FakeAdb:
    """The server. ``requests`` records every service asked for (device services as
    ``SERIAL:SERVICE``); ``connections`` counts accepted connections."""

    def __init__(self, port: int = 0, *, long_listing: bool = True) -> None:
        self.port = port
        self.devices: dict[str, FakeDevice] = {}
        self.requests: list[str] = []
        self.connections = 0
        self.running = False
        self.long_listing = long_listing  # False: FAIL host:track-devices-l, like an old server
        self._changed = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._streams: dict[tuple[str, int | None], set[trio.CancelScope]] = {}
        self._next_transport = 1

    # ------------------------------------------------------------------ test API

    def add_device(
        self,
        serial: str,
        *,
        state: str = "device",
        model: str | None = "Fake_Phone",
        product: str | None = "fake",
    ) -> FakeDevice:
        device = FakeDevice(self, serial, state, model, product, self._next_transport)
        self._next_transport += 1
        self.devices[serial] = device
        self.changed()
        return device

    def remove_device(self, serial: str, *, close_streams: bool = True) -> None:
        del self.devices[serial]
        if close_streams:
            self.close_streams(serial)
        self.changed()

    def set_state(self, serial: str, state: str) -> None:
        self.devices[serial].state = state
        self.changed()

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def close_streams(self, serial: str, pid: int | None = None) -> None:
        """Close the device's track-jdwp and jdwp streams (only those of ``pid`` if given)."""
        for (s, p), scopes in self._streams.items():
            if s == serial and (pid is None or p == pid):
                for scope in scopes:
                    scope.cancel()

    async def kill(self) -> None:
        """The server dies: listener and every connection closed."""
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()

    def requested(self, service: str) -> int:
        return sum(1 for r in self.requests if r == service)

    # ------------------------------------------------------------------ serving

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen (on ``port``; 0 picks one, kept for restarts) until ``kill()``."""
        self._stopped = trio.Event()
        self._scope = trio.CancelScope()
        try:
            with self._scope:
                listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
                self.port = listeners[0].socket.getsockname()[1]
                self.running = True
                task_status.started(self.port)
                await trio.serve_listeners(self._handle, listeners)
        finally:
            self.running = False
            self._stopped.set()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        async with stream:
            reader = _Reader(stream)
            try:
                await self._host_service(reader, await reader.request())
            except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, ValueError):
                return

    def _listing(self, *, long: bool) -> bytes:
        return "".join(d.line(long=long) for d in self.devices.values()).encode()

    async def _host_service(self, reader: _Reader, service: str) -> None:
        self.requests.append(service)
        send = reader.stream.send_all
        if service == "host:version":
            await send(okay() + record(b"%04x" % VERSION))
        elif service in ("host:devices", "host:devices-l"):
            await send(okay() + record(self._listing(long=service.endswith("-l"))))
        elif service == "host:track-devices-l" and not self.long_listing:
            await send(fail(f"unknown host service '{service}'"))
        elif service in ("host:track-devices", "host:track-devices-l"):
            await send(okay())
            long = service.endswith("-l")
            last = None
            while True:
                changed = self._changed
                listing = self._listing(long=long)
                if listing != last:
                    await send(record(listing))
                    last = listing
                await changed.wait()
        elif service == "host:kill":
            await send(okay())
            assert self._scope is not None
            self._scope.cancel()
        elif service.startswith(("host:transport:", "host:tport:serial:")) or service in (
            "host:transport-any",
            "host:tport:any",
        ):
            await self._transport(reader, service)
        else:
            await send(fail(f"unknown host service '{service}'"))

    async def _transport(self, reader: _Reader, service: str) -> None:
        serial = service.removeprefix("host:transport:").removeprefix("host:tport:serial:")
        if service in ("host:transport-any", "host:tport:any"):
            online = [d for d in self.devices.values() if d.state == "device"]
            device = online[0] if len(online) == 1 else None
            missing = "no devices/emulators found" if not online else "more than one device"
        else:
            device = self.devices.get(serial)
            missing = f"device '{serial}' not found"
        if device is not None and device.refused is not None:
            await reader.stream.send_all(fail(device.refused))
            return
        if device is None or device.state != "device":
            await reader.stream.send_all(fail(missing))
            return
        if service.startswith("host:tport:"):
            await reader.stream.send_all(okay() + struct.pack("<Q", device.transport_id))
        else:
            await reader.stream.send_all(okay())
        inner = await reader.request()
        self.requests.append(f"{device.serial}:{inner}")
        if inner in ("track-jdwp", "jdwp"):
            # "jdwp" (what `adb jdwp` asks for) is the same list without the length prefixes.
            framed = inner == "track-jdwp"
            await self._on_stream(device.serial, None, self._track_jdwp(reader, device, framed))
        elif inner.startswith("jdwp:"):
            await self._jdwp(reader, device, inner[len("jdwp:") :])
        elif inner == "sync:":
            await self._sync(reader, device)
        elif inner.startswith("shell:"):
            await self._shell(reader, device, inner[len("shell:") :])
        else:
            await reader.stream.send_all(fail(f"unknown device service '{inner}'"))

    async def _sync(self, reader: _Reader, device: FakeDevice) -> None:
        """The file-sync service: STAT and RECV (what a pull uses), QUIT."""
        send = reader.stream.send_all
        await send(okay())
        while True:
            head = await reader.exactly(8)
            command, length = head[:4], struct.unpack("<I", head[4:])[0]
            path = (await reader.exactly(length)).decode()
            data = device.files.get(path)
            if command == b"STAT":
                size = 0 if data is None else len(data)
                mode = 0 if data is None else 0o100644
                await send(b"STAT" + struct.pack("<III", mode, size, 0 if data is None else 1))
            elif command == b"RECV":
                if data is None:
                    message = b"No such file or directory"
                    await send(b"FAIL" + struct.pack("<I", len(message)) + message)
                    continue
                for at in range(0, len(data), 64 * 1024):
                    piece = data[at : at + 64 * 1024]
                    await send(b"DATA" + struct.pack("<I", len(piece)) + piece)
                await send(b"DONE" + struct.pack("<I", 0))
            else:  # QUIT, or anything else: the end of the service
                return

    async def _shell(self, reader: _Reader, device: FakeDevice, command: str) -> None:
        """``rm -f PATH`` (what ddmd runs after a pull); anything else prints nothing."""
        words = command.split()
        if words[:2] == ["rm", "-f"] and len(words) == 3:
            device.files.pop(words[2].strip("'\""), None)
        await reader.stream.send_all(okay())

    async def _on_stream(self, serial: str, pid: int | None, work: Awaitable[None]) -> None:
        """Run ``work`` (a coroutine) so that ``close_streams`` can cancel it."""
        scope = trio.CancelScope()
        scopes = self._streams.setdefault((serial, pid), set())
        scopes.add(scope)
        try:
            with scope:
                await work
        finally:
            scopes.discard(scope)

    async def _track_jdwp(self, reader: _Reader, device: FakeDevice, framed: bool) -> None:
        await reader.stream.send_all(okay())
        last = None
        while True:
            changed = self._changed
            if device.injected:
                await reader.stream.send_all(device.injected.pop(0))
                continue
            pids = "".join(f"{pid}\n" for pid in device.pids).encode()
            if pids != last:
                await reader.stream.send_all(record(pids) if framed else pids)
                last = pids
            await changed.wait()

    async def _jdwp(self, reader: _Reader, device: FakeDevice, raw_pid: str) -> None:
        pid = int(raw_pid) if raw_pid.isdigit() else -1
        if pid in device.jdwp_failures:
            await reader.stream.send_all(fail(device.jdwp_failures[pid]))
            return
        address = device.pids.get(pid)
        if address is None:
            await reader.stream.send_all(fail(f"no debuggable process {raw_pid}"))
            return
        try:
            backend = await trio.open_tcp_stream(*address)
        except OSError as exc:
            await reader.stream.send_all(fail(f"cannot connect to process {pid}: {exc}"))
            return
        await reader.stream.send_all(okay())
        await self._on_stream(device.serial, pid, _bridge(reader, backend))


async def _bridge(reader: _Reader, backend: trio.SocketStream) -> None:
    """Relay bytes both ways until either side closes."""
    async with backend:
        if reader.buffer:
            await backend.send_all(bytes(reader.buffer))
            reader.buffer.clear()
        async with trio.open_nursery() as nursery:

            async def pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream) -> None:
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, reader.stream, backend)
            nursery.start_soon(pump, backend, reader.stream)


# --------------------------------------------------------------------------------------------
# A running daemon wired to a fake adb server


def adb_config(fake_or_port: FakeAdb | int, program: str, **extra: object) -> dict[str, object]:
    """The ``[adb]`` section for ``tests.actors.rawpeers.monitor``: this server, mode "on", and
    ``program`` as the adb binary (a path that does not exist keeps ddmd from ever starting a
    real adb server on the fake's port)."""
    port = fake_or_port if isinstance(fake_or_port, int) else fake_or_port.port
    return {"enabled": "on", "host": "127.0.0.1", "port": port, "path": program, **extra}


@dataclass
class Rig:
    """``h``: the daemon (rawpeers Harness); ``fake``: its adb server; ``desk``: a workstation
    sim VM found by the port scan, to check that adb trouble never disturbs it."""

    h: Harness
    fake: FakeAdb
    servers: trio.Nursery
    desk_port: int
    desk_connected_at: float | None = None

    @property
    def desk_id(self) -> str:
        return f"tcp:{self.desk_port}"

    async def restart_adb(self) -> None:
        await self.servers.start(self.fake.run)

    async def device_sim(self, pid: int, app: str, **kw: object) -> SimVm:
        """A sim VM on a free port outside the scan range: reachable only through the fake."""
        return await self.h.start_sim(0, pid=pid, app_name=app, package_name=app, **kw)

    def plug(self, serial: str, vms: dict[int, SimVm | int], **kw: object) -> FakeDevice:
        """Add a device whose pids lead to ``vms`` (sims, or TCP ports of real JVMs)."""
        device = self.fake.add_device(serial, **kw)  # type: ignore[arg-type]
        for pid, vm in vms.items():
            port = vm if isinstance(vm, int) else vm.port
            assert port is not None, "start the sim first"
            device.add_pid(pid, ("127.0.0.1", port))
        return device

    async def wait_ready(self, vm_id: str, timeout: float = 5.0) -> dict[str, Any]:  # noqa: ASYNC109
        return await self.h.wait_vm(
            vm_id, lambda v: v["state"] == "ready" and v["debugger_port"] is not None, timeout
        )

    async def assert_desk_undisturbed(self) -> None:
        """The workstation VM kept its one connection and still answers DDM requests."""
        h = self.h
        vm = await h.vm(self.desk_id)
        assert vm is not None, "the workstation VM is gone"
        assert vm["state"] == "ready", vm
        assert vm["connected_at"] == self.desk_connected_at, vm
        assert not h.events("vm.disconnected", vm=self.desk_id)
        assert not h.events("vm.lost", vm=self.desk_id)
        response = await h.client.get(f"/api/v1/vms/{self.desk_id}/threads")
        assert response.status_code == 200, response.text
        assert response.json()["threads"], response.json()


@asynccontextmanager
async def adb_rig(
    tmp_path: Path,
    *,
    desk: bool = True,
    fake: FakeAdb | None = None,
    **sections: Mapping[str, object],
) -> AsyncIterator[Rig]:
    """A fake adb server (``fake``, or a new one), then the daemon using it ([timeouts] adb
    2 s), plus (``desk``) a workstation sim VM in the scan range."""
    (desk_port,) = free_port_range(1)
    async with trio.open_nursery() as servers:
        fake = FakeAdb() if fake is None else fake
        await servers.start(fake.run)
        merged: dict[str, Mapping[str, object]] = {
            "adb": adb_config(fake, str(tmp_path / "no-adb")),
            "timeouts": {"adb": 2.0},
        }
        for name, values in sections.items():
            merged[name] = {**merged.get(name, {}), **values}
        async with monitor([desk_port], tmp_path, **merged) as h:
            rig = Rig(h, fake, servers, desk_port)
            if desk:
                await h.start_sim(desk_port, pid=7, app_name="com.example.desk")
                vm = await h.wait_vm(rig.desk_id, lambda v: v["state"] == "ready" and v["threads"])
                rig.desk_connected_at = vm["connected_at"]
            yield rig
        servers.cancel_scope.cancel()
