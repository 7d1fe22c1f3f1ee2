"""The server side of ``ddmd sysmon``: a chunk handler built only on ``ddmd.ext``.

It is registered like any plugin, as the entry point ``sysmon`` in the group
``ddmd.handlers`` (ddmd's own ``pyproject.toml``), so ``[extensions] disabled = ["sysmon"]``
turns it off. For every DDM client that pushes ``SMON`` reports it publishes::

    {"kind": "system monitor", "latest": {...one report...}, "history": [...]}

``latest`` has the load averages, memory in KiB and per-CPU busy shares (0-1); ``history``
keeps the last 5 minutes of (time, load1, memory used share) for the web page's charts. On
connect it asks for a report at once, so the figures are there before the first interval ends.

Layer: ``ddmd.ext`` and ``ddmd.sysmon.chunk`` only (no trio, no daemon internals).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ddmd.ext import ChunkHandler, VmContext
from ddmd.protocol.errors import ProtocolError
from ddmd.sysmon.chunk import CHUNK_TYPE, SystemReport, decode_report

__all__ = ["HISTORY_MS", "SystemMonitorHandler", "make_handler", "report_json"]

#: How much history the charts show.
HISTORY_MS = 5 * 60 * 1000
KIND = "system monitor"
PACKAGE = "ddmd.sysmon"  # what ``ddmd sysmon`` reports in its HELO


def report_json(report: SystemReport) -> dict[str, Any]:
    used = None
    if report.mem_total and report.mem_available is not None:
        used = round(1 - report.mem_available / report.mem_total, 4)
    return {
        "timestamp_ms": report.timestamp_ms,
        "load": list(report.loads),
        "mem_total_kib": report.mem_total,
        "mem_available_kib": report.mem_available,
        "mem_free_kib": report.mem_free,
        "swap_total_kib": report.swap_total,
        "swap_free_kib": report.swap_free,
        "mem_used_share": used,
        "cpu_period_ms": report.cpu_period_ms,
        "cpu_busy": [None if b is None else b / 1000 for b in report.cpu_busy],
    }


class SystemMonitorHandler(ChunkHandler):
    """Decodes ``SMON`` reports and publishes the latest figures and a 5-minute history."""

    name = "sysmon"
    chunk_types = (CHUNK_TYPE,)

    def connected(self, vm: VmContext) -> None:
        vm.data["history"] = deque()
        if _is_monitor(vm):
            vm.send_chunk(CHUNK_TYPE)  # a report now, not at the end of the first interval

    def handle_chunk(
        self, vm: VmContext, chunk_type: str, data: bytes, is_reply: bool, msg_id: int
    ) -> None:
        if chunk_type != CHUNK_TYPE or not data:
            return  # an empty reply, or a FAIL: the next push will do
        try:
            report = decode_report(data)
        except ProtocolError:
            vm.data["bad_reports"] = vm.data.get("bad_reports", 0) + 1
            return
        history: deque[list[Any]] = vm.data.setdefault("history", deque())
        latest = report_json(report)
        history.append([report.timestamp_ms, latest["load"][0], latest["mem_used_share"]])
        while history and history[0][0] < report.timestamp_ms - HISTORY_MS:
            history.popleft()
        vm.publish({"kind": KIND, "latest": latest, "history": list(history)})


def _is_monitor(vm: VmContext) -> bool:
    """Only ``ddmd sysmon`` is asked (its HELO names the package; a phone's VM never is)."""
    snapshot = vm.snapshot()
    return snapshot.get("package") == PACKAGE or CHUNK_TYPE in (snapshot.get("features") or [])


def make_handler() -> SystemMonitorHandler:
    """The ``ddmd.handlers`` entry point."""
    return SystemMonitorHandler()
