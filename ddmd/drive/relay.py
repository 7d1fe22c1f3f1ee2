"""One VM's reads on the drive side, written once: the relay lane, else the session's general
path, then write what fits and hand on the rest; and the one executor of the session's commands.

Layer: ``ddmd.drive`` and ``ddmd.session`` (commands, inputs, the lane's decisions); no
coroutine and no event loop: the trio readers (``vm.py``, ``debuggers.py``) and the relay thread
(``threadlane.py``, holding the step lock) call the same code.

    a read ─▶ session.relay_vm / relay_debugger: the lane's decision, which changes nothing
              ├─ a packet: written at once (``Outbox.send_now``), then ONE call commits it
              │            (``relayed_vm`` / ``relayed_debugger``: id map, ledger, counters)
              └─ None: ``session.handle`` (its general path does not try the lane again),
                       and its commands carried out by ``carry_out``
           ─▶ what is queued written as far as the sockets take it now
           ─▶ what is left: nothing, or the commands and flushes only the event loop does

``carry_out`` is the one executor: packets are queued and log lines written wherever it runs;
any other command (a call's answer, a debugger leaving, a timer) and a queue that is full (the
slow consumer's rule) are the event loop's. Run there (``loop=True``) it does them through the
driver's ``in_loop``/``on_full``; run in the relay thread it stops at the first and returns it
with the rest, in order, for the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from ddmd.drive.writes import PendingWrites
from ddmd.logs import Event
from ddmd.session.commands import Command, Log, SendToDebugger, SendToVm
from ddmd.session.inputs import ConsumerBytes, VmBytes
from ddmd.session.vm import VmSession

__all__ = ["WRITTEN", "LaneCounts", "Left", "Relay"]

#: What a read left (``Relay.from_vm``/``from_debugger``): None, the relay lane passed the
#: packet on and everything is written; ``WRITTEN``, the session took the bytes and everything
#: it asked for is done and written; a list, the commands only the event loop may carry out, in
#: order (empty: only the flush of what the sockets did not take at once).
Left = list[Command] | tuple[()] | None
WRITTEN: Final[tuple[()]] = ()

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


@dataclass(slots=True)
class LaneCounts:
    """Reads of a VM's sockets: those the relay thread relayed whole, those it handed to trio."""

    relayed: int = 0
    handed: int = 0
    packets_in: int = 0  # reads of the VM's socket (by the thread or by trio)
    bytes_in: int = 0

    def statistics(self) -> dict[str, int]:
        """For ``bridge_statistics``: reads the thread passed on whole, and those it handed to
        the event loop."""
        return {"thread_relayed": self.relayed, "thread_handed": self.handed}


class Relay:
    """The reads of one VM and its debuggers, and the session's commands, for the driver's
    trio readers and its relay thread alike. ``in_loop``: the driver's part of the executor
    (commands only the event loop carries out); ``on_full``: its rule for a packet whose queue
    is full."""

    def __init__(
        self,
        session: VmSession,
        writes: PendingWrites,
        *,
        logger: structlog.stdlib.BoundLogger,
        in_loop: Callable[[Command], None],
        on_full: Callable[[SendToDebugger | SendToVm], None],
    ) -> None:
        # The session's lane and entry point, bound once: they are called per packet.
        self._relay_vm = session.relay_vm
        self._relayed_vm = session.relayed_vm
        self._relay_debugger = session.relay_debugger
        self._relayed_debugger = session.relayed_debugger
        self._handle = session.handle
        self._debuggers = writes.debuggers
        self._vm = writes.vm
        self._dirty = writes.dirty
        self._queue = writes.queue
        self._write_now = writes.write_now
        self._logger = logger
        self._in_loop = in_loop
        self._on_full = on_full
        self.counts = LaneCounts()
        self.timeouts = 0  # DDM requests the session gave up on (``VmStatistics``)

    # ------------------------------------------------------------------ reads

    def from_vm(self, data: bytes, now: Callable[[], float], loop: bool) -> Left:
        """One read of the VM's socket (not empty). ``now``: the clock, read only when the
        session is fed; ``loop``: this runs in the event loop. Raises ``RemoteProtocolError``
        when the VM broke the protocol (the caller ends the connection)."""
        counts = self.counts
        counts.packets_in += 1
        counts.bytes_in += len(data)
        lane = self._relay_vm(data)
        if lane is None:
            return self._rest(self.carry_out(self._handle(VmBytes(data), now()), loop))
        to = self._debuggers.get(lane[0])
        if to is None or to.gone:
            self._relayed_vm(lane)  # dropped, as the general path drops it
        else:
            outbox = to.outbox
            written = outbox.send_now(lane[1])
            self._relayed_vm(lane)
            if written is None:  # the outbox is not idle: queued behind what waits there
                left = self.carry_out([SendToDebugger(lane[0], lane[1])], loop)
                if left:
                    return left
            elif not written:
                self._dirty.append(outbox)  # the socket took part of it: the rest is queued
        return None if not self._dirty or self._write_now() else []

    def from_debugger(self, number: int, data: bytes, now: Callable[[], float], loop: bool) -> Left:
        """One read of a debugger's socket (not empty), as ``from_vm``."""
        lane = self._relay_debugger(number, data)
        if lane is None:
            item = ConsumerBytes(number, data)
            return self._rest(self.carry_out(self._handle(item, now()), loop))
        vm = self._vm()
        if vm is None:
            self._relayed_debugger(lane)  # the VM's connection is gone: dropped
            return WRITTEN if not self._dirty or self._write_now() else []
        written = vm.send_now(lane[0])
        self._relayed_debugger(lane)
        if written:
            return None if not self._dirty or self._write_now() else []
        if written is None:  # the outbox is not idle: queued behind what waits there
            left = self.carry_out([SendToVm(lane[0])], loop)
            if left:
                return left
            return WRITTEN if not self._dirty or self._write_now() else []
        self._dirty.append(vm)  # the socket took part of it: the rest is queued
        return None if self._write_now() else []

    def _rest(self, left: list[Command]) -> Left:
        if not left and (not self._dirty or self._write_now()):
            return WRITTEN
        return left

    # ------------------------------------------------------------------ the one executor

    def carry_out(self, commands: list[Command], loop: bool = True) -> list[Command]:
        """Carry out the session's commands in order (see the module docstring); returns those
        left for the event loop (always none with ``loop``)."""
        for i, command in enumerate(commands):
            if isinstance(command, SendToDebugger | SendToVm):
                if self._queue(command):
                    continue
                if not loop:
                    return commands[i:]
                self._on_full(command)
            elif isinstance(command, Log):
                self.log(command)
            elif not loop:
                return commands[i:]
            else:
                self._in_loop(command)
        return []

    def log(self, command: Log) -> None:
        """Write a log line of the session's (the driver's view of a debugger added)."""
        event = command.event
        if event == Event.DDM_REQUEST_TIMED_OUT:
            self.timeouts += 1
        elif event == Event.DEBUGGER_DETACHED:
            debugger = self._debuggers.get(int(command.fields.get("debugger", 0)))
            if debugger is not None:
                command.fields.update(peer=debugger.peer, via=debugger.via, port=debugger.port)
        self._logger.log(_LEVELS.get(command.level, 20), event, **command.fields)
