"""DeviceLogcat (ddmd/logcat/device.py) with a fake adb side: each open of the device's log is a
memory stream the test writes to. Bad input (a truncated entry, a length beyond the limit,
garbage, a stream that stalls inside an entry) is logged once per kind and the stream is
reopened, asking only for what came after the last entry; another device's log is untouched.
One stream however many viewers; closed after the last viewer leaves. Time is trio's
autojump clock: no test sleeps."""

from __future__ import annotations

import struct

import trio
import trio.testing
from structlog.testing import capture_logs

from ddmd.logcat.device import DeviceLogcat, LogcatSettings
from ddmd.logcat.lines import Line, LineFilter
from tests.logcat import recording as rec
from tests.logcat.writer import Record, write_record

SETTINGS = LogcatSettings(buffer_lines=1000, idle_stop=5.0, stall=3.0)


class FakeAdb:
    """Opens: one memory stream per open of a device's log; the test holds the other end."""

    def __init__(self) -> None:
        self.services: list[tuple[str, str]] = []
        self.ends: dict[str, list[trio.testing.MemorySendStream]] = {}
        self.opened = trio.Event()
        self.refuse = 0

    async def open(self, serial: str, service: str) -> trio.abc.Stream:
        if self.refuse:
            self.refuse -= 1
            raise OSError("adb server gone")
        self.services.append((serial, service))
        ours, theirs = trio.testing.memory_stream_pair()
        self.ends.setdefault(serial, []).append(ours)
        self.opened.set()
        self.opened = trio.Event()
        return theirs

    def end(self, serial: str) -> trio.testing.MemorySendStream:
        return self.ends[serial][-1]


def record(n: int, pid: int = rec.MAIL_PID, message: bytes = b"hello") -> bytes:
    return write_record(Record(rec.BASE_SEC + n, 0, pid, pid, 4, "T", message, 0, 1))


async def opened(adb: FakeAdb, count: int) -> None:
    while sum(len(v) for v in adb.ends.values()) < count:
        await adb.opened.wait()


def make(adb: FakeAdb, serial: str, crashes: list | None = None) -> DeviceLogcat:
    return DeviceLogcat(
        serial,
        adb.open,
        SETTINGS,
        lambda: {},
        lambda name, fields: crashes.append(fields) if crashes is not None else None,
    )


async def lines_of(viewer, count: int) -> list[Line]:
    out: list = []
    while len(out) < count:
        batch, _ = await viewer.next_batch()
        out += batch
    return out


async def test_bad_input_is_logged_once_per_kind_and_the_stream_reopens(nursery, autojump_clock):
    adb = FakeAdb()
    device, other = make(adb, "A"), make(adb, "B")
    nursery.start_soon(device.run)
    nursery.start_soon(other.run)
    with (
        capture_logs() as logs,
        device.subscribe(LineFilter()) as batches,
        other.subscribe(LineFilter()) as other_batches,
    ):
        await opened(adb, 2)
        assert adb.services[0][1].startswith("exec:logcat -B -b main -b system -b crash -T ")
        await adb.end("A").send_all(record(1))
        assert len(await lines_of(batches, 1)) == 1
        # 1. a length beyond the limit
        await adb.end("A").send_all(struct.pack("<HH", 0xFFFF, 28) + bytes(40))
        await opened(adb, 3)
        # The reopened stream asks from the last entry seen on, and repeats of it are skipped.
        assert adb.services[-1][1].endswith(f"-T {rec.BASE_SEC + 1}.000000000")
        await adb.end("A").send_all(record(1) + record(2))
        (second,) = await lines_of(batches, 1)
        assert second.entry.sec == rec.BASE_SEC + 2
        # 2. garbage, twice: logged once
        await adb.end("A").send_all(b"\xff" * 40)
        await opened(adb, 4)
        await adb.end("A").send_all(b"\xfe" * 40)
        await opened(adb, 5)
        # 3. a truncated entry, then the end of the stream
        await adb.end("A").send_all(record(3)[:-5])
        await adb.end("A").aclose()
        await opened(adb, 6)
        # 4. a stream that stops inside an entry
        await adb.end("A").send_all(record(4)[:10])
        await opened(adb, 7)
        await adb.end("A").send_all(record(5))
        (fifth,) = await lines_of(batches, 1)
        assert fifth.entry.sec == rec.BASE_SEC + 5
        # Device B never noticed.
        await adb.end("B").send_all(record(9, pid=7))
        (b_line,) = await lines_of(other_batches, 1)
        assert b_line.device == "B"
        assert len(adb.ends["B"]) == 1
    problems = [(e["device"], e["problem"]) for e in logs if e["event"] == "logcat.stream_problem"]
    warned = [(e["device"], e["problem"]) for e in logs
              if e["event"] == "logcat.stream_problem" and e["log_level"] == "warning"]  # fmt: skip
    assert sorted(set(problems)) == [("A", "malformed"), ("A", "stalled")]
    assert sorted(warned) == [("A", "malformed"), ("A", "stalled")]  # each kind once
    assert device.stats.problems["malformed"] == 4  # limit, garbage x2, truncated


