"""The fake device's log (``ddmd.sim.adbd``: ``FakeDevice(logcat=...)``, ``log``, ``replay``)
through the REAL adb server (Debian ``adb``, a private port: `tests.adb.device`), read back
with the real ``adb`` CLI and with a raw smart-socket client, and decoded by
``ddmd.protocol.logcat``; plus its argument parsing, record splitting, ring and pacing alone.

Every wait is bounded: ``CAP`` for a whole test, ``WAIT`` for one condition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from ddmd.protocol.logcat import EOF, NEED_DATA, LogcatDecoder, LogcatMalformed, LogEntry
from ddmd.sim.adbd import FakeDevice, LogcatOptions, parse_logcat_args, split_log_records
from tests.adb.device import AdbDevice, adb, open_adb_device
from tests.logcat import recording as rec
from tests.logcat.writer import Record, write_record, write_records

__all__ = ["adb"]  # fixture

CAP = 60  # seconds: absolute cap on every test
WAIT = 10  # seconds: one condition
SERVICE = "exec:logcat -B -b main -b system -b crash"  # what ddmd opens


def decode(data: bytes) -> list[LogEntry]:
    decoder = LogcatDecoder()
    decoder.receive_data(data)
    decoder.receive_data(b"")
    out = []
    while (event := decoder.next_entry()) is not EOF:
        assert isinstance(event, LogEntry)
        out.append(event)
    return out


def extra(n: int, *, start: int = 100_000) -> list[Record]:
    """``n`` records stamped after the recording (start ms after its base)."""
    return [
        Record(
            rec.BASE_SEC + (start + i) // 1000,
            (start + i) % 1000 * 1_000_000 + 7,
            rec.MAIL_PID_2,
            4318,
            4,
            "MailSync",
            f"later line {i}".encode(),
            0,
            rec.MAIL_UID,
        )
        for i in range(n)
    ]


# --------------------------------------------------------------------------------------------
# A raw client of a device service through the server


class Client:
    """One device service opened through the adb server's smart socket (``host:transport:
    SERIAL`` then the service), read with a `LogcatDecoder`."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.raw = bytearray()
        self.decoder = LogcatDecoder()
        self.entries: list[LogEntry] = []
        self.ended = False
        self.error: LogcatMalformed | None = None

    async def read_some(self) -> None:
        try:
            data = await self.stream.receive_some(1 << 16)
        except trio.BrokenResourceError:
            data = b""
        self.raw += data
        self.ended = not data
        if self.error is not None:
            return
        self.decoder.receive_data(data)
        try:
            while (event := self.decoder.next_entry()) is not NEED_DATA and event is not EOF:
                assert isinstance(event, LogEntry)
                self.entries.append(event)
        except LogcatMalformed as exc:
            self.error = exc

    async def until_entries(self, n: int) -> list[LogEntry]:
        with trio.fail_after(WAIT):
            while len(self.entries) < n:
                assert not self.ended, f"EOF after {len(self.entries)} entries, wanted {n}"
                await self.read_some()
        return self.entries

    async def until_bytes(self, n: int) -> bytes:
        with trio.fail_after(WAIT):
            while len(self.raw) < n and not self.ended:
                await self.read_some()
        return bytes(self.raw)

    async def until_eof(self) -> bytes:
        with trio.fail_after(WAIT):
            while not self.ended:
                await self.read_some()
        return bytes(self.raw)


async def _exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = b""
    with trio.fail_after(WAIT):
        while len(data) < n:
            more = await stream.receive_some(n - len(data))
            assert more, f"EOF after {data!r}"
            data += more
    return data


async def _request(stream: trio.SocketStream, service: str) -> None:
    with trio.fail_after(WAIT):
        await stream.send_all(b"%04x" % len(service) + service.encode())
    status = await _exactly(stream, 4)
    if status != b"OKAY":
        size = int(await _exactly(stream, 4), 16)
        raise AssertionError(f"{service}: {status!r} {await _exactly(stream, size)!r}")


@asynccontextmanager
async def open_service(rig: AdbDevice, service: str = SERVICE) -> AsyncIterator[Client]:
    with trio.fail_after(WAIT):
        stream = await trio.open_tcp_stream("127.0.0.1", rig.adb_port)
    async with stream:
        await _request(stream, f"host:transport:{rig.serial}")
        await _request(stream, service)
        yield Client(stream)


