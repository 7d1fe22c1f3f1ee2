"""Issue 20, friction 11: a DDM client that is not a VM (`ddmd sysmon`) is no VM in the CLI: no
debugger port, never current, no kill, no heap dump, no allocation tracker, and no sentence about
Android 12; `ddmd sysmon --show` prints the figures the daemon has from it. The daemon is a small
fake speaking the routes the commands use."""

from __future__ import annotations

import json
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ddmd.cli import client as cli_client
from ddmd.cli.format import format_clients
from ddmd.cli.profiling import allocs, hprof, kill
from ddmd.sysmon.cli import format_figures, sysmon_command

MONITOR_ID = "tcp:8003"
LATEST = {
    "timestamp_ms": 1_700_000_000_000,
    "load": [0.52, 0.61, 0.7],
    "mem_total_kib": 16 * 1024 * 1024,
    "mem_available_kib": 9 * 1024 * 1024,
    "mem_free_kib": 2 * 1024 * 1024,
    "swap_total_kib": 2 * 1024 * 1024,
    "swap_free_kib": 1024 * 1024,
    "mem_used_share": 0.4375,
    "cpu_period_ms": 1000,
    "cpu_busy": [0.12, 0.034, None],
}
PUBLISHED = {
    "kind": "system monitor",
    "latest": LATEST,
    "history": [[1_700_000_000_000, 0.52, 0.4375]],
}


def _vm(vm_id: str, name: str, pid: int, **fields: Any) -> dict[str, Any]:
    base = {"id": vm_id, "name": name, "app": name, "pid": pid, "device": None, "ddm": True}
    return {**base, "missing": {}, **fields}


MONITOR = _vm(
    MONITOR_ID,
    "system monitor",
    8648,
    package="ddmd.sysmon",
    vm_ident="ddmd.client 0.1.0",
    debugger_port=8603,
    current=True,
    features=["SMON"],
)
MAIL = _vm("tcp:8000", "com.example.mail", 3101, vm_ident="Dalvik v2.1.0", debugger_port=8601)


class FakeDaemon:
    def __init__(self, monitors: bool = True) -> None:
        self.vms = {MAIL["id"]: MAIL, **({MONITOR_ID: MONITOR} if monitors else {})}
        self.calls: list[str] = []

    def kind(self, vm: dict[str, Any]) -> str:
        return "system monitor" if vm["id"] == MONITOR_ID else "VM"

    async def listed(self, request: Request) -> Response:
        self.calls.append(f"{request.method} {request.url.path}")
        return JSONResponse([{**vm, "kind": self.kind(vm)} for vm in self.vms.values()])

    async def one(self, request: Request) -> Response:
        self.calls.append(f"{request.method} {request.url.path}")
        rest = request.path_params["rest"]
        for vm_id, vm in self.vms.items():
            if rest == vm_id or rest == vm["name"] or rest.startswith(vm_id + "/"):
                suffix = rest.removeprefix(vm_id)
                if suffix == "/ext":
                    ext = {"sysmon": PUBLISHED} if vm_id == MONITOR_ID else {}
                    return JSONResponse({"vm": vm_id, "ext": ext})
                if suffix == "":
                    return JSONResponse({"vm": vm, "threads": None})  # no "kind", as the API
                return JSONResponse({"error": f"not in this fake: {suffix}"}, status_code=500)
        return JSONResponse(
            {"error": f"no VM matches {rest!r}", "target": rest, "candidates": []},
            status_code=404,
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/v1/vms", self.listed, methods=["GET"]),
                Route("/api/v1/vms/{rest:path}", self.one, methods=["GET", "POST"]),
            ]
        )


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)


def serve(monkeypatch, fake: FakeDaemon) -> FakeDaemon:
    app = fake.app()
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))
    return fake


def invoke(command: click.Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def test_clients_gives_a_monitor_no_port_and_never_marks_it_current():
    lines = format_clients([{**MAIL, "kind": "VM"}, {**MONITOR, "kind": "system monitor"}])
    lines = lines.splitlines()
    header = lines[0].split()
    assert header[-3:] == ["DEBUGGER", "CURRENT", "KIND"]
    monitor = lines[2]
    assert monitor.startswith(MONITOR_ID)
    assert "8603" not in monitor  # the daemon's port for it is not offered to debuggers
    assert "*" not in monitor
    assert monitor.rstrip().endswith("system monitor")
    assert "8601" in lines[1]


def test_show_prints_the_figures(monkeypatch):
    serve(monkeypatch, FakeDaemon())
    result = invoke(sysmon_command, "--show")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"system monitor ({MONITOR_ID}, pid 8648), report at ")
    assert lines[1] == "  load average  0.52 / 0.61 / 0.70 (1 / 5 / 15 min)"
    assert lines[2] == "  memory        44 % used of 16.0 GiB, 9.0 GiB available"
    assert lines[3] == "  swap          50 % used of 2.0 GiB"
    assert lines[4] == "  CPUs          12% 3% ? (busy over 1 s)"


def test_show_json_has_iso_times_and_the_history(monkeypatch):
    serve(monkeypatch, FakeDaemon())
    result = invoke(sysmon_command, "--show", "--json")
    assert result.exit_code == 0, result.output
    (monitor,) = json.loads(result.stdout)
    assert monitor["id"] == MONITOR_ID
    assert monitor["latest"]["timestamp"] == "2023-11-14T22:13:20.000000Z"
    assert monitor["history"] == PUBLISHED["history"]


def test_show_without_a_monitor_says_how_to_start_one(monkeypatch):
    serve(monkeypatch, FakeDaemon(monitors=False))
    result = invoke(sysmon_command, "--show")
    assert result.exit_code == 1
    assert "the daemon knows no system monitor: start one with 'ddmd sysmon'" in result.stderr


def test_format_figures_before_the_first_report():
    assert (
        format_figures(MONITOR, None) == f"system monitor ({MONITOR_ID}, pid 8648): no report yet"
    )


@pytest.mark.parametrize(
    ("command", "args", "words"),
    [
        (kill, ("--yes",), "ddmd does not stop it (stop it where it runs)"),
        (hprof, (), "it has no heap to dump"),
        (allocs, ("--start",), "it has no allocations to track"),
    ],
)
def test_kill_hprof_and_allocs_refuse_a_monitor_in_its_own_words(monkeypatch, command, args, words):
    fake = serve(monkeypatch, FakeDaemon())
    result = invoke(command, MONITOR_ID, *args)
    assert result.exit_code == 1
    assert result.stderr == f"ddmd {command.name}: the system monitor is not a VM: {words}\n"
    assert "Android" not in result.stderr
    assert [c for c in fake.calls if c.startswith("POST")] == []
