"""Debugger listening ports: one per VM, plus the current-VM port (default 8700).

Layer: trio, structlog, config, errors, logs, registry, the port book (``ddmd.portbook``,
the persisted app -> port table) and ``ddmd.peers`` (the peer-uid rule). Accepts connections
and hands each one to the right VM's driver (which serves it in its own nursery, so a debugger
never outlives its VM). No JDWP parsing here. With a `PeerGuard`, every listener here is a
`GuardedListener`: a connection from a user who may not connect is closed before it is handed
to anyone.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import structlog
import trio

from ddmd.config import is_loopback_host
from ddmd.errors import PortInUse
from ddmd.logs import Event
from ddmd.peers import GuardedListener, PeerGuard, PortKind
from ddmd.portbook import PortBook
from ddmd.registry import VmRegistry

log = structlog.get_logger("ddmd.ports")

# Called with the accepted stream and the peer's "host:port"; must not block.
Acceptor = Callable[[trio.SocketStream, str], None]
Listener = trio.abc.Listener[trio.SocketStream]


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


async def open_listener(host: str, port: int, *, key: str) -> trio.SocketListener:
    """Bind one TCP listener; a taken port raises PortInUse naming ``key``."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(port, key, host) from exc
        raise
    if not is_loopback_host(host):
        log.warning(Event.LISTENER_NON_LOOPBACK, host=host, port=port, key=key)
    return listeners[0]


def guarded(listener: trio.SocketListener, guard: PeerGuard | None, kind: PortKind) -> Listener:
    """`listener` behind the peer-uid rule (as it is without a guard)."""
    return listener if guard is None else GuardedListener(listener, guard, kind)


async def accept_loop(listener: Listener, accept: Acceptor) -> None:
    """Accept until cancelled; the listener is closed on the way out. A guarded listener checks
    its connections concurrently (`GuardedListener.serve`): a slow check, or a flood of them,
    never holds up the next accept."""
    async with listener:
        if isinstance(listener, GuardedListener):
            await listener.serve(lambda stream: accept(stream, peer_name(stream)))
            return
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                # Out of file descriptors and similar: wait a moment rather than spin.
                log.warning(Event.LISTENER_ACCEPT_FAILED, error=str(exc))
                await trio.sleep(0.1)
                continue
            accept(stream, peer_name(stream))


async def close_with_reason(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        await stream.aclose()


class CurrentVmListener:
    """The current-VM port: each connection goes to whatever VM is current at accept time."""

    def __init__(
        self, registry: VmRegistry, host: str, port: int, *, guard: PeerGuard | None = None
    ) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._guard = guard
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listener = await open_listener(self._host, self._port, key="debugger.current_port")
        bound = listener.socket.getsockname()[1]
        log.info(Event.DEBUGGER_LISTENING, port=bound, via="current")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(bound)
            await accept_loop(guarded(listener, self._guard, "current_port"), self._accept)

    def _accept(self, stream: trio.SocketStream, peer: str) -> None:
        handle = self._registry.current()
        if handle is None:
            log.warning(
                Event.DEBUGGER_REJECTED,
                peer=peer,
                port=self._port,
                reason="no current VM: select one with 'ddmd select TARGET'",
                vms=len(self._registry),
            )
            assert self._nursery is not None
            self._nursery.start_soon(close_with_reason, stream)
            return
        handle.adopt_debugger(stream, peer, via="current")


#: Seconds between a VM getting its port and the book's write (`VmPorts.run_saver`).
SAVE_DELAY = 1.0
#: Seconds the last write may take when the daemon stops.
FINAL_SAVE_TIMEOUT = 2.0


class VmPorts:
    """Hands out per-VM debugger ports from the configured range, using the PortBook so an app
    gets the same port after a restart. A port taken by another program is skipped (logged)."""

    def __init__(self, book: PortBook, host: str, *, guard: PeerGuard | None = None) -> None:
        self._book = book
        self._host = host
        self._guard = guard
        self._in_use: set[int] = set()
        self._saving = False
        self._dirty = False
        self._saver: trio.Event | None = None  # set while `run_saver` runs: wake it
        for problem in book.problems:
            log.warning(Event.PORTS_STATE_PROBLEM, problem=problem)

    async def open_for(self, key: str) -> tuple[Listener, int] | None:
        for port in self._book.candidates(key, set(self._in_use)):
            if port in self._in_use:
                continue
            # Reserve before the (async) bind, so VMs starting together never race for it.
            self._in_use.add(port)
            try:
                listener = await open_listener(self._host, port, key="debugger.ports")
            except PortInUse:
                self._in_use.discard(port)
                log.warning(
                    Event.DEBUGGER_PORT_SKIPPED, port=port, reason="in use by another program"
                )
                continue
            except BaseException:
                self._in_use.discard(port)
                raise
            self._book.record(key, port)
            if self._saver is not None:
                self._saver.set()  # written a moment later, with the VMs starting meanwhile
            else:
                await self._save()
            return guarded(listener, self._guard, "vm_port"), port
        log.error(
            Event.DEBUGGER_PORT_SKIPPED,
            key=key,
            reason="no free port left in [debugger] ports",
        )
        return None

    def release(self, port: int) -> None:
        self._in_use.discard(port)

    @property
    def book(self) -> PortBook:
        return self._book

    async def run_saver(self, delay: float = SAVE_DELAY) -> None:
        """Write the book after VMs got their ports, ``delay`` seconds after the first of them:
        hundreds of VMs opening together cost one write, and none waits for it. What changed
        is written before this task ends (the daemon stops)."""
        try:
            while True:
                self._saver = trio.Event()
                await self._saver.wait()
                await trio.sleep(delay)
                await self._save()
        finally:
            pending = self._saver is not None and self._saver.is_set()
            self._saver = None
            if pending:
                with trio.CancelScope(shield=True), trio.move_on_after(FINAL_SAVE_TIMEOUT):
                    await self._save()

    async def save(self) -> None:
        """Write the book now (after the control API or the daily clean-up changed it)."""
        await self._save()

    async def _save(self) -> None:
        """Write the state file from one task at a time; changes made meanwhile are folded
        into one more write (hundreds of VMs starting together cause a few writes)."""
        self._dirty = True
        if self._saving:
            return
        self._saving = True
        try:
            while self._dirty:
                self._dirty = False
                # The content is taken here, in the trio thread that changes the book; only
                # the write runs in a worker thread.
                data = self._book.dumps()
                try:
                    await trio.to_thread.run_sync(self._book.write, data)
                except OSError as exc:
                    log.warning(Event.PORTS_STATE_PROBLEM, problem=f"cannot save: {exc}")
        finally:
            self._saving = False
