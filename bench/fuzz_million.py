"""Run each decoder's Hypothesis fuzz property on 1,000,000 inputs (issue 2's long fuzz run).

Usage: ``.venv/bin/python bench/fuzz_million.py [--examples N] [--jobs J] [NAME ...]``

Each property is the same test function CI runs with 2,000 examples; here it is fed N random
buffers through Hypothesis' ``fuzz_one_input`` (no shrinking, no example database), so the
whole range of its strategies is exercised. A property that finds a failing input raises, and
this command reports the decoder, the exception and exits 1. Prints inputs/s and elapsed time.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, module, test function): one fuzz property per decoder.
PROPERTIES = {
    "jdwp.PacketDecoder": ("tests.protocol.test_jdwp", "test_fuzz_decoder"),
    "jdwp.decode_packet": ("tests.protocol.test_jdwp", "test_fuzz_decode_packet"),
    "ddm.decode_chunks": ("tests.protocol.test_ddm_properties", "test_fuzz_decode_chunks"),
    "ddm.decode_chunk": (
        "tests.protocol.test_ddm_properties",
        "test_fuzz_decode_chunk_known_types",
    ),
    "ddm.inflate_chunk": ("tests.protocol.test_ddm_properties", "test_fuzz_inflate"),
    "heap.parse_segment_data": ("tests.protocol.test_heap", "test_fuzz_arbitrary_bytes"),
}


def run_one(name: str, examples: int, seed: int) -> tuple[str, int, float, str | None]:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("HYPOTHESIS_PROFILE", "million")
    module_name, func_name = PROPERTIES[name]
    test = getattr(importlib.import_module(module_name), func_name)
    fuzz = test.hypothesis.fuzz_one_input
    rng = random.Random(seed)
    start = time.perf_counter()
    done = 0
    try:
        while done < examples:
            fuzz(rng.randbytes(rng.randint(1, 1024)))
            done += 1
    except Exception as exc:
        return name, done, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    return name, done, time.perf_counter() - start, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("names", nargs="*", default=list(PROPERTIES))
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in PROPERTIES]
    if unknown:
        parser.error(f"unknown decoder(s) {unknown}; choose from {list(PROPERTIES)}")
    failed = False
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(run_one, name, args.examples, args.seed + i)
            for i, name in enumerate(args.names)
        ]
        for future in futures:
            name, done, seconds, error = future.result()
            rate = done / seconds if seconds else 0.0
            status = "ok" if error is None else f"FAILED: {error}"
            print(f"{name:26} {done:>10,} inputs  {seconds:8.1f} s  {rate:9,.0f}/s  {status}")
            failed = failed or error is not None
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
