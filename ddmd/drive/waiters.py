"""The VM driver's API calls under way: each waits for the session's answer (``Resolve``) or
refusal (``Reject``), which comes with a later input.

Layer: trio, ``ddmd.errors`` and ``ddmd.session`` (inputs, commands); no protocol decisions. A
part of ``VmDriver``.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from ddmd.drive.writes import PendingWrites
from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut, VmGone, WrongState
from ddmd.session.commands import Reject, Resolve
from ddmd.session.inputs import Call, Input, Request

__all__ = ["Waiters"]

_ERRORS: dict[str, type[Exception]] = {
    "unsupported": FeatureUnsupported,
    "timed_out": RequestTimedOut,
    "failed": DdmFailed,
    "gone": VmGone,
    "conflict": WrongState,
}


@dataclass(slots=True, eq=False)
class _Waiter:
    event: trio.Event
    value: Any = None
    error: Exception | None = None


class Waiters:
    """The calls under way, by call number. ``feed``: the driver's (ask the session, carry out
    its commands); ``flush``: its writer, started in ``nursery()`` when a call queued bytes."""

    def __init__(
        self,
        *,
        feed: Callable[[Input], None],
        flush: Callable[[], Awaitable[None]],
        nursery: Callable[[], trio.Nursery | None],
        writes: PendingWrites,
    ) -> None:
        self._feed = feed
        self._flush = flush
        self._nursery = nursery
        self._writes = writes
        self._calls: dict[int, _Waiter] = {}
        self.next_call = itertools.count(1).__next__

    async def ask(self, request: Request, *, number: int | None = None) -> object:
        """One API call: fed to the session; its answer comes with a later input (a reply, a
        push, a Tick at the call's deadline). A caller that is cancelled leaves the call to
        expire in the session; it never writes to a socket itself."""
        number = self.next_call() if number is None else number
        waiter = _Waiter(trio.Event())
        self._calls[number] = waiter
        try:
            self._feed(Call(number, request))
            nursery = self._nursery()
            if self._writes.dirty and nursery is not None:
                nursery.start_soon(self._flush)  # written by a task of the driver's own
            await waiter.event.wait()
        finally:
            self._calls.pop(number, None)
        if waiter.error is not None:
            raise waiter.error
        return waiter.value

    def settle(self, command: Resolve | Reject) -> None:
        """The session's answer to a call (none when its caller gave up)."""
        waiter = self._calls.get(command.call)
        if waiter is not None and not waiter.event.is_set():
            if isinstance(command, Resolve):
                waiter.value = command.value
            else:
                waiter.error = _ERRORS[command.kind](command.message)
            waiter.event.set()

    def fail_all(self, error: Exception) -> None:
        """The driver ends: every call still waiting fails with ``error``."""
        for waiter in self._calls.values():
            if not waiter.event.is_set():
                waiter.error = error
                waiter.event.set()
