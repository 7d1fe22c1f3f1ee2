"""What the adb front needs from the rest of ddmd: the VMs it holds, to hand them consumers.

Layer: trio (types only). The daemon implements `VmHub` (the lead's side, over the registry
and the VM drivers); the front only calls it. Tests use a fake.
"""

from __future__ import annotations

from typing import Protocol

import trio

__all__ = ["ConsumerTarget", "VmHub"]


class ConsumerTarget(Protocol):
    """One VM ddmd holds the JDWP connection of, able to take one more debugger."""

    @property
    def vm_id(self) -> str:  # "SERIAL/PID"
        ...

    def adopt_consumer(
        self, stream: trio.SocketStream, peer: str, *, via: str, tool: str | None = None
    ) -> None:
        """Take ownership of `stream` (synchronous, never blocks). `via` is "front" for a
        ``jdwp:PID`` socket (OKAY already sent) and "front-forward" for a connection accepted
        on a forward's port (nothing sent); the client's JDWP handshake comes next either way.
        `tool` names the program at the other end ("jdb", "Android Studio", ...); None (what
        the front passes) lets ddmd look it up after the hand-over, so that the client's
        handshake waits for no lookup."""
        ...


class VmHub(Protocol):
    """The VMs of Android devices that ddmd holds, by (serial, pid)."""

    def find(self, serial: str, pid: int) -> ConsumerTarget | None:
        """The VM if ddmd holds it now."""
        ...

    async def wait_for(self, serial: str, pid: int) -> ConsumerTarget | None:
        """The VM once ddmd opened it (None if it cannot). The caller puts the deadline
        around it ([front] open_timeout)."""
        ...
