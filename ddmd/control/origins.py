"""Which GC the heap figures and the heap segment summaries come from, in a user's words.

``ddmd heap`` and the web page print the same sentences: the daemon says them here, once, in
the ``origins`` object of ``GET /heap`` (and ``POST /heap/dump``, ``POST /gc``), and both only
add the time in their own local clock ("N s ago" on the page).

    origins: {
      heaps:  {at, why, gc} | null      the heap table (HPIF, or a plain JVM's GC.heap_info)
      images: {at, why, gc, note} | null   the segment summaries (HPSG/NHSG after a GC)
    }

``at`` is seconds since the epoch (None: not known); ``gc`` says whose GC it was: "ddmd" (one
ddmd ran: ``ddmd gc``, ``ddmd heap --segments``, the page's Cause GC), "vm" (the VM's own, or
the app's ``System.gc()``: ART does not tell them apart), "none" (no GC: figures asked for as
they are), or "unknown". ``note`` says when the segments and the heap figures come from
different GCs.

How ddmd knows: HPIF's reason byte is the "when" that caused it (1 now, 2 at the next GC, 3 at
every GC). ddmd asks "at the next GC" only right before a GC of its own; "at every GC" covers
every GC, ddmd's too, so the control API remembers the heap figures that came with the GCs it
ran (`HeapOrigins`). A segment dump carries no time: the one that ddmd took is remembered with
the time it ended and the heap figures of that moment (ART sends HPIF before HPSG after a GC).

Layer: `registry` snapshots' plain values; no I/O. Used by `control.app`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ddmd.protocol.heap import HeapImage
from ddmd.session.model import HeapInfoSnapshot

__all__ = ["HeapOrigins", "heaps_origin", "images_origin", "jvm_origin"]

#: How many VMs' records are kept (the oldest is forgotten first).
KEEP_VMS: Final = 256

#: HPIF's reason (the "when" that made the VM send it) in words, for a GC ddmd did not run.
_REASON_WORDS: Final[Mapping[int, tuple[str, str]]] = {
    0: ("unknown", "sent by the VM unasked"),
    1: ("none", "asked for by ddmd as they were (no GC)"),
    2: ("ddmd", "after the GC ddmd ran"),
    3: ("vm", "after a GC of the VM's own (or the app's System.gc())"),
}
_OURS: Final = "after the GC ddmd ran"
_DUMP: Final = "after the GC ddmd ran for a segment dump"


@dataclass(frozen=True, slots=True)
class _Dump:
    images: tuple[HeapImage, ...]
    at: float
    heaps: tuple[HeapInfoSnapshot, ...]  # the heap figures when the dump ended
    fresh: bool  # they came during the dump: its GC's (else from before it)


@dataclass(slots=True)
class _Record:
    gc_heaps: tuple[HeapInfoSnapshot, ...] | None = None  # heap figures of ddmd's last GC
    dump: _Dump | None = None


class HeapOrigins:
    """What the control API remembers of the GCs it ran, per VM (a bounded table)."""

    def __init__(self) -> None:
        self._vms: OrderedDict[str, _Record] = OrderedDict()

    def _record(self, vm_id: str) -> _Record:
        record = self._vms.pop(vm_id, None) or _Record()
        self._vms[vm_id] = record
        while len(self._vms) > KEEP_VMS:
            self._vms.popitem(last=False)
        return record

    def gc_ran(self, vm_id: str, heaps: Sequence[HeapInfoSnapshot]) -> None:
        """ddmd's GC was confirmed: ``heaps`` are the figures it brought."""
        if heaps:
            self._record(vm_id).gc_heaps = tuple(heaps)

    def dumped(
        self,
        vm_id: str,
        images: Sequence[HeapImage],
        heaps: tuple[Sequence[HeapInfoSnapshot], Sequence[HeapInfoSnapshot]],
        at: float,
    ) -> None:
        """ddmd's segment dump (its own GC) ended at ``at`` with ``images``; ``heaps``: the
        heap figures before the dump and when it ended (new ones came with its GC)."""
        before, after = tuple(heaps[0]), tuple(heaps[1])
        fresh = bool(after) and after != before
        record = self._record(vm_id)
        record.dump = _Dump(tuple(images), at, after, fresh)
        if fresh:
            record.gc_heaps = after

    def origins(
        self,
        vm_id: str,
        heaps: Sequence[HeapInfoSnapshot],
        images: Sequence[HeapImage],
    ) -> dict[str, Any]:
        """The ``origins`` object of an ART (or DDM) VM's heap body."""
        record = self._vms.get(vm_id) or _Record()
        return {
            "heaps": heaps_origin(heaps, ours=record.gc_heaps),
            "images": images_origin(images, heaps, record.dump),
        }


def heaps_origin(
    heaps: Sequence[HeapInfoSnapshot], *, ours: Sequence[HeapInfoSnapshot] | None = None
) -> dict[str, Any] | None:
    """Which GC the HPIF figures come from (``ours``: the figures of ddmd's last GC)."""
    if not heaps:
        return None
    first = heaps[0]
    at = first.timestamp_ms / 1000 if first.timestamp_ms else None
    if ours is not None and tuple(heaps) == tuple(ours) and first.reason != 1:
        return {"at": at, "why": _OURS, "gc": "ddmd"}
    gc, why = _REASON_WORDS.get(first.reason, ("unknown", f"sent for reason {first.reason}"))
    return {"at": at, "why": why, "gc": gc}


def images_origin(
    images: Sequence[HeapImage],
    heaps: Sequence[HeapInfoSnapshot],
    dump: _Dump | None,
) -> dict[str, Any] | None:
    """Which GC the segment summaries come from, and whether the heap figures do too."""
    if not images:
        return None
    java = [i for i in images if not i.native]
    if dump is not None and all(any(i is d for d in dump.images) for i in java):
        note = None
        if heaps and tuple(heaps) != dump.heaps:
            note = "the heap figures above come from a later GC than these segments"
        elif heaps and not dump.fresh:
            note = "the heap figures above come from before these segments' GC"
        return {"at": dump.at, "why": _DUMP, "gc": "ddmd", "note": note}
    return {
        "at": None,
        "why": "after a GC ddmd did not run (the VM's own, sent to a tool that asked)",
        "gc": "vm",
        "note": "ddmd cannot tell whether the heap figures above come from the same GC",
    }


def jvm_origin(jvm_heap: Mapping[str, Any], at: float, *, after_gc: bool = False) -> dict[str, Any]:
    """A plain JVM's figures: ``jcmd GC.heap_info`` at ``at`` (no GC of its own), named by
    its collector when jcmd says it."""
    collector = jvm_heap.get("collector")
    named = f", {collector} collector" if isinstance(collector, str) and collector else ""
    if after_gc:
        why = f"jcmd GC.heap_info right after the GC ddmd ran (GC.run{named})"
        return {"at": at, "why": why, "gc": "ddmd"}
    why = f"jcmd GC.heap_info as the heap was (no GC{named})"
    return {"at": at, "why": why, "gc": "none"}