async def wait_for(condition, what: str) -> None:
    """Poll one of the device's counters (it has no event to wait on) until ``condition``."""
    with trio.fail_after(WAIT):
        while not condition():  # noqa: ASYNC110 - polling a counter, bounded by WAIT
            await trio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# The real adb CLI


async def test_exec_out_dump_returns_the_recording_exactly(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(logcat=rec.STREAM), adb=adb) as rig:
            result = await rig.run_adb("-s", rig.serial, "exec-out", "logcat", "-B", "-d")
            assert result.returncode == 0, result.stderr
            assert result.stdout == rec.STREAM
            assert decode(result.stdout) == list(rec.ENTRIES)
            assert rig.device.statistics().services["logcat"] == 1


async def test_shell_dump_returns_the_recording_exactly(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(logcat=rec.STREAM), adb=adb) as rig:
            result = await rig.run_adb("-s", rig.serial, "shell", "logcat", "-B", "-d")
            assert result.returncode == 0, result.stderr
            assert result.stdout == rec.STREAM
            assert decode(result.stdout) == list(rec.ENTRIES)


async def test_dump_tail_and_since(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(logcat=rec.STREAM), adb=adb) as rig:
            last5 = await rig.run_adb("-s", rig.serial, "exec-out", "logcat", "-B", "-t", "5")
            assert last5.stdout == b"".join(rec.RECORD_BYTES[-5:])
            first = rec.ENTRIES[30]
            since = f"{first.sec}.{first.nsec:09d}"
            later = await rig.run_adb(
                "-s", rig.serial, "exec-out", "logcat", "-B", "-d", "-T", since
            )
            assert decode(later.stdout) == list(rec.ENTRIES[30:])


async def test_text_logcat_says_binary_only(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(logcat=rec.STREAM), adb=adb) as rig:
            result = await rig.run_adb("-s", rig.serial, "exec-out", "logcat", "-d")
            assert b"-B" in result.stdout
            assert result.stdout[-1:] == b"\n"
            assert len(result.stdout.splitlines()) == 1


async def test_exec_out_runs_the_small_shell_too(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(), adb=adb) as rig:
            result = await rig.run_adb("-s", rig.serial, "exec-out", "echo", "hi")
            assert result.stdout == b"hi\n"


async def test_an_empty_log_dumps_nothing(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice(), adb=adb) as rig:
            result = await rig.run_adb("-s", rig.serial, "exec-out", "logcat", "-B", "-d")
            assert (result.returncode, result.stdout) == (0, b"")


# --------------------------------------------------------------------------------------------
# Following the log through a raw service stream


async def test_follow_gets_the_backlog_then_what_is_logged(adb):
    with trio.fail_after(CAP):
        device = FakeDevice(logcat=b"".join(rec.RECORD_BYTES[:20]))
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            assert await client.until_entries(20) == list(rec.ENTRIES[:20])
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            device.log(b"".join(rec.RECORD_BYTES[20:]))
            assert await client.until_entries(len(rec.ENTRIES)) == list(rec.ENTRIES)
            assert bytes(client.raw) == rec.STREAM
            # One record at a time, too:
            more = extra(3)
            for record in more:
                device.log(write_record(record))
            got = await client.until_entries(len(rec.ENTRIES) + 3)
            assert got[-3:] == [rec.entry_of(r) for r in more]
            assert device.log_contents == rec.STREAM + write_records(more)


async def test_follow_with_a_tail_count_or_a_time(adb):
    with trio.fail_after(CAP):
        device = FakeDevice(logcat=rec.STREAM)
        async with open_adb_device(device, adb=adb) as rig:
            async with open_service(rig, SERVICE + " -T 3") as client:
                assert await client.until_entries(3) == list(rec.ENTRIES[-3:])
                await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
                device.log(write_records(extra(2)))
                got = await client.until_entries(5)
                assert got[3:] == [rec.entry_of(r) for r in extra(2)]
            entry = rec.ENTRIES[37]
            since = f"-T {entry.sec}.{entry.nsec:09d}"
            async with open_service(rig, f"{SERVICE} {since}") as client:
                assert await client.until_entries(len(rec.ENTRIES) - 37 + 2) == [
                    *rec.ENTRIES[37:],
                    *(rec.entry_of(r) for r in extra(2)),
                ]


