"""`/metrics`: Prometheus text format through prometheus-client, read from live state at scrape
time.

Layer: imports registry and `control.events` (for types); used by `daemon`. No global registry:
the daemon builds one ``CollectorRegistry`` per app with one `DaemonCollector`, which keeps no
state of its own. Counters come from the VM actors' own counts (``bridge_statistics()``,
``statistics()``) plus ``RelayTotals``, where the supervisor adds the final counts of every VM
that went away, so a counter never goes down when a VM disconnects.

Metrics (all prefixed ``ddmd_``)::

    ddmd_info{version}                               gauge 1
    ddmd_vms{source, ddm}                            gauge: known VMs; ddm = yes|no|unknown
    ddmd_debuggers_attached                          gauge
    ddmd_relayed_packets_total{direction}            counter: to_vm | to_debugger
    ddmd_relayed_bytes_total{direction}              counter
    ddmd_ddm_request_timeouts_total                  counter: ddmd's own requests unanswered
    ddmd_vm_reconnects_total                         counter: VM connections reopened
    ddmd_scan_probes_total                           counter: port-scan connection attempts
    ddmd_debuggers_dropped_slow_total                counter: debugger.slow_consumer drops
    ddmd_event_stream_subscribers                    gauge: open /api/v1/events streams
    ddmd_event_stream_dropped_total                  counter: streams closed for falling behind
    ddmd_peers_refused_total{port_kind}              counter: connections from users who may not
                                                     connect (vm_port | current_port | control)
    ddmd_trio_tasks                                  gauge: tasks alive in the daemon's task
                                                     tree (a leak shows as a steady climb)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ddmd import __version__
from ddmd.control.events import EventHub
from ddmd.drive.supervisor import CountedVm, RelayTotals
from ddmd.peers import PORT_KINDS, PeerGuard
from ddmd.registry import VmRegistry

__all__ = [
    "METRICS_PATH",
    "DaemonCollector",
    "RelayTotals",
    "make_registry",
    "metrics_route",
    "trio_task_count",
]

METRICS_PATH = "/metrics"
_SOURCES = ("tcp", "adb")
_DDM = ("yes", "no", "unknown")


def _ddm_label(ddm: bool | None) -> str:
    return "unknown" if ddm is None else ("yes" if ddm else "no")


def trio_task_count() -> int | None:
    """Tasks alive under the root task of the running trio loop (itself included); None
    outside trio. Walks the task tree: cheap next to a scrape (hundreds of tasks)."""
    try:
        root = trio.lowlevel.current_root_task()
    except RuntimeError:
        return None
    if root is None:
        return None
    count = 0
    pending = [root]
    while pending:
        task = pending.pop()
        count += 1
        for nursery in task.child_nurseries:
            pending.extend(nursery.child_tasks)
    return count


class DaemonCollector:
    """A prometheus-client collector over the daemon's live objects (read at scrape time)."""

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
    ) -> None:
        self._peers = peers
        self._registry = registry
        self._vms = vms
        self._retired = retired
        self._scan_probes = scan_probes
        self._hub = hub
        self._version = version

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("ddmd_info", "ddmd version", labels=["version"])
        info.add_metric([self._version], 1)
        yield info

        snapshots = self._registry.snapshots()
        counts = {(s, d): 0 for s in _SOURCES for d in _DDM}
        for snap in snapshots:
            key = (snap.source, _ddm_label(snap.ddm))
            counts[key] = counts.get(key, 0) + 1
        vms = GaugeMetricFamily(
            "ddmd_vms",
            "VMs known to the daemon, by discovery source and DDM support",
            labels=["source", "ddm"],
        )
        for (source, ddm), n in sorted(counts.items()):
            vms.add_metric([source, ddm], n)
        yield vms
        yield GaugeMetricFamily(
            "ddmd_debuggers_attached",
            "Debuggers attached to a VM through ddmd",
            value=sum(len(s.debuggers) for s in snapshots),
        )

        total = self._retired.plus(self._vms())
        packets = CounterMetricFamily(
            "ddmd_relayed_packets",
            "JDWP packets relayed between debuggers and VMs",
            labels=["direction"],
        )
        packets.add_metric(["to_vm"], total.packets_to_vm)
        packets.add_metric(["to_debugger"], total.packets_to_debugger)
        yield packets
        relayed = CounterMetricFamily(
            "ddmd_relayed_bytes",
            "JDWP bytes relayed between debuggers and VMs",
            labels=["direction"],
        )
        relayed.add_metric(["to_vm"], total.bytes_to_vm)
        relayed.add_metric(["to_debugger"], total.bytes_to_debugger)
        yield relayed
        yield CounterMetricFamily(
            "ddmd_ddm_request_timeouts",
            "Requests of ddmd's own (DDM, JDWP Version) a VM did not answer in time",
            value=total.requests_timed_out,
        )
        answered = CounterMetricFamily(
            "ddmd_foresight_answered",
            "Debuggers' commands ddmd answered itself (foresight), from replies kept or from its "
            "own speculative commands",
            labels=["source"],
        )
        answered.add_metric(["cache"], total.answered_cache)
        answered.add_metric(["speculation"], total.answered_speculation)
        yield answered
        yield CounterMetricFamily(
            "ddmd_foresight_wasted",
            "Speculative commands whose reply no debugger asked for before it went stale",
            value=total.speculation_wasted,
        )
        trip = GaugeMetricFamily(
            "ddmd_vm_round_trip_seconds",
            "Smoothed round trip of ddmd's own requests to a VM (foresight's auto threshold)",
            labels=["vm"],
        )
        for snap in snapshots:
            if snap.foresight is not None and snap.foresight.round_trip is not None:
                trip.add_metric([snap.id], snap.foresight.round_trip)
        yield trip
        yield CounterMetricFamily(
            "ddmd_vm_reconnects",
            "VM connections reopened (after a debugger left)",
            value=total.reconnects,
        )
        yield CounterMetricFamily(
            "ddmd_scan_probes", "Port-scan connection attempts", value=self._scan_probes()
        )
        yield CounterMetricFamily(
            "ddmd_debuggers_dropped_slow",
            "Debuggers disconnected because they did not read fast enough (slow consumer)",
            value=total.slow_debuggers,
        )
        if self._hub is not None:
            stats = self._hub.statistics()
            yield GaugeMetricFamily(
                "ddmd_event_stream_subscribers",
                "Open event streams (/api/v1/events)",
                value=stats.subscribers,
            )
            yield CounterMetricFamily(
                "ddmd_event_stream_dropped",
                "Event streams closed because their reader fell behind",
                value=stats.dropped,
            )
        if self._peers is not None:
            refused = self._peers.refused_counts()
            peers = CounterMetricFamily(
                "ddmd_peers_refused",
                "Connections refused because their user may not connect ([security])",
                labels=["port_kind"],
            )
            for kind in PORT_KINDS:
                peers.add_metric([kind], refused.get(kind, 0))
            yield peers
        tasks = trio_task_count()
        if tasks is not None:
            yield GaugeMetricFamily(
                "ddmd_trio_tasks", "Tasks alive in the daemon (trio's task tree)", value=tasks
            )


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
