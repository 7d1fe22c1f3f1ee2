"""The lifecycle of one VM session, as one table (``TRANSITIONS``) and the object that walks it.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

    connecting ─VmConnected─▶ identifying ─identified─▶ ready ─last debugger left─▶ releasing
                                   ▲                      ▲                            │
                                   │                      └─DBGD acknowledged/released─┤
                                   └──────VmConnected────── reconnecting ◀─no ack──────┘
    any state ─VmClosed─▶ closed

``VmSession`` holds one ``Lifecycle``; the parts that move it (the conversation when the VM is
identified, the release) are given it, and the others read it.
"""

from __future__ import annotations

from ddmd.protocol.errors import LocalProtocolError

__all__ = ["TRANSITIONS", "Lifecycle"]

#: (state, what happened) -> next state. Anything else is a bug (LocalProtocolError).
TRANSITIONS: dict[tuple[str, str], str] = {
    ("connecting", "connected"): "identifying",
    ("identifying", "identified"): "ready",
    ("ready", "last debugger left"): "releasing",
    ("releasing", "acknowledged"): "ready",
    ("releasing", "released"): "ready",  # ddmd released a VM without DDM on its connection
    ("releasing", "no acknowledgement"): "reconnecting",
    ("reconnecting", "connected"): "identifying",
    ("identifying", "closed"): "closed",
    ("ready", "closed"): "closed",
    ("releasing", "closed"): "closed",
    ("reconnecting", "closed"): "closed",
    ("connecting", "closed"): "closed",
}

#: States in which the VM cannot be asked anything.
_OFFLINE = frozenset({"closed", "connecting", "reconnecting"})


class Lifecycle:
    """Where one VM session is in ``TRANSITIONS``, and whether its VM was ever identified."""

    __slots__ = ("identified", "state", "vm_id")

    def __init__(self, vm_id: str) -> None:
        self.vm_id = vm_id
        self.state = "connecting"
        self.identified = False  # the VM answered HELO (or was found not to speak DDM) once

    def goto(self, what: str) -> None:
        try:
            self.state = TRANSITIONS[(self.state, what)]
        except KeyError:
            raise LocalProtocolError(
                f"{self.vm_id}: {what!r} cannot happen in {self.state!r}"
            ) from None

    def identify(self) -> None:
        """The VM is identified (on this connection)."""
        if self.state == "identifying":
            self.goto("identified")
        self.identified = True

    @property
    def offline(self) -> bool:
        """No connection to ask the VM on (not yet, being reopened, or gone)."""
        return self.state in _OFFLINE
