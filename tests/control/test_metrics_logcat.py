"""/metrics from devices' logs: each app's crash counters are there at 0 as soon as ddmd reads
the log of a device with a VM of it (so Prometheus' ``increase()`` sees the first crash), the
backlog's crashes and restarts are not counted, live ones are, and the counts stay once the
crash has ended the VM; each device's stream and each viewer have their series, a viewer's
gone with it. The counts' bounds (apps per device, forgetting) are checked on ``AppCounts``.

The device's log is a fake adb side (tests/logcat/test_device_stream.py); time is trio's
autojump clock."""

from __future__ import annotations

import time
from typing import Any

import trio
import trio.testing

from ddmd.control.metrics import DaemonCollector, RelayTotals
from ddmd.logcat.counts import CRASH_KINDS, AppCount, AppCounts
from ddmd.logcat.device import LogcatSettings
from ddmd.logcat.hub import LogcatHub
from ddmd.logcat.lines import LineFilter
from tests.logcat import recording as rec
from tests.logcat.test_backlog_crashes import live_java_crash
from tests.logcat.test_device_stream import FakeAdb, opened
from tests.logcat.writer import Record, write_record

from .fakes import FakeVm
from .fakes import make_registry as make_vm_registry
from .test_metrics import Samples, scrape_collector, value

APP = "com.example.live"
SETTINGS = LogcatSettings(buffer_lines=1000, keep=True, idle_stop=5.0, stall=3.0, viewer_lines=5)


def start_proc(pid: int, app: str, nsec: int = 0) -> bytes:
    """ActivityManager's line as a process starts, stamped now (a live line)."""
    message = f"Start proc {pid}:{app}/u0a1 for activity {{{app}/.Main}}".encode()
    return write_record(Record(int(time.time()), nsec, 600, 632, 4, "ActivityManager", message, 3))


def crashes_of(samples: Samples, app: str, device: str = "A") -> dict[str, float]:
    return {
        kind: value(samples, "ddmd_app_crashes_total", device=device, app=app, kind=kind)
        for kind in CRASH_KINDS
    }


def has(samples: Samples, name: str, **labels: str) -> bool:
    return (name, tuple(sorted(labels.items()))) in samples


async def test_crash_and_restart_counters_of_a_device_whose_log_ddmd_reads(nursery, autojump_clock):
    adb = FakeAdb()
    published: list[dict[str, Any]] = []
    registry = make_vm_registry(FakeVm.android("A/4400", app=APP, package=APP))
    registry.set_device("A", "device")
    hub = LogcatHub(registry, adb.open, SETTINGS, lambda name, fields: published.append(fields))
    collector = DaemonCollector(registry, vms=list, retired=RelayTotals(), host="lab-7", logcat=hub)
    nursery.start_soon(hub.run)
    await opened(adb, 1)  # [logcat] keep: the log is read with no viewer
    await trio.testing.wait_all_tasks_blocked()

    # Known (a VM of it on the device) and its log read: every kind at 0 before any crash.
    first = scrape_collector(collector)
    assert crashes_of(first, APP) == {"java": 0, "native": 0, "anr": 0, "died": 0}
    assert value(first, "ddmd_app_restarts_total", device="A", app=APP) == 0
    assert value(first, "ddmd_logcat_streaming", device="A") == 1
    assert value(first, "ddmd_logcat_viewers", device="A") == 0
    assert value(first, "ddmd_logcat_stream_reconnects_total", device="A") == 0

    with hub.device("A").subscribe(LineFilter()) as viewer:
        # The device's ring: crashes (java, native, anr) and a restart of 2023, not news.
        await adb.end("A").send_all(rec.STREAM)
        await trio.sleep(1)  # quiet: the backlog is over
        backlog = scrape_collector(collector)
        assert value(backlog, "ddmd_logcat_lines_read_total", device="A") == len(rec.ENTRIES)
        for app in ("com.example.maps", "com.example.mail"):
            assert not has(backlog, "ddmd_app_crashes_total", device="A", app=app, kind="java")
            assert not has(backlog, "ddmd_app_restarts_total", device="A", app=app)
        assert crashes_of(backlog, APP) == {"java": 0, "native": 0, "anr": 0, "died": 0}
        # The viewer did not read: it lost what did not fit in its 5 lines.
        assert value(backlog, "ddmd_logcat_viewers", device="A") == 1
        lost = value(backlog, "ddmd_logcat_viewer_lines_dropped_total", device="A", viewer="1")
        assert lost == viewer.lost > 0
        assert value(backlog, "ddmd_logcat_lines_dropped_total", device="A") == lost
    left = scrape_collector(collector)
    assert value(left, "ddmd_logcat_viewers", device="A") == 0
    assert not [labels for name, labels in left if name.endswith("viewer_lines_dropped_total")]
    assert value(left, "ddmd_logcat_lines_dropped_total", device="A") == lost  # a counter

    # Live: the app restarts (a new pid), then crashes, and the crash ends its VM.
    await adb.end("A").send_all(start_proc(4400, APP) + start_proc(4401, APP, nsec=1))
    await trio.sleep(1)
    registry.remove("A/4400")
    await adb.end("A").send_all(live_java_crash(4401, APP))
    await trio.sleep(1)
    assert [(c["kind"], c["app"]) for c in published] == [("java", APP)]
    after = scrape_collector(collector)
    assert crashes_of(after, APP) == {
        "java": 1,
        "native": 0,
        "anr": 0,
        "died": 0,
    }  # kept past its VM
    assert value(after, "ddmd_app_restarts_total", device="A", app=APP) == 1
    assert not [name for name, labels in after if "vm" in dict(labels)]  # the VM is gone

    # The stream breaks: it is reopened, and that is a reconnect.
    await adb.end("A").aclose()
    await opened(adb, 2)
    await trio.testing.wait_all_tasks_blocked()
    again = scrape_collector(collector)
    assert value(again, "ddmd_logcat_stream_reconnects_total", device="A") == 1
    assert crashes_of(again, APP)["java"] == 1


