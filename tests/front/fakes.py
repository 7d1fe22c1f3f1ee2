"""Test doubles for the adb front: a VM hub, a fake adb server that knows forwards and
serial queries, a JDWP echo "VM", raw clients, and the front running on them.

    async with trio.open_nursery() as nursery:
        hub = FakeHub(nursery)
        adb = ForwardingFakeAdb()
        await nursery.start(adb.run)
        async with running_front(adb.port, hub) as front:
            reply = await ask(front.port, b"000chost:version")
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ddmd.config import Config, parse_config
from ddmd.front import serve_front
from ddmd.peers import PeerGuard
from ddmd.protocol.adbrequests import parse_host_service
from tests.adb.fakeadb import FakeAdb, FakeDevice, _Reader, fail, okay, record

HANDSHAKE = b"JDWP-Handshake"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# The hub


async def serve_jdwp_echo(stream: trio.abc.Stream, greeting: bytes = b"") -> None:
    """A VM stand-in: answer the JDWP handshake, then echo everything (after `greeting`)."""
    try:
        got = b""
        while len(got) < len(HANDSHAKE):
            data = await stream.receive_some(len(HANDSHAKE) - len(got))
            if not data:
                return
            got += data
        if got != HANDSHAKE:
            return
        await stream.send_all(HANDSHAKE + greeting)
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await stream.aclose()


@dataclass(eq=False)
class Adopted:
    stream: trio.SocketStream
    peer: str
    via: str
    tool: str | None


@dataclass(eq=False)
class FakeTarget:
    """A VM ddmd "holds": adopted consumers get the handshake echoed, then an echo."""

    hub: FakeHub
    vm_id: str
    greeting: bytes = b""
    adopted: list[Adopted] = field(default_factory=list)

    def adopt_consumer(
        self, stream: trio.SocketStream, peer: str, *, via: str, tool: str | None = None
    ) -> None:
        self.adopted.append(Adopted(stream, peer, via, tool))
        self.hub.nursery.start_soon(serve_jdwp_echo, stream, self.greeting)


@dataclass(eq=False)
class BridgeTarget:
    """A VM "held" by relaying each adopted consumer to a real JDWP agent's TCP port (one
    debugger at a time, as HotSpot's agent allows)."""

    hub: FakeHub
    vm_id: str
    address: tuple[str, int]
    adopted: list[Adopted] = field(default_factory=list)

    def adopt_consumer(
        self, stream: trio.SocketStream, peer: str, *, via: str, tool: str | None = None
    ) -> None:
        self.adopted.append(Adopted(stream, peer, via, tool))
        self.hub.nursery.start_soon(self._bridge, stream)

    async def _bridge(self, stream: trio.SocketStream) -> None:
        vm = await trio.open_tcp_stream(*self.address)
        async with stream, vm, trio.open_nursery() as nursery:

            async def pump(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, stream, vm)
            nursery.start_soon(pump, vm, stream)


