"""What a part of the VM driver sees of it (``debuggers.Debuggers``, ``profiling.Profiling``):
a narrow host, as ``Bridge`` sees the session through ``BridgeHost``.

Layer: trio and ``ddmd.session`` (inputs, commands); no protocol decisions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
import trio

from ddmd.session.commands import Command
from ddmd.session.inputs import Input

__all__ = ["Core"]


@dataclass(frozen=True, slots=True, eq=False)
class Core:
    """The driver's members its parts may use, and nothing else."""

    #: Hand one input to the session and carry out its commands (no await in between).
    feed: Callable[[Input], None]
    #: The one executor (``relay.Relay.carry_out``), for commands a part has in hand.
    carry_out: Callable[[list[Command]], list[Command]]
    #: Write every outbox that got bytes (``reads=``: the outbox of the stream the caller reads).
    flush: Callable[..., Awaitable[None]]
    #: One API call: fed to the session, its answer awaited (``number``: a call id of
    #: ``next_call``, or a fresh one).
    ask: Callable[..., Awaitable[object]]
    next_call: Callable[[], int]
    #: The driver's nursery while it runs (None before and after).
    nursery: Callable[[], trio.Nursery | None]
    log: structlog.stdlib.BoundLogger
