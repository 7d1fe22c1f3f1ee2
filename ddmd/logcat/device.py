"""One device's log: one stream however many viewers, read in logcat's binary format through
the adb server, attributed to apps, kept in a bounded ring and passed on in batches.

Layer: trio, structlog, logs, ``ddmd.protocol.logcat`` and the sans-IO parts of this folder.
The adb side is one callable (``Opener``: serial, service -> stream), so tests and other
servers fit.

Lifecycle: the stream opens when the first viewer arrives (or at once with ``[logcat] keep``),
and closes ``idle_stop`` seconds after the last one leaves. It reopens with back-off when the
device or the adb server goes away, and when the stream breaks the format (each kind of
breakage logged once per device); a reopened stream asks only for what came after the last
entry seen, and entries seen already are skipped.

Why binary (``logcat -B``): every field is in it (time to the nanosecond, pid, tid, level, tag,
message, the buffer), a multi-line message is one entry, a tag may hold spaces, and nothing
has to be guessed from a text format that differs between Android versions.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
import trio

from ddmd.logcat.apps import AppTracker, Seen
from ddmd.logcat.counts import MAX_APPS, AppCount, AppCounts
from ddmd.logcat.crashes import Crash, CrashDetector
from ddmd.logcat.lines import Item, Line, LineFilter, Restart, Ring
from ddmd.logs import Event
from ddmd.protocol.logcat import EOF, NEED_DATA, LogcatDecoder, LogcatMalformed, LogEntry

__all__ = ["BUFFERS", "DeviceCounts", "DeviceLogcat", "LogcatSettings", "Opener", "Viewer"]

log = structlog.get_logger("ddmd.logcat")

#: The buffers a plain ``adb logcat`` shows (a Java crash lands in "crash").
BUFFERS = ("main", "system", "crash")
Opener = Callable[[str, str], Awaitable[trio.abc.Stream]]
RETRY_FIRST = 0.5
RETRY_MAX = 10.0
#: Quiet this long after a crash's first lines: its block is over.
CRASH_QUIET = 0.5
#: A process death this soon after a crash of its app is that crash's end, not a death of its own.
DIED_AFTER = 30.0
#: Seconds: an entry stamped this much before its stream was opened is from the backlog.
BACKLOG_SLACK = 2.0


@dataclass(frozen=True, slots=True)
class LogcatSettings:
    buffer_lines: int = 20_000
    keep: bool = False
    idle_stop: float = 30.0
    stall: float = 10.0  # a partial entry that gets no more bytes for this long: reopened
    # Lines that may wait for one viewer before it loses some: 12.5 s of a device logging
    # 20,000 lines a second. The lines are shared by all viewers; a slow one holds them longer.
    viewer_lines: int = 250_000


@dataclass(eq=False)
class Viewer:
    """One subscriber: its filter and its queue of batches (lists of items), bounded by the
    lines in it. A viewer too slow to take them loses the newest, and is told how many with
    the next batch it gets (``dropped``)."""

    wanted: LineFilter
    send: trio.MemorySendChannel[list[Item]]
    receive: trio.MemoryReceiveChannel[list[Item]]
    budget: int
    queued: int = 0
    dropped: int = 0  # lost since the viewer was last told
    lost: int = 0  # lost in all
    number: int = 0  # its device's number for it (the ``viewer`` label on /metrics)

    async def next_batch(self) -> tuple[list[Item], int]:
        """The next batch, and how many lines were lost before it (EndOfChannel at the end)."""
        batch = await self.receive.receive()
        self.queued -= len(batch)
        dropped, self.dropped = self.dropped, 0
        return batch, dropped


@dataclass
class _Stats:
    entries: int = 0
    opens: int = 0
    reconnects: int = 0  # opens after the stream broke, stalled or ended
    problems: dict[str, int] = field(default_factory=dict)
    dropped: int = 0  # lines viewers too slow to take them lost


@dataclass(frozen=True, slots=True)
class DeviceCounts:
    """One device's log, for /metrics: its stream's counts, each viewer's lost lines (viewer
    number, lines), and its apps' crashes and restarts (``counts.AppCounts``)."""

    serial: str
    streaming: bool
    entries: int
    dropped: int
    reconnects: int
    viewers: tuple[tuple[int, int], ...]
    apps: tuple[AppCount, ...]


