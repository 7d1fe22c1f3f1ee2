"""The round trip of ddmd's own requests to one VM, as foresight's "auto" reads it.

Layer: standard library only (sans-IO: times arrive from the caller). A part of ``Foresight``.

Only commands the VM answers at once are timed (reads, Version, IDSizes, DDM requests): an event
request, a resume or a redefinition costs the VM milliseconds of its own work (clearing a
breakpoint deoptimizes HotSpot's code) whatever the link. ``srtt`` is smoothed as TCP's SRTT:
what users are shown. ``least()`` is the least of the last few samples: what "auto" decides on,
since a link's delay is in every sample, while a moment's load, a slow command or a pipelined
burst inflates only some.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from typing import Final

__all__ = ["RoundTrip"]

ALPHA: Final = 0.125  # the smoothing of the shown round trip (TCP's SRTT)
RECENT: Final = 4  # samples whose least decides "auto"
MAX_TIMED: Final = 256  # commands timed at once (replies that never come are forgotten)
TIMED_TOO: Final = frozenset({0x0101, 0x0107})  # VM.Version, VM.IDSizes: answered at once
DDM: Final = 0xC7


class RoundTrip:
    """Send times of ddmd's own timed commands, and what their replies measured."""

    def __init__(self, reads: Container[int]) -> None:
        self.reads = reads  # (set << 8) | command of the read-only commands
        self.srtt: float | None = None
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.timed: dict[int, float] = {}  # VM-side id -> sent at

    def sent(self, vm_id: int, command_set: int, command: int, now: float) -> None:
        k = (command_set << 8) | command
        if k in self.reads or k in TIMED_TOO or command_set == DDM:
            if len(self.timed) >= MAX_TIMED:
                del self.timed[next(iter(self.timed))]
            self.timed[vm_id] = now

    def replied(self, vm_id: int, now: float) -> bool:
        """A reply: whether it was a timed command's (a new sample)."""
        sent = self.timed.pop(vm_id, None)
        if sent is None:
            return False
        sample = max(0.0, now - sent)
        self.srtt = sample if self.srtt is None else self.srtt + ALPHA * (sample - self.srtt)
        self.recent.append(sample)
        return True

    def least(self) -> float | None:
        return min(self.recent) if self.recent else None

    def forget_sent(self) -> None:
        """A new connection: nothing sent before is answered on it."""
        self.timed.clear()
