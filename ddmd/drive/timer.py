"""The VM driver's clock for its session: a ``Tick`` at the time the session asks for
(``WakeMeAt``), and, while a write may be under way, the watchdog a few times a second.

Layer: trio and ``ddmd.session.inputs``; no protocol decisions. A part of ``VmDriver``, seen
through its ``core.Core``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import trio

from ddmd.drive.core import Core
from ddmd.drive.debugger import DIRECT_SEND_LIMIT
from ddmd.session.inputs import Tick

__all__ = ["WATCHDOG_PERIOD", "Timer"]

#: How often the watchdog looks at writes while debuggers are attached (seconds).
WATCHDOG_PERIOD = DIRECT_SEND_LIMIT / 2


class Timer:
    """``run`` is the driver's timer task. ``watching``: whether a write is (or may soon be)
    under way; ``watchdog(now)``: what the driver does about writes that take too long."""

    def __init__(
        self,
        core: Core,
        *,
        watching: Callable[[], bool],
        watchdog: Callable[[float], Awaitable[None]],
    ) -> None:
        self._core = core
        self._watching = watching
        self._watchdog = watchdog
        self._wake_at = math.inf
        self._changed = trio.Event()
        self._sleeping_until = -math.inf

    def wake(self) -> None:
        """Look again now (a debugger arrived: the watchdog runs while debuggers are here)."""
        self._changed.set()

    def wake_me_at(self, when: float) -> None:
        """The session's ``WakeMeAt``."""
        self._wake_at = when
        if when < self._sleeping_until:  # earlier than the timer sleeps until
            self._changed.set()

    async def run(self) -> None:
        """Ticks at the times the session asks for; and, while debuggers are attached or a
        write to the VM is under way, the watchdog of writes that take too long."""
        while True:
            wake = self._wake_at
            if self._watching():
                # A write is (or may soon be) under way: look at it a few times a second. A
                # write of ddmd's own always comes with a request deadline, so the timer is
                # awake to see it even when no debugger is attached.
                wake = min(wake, trio.current_time() + WATCHDOG_PERIOD)
            changed = self._changed = trio.Event()
            self._sleeping_until = wake
            with trio.move_on_at(wake):
                await changed.wait()
            self._sleeping_until = -math.inf  # awake: a new WakeMeAt needs no wake-up call
            if changed.is_set():
                continue
            now = trio.current_time()
            await self._watchdog(now)
            if now >= self._wake_at:
                self._wake_at = math.inf  # the session asks again (WakeMeAt) after every Tick
                self._core.feed(Tick(now))
                await self._core.flush()  # returns at once when nothing was queued
