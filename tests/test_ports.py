"""PortBook: per-app debugger ports kept across restarts (plain logic and one JSON file).

The last test runs ``VmPorts`` on real loopback listeners to check that a port another program
holds is skipped; everything else is file and dict logic.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from ddmd import portbook as ports_module
from ddmd.config import PortRange, parse_config
from ddmd.daemon import forget_old_ports
from ddmd.drive.ports import VmPorts
from ddmd.errors import ConfigError, TargetError
from ddmd.portbook import MAX_ENTRIES, PortBook, vm_key
from tests.actors.rawpeers import free_port_range
from tests.control.fakes import FakeVm, make_registry

RANGE = PortRange(9000, 9009)
T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
DAY = 86400.0


def first(book: PortBook, key: str, in_use: set[int] | None = None) -> int:
    return next(iter(book.candidates(key, in_use or set())))


def test_vm_key() -> None:
    assert vm_key(None, "com.example") == "local|com.example"
    assert vm_key("emulator-5554", "com.example") == "emulator-5554|com.example"


def test_same_key_gets_the_same_port_after_reload(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ports.json"  # the directory does not exist yet
    book = PortBook(path, RANGE)
    for key in ("local|a", "local|b", "local|c"):
        book.record(key, first(book, key))
    book.save()
    again = PortBook(path, RANGE)
    assert again.problems == []
    assert again.items() == [("local|a", 9000), ("local|b", 9001), ("local|c", 9002)]
    assert first(again, "local|b") == 9001
    assert again.get("local|c") == 9002
    assert again.get("local|unknown") is None


def test_new_keys_get_the_lowest_free_unreserved_port(tmp_path: Path) -> None:
    book = PortBook(None, RANGE)
    book.record("local|a", 9000)
    book.record("local|b", 9002)
    assert first(book, "local|new") == 9001
    candidates = list(book.candidates("local|new", set()))
    # Free unreserved ports first, lowest first; ports reserved by absent apps last.
    assert candidates == [9001, *range(9003, 9010), 9000, 9002]


def test_ports_in_use_are_skipped() -> None:
    book = PortBook(None, RANGE)
    book.record("local|a", 9000)
    book.record("local|b", 9001)
    # a's own port is taken (say by a second instance of a): the next free one, never 9001.
    assert list(book.candidates("local|a", {9000, 9002}))[:2] == [9003, 9004]
    assert 9000 not in book.candidates("local|a", {9000})
    everything = set(RANGE)
    assert list(book.candidates("local|c", everything)) == []
    assert list(book.candidates("local|c", everything - {9001})) == [9001]


def test_record_moves_a_port_to_its_new_owner() -> None:
    book = PortBook(None, RANGE)
    book.record("local|a", 9000)
    book.record("local|b", 9000)
    assert book.items() == [("local|b", 9000)]
    book.record("local|b", 9005)
    assert book.items() == [("local|b", 9005)]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"version": 1}',
        b'{"ports": []}',
        b"[1, 2]",
        b'{"ports": {"\xff": 9000}}',
        b"",
    ],
    ids=["syntax", "no-ports", "ports-not-object", "not-object", "bad-utf8", "empty"],
)
def test_corrupt_state_file_is_reported_and_ignored(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "ports.json"
    path.write_bytes(content)
    problem = "ignoring corrupt state file"
    book = PortBook(path, RANGE)
    assert book.items() == []
    assert len(book.problems) == 1
    assert book.problems[0].startswith(f"{problem} {path}")
    # The book still works and saving replaces the bad file.
    book.record("local|a", first(book, "local|a"))
    book.save()
    assert PortBook(path, RANGE).items() == [("local|a", 9000)]


def test_unreadable_state_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    path.mkdir()  # reading a directory fails even as root
    book = PortBook(path, RANGE)
    assert book.items() == []
    assert len(book.problems) == 1
    assert book.problems[0].startswith(f"cannot read {path}")


def test_missing_state_file_is_not_a_problem(tmp_path: Path) -> None:
    book = PortBook(tmp_path / "nothing-here.json", RANGE)
    assert book.problems == []
    assert book.items() == []


def test_entries_outside_the_range_or_malformed_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    entries = {"local|low": 80, "local|ok": 9004, "local|str": "9001", "local|bool": True}
    entries["local|float"] = 9002.0
    entries["local|high"] = 9010
    path.write_text(json.dumps({"version": 1, "ports": entries}))
    book = PortBook(path, RANGE)
    assert book.items() == [("local|ok", 9004)]
    # One summarising problem line, not one per entry (a changed range would flood the log).
    (problem,) = book.problems
    assert str(path) in problem
    assert problem.startswith("ignoring 5 entries")
    assert "'local|low': 80" in problem
    # A narrower range on the next start drops what no longer fits, a wider one keeps all.
    assert PortBook(path, PortRange(9000, 9003)).items() == []


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ports.json"
    book = PortBook(path, RANGE, clock=lambda: T0)
    book.record("local|a", 9000)
    book.save()
    before = path.read_bytes()
    assert json.loads(before) == {
        "version": 1,
        "ports": {"local|a": 9000},
        "last_seen": {"local|a": "2024-05-01T12:00:00Z"},
    }
    assert os.listdir(tmp_path) == ["ports.json"]  # no temp file left behind

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    book.record("local|b", 9001)
    monkeypatch.setattr(ports_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        book.save()
    assert path.read_bytes() == before  # the old file is intact
    assert os.listdir(tmp_path) == ["ports.json"]  # and the temp file was removed
    monkeypatch.undo()
    book.save()
    assert PortBook(path, RANGE).items() == [("local|a", 9000), ("local|b", 9001)]


def test_save_without_a_path_does_nothing(tmp_path: Path) -> None:
    book = PortBook(None, RANGE)
    book.record("local|a", 9000)
    book.save()
    assert book.problems == []


def test_entries_are_capped_dropping_the_least_recently_used(tmp_path: Path) -> None:
    wide = PortRange(1024, 65535)
    book = PortBook(tmp_path / "ports.json", wide)
    for i in range(MAX_ENTRIES):
        book.record(f"local|app{i}", 1024 + i)
    book.record("local|app0", 1024)  # used again: now the most recent
    for i in range(MAX_ENTRIES, MAX_ENTRIES + 3):
        book.record(f"local|app{i}", 1024 + i)
    keys = [k for k, _ in book.items()]
    assert len(keys) == MAX_ENTRIES
    assert "local|app0" in keys
    assert {"local|app1", "local|app2", "local|app3"}.isdisjoint(keys)
    book.save()
    assert len(PortBook(tmp_path / "ports.json", wide).items()) == MAX_ENTRIES


async def test_vm_ports_skip_a_port_held_by_another_program(tmp_path: Path) -> None:
    low, mid, high = free_port_range(3)
    book = PortBook(tmp_path / "ports.json", PortRange(low, high))
    vm_ports = VmPorts(book, "127.0.0.1")
    with socket.socket() as squatter, capture_logs() as logs, trio.fail_after(10):
        squatter.bind(("127.0.0.1", low))
        squatter.listen()
        opened = await vm_ports.open_for("local|a")
        second = await vm_ports.open_for("local|b")
        assert opened is not None
        assert second is not None
        # (Exactly mid and high unless another program grabbed one of them meanwhile.)
        assert opened[1] == mid
        assert second[1] == high
        assert await vm_ports.open_for("local|c") is None  # the range is used up
        for listener, port in (opened, second):
            await listener.aclose()
            vm_ports.release(port)
        skipped = [e for e in logs if e["event"] == "debugger.port_skipped"]
        assert skipped[0]["port"] == low
        assert skipped[0]["reason"] == "in use by another program"
        assert skipped[-1]["log_level"] == "error"
        assert skipped[-1]["key"] == "local|c"
    assert PortBook(tmp_path / "ports.json", PortRange(low, high)).items() == [
        ("local|a", mid),
        ("local|b", high),
    ]


async def test_vm_ports_saver_writes_a_burst_once_and_flushes_at_stop(tmp_path: Path) -> None:
    ports = free_port_range(20)
    book = PortBook(tmp_path / "ports.json", PortRange(ports[0], ports[-1]))
    writes: list[str] = []
    real_write = book.write

    def counting_write(data: str) -> None:
        writes.append(data)
        real_write(data)

    book.write = counting_write  # type: ignore[method-assign]
    vm_ports = VmPorts(book, "127.0.0.1")
    opened = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(vm_ports.run_saver, 0.2)
            await trio.testing.wait_all_tasks_blocked()
            for i in range(10):  # ten VMs opening together: none waits for a write
                got = await vm_ports.open_for(f"local|a{i}")
                assert got is not None
                opened.append(got)
            assert writes == []
            await trio.sleep(0.5)
            assert len(writes) == 1  # one write for the ten
            got = await vm_ports.open_for("local|late")
            assert got is not None
            opened.append(got)
            nursery.cancel_scope.cancel()  # the daemon stops before the delay is over
        assert len(writes) == 2  # ... and what changed is written all the same
        for listener, port in opened:
            await listener.aclose()
            vm_ports.release(port)
    saved = dict(PortBook(tmp_path / "ports.json", PortRange(ports[0], ports[-1])).items())
    assert set(saved) == {f"local|a{i}" for i in range(10)} | {"local|late"}


# ------------------------------------------------------------------------------ last seen, expiry


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def seen(book: PortBook) -> dict[str, float]:
    return {e.key: e.last_seen for e in book.entries()}


def test_old_format_file_counts_as_seen_when_loaded(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    path.write_text(json.dumps({"version": 1, "ports": {"local|a": 9000, "emu|b": 9001}}))
    clock = Clock(T0 + 5 * DAY)
    book = PortBook(path, RANGE, clock=clock)
    assert book.problems == []
    assert seen(book) == {"local|a": T0 + 5 * DAY, "emu|b": T0 + 5 * DAY}
    clock.now += 29 * DAY
    assert book.expire(30 * DAY) == []
    clock.now += 2 * DAY
    assert [e.key for e in book.expire(30 * DAY)] == ["local|a", "emu|b"]
    assert book.items() == []


def test_last_seen_is_saved_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    clock = Clock()
    book = PortBook(path, RANGE, clock=clock)
    book.record("local|a", 9000)
    clock.now += 3 * DAY
    book.record("emu|b", 9001)
    book.save()
    data = json.loads(path.read_text())
    assert data["last_seen"] == {"local|a": "2024-05-01T12:00:00Z", "emu|b": "2024-05-04T12:00:00Z"}
    clock.now += 100 * DAY  # the load time does not matter for entries that have a time
    assert seen(PortBook(path, RANGE, clock=clock)) == {"local|a": T0, "emu|b": T0 + 3 * DAY}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-05-01T12:00:00Z", T0),
        ("2024-05-01T14:00:00+02:00", T0),
        (T0 - DAY, T0 - DAY),  # epoch seconds are read too
        (int(T0), T0),
        ("2024-05-01T12:00:00", None),  # no zone: unknown
        ("yesterday", None),
        (True, None),
        (None, None),
        (1e300, None),
        ([1], None),
    ],
)
def test_unreadable_times_count_as_seen_when_loaded(
    tmp_path: Path, value: object, expected: float | None
) -> None:
    path = tmp_path / "ports.json"
    path.write_text(
        json.dumps({"version": 1, "ports": {"local|a": 9000}, "last_seen": {"local|a": value}})
    )
    book = PortBook(path, RANGE, clock=Clock(T0 + 10 * DAY))
    assert book.problems == []
    assert seen(book) == {"local|a": T0 + 10 * DAY if expected is None else expected}


def test_a_bad_last_seen_object_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "ports.json"
    path.write_text(json.dumps({"version": 1, "ports": {"local|a": 9000}, "last_seen": [1]}))
    book = PortBook(path, RANGE, clock=Clock(T0))
    assert book.items() == [("local|a", 9000)]
    assert seen(book) == {"local|a": T0}


def test_expire_drops_only_entries_older_than_the_limit() -> None:
    clock = Clock()
    book = PortBook(None, RANGE, clock=clock)
    book.record("local|old", 9000)
    clock.now += 10 * DAY
    book.record("local|newer", 9001)
    clock.now += 10 * DAY
    book.record("local|connected", 9002)
    clock.now += 21 * DAY  # old: 41 days, newer: 31, connected: 21 (but connected now)
    dropped = book.expire(30 * DAY, keep={"local|old"})
    assert [(e.key, e.port, e.last_seen) for e in dropped] == [("local|newer", 9001, T0 + 10 * DAY)]
    assert [k for k, _ in book.items()] == ["local|old", "local|connected"]
    # "connected" is exactly 30 days old now: not more than the limit, kept.
    clock.now = T0 + 20 * DAY + 30 * DAY
    assert [e.key for e in book.expire(30 * DAY)] == ["local|old"]
    assert [k for k, _ in book.items()] == ["local|connected"]
    with pytest.raises(ValueError, match="positive"):
        book.expire(0)


def test_touch_and_sweep_keep_connected_apps() -> None:
    clock = Clock()
    book = PortBook(None, RANGE, clock=clock)
    book.record("local|a", 9000)
    book.record("local|b", 9001)
    clock.now += 40 * DAY
    dropped = book.sweep(30 * DAY, connected=["local|a", "local|unknown"])
    assert [e.key for e in dropped] == ["local|b"]
    assert seen(book) == {"local|a": T0 + 40 * DAY}  # seen now; unknown keys are not added
    book.touch(["local|a"])
    assert book.items() == [("local|a", 9000)]


def test_forget_and_resolve() -> None:
    book = PortBook(None, RANGE, clock=Clock())
    book.record("emulator-5554|com.example.mail", 9000)
    book.record("R58M|com.example.mail", 9001)
    book.record("local|com.example.other", 9002)
    assert book.resolve("com.example.other").key == "local|com.example.other"
    assert book.resolve("R58M|com.example.mail").port == 9001  # the whole key
    assert book.resolve("com.example.mail", device="emulator-5554").port == 9000
    with pytest.raises(TargetError) as err:
        book.resolve("com.example.mail")
    assert err.value.ambiguous
    assert err.value.candidates == (
        "emulator-5554|com.example.mail (port 9000)",
        "R58M|com.example.mail (port 9001)",
    )
    with pytest.raises(TargetError) as err:
        book.resolve("mail")  # no guessing for a removal: names are exact
    assert not err.value.ambiguous
    assert err.value.message == "no remembered debugger port for 'mail'"
    assert len(err.value.candidates) == 3
    with pytest.raises(TargetError, match="on device R58M"):
        book.resolve("com.example.other", device="R58M")
    forgotten = book.forget("local|com.example.other")
    assert forgotten is not None
    assert forgotten.port == 9002
    assert book.forget("local|com.example.other") is None
    assert [k for k, _ in book.items()] == [
        "emulator-5554|com.example.mail",
        "R58M|com.example.mail",
    ]


def test_entry_json() -> None:
    book = PortBook(None, RANGE, clock=Clock())
    book.record("emulator-5554|com.example.mail", 9000)
    (entry,) = book.entries()
    assert entry.to_json(in_use=True, vm="emulator-5554/1234") == {
        "key": "emulator-5554|com.example.mail",
        "device": "emulator-5554",
        "app": "com.example.mail",
        "port": 9000,
        "last_seen": "2024-05-01T12:00:00Z",
        "in_use": True,
        "vm": "emulator-5554/1234",
    }


# ------------------------------------------------------------------------------ the daily clean-up


class FakeOwner:
    """Stands in for VmPorts: the book, and a count of saves."""

    def __init__(self, book: PortBook) -> None:
        self.book = book
        self.saves = 0

    async def save(self) -> None:
        await trio.lowlevel.checkpoint()
        self.saves += 1


async def test_forget_old_ports_runs_once_a_day(autojump_clock: trio.testing.MockClock) -> None:
    # The book's wall clock moves with trio's virtual clock: no real waiting.
    book = PortBook(None, RANGE, clock=lambda: T0 + trio.current_time())
    book.record("emu|com.example.gone", 9000)
    book.record("emu|com.example.running", 9001)
    owner = FakeOwner(book)
    running = FakeVm.android("emu/1", app="com.example.running", package="com.example.running")
    registry = make_registry(running)
    with capture_logs() as logs, trio.fail_after(100 * DAY):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forget_old_ports, owner, registry, 30 * DAY)
            await trio.sleep(29.5 * DAY)
            assert [k for k, _ in book.items()] == [
                "emu|com.example.gone",
                "emu|com.example.running",
            ]
            await trio.sleep(DAY)  # the sweep after day 30 finds "gone" 30 days old: kept
            assert len(book.items()) == 2
            await trio.sleep(DAY)  # day 31: dropped; the running app is kept and was seen
            assert book.items() == [("emu|com.example.running", 9001)]
            assert book.entries()[0].last_seen == T0 + 31 * DAY
            nursery.cancel_scope.cancel()
    assert owner.saves == 31  # every sweep saw a connected app: its time was saved
    (forgotten,) = [e for e in logs if e["event"] == "ports.forgotten"]
    assert forgotten["key"] == "emu|com.example.gone"
    assert forgotten["port"] == 9000
    assert forgotten["last_seen"] == "2024-05-01T12:00:00Z"


async def test_forget_old_ports_saves_at_once_after_dropping_at_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = FakeOwner(PortBook(None, RANGE))
    with trio.move_on_after(1):
        await forget_old_ports(owner, make_registry(), 30 * DAY, True)
    assert owner.saves == 1


# ------------------------------------------------------------------------------ the config key


def test_forget_after_days_default_and_value() -> None:
    assert parse_config({}, source="t", env={}).debugger.forget_after_days == 30
    data = {"debugger": {"forget_after_days": 7}}
    assert parse_config(data, source="t", env={}).debugger.forget_after_days == 7


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be >= 1"),
        (-3, "must be >= 1"),
        (1.5, "expected an integer, got a float"),
        ("30", "expected an integer, got a string"),
        (True, "expected an integer, got a boolean"),
    ],
)
def test_forget_after_days_must_be_a_positive_integer(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"debugger": {"forget_after_days": value}}, source="cfg.toml", env={})
    assert err.value.key == "debugger.forget_after_days"
    assert message in str(err.value)
    assert str(err.value).startswith("cfg.toml: [debugger] forget_after_days = ")
