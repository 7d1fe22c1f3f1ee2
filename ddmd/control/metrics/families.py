"""Every metric family ddmd can export (`FAMILIES`), and `Host`, which makes them: each with the
``host`` label first, so that one Prometheus can scrape several lab hosts without relabelling.

Layer: prometheus-client only. docs/metrics.md describes each family; a test scrapes a daemon
and checks that nothing outside `FAMILIES` appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["FAMILIES", "HOST_LABEL", "Host", "Series"]

HOST_LABEL: Final = "host"

#: Every family name as it appears in the text exposition (counters with ``_total``) -> its
#: type, "counter" or "gauge".
FAMILIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # The daemon (totals.py)
        "ddmd_info": "gauge",
        "ddmd_vms": "gauge",
        "ddmd_debuggers_attached": "gauge",
        "ddmd_relayed_packets_total": "counter",
        "ddmd_relayed_bytes_total": "counter",
        "ddmd_ddm_request_timeouts_total": "counter",
        "ddmd_foresight_answered_total": "counter",
        "ddmd_foresight_wasted_total": "counter",
        "ddmd_vm_reconnects_total": "counter",
        "ddmd_scan_probes_total": "counter",
        "ddmd_debuggers_dropped_slow_total": "counter",
        "ddmd_event_stream_subscribers": "gauge",
        "ddmd_event_stream_dropped_total": "counter",
        "ddmd_peers_refused_total": "counter",
        "ddmd_trio_tasks": "gauge",
        # Each VM (vms.py)
        "ddmd_vm_info": "gauge",
        "ddmd_vm_heap_size_bytes": "gauge",
        "ddmd_vm_heap_allocated_bytes": "gauge",
        "ddmd_vm_heap_max_bytes": "gauge",
        "ddmd_vm_threads": "gauge",
        "ddmd_vm_debuggers": "gauge",
        "ddmd_vm_suspended_seconds": "gauge",
        "ddmd_vm_round_trip_seconds": "gauge",
        "ddmd_vm_connected_seconds": "gauge",
        # Each app of a device, and each device's log (logcat.py)
        "ddmd_app_crashes_total": "counter",
        "ddmd_app_restarts_total": "counter",
        "ddmd_logcat_streaming": "gauge",
        "ddmd_logcat_lines_read_total": "counter",
        "ddmd_logcat_lines_dropped_total": "counter",
        "ddmd_logcat_viewers": "gauge",
        "ddmd_logcat_stream_reconnects_total": "counter",
        "ddmd_logcat_viewer_lines_dropped_total": "counter",
        # The adb front (front.py)
        "ddmd_front_connections_total": "counter",
        "ddmd_front_forwards": "gauge",
        "ddmd_front_forward_connections_total": "counter",
        "ddmd_front_requests_refused_total": "counter",
        "ddmd_front_requests_relayed_total": "counter",
        "ddmd_front_jdwp_connections_total": "counter",
    }
)


class Series:
    """One family being filled: `add` one series of it (its labels after ``host``)."""

    def __init__(self, family: GaugeMetricFamily | CounterMetricFamily, host: str) -> None:
        self.family = family
        self._host = host

    def add(self, value: float, *labels: str) -> None:
        self.family.add_metric([self._host, *labels], value)


@dataclass(frozen=True, slots=True)
class Host:
    """Makes ddmd's families for the host named ``name`` (``[metrics] host``)."""

    name: str

    def gauge(self, name: str, documentation: str, *labels: str) -> Series:
        return Series(
            GaugeMetricFamily(_known(name, "gauge"), documentation, labels=_all(labels)), self.name
        )

    def counter(self, name: str, documentation: str, *labels: str) -> Series:
        family = CounterMetricFamily(_known(name, "counter"), documentation, labels=_all(labels))
        return Series(family, self.name)

    def one_gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        """A gauge family of one series (no label but ``host``)."""
        family = GaugeMetricFamily(_known(name, "gauge"), documentation, labels=[HOST_LABEL])
        family.add_metric([self.name], value)
        return family

    def one_counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        """A counter family of one series (no label but ``host``)."""
        family = CounterMetricFamily(_known(name, "counter"), documentation, labels=[HOST_LABEL])
        family.add_metric([self.name], value)
        return family


def _known(name: str, kind: str) -> str:
    """``name`` if `FAMILIES` lists it as ``kind`` (a programming error otherwise)."""
    if FAMILIES.get(name) != kind:
        raise ValueError(f"{name} is not a {kind} of FAMILIES")
    return name


def _all(labels: tuple[str, ...]) -> list[str]:
    return [HOST_LABEL, *labels]
