"""Heap picture benchmark: how long ddmd takes to draw the heap bitmap of a large heap.

Run: ``.venv/bin/python bench/heapimage_render.py [MiB] [repeats]`` (default 64 MiB, 3 times).
Prints, for this machine, the number of HPSG pairs, the picture's layout and the time of each
render of `ddmd.control.heapimage.render_png` (what ``GET /api/v1/vms/TARGET/heap.png`` runs
in a worker thread), and writes the same line to ``artifacts/heapimage-bench.txt``.

The heap is the one tests/web/test_heapimage.py draws (there without any timing): 8-byte
units in runs of about four units, 512 KiB segments, a 64 KiB gap after every eighth segment;
about two million pairs for 64 MiB.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ddmd.control.heapimage import render_png
from ddmd.protocol.heap import HeapAssembler, HeapImage, SegmentKind

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


def big_heap(mib: int = 64) -> HeapImage:
    pattern = bytes([0x01, 2, 0x00, 0, 0x11, 6, 0x09, 3, 0x21, 1, 0x00, 4, 0x29, 0, 0x19, 2])
    pattern_units = sum(pattern[1::2]) + len(pattern) // 2  # 30
    repeats = (512 * 1024 // 8) // pattern_units
    units = repeats * pattern_units
    usage = pattern * repeats
    assembler = HeapAssembler()
    assembler.start(1)
    address = 0x1300_0000
    for index in range(mib * 2):
        problems = assembler.segment(SegmentKind.HPSG, 1, 8, address, 0, units, usage)
        if problems:
            raise RuntimeError(f"the benchmark heap is malformed: {problems}")
        address += units * 8 + (64 * 1024 if index % 8 == 7 else 0)
    return assembler.end(1)


def main(mib: int = 64, repeat: int = 3) -> str:
    image = big_heap(mib)
    pairs = sum(s.pair_count for s in image.segments)
    times = []
    layout = None
    for _ in range(repeat):
        began = time.perf_counter()
        rendered = render_png(image)
        times.append(time.perf_counter() - began)
        if rendered is None:
            raise RuntimeError("the benchmark heap has no segments")
        layout = rendered.layout
    each = ", ".join(f"{t * 1000:.0f} ms" for t in times)
    report = f"heap picture: {mib} MiB, {pairs} pairs, {layout} rendered in {each}"
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "heapimage-bench.txt").write_text(report + "\n")
    return report


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    print(main(*args))
