"""The client commands, driven by click's CliRunner against the in-process app (transport seam)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import click
import httpx
import pytest
import trio
from click.testing import CliRunner, Result

from ddmd.cli import client as cli_client
from ddmd.cli.client import (
    EXIT_API_ERROR,
    EXIT_NO_DAEMON,
    EXIT_TARGET,
    clients,
    gc,
    heap,
    stack,
    threads,
)
from ddmd.cli.format import format_frame
from ddmd.cli.main import CLIENT_COMMANDS, main
from ddmd.cli.words import json_words
from ddmd.config import ControlConfig
from ddmd.control.app import create_app
from ddmd.control.safety import control_middleware
from ddmd.registry import ThreadSnapshot
from tests.contract import CLIENT_KEYS

from .fakes import FakeVm, make_registry, standard_vms


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Never read the developer's own ~/.config/ddmd/config.toml."""
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def vms() -> dict[str, FakeVm]:
    return standard_vms()


def route_to_app(monkeypatch, vms: dict[str, FakeVm], *, token: str = "") -> None:
    # With a token: the daemon's own check (control.safety), configured as `ddmd run` does.
    config = ControlConfig(host="127.0.0.1", port=8710, token=token)
    middleware = control_middleware(config) if token else ()
    app = create_app(make_registry(*vms.values()), middleware=middleware)
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))


@pytest.fixture
def api(monkeypatch, vms) -> dict[str, FakeVm]:
    route_to_app(monkeypatch, vms)
    return vms


def invoke(command: click.Command, *args: str) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api_json(vms: dict[str, FakeVm], method: str, path: str) -> object:
    """What the API itself answers, for comparing with --json."""

    async def main() -> object:
        app = create_app(make_registry(*vms.values()))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as c:
            return (await c.request(method, path)).json()

    return trio.run(main)


def test_commands_list():
    assert CLIENT_COMMANDS == (
        "clients",
        "devices",
        "threads",
        "heap",
        "gc",
        "select",
        "stack",
        "ports",
        "events",
        "extensions",
        "trace",
        "allocs",
        "hprof",
        "kill",
    )
    ctx = click.Context(main)
    for name in CLIENT_COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        assert command.name == name
        names = {p.name for p in command.params}
        assert {"config_file", "control", "device", "as_json"} <= names


# ------------------------------------------------------------------------------ clients


def test_clients_table(api):
    result = invoke(clients)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "PID",
        "APP/PACKAGE",
        "VM",
        "DDM",
        "WAIT",
        "THREADS",
        "PORT",
        "DEBUGGER",
        "CURRENT",
    ]
    assert len(lines) == 5
    # Columns are aligned: every header starts where its values start.
    col = lines[0].index("PID")
    assert all(line[col - 2 : col] == "  " for line in lines)
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert by_id["emulator-5554/1234"].rstrip().endswith("*")
    assert "com.example.app:remote [com.example.app]" in by_id["emulator-5554/2000"]
    # The three-line JDWP description shrinks to the JVM's short name.
    assert "  OpenJDK 17.0.9  " in by_id["tcp:8000"]
    assert "JVM version" not in result.stdout
    # A debugger is never shown by its ephemeral port.
    assert "51234" not in by_id["R58M/1234"]
    assert by_id["tcp:8000"].split()[1] == "4242"


def test_clients_json_is_the_api_json(api):
    result = invoke(clients, "--json")
    assert result.exit_code == 0
    body = json.loads(result.stdout)
    # The API's JSON, its times in ISO 8601 and heap-info reasons named.
    assert body == json_words(api_json(api, "GET", "/api/v1/vms"))
    assert set(body[0]) >= CLIENT_KEYS


def test_clients_device_filter(api):
    result = invoke(clients, "--json", "--device", "R58M")
    assert [vm["id"] for vm in json.loads(result.stdout)] == ["R58M/1234"]


