"""The sans-IO parts of ddmd.logcat on THE recording (tests/logcat/recording.py): which app each
entry belongs to, restarts, pid reuse, crash marks and the one report per crash, the filter
and the ring. No event loop."""

from __future__ import annotations

import pytest

from ddmd.logcat.apps import AppTracker, Seen
from ddmd.logcat.crashes import CrashDetector
from ddmd.logcat.lines import Line, LineFilter, Restart, Ring, parse_since
from ddmd.protocol.logcat import LogEntry
from tests.logcat import recording as rec


def attribute(entries=rec.ENTRIES, vms=None):
    """(app, mark) of every entry, the restarts seen, the crashes reported."""
    apps, crashes = AppTracker(), CrashDetector()
    out, seen, reported = [], [], []
    if vms is not None:
        seen += apps.sync(vms)
    for entry in entries:
        app, more = apps.observe(entry)
        seen += more
        mark, app, ended = crashes.observe(entry, app)
        reported += ended
        out.append((app, mark))
    reported += crashes.flush()
    return out, seen, reported


def test_every_line_an_app_wrote_is_its_own_and_lines_about_it_may_be_too():
    out, _, _ = attribute()
    for app in (rec.MAIL, rec.MAPS, rec.OTHER):
        shown = {i for i, (who, _) in enumerate(out) if who == app}
        assert set(rec.lines_of(app)) <= shown, (app, sorted(set(rec.lines_of(app)) - shown))
        assert shown <= set(rec.lines_about(app)), (app, sorted(shown - set(rec.lines_about(app))))


def test_the_app_that_reuses_a_pid_is_never_shown_as_the_old_one():
    out, _, _ = attribute()
    for i in rec.lines_of(rec.OTHER):
        assert out[i][0] == rec.OTHER
        assert rec.ENTRIES[i].pid == rec.MAIL_PID  # the very pid mail had


def test_a_restart_is_seen_once_with_both_pids():
    _, seen, _ = attribute()
    assert seen == [Seen(rec.MAIL, rec.MAIL_PID, rec.MAIL_PID_2)]


def test_ddmds_own_vms_name_pids_that_no_log_line_names():
    # Without the "Start proc" lines (a log opened later), ddmd's VM list names the pids.
    late = [e for e in rec.ENTRIES if not e.message.startswith("Start proc")]
    out, _, _ = attribute(late, vms={rec.MAIL_PID: rec.MAIL, rec.MAPS_PID: rec.MAPS})
    first_mail = next(i for i, e in enumerate(late) if e.pid == rec.MAIL_PID)
    assert out[first_mail][0] == rec.MAIL


def test_crash_lines_are_marked_and_attributed_as_designed():
    out, _, _ = attribute()
    for kind in ("java", "native", "anr", "died"):
        marked = {i for i, (_, mark) in enumerate(out) if mark == kind}
        assert marked == set(rec.crash_lines(kind)), kind
        for app in (rec.MAIL, rec.MAPS):
            mine = {i for i in marked if out[i][0] == app}
            assert mine == set(rec.crash_lines(kind, app)), (kind, app)


def test_each_crash_is_reported_once_with_its_app_pid_and_first_lines():
    _, _, reported = attribute()
    assert [(c.kind, c.app, c.pid) for c in reported] == [
        ("anr", rec.MAPS, rec.MAPS_PID),
        ("java", rec.MAPS, rec.MAPS_PID),
        ("native", rec.MAIL, rec.MAIL_PID_2),
    ]
    java = reported[1]
    assert java.lines[0].startswith("FATAL EXCEPTION")
    assert any(line.startswith("java.lang.") for line in java.lines)
    native = reported[2]
    assert any("SIGSEGV" in line for line in native.lines)
    assert not any(line.startswith("*** ***") for line in native.lines)


def entry(tag: str, message: str, level: int = 4, pid: int = 1) -> LogEntry:
    return LogEntry(sec=1, nsec=0, pid=pid, tid=pid, level=level, tag=tag, message=message)


def test_the_filter_by_level_tag_exclusion_and_grep():
    lines = [
        Line(1, "d", entry("A b", "hello world", 3), "app"),
        Line(2, "d", entry("B", "oops", 6), "app"),
        Line(3, "d", entry("C", "crash here", 2), "app", crash="java"),
        Line(4, "d", entry("A b", "other", 6), "other"),
    ]
    restart = Restart(5, "d", "app", 1, 2, 1.0)

    def pick(wanted: LineFilter) -> list[int]:
        return [item.seq for item in [*lines, restart] if wanted.matches(item)]

    assert pick(LineFilter.parse(app="app")) == [1, 2, 3, 5]
    assert pick(LineFilter.parse(app="app", level="W")) == [2, 3, 5]  # crash lines always
    assert pick(LineFilter.parse(tags=["A b"])) == [1, 4, 5]
    assert pick(LineFilter.parse(app="app", tags=["-A b"])) == [2, 3, 5]
    assert pick(LineFilter.parse(grep="o+ps|world")) == [1, 2, 5]
    with pytest.raises(ValueError, match="not a regular expression"):
        LineFilter.parse(grep="(")
    with pytest.raises(ValueError):
        LineFilter.parse(level="loud")


def test_since_takes_a_count_or_a_duration():
    assert parse_since("200") == ("lines", 200)
    assert parse_since("5m") == ("seconds", 300)
    assert parse_since("30s") == ("seconds", 30)
    with pytest.raises(ValueError, match="30s, 5m, 2h"):
        parse_since("yesterday")


def test_the_ring_keeps_the_newest_and_selects_by_seq_count_and_time():
    ring = Ring(3)
    for n in range(5):
        ring.add([Line(ring.take(), "d", LogEntry(n, 0, 1, 1, 4, "T", str(n)))])
    every = LineFilter()
    assert [i.seq for i in ring.select(every)] == [3, 4, 5]
    assert [i.seq for i in ring.select(every, after=3)] == [4, 5]
    assert [i.seq for i in ring.select(every, last=1)] == [5]
    assert [i.seq for i in ring.select(every, since_time=3.5)] == [5]
    assert ring.select(every, last=0) == []


def test_ddmds_vm_list_now_does_not_turn_the_backlog_into_restarts():
    # ddmd already holds mail's second process when the log opens: its backlog still shows
    # exactly one restart, 4242 -> 4301.
    _, seen, _ = attribute(vms={rec.MAIL_PID_2: rec.MAIL})
    assert seen == [Seen(rec.MAIL, rec.MAIL_PID, rec.MAIL_PID_2)]


def test_a_restart_ddmd_sees_before_the_log_says_it_is_told_once():
    apps = AppTracker()
    assert apps.sync({10: "a"}) == []
    assert apps.sync({11: "a"}) == [Seen("a", 10, 11)]
    started = LogEntry(5, 0, 600, 600, 4, "ActivityManager", "Start proc 11:a/u0a1 for activity")
    assert apps.observe(started) == ("a", [])  # already told
    assert apps.app_of(11) == "a"
