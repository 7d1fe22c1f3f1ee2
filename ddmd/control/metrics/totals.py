"""The daemon's own figures on /metrics: its version, VMs and debuggers counted, the relay's
and foresight's counters, the scan, the event streams, the peer check and the task count.

Layer: prometheus-client, registry types, `drive.supervisor` (``RelayTotals``), `control.events`
and `peers`. Keeps no state: counters come from the VM actors' own counts
(``bridge_statistics()``, ``statistics()``) plus ``RelayTotals``, where the supervisor adds the
final counts of every VM that went away, so a counter never goes down when a VM disconnects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import trio
from prometheus_client.core import Metric

from ddmd.control.events import EventHub
from ddmd.control.metrics.families import Host
from ddmd.drive.supervisor import CountedVm, RelayTotals
from ddmd.peers import PORT_KINDS, PeerGuard
from ddmd.session.model import VmSnapshot

__all__ = ["DDM_LABELS", "SOURCES", "DaemonTotals", "ddm_label", "trio_task_count"]

SOURCES = ("tcp", "adb")
DDM_LABELS = ("yes", "no", "unknown")


def ddm_label(ddm: bool | None) -> str:
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


class DaemonTotals:
    """The daemon-wide families (`collect` is given the scrape's VM snapshots)."""

    def __init__(
        self,
        *,
        vms: Callable[[], Iterable[CountedVm]],
        retired: RelayTotals,
        scan_probes: Callable[[], int],
        hub: EventHub | None,
        peers: PeerGuard | None,
        version: str,
    ) -> None:
        self._vms = vms
        self._retired = retired
        self._scan_probes = scan_probes
        self._hub = hub
        self._peers = peers
        self._version = version

    def collect(self, host: Host, snapshots: Sequence[VmSnapshot]) -> Iterator[Metric]:
        info = host.gauge("ddmd_info", "ddmd version", "version")
        info.add(1, self._version)
        yield info.family
        yield from self._vm_counts(host, snapshots)
        yield from self._relay(host, self._retired.plus(self._vms()))
        yield host.one_counter(
            "ddmd_scan_probes_total", "Port-scan connection attempts", self._scan_probes()
        )
        if self._hub is not None:
            stats = self._hub.statistics()
            yield host.one_gauge(
                "ddmd_event_stream_subscribers",
                "Open event streams (/api/v1/events)",
                stats.subscribers,
            )
            yield host.one_counter(
                "ddmd_event_stream_dropped_total",
                "Event streams closed because their reader fell behind",
                stats.dropped,
            )
        if self._peers is not None:
            refused = self._peers.refused_counts()
            peers = host.counter(
                "ddmd_peers_refused_total",
                "Connections refused because their user may not connect ([security])",
                "port_kind",
            )
            for kind in PORT_KINDS:
                peers.add(refused.get(kind, 0), kind)
            yield peers.family
        tasks = trio_task_count()
        if tasks is not None:
            yield host.one_gauge(
                "ddmd_trio_tasks", "Tasks alive in the daemon (trio's task tree)", tasks
            )

    @staticmethod
    def _vm_counts(host: Host, snapshots: Sequence[VmSnapshot]) -> Iterator[Metric]:
        counts = {(s, d): 0 for s in SOURCES for d in DDM_LABELS}
        for snap in snapshots:
            key = (snap.source, ddm_label(snap.ddm))
            counts[key] = counts.get(key, 0) + 1
        vms = host.gauge(
            "ddmd_vms",
            "VMs known to the daemon, by discovery source and DDM support",
            "source",
            "ddm",
        )
        for (source, ddm), n in sorted(counts.items()):
            vms.add(n, source, ddm)
        yield vms.family
        yield host.one_gauge(
            "ddmd_debuggers_attached",
            "Debuggers attached to a VM through ddmd",
            sum(len(s.debuggers) for s in snapshots),
        )

    @staticmethod
    def _relay(host: Host, total: RelayTotals) -> Iterator[Metric]:
        packets = host.counter(
            "ddmd_relayed_packets_total",
            "JDWP packets relayed between debuggers and VMs",
            "direction",
        )
        packets.add(total.packets_to_vm, "to_vm")
        packets.add(total.packets_to_debugger, "to_debugger")
        yield packets.family
        relayed = host.counter(
            "ddmd_relayed_bytes_total", "JDWP bytes relayed between debuggers and VMs", "direction"
        )
        relayed.add(total.bytes_to_vm, "to_vm")
        relayed.add(total.bytes_to_debugger, "to_debugger")
        yield relayed.family
        yield host.one_counter(
            "ddmd_ddm_request_timeouts_total",
            "Requests of ddmd's own (DDM, JDWP Version) a VM did not answer in time",
            total.requests_timed_out,
        )
        answered = host.counter(
            "ddmd_foresight_answered_total",
            "Debuggers' commands ddmd answered itself (foresight), from replies kept or from its "
            "own speculative commands",
            "source",
        )
        answered.add(total.answered_cache, "cache")
        answered.add(total.answered_speculation, "speculation")
        yield answered.family
        yield host.one_counter(
            "ddmd_foresight_wasted_total",
            "Speculative commands whose reply no debugger asked for before it went stale",
            total.speculation_wasted,
        )
        yield host.one_counter(
            "ddmd_vm_reconnects_total",
            "VM connections reopened (after a debugger left)",
            total.reconnects,
        )
        yield host.one_counter(
            "ddmd_debuggers_dropped_slow_total",
            "Debuggers disconnected because they did not read fast enough (slow consumer)",
            total.slow_debuggers,
        )