def test_clients_none_known(monkeypatch):
    route_to_app(monkeypatch, {})
    result = invoke(clients)
    assert result.exit_code == 0
    assert result.stdout.strip() == "no VMs are known to the daemon"
    assert json.loads(invoke(clients, "--json").stdout) == []


# ------------------------------------------------------------------------------ threads


def test_threads_table(api):
    result = invoke(threads, "com.example.app:remote")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "threads of VM com.example.app:remote (emulator-5554/2000, pid 2000)"
    )
    assert lines[1].split() == [
        "ID", "TID", "STATE", "USER", "CPU", "SYSTEM", "CPU", "DAEMON", "NAME"
    ]  # fmt: skip
    # CPU times in seconds (THST's clock ticks, 1/100 s).
    assert lines[2].split() == ["1", "1234", "running", "0.52", "s", "0.07", "s", "main"]
    assert lines[3].split() == [
        "2", "1240", "wait", "0.03", "s", "0.01", "s", "daemon", "HeapTaskDaemon"
    ]  # fmt: skip
    assert lines[4].split()[-1] == "Binder:1234_1"
    assert api["remote"].refresh_count == 1


def test_threads_json(api):
    result = invoke(threads, "emulator-5554/1234", "--json")
    body = json.loads(result.stdout)
    assert body["supported"] is True
    assert [t["id"] for t in body["threads"]] == [1, 2, 9]


def test_threads_not_available(api):
    result = invoke(threads, "4242")
    assert result.exit_code == EXIT_API_ERROR  # not available: the exit-code table's 1
    assert "not available" in result.stdout