async def test_one_stream_for_many_viewers_closed_after_the_last_leaves(nursery, autojump_clock):
    adb = FakeAdb()
    device = make(adb, "A")
    nursery.start_soon(device.run)
    with device.subscribe(LineFilter()) as first, device.subscribe(LineFilter()) as second:
        await opened(adb, 1)
        await adb.end("A").send_all(record(1))
        assert len(await lines_of(first, 1)) == 1
        assert len(await lines_of(second, 1)) == 1
        assert len(adb.services) == 1
    await trio.sleep(SETTINGS.idle_stop + CRASH_PAUSE)
    assert not device.streaming
    with device.subscribe(LineFilter()):
        await opened(adb, 2)  # a new viewer opens it again


CRASH_PAUSE = 2.0


async def test_the_adb_server_going_away_is_retried_with_back_off(nursery, autojump_clock):
    adb = FakeAdb()
    adb.refuse = 3
    device = make(adb, "A")
    nursery.start_soon(device.run)
    with capture_logs() as logs, device.subscribe(LineFilter()):
        start = trio.current_time()
        await opened(adb, 1)
        waited = trio.current_time() - start
    assert waited >= 0.5 + 1 + 2  # backed off between the refusals
    problems = [e for e in logs if e["event"] == "logcat.stream_problem"]
    assert [e["log_level"] for e in problems] == ["warning", "debug", "debug"]


async def test_a_live_crash_in_the_stream_is_published_once(nursery, autojump_clock):
    adb = FakeAdb()
    crashes: list = []
    device = make(adb, "A", crashes)
    nursery.start_soon(device.run)
    with device.subscribe(LineFilter()) as batches:
        await opened(adb, 1)
        await trio.sleep(1)  # no backlog: the stream went quiet, what comes now is live
        await adb.end("A").send_all(rec.STREAM)
        await lines_of(batches, len(rec.ENTRIES))
        await trio.sleep(1)  # quiet: a block under way is over
    assert sorted((c["kind"], c["app"]) for c in crashes) == [
        ("anr", rec.MAPS),
        ("java", rec.MAPS),
        ("native", rec.MAIL),
    ]


async def test_a_live_line_stamped_before_the_one_ahead_of_it_is_kept(nursery, autojump_clock):
    adb = FakeAdb()
    device = make(adb, "A")
    nursery.start_soon(device.run)
    with device.subscribe(LineFilter()) as batches:
        await opened(adb, 1)
        await adb.end("A").send_all(record(5) + record(4))  # processes stamp their own lines
        got = await lines_of(batches, 2)
        assert [line.entry.sec - rec.BASE_SEC for line in got] == [5, 4]


async def test_a_viewer_too_slow_loses_the_newest_lines_and_is_told_how_many(
    nursery, autojump_clock
):
    adb = FakeAdb()
    device = DeviceLogcat(
        "A", adb.open, LogcatSettings(viewer_lines=3, idle_stop=5.0), lambda: {}, lambda *a: None
    )
    nursery.start_soon(device.run)
    with capture_logs() as logs:
        with device.subscribe(LineFilter()) as slow:
            await opened(adb, 1)
            for n in range(6):  # one entry per read: six batches of one
                await adb.end("A").send_all(record(n))
                await trio.testing.wait_all_tasks_blocked()
            kept = [await slow.next_batch() for _ in range(3)]
            assert [b[0].entry.sec - rec.BASE_SEC for b, _ in kept] == [0, 1, 2]
            await adb.end("A").send_all(record(9))
            batch, dropped = await slow.next_batch()
            assert batch[0].entry.sec - rec.BASE_SEC == 9
            assert dropped + sum(d for _, d in kept) == 3  # told once, with a batch it got
        assert device.stats.dropped == 3
    assert [e["lost"] for e in logs if e["event"] == "logcat.viewer_lagged"] == [3]