async def test_every_follower_gets_each_record(adb):
    with trio.fail_after(CAP):
        device = FakeDevice()
        async with (
            open_adb_device(device, adb=adb) as rig,
            open_service(rig) as one,
            open_service(rig, "shell:logcat -B") as two,
        ):
            await wait_for(lambda: device.statistics().log_followers == 2, "two followers")
            device.log(rec.STREAM)
            assert await one.until_entries(len(rec.ENTRIES)) == list(rec.ENTRIES)
            assert await two.until_entries(len(rec.ENTRIES)) == list(rec.ENTRIES)
        await wait_for(lambda: device.statistics().log_followers == 0, "followers gone")


async def test_garbage_goes_out_as_it_is(adb):
    with trio.fail_after(CAP):
        device = FakeDevice(logcat=rec.RECORD_BYTES[0])
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            await client.until_entries(1)
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            device.log(b"garbage")
            raw = await client.until_bytes(len(rec.RECORD_BYTES[0]) + 7)
            assert raw == rec.RECORD_BYTES[0] + b"garbage"
            assert client.entries == [rec.ENTRIES[0]]
            assert client.error is not None
            assert "header size 25202" in str(client.error)  # b"rb" of b"garbage"


async def test_a_follower_too_far_behind_is_closed(adb):
    with trio.fail_after(CAP):
        device = FakeDevice(log_follower_bytes=1000)
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            device.log(rec.STREAM)  # 5 KB at once: more than the follower may hold
            assert await client.until_eof() == b""
            stats = device.statistics()
            assert (stats.log_overflows, stats.log_followers) == (1, 0)


async def test_replay_through_adb(adb):
    with trio.fail_after(CAP):
        device = FakeDevice()
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            sent = await device.replay(rec.STREAM, lines_per_second=2000)
            assert sent == len(rec.ENTRIES)
            assert await client.until_entries(len(rec.ENTRIES)) == list(rec.ENTRIES)


async def test_a_looping_replay_at_the_bench_rate_arrives_whole_and_in_order(adb):
    # The bench's rate (issue 19): a looping replay for one second through the real server.
    # How many lines a second it really sends is bench/logcat.py's to say, not a test's.
    rate, seconds = 20_000, 1.0
    with trio.fail_after(CAP):
        device = FakeDevice()
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            async with trio.open_nursery() as nursery:

                async def read() -> None:
                    while True:
                        await client.read_some()

                nursery.start_soon(read)
                started = trio.current_time()
                with trio.move_on_after(seconds):
                    await device.replay(rec.STREAM, lines_per_second=rate, loop=True)
                logged = device.statistics().log_records
                await wait_for(lambda: len(client.entries) >= logged, "everything logged")
                elapsed = trio.current_time() - started
                nursery.cancel_scope.cancel()
            assert logged > len(rec.ENTRIES), (logged, elapsed)  # it looped
            assert client.entries[: len(rec.ENTRIES)] == list(rec.ENTRIES)
            assert len(client.entries) == logged


# --------------------------------------------------------------------------------------------
# Alone: arguments, splitting, the ring, pacing


@pytest.mark.parametrize(
    ("args", "options"),
    [
        ("-B", LogcatOptions(binary=True)),
        ("-B -b main -b system -b crash", LogcatOptions(binary=True)),
        ("-B -d", LogcatOptions(binary=True, dump=True)),
        ("-Bd", LogcatOptions(binary=True, dump=True)),
        ("--binary --dump", LogcatOptions(binary=True, dump=True)),
        ("-B -t 5", LogcatOptions(binary=True, dump=True, tail=5)),
        ("-B -T 5", LogcatOptions(binary=True, tail=5)),
        ("-B -T5", LogcatOptions(binary=True, tail=5)),
        ("-B -T 1700000000.25", LogcatOptions(binary=True, since=(1700000000, 250000000))),
        ("-B -T 12.000000001", LogcatOptions(binary=True, since=(12, 1))),
        ("-v brief -s MailSync:V", LogcatOptions()),
        ("-b -B", LogcatOptions()),  # -B is -b's value here
    ],
)
def test_logcat_arguments(args, options):
    assert parse_logcat_args(args.split()) == options


