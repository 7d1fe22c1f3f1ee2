"""The device of bench/logcat.py: a `FakeDevice` (``ddmd.sim.adbd``) adopted by a real adb
server, with one app VM on it (a ``ddmd sim`` VM under pid 4242), that logs lines stamped at
the moment it logs them. A process of its own, so that its CPU is counted apart from ddmd's.

Run by the bench: ``.venv/bin/python bench/logcat_device.py --adb-port N``; it prints
``device SERIAL ready (pid PID, app APP)`` once the server has it, then takes commands on
standard input, one a line, and answers each with one line:

- ``reset``: empties the device's log ring (a fresh ddmd then gets no backlog) -> ``ok reset``;
- ``mark K``: logs one line ``benchmark-mark K`` (the bench waits until every viewer showed
  it: the viewers are then connected) -> ``ok mark K``;
- ``load SECONDS RATE``: logs RATE lines a second for SECONDS -> ``done sent=N first=A
  last=B seconds=S late_max=MS queue_max=BYTES overflows=N``.

Each line of a load is its own logger_entry v4 (``logcat -B``): a distinct timestamp (the
batch's ``time.time_ns()`` plus its index, as logd stamps every entry), one of a few pids
(half of them the app's), a tag of that process, a level (mostly D and I) and the message
``bench COUNTER SENT_NS <text>``: COUNTER numbers every line of the run from 0 (the bench
finds gaps by it), SENT_NS is when the line was logged (the bench's latency is measured from
it). A batch is logged every 10 ms (the first at once), as many lines as the rate owes by
then, whatever the readers do: logd never waits for a reader (a reader more than
``log_follower_bytes`` behind is closed, as logd drops one that cannot keep up; ``overflows``
counts them). ``queue_max`` is the most bytes logged and not yet sent to adb at a tick (how
far behind the adb stream, i.e. ddmd, was); ``late_max`` the longest a tick came late (the
device's own lag).

Layer: the bench; imports trio and ``ddmd.sim`` only.
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import time
from functools import partial

import structlog
import trio

from ddmd.sim import SimConfig, SimVm
from ddmd.sim.adbd import FakeDevice

APP = "com.example.bench"
APP_PID = 4242
TICK = 0.01  # seconds between batches
#: (pid, tid, tags) of the processes that log: the app half the time, the rest the system.
PROCESSES = (
    (APP_PID, APP_PID, ("BenchActivity", "OkHttp", "RecyclerView", "Glide")),
    (APP_PID, APP_PID + 17, ("BenchSync", "SQLiteDatabase")),
    (1000, 1043, ("ActivityTaskManager", "WindowManager", "InputDispatcher")),
    (1372, 1372, ("wificond", "WifiHAL")),
    (612, 640, ("SurfaceFlinger", "BufferQueueProducer")),
    (5120, 5120, ("chatty", "GmsCore", "Finsky")),
)
#: Text after the counter and stamp, a realistic 40-90 characters.
TEXTS = (
    "onBindViewHolder position=118 holder=ItemHolder{3f2a9c1} took 2 ms",
    "--> GET https://api.example.com/v2/items?page=7 (0-byte body)",
    "<-- 200 OK https://api.example.com/v2/items?page=7 (38ms, 14213-byte body)",
    "Frame time 16.4 ms, janky frames 0 of 60",
    "Relayout returned: old=[0,0][1080,2340] new=[0,0][1080,2340] result=0x1",
    "setRequestedFrameRate 60.0 for layer com.example.bench/BenchActivity#0",
    "Scan results: 14 networks, best RSSI -48 dBm on 5180 MHz",
    "Delivering touch to (6443): action: 0x1, toolType: 1",
    "sync tick: 3 rows written, next in 30000 ms",
    "uid=10123 com.example.bench expire 3 lines",
)
#: android_LogPriority by share of lines: D and I most.
LEVELS = (3, 3, 3, 4, 4, 4, 4, 2, 5, 6)
#: logger_entry v4: len, hdr_size, pid, tid, sec, nsec, lid, uid
_HEADER = struct.Struct("<HHiIIIII")


class LineMaker:
    """Records of the load: see the module docstring."""

    def __init__(self) -> None:
        self.counter = 0
        # (pid, tid, payload head: prio byte + tag + NUL, text) for each kind of line
        kinds = []
        for i in range(60):
            # even lines: the app (its two threads in turn); odd ones: the four others
            pid, tid, tags = PROCESSES[(i // 2) % 2 if i % 2 == 0 else 2 + (i // 2) % 4]
            tag = tags[i % len(tags)]
            level = LEVELS[i % len(LEVELS)]
            text = TEXTS[(i * 7) % len(TEXTS)]
            kinds.append((pid, tid, bytes([level]) + tag.encode() + b"\0", text))
        self._kinds = kinds

    def batch(self, count: int) -> tuple[bytes, int, int]:
        """(records, first counter, last counter) of ``count`` lines stamped now."""
        now = time.time_ns()
        sec, nsec0 = divmod(now, 1_000_000_000)
        first = self.counter
        out = []
        kinds, nk = self._kinds, len(self._kinds)
        pack = _HEADER.pack
        for i in range(count):
            n = first + i
            pid, tid, head, text = kinds[n % nk]
            body = head + f"bench {n} {now} {text}".encode() + b"\0"
            s, ns = (sec, nsec0 + i) if nsec0 + i < 1_000_000_000 else (sec + 1, nsec0 + i - 10**9)
            out.append(pack(len(body), 28, pid, tid, s, ns, 0, 10123) + body)
        self.counter = first + count
        return b"".join(out), first, self.counter - 1

    @staticmethod
    def mark(k: int) -> bytes:
        now = time.time_ns()
        sec, nsec = divmod(now, 1_000_000_000)
        body = b"\x04BenchMark\0" + f"benchmark-mark {k}".encode() + b"\0"
        return _HEADER.pack(len(body), 28, APP_PID, APP_PID, sec, nsec, 0, 10123) + body


def _queued(device: FakeDevice) -> int:
    """Bytes logged and not yet taken by the device's logcat streams (the most behind one).
    The device keeps no public figure for it: read its private follower list if it is there."""
    followers = getattr(getattr(device, "_log", None), "followers", ())
    return max((len(f.pending) for f in followers), default=0)


async def load(device: FakeDevice, maker: LineMaker, seconds: float, rate: float) -> str:
    total = round(seconds * rate)
    sent = 0
    first: int | None = None
    last = -1
    late_max = queue_max = 0.0
    overflows = device.statistics().log_overflows
    start = trio.current_time()
    k = 0
    while sent < total:
        due_at = start + k * TICK
        now = trio.current_time()
        late_max = max(late_max, now - due_at)
        owed = min(total, math.floor(rate * (now - start + TICK))) - sent
        if owed > 0:
            data, a, b = maker.batch(owed)
            device.log(data)
            sent += owed
            first = a if first is None else first
            last = b
        queue_max = max(queue_max, _queued(device))
        k += 1
        await trio.sleep_until(max(start + k * TICK, trio.current_time()))
    took = trio.current_time() - start
    overflows = device.statistics().log_overflows - overflows
    return (
        f"done sent={sent} first={first} last={last} seconds={took:.3f} "
        f"late_max={late_max * 1000:.1f} queue_max={int(queue_max)} overflows={overflows}"
    )


async def commands(device: FakeDevice, maker: LineMaker) -> None:
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    buffer = b""
    while True:
        data = await stdin.receive_some(4096)
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            raw, _, buffer = buffer.partition(b"\n")
            words = raw.decode().split()
            if not words:
                continue
            if words[0] == "reset":
                device.set_log(b"")
                answer = "ok reset"
            elif words[0] == "mark":
                device.log(maker.mark(int(words[1])))
                answer = f"ok mark {words[1]}"
            elif words[0] == "load":
                answer = await load(device, maker, float(words[1]), float(words[2]))
            else:
                answer = f"error unknown command {raw!r}"
            print(answer, flush=True)


async def main_async(args: argparse.Namespace) -> int:
    sim = SimVm(  # a quiet VM: no thread churn, no periodic GC
        SimConfig(
            pid=APP_PID,
            app_name=APP,
            package_name=APP,
            churn_interval=0.0,
            gc_interval=0.0,
            heap_mb=1,
        )
    )
    async with trio.open_nursery() as nursery:
        vm_port = await nursery.start(sim.run)
        device = FakeDevice(
            {APP_PID: ("127.0.0.1", vm_port)},
            process_names={APP_PID: APP},
            log_follower_bytes=args.follower_mb << 20,
        )
        port = await nursery.start(partial(device.serve, 0))
        serial = f"127.0.0.1:{port}"
        with trio.fail_after(30):
            result = await trio.run_process(
                [args.adb, "-P", str(args.adb_port), "connect", serial],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        said = (result.stdout + result.stderr).decode(errors="replace").strip()
        if result.returncode != 0 or "connected" not in said:
            print(f"adb connect {serial} failed: {said}", file=sys.stderr, flush=True)
            return 1
        print(f"device {serial} ready (pid {APP_PID}, app {APP})", flush=True)
        await commands(device, LineMaker())
        nursery.cancel_scope.cancel()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adb-port", type=int, required=True)
    parser.add_argument("--adb", default="adb")
    parser.add_argument(
        "--follower-mb", type=int, default=16, help="a reader this far behind is closed (MiB)"
    )
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        return trio.run(main_async, args)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
