"""What a VM session wants done: one frozen dataclass per kind. The driver carries each out in
order, with no ``await`` between asking the session and acting on its answer; an unknown
command is a bug in the driver (it raises, it never skips).

Layer: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The relay's commands and inputs are plain (not frozen) slotted dataclasses: one of each is
# made per packet, and a frozen dataclass costs three times as much to make. Nothing changes
# them after they are made.


@dataclass(slots=True)
class SendToVm:
    """Write these bytes to the VM connection in one send (whole packets only)."""

    data: bytes


@dataclass(slots=True)
class SendToDebugger:
    """Write these bytes to one debugger. ``more``: part of a packet relayed in pieces; nothing
    else may be written to that debugger until the piece with ``more=False``."""

    debugger: int
    data: bytes
    more: bool = False


@dataclass(frozen=True, slots=True)
class CloseDebugger:
    """Close one debugger connection (after what was sent to it so far)."""

    debugger: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reconnect:
    """Close the VM connection and open a new one (the way to release a debugger's state on
    every VM family); the session is told ``VmConnected`` again."""

    reason: str


@dataclass(frozen=True, slots=True)
class WakeMeAt:
    """Send a ``Tick`` at (or soon after) this time of the driver's clock."""

    when: float


@dataclass(frozen=True, slots=True)
class Log:
    """One structured log line: ``event`` is a name from ``ddmd.logs.Event``."""

    event: str
    level: str = "info"
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Changed:
    """The snapshot changed; ``renamed``: its selection key may have changed too."""

    renamed: bool = False


@dataclass(frozen=True, slots=True)
class SelectMe:
    """Make this VM the current one (it waits for a debugger and none is attached)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Resolve:
    """A call succeeded; ``value`` depends on the request (see ``VmSession``)."""

    call: int
    value: Any = None


@dataclass(frozen=True, slots=True)
class Reject:
    """A call failed. ``kind``: "unsupported" (the VM lacks it), "timed_out", "failed" (the VM
    refused this one request, e.g. a thread that has ended), "gone" (the VM went away)."""

    call: int
    kind: str
    message: str


@dataclass(slots=True)
class Publish:
    """A chunk handler published ``value`` (checked to be JSON) for this VM: keep it, serve it
    and announce it (``ext.updated``)."""

    handler: str
    value: Any


@dataclass(slots=True)
class Capture:
    """Bytes of a file the VM sends for call ``call`` (a method trace, a heap dump), in order;
    ``last``: the file is complete. The driver writes them to the call's file as they come."""

    call: int
    data: bytes
    last: bool = False


Command = (
    SendToVm
    | SendToDebugger
    | CloseDebugger
    | Reconnect
    | WakeMeAt
    | Log
    | Changed
    | SelectMe
    | Resolve
    | Reject
    | Publish
    | Capture
)
