"""A stand-in adb server for the benchmarks: the adb host protocol over TCP, one fake device.

Run: ``.venv/bin/python bench/rig/fake_adb.py --serial SERIAL --pid PID=PORT [--pid ...]
[--port N]``

There is no Android device on a workstation, so this process plays the adb server (and, behind
it, the device): ``jdwp:PID`` on the device leads to the local TCP port given for that pid, a
JVM started with ``-agentlib:jdwp=...server=y``. It prints ``listening PORT`` once it accepts
connections and runs until SIGTERM/SIGINT. Every unknown service is answered with FAIL and
reported on stderr, so a client that asks for more than this speaks shows up in the bench log.

Services (adb's host protocol: 4 hex digits of length, the service name; ``OKAY`` or ``FAIL``
and a length-prefixed message):

- ``host:version``, ``host:devices``, ``host:devices-l``, ``host:track-devices``,
  ``host:track-devices-l`` (one listing now; the device never changes), ``host:kill``;
- the device selectors ``host:transport:SERIAL``, ``host:transport-any``,
  ``host:tport:serial:SERIAL``, ``host:tport:any``, then on the same connection ``track-jdwp``
  (the pids, length-prefixed, then silence), ``jdwp`` (the same without the prefix) or
  ``jdwp:PID`` (OKAY, then bytes are relayed both ways between the client and the pid's port),
  or ``shell:getprop`` (a few fixed properties, then the connection closes);
- port forwarding as the real server does it for ``adb forward tcp:LOCAL jdwp:PID``:
  ``host[-serial:SERIAL|-usb|-local|-transport-id:N]:forward[:norebind]:tcp:LOCAL;jdwp:PID``
  (this process listens on 127.0.0.1:LOCAL, 0 picks a port, and relays every accepted
  connection to the pid's port, as the real server relays it to the device),
  ``...:killforward:tcp:LOCAL``, ``host:killforward-all`` and ``host:list-forward``.

The relays copy bytes with ``receive_some(65536)``/``send_all``, like the bench's trio relay.
Two things make a stand-in device behave like a phone for the old ddmlib:

- a refused connection to a pid's port is retried for up to 2 s (a JVM listens again a few ms
  after its previous debugger connection ended; a phone's adbd hands out a new JDWP connection
  as soon as the VM can take one);
- when the VM ends a ``jdwp:PID`` stream first, the client's side stays open until the client
  closes it (at most 5 s; what it sends meanwhile is dropped). The OpenJDK agent (HotSpot, and
  ART 9+ once a debugger attached) closes its connection right after VirtualMachine.Dispose.
  ddmlib 25 drops a VM for good when that EOF reaches it before the debugger's own EOF (the pid
  never leaves ``track-jdwp``, so it is never reopened), and reopens the VM when the debugger's
  EOF comes first. Holding the VM's EOF back makes the second order certain, so ddmlib recycles
  its VM connection after every debugger session. ddmd answers Dispose itself and closes the
  stream from its side, so this never applies to it.
(tests/adb/fakeadb.py is the test suite's richer fake, with faults and device changes; benches
never import tests, so this is a separate, smaller one.)
"""

from __future__ import annotations

import argparse
import contextlib
import re
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import trio

HOST = "127.0.0.1"
VERSION = 41  # adb 1.0.41: what Debian's adb 29.0.6 client expects, or it restarts the server
REQUEST_TIMEOUT = 10.0  # seconds for a client to finish sending a request
CONNECT_TIMEOUT = 5.0  # seconds to reach a pid's JDWP port
REFUSED_RETRY = 2.0  # seconds during which a refused connection to a pid's port is retried
HOLD_AFTER_VM_EOF = 5.0  # see bridge()
GETPROP = (
    b"[ro.build.version.release]: [11]\n[ro.build.version.sdk]: [30]\n"
    b"[ro.product.model]: [Bench]\n[ro.product.cpu.abi]: [x86_64]\n[ro.debuggable]: [1]\n"
)
FORWARD = re.compile(
    r"^host(?:-serial:(?P<serial>.+?)|-usb|-local|-transport-id:\d+)?:"
    r"(?P<verb>forward|killforward|killforward-all)(?::norebind)?(?::(?P<spec>.*))?$"
)


def record(payload: bytes) -> bytes:
    """4 hex digits of length, then the payload."""
    return b"%04x" % len(payload) + payload


def fail(message: str) -> bytes:
    return b"FAIL" + record(message.encode())


class Closed(Exception):
    """The client closed the connection."""


