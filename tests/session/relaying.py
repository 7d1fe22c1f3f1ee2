"""The relay lane as the driver uses it, for tests: decide (``relay_from_*``, which changes
nothing), then commit the decision (``relayed_from_*``), as ``drive/relay.py`` does around its
write. Each returns the command the general path would have returned, or None (not taken, and
nothing changed)."""

from __future__ import annotations

from ddmd.session.commands import SendToDebugger, SendToVm
from ddmd.session.router import Router


def lane_from_vm(router: Router, data: bytes) -> SendToDebugger | None:
    lane = router.relay_from_vm(data)
    if lane is None:
        return None
    router.relayed_from_vm(lane)
    return SendToDebugger(lane[0], lane[1])


def lane_from_debugger(router: Router, number: int, data: bytes) -> SendToVm | None:
    lane = router.relay_from_debugger(number, data)
    if lane is None:
        return None
    router.relayed_from_debugger(lane)
    return SendToVm(lane[0])
