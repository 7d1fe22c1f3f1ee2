"""Closing a stream without waiting long or raising: shared by the drivers and discovery.

Layer: trio, structlog, logs.
"""

from __future__ import annotations

import structlog
import trio

from ddmd.logs import Event

log = structlog.get_logger("ddmd.drive")

#: Seconds a close may take before it is given up.
CLOSE_PATIENCE = 1.0


async def aclose_quietly(stream: trio.abc.AsyncResource) -> None:
    """Close ``stream`` within `CLOSE_PATIENCE`, even while the caller is being cancelled; a
    failure to close is logged (debug) and otherwise ignored."""
    with trio.move_on_after(CLOSE_PATIENCE) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except Exception:
            log.debug(Event.STREAM_CLOSE_FAILED)
