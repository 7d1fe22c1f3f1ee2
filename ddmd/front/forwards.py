"""The front's own forwards: ``adb forward tcp:N jdwp:PID`` served by ddmd.

Layer: trio, structlog, logs, `peers` (the peer-uid rule), `drive.ports` (listener helpers),
`protocol.adbwire` and the front's hub, relay, tools and upstream modules.

A forward is a listener on 127.0.0.1:N (like adb's server, which binds the loopback address
for ``tcp:N``). Every connection accepted there, once the peer-uid check admits it, is handed
to the VM as one more consumer (`VmHub`; nothing is sent on it: the client's JDWP handshake
comes raw, as through adb's own forwards). A connection that arrives while ddmd does not hold
the VM waits up to ``[front] open_timeout`` for it and is then closed (the client sees EOF,
as when a device refuses ``jdwp:PID``).

Forwards go away with ``killforward``/``killforward-all`` through the front, when ddmd stops,
and when their device leaves the real server's device list (adb's server drops its listeners
when the transport goes): while the front owns forwards it follows ``host:track-devices``.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Final

import structlog
import trio

from ddmd.drive.ports import accept_loop, guarded
from ddmd.front.hub import VmHub
from ddmd.front.relay import UpstreamReplies, UpstreamSilent, close_now
from ddmd.front.upstream import Upstream, UpstreamUnavailable
from ddmd.logs import Event
from ddmd.peers import PeerGuard
from ddmd.protocol.adbrequests import forward_line, request
from ddmd.protocol.adbwire import AdbMalformed, RecordDecoder, parse_devices

__all__ = ["FORWARD_HOST", "BindFailed", "FrontForward", "FrontForwards"]

log = structlog.get_logger("ddmd.front")

#: Where forwards listen: adb's server binds the loopback address for ``tcp:N``.
FORWARD_HOST: Final = "127.0.0.1"
#: Seconds between attempts to follow the device list after it failed.
WATCH_RETRY: Final = 2.0
#: The tool name of a forward's connection whose process cannot be found.


class BindFailed(Exception):
    """The port could not be bound; ``message`` is adb's wording."""

    def __init__(self, port: int, exc: OSError) -> None:
        self.port = port
        self.in_use = exc.errno == errno.EADDRINUSE
        self.message = f"cannot bind listener: {exc.strerror or exc}"
        super().__init__(self.message)


@dataclass(eq=False)
class FrontForward:
    """One forward ``tcp:PORT -> jdwp:PID`` of device SERIAL."""

    serial: str
    pid: int
    port: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    connections: int = 0

    @property
    def local(self) -> str:
        return f"tcp:{self.port}"

    @property
    def remote(self) -> str:
        return f"jdwp:{self.pid}"

    @property
    def vm(self) -> str:
        return f"{self.serial}/{self.pid}"


