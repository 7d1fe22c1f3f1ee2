"""`SimHeap`: a simulated VM's heap as the DDM heap chunks show it (built on first use), and its
garbage collector: each GC changes one piece of the layout, lets the allocation tracker take
what the app allocated, and pushes what the connection asked for (HPIF, HPSG, NHSG).

Layer: imports ``ddmd.sim`` (`config`, `heap`, `link`, `ddms`) and trio; used by `sim.vm` and
`sim.ddmhandlers`.
"""

from __future__ import annotations

import random

import trio

from ddmd.sim.config import SimConfig
from ddmd.sim.ddms import DdmsFeatures
from ddmd.sim.heap import (
    HeapPiece,
    build_heap,
    dump_chunks,
    heap_info_chunk,
    mutate_piece,
    native_dump_chunks,
)
from ddmd.sim.link import SimLink

__all__ = ["SimHeap"]


class SimHeap:
    """The heap layout and the GC of one `SimVm`; pushes go out on ``link``'s connection."""

    def __init__(
        self, config: SimConfig, rng: random.Random, link: SimLink, ddms: DdmsFeatures
    ) -> None:
        self._config = config
        self._rng = rng
        self._link = link
        self._ddms = ddms
        self._heap: list[HeapPiece] | None = None
        self._gc_lock = trio.Lock()
        self.gcs = 0

    def info(self, reason: int) -> bytes:
        """HPIF data for the heap as it is now: the very layout a segment dump would send."""
        return heap_info_chunk(self.pieces(), reason)

    def pieces(self) -> list[HeapPiece]:
        """The layout, built now if nobody asked before."""
        if self._heap is None:
            self._heap = build_heap(self._rng, self._config.heap_mb << 20, draft=self._config.draft)
        return self._heap

    async def gc(self) -> None:
        async with self._gc_lock:  # one dump sequence at a time: HPST ... HPEN never interleave
            self.gcs += 1
            if self._heap is not None:  # built once someone asks for heap info or a dump
                index = self._rng.randrange(len(self._heap))
                mutate_piece(self._rng, self._heap[index])
            self._ddms.after_gc()  # what the app allocated since the last GC
            conn = self._link.conn
            if conn is None:
                return
            push = self._link.push
            if conn.hpif_when in (2, 3):
                reason = conn.hpif_when
                if reason == 2:
                    conn.hpif_when = 0  # one shot
                await push(self.info(reason), conn)
            if conn.hpsg_when:
                for chunk in dump_chunks(self.pieces(), objects=bool(conn.hpsg_what)):
                    await push(chunk, conn)
            if conn.nhsg_when:  # ART never walks the native heap: start and end only
                for chunk in native_dump_chunks():
                    await push(chunk, conn)

    async def gc_loop(self) -> None:
        interval = self._config.gc_interval
        await trio.sleep(interval * self._rng.uniform(0.5, 1.0))  # spread many VMs out
        while True:
            await self.gc()
            await trio.sleep(interval * self._rng.uniform(0.8, 1.2))
