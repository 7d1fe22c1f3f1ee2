"""A realistic large managed heap as HPSG chunk data, and a timing of decode + summary.

Run: ``.venv/bin/python bench/heap_fixture.py [MiB]`` (default 64).

The heap is built like a shipped VM's dump: unit size 8, runs for every object and every
gap (never merged), runs over 256 units split into P pieces, and a new chunk (with its own
start address, offset 0) whenever the next run would not fit into 16,368 bytes of chunk
data. Object sizes average about 30 bytes, so 64 MiB gives about two million pairs.
"""

from __future__ import annotations

import random
import struct
import sys
import time

from ddmd.protocol.heap import HeapAssembler, SegmentKind

UNIT = 8
CHUNK_LIMIT = 16_368  # bytes of chunk data a shipped VM puts in one HPSG chunk
HEADER = struct.Struct(">IBIII")
PAIRS_PER_CHUNK = (CHUNK_LIMIT - HEADER.size) // 2

# (state, min units, max units, weight): hard objects of each kind, then free gaps.
SHAPES = (
    (0x01, 2, 4, 65),  # plain objects, 16-32 bytes
    (0x01, 5, 10, 5),
    (0x09, 10, 40, 0.5),  # class objects
    (0x19, 2, 8, 10),  # char[] (strings)
    (0x11, 2, 16, 4),  # byte[]
    (0x11, 300, 2000, 0.01),  # large byte[] (bitmaps, buffers): P-split
    (0x21, 2, 12, 4),  # int[] / Object[]
    (0x29, 2, 6, 1),  # long[]
    (0x00, 1, 6, 10),  # small free gaps
    (0x00, 300, 1000, 0.01),  # large free areas
)


def build_heap(total_bytes: int = 64 << 20, *, seed: int = 1) -> list[bytes]:
    """HPSG chunk data (header + pairs) describing ``total_bytes`` of heap."""
    rng = random.Random(seed)
    weights = [shape[3] for shape in SHAPES]
    left = total_bytes // UNIT
    address = 0x12C00000
    chunks: list[bytes] = []
    pairs = bytearray()
    chunk_start = address
    chunk_units = 0

    def flush() -> None:
        nonlocal pairs, chunk_start, chunk_units
        if pairs:
            chunks.append(HEADER.pack(1, UNIT, chunk_start, 0, chunk_units) + bytes(pairs))
        pairs = bytearray()
        chunk_start = address
        chunk_units = 0

    previous_free = False
    while left > 0:
        state, low, high, _ = rng.choices(SHAPES, weights)[0]
        if state == 0 and previous_free:
            continue  # the VM coalesces free space: never two free runs in a row
        units = min(rng.randint(low, high), left)
        pieces = -(-units // 256)
        if len(pairs) // 2 + pieces > PAIRS_PER_CHUNK:
            flush()
        rest = units
        while rest > 256:
            pairs += bytes((state | 0x80, 255))
            rest -= 256
        pairs += bytes((state, rest - 1))
        address += units * UNIT
        chunk_units += units
        left -= units
        previous_free = state == 0
    flush()
    return chunks


def decode_and_summarise(chunks: list[bytes]) -> tuple[float, float, object]:
    asm = HeapAssembler()
    t0 = time.perf_counter()
    asm.start(1)
    for data in chunks:
        heap_id, unit, start, offset, units = HEADER.unpack_from(data)
        problems = asm.segment(
            SegmentKind.HPSG, heap_id, unit, start, offset, units, data[HEADER.size :]
        )
        assert not problems, problems
    image = asm.end(1)
    t1 = time.perf_counter()
    summary = image.summary()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, summary


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    chunks = build_heap(mib << 20)
    pairs = sum((len(c) - HEADER.size) // 2 for c in chunks)
    print(f"{mib} MiB heap: {len(chunks)} chunks, {pairs:,} pairs")
    best = None
    for _ in range(3):
        decode, summarise, summary = decode_and_summarise(chunks)
        total = decode + summarise
        print(f"decode {decode:.3f}s  summary {summarise:.3f}s  total {total:.3f}s")
        best = total if best is None else min(best, total)
    print(f"best total {best:.3f}s")
    print(summary)


if __name__ == "__main__":
    main()
