"""The writes a VM driver has queued and not yet seen written: which outboxes got packets, in
order, and the two things done with them without waiting (queue one, write what fits now).

Layer: ``ddmd.drive`` and ``ddmd.session.commands``; no coroutine, no clock, no event loop:
the driver's trio tasks and its relay threads (holding the step lock) both use it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ddmd.drive.debugger import DebuggerConnection, Outbox
from ddmd.session.commands import SendToDebugger, SendToVm

__all__ = ["PendingWrites"]


@dataclass(eq=False)
class PendingWrites:
    """``dirty``: the outboxes that got packets, in the order they got them (an outbox may be
    listed more than once); the driver's flush writes the rest of them."""

    debuggers: dict[int, DebuggerConnection]
    vm: Callable[[], Outbox | None]
    dirty: list[Outbox] = field(default_factory=list)

    def queue(self, command: SendToDebugger | SendToVm) -> bool:
        """Queue a packet for its stream; False when its queue is full (the caller applies the
        rule for that). A packet for a stream that is gone is dropped."""
        if isinstance(command, SendToDebugger):
            debugger = self.debuggers.get(command.debugger)
            outbox = None if debugger is None or debugger.gone else debugger.outbox
        else:
            outbox = self.vm()
        if outbox is not None:
            if not outbox.put(command.data):
                return False
            self.dirty.append(outbox)
        return True

    def write_now(self) -> bool:
        """Write the outboxes that got bytes, in order, as far as their sockets take them at
        once; True when all are written (the relay's common case). Otherwise the rest stay in
        order for the driver's flush."""
        dirty = self.dirty
        while dirty:
            if not dirty[0].write_now():
                return False
            dirty.pop(0)
        return True