class FrontForwards:
    """The forward table and its listeners; `run` owns their tasks (cancelled: all closed)."""

    def __init__(
        self,
        hub: VmHub,
        upstream: Upstream,
        guard: PeerGuard | None,
        *,
        open_timeout: float,
    ) -> None:
        self._hub = hub
        self._upstream = upstream
        self._guard = guard
        self._open_timeout = open_timeout
        self._table: dict[int, FrontForward] = {}
        self._nursery: trio.Nursery | None = None
        self._watch: trio.CancelScope | None = None
        self.connections = 0  # accepted connections handed to VMs
        self.refused = 0  # accepted connections closed: no VM

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._table.clear()

    # ------------------------------------------------------------------ the table

    def __len__(self) -> int:
        return len(self._table)

    def get(self, port: int) -> FrontForward | None:
        return self._table.get(port)

    def per_device(self) -> dict[str, int]:
        """How many forwards each device's VMs have (by serial)."""
        out: dict[str, int] = {}
        for forward in self._table.values():
            out[forward.serial] = out.get(forward.serial, 0) + 1
        return out

    def lines(self) -> list[bytes]:
        """``list-forward`` lines, in the order the forwards were made."""
        return [forward_line(f.serial, f.local, f.remote) for f in self._table.values()]

    async def add(self, serial: str, pid: int, port: int) -> int:
        """Listen on `port` (0: any free port) for device `serial`'s VM `pid`; the bound port.
        `BindFailed` when the port cannot be bound."""
        assert self._nursery is not None, "FrontForwards.run first"
        try:
            listeners = await trio.open_tcp_listeners(port, host=FORWARD_HOST)
        except OSError as exc:
            raise BindFailed(port, exc) from exc
        listener = listeners[0]
        bound = int(listener.socket.getsockname()[1])
        forward = FrontForward(serial, pid, bound)
        self._table[bound] = forward
        self._nursery.start_soon(self._serve, forward, listener)
        self._ensure_watch()
        log.info(Event.FRONT_FORWARD_ADDED, vm=forward.vm, port=bound, local=forward.local)
        return bound

    def retarget(self, port: int, serial: str, pid: int) -> None:
        """Point the front's forward on `port` at another VM (``forward`` without norebind
        on a port that is already one)."""
        forward = self._table[port]
        forward.serial, forward.pid = serial, pid
        log.info(Event.FRONT_FORWARD_ADDED, vm=forward.vm, port=port, local=forward.local)

    def remove(self, port: int, reason: str) -> bool:
        forward = self._table.pop(port, None)
        if forward is None:
            return False
        forward.scope.cancel()
        log.info(
            Event.FRONT_FORWARD_REMOVED,
            vm=forward.vm,
            port=port,
            reason=reason,
            connections=forward.connections,
        )
        if not self._table and self._watch is not None:
            self._watch.cancel()
        return True

    def remove_all(self, reason: str) -> int:
        ports = list(self._table)
        for port in ports:
            self.remove(port, reason)
        return len(ports)

    # ------------------------------------------------------------------ connections

    async def _serve(self, forward: FrontForward, listener: trio.SocketListener) -> None:
        """Accept on the forward's port until it is removed."""
        nursery = self._nursery
        assert nursery is not None

        def accept(stream: trio.SocketStream, peer: str) -> None:
            nursery.start_soon(self._hand_over, forward, stream, peer)

        with forward.scope:
            await accept_loop(guarded(listener, self._guard, "front_forward"), accept)

    async def _hand_over(self, forward: FrontForward, stream: trio.SocketStream, peer: str) -> None:
        serial, pid = forward.serial, forward.pid
        handed = False
        try:
            target = self._hub.find(serial, pid)
            if target is None:
                with trio.move_on_after(self._open_timeout):
                    target = await self._hub.wait_for(serial, pid)
            if target is None:
                self.refused += 1
                log.info(
                    Event.FRONT_FORWARD_REFUSED,
                    vm=forward.vm,
                    port=forward.port,
                    peer=peer,
                    reason=f"ddmd does not hold that VM (waited {self._open_timeout:g} s)",
                )
                return
            forward.connections += 1
            self.connections += 1
            # Handed over at once: the VM's driver names the program on the other end after
            # the hand-over ("adb forward" when it cannot), so the handshake waits for nothing.
            target.adopt_consumer(stream, peer, via="front-forward")
            log.info(Event.FRONT_FORWARD_CONNECTED, vm=target.vm_id, port=forward.port, peer=peer)
            handed = True
        except Exception:  # a bug must cost one connection, never the front
            log.exception(Event.FRONT_CLIENT_FAILED, peer=peer, port=forward.port)
        finally:
            if not handed:
                await close_now(stream)

    # ------------------------------------------------------------------ devices

    def _ensure_watch(self) -> None:
        if self._watch is not None or self._nursery is None:
            return
        self._watch = trio.CancelScope()
        self._nursery.start_soon(self._follow_devices, self._watch)

    async def _follow_devices(self, scope: trio.CancelScope) -> None:
        """While forwards exist: drop those whose device left the server's device list."""
        try:
            with scope:
                while self._table:
                    try:
                        await self._track_once()
                    except (UpstreamUnavailable, UpstreamSilent, AdbMalformed, OSError):
                        pass  # no server now: its forwards are gone too; ours wait for the list
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    except Exception:  # a bug must not stop the forwards
                        log.exception(Event.FRONT_CLIENT_FAILED, peer="host:track-devices")
                    await trio.sleep(WATCH_RETRY)
        finally:
            if self._watch is scope:
                self._watch = None

    async def _track_once(self) -> None:
        stream = await self._upstream.connect(start=False)
        try:
            await stream.send_all(request("host:track-devices"))
            replies = UpstreamReplies(stream, self._upstream.reply_timeout)
            if await replies.status() != b"OKAY":
                return
            decoder = RecordDecoder()
            decoder.receive_data(replies.take_buffer())
            while True:
                while (record := decoder.next_record()) is not None:
                    self._devices_now(record)
                data = await stream.receive_some(65536)
                if not data:
                    return
                decoder.receive_data(data)
        finally:
            await close_now(stream)

    def _devices_now(self, record: bytes) -> None:
        """One device list: forwards of devices no longer listed go (a device listed as
        offline keeps them, as adb's server keeps the listeners of a transport it still has)."""
        devices, _ = parse_devices(record)
        listed = {d.serial for d in devices}
        for forward in list(self._table.values()):
            if forward.serial not in listed:
                self.remove(forward.port, "its device is gone")
