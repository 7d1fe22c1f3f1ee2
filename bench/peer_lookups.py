"""Peer-uid lookups under connection churn: how much resident memory do they leave behind?

Run: ``.venv/bin/python bench/peer_lookups.py [--rows 5000] [--lookups 2400]``.

Every connection ddmd accepts is checked by reading the socket tables (``/proc/net/tcp`` and
``tcp6``) in a trio worker thread. Under churn those tables hold thousands of TIME_WAIT rows, a few
hundred KB of text. This bench writes such a table (``--rows`` rows, one of them the peer being
looked up) under a temporary proc root, runs ``--lookups`` lookups through
``ddmd.host.localproc.peer_owner`` in worker threads, 40 at a time as a burst of accepts
would, and prints this process's RSS before and after each round of 400, and the time per lookup.
Each lookup must find the peer's uid (it fails loudly otherwise).

PASS when RSS after the last round is less than 8 MB above the RSS after the first round (the
first round warms the thread pool and the allocator). With the defaults, reading each table
whole, as ddmd did before, grew RSS by 27 MB in all and 17 MB after the first round (FAIL); a line
at a time, by 5 MB and 1.6 MB.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path

import trio

from ddmd.host.localproc import peer_owner

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    "   uid  timeout inode\n"
)
OURS = ("127.0.0.1", 8700)
PEER = ("127.0.0.1", 45678)
PEER_UID = 1234
LIMIT_MB = 8.0


def _row(n: int, local_port: int, remote_port: int, state: str, uid: int, inode: int) -> str:
    return (
        f"{n:4d}: 0100007F:{local_port:04X} 0100007F:{remote_port:04X} {state} "
        f"00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} 1 0000000000000000 "
        "20 4 30 10 -1\n"
    )


def write_tables(root: Path, rows: int) -> None:
    net = root / "net"
    net.mkdir(parents=True)
    # TIME_WAIT rows of earlier connections (inode 0, uid 0), then the peer's own row
    lines = [HEADER, *(_row(n, 30000 + n % 30000, 8700, "06", 0, 0) for n in range(rows - 1))]
    lines.append(_row(rows - 1, PEER[1], OURS[1], "01", PEER_UID, 99999))
    (net / "tcp").write_text("".join(lines))
    (net / "tcp6").write_text(HEADER)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("this bench reads /proc/self/status (Linux only)")


async def run(root: Path, lookups: int) -> list[float]:
    limiter = trio.CapacityLimiter(40)
    lookup = functools.partial(peer_owner, OURS, PEER, proc_root=str(root))
    samples = [rss_mb()]
    print(f"before       rss {samples[0]:7.2f} MB")
    done = 0
    while done < lookups:
        batch = min(400, lookups - done)
        started = time.perf_counter()

        async def one() -> None:
            owner = await trio.to_thread.run_sync(lookup, limiter=limiter)
            if owner.uid != PEER_UID:
                raise SystemExit(f"lookup answered {owner}, expected uid {PEER_UID}")

        async with trio.open_nursery() as nursery:
            for _ in range(batch):
                nursery.start_soon(one)
        took = time.perf_counter() - started
        done += batch
        samples.append(rss_mb())
        print(
            f"after {done:6d} rss {samples[-1]:7.2f} MB   {took / batch * 1000:6.2f} ms per lookup "
            "(wall, 40 threads)"
        )
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5000, help="rows in the table (5000)")
    parser.add_argument("--lookups", type=int, default=2400, help="lookups in all (2400)")
    args = parser.parse_args()
    if args.rows < 1 or args.lookups < 800:
        parser.error("--rows must be at least 1 and --lookups at least 800")
    with tempfile.TemporaryDirectory(prefix="ddmd-peer-bench-") as tmp:
        root = Path(tmp)
        write_tables(root, args.rows)
        size = os.path.getsize(root / "net" / "tcp")
        print(f"table: {args.rows} rows, {size / 1024:.0f} KB; {args.lookups} lookups")
        samples = trio.run(run, root, args.lookups)
    growth = samples[-1] - samples[1]
    verdict = "PASS" if growth < LIMIT_MB else "FAIL"
    print(f"RSS growth after the first round: {growth:+.2f} MB (limit {LIMIT_MB:g} MB): {verdict}")
    if verdict == "FAIL":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
