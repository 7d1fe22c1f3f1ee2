"""Devices' logs on /metrics: each app's crashes and restarts (labels ``host``, ``device``,
``app``), each device's stream (``host``, ``device``) and each viewer's lost lines (``host``,
``device``, ``viewer``).

Layer: prometheus-client and ``ddmd.logcat`` (the hub and its counts). The counts live in the
hub's devices; the apps of ddmd's VMs on a device are handed to it at each scrape, which is what
makes an app's crash counters appear at 0 before its first crash (``logcat/counts.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import Metric

from ddmd.control.metrics.families import Host
from ddmd.logcat.hub import LogcatHub
from ddmd.session.model import VmSnapshot

__all__ = ["LogcatSeries"]


class LogcatSeries:
    def __init__(self, hub: LogcatHub) -> None:
        self._hub = hub

    def collect(self, host: Host, snapshots: Sequence[VmSnapshot]) -> Iterator[Metric]:
        apps: dict[str, list[str]] = {}
        for snap in snapshots:
            if snap.device is not None:
                apps.setdefault(snap.device, []).append(snap.display_name)
        devices = self._hub.counts(apps)
        crashes = host.counter(
            "ddmd_app_crashes_total",
            "Crashes of the app in its device's log (java, native, anr), while ddmd reads it",
            "device",
            "app",
            "kind",
        )
        restarts = host.counter(
            "ddmd_app_restarts_total",
            "Restarts of the app (a new process) seen while ddmd reads its device's log",
            "device",
            "app",
        )
        streaming = host.gauge(
            "ddmd_logcat_streaming",
            "Whether ddmd reads the device's log now (1) or not (0)",
            "device",
        )
        read = host.counter(
            "ddmd_logcat_lines_read_total", "Entries read from the device's log", "device"
        )
        dropped = host.counter(
            "ddmd_logcat_lines_dropped_total",
            "Lines of the device's log that viewers too slow to take them lost",
            "device",
        )
        viewers = host.gauge("ddmd_logcat_viewers", "Viewers of the device's log now", "device")
        reconnects = host.counter(
            "ddmd_logcat_stream_reconnects_total",
            "Times the device's log stream was reopened after it broke, stalled or ended",
            "device",
        )
        viewer_dropped = host.counter(
            "ddmd_logcat_viewer_lines_dropped_total",
            "Lines this viewer of the device's log lost (too slow to take them)",
            "device",
            "viewer",
        )
        for d in devices:
            serial = d.serial
            for app in d.apps:
                for kind, n in app.crashes:
                    crashes.add(n, serial, app.app, kind)
                restarts.add(app.restarts, serial, app.app)
            streaming.add(1 if d.streaming else 0, serial)
            read.add(d.entries, serial)
            dropped.add(d.dropped, serial)
            viewers.add(len(d.viewers), serial)
            reconnects.add(d.reconnects, serial)
            for number, lost in d.viewers:
                viewer_dropped.add(lost, serial, str(number))
        for series in (
            crashes,
            restarts,
            streaming,
            read,
            dropped,
            viewers,
            reconnects,
            viewer_dropped,
        ):
            yield series.family