def test_threads_device_option(api):
    result = invoke(threads, "1234", "--device", "R58M", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vm"]["id"] == "R58M/1234"


def test_threads_watch_bounded(api):
    result = invoke(threads, "emulator-5554/1234", "--watch", "--interval", "0.01", "--count", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("threads of VM com.example.app (emulator-5554/1234") == 3
    assert api["app"].refresh_count == 3


def test_threads_watch_json_lines(api):
    result = invoke(
        threads, "emulator-5554/1234", "--watch", "--json", "--interval", "0.01", "--count", "2"
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["vm"]["id"] == "emulator-5554/1234" for line in lines)


def test_threads_watch_ctrl_c_exits_0(api, monkeypatch):
    async def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(trio, "sleep", interrupted)
    result = invoke(threads, "emulator-5554/1234", "--watch")
    assert result.exit_code == 0
    assert result.stdout.count("threads of VM") == 1


def test_threads_watch_stops_on_error(api):
    api["app"].failures["refresh_threads"] = RuntimeError("boom")
    result = invoke(threads, "emulator-5554/1234", "--watch", "--interval", "0.01")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr.startswith("ddmd threads: internal error (RuntimeError)")


# ------------------------------------------------------------------------------ heap


def test_heap_info_only(api):
    result = invoke(heap, "emulator-5554/1234")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["HEAP", "MAX", "SIZE", "ALLOCATED", "OBJECTS"]
    assert lines[2].split() == ["1", "64.0", "MiB", "10.0", "MiB", "5.5", "MiB", "12345"]
    assert "segments" not in result.stdout


def test_heap_segments(api):
    result = invoke(heap, "emulator-5554/1234", "--segments")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "heap 1 segments:" in out
    assert "USED" in out
    assert "FRAGMENTATION" not in out  # explained in words, the figure only with -v
    assert "2.1 KiB" in out  # 2168 B used
    assert "56 B" in out  # free
    assert "40 B" in out  # largest free region
    assert "free: 56 B in 2 runs between objects, the largest 40 B" in out
    # The kinds as the web page names them; units and runs only with -v.
    assert "used by kind: object 32 B, class object 8 B, byte[] / boolean[] 2.1 KiB" in out
    assert "units of" not in out
    assert api["app"].segment_requests == 1


def test_heap_segments_verbose_shows_units_runs_and_fragmentation(api):
    result = invoke(heap, "emulator-5554/1234", "--segments", "-v")
    assert result.exit_code == 0, result.output
    assert "units of" in result.stdout  # only with -v
    assert "outside the largest run" in result.stdout


def test_heap_json(api):
    body = json.loads(invoke(heap, "emulator-5554/1234", "--segments", "--json").stdout)
    assert body["run_fields"] == ["address", "units", "kind", "solidity"]
    assert body["images"][0]["summary"]["bytes_used"] == 2168


def test_heap_nothing_yet(api):
    api["app"].update(heaps=())
    result = invoke(heap, "emulator-5554/1234")
    assert result.exit_code == 0
    assert "no heap information yet" in result.stdout


def test_heap_hints_suggest_only_what_can_work(api):
    api["app"].update(
        heaps=(), unsupported=("HPGC",), unsupported_reasons=(("HPGC", "it refused: no GC"),)
    )
    result = invoke(heap, "emulator-5554/1234")
    assert result.exit_code == 0, result.output
    assert "no heap information yet (try 'ddmd heap TARGET --segments')" in result.stdout
    assert "ddmd gc" not in result.stdout


def test_heap_of_a_vm_without_heap_information_says_why(api):
    api["app"].update(
        heaps=(),
        unsupported=("HPIF", "HPSG"),
        unsupported_reasons=(("HPIF", "Android 12 removed the heap handlers"),),
    )
    result = invoke(heap, "emulator-5554/1234")
    assert result.exit_code == EXIT_API_ERROR, result.output  # not available
    assert result.stdout.splitlines()[1] == (
        "not available: com.example.app does not report heap information "
        "(Android 12 removed the heap handlers)"
    )
    assert "HPIF" not in result.stdout


def test_heap_without_ddm(api):
    result = invoke(heap, "4242")
    assert result.exit_code == EXIT_API_ERROR  # not available
    assert result.stdout.splitlines() == [
        "heap of VM JVM pid 4242 (tcp:8000, pid 4242):",
        "not available: JVM pid 4242 does not speak DDM (a plain JVM has none)",
    ]


def test_heap_segments_unsupported(api):
    result = invoke(heap, "4242", "--segments")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stdout == ""
    assert result.stderr.startswith("ddmd heap: tcp:8000 does not support heap_segments")
    assert len(result.stderr.splitlines()) == 1


# ------------------------------------------------------------------------------ gc


def test_gc(api):
    result = invoke(gc, "com.example.app:remote")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        "GC done on com.example.app:remote (emulator-5554/2000, pid 2000): "
        "heap 1 5.5 MiB allocated of 10.0 MiB"
    )
    assert api["remote"].gc_count == 1


def test_gc_json(api):
    body = json.loads(invoke(gc, "emulator-5554/1234", "--json").stdout)
    assert body["gc"] == "done"
    assert api["app"].gc_count == 1


# ------------------------------------------------------------------------------ stack


def test_stack(api):
    result = invoke(stack, "emulator-5554/1234", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "thread 1 (main) of VM com.example.app (emulator-5554/1234, pid 1234):",
        "  at java.lang.Object.wait(Native Method)",
        "  at com.example.app.Worker.run(Worker.java:42)",
        "  at com.example.app.Gen.lambda$0(Unknown Source)",
        "  at java.lang.Thread.run(Thread.java)",
    ]


def test_stack_json(api):
    body = json.loads(invoke(stack, "emulator-5554/1234", "1", "--json").stdout)
    path = "/api/v1/vms/emulator-5554/1234/threads/1/stack"
    assert body == json_words(api_json(api, "GET", path))


def test_stack_unknown_thread(api):
    result = invoke(stack, "emulator-5554/1234", "77")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.splitlines() == [
        "ddmd stack: no thread 77 in VM emulator-5554/1234; candidates:",
        "  1 main",
        "  2 HeapTaskDaemon",
        "  9 Binder:1234_1",
    ]


def test_stack_unknown_thread_the_vm_does_not_list(api):
    api["app"].update(threads=None)  # ddmd cannot check the id: the VM says no
    result = invoke(stack, "emulator-5554/1234", "77")
    assert result.exit_code == EXIT_API_ERROR
    assert "no thread 77" in result.stderr


def test_stack_by_app_part_and_thread_name(api):
    # "remote" ends the app name of emulator-5554/2000; "binder" is part of thread 9's name.
    api["remote"].stacks[9] = api["app"].stacks[1]
    result = invoke(stack, "remote", "binder")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("thread 9 (Binder:1234_1) of VM ")
    assert "emulator-5554/2000" in result.stdout.splitlines()[0]


def test_stack_ambiguous_thread_name(api):
    api["app"].update(threads=(*api["app"].snap.threads, ThreadSnapshot(3, "Binder:1234_2")))
    result = invoke(stack, "emulator-5554/1234", "binder")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.splitlines() == [
        "ddmd stack: 'binder' matches several threads in VM emulator-5554/1234:",
        "  3 Binder:1234_2",
        "  9 Binder:1234_1",
    ]


def test_stack_thread_name_with_a_slash(api):
    api["app"].update(threads=(ThreadSnapshot(1, "pool/worker 1"),))
    result = invoke(stack, "emulator-5554/1234", "pool/worker 1")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("thread 1 (pool/worker 1) of VM ")


def test_stack_of_a_plain_jvm_says_it_has_no_stack_traces(api):
    result = invoke(stack, "tcp:8000", "main")
    assert result.exit_code == EXIT_API_ERROR
    assert "so it has no stack traces" in result.stderr  # not "give a thread id"


@pytest.mark.parametrize(
    ("frame", "text"),
    [
        (
            {"class_name": "a.B", "method_name": "m", "file_name": "B.java", "line": 0},
            "  at a.B.m(B.java:0)",
        ),
        (
            {"class_name": "a.B", "method_name": "m", "file_name": "B.java", "line": -2},
            "  at a.B.m(Native Method)",
        ),
        (
            {"class_name": "a.B", "method_name": "m", "file_name": None, "line": 3},
            "  at a.B.m(Unknown Source)",
        ),
    ],
)
def test_format_frame(frame, text):
    assert format_frame(frame) == text


# ------------------------------------------------------------------------------ targets


def test_unknown_target_exit_2(api):
    result = invoke(threads, "nope")
    assert result.exit_code == EXIT_TARGET
    assert result.stdout == ""
    first, *candidates = result.stderr.splitlines()
    assert first == "ddmd threads: no VM matches 'nope'; candidates:"
    # One candidate per line, indented, every VM the daemon knows.
    assert [c.split()[0] for c in candidates] == [
        "R58M/1234",
        "emulator-5554/1234",
        "emulator-5554/2000",
        "tcp:8000",
    ]
    assert all(c.startswith("  ") for c in candidates)


def test_ambiguous_target_exit_2(api):
    result = invoke(gc, "1234")
    assert result.exit_code == EXIT_TARGET
    first, *candidates = result.stderr.splitlines()
    assert first == "ddmd gc: '1234' matches several VMs:"
    assert [c.split()[0] for c in candidates] == ["R58M/1234", "emulator-5554/1234"]
    assert api["app"].gc_count == 0


def test_target_by_a_part_of_the_name(api):
    result = invoke(threads, "other")
    assert result.exit_code == 0, result.output
    assert "R58M/1234" in result.stdout.splitlines()[0]


def test_unknown_target_with_no_vms(monkeypatch):
    route_to_app(monkeypatch, {})
    result = invoke(stack, "x", "1")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.strip() == (
        "ddmd stack: no VM matches 'x' (no VMs are known to the daemon)"
    )


# ------------------------------------------------------------------------------ the daemon


@pytest.mark.parametrize("command", [clients, threads, heap, gc, stack])
def test_daemon_not_running_exit_3(command):
    port = closed_port()
    args = {"clients": [], "stack": ["x", "1"]}.get(command.name, ["x"])
    result = invoke(command, *args, "--control", f"127.0.0.1:{port}")
    assert result.exit_code == EXIT_NO_DAEMON
    assert result.stdout == ""
    assert result.stderr == (
        f"ddmd {command.name}: no daemon is answering at http://127.0.0.1:{port} "
        "(start it with 'ddmd run', or pass --control HOST:PORT)\n"
    )


def test_the_client_loads_no_certificate_authorities(monkeypatch):
    # Plain HTTP only: loading the CA bundle (httpx's default) cost ~60 ms at every start.
    import ssl

    def no_cas(*args, **kwargs):
        raise AssertionError("the CA bundle was loaded")

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", no_cas)
    result = invoke(clients, "--control", f"127.0.0.1:{closed_port()}")
    assert result.exit_code == EXIT_NO_DAEMON, result.output


def test_any_address_is_reached_on_loopback():
    port = closed_port()
    result = invoke(clients, "--control", f"0.0.0.0:{port}")
    assert result.exit_code == EXIT_NO_DAEMON
    assert f"http://127.0.0.1:{port} " in result.stderr


def test_control_address_from_config(tmp_path: Path):
    port = closed_port()
    config = tmp_path / "ddmd.toml"
    config.write_text(f"[control]\nport = {port}\n")
    result = invoke(clients, "--config", str(config))
    assert result.exit_code == EXIT_NO_DAEMON
    assert f"http://127.0.0.1:{port} " in result.stderr


def test_config_from_environment(tmp_path: Path, monkeypatch):
    port = closed_port()
    config = tmp_path / "env.toml"
    config.write_text(f"[control]\nport = {port}\n")
    monkeypatch.setenv("DDMD_CONFIG", str(config))
    result = invoke(clients)
    assert f"http://127.0.0.1:{port} " in result.stderr


def test_token_from_config(tmp_path: Path, monkeypatch, vms):
    route_to_app(monkeypatch, vms, token="s3cret")
    config = tmp_path / "ddmd.toml"
    config.write_text('[control]\ntoken = "s3cret"\n')
    result = invoke(clients, "--json", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 4

    result = invoke(clients)
    assert result.exit_code == EXIT_API_ERROR
    [line] = result.stderr.splitlines()
    assert line.startswith("ddmd clients: this daemon requires its token ([control] token)")
    assert "[control] token" in line


def test_bad_config_exit_2(tmp_path: Path):
    config = tmp_path / "bad.toml"
    config.write_text("[control]\nport = 'x'\n")
    result = invoke(clients, "--config", str(config))
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("ddmd clients: ")
    assert "port" in line


@pytest.mark.parametrize("value", ["8710", "host:", ":8710", "host:99999", "host:http"])
def test_bad_control_option(value):
    result = invoke(clients, "--control", value)
    assert result.exit_code == 2
    assert "--control" in result.stderr


def test_not_a_ddmd_daemon(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>", headers={"content-type": "text/html"})

    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.MockTransport(handler))
    result = invoke(clients)
    assert result.exit_code == EXIT_API_ERROR
    assert "did not answer like a ddmd daemon (HTTP 200, text/html)" in result.stderr


def test_read_timeout(monkeypatch):
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.extensions["timeout"] == {
            "connect": 2.0,
            "read": 30.0,
            "write": 10.0,
            "pool": 10.0,
        }
        raise httpx.ReadTimeout("timed out", request=request)

    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.MockTransport(handler))
    result = invoke(heap, "x", "--segments")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr.strip() == (
        "ddmd heap: the daemon at http://127.0.0.1:8710 did not answer within 30 s"
    )


def test_default_timeouts(monkeypatch):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200, json=[])

    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.MockTransport(handler))
    assert invoke(clients).exit_code == 0
    assert seen == [{"connect": 2.0, "read": 10.0, "write": 10.0, "pool": 10.0}]