class DeviceLogcat:
    """The log of device ``serial``. ``vms()``: pid -> app of ddmd's VMs on it now;
    ``publish(name, fields)``: an event for the event stream (``app.crashed``)."""

    def __init__(
        self,
        serial: str,
        opener: Opener,
        settings: LogcatSettings,
        vms: Callable[[], Mapping[int, str]],
        publish: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self.serial = serial
        self._opener = opener
        self.settings = settings
        self._vms = vms
        self._publish = publish
        self.ring = Ring(settings.buffer_lines)
        self._apps = AppTracker()
        self._crashes = CrashDetector()
        self._viewers: set[Viewer] = set()
        self._viewer_numbers = itertools.count(1)
        # Live crashes and restarts per app (not the backlog's: they are not news).
        self.app_counts = AppCounts()
        self._crash_at: dict[str, float] = {}  # app -> when its last live crash was counted
        self._wanted = trio.Event()
        self._last: tuple[int, int] | None = None  # (sec, nsec) of the newest entry seen
        self._last_keys: set[tuple[int, int, int, str]] = set()  # entries at that instant
        # While a reopened stream repeats what came before: the instant it must pass.
        self._replaying: tuple[int, int] | None = None
        self._replay_keys: set[tuple[int, int, int, str]] = set()
        # The backlog (crashes from the past are not news): what a stream sends first, stamped
        # before it was opened (wall clock, less `BACKLOG_SLACK`), until it goes quiet or
        # sends a newer entry. `_backlog_end`: the newest backlog entry's time, for good.
        self._backlog_before: float | None = None
        self._backlog_end: float | None = None
        self.stats = _Stats()
        self.streaming = False

    # ------------------------------------------------------------------ viewers

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    @contextlib.contextmanager
    def subscribe(self, wanted: LineFilter) -> Iterator[Viewer]:
        """New items matching ``wanted`` (``Viewer.next_batch``) while the context lasts."""
        send, receive = trio.open_memory_channel[list[Item]](math.inf)
        viewer = Viewer(
            wanted, send, receive, self.settings.viewer_lines, number=next(self._viewer_numbers)
        )
        self._viewers.add(viewer)
        self._wanted.set()
        try:
            yield viewer
        finally:
            self._viewers.discard(viewer)
            send.close()
            if viewer.lost:
                log.info(Event.LOGCAT_VIEWER_LAGGED, device=self.serial, lost=viewer.lost)

    def select(self, wanted: LineFilter, **kw: Any) -> list[Item]:
        return self.ring.select(wanted, **kw)

    def counts(self, apps: Iterable[str], now: float) -> DeviceCounts:
        """Its counts now (``now``: `time.monotonic`); ``apps``, the apps of ddmd's VMs on the
        device, are counted from now on (at 0) while the log is read."""
        if self.streaming:
            for app in apps:
                self.app_counts.seen(app, now)
        stats = self.stats
        return DeviceCounts(
            self.serial,
            self.streaming,
            stats.entries,
            stats.dropped,
            stats.reconnects,
            tuple(sorted((v.number, v.lost) for v in self._viewers)),
            tuple(self.app_counts.counts(now)),
        )

    # ------------------------------------------------------------------ the stream

    async def run(self) -> None:
        """Follow the device's log while someone wants it; never returns (cancel it)."""
        failures = 0
        broke = False  # the last stream broke, stalled or ended: the next open is a reconnect
        while True:
            await self._wait_for_viewers()
            try:
                stream = await self._opener(self.serial, self._service())
            except Exception as exc:  # the adb edge: anything here means "not now"
                failures += 1
                self._problem("open_failed", f"could not open the log: {exc}")
                await trio.sleep(min(RETRY_MAX, RETRY_FIRST * 2 ** min(failures, 6)))
                continue
            self.stats.opens += 1
            if broke:
                self.stats.reconnects += 1
            self.streaming = True
            self._backlog_before = time.time() - BACKLOG_SLACK
            try:
                how = await self._follow(stream)
            finally:
                self.streaming = False
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            self._crashed(self._crashes.flush())
            broke = how != "idle"
            if how == "idle":
                failures = 0
                continue
            failures = failures + 1 if how != "ended" else 1
            await trio.sleep(min(RETRY_MAX, RETRY_FIRST * 2 ** min(failures, 6)))

    def _service(self) -> str:
        buffers = " ".join(f"-b {b}" for b in BUFFERS)
        if self._last is None:
            since = str(self.settings.buffer_lines)  # the newest N of the device's backlog
        else:
            sec, nsec = self._last
            since = f"{sec}.{nsec:09d}"  # what came after the last entry seen
        return f"exec:logcat -B {buffers} -T {since}"

    async def _wait_for_viewers(self) -> None:
        while not self._viewers and not self.settings.keep:
            self._wanted = trio.Event()
            await self._wanted.wait()

    async def _follow(self, stream: trio.abc.Stream) -> str:
        """Read until the stream ends ("ended"), breaks ("broken") or nobody watches ("idle")."""
        decoder = LogcatDecoder()
        self._replaying, self._replay_keys = self._last, set(self._last_keys)
        unwatched_since: float | None = None
        while True:
            now = trio.current_time()
            if self._viewers or self.settings.keep:
                unwatched_since = None
            elif unwatched_since is None:
                unwatched_since = now
            elif now - unwatched_since >= self.settings.idle_stop:
                return "idle"
            quiet = CRASH_QUIET if decoder.buffered == 0 else self.settings.stall
            with trio.move_on_after(quiet) as waited:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._problem("broken", f"the log stream broke: {exc}")
                    return "broken"
            if waited.cancelled_caught:
                if decoder.buffered:
                    self._problem(
                        "stalled",
                        f"the log stream stopped inside an entry for {self.settings.stall:g} s",
                    )
                    return "broken"
                self._crashed(self._crashes.flush())
                self._backlog_before = None  # the backlog is over: what comes now is live
                continue
            decoder.receive_data(data)
            try:
                entries = list(_drain(decoder))
            except LogcatMalformed as exc:
                self._problem("malformed", str(exc))
                return "broken"
            if entries:
                self._take(entries)
            if not data:
                self._problem("ended", "the log stream ended (the device or adb went away)")
                return "ended"

    # ------------------------------------------------------------------ entries

    def _take(self, entries: list[LogEntry]) -> None:
        ring = self.ring
        items: list[Item] = []
        crashes: list[Crash] = []
        items += self._restarts(self._apps.sync(self._vms()), entries[0])
        for entry in entries:
            if not self._is_new(entry):
                continue
            self._note_backlog(entry)
            app, seen = self._apps.observe(entry)
            items += self._restarts(seen, entry)
            mark, app, ended = self._crashes.observe(entry, app)
            crashes += ended
            if mark == "died":
                self._died(app, entry, crashes)
            items.append(Line(ring.take(), self.serial, entry, app, mark))
        self.stats.entries += len(entries)
        ring.add(items)
        self._deliver(items)
        self._crashed(crashes)

    def _is_new(self, entry: LogEntry) -> bool:
        """Skip what a reopened stream sends again (it asks from the last instant seen), until
        it passes that instant; a live stream's entries all pass, even one stamped a little
        before the one ahead of it (processes stamp their own lines)."""
        stamp = (entry.sec, entry.nsec)
        key = (entry.sec, entry.nsec, entry.pid, entry.tag)
        replaying = self._replaying
        if replaying is not None:
            if stamp < replaying or (stamp == replaying and key in self._replay_keys):
                return False
            if stamp > replaying:
                self._replaying = None
        last = self._last
        if last is None or stamp > last:
            self._last, self._last_keys = stamp, {key}
        elif stamp == last:
            self._last_keys.add(key)
        return True

    def _note_backlog(self, entry: LogEntry) -> None:
        before = self._backlog_before
        if before is None:
            return
        stamp = entry.sec + entry.nsec / 1e9
        if stamp >= before:
            self._backlog_before = None  # a live entry: the backlog is over
        elif self._backlog_end is None or stamp > self._backlog_end:
            self._backlog_end = stamp

    def _restarts(self, seen: list[Seen], entry: LogEntry) -> list[Item]:
        when = entry.sec + entry.nsec / 1e9
        if seen and (self._backlog_end is None or when > self._backlog_end):
            now = time.monotonic()  # counted live only: the backlog's restarts are not news
            for s in seen:
                self.app_counts.restarted(s.app, now)
        return [
            Restart(self.ring.take(), self.serial, s.app, s.old_pid, s.new_pid, when) for s in seen
        ]

    def _crashed(self, crashes: list[Crash]) -> None:
        for crash in crashes:
            fields = {
                "device": self.serial,
                "app": crash.app,
                "pid": crash.pid,
                "kind": crash.kind,
                "lines": list(crash.lines),
            }
            if self._backlog_end is not None and crash.time <= self._backlog_end:
                # From the device's log backlog: shown in logcat with its own time, not news.
                happened = datetime.fromtimestamp(crash.time, UTC).isoformat()
                log.info(Event.APP_CRASHED, backlog=True, happened=happened, **fields)
                continue
            log.warning(Event.APP_CRASHED, **fields)
            self.app_counts.crashed(crash.app, crash.kind, time.monotonic())
            if crash.app is not None:
                self._crash_at.pop(crash.app, None)
                self._crash_at[crash.app] = trio.current_time()
                while len(self._crash_at) > MAX_APPS:
                    del self._crash_at[next(iter(self._crash_at))]
            self._publish(Event.APP_CRASHED, fields)

    def _died(self, app: str | None, entry: LogEntry, crashes: list[Crash]) -> None:
        """A process died: counted as "died" when no crash of its app came just before (a crash
        report ends with that line too), and only live (not from the backlog)."""
        stamp = entry.sec + entry.nsec / 1e9
        if app is None or (self._backlog_end is not None and stamp <= self._backlog_end):
            return
        now = trio.current_time()
        if any(c.app == app for c in crashes) or now - self._crash_at.get(app, -1e9) < DIED_AFTER:
            return
        self.app_counts.crashed(app, "died", time.monotonic())

    def _deliver(self, items: list[Item]) -> None:
        if not items:
            return
        for viewer in list(self._viewers):
            batch = [item for item in items if viewer.wanted.matches(item)]
            if not batch:
                continue
            if viewer.queued + len(batch) > viewer.budget:
                viewer.dropped += len(batch)  # it is told with the next batch it gets
                viewer.lost += len(batch)
                self.stats.dropped += len(batch)
                continue
            try:
                viewer.send.send_nowait(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._viewers.discard(viewer)
                continue
            viewer.queued += len(batch)

    def _problem(self, kind: str, message: str) -> None:
        count = self.stats.problems.get(kind, 0)
        self.stats.problems[kind] = count + 1
        report = log.warning if count == 0 else log.debug
        report(Event.LOGCAT_STREAM_PROBLEM, device=self.serial, problem=kind, error=message)


def _drain(decoder: LogcatDecoder) -> Iterator[LogEntry]:
    while True:
        event = decoder.next_entry()
        if event is NEED_DATA or event is EOF:
            return
        assert isinstance(event, LogEntry)
        yield event
