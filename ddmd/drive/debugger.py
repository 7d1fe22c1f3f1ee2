"""Outboxes: whole packets for one stream, written in the order the session asked for them.

Layer: trio only (plus ``ddmd.logs`` names); no protocol decisions.

Whoever adds bytes to an idle outbox writes them itself, at once: a VM packet goes from the VM
reader straight to the debugger's socket and a debugger's command from its reader straight to
the VM's, with no task hop and no cancel scope, the way a byte relay does. If another task is
writing already, the bytes queue and that task writes them too, so the order the session chose
is kept.

A debugger's outbox has a writer of its own (``writer``): when its socket does not take a
packet at once (the debugger stopped reading: a GC pause in the IDE, a debugger stopped with
Ctrl-Z), the rest is written by a task of that debugger's, and the VM reader goes on relaying
to everyone else. Meanwhile its packets queue, up to ``[debugger] queue_bytes`` and
``queue_packets``; a debugger that does not read for ``[debugger] pause_limit`` seconds (the
driver's watchdog: the write under way is older than that) or whose queue passes either budget
is dropped as a slow consumer. A reader that pauses within both bounds keeps its session and
gets every packet, in order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from ddmd.drive.relaythreads import AnySocket, plain_socket

#: How long one write to a debugger may wait (its socket buffer is full: it stopped reading).
DIRECT_SEND_LIMIT = 0.25
#: Writes up to this size are "small": they fit a socket buffer unless the reader stopped.
QUICK_WRITE = 64 * 1024
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
    since: float | None = None  # when the write under way began
    sock: AnySocket | None = None  # for writes that need no waiting (``plain_socket``)
    quick: float = DIRECT_SEND_LIMIT  # how long a small write may take
    allowed: float = 0.0  # how long the write under way may take
    #: Starts a task of this stream's own that calls `drain` (True when it did): `flush` then
    #: returns at once, and whoever flushed never waits for this stream's reader.
    writer: Callable[[Outbox], bool] | None = None
    _idle: trio.Event | None = None  # made only when someone waits for the write to end

    def __post_init__(self) -> None:
        if isinstance(self.stream, trio.SocketStream):
            self.sock = plain_socket(self.stream.socket)

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

    def send_now(self, data: bytes) -> bool | None:
        """The relay's common case in one step: when nothing is queued or being written, write
        ``data`` at once. True when it was written whole; False when the socket took part or
        none of it (the rest is queued: the caller has it flushed); None when the outbox is not
        idle, and nothing was done (the caller takes the general path: `put`). No coroutine."""
        sock = self.sock
        if self.queue or self.busy or self.broken is not None or sock is None:
            return None
        fd = sock.fileno()
        try:
            sent = os.write(fd, data) if fd >= 0 else 0
        except OSError:
            sent = 0  # not now (BlockingIOError), or an error that flush meets and reports
        if sent == len(data):
            self.packets += 1
            self.written += sent
            return True
        self.written += sent
        self.queue.append(data[sent:] if sent else data)
        self.queued += len(data) - sent
        return False

    def write_now(self) -> bool:
        """Write what is queued without waiting, if the socket takes all of it now (the common
        case); True when nothing is left to write. Anything the socket does not take at once
        stays queued, in order, for ``flush``. No coroutine, no clock: the relay calls this once
        per packet."""
        if self.busy or self.broken is not None or self.sock is None:
            return not self.queue and not self.busy
        queue = self.queue
        while queue:
            data = queue[0]
            fd = self.sock.fileno()
            if fd < 0:
                return False  # closed: flush raises and reports it
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                return False
            except OSError:
                return False  # flush meets the same error and reports it
            if sent != len(data):
                queue[0] = data[sent:]
                self.queued -= sent
                self.written += sent
                return False
            queue.popleft()
            self.queued -= sent
            self.packets += 1
            self.written += sent
        return True

    async def flush(self, now: float) -> None:
        """Write what is queued unless another task is already doing it; with a ``writer``,
        hand the writing to the stream's own task and return at once. No cancel scope per
        write (they cost more than the write): ``since`` says when the current write began,
        and the driver's watchdog closes a stream whose write takes longer than allowed, which
        makes the write fail in the task writing. Raises OutboxBroken when a write fails."""
        if self.busy or not self.queue or self.broken is not None:
            return
        if self.writer is not None:
            self.busy = True  # the writer's from now on: nobody else starts one
            if self.writer(self):
                return
            self.busy = False
        await self.drain(now, claimed=False)

    async def drain(self, now: float, *, claimed: bool = True) -> None:
        """Write what is queued in this task (the ``writer``'s task calls it with ``claimed``:
        `flush` marked the outbox busy for it). Raises OutboxBroken when a write fails."""
        if not claimed and (self.busy or not self.queue or self.broken is not None):
            return
        self.busy = True
        try:
            while self.queue and self.broken is None:
                data = self.queue.popleft()
                self.queued -= len(data)
                self.since = trio.current_time() if claimed else now
                now = self.since
                self.allowed = self.quick if len(data) <= QUICK_WRITE else self.limit
                try:
                    if self.sock is not None:
                        # The socket is non-blocking: write what fits now, without trio's
                        # send machinery (the common case is all of it); trio waits for the
                        # rest. The reader calling us has just passed a checkpoint. The
                        # descriptor is asked for each time: a closed socket says -1, and a
                        # number kept from before could belong to another socket by now.
                        fd = self.sock.fileno()
                        if fd < 0:
                            raise trio.ClosedResourceError("the socket is closed")
                        try:
                            sent = os.write(fd, data)
                        except BlockingIOError:
                            sent = 0
                        if sent == len(data):
                            self.packets += 1
                            self.written += sent
                            continue
                        self.written += sent  # the rest is counted once send_all took it
                        data = data[sent:]
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self.broken = self.broken or f"connection error: {exc}"
                    raise OutboxBroken(self.broken) from exc
                self.packets += 1
                self.written += len(data)
        except BaseException:
            if self.broken is None:
                # Cancelled from outside in the middle of a write: part of a packet may be out.
                self.broken = "a write was interrupted"
            raise
        finally:
            self.since = None
            self.busy = False
            if self._idle is not None:
                self._idle.set()
                self._idle = None

    async def wait_idle(self) -> None:
        """Wait until the write under way (if any) is over."""
        if self.busy:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()

    def overdue(self, now: float) -> bool:
        """A write has been waiting longer than allowed (the other end stopped reading)."""
        return self.since is not None and now - self.since > self.allowed


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
    writing: bool = False  # its reader task is writing to the VM now
    since: float | None = None  # wall-clock time of its arrival
    tool: str | None = None  # the program on the other end, when known
    pid: int | None = None  # its process id, when known (a local process of an allowed user)
    suspended_since: float | None = None  # wall clock: since when it holds a suspension

    def end(self, reason: str) -> None:
        """Stop its reader. Not while that reader writes a packet to the VM: cutting it would
        break the VM connection; the reader stops by itself right after that write."""
        if self.end_reason is None:
            self.end_reason = reason
        if not self.writing:
            self.scope.cancel()
