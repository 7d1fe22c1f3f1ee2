"""The VM driver's debuggers: their table, accepting one, its reader task, its departure, and
the per-VM debugger port.

Layer: trio only; a part of ``VmDriver`` (drive/vm.py), seen through its ``core.Core``. The
session decides everything: a debugger's bytes go through ``relay.Relay`` (the relay lane, else
the session), and what the session answers is carried out by the one executor.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence

import trio

from ddmd.config import Config
from ddmd.drive.core import Core
from ddmd.drive.debugger import (
    DIRECT_SEND_LIMIT,
    SLOW_CONSUMER,
    DebuggerConnection,
    Outbox,
    OutboxBroken,
)
from ddmd.drive.ports import VmPorts, accept_loop, close_with_reason
from ddmd.drive.relay import Left, Relay
from ddmd.drive.threadlane import RECEIVE_SIZE, ThreadLane, socket_of
from ddmd.drive.writes import PendingWrites
from ddmd.logs import Event
from ddmd.registry import VmRegistry
from ddmd.session.commands import Command
from ddmd.session.consumers import DEBUGGER, FRONT, ConsumerKind
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    ConsumerNamed,
)
from ddmd.session.model import DebuggerSnapshot
from ddmd.session.vm import VmSession
from ddmd.toolnames import peer_process

__all__ = ["DEBUGGER_BUDGET", "Debuggers"]

#: How DDM clients that are not VMs (``ddmd.client``: ``ddmd sysmon``) name their "VM".
CLIENT_IDENT = "ddmd.client "
#: The name of a front forward's client that cannot be looked up (another user's, gone).
FORWARD_TOOL = "adb forward"
#: Bytes that may wait for one debugger before it counts as too slow, by default (``[debugger]
#: queue_bytes``; pieces of a large packet wait here while the debugger reads the ones before).
DEBUGGER_BUDGET = 16 << 20


class Debuggers:
    """A VM driver's debuggers (``table``, by number; the writes look their outboxes up in it)
    and its per-VM port (``port`` while it is open)."""

    def __init__(
        self,
        core: Core,
        session: VmSession,
        *,
        vm_id: str,
        config: Config,
        registry: VmRegistry,
        ports: VmPorts | None,
        writes: PendingWrites,
        relay: Relay,
        lane: ThreadLane,
        wake_timer: Callable[[], None],
    ) -> None:
        self._core = core
        self._session = session
        self._vm_id = vm_id
        self._config = config
        self._registry = registry
        self._ports = ports
        self._writes = writes
        self._relay = relay
        self._lane = lane
        self._wake_timer = wake_timer
        self.table: dict[int, DebuggerConnection] = writes.debuggers
        self._numbers = itertools.count(1)
        self._port_key: str | None = None
        self.port: int | None = None
        self.slow = 0  # debuggers dropped for not reading (``bridge_statistics``)

    # ------------------------------------------------------------------ debuggers

    def snapshots(self) -> tuple[DebuggerSnapshot, ...]:
        """The attached debuggers, for the VM's snapshot."""
        state = self._session.consumer_state
        out = []
        for d in self.table.values():
            found = state(d.number)
            if found is None:
                continue
            packets_in, packets_out, held, debugging = found
            out.append(
                DebuggerSnapshot(
                    d.peer,
                    d.via,
                    d.port,
                    d.since,
                    packets_in,
                    packets_out,
                    held,
                    d.tool,
                    debugging,
                    d.pid,
                    _suspended_since(d, held),
                )
            )
        return tuple(out)

    def stamp_suspensions(self) -> None:
        """Note since when each debugger holds a suspension (``suspended_since``). The session
        has no clock: the watchdog calls this while debuggers are attached (every
        ``timer.WATCHDOG_PERIOD``), and so does every snapshot, so a suspension is stamped at
        most that long after it began."""
        state = self._session.consumer_state
        for d in self.table.values():
            found = state(d.number)
            _suspended_since(d, 0 if found is None else found[2])

    def adopt_consumer(
        self, stream: trio.SocketStream, peer: str, *, via: str, tool: str | None = None
    ) -> None:
        """Take a socket from the adb front (``ddmd.front.hub.ConsumerTarget``): a consumer of
        this VM that may speak DDM only, or debug too (session/consumers.py)."""
        self.adopt_debugger(stream, peer, via=via, kind=FRONT, tool=tool)

    def adopt_debugger(
        self,
        stream: trio.abc.Stream,
        peer: str,
        *,
        via: str,
        kind: ConsumerKind = DEBUGGER,
        tool: str | None = None,
    ) -> None:
        """Take an accepted debugger connection (sync; the driver runs it)."""
        nursery = self._core.nursery()
        if nursery is None:
            trio.lowlevel.spawn_system_task(close_with_reason, stream)
            return
        number = next(self._numbers)
        if via == "vm-port":
            port = self.port
        elif via == "current":
            port = self._config.debugger.current_port
        else:
            port = None  # a front socket: the port is the front's, or a forward's
        settings = self._config.debugger
        outbox = Outbox(
            stream,
            budget=settings.queue_bytes,
            limit=max(self._config.timeouts.jdwp_request, settings.pause_limit),
            max_packets=settings.queue_packets,
            quick=settings.pause_limit,  # a paused reader keeps its session this long
            writer=self._start_writer,
        )
        debugger = DebuggerConnection(
            number, stream, peer, via, port, outbox, since=time.time(), tool=tool
        )
        outbox.owner = debugger
        self.table[number] = debugger
        self._wake_timer()  # the watchdog looks at writes while debuggers are here
        self._core.feed(ConsumerJoined(number, via, peer, kind, tool))
        if not debugger.gone:
            nursery.start_soon(self._serve_debugger, debugger)
            if tool is None and isinstance(stream, trio.SocketStream):
                # A front forward's client that cannot be looked up is still "adb forward".
                fallback = FORWARD_TOOL if via == "front-forward" else None
                nursery.start_soon(self._name_debugger, debugger, stream, fallback)

    async def _name_debugger(
        self, debugger: DebuggerConnection, stream: trio.SocketStream, fallback: str | None
    ) -> None:
        """Name the program on the other end ("jdb", "Android Studio"), after the hand-over:
        the lookup reads socket and fd tables (milliseconds), which no handshake waits for."""
        found = await peer_process(stream)
        tool = found.tool if found is not None and found.tool else fallback
        if tool is None or debugger.gone:
            return
        debugger.tool = tool
        debugger.pid = found.pid if found is not None else None
        self._core.feed(ConsumerNamed(debugger.number, tool))

    async def _serve_debugger(self, debugger: DebuggerConnection) -> None:
        reason = "debugger closed the connection"
        with debugger.scope:
            deadline = trio.current_time() + self._config.timeouts.handshake
            session, lane, relay = self._session, self._lane, self._relay
            attached, waiting = session.consumer_attached, session.consumer_waiting
            sock = socket_of(debugger.stream) if lane.applies else None
            number = debugger.number
            try:
                while not debugger.gone:
                    if sock is not None and lane.running and attached(number):
                        # The relay lane's thread reads it (threadlane.py) while it runs.
                        if await lane.serve_debugger(debugger, sock):
                            break
                        continue
                    if attached(number) or waiting(number):
                        data = await debugger.stream.receive_some(RECEIVE_SIZE)
                    else:  # the handshake has a deadline; an attached debugger may be idle
                        with trio.move_on_at(deadline) as scope:
                            data = await debugger.stream.receive_some(RECEIVE_SIZE)
                        if scope.cancelled_caught:
                            self._core.log.warning(
                                Event.DEBUGGER_HANDSHAKE_TIMED_OUT, peer=debugger.peer
                            )
                            reason = "handshake timed out"
                            break
                    if not data or debugger.gone:  # the end: the session is told in the rest
                        if await self.read_rest(debugger, bytes(data), ()):
                            break
                        continue
                    left = relay.from_debugger(number, bytes(data), trio.current_time, True)
                    if await self._after_read(debugger, left):
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                reason = f"connection error: {exc}"
        self.leave(debugger, debugger.end_reason or reason)

    async def _after_read(self, debugger: DebuggerConnection, left: Left) -> bool:
        """A debugger's read in the event loop, after ``Relay.from_debugger``: what is left
        written (the relay lane's packet: one yield first). True when its reader must stop."""
        if left is None:
            await trio.lowlevel.cancel_shielded_checkpoint()  # design.md: relay lane
        elif left:
            self._core.carry_out(left)
        if type(left) is list and self._writes.dirty and not self._writes.write_now():
            await self._flush_reading(debugger)
        return debugger.end_reason is not None

    async def read_rest(
        self, debugger: DebuggerConnection, data: bytes | None, later: Sequence[Command]
    ) -> bool:
        """A debugger's read the relay thread hands to the event loop (``DebuggerRest``), and
        a trio reader's end: ``data`` the session has not seen yet (b"": the end), ``later``
        commands the thread left; then the writes. True when its reader must stop."""
        if debugger.gone:
            return True
        if later:
            self._core.carry_out(list(later))
        if data is not None:
            self._core.feed(ConsumerBytes(debugger.number, data))
        if self._writes.dirty and not self._writes.write_now():
            await self._flush_reading(debugger)
        elif data is None and not later:
            await trio.lowlevel.cancel_shielded_checkpoint()  # design.md: relay lane
        return debugger.end_reason is not None or data == b""

    async def _flush_reading(self, debugger: DebuggerConnection) -> None:
        debugger.writing = True
        try:
            await self._core.flush(reads=debugger.outbox)
        finally:
            debugger.writing = False

    def leave(self, debugger: DebuggerConnection, reason: str) -> None:
        """The debugger's connection is over: tell the session (once) and close it."""
        if not debugger.gone:
            debugger.gone = True
            self._core.feed(ConsumerLeft(debugger.number, reason))
        debugger.end(reason)
        nursery = self._core.nursery()
        if nursery is not None:
            nursery.start_soon(self._close, debugger, reason)

    def close(self, number: int, reason: str) -> None:
        """The session forgot the debugger (``CloseDebugger``): close its connection."""
        debugger = self.table.get(number)
        if debugger is not None:
            debugger.gone = True
            nursery = self._core.nursery()
            if nursery is not None:
                nursery.start_soon(self._close, debugger, reason)

    async def close_all(self, reason: str) -> None:
        for debugger in list(self.table.values()):
            await self._close(debugger, reason)

    def _start_writer(self, outbox: Outbox) -> bool:
        """A task of the debugger's own writes what its socket did not take at once, so the
        VM reader (and every other debugger) never waits for a reader that paused."""
        nursery = self._core.nursery()
        debugger = outbox.owner
        if nursery is None or not isinstance(debugger, DebuggerConnection):
            return False
        nursery.start_soon(self._write_behind, debugger)
        return True

    async def _write_behind(self, debugger: DebuggerConnection) -> None:
        try:
            await debugger.outbox.drain(trio.current_time())
        except OutboxBroken as exc:
            self.leave(debugger, str(exc))

    def drop_slow(self, number: int, *, waited: float | None = None) -> None:
        """A debugger that does not read what it is sent: dropped (a slow consumer)."""
        debugger = self.table[number]
        self.slow += 1
        why: dict[str, object] = (
            {"waited": waited}
            if waited is not None
            else {
                "queue": debugger.outbox.max_packets,
                "queued_packets": len(debugger.outbox.queue),
                "queued_bytes": debugger.outbox.queued,
                "queue_bytes": debugger.outbox.budget,
            }
        )
        self._core.log.warning(Event.DEBUGGER_SLOW_CONSUMER, peer=debugger.peer, **why)
        debugger.outbox.broken = SLOW_CONSUMER
        self.leave(debugger, SLOW_CONSUMER)

    def watchdog(self, now: float) -> None:
        """Drop a debugger whose write is overdue: the write then fails in the task doing it.
        Also stamps the suspensions (`stamp_suspensions`)."""
        self.stamp_suspensions()
        for debugger in list(self.table.values()):
            outbox = debugger.outbox
            if outbox.overdue(now) and not debugger.gone:
                self.drop_slow(debugger.number, waited=outbox.allowed)

    async def _close(self, debugger: DebuggerConnection, reason: str) -> None:
        """Write what is queued for it (a Dispose reply), briefly, then close it."""
        if self.table.pop(debugger.number, None) is None:
            return
        if not self.table:
            self._lane.stop()  # the VM's socket goes back to the event loop at once
        outbox = debugger.outbox
        try:
            with trio.move_on_after(DIRECT_SEND_LIMIT):
                await outbox.wait_idle()  # its writer may be writing to it: let it finish
                if outbox.broken is None and outbox.queue:
                    with contextlib.suppress(OutboxBroken):
                        await outbox.drain(trio.current_time(), claimed=False)  # in this task
        finally:
            # Also when the VM's nursery is cancelled meanwhile: the debugger sees the end.
            debugger.end(reason)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                with contextlib.suppress(Exception):
                    await debugger.stream.aclose()

    # ------------------------------------------------------------------ the per-VM port

    def maybe_listen(self) -> None:
        """Open the per-VM debugger port once the VM has a stable key."""
        nursery = self._core.nursery()
        if self._ports is None or self._port_key is not None or nursery is None:
            return
        key = self._session.selection_key()
        if key is None:
            return
        if (self._session.model.vm_ident or "").startswith(CLIENT_IDENT):
            return  # a DDM client that is no VM (ddmd sysmon): nothing to debug
        self._port_key = key
        nursery.start_soon(self._serve_port, key)

    async def _serve_port(self, key: str) -> None:
        assert self._ports is not None
        opened = await self._ports.open_for(key)
        if opened is None:
            return
        listener, port = opened
        self.port = port
        self._registry.changed(self._vm_id)
        self._core.log.info(Event.DEBUGGER_LISTENING, port=port, via="vm-port", key=key)
        try:
            await accept_loop(
                listener, lambda stream, peer: self.adopt_debugger(stream, peer, via="vm-port")
            )
        finally:
            self._ports.release(port)
            self.port = None


def _suspended_since(debugger: DebuggerConnection, held: int) -> float | None:
    """Since when (wall clock) ``debugger``, which holds ``held`` suspensions now, has held
    one without a break: stamped when first seen held, cleared when it holds none."""
    if held == 0:
        debugger.suspended_since = None
    elif debugger.suspended_since is None:
        debugger.suspended_since = time.time()
    return debugger.suspended_since
