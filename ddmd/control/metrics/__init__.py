"""`/metrics`: Prometheus text format through prometheus-client, read from live state at scrape
time. docs/metrics.md is the reference of every family.

Layer: prometheus-client, the registry, `control.events`, `drive.supervisor`, `peers` and
``ddmd.logcat``; used by `daemon`. No global registry: the daemon builds one
``CollectorRegistry`` per app with one `DaemonCollector`. It keeps no state of its own: at each
scrape it takes the VMs' snapshots once and hands them to its parts, one per area:

- `totals.DaemonTotals`: the daemon's own figures (``ddmd_vms``, the relay's counters, ...);
- `vms.VmSeries`: each VM's series (``ddmd_vm_*``), there while the VM is known;
- `logcat.LogcatSeries`: apps' crashes and restarts, devices' log streams (with adb);
- `front.FrontSeries`: the adb front's counters (while it listens).

Every series has the ``host`` label first (``[metrics] host``); `FAMILIES` lists every family
name that can appear, with its type.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ddmd import __version__
from ddmd.config.schema import this_host
from ddmd.control.events import EventHub
from ddmd.control.metrics.families import FAMILIES, HOST_LABEL, Host
from ddmd.control.metrics.front import FrontCounts, FrontSeries
from ddmd.control.metrics.logcat import LogcatSeries
from ddmd.control.metrics.totals import DaemonTotals, trio_task_count
from ddmd.control.metrics.vms import VmSeries
from ddmd.drive.supervisor import CountedVm, RelayTotals
from ddmd.logcat.hub import LogcatHub
from ddmd.peers import PeerGuard
from ddmd.registry import VmRegistry

__all__ = [
    "FAMILIES",
    "HOST_LABEL",
    "METRICS_PATH",
    "DaemonCollector",
    "FrontCounts",
    "RelayTotals",
    "make_registry",
    "metrics_route",
    "trio_task_count",
]

METRICS_PATH = "/metrics"


class DaemonCollector:
    """A prometheus-client collector over the daemon's live objects (read at scrape time).
    ``host``: the ``host`` label (default: this machine's host name); ``logcat``: the devices'
    logs (None without adb); ``front``: the adb front's counters, None while it does not
    listen; ``clock``: the wall clock (for how long a VM has been suspended or connected)."""

    def __init__(
        self,
        registry: VmRegistry,
        *,
        vms: Callable[[], Iterable[CountedVm]],
        retired: RelayTotals,
        scan_probes: Callable[[], int] = lambda: 0,
        hub: EventHub | None = None,
        peers: PeerGuard | None = None,
        version: str = __version__,
        host: str | None = None,
        logcat: LogcatHub | None = None,
        front: Callable[[], FrontCounts | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._registry = registry
        self._host = Host(this_host() if host is None else host)
        self._clock = clock
        self._totals = DaemonTotals(
            vms=vms,
            retired=retired,
            scan_probes=scan_probes,
            hub=hub,
            peers=peers,
            version=version,
        )
        self._vms = VmSeries()
        self._logcat = LogcatSeries(logcat) if logcat is not None else None
        self._front = FrontSeries(front) if front is not None else None

    def collect(self) -> Iterator[Metric]:
        host = self._host
        snapshots = self._registry.snapshots()  # once per scrape, never kept
        yield from self._totals.collect(host, snapshots)
        yield from self._vms.collect(host, snapshots, self._clock())
        if self._logcat is not None:
            yield from self._logcat.collect(host, snapshots)
        if self._front is not None:
            yield from self._front.collect(host)


def make_registry(collector: DaemonCollector) -> CollectorRegistry:
    """A fresh prometheus-client registry holding only ``collector`` (never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def metrics_route(registry: CollectorRegistry) -> Route:
    """``GET /metrics``: the text format (or OpenMetrics when the scraper asks for it)."""

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), headers={"Content-Type": content_type})

    return Route(METRICS_PATH, metrics, methods=["GET"])
