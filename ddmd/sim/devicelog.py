"""The fake device's log (``logcat -B`` records): `split_log_records`, the fake ``logcat``'s
arguments (`LogcatOptions`, `parse_logcat_args`), the log ring and the streams following it
(`_DeviceLog`, `_LogFollower`). `ddmd.sim.adbd.FakeDevice` owns one `_DeviceLog`;
`ddmd.sim.adbd` re-exports the public names.

The log: ``FakeDevice(logcat=BACKLOG)`` or `FakeDevice.set_log` fill the ring (whole records,
the oldest dropped past ``log_ring_bytes``); ``device.log(records)`` appends and sends to every
open logcat stream (bytes that are not records, ``b"garbage"``, go out as they are); ``await
device.replay(records, lines_per_second=20_000, loop=True)`` logs a batch per tick and waits
while a stream is over a high-water mark (the adb flow control reaches back to it). A stream
more than ``log_follower_bytes`` behind is closed (logd drops a reader that cannot keep up).

Layer: the simulator; imports trio, the standard library and `ddmd.sim.devicestats`.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from ddmd.sim.devicestats import DeviceStatistics

__all__ = ["LogcatOptions", "parse_logcat_args", "split_log_records"]

_LOG_PREFIX: Final = struct.Struct("<HH")
_LOG_STAMP: Final = struct.Struct("<II")  # sec, nsec at offset 12 of every header version
_LOGCAT_PROGRAMS: Final = frozenset({"logcat", "/system/bin/logcat"})
#: logcat's one-letter options that take a value (besides -t and -T).
_LOGCAT_VALUED: Final = frozenset("bvefGnrmP")


def split_log_records(data: bytes) -> list[bytes]:
    """``data`` (logcat -B output) cut into records by their headers (``len`` and
    ``hdr_size``, 0 meaning 20). Bytes that do not make a whole record (garbage, a cut tail)
    are kept as one last piece, so nothing is lost."""
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < _LOG_PREFIX.size:
            out.append(data[pos:])
            break
        length, hdr_size = _LOG_PREFIX.unpack_from(data, pos)
        size = (hdr_size or 20) + length
        if (hdr_size not in (0, 20) and hdr_size < 24) or pos + size > end:
            out.append(data[pos:])
            break
        out.append(data[pos : pos + size])
        pos += size
    return out


def _whole_record(piece: bytes) -> bool:
    """Whether ``piece`` is exactly one record by its header (as `split_log_records` cuts)."""
    if len(piece) < _LOG_PREFIX.size:
        return False
    length: int
    hdr_size: int
    length, hdr_size = _LOG_PREFIX.unpack_from(piece, 0)
    if hdr_size not in (0, 20) and hdr_size < 24:
        return False
    return (hdr_size or 20) + length == len(piece) and length > 0


def _stamp(record: bytes) -> tuple[int, int] | None:
    """(sec, nsec) of a record; None for bytes too short to be one."""
    if len(record) < 20:
        return None
    sec, nsec = _LOG_STAMP.unpack_from(record, 12)
    return sec, nsec


@dataclass(frozen=True, slots=True)
class LogcatOptions:
    """What the fake ``logcat`` does with its arguments: ``-B`` (binary), ``-d`` (dump the
    ring and exit), ``-t N|TIME`` (the last N records, or those since TIME, and exit), ``-T
    N|TIME`` (the same, then follow). TIME is seconds since the Epoch with a fraction
    (``1700000000.250000000``), logcat's ``sssss.mmm`` form. ``-b``, ``-v``, ``-s`` and
    filter specs are accepted and ignored: the stream carries whatever was logged."""

    binary: bool = False
    dump: bool = False
    tail: int | None = None
    since: tuple[int, int] | None = None


def parse_logcat_args(args: list[str]) -> LogcatOptions:
    """`LogcatOptions` of ``args``; ValueError (logcat's own complaint) for a bad ``-t``/``-T``
    value or a missing option argument."""
    binary = dump = False
    tail: int | None = None
    since: tuple[int, int] | None = None
    words = iter(args)
    for word in words:
        if word.startswith("--"):
            name = word[2:].partition("=")[0]
            binary = binary or name == "binary"
            dump = dump or name == "dump"
            continue
        if not word.startswith("-") or len(word) < 2:
            continue  # a filter spec
        flags = word[1:]
        for i, flag in enumerate(flags):
            if flag in "tT":
                value = flags[i + 1 :] or next(words, None)
                if value is None:
                    raise ValueError(f"logcat: option requires an argument -- '{flag}'")
                tail, since = _tail_or_since(value)
                dump = dump or flag == "t"
                break
            if flag in _LOGCAT_VALUED:
                if i == len(flags) - 1:
                    next(words, None)  # its value is the next word
                break  # the rest of this word is its value
            binary = binary or flag == "B"
            dump = dump or flag == "d"
    return LogcatOptions(binary, dump, tail, since)


def _tail_or_since(value: str) -> tuple[int | None, tuple[int, int] | None]:
    whole, dot, fraction = value.partition(".")
    if whole.isdigit() and not dot:
        return int(whole), None
    if whole.isdigit() and fraction.isdigit() and len(fraction) <= 9:
        return None, (int(whole), int(fraction.ljust(9, "0")))
    raise ValueError(f"logcat: -t/-T {value!r}: expected a count or seconds.fraction")


class _LogFollower:
    """One ``logcat`` stream following the log: what was logged since it last took."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending = bytearray()
        self.overflowed = False
        self._wake = trio.Event()

    def push(self, data: bytes) -> bool:
        """Queue ``data``; False (and overflowed) once more than ``limit`` bytes wait."""
        if self.overflowed:
            return False
        if len(self.pending) + len(data) > self.limit:
            self.overflowed = True
            self.pending.clear()
        else:
            self.pending += data
        self._wake.set()
        return not self.overflowed

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data

    async def wait(self) -> None:
        if not self.pending and not self.overflowed:
            self._wake = trio.Event()
            await self._wake.wait()


class _DeviceLog:
    """The device's log ring (whole records, the oldest dropped past ``ring_bytes``, never the
    last one) and the streams that follow it."""

    def __init__(self, stats: DeviceStatistics, ring_bytes: int, follower_bytes: int) -> None:
        self._stats = stats
        self.ring_bytes = ring_bytes
        self.follower_bytes = follower_bytes
        self._ring: deque[tuple[tuple[int, int] | None, bytes]] = deque()
        self._size = 0
        self.followers: set[_LogFollower] = set()
        self._drained = trio.Event()

    def contents(self) -> bytes:
        return b"".join(record for _, record in self._ring)

    def set(self, data: bytes) -> None:
        self._ring.clear()
        self._size = 0
        self._keep(split_log_records(data))

    def append(self, records: list[bytes]) -> None:
        """Add ``records`` to the ring and queue them for every follower. Bytes that are not a
        whole record (garbage, a cut tail) go to the open streams only: logd's ring holds
        records, so a stream opened later never gets them."""
        if not records:
            return
        self._keep([r for r in records if _whole_record(r)])
        data = b"".join(records)
        for follower in list(self.followers):
            if not follower.push(data):
                self._stats.log_overflows += 1
                self.followers.discard(follower)

    def _keep(self, records: list[bytes]) -> None:
        ring = self._ring
        for record in records:
            ring.append((_stamp(record), record))
            self._size += len(record)
        self._stats.log_records += len(records)
        while self._size > self.ring_bytes and len(ring) > 1:
            self._size -= len(ring.popleft()[1])

    def select(self, tail: int | None, since: tuple[int, int] | None) -> bytes:
        """The ring, or its last ``tail`` records, or those stamped ``since`` or later
        (bytes without a stamp always pass)."""
        ring: list[tuple[tuple[int, int] | None, bytes]] = list(self._ring)
        if tail is not None:
            ring = ring[len(ring) - tail :] if tail else []
        if since is not None:
            ring = [(stamp, r) for stamp, r in ring if stamp is None or stamp >= since]
        return b"".join(record for _, record in ring)

    def follow(self) -> _LogFollower:
        follower = _LogFollower(self.follower_bytes)
        self.followers.add(follower)
        return follower

    def taken(self) -> None:
        """A follower took its queue: wake `wait_drained`."""
        self._drained.set()

    async def wait_drained(self, high_water: int) -> bool:
        """Until no follower has more than ``high_water`` bytes queued; whether it waited."""
        waited = False
        while any(len(f.pending) > high_water for f in self.followers):
            waited = True
            self._drained = trio.Event()
            await self._drained.wait()
        return waited

    async def replay(
        self,
        records: bytes | Sequence[bytes],
        *,
        lines_per_second: float,
        loop: bool,
        tick: float,
        high_water: int,
    ) -> int:
        """`append` ``records`` at ``lines_per_second``, one batch per ``tick``, waiting while a
        follower has over ``high_water`` bytes queued (see `ddmd.sim.adbd.FakeDevice.replay`)."""
        if lines_per_second <= 0 or tick <= 0:
            raise ValueError("lines_per_second and tick must be positive")
        items = split_log_records(records) if isinstance(records, bytes) else list(records)
        if not items:
            return 0
        sent = index = 0
        owed = lines_per_second * tick
        last = trio.current_time()
        while True:
            count = int(owed + 1e-9)
            owed -= count
            batch: list[bytes] = []
            while count > 0:
                take = items[index : index + count]
                batch += take
                count -= len(take)
                index += len(take)
                if index == len(items):
                    if not loop:
                        break
                    index = 0
            self.append(batch)
            sent += len(batch)
            if not loop and index == len(items):
                return sent
            if await self.wait_drained(high_water):
                last = trio.current_time()
            await trio.sleep(tick)
            now = trio.current_time()
            owed += lines_per_second * (now - last)
            last = now

    async def serve(self, args: list[str], write: Callable[[bytes], Awaitable[None]]) -> None:
        """A ``logcat ARGS`` stream (see `LogcatOptions`) through ``write``. Without ``-B`` it
        says it serves binary only and exits (ddmd always asks for binary)."""
        try:
            options = parse_logcat_args(args)
        except ValueError as exc:
            await write(f"{exc}\n".encode())
            return
        if not options.binary:
            await write(b"logcat: this fake device only serves the binary format: add -B\n")
            return
        if options.dump:
            backlog = self.select(options.tail, options.since)
            if backlog:
                await write(backlog)
            return
        # Snapshot and registration with no await between: nothing logged is missed.
        backlog = self.select(options.tail, options.since)
        follower = self.follow()
        try:
            if backlog:
                await write(backlog)
            while True:
                data = follower.take()
                self.taken()
                if data:
                    await write(data)
                elif follower.overflowed:
                    return
                else:
                    await follower.wait()
        finally:
            self.followers.discard(follower)
            self.taken()
