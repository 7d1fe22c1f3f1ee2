"""The VM driver's relay lane in a thread: while a VM has debuggers, one thread per VM reads
its socket and each attached debugger's, waiting on them all with one epoll set
(``relaythreads.py`` says why, and how it shares the session with the event loop).

Layer: trio and ``ddmd.drive``; no protocol decisions. Composed into ``VmDriver``.

Per read, holding the step lock, the thread does what the trio readers do, with the same code
(``relay.Relay``): the relay lane's packet is written at once, other bytes go to the session and
the commands it returns are carried out here as long as they need no event loop (packets that
fit their queues, log lines). Whatever is left (a call's answer, a debugger leaving, a write
the socket did not take whole) is done by the trio readers' own code, run in the event loop
with ``trio.from_thread.run`` while the thread waits: the order of packets and every rule of
the trio side stay as they were, and a hand-over (about 100 us here) is paid only then.

One thread, not one per socket: a reply wakes the thread that has just passed the command on,
where a second thread, asleep since the last reply, costs more to wake. Behind a stand-in adb
server two threads per VM measured slower than the event loop, one thread faster
(docs/design.md, "The relay lane").
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from ddmd.drive.debugger import DebuggerConnection
from ddmd.drive.relay import Relay
from ddmd.drive.relaythreads import (
    AnySocket,
    Looking,
    Poller,
    plain_socket,
    run_in_thread,
    step_lock,
)
from ddmd.logs import Event
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.session.commands import Command, Log

__all__ = ["RECEIVE_SIZE", "ThreadLane", "socket_of"]

RECEIVE_SIZE = 65536

#: What the event loop does after a relay thread's read: (bytes the session has not seen: b"" at
#: the end of the stream, else None; commands the thread left to it, in order). For the VM it
#: returns why the connection ends, or None; for a debugger, True when its reader must stop.
VmRest = Callable[[bytes | None, Sequence[Command]], Awaitable[str | None]]
DebuggerRest = Callable[[DebuggerConnection, bytes | None, Sequence[Command]], Awaitable[bool]]


def socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket a relay thread can read, when the stream is a plain socket."""
    return stream.socket if isinstance(stream, trio.SocketStream) else None


