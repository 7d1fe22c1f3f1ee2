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
from structlog.testing import capture_logs

from ddmd import ports as ports_module
from ddmd.config import PortRange
from ddmd.listeners import VmPorts
from ddmd.ports import MAX_ENTRIES, PortBook, vm_key
from tests.actors.rawpeers import free_port_range

RANGE = PortRange(9000, 9009)


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
    book = PortBook(path, RANGE)
    book.record("local|a", 9000)
    book.save()
    before = path.read_bytes()
    assert json.loads(before) == {"version": 1, "ports": {"local|a": 9000}}
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