class FakeHub:
    """The daemon's side: `hold` makes a VM available (waking `wait_for`), `drop` forgets it."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.targets: dict[tuple[str, int], FakeTarget] = {}
        self.asked: list[tuple[str, int]] = []
        self.waited: list[tuple[str, int]] = []
        self._changed = trio.Event()

    def hold(self, serial: str, pid: int, greeting: bytes = b"") -> FakeTarget:
        target = FakeTarget(self, f"{serial}/{pid}", greeting)
        self.targets[(serial, pid)] = target
        self._changed.set()
        self._changed = trio.Event()
        return target

    def hold_bridge(self, serial: str, pid: int, address: tuple[str, int]) -> BridgeTarget:
        target = BridgeTarget(self, f"{serial}/{pid}", address)
        self.targets[(serial, pid)] = target  # type: ignore[assignment]
        self._changed.set()
        self._changed = trio.Event()
        return target

    def drop(self, serial: str, pid: int) -> None:
        self.targets.pop((serial, pid), None)

    def find(self, serial: str, pid: int) -> FakeTarget | None:
        self.asked.append((serial, pid))
        return self.targets.get((serial, pid))

    async def wait_for(self, serial: str, pid: int) -> FakeTarget | None:
        self.waited.append((serial, pid))
        while (serial, pid) not in self.targets:
            await self._changed.wait()
        return self.targets[(serial, pid)]


# --------------------------------------------------------------------------------------------
# A fake adb server with serial queries and forwards


class ForwardingFakeAdb(FakeAdb):
    """`FakeAdb` plus what the front asks the server for: ``get-serialno`` with every
    prefix, ``features``, and a forward table (``forward``, ``list-forward``,
    ``killforward``, ``killforward-all``; its listeners are pretend: nothing binds)."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(port)
        self.forward_table: dict[str, tuple[str, str]] = {}  # local -> (serial, remote)
        self.wires: list[bytes] = []  # every first request's 4-byte header, as sent
        self.on_killforward: Callable[[str], None] | None = None  # called with LOCAL

    def _select(self, selector: str) -> tuple[FakeDevice | None, str]:
        """A device by prefix kind: "", "usb", "serial:S", "id:N" -> (device, error)."""
        online = [d for d in self.devices.values() if d.state == "device"]
        if selector.startswith("serial:"):
            serial = selector[len("serial:") :]
            return self.devices.get(serial), f"device '{serial}' not found"
        if selector.startswith("id:"):
            wanted = int(selector[3:])
            found = [d for d in self.devices.values() if d.transport_id == wanted]
            return (found[0] if found else None), f"no device with transport id '{wanted}'"
        if len(online) == 1:
            return online[0], ""
        return None, "no devices/emulators found" if not online else "more than one device"

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        async with stream:
            reader = _Reader(stream)
            try:
                head = await reader.exactly(4)
                self.wires.append(head)
                service = (await reader.exactly(int(head, 16))).decode()
                await self._host_service(reader, service)
            except Exception:  # a test server: any trouble ends the connection
                return

    async def _host_service(self, reader: _Reader, service: str) -> None:
        key: str | None = None
        body = ""
        if service.startswith("host:transport-id:"):
            await self._transport(reader, service)
            return
        if service.startswith(("host-usb:", "host-local:")):
            key, body = "", service.partition(":")[2]
        elif service.startswith("host-serial:"):
            split = parse_host_service(service[len("host-serial:") :])
            if split is not None:
                key, body = "serial:" + split[0], split[1]
        elif service.startswith("host-transport-id:"):
            number, _, body = service[len("host-transport-id:") :].partition(":")
            key = "id:" + number
        elif service.startswith("host:") and self._is_query(service[5:]):
            key, body = "", service[5:]
        if key is None:
            await super()._host_service(reader, service)
            return
        self.requests.append(service)
        await self._device_query(reader, key, body)

    @staticmethod
    def _is_query(body: str) -> bool:
        return body in ("get-serialno", "features", "list-forward", "killforward-all") or (
            body.startswith(("forward:", "killforward:"))
        )

    async def _device_query(
        self, reader: _Reader, selector: str, body: str, device: FakeDevice | None = None
    ) -> None:
        send = reader.stream.send_all
        if body == "list-forward":
            lines = "".join(f"{s} {local} {r}\n" for local, (s, r) in self.forward_table.items())
            await send(okay() + record(lines.encode()))
            return
        if body == "killforward-all":
            self.forward_table.clear()
            await send(b"OKAYOKAY")
            return
        error = ""
        if device is None:
            device, error = self._select(selector)
        if device is None:
            await send(fail(error if not body.startswith(("forward:", "killforward:")) else ""))
            return
        if body == "get-serialno":
            await send(okay() + record(device.serial.encode()))
        elif body == "features":
            await send(okay() + record(b"shell_v2,cmd"))
        elif body.startswith("killforward:"):
            local = body[len("killforward:") :]
            if self.forward_table.pop(local, None) is None:
                await send(fail(f"listener '{local}' not found"))
            else:
                if self.on_killforward is not None:
                    self.on_killforward(local)
                await send(b"OKAYOKAY")
        elif body.startswith("forward:"):
            spec = body[len("forward:") :]
            norebind = spec.startswith("norebind:")
            spec = spec.removeprefix("norebind:")
            local, _, remote = spec.partition(";")
            if norebind and local in self.forward_table:
                await send(fail("cannot rebind existing socket"))
                return
            if local == "tcp:0":
                local = f"tcp:{free_port()}"
            self.forward_table[local] = (device.serial, remote)
            await send(b"OKAYOKAY" + record(local[4:].encode()))
        else:
            await send(fail("unknown host service"))

    async def _transport(self, reader: _Reader, service: str) -> None:
        # host:transport-id:N (FakeAdb has no such form): OKAY alone, then the device's
        # services; everything else as FakeAdb does, plus host queries on a switched socket.
        if service.startswith("host:transport-id:"):
            device, error = self._select("id:" + service[len("host:transport-id:") :])
            if device is None:
                await reader.stream.send_all(fail(error))
                return
            await reader.stream.send_all(okay())
            inner = await reader.request()
            self.requests.append(f"{device.serial}:{inner}")
            await self._device_service(reader, device, inner)
            return
        serial = service.removeprefix("host:transport:").removeprefix("host:tport:serial:")
        if service in ("host:transport-any", "host:tport:any"):
            device, missing = self._select("")
        else:
            device = self.devices.get(serial)
            missing = f"device '{serial}' not found"
        if device is None or device.state != "device":
            await reader.stream.send_all(fail(missing))
            return
        if service.startswith("host:tport:"):
            await reader.stream.send_all(okay() + device.transport_id.to_bytes(8, "little"))
        else:
            await reader.stream.send_all(okay())
        inner = await reader.request()
        self.requests.append(f"{device.serial}:{inner}")
        await self._device_service(reader, device, inner)

    async def _device_service(self, reader: _Reader, device: FakeDevice, inner: str) -> None:
        if inner.startswith("host:") and self._is_query(inner[5:]):
            await self._device_query(reader, "", inner[5:], device)
        elif inner in ("track-jdwp", "jdwp"):
            framed = inner == "track-jdwp"
            await self._on_stream(device.serial, None, self._track_jdwp(reader, device, framed))
        elif inner.startswith("jdwp:"):
            await self._jdwp(reader, device, inner[len("jdwp:") :])
        elif inner.startswith("shell:"):
            await reader.stream.send_all(okay() + inner[len("shell:") :].encode() + b"\n")
        else:
            await reader.stream.send_all(fail(f"unknown device service '{inner}'"))


