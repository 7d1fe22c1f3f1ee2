"""Issue 31, item 2: crashes from the past are not news.

A device's log stream starts with its backlog (``logcat -T N``: the ring, then what comes
live). A crash read from that backlog (a device connecting with old crashes in its ring, or
``[logcat] keep`` at start) is shown in logcat with its own time, but is never announced as
a new ``app.crashed`` warning: ddmd logs it at info level, saying it is from the backlog and
when it happened, and publishes no event. A crash that happens while the stream is live still
is news: one warning, one event.
"""

from __future__ import annotations

import time

import trio
from structlog.testing import capture_logs

from ddmd.logcat.lines import Line, LineFilter
from tests.logcat import recording as rec
from tests.logcat.test_device_stream import FakeAdb, lines_of, make, opened
from tests.logcat.writer import Record, write_record


def live_java_crash(pid: int, app: str) -> bytes:
    now = int(time.time())
    lines = ("FATAL EXCEPTION: main", f"Process: {app}, PID: {pid}", "java.lang.Error: now")
    return b"".join(
        write_record(Record(now, i, pid, pid, 6, "AndroidRuntime", text.encode(), 4, 10123))
        for i, text in enumerate(lines)
    )


async def test_backlog_crashes_are_shown_with_their_time_but_not_announced(nursery, autojump_clock):
    adb = FakeAdb()
    published: list = []
    device = make(adb, "A", published)
    nursery.start_soon(device.run)
    with capture_logs() as logs, device.subscribe(LineFilter()) as batches:
        await opened(adb, 1)
        # The device's ring, sent at once when the stream opens: three crashes of 2023.
        await adb.end("A").send_all(rec.STREAM)
        shown = await lines_of(batches, len(rec.ENTRIES))
        await trio.sleep(1)  # quiet: the backlog is over
        assert published == []
        crashed = [e for e in logs if e["event"] == "app.crashed"]
        assert sorted(e["kind"] for e in crashed) == ["anr", "java", "native"]
        assert {e["log_level"] for e in crashed} == {"info"}
        assert all(e["backlog"] is True for e in crashed)
        assert all(e["happened"].startswith("2023-11-14T22:13:") for e in crashed)
        # ... and logcat shows the crash lines with their own time.
        marked = [i for i in shown if isinstance(i, Line) and i.crash == "java"]
        assert marked
        assert all(i.entry.sec < rec.BASE_SEC + 60 for i in marked)

        # A crash that happens now is news: one warning, one event.
        await adb.end("A").send_all(live_java_crash(4400, "com.example.live"))
        await lines_of(batches, 3)
        await trio.sleep(1)
    assert [(c["kind"], c["app"]) for c in published] == [("java", "com.example.live")]
    warned = [e for e in logs if e["event"] == "app.crashed" and e["log_level"] == "warning"]
    assert len(warned) == 1
    assert "backlog" not in warned[0]
