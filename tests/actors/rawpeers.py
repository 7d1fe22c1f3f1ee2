"""Scripted raw-socket peers built on ``ddmd.protocol``, and a harness that runs the real daemon.

Peers (each a small trio TCP server on 127.0.0.1, serving one connection at a time like a VM):

- ``RawPeer(port, script)``: answers the JDWP handshake, then runs ``script(conn)`` on the
  connection. ``PeerConnection`` reads packets with ddmd's own ``PacketDecoder`` and writes
  replies, pushes and arbitrary bytes. ``ddm_script(...)`` builds the usual script: a loop that
  answers DDM requests by chunk type (empty reply by default).
- ``NotJdwpServer(port)``: an HTTP-like server that answers anything with garbage and closes.

Harness: ``free_port_range(n)`` picks consecutive free ports below the ephemeral range (so a
probe of a closed port can never connect to itself, and no outgoing connection takes a sim's
port); ``monitor(ports)`` runs ``ddmd.daemon.run`` with a quick test config, captures structlog
events, and gives an ``httpx.AsyncClient`` on the real control port plus a nursery for peers;
``wait_until(predicate, timeout)`` polls.
"""

from __future__ import annotations

import inspect
import random
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from click.testing import CliRunner, Result
from structlog.testing import capture_logs

from ddmd import daemon
from ddmd.config import Config, parse_config
from ddmd.logs import CONTEXT_PROCESSORS
from ddmd.protocol.ddm import ChunkType, HeloReply, encode_chunk
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    PacketDecoder,
    ReplyPacket,
    encode,
)
from ddmd.sim import SimConfig, SimVm

# --------------------------------------------------------------------------------------------
# Ports


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port an earlier test's connection left in TIME_WAIT counts as taken,
    # because some tests bind plain sockets (and ddmd's sysmon probe binds without it too).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free loopback port chosen by the system (for listeners only ddmd binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int) -> list[int]:
    """``count`` consecutive free ports below the ephemeral range (a scan range for sims)."""
    low, _ = _ephemeral_range()
    top = min(low, 32768) - count
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, top)
        ports = list(range(base, base + count))
        if all(_bindable(p) for p in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports found below {low}")


# --------------------------------------------------------------------------------------------
# Waiting


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float,  # noqa: ASYNC109 - the wait's deadline is this test helper's whole policy
    *,
    what: str = "",
    step: float = 0.05,
) -> Any:
    """Poll ``predicate`` (sync or async) every ``step`` s until it returns something truthy.

    Returns that value. On timeout, fails with an AssertionError naming ``what`` and the last
    value seen instead of a bare TooSlowError.
    """
    last: Any = None
    try:
        with trio.fail_after(timeout):
            while True:
                last = predicate()
                if inspect.isawaitable(last):
                    last = await last
                if last:
                    return last
                await trio.sleep(step)
    except trio.TooSlowError:
        raise AssertionError(
            f"not true within {timeout:g} s: {what or predicate!r}; last value: {last!r}"
        ) from None


# --------------------------------------------------------------------------------------------
# Raw JDWP peers


class PeerConnection:
    """One accepted connection of a RawPeer, past the handshake."""

    def __init__(self, stream: trio.SocketStream, peer: RawPeer) -> None:
        self.stream = stream
        self.peer = peer
        self.decoder = PacketDecoder(max_length=1 << 24)
        self._push_serial = 0

    async def receive_packet(self) -> CommandPacket | ReplyPacket | None:
        """The next whole packet from ddmd; None at EOF (or on a broken stream)."""
        while True:
            try:
                event = self.decoder.next_event()
            except ProtocolError:
                return None
            if event is NEED_DATA:
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                self.decoder.receive_data(data)
                continue
            if isinstance(event, CommandPacket | ReplyPacket):
                if isinstance(event, CommandPacket):
                    self.peer.received.append(event)
                return event
            if isinstance(event, ConnectionClosed):
                return None
            return None  # EOF

    async def receive_command(self) -> CommandPacket | None:
        while True:
            packet = await self.receive_packet()
            if packet is None or isinstance(packet, CommandPacket):
                return packet

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self, packet_id: int, data: bytes = b"", error: int = 0) -> None:
        await self.send_raw(encode(ReplyPacket(packet_id, error, data)))

    async def push(self, chunk_bytes: bytes) -> None:
        """A DDM command from the VM carrying ``chunk_bytes`` (header included), VM id space."""
        self._push_serial += 1
        packet_id = 0x80000000 | self._push_serial
        await self.send_raw(encode(CommandPacket(packet_id, CommandSet.DDM, 1, chunk_bytes)))

    async def wait_closed(self) -> None:
        """Read and drop everything until ddmd closes the connection."""
        while await self.receive_packet() is not None:
            pass


Script = Callable[[PeerConnection], Awaitable[None]]


