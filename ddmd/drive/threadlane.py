"""The VM driver's relay lane in threads: the loops that read a VM's socket, and each attached
debugger's, while the VM has debuggers (``relaythreads.py`` says why and how they share state).

Layer: trio and ``ddmd.drive``; no protocol decisions. Composed into ``VmDriver``.

Each loop does, per read, what the trio reader does on the fast lane, holding the step lock:
hand the bytes to the session's relay lane and write the one packet it returns at once. Whatever
else a read needs (the general path, a write the socket did not take whole, a debugger leaving)
is done by the trio reader's own code, run in trio with ``trio.from_thread.run`` while the loop
waits, so the order of packets and every rule of the trio side stay as they were.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ddmd.drive.debugger import DebuggerConnection, Outbox
from ddmd.drive.relaythreads import ThreadReader, run_in_thread, step_lock
from ddmd.session.commands import SendToDebugger, SendToVm

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

__all__ = ["RECEIVE_SIZE", "LaneCounts", "ThreadLane", "socket_of", "uses_threads"]

RECEIVE_SIZE = 65536

#: What the trio side does with a VM read the loop could not finish: (bytes, the relay lane's
#: packet or None, that packet again when it still has to be queued). Returns why the VM
#: connection ends, or None.
VmRest = Callable[[bytes, SendToDebugger | None, SendToDebugger | None], Awaitable[str | None]]
#: The same for a debugger's read: (debugger, bytes, packet or None, packet to queue or None);
#: returns True when the debugger's reader must stop.
DebuggerRest = Callable[
    [DebuggerConnection, bytes, SendToVm | None, SendToVm | None], Awaitable[bool]
]


def uses_threads(setting: str, source: str) -> bool:
    """Whether a VM's debugger traffic takes the relay threads: ``[debugger] relay_threads`` is
    "all", or "local" and the VM was found by the port scan (source "tcp"). Behind an adb
    server the event loop relays: there, on a 2-core machine, two threads per VM added more
    latency than they saved (docs/design.md, "The relay lane")."""
    return setting == "all" or (setting == "local" and source == "tcp")


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket a relay thread can read, when the stream is a plain socket."""
    return stream.socket if isinstance(stream, trio.SocketStream) else None


@dataclass(slots=True)
class LaneCounts:
    """Reads of a VM's sockets: those the threads relayed whole, those they handed to trio."""

    relayed: int = 0
    handed: int = 0
    packets_in: int = 0  # reads of the VM's socket (by a thread or by trio)
    bytes_in: int = 0

    def statistics(self) -> dict[str, int]:
        """For ``bridge_statistics``: reads the threads passed on whole, and those they handed
        to the event loop."""
        return {"thread_relayed": self.relayed, "thread_handed": self.handed}


class ThreadLane:
    """The two loops, for one VM driver."""

    def __init__(
        self,
        session: VmSession,
        debuggers: dict[int, DebuggerConnection],
        dirty: list[Outbox],
        vm_outbox: Callable[[], Outbox | None],
    ) -> None:
        self._session = session
        self._debuggers = debuggers
        self._dirty = dirty
        self._vm_outbox = vm_outbox
        self.counts = LaneCounts()
        self.applies = True  # the VM's debugger traffic takes the threads (`uses_threads`)

    # ------------------------------------------------------------------ the VM's socket

    async def read_vm(self, sock: trio.socket.SocketType, rest: VmRest) -> str | None:
        """Read the VM in a thread until no debugger is left (None: go on in trio) or the
        connection ends (why). Raises OSError when the socket fails."""
        reader = ThreadReader(sock)
        lock = step_lock()
        return await run_in_thread(reader, lambda: self._vm_loop(reader, lock, rest))

    def _vm_loop(self, reader: ThreadReader, lock: threading.Lock, rest: VmRest) -> str | None:
        session, debuggers, counts = self._session, self._debuggers, self.counts
        while debuggers:
            data = reader.read(RECEIVE_SIZE)
            if data is None:
                return None
            if not data:
                return trio.from_thread.run(rest, b"", None, None)
            with lock:
                counts.packets_in += 1
                counts.bytes_in += len(data)
                relayed = session.relay_vm(data)
                queue: SendToDebugger | None = None
                if relayed is not None:
                    to = debuggers.get(relayed.debugger)
                    if to is None or to.gone:
                        counts.relayed += 1
                        continue  # the trio path drops it too
                    written = to.outbox.send_now(relayed.data)
                    if written:
                        counts.relayed += 1
                        continue
                    if written is None:
                        queue = relayed  # the outbox is busy: queued behind what waits
                    else:
                        self._dirty.append(to.outbox)  # the rest is queued: flushed in trio
                counts.handed += 1
            reason = trio.from_thread.run(rest, data, relayed, queue)
            if reason is not None:
                return reason
        return None

    # ------------------------------------------------------------------ a debugger's socket

    async def read_debugger(
        self, debugger: DebuggerConnection, sock: trio.socket.SocketType, rest: DebuggerRest
    ) -> bool:
        """Read an attached debugger in a thread until it must stop (True) or the thread was
        woken (False: go on in trio). Raises OSError when the socket fails."""
        reader = ThreadReader(sock)
        lock = step_lock()
        return await run_in_thread(
            reader, lambda: self._debugger_loop(debugger, reader, lock, rest)
        )

    def _debugger_loop(
        self,
        debugger: DebuggerConnection,
        reader: ThreadReader,
        lock: threading.Lock,
        rest: DebuggerRest,
    ) -> bool:
        session, counts, number = self._session, self.counts, debugger.number
        while debugger.end_reason is None and not debugger.gone:
            data = reader.read(RECEIVE_SIZE)
            if data is None:
                return False
            queue: SendToVm | None = None
            relayed: SendToVm | None = None
            with lock:
                if data and debugger.end_reason is None and not debugger.gone:
                    relayed = session.relay_debugger(number, data)
                    if relayed is not None:
                        vm = self._vm_outbox()
                        written = vm.send_now(relayed.data) if vm is not None else None
                        if written:
                            counts.relayed += 1
                            continue
                        if written is None:
                            queue = relayed
                        else:
                            assert vm is not None
                            self._dirty.append(vm)
                counts.handed += 1
            if trio.from_thread.run(rest, debugger, data, relayed, queue):
                return True
        return True
