"""Each VM's series on /metrics, labelled ``host``, ``device``, ``app`` and ``vm``: built from the
scrape's snapshots, so a VM's series are there while the registry knows it and gone with it.

Layer: prometheus-client and the session's snapshot types. Keeps no state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from prometheus_client.core import Metric

from ddmd.control.metrics.families import Host, Series
from ddmd.control.metrics.totals import ddm_label
from ddmd.session.model import VmSnapshot, vm_label

__all__ = ["LOCAL_DEVICE", "VM_LABELS", "VmSeries", "device_label"]

#: The ``device`` of a VM on a local port (found by the port scan).
LOCAL_DEVICE: Final = "local"
#: The labels of every per-VM series (after ``host``).
VM_LABELS: Final = ("device", "app", "vm")


def device_label(snap: VmSnapshot) -> str:
    return snap.device or LOCAL_DEVICE


class VmSeries:
    """The per-VM families. ``now``: the wall clock of the scrape."""

    def collect(self, host: Host, snapshots: Sequence[VmSnapshot], now: float) -> Iterator[Metric]:
        info = host.gauge(
            "ddmd_vm_info",
            "A VM ddmd knows (1): how it was found, its kind and whether it speaks DDM",
            *VM_LABELS,
            "source",
            "kind",
            "ddm",
        )
        heap_size = _vm_gauge(host, "ddmd_vm_heap_size_bytes", "Heap size of the VM (all heaps)")
        heap_allocated = _vm_gauge(
            host, "ddmd_vm_heap_allocated_bytes", "Bytes allocated in the VM's heaps"
        )
        heap_max = _vm_gauge(
            host, "ddmd_vm_heap_max_bytes", "Largest size the VM's heaps may grow to"
        )
        threads = _vm_gauge(host, "ddmd_vm_threads", "Threads of the VM")
        debuggers = _vm_gauge(host, "ddmd_vm_debuggers", "Debuggers attached to the VM")
        suspended = _vm_gauge(
            host,
            "ddmd_vm_suspended_seconds",
            "How long a debugger has held the VM or some of its threads suspended (0: none does)",
        )
        trip = _vm_gauge(
            host,
            "ddmd_vm_round_trip_seconds",
            "Smoothed round trip of ddmd's own requests to the VM (foresight's auto threshold)",
        )
        connected = _vm_gauge(
            host, "ddmd_vm_connected_seconds", "How long ddmd has been connected to the VM"
        )
        for snap in snapshots:
            labels = (device_label(snap), snap.display_name, snap.id)
            kind = vm_label(snap.vm_ident, snap.description) or "unknown"
            info.add(1, *labels, snap.source, kind, ddm_label(snap.ddm))
            if snap.heaps:
                heap_size.add(sum(h.size for h in snap.heaps), *labels)
                heap_allocated.add(sum(h.bytes_allocated for h in snap.heaps), *labels)
                heap_max.add(sum(h.max_size for h in snap.heaps), *labels)
            if snap.threads is not None:
                threads.add(len(snap.threads), *labels)
            debuggers.add(sum(1 for d in snap.debuggers if d.debugging), *labels)
            held = [d.suspended_since for d in snap.debuggers if d.suspended_since is not None]
            suspended.add(max(0.0, now - min(held)) if held else 0.0, *labels)
            if snap.foresight is not None and snap.foresight.round_trip is not None:
                trip.add(snap.foresight.round_trip, *labels)
            if snap.connected_at is not None:
                connected.add(max(0.0, now - snap.connected_at), *labels)
        for series in (
            info,
            heap_size,
            heap_allocated,
            heap_max,
            threads,
            debuggers,
            suspended,
            trip,
            connected,
        ):
            yield series.family


def _vm_gauge(host: Host, name: str, documentation: str) -> Series:
    return host.gauge(name, documentation, *VM_LABELS)
