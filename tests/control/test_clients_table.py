"""Issue 20, friction 9: `ddmd clients` -- rows sorted, a short VM cell, debuggers by their tool
and pid (never an ephemeral port), `ports` saying "connected now", and ddmd's internal keys
(``local|com.example.mail``) never shown."""

from __future__ import annotations

from typing import Any

from ddmd.cli.format import format_clients, format_event, format_ports
from ddmd.cli.words import debugger_words, short_vm_name

HOTSPOT = (
    "Java Debug Wire Protocol (Reference Implementation) version 17.0\n"
    "JVM Debug Interface version 17.0\n"
    "JVM version 17.0.15 (OpenJDK 64-Bit Server VM, mixed mode, sharing)"
)


def vm(vm_id: str, name: str, pid: int, **fields: Any) -> dict[str, Any]:
    return {
        "id": vm_id,
        "name": name,
        "app": name,
        "pid": pid,
        "ddm": True,
        "device": None,
        "debugger_port": 8600 + pid % 100,
        "debuggers": [],
        **fields,
    }


def rows(text: str) -> list[str]:
    """The table's rows (after the header, up to the first blank line)."""
    lines = text.split("\n\n")[0].splitlines()
    return lines[1:]


def test_rows_are_sorted_local_first_then_by_device_name_and_pid():
    listed = [
        vm("emulator-5554/300", "com.example.notes", 300, device="emulator-5554"),
        vm("tcp:8002", "Worker", 4243, ddm=False, description=HOTSPOT),
        vm("R58M/200", "com.example.mail", 200, device="R58M"),
        vm("tcp:8001", "com.example.mail", 4102),
        vm("tcp:8000", "com.example.mail", 4101),
        vm("emulator-5554/100", "com.example.mail", 100, device="emulator-5554"),
    ]
    ids = [row.split()[0] for row in rows(format_clients(listed))]
    assert ids == [
        "tcp:8000",
        "tcp:8001",
        "tcp:8002",
        "R58M/200",
        "emulator-5554/100",
        "emulator-5554/300",
    ]
    # The same whatever order the daemon listed them in.
    assert format_clients(listed[::-1]) == format_clients(listed)


def test_the_vm_cell_is_short():
    assert short_vm_name({"description": HOTSPOT}) == "OpenJDK 17.0.15"
    hotspot = HOTSPOT.replace("OpenJDK", "Java HotSpot(TM)")
    assert short_vm_name({"description": hotspot}) == "HotSpot 17.0.15"
    assert short_vm_name({"vm_ident": "Dalvik v2.1.0"}) == "ART"
    assert short_vm_name({"vm_ident": "Dalvik v1.6.0"}) == "Dalvik"
    assert short_vm_name({"vm_ident": "ddmd.client 0.1.0"}) == "ddmd.client 0.1.0"
    text = format_clients([vm("tcp:8002", "Worker", 4243, ddm=False, description=HOTSPOT)])
    assert text.splitlines()[1].split()[3:5] == ["OpenJDK", "17.0.15"]
    assert "Debug Wire Protocol" not in text
    assert "JVM version 17.0.15" in format_clients(
        [vm("tcp:8002", "Worker", 4243, description=HOTSPOT)], verbose=True
    )


def _debugger(**fields: Any) -> dict[str, Any]:
    return {
        "peer": "127.0.0.1:54321",
        "via": "vm-port",
        "port": 8601,
        "since": 1_700_000_000.0,
        "packets_in": 12,
        "packets_out": 30,
        "suspensions": 0,
        "debugging": True,
        **fields,
    }


def test_a_debugger_shows_as_its_tool_and_pid_not_its_port():
    assert debugger_words(_debugger(tool="jdb", pid=1234)) == "jdb pid 1234"
    # The daemon's snapshot names the tool; a pid is added when the snapshot has one.
    assert debugger_words(_debugger(tool="jdb")) == "jdb"
    assert debugger_words(_debugger(tool=None)) == "unnamed debugger"
    assert debugger_words(_debugger(tool="Android Studio", debugging=False)) == (
        "Android Studio (DDM only)"
    )
    attached = [_debugger(tool="jdb", pid=1234), _debugger(tool="Android Studio", via="current")]
    text = format_clients(
        [vm("tcp:8001", "com.example.mail", 4101, debuggers=attached, debugger="127.0.0.1:54321")]
    )
    assert "jdb pid 1234, Android Studio" in text.splitlines()[1]
    assert "54321" not in text
    table = text.split("debuggers attached:\n")[1].splitlines()
    assert table[0].split()[:2] == ["VM", "DEBUGGER"]
    assert table[1].split()[:4] == ["tcp:8001", "jdb", "pid", "1234"]


def test_ports_says_connected_now_for_a_connected_app():
    now = 1_714_600_000.0
    body = {
        "path": "/x/ports.json",
        "ports": [
            {
                "key": "local|com.example.mail",
                "app": "com.example.mail",
                "device": "local",
                "port": 8601,
                "last_seen": "2024-05-01T21:46:40Z",
                "in_use": True,
                "vm": "tcp:8000",
            },
            {
                "key": "R58M|com.example.old",
                "app": "com.example.old",
                "device": "R58M",
                "port": 8602,
                "last_seen": "2024-05-01T21:45:40Z",
                "in_use": False,
            },
        ],
    }
    text = format_ports(body, now=now)
    mail, old = text.splitlines()[2:]
    assert "connected now" in mail
    assert "min ago" not in mail
    assert "(1 min ago)" in old
    # ddmd's own keys for the port book are never shown.
    assert "|" not in text


def test_internal_keys_are_never_shown():
    listed = [vm("tcp:8000", "com.example.mail", 4101, current=True)]
    assert "|" not in format_clients(listed)
    event = {
        "event": "debugger.listening",
        "ts": "2026-11-26T12:00:00.000000Z",
        "vm": "tcp:8000",
        "port": 8601,
        "key": "local|com.example.mail",
        "selected": "local|com.example.mail",
    }
    line = format_event(event)
    assert "8601" in line
    assert "local|com.example.mail" not in line


def test_verbose_shows_what_foresight_answered_per_vm():
    figures = {
        "on": True,
        "round_trip": 0.0231,
        "answered_cache": 12,
        "answered_speculation": 122,
        "speculated": 170,
        "wasted": 40,
    }
    listed = [vm("tcp:8000", "Prog", 10, ddm=False, foresight=figures), vm("adb:x", "a", 11)]
    text = format_clients(listed, verbose=True)
    assert "foresight (answered by ddmd):" in text
    (line,) = [row for row in text.splitlines() if row.startswith("tcp:8000") and "ms" in row]
    assert line.split() == ["tcp:8000", "on", "23.10", "ms", "12", "122", "170", "40"]
    assert "foresight" not in format_clients(listed)  # only with -v