class Reader:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            data = await self.stream.receive_some(65536)
            if not data:
                raise Closed
            self.buffer += data
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    async def request(self) -> str:
        with trio.fail_after(REQUEST_TIMEOUT):
            head = await self.exactly(4)
            try:
                size = int(head, 16)
            except ValueError:
                raise ValueError(f"bad request length {head!r}") from None
            return (await self.exactly(size)).decode(errors="replace")


@dataclass
class Server:
    serial: str
    pids: dict[int, int]  # pid -> local JDWP port
    port: int = 0
    forwards: dict[int, tuple[int, trio.CancelScope]] = field(default_factory=dict)
    nursery: trio.Nursery | None = None

    async def run(self) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=HOST)
        self.port = listeners[0].socket.getsockname()[1]
        print(f"listening {self.port}", flush=True)
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await trio.serve_listeners(self.handle, listeners)

    async def handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = Reader(stream)
            service = ""
            try:
                service = await reader.request()
                await self.host_service(reader, service)
            except (Closed, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            except (ValueError, trio.TooSlowError) as exc:
                print(f"fake adb: {service or 'request'}: {exc}", file=sys.stderr, flush=True)

    async def host_service(self, reader: Reader, service: str) -> None:
        send = reader.stream.send_all
        line = f"{self.serial}\tdevice\n".encode()
        long_line = f"{self.serial:<22} device product:fake model:Bench transport_id:1\n".encode()
        if service == "host:version":
            await send(b"OKAY" + record(b"%04x" % VERSION))
        elif service in ("host:devices", "host:devices-l"):
            await send(b"OKAY" + record(long_line if service.endswith("-l") else line))
        elif service in ("host:track-devices", "host:track-devices-l"):
            await send(b"OKAY" + record(long_line if service.endswith("-l") else line))
            await trio.sleep_forever()  # the device list never changes
        elif service == "host:kill":
            await send(b"OKAY")
            assert self.nursery is not None
            self.nursery.cancel_scope.cancel()  # the server exits, as the real one does
        elif service.startswith(("host:transport:", "host:tport:serial:")) or service in (
            "host:transport-any",
            "host:tport:any",
        ):
            await self.transport(reader, service)
        elif service == "host:list-forward":
            listing = "".join(
                f"{self.serial} tcp:{port} jdwp:{pid}\n" for port, (pid, _) in self.forwards.items()
            )
            await send(b"OKAY" + record(listing.encode()))
        elif match := FORWARD.match(service):
            await self.forward(reader, match)
        else:
            print(f"fake adb: unknown service {service!r}", file=sys.stderr, flush=True)
            await send(fail(f"unknown host service '{service}'"))

    async def transport(self, reader: Reader, service: str) -> None:
        serial = service.removeprefix("host:transport:").removeprefix("host:tport:serial:")
        if serial not in (self.serial, "host:transport-any", "host:tport:any"):
            await reader.stream.send_all(fail(f"device '{serial}' not found"))
            return
        if service.startswith("host:tport:"):
            await reader.stream.send_all(b"OKAY" + struct.pack("<Q", 1))
        else:
            await reader.stream.send_all(b"OKAY")
        inner = await reader.request()
        if inner in ("track-jdwp", "jdwp"):
            pids = "".join(f"{pid}\n" for pid in self.pids).encode()
            await reader.stream.send_all(
                b"OKAY" + (record(pids) if inner == "track-jdwp" else pids)
            )
            await trio.sleep_forever()  # the pid list never changes
        elif inner == "shell:getprop":  # ddmlib asks each new device for its properties
            await reader.stream.send_all(b"OKAY" + GETPROP)
        elif match := FORWARD.match(inner):  # what the adb client sends after host:tport:...
            await self.forward(reader, match)
        elif inner.startswith("jdwp:"):
            backend = await self.open_pid(inner.removeprefix("jdwp:"))
            if isinstance(backend, str):
                await reader.stream.send_all(fail(backend))
            else:
                await reader.stream.send_all(b"OKAY")
                await bridge(reader.stream, backend, bytes(reader.buffer))
        else:
            print(f"fake adb: unknown device service {inner!r}", file=sys.stderr, flush=True)
            await reader.stream.send_all(fail(f"unknown device service '{inner}'"))

    async def open_pid(self, raw_pid: str) -> trio.SocketStream | str:
        """A connection to the pid's JDWP port, or why there is none."""
        pid = int(raw_pid) if raw_pid.isdigit() else -1
        port = self.pids.get(pid)
        if port is None:
            return f"no debuggable process {raw_pid}"
        deadline = trio.current_time() + REFUSED_RETRY
        delay = 0.005
        while True:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    return await trio.open_tcp_stream(HOST, port)
            except trio.TooSlowError:
                return f"cannot connect to process {pid}: no answer in {CONNECT_TIMEOUT:g} s"
            except OSError as exc:
                # A JVM listens again a few ms after its previous connection ended.
                if trio.current_time() + delay > deadline:
                    return f"cannot connect to process {pid}: {exc}"
            await trio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def forwarded(self, raw_pid: str, stream: trio.SocketStream) -> None:
        """One connection to a forward listener: relayed to the pid, or closed (as adb does)."""
        async with stream:
            backend = await self.open_pid(raw_pid)
            if isinstance(backend, str):
                print(f"fake adb: forward: {backend}", file=sys.stderr, flush=True)
            else:
                await bridge(stream, backend, b"")

    async def forward(self, reader: Reader, match: re.Match[str]) -> None:
        """forward, killforward, killforward-all. The real server answers OKAY twice on
        success (device found, then done); forward adds the local port, length-prefixed."""
        send = reader.stream.send_all
        serial = match["serial"]
        if serial is not None and serial != self.serial:
            await send(fail(f"device '{serial}' not found"))
            return
        if match["verb"] == "killforward-all":
            for _, scope in self.forwards.values():
                scope.cancel()
            self.forwards.clear()
            await send(b"OKAYOKAY")
            return
        local, _, remote = (match["spec"] or "").partition(";")
        if not local.startswith("tcp:") or not local[4:].isdigit():
            await send(fail(f"cannot bind listener: only tcp:PORT is supported here: {local}"))
            return
        if match["verb"] == "killforward":
            entry = self.forwards.pop(int(local[4:]), None)
            if entry is None:
                await send(fail(f"listener '{local}' not found"))
                return
            entry[1].cancel()
            await send(b"OKAYOKAY")
            return
        raw_pid = remote.removeprefix("jdwp:")
        if not remote.startswith("jdwp:") or int(raw_pid if raw_pid.isdigit() else -1) not in (
            self.pids
        ):
            await send(fail(f"only jdwp:PID of this device can be forwarded here: {remote}"))
            return
        try:
            listeners = await trio.open_tcp_listeners(int(local[4:]), host=HOST)
        except OSError as exc:
            await send(fail(f"cannot bind listener: {exc}"))
            return
        port = listeners[0].socket.getsockname()[1]
        scope = trio.CancelScope()
        self.forwards[port] = (int(raw_pid), scope)

        async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                task_status.started()
                await trio.serve_listeners(partial(self.forwarded, raw_pid), listeners)

        assert self.nursery is not None
        await self.nursery.start(serve)
        await send(b"OKAYOKAY" + record(str(port).encode()))


async def bridge(client: trio.SocketStream, backend: trio.SocketStream, pending: bytes) -> None:
    """Relay bytes both ways until either side closes. When the VM's side ends first, the
    client's side is kept open (what it sends is dropped) until the client closes it, for at
    most HOLD_AFTER_VM_EOF seconds."""
    client_closed = False
    async with backend:
        if pending:
            await backend.send_all(pending)
        async with trio.open_nursery() as nursery:

            async def pump(source: trio.SocketStream, sink: trio.SocketStream) -> None:
                nonlocal client_closed
                try:
                    while data := await source.receive_some(65536):
                        await sink.send_all(data)
                    client_closed = client_closed or source is client
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, client, backend)
            nursery.start_soon(pump, backend, client)
    if not client_closed:
        with trio.move_on_after(HOLD_AFTER_VM_EOF):
            try:
                while await client.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass


def parse_pid(text: str) -> tuple[int, int]:
    pid, sep, port = text.partition("=")
    if not (sep and pid.isdigit() and port.isdigit() and 0 < int(port) < 65536):
        raise argparse.ArgumentTypeError(f"expected PID=PORT (numbers), got {text!r}")
    return int(pid), int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serial", required=True, help="the fake device's serial number")
    parser.add_argument(
        "--pid", type=parse_pid, action="append", default=[], help="PID=PORT: jdwp:PID leads there"
    )
    parser.add_argument("--port", type=int, default=0, help="where to listen (0: a free port)")
    args = parser.parse_args(argv)
    server = Server(args.serial, dict(args.pid), args.port)
    with contextlib.suppress(KeyboardInterrupt):
        trio.run(server.run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
