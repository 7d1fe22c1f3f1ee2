"""`SystemMonitor`: a DDM client, built only on `ddmd.client`, that reports this machine's load,
memory and CPU use in ``SMON`` chunks.

While a DDM server is connected it pushes one report every ``interval`` seconds (the first right
after the connection opens); an ``SMON`` request with empty data is answered at once with a
report as the reply. Each report's CPU figures cover the time since the previous report.

Layer: `ddmd.client`, `ddmd.sysmon.chunk` and `ddmd.sysmon.proc`, trio and structlog.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

import structlog
import trio

from ddmd.client import DdmClient, NotConnectedError
from ddmd.sysmon.chunk import CHUNK_TYPE, SystemReport
from ddmd.sysmon.proc import PROC, Sampler

__all__ = ["APP_NAME", "PACKAGE_NAME", "SystemMonitor"]

#: How the monitor is listed by the DDM server (the HELO app name) ...
APP_NAME: Final = "system monitor"
#: ... and the HELO package name, a name without spaces for targets and the port book.
PACKAGE_NAME: Final = "ddmd.sysmon"

logger = structlog.get_logger("ddmd.sysmon")


class SystemMonitor:
    """Serve ``SMON`` reports on ``host:port`` (0: a free port; see ``client.port``).

    ``interval`` is the seconds between pushes; ``proc`` the directory to read instead of
    ``/proc`` (tests). Raises ValueError for an interval that is not a positive number.
    """

    def __init__(
        self,
        *,
        port: int,
        host: str = "127.0.0.1",
        interval: float = 1.0,
        proc: Path = PROC,
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ValueError(f"interval must be a number of seconds, not {interval!r}")
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, not {interval!r}")
        self.interval = float(interval)
        self.client = DdmClient(APP_NAME, port=port, host=host, package_name=PACKAGE_NAME)
        self._proc = proc
        self._sampler: Sampler | None = None
        self._lock = trio.Lock()  # one report at a time: each moves the sampler's CPU baseline
        self.reports_pushed = 0
        self.reports_answered = 0
        self.client.on_chunk(CHUNK_TYPE)(self._answer)
        self.client.on_connected(self._push_reports)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the first CPU sample, then serve (`DdmClient.serve`) until cancelled; reports
        the listening port through ``task_status``. A /proc that cannot be read is logged
        (``sysmon.read_failed``) and tried again at each report."""
        try:
            async with self._lock:
                self._sampler = await trio.to_thread.run_sync(Sampler, self._proc)
        except OSError as exc:
            logger.warning("sysmon.read_failed", error=str(exc))
        await self.client.serve(task_status=task_status)

    async def report(self) -> SystemReport:
        """A report now (read in a worker thread; reading /proc never waits on anything).

        Raises OSError when a file cannot be read and ValueError when one is malformed."""
        async with self._lock:
            sampler = self._sampler
            if sampler is None:
                sampler = self._sampler = await trio.to_thread.run_sync(Sampler, self._proc)
            return await trio.to_thread.run_sync(sampler.report)

    async def _answer(self, data: bytes) -> tuple[str, bytes]:
        if data:
            raise ValueError(f"an {CHUNK_TYPE} request carries no data, not {len(data)} bytes")
        report = await self.report()
        self.reports_answered += 1
        return (CHUNK_TYPE, report.encode())

    async def _push_reports(self) -> None:
        """Runs while a server is connected: one push every interval, missed ticks skipped."""
        log = logger.bind(port=self.client.port)
        next_at = trio.current_time()
        failing = False
        while True:
            try:
                report = await self.report()
            except (OSError, ValueError) as exc:
                if not failing:  # once per run of failures, not at every interval
                    log.warning("sysmon.read_failed", error=str(exc))
                failing = True
            else:
                failing = False
                try:
                    await self.client.send_chunk(CHUNK_TYPE, report.encode())
                except NotConnectedError:
                    return
                self.reports_pushed += 1
            now = trio.current_time()
            next_at += self.interval * max(1, math.ceil((now - next_at) / self.interval))
            await trio.sleep_until(next_at)