class RawPeer:
    """A scripted JDWP peer: listens, handshakes, runs ``script`` per connection.

    Like a VM it serves one connection at a time and listens again afterwards. ``received``
    collects every command packet from every connection, in order.
    """

    def __init__(self, port: int, script: Script) -> None:
        self.port = port
        self.script = script
        self.connections = 0
        self.accept_times: list[float] = []  # trio clock at each accepted connection
        self.closed = 0
        self.received: list[CommandPacket] = []

    def ddm_types(self) -> list[str]:
        """Chunk type names of the DDM commands received so far."""
        out = []
        for packet in self.received:
            if packet.command_set == CommandSet.DDM and len(packet.data) >= 4:
                out.append(packet.data[:4].decode("ascii", "replace"))
            else:
                out.append(f"{packet.command_set}/{packet.command}")
        return out

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        reported = False
        while True:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            if not reported:
                task_status.started(self.port)
                reported = True
            try:
                stream = await listeners[0].accept()
            finally:
                for listener in listeners:
                    await listener.aclose()
            self.connections += 1
            self.accept_times.append(trio.current_time())
            try:
                await self._serve(stream)
            finally:
                self.closed += 1
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()

    async def _serve(self, stream: trio.SocketStream) -> None:
        got = b""
        try:
            while len(got) < len(HANDSHAKE):
                data = await stream.receive_some(len(HANDSHAKE) - len(got))
                if not data:
                    return
                got += data
            if got != HANDSHAKE:
                return
            await stream.send_all(HANDSHAKE)
            await self.script(PeerConnection(stream, self))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


class NotJdwpServer:
    """An HTTP-like server: whatever arrives, it answers a garbage status line and closes."""

    ANSWER = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted_at: list[float] = []

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.accepted_at.append(trio.current_time())
        try:
            with trio.move_on_after(2):
                await stream.receive_some(4096)
            await stream.send_all(self.ANSWER)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


# --------------------------------------------------------------------------------------------
# Scripts

ChunkHandler = Callable[[PeerConnection, CommandPacket, bytes], Awaitable[None]]


def chunk_type_of(packet: CommandPacket) -> int | None:
    if packet.command_set != CommandSet.DDM or packet.command != 1 or len(packet.data) < 8:
        return None
    return int(struct.unpack_from(">I", packet.data)[0])


def ddm_script(
    handlers: Mapping[int, ChunkHandler],
    *,
    on_start: Script | None = None,
    silent_default: bool = False,
) -> Script:
    """Answer each DDM request with its handler (by chunk type), else an empty reply
    (or nothing at all with ``silent_default``); non-DDM commands get error 99."""

    async def script(conn: PeerConnection) -> None:
        if on_start is not None:
            await on_start(conn)
        while True:
            packet = await conn.receive_command()
            if packet is None:
                return
            kind = chunk_type_of(packet)
            if kind is None:
                await conn.reply(packet.id, error=99)
                continue
            handler = handlers.get(kind)
            if handler is not None:
                await handler(conn, packet, packet.data[8:])
            elif not silent_default:
                await conn.reply(packet.id)

    return script


def reply_with(chunk_bytes: bytes) -> ChunkHandler:
    async def handler(conn: PeerConnection, packet: CommandPacket, data: bytes) -> None:
        await conn.reply(packet.id, chunk_bytes)

    return handler


def helo_chunk(pid: int = 777, app: str = "com.example.raw", **trailers: Any) -> bytes:
    """A shipped-format HELO reply chunk (all five trailers unless given)."""
    values = {
        "user_id": 0,
        "abi": "64-bit (x86_64)",
        "jvm_flags": "CheckJNI=false",
        "native_debuggable": False,
        "package_name": app,
        **trailers,
    }
    return encode_chunk(HeloReply(1, pid, "Dalvik v2.1.0", app, **values))


def raw_chunk(chunk_type: int, data: bytes, *, declared: int | None = None) -> bytes:
    """Chunk bytes with an arbitrary declared length (``declared`` defaults to the truth)."""
    length = len(data) if declared is None else declared
    return struct.pack(">II", chunk_type, length) + data


HELO = int(ChunkType.HELO)


# --------------------------------------------------------------------------------------------
# The daemon under test