async def test_no_app_series_for_a_device_whose_log_is_not_read(nursery, autojump_clock):
    adb = FakeAdb()
    registry = make_vm_registry(FakeVm.android("A/4400", app=APP, package=APP))
    registry.set_device("A", "device")
    settings = LogcatSettings(keep=False)
    hub = LogcatHub(registry, adb.open, settings, lambda name, fields: None)
    collector = DaemonCollector(registry, vms=list, retired=RelayTotals(), host="h", logcat=hub)
    nursery.start_soon(hub.run)
    await trio.testing.wait_all_tasks_blocked()
    samples = scrape_collector(collector, "h")
    assert not [name for name, _ in samples if name.startswith(("ddmd_app_", "ddmd_logcat_"))]


def test_app_counts_start_at_zero_and_stay_bounded():
    counts = AppCounts(max_apps=3, forget_after=3600.0)
    counts.seen("a", 0.0)
    counts.seen("b", 10.0)
    zero = dict.fromkeys(CRASH_KINDS, 0)
    assert counts.counts(10.0) == [
        AppCount("a", tuple(zero.items()), 0),
        AppCount("b", tuple(zero.items()), 0),
    ]
    counts.crashed("a", "native", 20.0)
    counts.crashed(None, "anr", 30.0)  # a crash the log names no app for
    counts.restarted("b", 40.0)
    assert {c.app: (dict(c.crashes), c.restarts) for c in counts.counts(40.0)} == {
        "a": ({**zero, "native": 1}, 0),
        "b": (zero, 1),
        "unknown": ({**zero, "anr": 1}, 0),
    }
    # Full: an app merely seen is not added; a crash makes room (the app seen longest ago goes).
    counts.seen("c", 50.0)
    assert [c.app for c in counts.counts(50.0)] == ["a", "b", "unknown"]
    counts.crashed("d", "java", 60.0)
    assert [c.app for c in counts.counts(60.0)] == ["b", "d", "unknown"]
    # Seen keeps an app; an hour without being seen or counted forgets it.
    counts.seen("b", 3000.0)
    assert [c.app for c in counts.counts(3650.0)] == ["b", "d"]
    assert [c.app for c in counts.counts(6601.0)] == []


def has_died(pid: int, app: str, nsec: int = 0) -> bytes:
    """ActivityManager's line as a process ends, stamped now."""
    message = f"Process {app} (pid {pid}) has died".encode()
    return write_record(Record(int(time.time()), nsec, 600, 632, 4, "ActivityManager", message, 3))


async def test_a_death_without_a_crash_is_counted_as_died_and_a_crash_s_end_is_not(
    nursery, autojump_clock
):
    adb = FakeAdb()
    published: list[dict[str, Any]] = []
    registry = make_vm_registry(FakeVm.android("A/4400", app=APP, package=APP))
    registry.set_device("A", "device")
    hub = LogcatHub(registry, adb.open, SETTINGS, lambda name, fields: published.append(fields))
    collector = DaemonCollector(registry, vms=list, retired=RelayTotals(), host="lab-7", logcat=hub)
    nursery.start_soon(hub.run)
    await opened(adb, 1)
    await trio.sleep(1)  # the (empty) backlog is over: what comes now is live
    # A Java crash, then ActivityManager's line of the death it caused: one crash, no died.
    await adb.end("A").send_all(live_java_crash(4400, APP) + has_died(4400, APP, nsec=9))
    await trio.sleep(1)
    assert crashes_of(scrape_collector(collector), APP) == {
        "java": 1, "native": 0, "anr": 0, "died": 0
    }  # fmt: skip
    # Much later the system kills the next process of the app, with no crash report: died,
    # counted, never announced.
    await trio.sleep(60)
    await adb.end("A").send_all(has_died(4401, APP))
    await trio.sleep(1)
    assert crashes_of(scrape_collector(collector), APP) == {
        "java": 1, "native": 0, "anr": 0, "died": 1
    }  # fmt: skip
    assert [c["kind"] for c in published] == ["java"]