# ------------------------------------------------------------------------------ threads --watch


def test_threads_watch_into_a_pipe_prints_a_time_line_before_each_table(api):
    # CliRunner's stdout is not a terminal, as with `ddmd threads X --watch | tee log`.
    result = invoke(threads, "emulator-5554/1234", "--watch", "--interval", "0.01", "--count", "3")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout  # no terminal codes
    lines = result.stdout.splitlines()
    stamps = [i for i, line in enumerate(lines) if line.startswith("---")]
    assert len(stamps) == 3
    for i in stamps:
        assert re.fullmatch(r"--- \d{4}-\d\d-\d\d \d\d:\d\d:\d\d ---", lines[i]), lines[i]
        assert lines[i + 1].startswith("threads of VM ")
        assert "emulator-5554/1234" in lines[i + 1]


def test_threads_watch_on_a_terminal_redraws_in_place(api, monkeypatch):
    monkeypatch.setattr(cli_client, "_is_tty", lambda: True)
    args = ["emulator-5554/1234", "--watch", "--interval", "0.01", "--count", "2"]
    # color=True: click keeps escape codes only for what it takes to be a terminal.
    result = CliRunner().invoke(threads, args, catch_exceptions=False, color=True)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\x1b[H\x1b[2J") == 2
    assert "---" not in result.stdout


def test_threads_without_watch_prints_the_table_alone(api):
    result = invoke(threads, "emulator-5554/1234")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("threads of VM ")
    assert "---" not in result.stdout


# ------------------------------------------------------------------------------ devices, adb off


def route_with_health(monkeypatch, health: dict) -> None:
    app = create_app(make_registry(), health=health)
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))


