"""HoldEvents/ReleaseEvents per debugger (a part of ``Bridge``, ``bridge.py``).

Layer: standard library only (sans-IO). It sees nobody: the bridge asks it what to send a
debugger now, and sends it.

A debugger's VirtualMachine.HoldEvents is answered by the bridge, not the VM: from then on that
debugger's events wait in its queue, and its ReleaseEvents gives them, in order. The queue is
bounded: past ``MAX_HELD_EVENTS`` the debugger gets them all at once and holds no more (the
bridge logs it). A debugger that joins holds nothing; one that leaves is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["MAX_HELD_EVENTS", "Holding"]

MAX_HELD_EVENTS: Final = 4096


@dataclass(slots=True)
class _Member:
    holding: bool = False
    queue: list[bytes] = field(default_factory=list)


class Holding:
    """The events each debugger holds (HoldEvents) until it releases them (ReleaseEvents)."""

    def __init__(self) -> None:
        self.members: dict[int, _Member] = {}

    def clear(self) -> None:
        self.members.clear()

    def joined(self, debugger: int) -> None:
        self.members[debugger] = _Member()

    def left(self, debugger: int) -> None:
        self.members.pop(debugger, None)

    def hold(self, debugger: int) -> None:
        """``debugger``'s HoldEvents: its events wait from now on."""
        self._member(debugger).holding = True

    def release(self, debugger: int) -> list[bytes]:
        """``debugger``'s ReleaseEvents: the events it held, in order, to send now."""
        member = self._member(debugger)
        member.holding = False
        queued, member.queue = member.queue, []
        return queued

    def deliver(self, debugger: int, data: bytes) -> tuple[list[bytes], bool]:
        """An event packet for ``debugger``: what to send it now (nothing while it holds), and
        whether its queue overflowed (then it is everything it held, and it holds no more)."""
        member = self._member(debugger)
        if not member.holding:
            return [data], False
        member.queue.append(data)
        if len(member.queue) <= MAX_HELD_EVENTS:
            return [], False
        return self.release(debugger), True

    def _member(self, debugger: int) -> _Member:
        return self.members.setdefault(debugger, _Member())
