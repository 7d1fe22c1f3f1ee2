"""The adb front on /metrics (labels ``host``; the forwards also ``device``), while it listens.

Layer: prometheus-client only: the front stands above ``control`` (tests/test_layers.py), so
its counters (``ddmd.front.stats.FrontStatistics``) are read through `FrontCounts` and a
callable the daemon gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import Metric

from ddmd.control.metrics.families import Host

__all__ = ["FrontCounts", "FrontSeries"]


class FrontCounts(Protocol):
    """What the collector reads of the front's counters (``FrontStatistics``)."""

    @property
    def connections(self) -> int: ...
    @property
    def relayed(self) -> int: ...
    @property
    def jdwp_served(self) -> int: ...
    @property
    def jdwp_relayed(self) -> int: ...
    @property
    def forwards_by_device(self) -> Mapping[str, int]: ...
    @property
    def forward_connections(self) -> int: ...
    @property
    def forward_refused(self) -> int: ...
    @property
    def kills_refused(self) -> int: ...
    @property
    def bad_requests(self) -> int: ...
    @property
    def timeouts(self) -> int: ...
    @property
    def upstream_failures(self) -> int: ...


class FrontSeries:
    """``counts()``: the running front's counters, None when no front listens (then the front
    has no series)."""

    def __init__(self, counts: Callable[[], FrontCounts | None]) -> None:
        self._counts = counts

    def collect(self, host: Host) -> Iterator[Metric]:
        s = self._counts()
        if s is None:
            return
        yield host.one_counter(
            "ddmd_front_connections_total", "Connections accepted by the adb front", s.connections
        )
        forwards = host.gauge(
            "ddmd_front_forwards", "JDWP forwards the adb front owns now (adb forward)", "device"
        )
        for serial, n in sorted(s.forwards_by_device.items()):
            forwards.add(n, serial)
        yield forwards.family
        yield host.one_counter(
            "ddmd_front_forward_connections_total",
            "Connections to the front's forwards handed to ddmd's VM connections",
            s.forward_connections,
        )
        refused = host.counter(
            "ddmd_front_requests_refused_total",
            "Requests the adb front refused or could not serve, by reason",
            "reason",
        )
        refused.add(s.bad_requests, "bad_request")
        refused.add(s.timeouts, "timeout")
        refused.add(s.upstream_failures, "no_server")
        refused.add(s.kills_refused, "kill")
        refused.add(s.forward_refused, "no_vm")
        yield refused.family
        yield host.one_counter(
            "ddmd_front_requests_relayed_total",
            "Requests the adb front relayed to the adb server",
            s.relayed,
        )
        jdwp = host.counter(
            "ddmd_front_jdwp_connections_total",
            "jdwp:PID connections through the front, by who served them (ddmd, or the adb server)",
            "served_by",
        )
        jdwp.add(s.jdwp_served, "ddmd")
        jdwp.add(s.jdwp_relayed, "adb")
        yield jdwp.family
