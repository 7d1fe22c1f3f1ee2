"""What a relay thread needs: the lock it shares with trio, the epoll set it waits on, a
non-blocking read, and the way its host task starts and ends it (docs/design.md, "The relay
lane"; the thread's loop is ``threadlane.py``).

Layer: trio and the standard library; no protocol decisions.

Why a thread: a packet relayed by a trio task costs a loop turn (epoll, a task switch, a
coroutine step) on each pass, about 30 us here; a thread that waits in epoll and reads and
writes at once costs about 10 us. ddmlib relays in a thread of its own (a java.nio selector).

How the thread and trio share a VM's state: one lock per trio run, `step_lock`. Trio's thread
holds it for every task step (an instrument takes it before a step and gives it back after), and
a relay thread holds it for each read it carries out (non-blocking reads and writes only:
microseconds). So the session and the outboxes are only ever touched by one thread at a time, at
the same points as before: between trio's steps. What needs the event loop is handed to trio
with ``trio.from_thread.run`` while the thread waits, so packets keep their order and trio's
rules (cancel scopes, flushes) apply as they did.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import trio

__all__ = ["Looking", "Poller", "plain_socket", "read_socket", "run_in_thread", "step_lock"]

T = TypeVar("T")

#: How long a relay thread's wait may last before it looks at its wake flag again (seconds): the
#: wake pipe ends a wait at once; this only bounds a wake-up that was somehow lost.
POLL_S = 1.0
_now_ns = time.monotonic_ns


class _StepLock(trio.abc.Instrument):
    """Holds the run's lock for every task step."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.lock.acquire()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.lock.release()


_LOCK: trio.lowlevel.RunVar[threading.Lock] = trio.lowlevel.RunVar("ddmd_step_lock")
_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("ddmd_relay_limiter")


def step_lock() -> threading.Lock:
    """The lock trio's thread holds while a task runs; made (and the instrument installed) at
    the first call of a run, from a task."""
    try:
        return _LOCK.get()
    except LookupError:
        pass
    lock = threading.Lock()
    _LOCK.set(lock)
    trio.lowlevel.add_instrument(_StepLock(lock))
    # Installed in the middle of this task's step: trio calls after_task_step at its end, which
    # releases the lock, so this step takes it now, as before_task_step would have.
    lock.acquire()
    return lock


def _limiter() -> trio.CapacityLimiter:
    """Relay threads do not count against trio's default limiter (40 threads), which short
    jobs (file writes, /proc readings) share; one is running per socket with a debugger."""
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(1 << 20)
        _LIMITER.set(limiter)
        return limiter


class Poller:
    """The epoll set a relay thread waits on. Sockets are added and removed from any thread
    (the kernel's set is thread-safe); `wake` (from any thread) ends the wait for good."""

    def __init__(self) -> None:
        self._woken = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._wake_r, select.EPOLLIN)

    @property
    def woken(self) -> bool:
        return self._woken

    def add(self, fd: int) -> None:
        self._epoll.register(fd, select.EPOLLIN)

    def discard(self, fd: int) -> None:
        """Stop watching ``fd`` (a socket closed meanwhile has left the set by itself)."""
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)

    def wake(self) -> None:
        if self._woken or self._closed:
            return
        self._woken = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def wait(self, spin_ns: int = 0) -> list[int] | None:
        """Block until sockets of the set are readable (or closed, or failed): their
        descriptors; None once woken. With ``spin_ns``, look without sleeping for up to that
        long first (``ThreadLane`` says when: a reply expected within it)."""
        poll, wake_fd = self._epoll.poll, self._wake_r
        until = _now_ns() + spin_ns if spin_ns else 0
        while not self._woken:
            ready = []
            for fd, _ in poll(0) if until and _now_ns() < until else poll(POLL_S):
                if fd != wake_fd:
                    ready.append(fd)
            if ready and not self._woken:
                return ready
        return None


#: A socket the relay thread reads or writes: trio's, or the standard library's under it.
AnySocket = trio.socket.SocketType | socket.socket