def make_config(
    scan_ports: Sequence[int], state_dir: Path, **sections: Mapping[str, object]
) -> Config:
    """A quick config: scan ``scan_ports`` (consecutive) every 0.2 s, 1 s DDM timeout, free
    control and debugger ports, the port book in ``state_dir``, adb off. ``sections``
    override or add keys per section."""
    first, last = scan_ports[0], scan_ports[-1]
    if list(scan_ports) != list(range(first, last + 1)):
        raise ValueError(f"scan ports {list(scan_ports)} are not consecutive (free_port_range)")
    # The daemon's own ports: free, below the ephemeral range, and outside the scan range.
    while True:
        own = free_port_range(6)
        if own[-1] < first or own[0] > last:
            break
    control_port, current_port, debugger_ports = own[0], own[1], own[2:]
    data: dict[str, dict[str, object]] = {
        "scan": {
            "ports": f"{first}-{last}",
            "interval": 0.2,
            "backoff_max": 2.0,
        },
        "control": {"port": control_port},
        "debugger": {
            "ports": f"{debugger_ports[0]}-{debugger_ports[-1]}",
            "current_port": current_port,
            "state_file": str(state_dir / "ports.json"),
        },
        "adb": {"enabled": "off"},
        "timeouts": {"ddm_request": 1.0, "connect": 1.0, "handshake": 1.0, "shutdown_grace": 2.0},
        "monitor": {"thread_poll_interval": 0.1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_config(data, source="test")


QUIET_SIM = {"churn_interval": 0.0, "gc_interval": 0.0, "heap_mb": 1}


@dataclass
class Harness:
    """A running daemon plus what a test needs around it."""

    started: daemon.Started
    client: httpx.AsyncClient
    logs: list[dict[str, Any]]
    peers: trio.Nursery
    config_file: Path
    sims: list[SimVm] = field(default_factory=list)

    @property
    def control(self) -> str:
        host, port = self.started.control
        return f"{host}:{port}"

    async def start_sim(self, port: int, **kw: Any) -> SimVm:
        sim = SimVm(SimConfig(port=port, **{**QUIET_SIM, **kw}))
        await self.peers.start(sim.run)
        self.sims.append(sim)
        return sim

    async def start(self, server: Any) -> Any:
        """Start a RawPeer / NotJdwpServer (anything with ``run(task_status=)``)."""
        await self.peers.start(server.run)
        return server

    async def vms(self) -> list[dict[str, Any]]:
        response = await self.client.get("/api/v1/vms")
        assert response.status_code == 200, response.text
        body: list[dict[str, Any]] = response.json()
        return body

    async def vm(self, vm_id: str) -> dict[str, Any] | None:
        for vm in await self.vms():
            if vm["id"] == vm_id:
                return vm
        return None

    async def wait_vm(
        self,
        vm_id: str,
        check: Callable[[dict[str, Any]], bool],
        timeout: float = 5.0,  # noqa: ASYNC109 - passed to wait_until
    ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            vm = await self.vm(vm_id)
            return vm if vm is not None and check(vm) else None

        result: dict[str, Any] = await wait_until(probe, timeout, what=f"{vm_id} condition")
        return result

    def events(self, name: str, **match: object) -> list[dict[str, Any]]:
        """Captured log entries with event ``name`` whose keys equal ``match``."""
        return [
            e
            for e in self.logs
            if e.get("event") == name and all(e.get(k) == v for k, v in match.items())
        ]

    async def wait_event(
        self,
        name: str,
        timeout: float = 5.0,  # noqa: ASYNC109 - passed to wait_until
        **match: object,
    ) -> dict[str, Any]:
        found = await wait_until(
            lambda: self.events(name, **match), timeout, what=f"log event {name} {match}"
        )
        first: dict[str, Any] = found[0]
        return first

    async def cli(self, *args: str) -> Result:
        """``ddmd ARGS --control HOST:PORT --config EMPTY``, run in a thread (CliRunner blocks)."""
        from ddmd.cli import main

        argv = [*args, "--control", self.control, "--config", str(self.config_file)]
        runner = CliRunner()
        return await trio.to_thread.run_sync(partial(runner.invoke, main, argv))


# Events logged by the VM actor or about one VM: each must carry the `vm` key.
VM_SCOPED_PREFIXES = ("vm.", "ddm.", "heap.", "threads.")


def assert_vm_scoped(logs: Sequence[Mapping[str, Any]]) -> None:
    for entry in logs:
        event = str(entry.get("event", ""))
        if event.startswith(VM_SCOPED_PREFIXES):
            assert entry.get("vm"), f"VM-scoped log line without vm: {entry}"
        if event == "vm.disconnected":
            assert entry.get("reason"), f"vm.disconnected without a reason: {entry}"


@asynccontextmanager
async def monitor(
    ports: Sequence[int], tmp_path: Path, **sections: Mapping[str, object]
) -> AsyncIterator[Harness]:
    """Run the daemon (scanning ``ports``) and a nursery for peers; stop both at the end.

    Logs are captured with ``ddmd.logs.CONTEXT_PROCESSORS`` first, as ``ddmd.logs.configure``
    does, so context bound with ``bound_contextvars`` and a VM's app and pid show up as they
    would in production.
    """
    config = make_config(ports, tmp_path, **sections)
    config_file = tmp_path / "client.toml"  # the CLI reads no user config in tests
    config_file.write_text("")
    with capture_logs(processors=list(CONTEXT_PROCESSORS)) as logs:
        async with trio.open_nursery() as outer, trio.open_nursery() as peers:
            started: daemon.Started = await outer.start(
                partial(daemon.run, config, install_signal_handlers=False)
            )
            host, port = started.control
            async with httpx.AsyncClient(
                base_url=f"http://{host}:{port}", trust_env=False, timeout=10.0
            ) as client:
                harness = Harness(started, client, logs, peers, config_file)
                try:
                    yield harness
                finally:
                    started.stop()
            peers.cancel_scope.cancel()
    assert_vm_scoped(logs)
