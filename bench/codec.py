"""Codec benchmark: how fast the sans-IO core decodes what the bridge and the monitor see.

Run: ``.venv/bin/python bench/codec.py``. Prints, for this machine:
- packets/s (and µs per packet) decoding small JDWP packets of 11-64 bytes,
- the same plus the id-map work the bridge does per packet (allocate on the way in, resolve on
  the way back): "decode + route",
- MB/s decoding 64 KiB packets,
- seconds to decode and summarise a 64 MiB managed heap (HPST, ~2 M HPSG pairs, HPEN).

Target from issue 2: decoding and routing a small packet costs under 5 µs.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heap_fixture import build_heap, decode_and_summarise

from ddmd.protocol.idmap import IdRewriter
from ddmd.protocol.jdwp import (
    NEED_DATA,
    CommandPacket,
    PacketDecoder,
    ReplyPacket,
    encode,
)


def _best_of(runs: int, fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def small_packets(n: int = 200_000) -> tuple[bytes, int]:
    rng = random.Random(7)
    parts = []
    for i in range(n):
        size = rng.randint(0, 53)  # 11..64 bytes on the wire
        if i % 2:
            parts.append(encode(ReplyPacket(i, 0, bytes(size))))
        else:
            parts.append(
                encode(CommandPacket(i, rng.randint(1, 18), rng.randint(1, 20), bytes(size)))
            )
    return b"".join(parts), n


def _report(what: str, n: int, seconds: float) -> None:
    rate = n / seconds
    micros = seconds / n * 1e6
    print(f"small packets (11-64 B), {what} {rate:12,.0f} packets/s  {micros:6.2f} µs/packet")


def _decode(pieces: list[bytes]) -> int:
    """Decode every packet in ``pieces``; how many there were."""
    d = PacketDecoder()
    count = 0
    for piece in pieces:
        d.receive_data(piece)
        while d.next_event() is not NEED_DATA:
            count += 1
    return count


def bench_small() -> None:
    stream, n = small_packets()
    pieces = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]

    def decode_only() -> None:
        assert _decode(pieces) == n

    def decode_and_route() -> None:
        d = PacketDecoder()
        ids = IdRewriter()
        origin = object()
        count = 0
        for piece in pieces:
            d.receive_data(piece)
            while (p := d.next_event()) is not NEED_DATA:
                vm_id = ids.allocate(origin, p.id, 1, 1, 1e18)
                pending = ids.resolve(vm_id)
                assert pending is not None
                count += 1
        assert count == n

    t = _best_of(5, decode_only)
    _report("decode:        ", n, t)
    t = _best_of(5, decode_and_route)
    _report("decode + route:", n, t)


def bench_large() -> None:
    packet = encode(ReplyPacket(1, 0, bytes(65536 - 11)))
    stream = packet * 1024  # 64 MiB
    pieces = [stream[i : i + 65536] for i in range(0, len(stream), 65536)]

    def run() -> None:
        assert _decode(pieces) == 1024

    t = _best_of(5, run)
    print(f"64 KiB packets, decode:                  {len(stream) / t / 1e6:12,.0f} MB/s")


def bench_heap() -> None:
    chunks = build_heap(64 << 20)
    pairs = sum((len(c) - 17) // 2 for c in chunks)
    best = float("inf")
    summary = None
    for _ in range(3):
        t0 = time.perf_counter()
        _, _, summary = decode_and_summarise(chunks)
        best = min(best, time.perf_counter() - t0)
    print(
        f"64 MiB heap ({len(chunks)} HPSG chunks, {pairs:,} pairs): decode + summarise {best:.3f} s"
    )
    print(f"   summary: {summary}")


def main() -> None:
    print(f"python {sys.version.split()[0]}")
    bench_small()
    bench_large()
    bench_heap()


if __name__ == "__main__":
    main()
