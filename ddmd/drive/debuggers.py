"""The VM driver's debugger side: accepting a debugger, its reader task, its departure, and
the per-VM debugger port.

Layer: trio only; mixed into ``VmDriver`` (drive/vm.py), whose session decides everything (the
debugger's bytes go to ``VmSession`` through the relay lane or ``handle``; what it answers is
carried out by the driver's ``_act``).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog
import trio

from ddmd.config import Config
from ddmd.drive.debugger import (
    DIRECT_SEND_LIMIT,
    SLOW_CONSUMER,
    DebuggerConnection,
    Outbox,
    OutboxBroken,
    send_relayed,
)
from ddmd.drive.ports import VmPorts, accept_loop, close_with_reason
from ddmd.drive.threadlane import RECEIVE_SIZE, ThreadLane, socket_of
from ddmd.logs import Event
from ddmd.registry import VmRegistry
from ddmd.session.commands import Command, Log, SendToDebugger
from ddmd.session.consumers import DEBUGGER, FRONT, ConsumerKind
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    ConsumerNamed,
    Input,
)
from ddmd.session.model import DebuggerSnapshot
from ddmd.session.vm import VmSession
from ddmd.toolnames import peer_process

__all__ = ["DEBUGGER_BUDGET", "DebuggerSide"]

#: How DDM clients that are not VMs (``ddmd.client``: ``ddmd sysmon``) name their "VM".
CLIENT_IDENT = "ddmd.client "
#: The name of a front forward's client that cannot be looked up (another user's, gone).
FORWARD_TOOL = "adb forward"
#: Bytes that may wait for one debugger before it counts as too slow (pieces of a large
#: packet wait here while the debugger reads the ones before).
DEBUGGER_BUDGET = 4 << 20


class DebuggerSide:
    """Mixed into ``VmDriver``: its debuggers and its per-VM port."""

    _session: VmSession
    _config: Config
    _registry: VmRegistry
    _ports: VmPorts | None
    _nursery: trio.Nursery | None
    _debuggers: dict[int, DebuggerConnection]
    _numbers: itertools.count[int]
    _timer_changed: trio.Event
    _dirty: list[Outbox]
    _lane: ThreadLane
    _write_now: Callable[[], bool]
    _vm: Outbox | None
    _port_key: str | None
    _debugger_port: int | None
    _slow_debuggers: int
    _vm_id: str
    _log: structlog.stdlib.BoundLogger

    if TYPE_CHECKING:  # VmDriver's

        def _feed(self, item: Input) -> None: ...

        def _act(self, command: Command) -> None: ...

        async def _flush(self, *, reads: Outbox | None = None) -> None: ...

        def selection_key(self) -> str | None: ...

    # ------------------------------------------------------------------ debuggers

    def _debugger_snapshots(self) -> tuple[DebuggerSnapshot, ...]:
        router = self._session.router
        out = []
        for d in self._debuggers.values():
            counts = router.debugger_statistics(d.number)
            if counts is None or not router.is_attached(d.number):
                continue
            packets_in, packets_out, _, _ = counts
            held = router.bridge.held_by(d.number)
            debugging = d.number in router.attached()
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
                )
            )
        return tuple(out)

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
        nursery = self._nursery
        if nursery is None:
            trio.lowlevel.spawn_system_task(close_with_reason, stream)
            return
        number = next(self._numbers)
        if via == "vm-port":
            port = self._debugger_port
        elif via == "current":
            port = self._config.debugger.current_port
        else:
            port = None  # a front socket: the port is the front's, or a forward's
        outbox = Outbox(
            stream,
            budget=DEBUGGER_BUDGET,
            limit=self._config.timeouts.jdwp_request,
            max_packets=self._config.debugger.queue_packets,
        )
        debugger = DebuggerConnection(
            number, stream, peer, via, port, outbox, since=time.time(), tool=tool
        )
        outbox.owner = debugger
        self._debuggers[number] = debugger
        self._timer_changed.set()  # the watchdog looks at writes while debuggers are here
        self._feed(ConsumerJoined(number, via, peer, kind, tool))
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
        self._feed(ConsumerNamed(debugger.number, tool))

    async def _serve_debugger(self, debugger: DebuggerConnection) -> None:
        reason = "debugger closed the connection"
        with debugger.scope:
            deadline = trio.current_time() + self._config.timeouts.handshake
            session = self._session
            router = session.router
            sock = socket_of(debugger.stream) if self._lane.applies else None
            try:
                while not debugger.gone:
                    if (
                        sock is not None
                        and self._lane.running
                        and router.is_attached(debugger.number)
                    ):
                        # The relay lane's thread reads it (threadlane.py) while it runs.
                        if await self._lane.serve_debugger(debugger, sock):
                            break
                        continue
                    if router.is_attached(debugger.number) or router.is_waiting(debugger.number):
                        data = await debugger.stream.receive_some(RECEIVE_SIZE)
                    else:  # the handshake has a deadline; an attached debugger may be idle
                        with trio.move_on_at(deadline) as scope:
                            data = await debugger.stream.receive_some(RECEIVE_SIZE)
                        if scope.cancelled_caught:
                            self._log.warning(
                                Event.DEBUGGER_HANDSHAKE_TIMED_OUT, peer=debugger.peer
                            )
                            reason = "handshake timed out"
                            break
                    data = bytes(data)  # trio gives bytes: no copy
                    relayed = session.relay_debugger(debugger.number, data)
                    later: list[Command] = []
                    if relayed is not None:
                        vm = self._vm
                        if vm is None or not send_relayed(vm, relayed.data, self._dirty):
                            later.append(relayed)
                    if await self._debugger_read_rest(
                        debugger, data if relayed is None else None, later
                    ):
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                reason = f"connection error: {exc}"
        self._leave(debugger, debugger.end_reason or reason)

    async def _debugger_read_rest(
        self, debugger: DebuggerConnection, data: bytes | None, later: Sequence[Command]
    ) -> bool:
        """A debugger's read after the relay lane's try, in the event loop (also for the relay
        thread): ``data`` the session has not seen yet (b"": the end), ``later`` commands a
        relay thread left; then the writes. True when its reader must stop."""
        if debugger.gone:
            return True
        for command in later:
            self._act(command)
        if data is not None:
            self._feed(ConsumerBytes(debugger.number, data))
        if self._dirty and not self._write_now():
            debugger.writing = True
            try:
                await self._flush(reads=debugger.outbox)
            finally:
                debugger.writing = False
        elif data is None and not later:
            await trio.lowlevel.cancel_shielded_checkpoint()  # design.md: relay lane
        return debugger.end_reason is not None or data == b""

    def _to_debugger(self, relayed: SendToDebugger) -> None:
        """The relay lane's reply, written at once when the debugger's outbox is idle."""
        to = self._debuggers.get(relayed.debugger)
        if to and not to.gone and not send_relayed(to.outbox, relayed.data, self._dirty):
            self._act(relayed)

    def _add_debugger_fields(self, command: Log) -> None:
        debugger = self._debuggers.get(int(command.fields.get("debugger", 0)))
        if debugger is not None:
            command.fields.update(peer=debugger.peer, via=debugger.via, port=debugger.port)

    def _leave(self, debugger: DebuggerConnection, reason: str) -> None:
        """The debugger's connection is over: tell the session (once) and close it."""
        if not debugger.gone:
            debugger.gone = True
            self._feed(ConsumerLeft(debugger.number, reason))
        debugger.end(reason)
        if self._nursery is not None:
            self._nursery.start_soon(self._close_debugger, debugger, reason)

    def _drop_slow(self, debugger: DebuggerConnection, *, waited: float | None = None) -> None:
        self._slow_debuggers += 1
        why: dict[str, object] = (
            {"waited": waited}
            if waited is not None
            else {"queue": debugger.outbox.max_packets, "queued_bytes": debugger.outbox.queued}
        )
        self._log.warning(Event.DEBUGGER_SLOW_CONSUMER, peer=debugger.peer, **why)
        debugger.outbox.broken = SLOW_CONSUMER
        self._leave(debugger, SLOW_CONSUMER)

    async def _close_debugger(self, debugger: DebuggerConnection, reason: str) -> None:
        """Write what is queued for it (a Dispose reply), briefly, then close it."""
        if self._debuggers.pop(debugger.number, None) is None:
            return
        if not self._debuggers:
            self._lane.stop()  # the VM's socket goes back to the event loop at once
        outbox = debugger.outbox
        with trio.move_on_after(DIRECT_SEND_LIMIT):
            await outbox.wait_idle()  # another task may be writing to it: let it finish
            if outbox.broken is None and outbox.queue:
                with contextlib.suppress(OutboxBroken):
                    await outbox.flush(trio.current_time())
        debugger.end(reason)
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            with contextlib.suppress(Exception):
                await debugger.stream.aclose()

    # ------------------------------------------------------------------ the per-VM port

    def _maybe_listen(self) -> None:
        """Open the per-VM debugger port once the VM has a stable key."""
        if self._ports is None or self._port_key is not None or self._nursery is None:
            return
        key = self.selection_key()
        if key is None:
            return
        if (self._session.model.vm_ident or "").startswith(CLIENT_IDENT):
            return  # a DDM client that is no VM (ddmd sysmon): nothing to debug
        self._port_key = key
        self._nursery.start_soon(self._serve_port, key)

    async def _serve_port(self, key: str) -> None:
        assert self._ports is not None
        opened = await self._ports.open_for(key)
        if opened is None:
            return
        listener, port = opened
        self._debugger_port = port
        self._registry.changed(self._vm_id)
        self._log.info(Event.DEBUGGER_LISTENING, port=port, via="vm-port", key=key)
        try:
            await accept_loop(
                listener, lambda stream, peer: self.adopt_debugger(stream, peer, via="vm-port")
            )
        finally:
            self._ports.release(port)
            self._debugger_port = None