class ThreadLane:
    """The relay thread of one VM driver: the VM's reader task hosts it (`read_vm`), each
    attached debugger's reader task hands its socket to it (`serve_debugger`)."""

    def __init__(self, relay: Relay, debuggers: Mapping[int, DebuggerConnection]) -> None:
        self._relay = relay
        self._debuggers = debuggers
        self.applies = True  # [debugger] relay_threads
        self.spin_ns = 0  # [debugger] relay_spin_us, in ns (see `_loop`)
        self._poller: Poller | None = None  # while the thread runs
        self._members: dict[int, _Member] = {}  # debuggers' sockets the thread reads, by fd

    # ------------------------------------------------------------------ the thread

    @property
    def running(self) -> bool:
        """The thread runs: an attached debugger's socket can be handed to it."""
        return self._poller is not None

    def stop(self) -> None:
        """End the thread (no debugger is left): the VM's reader goes on in trio."""
        if self._poller is not None:
            self._poller.wake()

    async def read_vm(
        self, sock: trio.socket.SocketType, vm_rest: VmRest, debugger_rest: DebuggerRest
    ) -> str | None:
        """Read the VM, and the debuggers that hand their sockets over (`serve_debugger`), in a
        thread until no debugger is left (None: go on in trio) or the VM's connection ends
        (why). Raises OSError when the VM's socket fails."""
        poller = Poller()
        plain = plain_socket(sock)
        fd = plain.fileno()
        if fd < 0:
            raise OSError(errno.EBADF, "the socket is closed")
        poller.add(fd)
        self._poller = poller
        lock, clock = step_lock(), trio.lowlevel.current_clock()
        try:
            return await run_in_thread(
                poller,
                lambda: self._loop(poller, plain, lock, clock.current_time, vm_rest, debugger_rest),
            )
        finally:
            self._poller = None
            for member in list(self._members.values()):
                member.done.set()  # back to the event loop's reading
            self._members.clear()

    async def serve_debugger(
        self, debugger: DebuggerConnection, sock: trio.socket.SocketType
    ) -> bool:
        """Hand an attached debugger's socket to the running thread and wait until it hands it
        back: True when the debugger's reader must stop, False to go on reading in trio (the
        thread ended). Raises OSError when the socket failed."""
        poller = self._poller
        fd = sock.fileno()
        if poller is None or fd < 0:
            return False
        member = _Member(debugger, plain_socket(sock), trio.Event())
        self._members[fd] = member
        poller.add(fd)
        try:
            await member.done.wait()
        finally:
            self._forget(poller, fd, member)
        if member.error is not None:
            raise member.error
        return member.stop

    def _forget(self, poller: Poller, fd: int, member: _Member) -> None:
        """Stop reading a debugger's socket (holding the step lock): only if ``fd`` is still
        that debugger's, since a closed socket's number may be a new debugger's by now."""
        if self._members.get(fd) is member:
            del self._members[fd]
            poller.discard(fd)

    def _loop(
        self,
        poller: Poller,
        vm_sock: AnySocket,
        lock: threading.Lock,
        now: Callable[[], float],
        vm_rest: VmRest,
        debugger_rest: DebuggerRest,
    ) -> str | None:
        vm_fd = vm_sock.fileno()
        wait, members, debuggers = poller.wait, self._members, self._debuggers
        vm_read, debugger_read = self._vm_read, self._debugger_read
        looking = Looking(self.spin_ns)
        expect = False  # a debugger's read just went to the VM: its reply is due
        read_at = 0  # when that read began
        while True:
            if expect:
                began = _now_ns()
                ready = wait(looking.budget)
                came = _now_ns()
                looking.took(came - began, came - read_at)
                expect = False
            else:
                ready = wait()
            if ready is None:
                return None
            # Whether the event loop ran meanwhile (a hand-over): debuggers may have left.
            # Otherwise that is seen under the lock of the read itself, one lock per read.
            handed_over = False
            for fd in ready:
                if fd == vm_fd:
                    with lock:
                        try:
                            step = vm_read(vm_sock, now)
                        except _ProtocolError as exc:
                            return str(exc)
                        if step is None and not debuggers:
                            return None
                    if step is not None:
                        handed_over = True
                        reason = trio.from_thread.run(vm_rest, *step)
                        if reason is not None:
                            return reason
                    continue
                if looking.on:
                    read_at = _now_ns()
                with lock:
                    member = members.get(fd)
                    if member is None:
                        handed_over = True
                        continue  # handed back meanwhile
                    handed = debugger_read(member, now)
                    if handed is None and not debuggers:
                        return None
                expect = looking.on
                if handed is None:
                    continue
                handed_over = True
                if handed is _ENDED:
                    trio.from_thread.run_sync(member.done.set)  # its reader stops
                else:
                    trio.from_thread.run(self._debugger_rest, member, debugger_rest, *handed)
                if member.stop or member.error is not None:
                    with lock:  # out of the set now: a socket at its end stays "readable"
                        self._forget(poller, fd, member)
            if handed_over:
                with lock:
                    if not debuggers:
                        return None

    # ------------------------------------------------------------------ one read each

    def _vm_read(
        self, sock: AnySocket, now: Callable[[], float]
    ) -> tuple[bytes | None, Sequence[Command]] | None:
        """One read of the VM's socket, holding the step lock; what is left for the event loop
        (``VmRest``'s arguments), or None. Raises OSError when the socket failed."""
        # relaythreads.read_socket, in line (a frame less per packet)
        fd = sock.fileno()
        if fd < 0:
            raise OSError(errno.EBADF, "the socket is closed")
        try:
            data = _read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        if not data:
            return b"", []
        try:
            left = self._relay.from_vm(data, now, False)
        except RemoteProtocolError as exc:
            self._relay.log(Log(Event.VM_PROTOCOL_ERROR, "warning", {"error": str(exc)}))
            raise _ProtocolError(f"protocol error: {exc}") from exc
        if type(left) is not list:  # the common case: all done in the thread
            self._relay.counts.relayed += 1
            return None
        self._relay.counts.handed += 1
        return None, left

    def _debugger_read(
        self, member: _Member, now: Callable[[], float]
    ) -> tuple[bytes | None, Sequence[Command]] | None:
        """One read of a debugger's socket, holding the step lock; what is left for the event
        loop (``DebuggerRest``'s arguments), or None."""
        debugger = member.debugger
        if debugger.end_reason is not None or debugger.gone:
            member.stop = True
            return _ENDED
        fd = member.sock.fileno()  # relaythreads.read_socket, in line
        try:
            if fd < 0:
                raise OSError(errno.EBADF, "the socket is closed")
            data = _read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            member.error = exc
            return b"", []
        if not data:
            return b"", []
        left = self._relay.from_debugger(debugger.number, data, now, False)
        if type(left) is not list:  # the common case: all done in the thread
            self._relay.counts.relayed += 1
            return None
        self._relay.counts.handed += 1
        return None, left

    async def _debugger_rest(
        self,
        member: _Member,
        rest: DebuggerRest,
        data: bytes | None,
        later: Sequence[Command],
    ) -> None:
        """In the event loop: the debugger's read as its own reader would finish it; when the
        reader must stop, its socket is handed back."""
        stop = member.error is not None or await rest(member.debugger, data, later)
        if stop:
            member.stop = True
            member.done.set()


_read = os.read
_now_ns = time.monotonic_ns

#: `_debugger_read`: the debugger's reader stops, with nothing for the session.
_ENDED: tuple[bytes | None, Sequence[Command]] = (b"", [])


class _ProtocolError(Exception):
    """The VM broke the protocol; the message is why its connection ends."""


@dataclass(eq=False, slots=True)
class _Member:
    """An attached debugger whose socket the thread reads."""

    debugger: DebuggerConnection
    sock: AnySocket  # plain_socket's
    done: trio.Event
    stop: bool = False
    error: OSError | None = None
