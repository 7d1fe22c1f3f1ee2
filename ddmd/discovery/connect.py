"""What both discoverers do to open a VM's connection: the JDWP handshake, closing a stream
that is not handed over, and the back-off between attempts.

Layer: imports `protocol.jdwp` (the handshake bytes), logs and trio; used by `discovery.scan`
and `discovery.adb`.
"""

from __future__ import annotations

import structlog
import trio

from ddmd.drive.streams import aclose_quietly
from ddmd.protocol.jdwp import HANDSHAKE

__all__ = ["NotJdwp", "aclose_quietly", "backoff", "jdwp_handshake"]

log = structlog.get_logger("ddmd.discovery")

#: Seconds a stream gets to close (shielded from the caller's cancellation).
_MAX_DOUBLINGS = 64


class NotJdwp(Exception):
    """The peer answered, but not with a JDWP handshake."""


async def jdwp_handshake(stream: trio.abc.Stream) -> bytes:
    """Send the JDWP handshake and read the echo; returns any bytes received after it.

    `NotJdwp` when the peer answers something else or closes first. No timeout of its own:
    the caller bounds it with ``[timeouts] handshake``.
    """
    await stream.send_all(HANDSHAKE)
    got = b""
    while len(got) < len(HANDSHAKE):
        data = await stream.receive_some(4096)
        if not data:
            raise NotJdwp(f"the stream closed after {len(got)} bytes of the JDWP handshake")
        got += data
        if not HANDSHAKE.startswith(got[: len(HANDSHAKE)]):
            raise NotJdwp(f"answered {got[:32]!r} instead of the JDWP handshake")
    return got[len(HANDSHAKE) :]


def backoff(failures: int, first: float, cap: float) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row: ``first``, doubling with
    every further failure, at most ``cap``. (The exponent stops growing long after ``cap`` is
    reached: a port that fails for days must not overflow the float.)"""
    return float(min(first * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS), cap))
