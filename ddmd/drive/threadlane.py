"""The VM driver's relay lane in threads: the loops that read a VM's socket, and each attached
debugger's, while the VM has debuggers (``relaythreads.py`` says why and how they share state).

Layer: trio and ``ddmd.drive``; no protocol decisions. Composed into ``VmDriver``.

Each loop does, per read, what the trio reader does, holding the step lock: the relay lane's
packet is written at once; other bytes go to the session (``VmSession.handle``, a pure function)
and the commands it returns are carried out here as long as they need no event loop (packets
that fit their queues, log lines). Whatever is left (a call's answer, a debugger leaving, a
write the socket did not take whole) is done by the trio reader's own code, run in the event
loop with ``trio.from_thread.run`` while the loop waits: the order of packets and every rule of
the trio side stay as they were, and a hand-over (about 100 us here) is paid only then.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ddmd.drive.debugger import DebuggerConnection
from ddmd.drive.relaythreads import ThreadReader, run_in_thread, step_lock
from ddmd.drive.writes import PendingWrites
from ddmd.logs import Event
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.session.commands import Command, Log, SendToDebugger, SendToVm
from ddmd.session.inputs import DebuggerBytes, VmBytes

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

__all__ = ["RECEIVE_SIZE", "LaneCounts", "ThreadLane", "socket_of", "uses_threads"]

RECEIVE_SIZE = 65536

#: What the event loop does after a relay thread's read: (bytes the session has not seen: b"" at
#: the end of the stream, else None; commands the thread left to it, in order). For the VM it
#: returns why the connection ends, or None; for a debugger, True when its reader must stop.
VmRest = Callable[[bytes | None, Sequence[Command]], Awaitable[str | None]]
DebuggerRest = Callable[[DebuggerConnection, bytes | None, Sequence[Command]], Awaitable[bool]]


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
        self, session: VmSession, writes: PendingWrites, *, log: Callable[[Log], None]
    ) -> None:
        self._session = session
        self._debuggers = writes.debuggers
        self._dirty = writes.dirty
        self._vm_outbox = writes.vm
        self._queue_write = writes.queue
        self._write_now = writes.write_now
        self._log = log
        self.counts = LaneCounts()
        self.applies = True  # the VM's debugger traffic takes the threads (`uses_threads`)

    def _act_here(self, commands: list[Command]) -> list[Command]:
        """Carry out, in the relay thread, the commands that need no event loop (packets that
        fit their queues, log lines), in order, up to the first that does; return that one
        and the rest, for the event loop."""
        for i, command in enumerate(commands):
            if isinstance(command, SendToDebugger | SendToVm):
                if not self._queue_write(command):
                    return commands[i:]
            elif isinstance(command, Log):
                self._log(command)
            else:
                return commands[i:]
        return []

    def _written(self) -> bool:
        """Whether every packet queued is written now (the socket took it at once)."""
        return not self._dirty or self._write_now()

    # ------------------------------------------------------------------ the VM's socket

    async def read_vm(self, sock: trio.socket.SocketType, rest: VmRest) -> str | None:
        """Read the VM in a thread until no debugger is left (None: go on in trio) or the
        connection ends (why). Raises OSError when the socket fails."""
        reader = ThreadReader(sock)
        lock, clock = step_lock(), trio.lowlevel.current_clock()
        return await run_in_thread(reader, lambda: self._vm_loop(reader, lock, clock, rest))

    def _vm_loop(
        self, reader: ThreadReader, lock: threading.Lock, clock: trio.abc.Clock, rest: VmRest
    ) -> str | None:
        session, debuggers, counts = self._session, self._debuggers, self.counts
        while debuggers:
            data = reader.read(RECEIVE_SIZE)
            if data is None:
                return None
            if not data:
                return trio.from_thread.run(rest, b"", [])
            with lock:
                counts.packets_in += 1
                counts.bytes_in += len(data)
                relayed = session.relay_vm(data)
                commands: list[Command] = []
                if relayed is not None:
                    to = debuggers.get(relayed.debugger)
                    if to is not None and not to.gone:  # else dropped, as in the event loop
                        written = to.outbox.send_now(relayed.data)
                        if written is None:
                            commands = [relayed]  # the outbox is busy: queued behind the rest
                        elif not written:
                            self._dirty.append(to.outbox)  # the rest is queued
                else:
                    try:
                        commands = session.handle(VmBytes(data), clock.current_time())
                    except RemoteProtocolError as exc:
                        self._log(Log(Event.VM_PROTOCOL_ERROR, "warning", {"error": str(exc)}))
                        return f"protocol error: {exc}"
                later = self._act_here(commands)
                if not later and self._written():
                    counts.relayed += 1
                    continue
                counts.handed += 1
            reason = trio.from_thread.run(rest, None, later)
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
        lock, clock = step_lock(), trio.lowlevel.current_clock()
        return await run_in_thread(
            reader, lambda: self._debugger_loop(debugger, reader, lock, clock, rest)
        )

    def _debugger_loop(
        self,
        debugger: DebuggerConnection,
        reader: ThreadReader,
        lock: threading.Lock,
        clock: trio.abc.Clock,
        rest: DebuggerRest,
    ) -> bool:
        session, counts, number = self._session, self.counts, debugger.number
        while debugger.end_reason is None and not debugger.gone:
            data = reader.read(RECEIVE_SIZE)
            if data is None:
                return False
            if not data:
                return trio.from_thread.run(rest, debugger, b"", [])
            with lock:
                if debugger.end_reason is not None or debugger.gone:
                    return True
                relayed = session.relay_debugger(number, data)
                commands: list[Command] = []
                if relayed is not None:
                    vm = self._vm_outbox()
                    if vm is not None:
                        written = vm.send_now(relayed.data)
                        if written is None:
                            commands = [relayed]  # the outbox is busy: queued behind the rest
                        elif not written:
                            self._dirty.append(vm)  # the rest is queued
                else:
                    commands = session.handle(DebuggerBytes(number, data), clock.current_time())
                later = self._act_here(commands)
                if not later and self._written():
                    counts.relayed += 1
                    continue
                counts.handed += 1
            if trio.from_thread.run(rest, debugger, None, later):
                return True
        return True