async def jdwp_echo_listener(nursery: trio.Nursery, greeting: bytes = b"") -> tuple[int, list[int]]:
    """A TCP "VM" (handshake, then echo) for the fake server's pids; its port, and a list
    that grows by one per connection."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    count: list[int] = []

    async def handle(stream: trio.SocketStream) -> None:
        count.append(1)
        await serve_jdwp_echo(stream, greeting)

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return int(listeners[0].socket.getsockname()[1]), count


# --------------------------------------------------------------------------------------------
# The front, and raw clients


@dataclass
class Front:
    port: int
    config: Config


def front_config(
    upstream_port: int,
    *,
    front_port: int | None = None,
    adb_path: str = "/nonexistent/adb",
    home: Path | None = None,
    **front: Any,
) -> Config:
    data: dict[str, Any] = {
        "front": {"port": front_port or free_port(), **front},
        "adb": {"port": upstream_port, "path": adb_path, "enabled": "on"},
        "scan": {"enabled": False},
        "timeouts": {"adb": 3.0, "connect": 2.0},
    }
    return parse_config(data, source="test", env={"HOME": str(home or "/nonexistent")})


@asynccontextmanager
async def running_front(
    upstream_port: int,
    hub: FakeHub,
    *,
    guard: PeerGuard | None = None,
    config: Config | None = None,
    **front: Any,
) -> AsyncIterator[Front]:
    config = config or front_config(upstream_port, **front)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve_front, config, hub, guard))
        assert port is not None, "the front did not start"
        yield Front(port, config)
        nursery.cancel_scope.cancel()


async def connect(port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def read_exactly(stream: trio.abc.ReceiveStream, size: int, patience: float = 5.0) -> bytes:
    out = b""
    with trio.fail_after(patience):
        while len(out) < size:
            data = await stream.receive_some(size - len(out))
            if not data:
                break
            out += data
    return out


async def read_to_eof(stream: trio.abc.ReceiveStream, patience: float = 5.0) -> bytes:
    out = b""
    with trio.fail_after(patience):
        try:
            while data := await stream.receive_some(65536):
                out += data
        except trio.BrokenResourceError:
            pass
    return out


async def ask(port: int, *wires: bytes, patience: float = 5.0) -> bytes:
    """Send `wires` at once and read until the front closes."""
    stream = await connect(port)
    async with stream:
        await stream.send_all(b"".join(wires))
        return await read_to_eof(stream, patience)


def wire(service: str, *, upper: bool = False) -> bytes:
    head = b"%04X" if upper else b"%04x"
    return head % len(service.encode()) + service.encode()