def plain_socket(sock: trio.socket.SocketType) -> AnySocket:
    """The standard library's socket under trio's, for the relay thread's reads and writes:
    its ``fileno`` is one C call where trio's wrapper adds a Python frame, and the thread asks
    for it at every read and write. It is the same socket (closed when trio closes it, so the
    descriptor then reads -1). trio keeps it as ``_sock``; should that change, trio's own
    socket is returned, which works the same, a little slower."""
    raw = getattr(sock, "_sock", None)
    return raw if type(raw) is socket.socket else sock


class Looking:
    """When a relay thread looks for a VM's reply without sleeping (``[debugger]
    relay_spin_us``), and for how long: ``Poller.wait(budget)`` after a debugger's command went
    to the VM, then ``took`` with how long that wait lasted and how long since the command was
    read.

    Why: a thread asleep in epoll is woken in some 15 us here, about what a local JVM takes to
    answer a small command, so looking for the reply (epoll with no timeout, in a loop) cuts most
    of the relay's added latency for a VM on this machine, for about the CPU it saves in
    wake-ups. The driver sets it only for a VM it reaches directly: behind adb the reply comes
    through the adb server and the device, later than any budget (70-150 us here, far more over
    USB), and even the bookkeeping of the score measurably slowed that path.

    A score says when: a reply found while looking adds one, one that was not takes two; while
    the thread slept, a reply adds one when it came within five quarters of the budget after the
    command was read, and takes one if later (the time since the read, not the wait: a thread put
    aside right after its write finds the reply there at once). The thread looks while the score
    is at least `LOOK_AT` (out of `TOP`). A local VM's odd late reply does not stop the looking;
    a VM that got slow (a remote one, or one busy in a GC) soon has the thread sleep again."""

    TOP = 4
    LOOK_AT = 2

    def __init__(self, spin_ns: int) -> None:
        self.spin_ns = spin_ns
        self.on = spin_ns > 0  # looking is configured at all
        self._enter_ns = spin_ns * 5 // 4  # since the command's read: the thread's own work too
        self._score = self.TOP if self.on else 0  # a thread starts out looking
        self._looking = self.on

    @property
    def budget(self) -> int:
        """How long the next wait for a reply looks before it sleeps (ns; 0: it sleeps)."""
        return self.spin_ns if self._looking else 0

    def took(self, waited: int, since_read: int) -> None:
        """The reply came: the wait for it lasted ``waited`` ns, and ``since_read`` ns passed
        since the command was read (the thread's own work included, and any time it was not
        running: a thread put aside right after its write finds the reply there at once, so
        only this says how long the VM took)."""
        if not self.on:
            return
        score = self._score
        if self._looking:
            score = score + 1 if waited <= self.spin_ns else score - 2
        else:
            score = score + 1 if since_read <= self._enter_ns else score - 1
        self._score = score = min(self.TOP, max(0, score))
        self._looking = score >= self.LOOK_AT


def read_socket(sock: AnySocket, size: int) -> bytes | None:
    """What a non-blocking socket has now: bytes (b"" at its end), or None (nothing yet).
    Raises OSError when it failed or was closed. The descriptor is asked for at each read: a
    closed socket says -1, and a number kept from before could be another socket's by now."""
    fd = sock.fileno()
    if fd < 0:
        raise OSError(errno.EBADF, "the socket is closed")
    try:
        return os.read(fd, size)
    except BlockingIOError:
        return None


async def run_in_thread(poller: Poller, body: Callable[[], T]) -> T:
    """Run ``body`` (which waits with ``poller``) in a relay thread and return what it returns.
    The calling task stays the thread's host: ``trio.from_thread.run`` in ``body`` runs in it,
    under its cancel scopes. When the task is cancelled the poller is woken, ``body`` returns
    at its next wait, and the cancellation goes on from here."""

    async def wake_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        finally:
            poller.wake()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wake_when_cancelled)
            try:
                return await trio.to_thread.run_sync(
                    body, thread_name="ddmd relay", limiter=_limiter()
                )
            finally:
                nursery.cancel_scope.cancel()
    finally:
        poller.close()