@pytest.mark.parametrize("args", ["-B -T", "-B -t x", "-B -T 1.2.3", "-B -T 1.1234567890"])
def test_bad_logcat_arguments(args):
    with pytest.raises(ValueError, match="logcat: "):
        parse_logcat_args(args.split())


def test_split_log_records():
    assert split_log_records(rec.STREAM) == list(rec.RECORD_BYTES)
    assert split_log_records(b"") == []
    assert split_log_records(b"garbage") == [b"garbage"]
    first = rec.RECORD_BYTES[0]
    assert split_log_records(first + b"\x01") == [first, b"\x01"]
    assert split_log_records(first + first[:30]) == [first, first[:30]]
    v1 = write_record(rec.RECORDS[3], version=1)
    assert split_log_records(v1 + first) == [v1, first]
    bad_header = b"\x05\x00\x03\x00" + bytes(30)
    assert split_log_records(first + bad_header) == [first, bad_header]


def test_the_ring_keeps_whole_records_and_drops_the_oldest():
    size = sum(len(r) for r in rec.RECORD_BYTES[-10:])
    device = FakeDevice(logcat=rec.STREAM, log_ring_bytes=size)
    assert device.log_contents == b"".join(rec.RECORD_BYTES[-10:])
    device.set_log(b"")
    assert device.log_contents == b""
    device.log(rec.RECORD_BYTES[0])
    device.log(b"")
    assert device.log_contents == rec.RECORD_BYTES[0]
    tiny = FakeDevice(log_ring_bytes=1)
    tiny.log(rec.STREAM)
    assert tiny.log_contents == rec.RECORD_BYTES[-1]  # never less than the last record
    assert tiny.statistics().log_records == len(rec.RECORDS)


async def test_replay_paces_its_batches(autojump_clock):
    device = FakeDevice()
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def run() -> None:
            await device.replay(rec.STREAM, lines_per_second=10, tick=0.1)
            done.set()

        nursery.start_soon(run)
        await trio.sleep(1.05)
        assert device.statistics().log_records == 11  # 1 per tick, the first at once
        await done.wait()
    assert device.log_contents == rec.STREAM
    assert trio.current_time() == pytest.approx(4.0, abs=0.11)


async def test_replay_loops(autojump_clock):
    device = FakeDevice(log_ring_bytes=1 << 30)
    with trio.move_on_after(1.0):
        await device.replay(list(rec.RECORD_BYTES), lines_per_second=1000, loop=True)
    logged = device.statistics().log_records
    assert 990 <= logged <= 1010
    assert device.log_contents.startswith(rec.STREAM * (logged // len(rec.RECORDS)))


async def test_replay_refuses_a_rate_of_zero():
    with pytest.raises(ValueError, match="positive"):
        await FakeDevice().replay(rec.STREAM, lines_per_second=0)
    assert await FakeDevice().replay(b"", lines_per_second=1) == 0


async def test_replay_waits_for_a_reader_that_does_not_read(adb):
    # The adb flow control reaches back: WRTE waits for OKAY, the follower's queue fills up to
    # the high-water mark, and the replay waits instead of overflowing the follower.
    with trio.fail_after(CAP):
        device = FakeDevice(log_follower_bytes=8 << 20)
        async with open_adb_device(device, adb=adb) as rig, open_service(rig) as client:
            await wait_for(lambda: device.statistics().log_followers == 1, "a follower")
            with trio.move_on_after(2.0):
                await device.replay(
                    rec.STREAM, lines_per_second=200_000, loop=True, high_water=64 << 10
                )
            stats = device.statistics()
            assert stats.log_overflows == 0
            assert stats.log_records < 200_000  # held back: nobody read
            # Now read: everything logged arrives, in order.
            logged = stats.log_records
            entries = await client.until_entries(logged)
            assert len(entries) == logged
            assert entries[: len(rec.ENTRIES)] == list(rec.ENTRIES)
