"""The port book over the control API (GET /api/v1/ports, DELETE /api/v1/ports/{app}) and
`ddmd ports`, through the daemon and, when none answers, on the state file itself."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from starlette.applications import Starlette

from ddmd.cli import client as cli_client
from ddmd.cli.client import EXIT_API_ERROR, EXIT_TARGET
from ddmd.cli.format import format_ports
from ddmd.cli.ports import ports
from ddmd.config import ControlConfig, PortRange
from ddmd.control.app import create_app
from ddmd.control.safety import control_middleware
from ddmd.drive.ports import VmPorts
from ddmd.portbook import PortBook

from .fakes import FakeVm, make_registry, standard_vms

T0 = 1_714_564_800.0  # 2024-05-01T12:00:00Z
DAY = 86400.0
RANGE = PortRange(8600, 8699)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_book(path: Path | None, clock: Clock | None = None) -> PortBook:
    """Four apps: one connected by its key (emulator-5554/1234, com.example.app, port 8600),
    one whose VM uses its port (R58M/1234 on 8602), two gone; "com.example.gone" on two
    devices."""
    clock = clock or Clock()
    book = PortBook(path, RANGE, clock=clock)
    book.record("emulator-5554|com.example.app", 8600)
    book.record("R58M|org.other.old-name", 8602)
    clock.now += DAY
    book.record("emulator-5554|com.example.gone", 8610)
    book.record("R58M|com.example.gone", 8611)
    clock.now += 2 * DAY
    return book


@pytest.fixture
def vms() -> dict[str, FakeVm]:
    return standard_vms()


@pytest.fixture
def book(tmp_path: Path) -> PortBook:
    return make_book(tmp_path / "state" / "ports.json")


def app_for(vms: dict[str, FakeVm], book: PortBook, **kw: Any) -> Starlette:
    return create_app(make_registry(*vms.values()), ports=VmPorts(book, "127.0.0.1"), **kw)


@pytest.fixture
async def client(vms, book) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app_for(vms, book))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        yield c


def saved(book: PortBook) -> dict[str, int]:
    assert book.path is not None
    return dict(json.loads(book.path.read_text())["ports"])


# ------------------------------------------------------------------------------ the API


async def test_list(client, book):
    r = await client.get("/api/v1/ports")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["path"] == str(book.path)
    by_key = {e["key"]: e for e in body["ports"]}
    assert list(by_key) == [
        "emulator-5554|com.example.app",
        "R58M|org.other.old-name",
        "emulator-5554|com.example.gone",
        "R58M|com.example.gone",
    ]
    assert by_key["emulator-5554|com.example.app"] == {
        "key": "emulator-5554|com.example.app",
        "device": "emulator-5554",
        "app": "com.example.app",
        "port": 8600,
        "last_seen": "2024-05-01T12:00:00Z",
        "in_use": True,
        "vm": "emulator-5554/1234",
    }
    # Its VM was renamed since it got the port: still in use, found by the port.
    assert by_key["R58M|org.other.old-name"]["vm"] == "R58M/1234"
    assert by_key["R58M|com.example.gone"]["in_use"] is False
    assert by_key["R58M|com.example.gone"]["vm"] is None
    assert by_key["R58M|com.example.gone"]["last_seen"] == "2024-05-02T12:00:00Z"


async def test_without_a_port_book_the_routes_say_so():
    app = create_app(make_registry(FakeVm.android()))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        r = await c.get("/api/v1/ports")
        assert r.status_code == 501
        assert "port book" in r.json()["error"]
        r = await c.delete("/api/v1/ports/x")
        assert r.status_code == 501


async def test_forget(client, book):
    r = await client.delete("/api/v1/ports/com.example.gone", params={"device": "R58M"})
    assert r.status_code == 200, r.text
    assert r.json()["forgotten"]["key"] == "R58M|com.example.gone"
    assert r.json()["forgotten"]["port"] == 8611
    assert book.entry("R58M|com.example.gone") is None
    assert "R58M|com.example.gone" not in saved(book)  # written to the state file
    assert "emulator-5554|com.example.gone" in saved(book)


async def test_forget_by_whole_key(client, book):
    r = await client.delete("/api/v1/ports/emulator-5554%7Ccom.example.gone")
    assert r.status_code == 200, r.text
    assert book.entry("emulator-5554|com.example.gone") is None


async def test_forget_ambiguous_409_lists_the_entries(client, book):
    r = await client.delete("/api/v1/ports/com.example.gone")
    assert r.status_code == 409
    body = r.json()
    assert body["app"] == "com.example.gone"
    assert body["candidates"] == [
        "emulator-5554|com.example.gone (port 8610)",
        "R58M|com.example.gone (port 8611)",
    ]
    assert len(book.entries()) == 4


async def test_forget_unknown_404(client, book):
    r = await client.delete("/api/v1/ports/gone")  # names are exact for a removal
    assert r.status_code == 404
    body = r.json()
    assert body["error"] == "no remembered debugger port for 'gone'"
    assert len(body["candidates"]) == 4


@pytest.mark.parametrize("app", ["com.example.app", "R58M|org.other.old-name"])
async def test_forget_refused_while_connected(client, book, app):
    r = await client.delete(f"/api/v1/ports/{app}")
    assert r.status_code == 409
    body = r.json()
    assert "is connected now as VM" in body["error"]
    assert "candidates" not in body
    assert len(book.entries()) == 4
    assert book.path is not None
    assert not book.path.exists()  # nothing was written


async def test_forget_needs_delete(client):
    r = await client.get("/api/v1/ports/com.example.gone")
    assert r.status_code == 405
    r = await client.post("/api/v1/ports/com.example.gone")
    assert r.status_code == 405


# ------------------------------------------------------------------------------ safety rules


def safe_client(vms, book, token: str = "") -> httpx.AsyncClient:
    middleware = control_middleware(ControlConfig(host="127.0.0.1", port=8710, token=token))
    app = app_for(vms, book, middleware=middleware)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1:8710",
    )


GONE = "/api/v1/ports/emulator-5554%7Ccom.example.gone"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": "http://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}, 403),
        ({"Host": "rebound.example:8710"}, 421),
    ],
)
async def test_delete_from_another_site_is_refused(vms, book, headers, status):
    async with safe_client(vms, book) as c:
        r = await c.delete(GONE, headers=headers)
        assert r.status_code == status
        assert book.entry("emulator-5554|com.example.gone") is not None
        r = await c.delete(GONE, headers={"Origin": "http://127.0.0.1:8710"})  # its own page
        assert r.status_code == 200, r.text


async def test_delete_needs_the_token(vms, book):
    async with safe_client(vms, book, token="s3cret") as c:
        r = await c.delete(GONE)
        assert r.status_code == 401
        r = await c.delete(GONE, params={"token": "s3cret"})  # ?token= only logs in a GET
        assert r.status_code == 401
        assert book.entry("emulator-5554|com.example.gone") is not None
        r = await c.get("/api/v1/ports", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        r = await c.delete(GONE, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200


# ------------------------------------------------------------------------------ ddmd ports


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("HOME", str(tmp_path))


def invoke(command: click.Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


@pytest.fixture
def daemon(monkeypatch, vms, book) -> PortBook:
    app = app_for(vms, book)
    monkeypatch.setattr(
        cli_client,
        "make_transport",
        lambda: httpx.ASGITransport(app=app),
    )
    return book


def test_cli_lists_through_the_daemon(daemon, monkeypatch):
    monkeypatch.setattr(cli_client.time, "time", lambda: T0 + 3 * DAY + 60)
    result = invoke(ports)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"debugger ports remembered in {daemon.path}:"
    assert lines[1].split() == ["APP", "DEVICE", "PORT", "LAST", "SEEN", "IN", "USE"]
    assert [line.split()[:3] for line in lines[2:]] == [
        ["com.example.app", "emulator-5554", "8600"],
        ["org.other.old-name", "R58M", "8602"],
        ["com.example.gone", "emulator-5554", "8610"],
        ["com.example.gone", "R58M", "8611"],
    ]
    # Connected now: when it was last seen says nothing.
    assert lines[2].split()[3:] == ["connected", "now", "yes", "(emulator-5554/1234)"]
    assert lines[5].endswith("2024-05-02T12:00:00Z (2 days ago)  no")


def test_cli_json_and_device_filter(daemon):
    result = invoke(ports, "--json", "--device", "R58M")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert [e["key"] for e in body["ports"]] == ["R58M|org.other.old-name", "R58M|com.example.gone"]
    assert body["path"] == str(daemon.path)


def test_cli_forget_through_the_daemon(daemon):
    result = invoke(ports, "--forget", "com.example.gone", "--device", "emulator-5554")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "forgot debugger port 8610 of com.example.gone (emulator-5554); "
        "the app gets a port again when its VM is next seen\n"
    )
    assert "emulator-5554|com.example.gone" not in saved(daemon)


def test_cli_forget_refused_while_connected(daemon):
    result = invoke(ports, "--forget", "com.example.app")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr == (
        "ddmd ports: com.example.app (emulator-5554) is connected now as VM emulator-5554/1234 "
        "and uses port 8600; it can be forgotten once its VM is gone\n"
    )
    assert daemon.entry("emulator-5554|com.example.app") is not None


def test_cli_forget_ambiguous_lists_one_per_line(daemon):
    result = invoke(ports, "--forget", "com.example.gone")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.splitlines() == [
        "ddmd ports: 'com.example.gone' has remembered ports on several devices; give --device "
        "SERIAL or the whole DEVICE|NAME key:",
        "  emulator-5554|com.example.gone (port 8610)",
        "  R58M|com.example.gone (port 8611)",
    ]


# ------------------------------------------------------------------------------ without a daemon


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def offline(tmp_path: Path) -> tuple[list[str], Path]:
    """Options that reach no daemon, and the state file the config names."""
    state = tmp_path / "state.json"
    config = tmp_path / "config.toml"
    config.write_text(f'[debugger]\nstate_file = "{state}"\n')
    return ["--config", str(config), "--control", f"127.0.0.1:{closed_port()}"], state


def test_cli_reads_an_old_format_file_without_a_daemon(offline):
    options, state = offline
    state.write_text(json.dumps({"version": 1, "ports": {"local|com.example.a": 8600}}))
    result = invoke(ports, *options)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"debugger ports remembered in {state} (no daemon answers at ")
    assert lines[0].endswith(": read from the file):")
    assert lines[2].split()[:3] == ["com.example.a", "local", "8600"]
    assert "(just now)" in lines[2]  # an entry without a time counts as seen when read
    assert lines[2].endswith("  no")
    assert json.loads(state.read_text()) == {"version": 1, "ports": {"local|com.example.a": 8600}}


def test_cli_json_without_a_daemon(offline):
    options, state = offline
    book = make_book(state)
    book.save()
    result = invoke(ports, *options, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["path"] == str(state)
    assert [e["key"] for e in body["ports"]] == [e.key for e in book.entries()]
    assert {e["in_use"] for e in body["ports"]} == {False}


def test_cli_forgets_in_the_file_without_a_daemon(offline):
    options, state = offline
    book = make_book(state)
    book.record("local|far.away", 9999)  # outside [debugger] ports: must survive the edit
    book.save()
    before = json.loads(state.read_text())
    result = invoke(ports, *options, "--forget", "com.example.gone", "--device", "R58M")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("forgot debugger port 8611 of com.example.gone (R58M)")
    after = json.loads(state.read_text())
    expected = {k: v for k, v in before["ports"].items() if k != "R58M|com.example.gone"}
    assert after["ports"] == expected
    assert after["last_seen"] == {k: before["last_seen"][k] for k in expected}
    assert sorted(os.listdir(state.parent)) == ["config.toml", "state.json"]  # no temp file


def test_cli_forget_without_a_daemon_unknown_or_ambiguous(offline):
    options, state = offline
    result = invoke(ports, *options, "--forget", "com.example.gone")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr == (
        "ddmd ports: no remembered debugger port for 'com.example.gone' "
        "(no debugger ports are remembered)\n"
    )
    make_book(state).save()
    result = invoke(ports, *options, "--forget", "com.example.gone")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.splitlines()[1:] == [
        "  emulator-5554|com.example.gone (port 8610)",
        "  R58M|com.example.gone (port 8611)",
    ]
    result = invoke(ports, *options, "--forget", "nope")
    assert result.exit_code == EXIT_TARGET
    first, *candidates = result.stderr.splitlines()
    assert first == "ddmd ports: no remembered debugger port for 'nope'; candidates:"
    assert len(candidates) == 4


def test_cli_reports_a_corrupt_file_without_a_daemon(offline):
    options, state = offline
    state.write_text("{not json")
    result = invoke(ports, *options)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"ddmd ports: ignoring corrupt state file {state}")
    assert result.stdout.rstrip().endswith(": none")
    assert state.read_text() == "{not json"  # listing never writes


def test_format_ports_empty():
    assert format_ports({"path": "/x/ports.json", "ports": []}) == (
        "debugger ports remembered in /x/ports.json: none"
    )
