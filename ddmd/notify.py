"""sd_notify for ``Type=notify`` units: READY=1 once every listener is bound, STOPPING=1 at stop.

Layer: standard library only; no logging (the daemon logs a failed notification). Called by
`daemon`. Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op that returns False.

The protocol (sd_notify(3)): one datagram of newline-separated ``KEY=VALUE`` assignments to the
AF_UNIX socket named by ``$NOTIFY_SOCKET``; a name starting with "@" is in the abstract
namespace (the "@" stands for a leading NUL byte). The send never blocks: if the socket's queue
is full, the notification is lost and ``OSError`` is raised, as any other failure.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["notify", "ready", "socket_address", "stopping"]


def socket_address(env: Mapping[str, str] | None = None) -> str | bytes | None:
    """The address from ``$NOTIFY_SOCKET``, or None when unset or not an AF_UNIX path."""
    value = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # unset, or a transport this module does not speak (e.g. vsock:)


def notify(state: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=..."``); False when there is no socket.

    Raises OSError when the socket exists but the datagram cannot be sent.
    """
    address = socket_address(env)
    if address is None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.setblocking(False)
        sock.connect(address)
        sock.send(state.encode())
    return True


def _status(text: str) -> str:
    return " ".join(text.split())  # STATUS is one line


def ready(status: str, *, env: Mapping[str, str] | None = None) -> bool:
    return notify(f"READY=1\nSTATUS={_status(status)}", env=env)


def stopping(status: str = "stopping", *, env: Mapping[str, str] | None = None) -> bool:
    return notify(f"STOPPING=1\nSTATUS={_status(status)}", env=env)