def test_devices_says_where_adb_is_turned_off(monkeypatch):
    source = "/home/u/.config/ddmd/config.toml"
    route_with_health(monkeypatch, {"adb": {"enabled": "off", "config": source}})
    result = invoke(cli_client.devices)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f'adb is turned off: [adb] enabled = "off" in {source}; set it to "auto" (or "on") '
        "and restart the daemon to list Android devices"
    )
    # --json keeps the API's shape: a plain list.
    listed = invoke(cli_client.devices, "--json")
    assert json.loads(listed.stdout) == []


def test_devices_with_adb_on_and_no_device_says_none_is_known(monkeypatch):
    route_with_health(monkeypatch, {"adb": {"enabled": "auto", "config": None}})
    result = invoke(cli_client.devices)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("no Android devices are known to the daemon")
    assert "turned off" not in result.stdout


def test_clients_lists_every_attached_debugger():
    from ddmd.cli.format import format_clients
    from ddmd.session.model import DebuggerSnapshot

    snap = FakeVm.android(
        "tcp:8000",
        debugger="127.0.0.1:5005 via vm-port, 127.0.0.1:5006 via current",
        debuggers=(
            DebuggerSnapshot("127.0.0.1:5005", "vm-port", 8600, 1700000000.0, 12, 30, 1),
            DebuggerSnapshot("127.0.0.1:5006", "current", 8700, 1700000001.0, 4, 9, 0),
        ),
    ).snap.to_json()
    text = format_clients([snap])
    lines = text.splitlines()
    start = lines.index("debuggers attached:")
    first, second = (line.split() for line in lines[start + 2 : start + 4])
    # No tool known: said so, and never the ephemeral port (only with verbose, as PEER).
    assert first[:5] == ["tcp:8000", "unnamed", "debugger", "vm-port", "8600"]
    assert first[-3:] == ["12", "30", "1"]
    assert second[:5] == ["tcp:8000", "unnamed", "debugger", "current", "8700"]
    assert second[-3:] == ["4", "9", "0"]
    assert "5005" not in text
    assert "127.0.0.1:5005" in format_clients([snap], verbose=True)
