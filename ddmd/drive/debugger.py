"""Outboxes: whole packets for one stream, written in the order the session asked for them.

Layer: trio only (plus ``ddmd.logs`` names); no protocol decisions.

Whoever adds bytes to an idle outbox writes them itself, at once: a VM packet goes from the VM
reader straight to the debugger's socket and a debugger's command from its reader straight to
the VM's, with no task hop, the way a byte relay does. If another task is writing already, the
bytes queue and that task writes them too, so the order the session chose is kept. A debugger
that stops reading is detected by the write's time limit or by the queue's byte budget, and is
dropped as a slow consumer; the VM reader is never held longer than that limit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import trio

#: How long one write to a debugger may wait (its socket buffer is full: it stopped reading).
DIRECT_SEND_LIMIT = 0.25
#: The end reason of a debugger dropped for not reading.
SLOW_CONSUMER = "slow consumer"


class OutboxBroken(Exception):
    """A write failed or was cut short: the stream may hold part of a packet."""


@dataclass(eq=False)
class Outbox:
    """Queued writes of one stream. ``budget``: bytes that may wait before the reader of the
    other end counts as too slow; ``limit``: seconds one write may take."""

    stream: trio.abc.SendStream
    budget: int
    limit: float
    max_packets: int = 1 << 62
    queue: deque[bytes] = field(default_factory=deque)
    queued: int = 0
    busy: bool = False
    broken: str | None = None
    packets: int = 0
    written: int = 0
    owner: object = None  # whose stream this is (the driver's debugger record)
    idle: trio.Event = field(default_factory=trio.Event)

    def put(self, data: bytes) -> bool:
        """Queue ``data``; False when that would pass the budget of bytes or packets (the
        reader of the other end is too slow)."""
        if self.broken is not None:
            return True
        if self.queue and (
            self.queued + len(data) > self.budget or len(self.queue) >= self.max_packets
        ):
            return False
        self.queue.append(data)
        self.queued += len(data)
        return True

    async def flush(self, *, limit: float | None = None) -> None:
        """Write what is queued unless another task is already doing it. Raises OutboxBroken
        when a write fails or takes longer than the limit (the stream is then unusable)."""
        if self.busy or self.broken is not None:
            return
        self.busy = True
        self.idle = trio.Event()
        try:
            while self.queue:
                data = self.queue.popleft()
                self.queued -= len(data)
                with trio.move_on_after(self.limit if limit is None else limit) as scope:
                    try:
                        await self.stream.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                        self.broken = f"connection error: {exc}"
                        raise OutboxBroken(self.broken) from exc
                if scope.cancelled_caught:
                    self.broken = SLOW_CONSUMER
                    raise OutboxBroken(self.broken)
                self.packets += 1
                self.written += len(data)
        except BaseException:
            if self.broken is None:
                # Cancelled from outside in the middle of a write: part of a packet may be out.
                self.broken = "a write was interrupted"
            raise
        finally:
            self.busy = False
            self.idle.set()


@dataclass(eq=False)
class DebuggerConnection:
    """One accepted debugger socket: its outbox, and the scope of its reader task."""

    number: int
    stream: trio.abc.Stream
    peer: str
    via: str
    port: int | None
    outbox: Outbox
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    gone: bool = False  # the session forgot it (CloseDebugger): do not report it again
    end_reason: str | None = None

    def end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self.scope.cancel()
