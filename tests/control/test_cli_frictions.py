"""Issue 20, part 2: the frictions a new user hit, through the CLI against the real control API
over fake VMs (items 1, 5 and 6; item 7, the exit codes, is tests/control/test_exit_codes.py;
the registry's rules are tests/test_registry_frictions.py; the web page's lines are
tests/web/test_current_vm_page.py).

1. Port 8700 with no current VM: `ddmd clients` and `ddmd demo` say so plainly, with the port
   the daemon bound; `ddmd attach [TARGET]` prints the jdb line and Android Studio's settings
   for the VM's own port, and `--jdb` runs jdb.
5. Commands default to the current VM when TARGET is left out; a scan port is a target.
6. `--device nosuch`, `stack` on an Android 12 VM and `ddmd devices` with an adb server but no
   phone say what is really the matter.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, NoReturn

import click
import pytest
from click.testing import CliRunner, Result

from ddmd.cli import debuggers
from ddmd.cli.main import main
from ddmd.config import load_config
from ddmd.errors import FeatureUnsupported
from ddmd.registry import VmRegistry, VmSnapshot
from ddmd.sim import demo

from .fakes import make_registry
from .profvm import Daemon, ProfVm

MAIL = "com.example.mail"
NOTES = "com.example.notes"
MAPS = "com.example.maps:remote"
NO_CURRENT = "no TARGET given and no VM is current"


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Never read the developer's own ~/.config/ddmd/config.toml."""
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)


def mail(**fields: Any) -> ProfVm:
    defaults: dict[str, Any] = {"app": MAIL, "package": MAIL, "debugger_port": 8600}
    return ProfVm.android("emulator-5554/3101", **{**defaults, **fields})


def notes(**fields: Any) -> ProfVm:
    defaults: dict[str, Any] = {"app": NOTES, "package": NOTES, "debugger_port": 8602}
    return ProfVm.android("tcp:8001", **{**defaults, "device": None, **fields})


class Android12(ProfVm):
    """An Android 12+ VM met for the first time: its thread list is not known, nothing is
    known missing yet; asking for threads finds out (no answer: the handlers are gone), as
    the real VM actor does."""

    def stack_trace(self, thread_id: int) -> NoReturn:  # type: ignore[override]
        raise AssertionError("an Android 12 VM is not asked for a stack trace")

    async def refresh_threads(self) -> VmSnapshot:
        self.refresh_count += 1
        reason = "no answer within 5 s; newer Android versions removed the thread handlers"
        self.update(unsupported=("THST",), unsupported_reasons=(("THST", reason),))
        raise FeatureUnsupported(f"{MAPS} does not report thread states ({reason})")


def maps() -> Android12:
    return Android12.android(
        "tcp:8002",
        app=MAPS,
        package="com.example.maps",
        device=None,
        threads=None,
        heaps=(),
        debugger_port=8601,
    )


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def serve(monkeypatch, tmp_path: Path, registry: VmRegistry, **kw: Any) -> Daemon:
    return Daemon(registry).route(monkeypatch, tmp_path, **kw)


# ------------------------------------------------------------------------------ 1: port 8700


def test_clients_says_the_bound_port_has_no_current_vm(monkeypatch, tmp_path):
    registry = make_registry(mail(), notes())
    registry.current_port = 18700  # as the daemon sets it once the port listens
    serve(monkeypatch, tmp_path, registry)
    result = run("clients")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "port 18700: no current VM \u2014 'ddmd select TARGET'"


def test_clients_names_the_configured_port_when_the_daemon_does_not(monkeypatch, tmp_path):
    serve(monkeypatch, tmp_path, make_registry(mail(), notes()))
    config = tmp_path / "ddmd.toml"
    config.write_text("[debugger]\ncurrent_port = 8777\n")
    result = run("clients", "--config", str(config))
    assert result.stdout.splitlines()[-1] == "port 8777: no current VM \u2014 'ddmd select TARGET'"


def test_clients_with_a_current_vm_or_as_json_adds_nothing(monkeypatch, tmp_path):
    registry = make_registry(mail(current=True), notes())
    daemon = serve(monkeypatch, tmp_path, registry)
    assert "no current VM" not in run("clients").stdout
    registry = make_registry(mail(), notes())
    daemon = serve(monkeypatch, tmp_path, registry)
    result = run("clients", "--json")
    assert "no current VM" not in result.stdout
    assert daemon.seen == ["GET /api/v1/vms"]  # the JSON is the list, as it always was


def test_the_only_vm_is_current_so_a_command_needs_no_target(monkeypatch, tmp_path):
    daemon = serve(monkeypatch, tmp_path, make_registry(mail()))
    result = run("threads")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"threads of VM {MAIL} (emulator-5554/3101, pid 3101)")
    assert daemon.seen[:2] == [
        "GET /api/v1/current",
        "GET /api/v1/vms/emulator-5554/3101/threads",
    ]


def test_attach_prints_the_jdb_line_and_android_studios_settings(monkeypatch, tmp_path):
    registry = make_registry(mail(), notes())
    registry.current_port = 18700
    serve(monkeypatch, tmp_path, registry)
    result = run("attach", "mail")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"attach your debugger to localhost:8600 for {MAIL} (emulator-5554/3101, pid 3101)",
        "",
        "jdb:",
        "  jdb -attach localhost:8600",
        "",
        "IntelliJ IDEA: Run > Edit Configurations > + > Remote JVM Debug",
        "  Debugger mode:  Attach to remote JVM",
        "  Host:           localhost",
        "  Port:           8600",
        "",
        "Android Studio: point its adb at ddmd's adb front instead, then Attach Debugger to",
        '  Android Process (docs/android-tools.md, "The adb front").',
        "",
        "Port 18700 leads to the current VM, not to this one ('ddmd select TARGET' changes that).",
    ]


def test_attach_to_the_current_vm_and_as_json(monkeypatch, tmp_path):
    registry = make_registry(mail(current=True), notes())
    registry.select("emulator-5554/3101")
    registry.current_port = 18700
    daemon = serve(monkeypatch, tmp_path, registry)
    result = run("attach")
    assert result.exit_code == 0, result.output
    assert "  jdb -attach localhost:8600" in result.stdout
    assert result.stdout.splitlines()[-1] == (
        "It is the current VM too: localhost:18700 reaches it as well."
    )
    assert daemon.seen[0] == "GET /api/v1/current"
    answer = json.loads(run("attach", "--json").stdout)
    assert answer["jdb"] == ["jdb", "-attach", "localhost:8600"]
    assert answer["android_studio"] == {
        "configuration": "Remote JVM Debug",
        "debugger_mode": "Attach to remote JVM",
        "host": "localhost",
        "port": 8600,
    }
    assert (answer["vm"]["id"], answer["current_port"]) == ("emulator-5554/3101", 18700)


def test_attach_names_the_configured_debugger_host(monkeypatch, tmp_path):
    serve(monkeypatch, tmp_path, make_registry(mail()))
    config = tmp_path / "ddmd.toml"
    config.write_text(
        '[debugger]\nhost = "192.168.1.20"\n\n[security]\nallow_non_loopback = true\n'
    )
    result = run("attach", "--config", str(config))
    assert "  jdb -attach 192.168.1.20:8600" in result.stdout
    assert "  Host:           192.168.1.20" in result.stdout


def test_attach_jdb_runs_jdb_attached_to_the_vms_port(monkeypatch, tmp_path):
    serve(monkeypatch, tmp_path, make_registry(mail(), notes()))
    ran: list[tuple[str, list[str]]] = []

    def exec_program(path: str, argv: list[str]) -> NoReturn:
        ran.append((path, argv))
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(debuggers.shutil, "which", lambda name: f"/opt/jdk/bin/{name}")
    monkeypatch.setattr(debuggers, "exec_program", exec_program)
    result = run("attach", "notes", "--jdb")
    assert result.exit_code == 0, result.output
    assert ran == [("/opt/jdk/bin/jdb", ["jdb", "-attach", "localhost:8602"])]
    assert "running jdb -attach localhost:8602" in result.stderr


def test_attach_jdb_without_jdb_says_where_it_comes_from(monkeypatch, tmp_path):
    serve(monkeypatch, tmp_path, make_registry(mail()))
    monkeypatch.setattr(debuggers.shutil, "which", lambda name: None)
    result = run("attach", "--jdb")
    assert result.exit_code == 1
    assert result.stderr.startswith("ddmd attach: jdb is not installed (it comes with a JDK")
    assert "localhost:8600" in result.stderr


def test_attach_to_a_vm_without_a_port_of_its_own(monkeypatch, tmp_path):
    serve(monkeypatch, tmp_path, make_registry(mail(debugger_port=None), notes()))
    result = run("attach", "mail")
    assert result.exit_code == 1
    assert "has no debugger port of its own yet" in result.stderr
    assert "'ddmd select TARGET'" in result.stderr
    # Current, it is reached through the current-VM port.
    registry = make_registry(mail(debugger_port=None))
    registry.current_port = 18700
    serve(monkeypatch, tmp_path, registry)
    assert "  jdb -attach localhost:18700" in run("attach").stdout


def test_demo_says_the_port_has_no_current_vm_and_how_to_attach(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    lines = demo.hint_lines(load_config(None, env=os.environ), 18700)
    assert "# port 18700: no current VM \u2014 'ddmd select TARGET', e.g.:" in lines
    assert f"ddmd attach {MAIL}" in lines
    after = lines[lines.index("# port 18700: no current VM \u2014 'ddmd select TARGET', e.g.:") :]
    commands = [line for line in after if not line.startswith("#")]
    assert commands == [f"ddmd select {MAIL}", "jdb -attach localhost:18700"]
    assert all(shlex.split(c)[0] in ("ddmd", "jdb") for c in commands)


# ------------------------------------------------------------------------------ 5: no TARGET


@pytest.mark.parametrize(
    ("args", "request_line"),
    [
        (["threads"], "GET /api/v1/vms/emulator-5554/3101/threads"),
        (["heap"], "GET /api/v1/vms/emulator-5554/3101/heap"),
        (["gc"], "POST /api/v1/vms/emulator-5554/3101/gc"),
        (["stack", "main"], "GET /api/v1/vms/emulator-5554/3101/threads/main/stack"),
        (["stack", "1"], "GET /api/v1/vms/emulator-5554/3101/threads/1/stack"),
        (["trace", "--seconds", "0.01"], "POST /api/v1/vms/emulator-5554/3101/trace/stop"),
        (["allocs", "--status"], "GET /api/v1/vms/emulator-5554/3101/profiling"),
        (["hprof"], "POST /api/v1/vms/emulator-5554/3101/hprof"),
        (["kill", "--yes"], "POST /api/v1/vms/emulator-5554/3101/kill"),
        (["attach"], "GET /api/v1/current"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_without_target_commands_use_the_current_vm(monkeypatch, tmp_path, args, request_line):
    registry = make_registry(mail(), notes())
    registry.select("emulator-5554/3101")
    daemon = serve(monkeypatch, tmp_path, registry)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "GET /api/v1/current" in daemon.seen
    assert request_line in daemon.seen
    # Every request about a VM is about the current one (`stack WORD` first looks WORD up as
    # a VM: every thread's stack of it, when it names one).
    probe = f"GET /api/v1/vms/{args[1]}" if args[0] == "stack" else None
    asked = [line for line in daemon.vm_requests() if line != probe]
    assert all("/vms/emulator-5554/3101" in line for line in asked), asked


@pytest.mark.parametrize(
    "args",
    [["threads"], ["heap"], ["gc"], ["stack", "main"], ["trace"], ["allocs"], ["hprof"],
     ["kill", "--yes"], ["attach"], ["logcat", "--no-follow"]],
    ids=lambda v: " ".join(v),
)  # fmt: skip
def test_without_target_and_without_a_current_vm_it_says_how_to_choose(monkeypatch, tmp_path, args):
    daemon = serve(monkeypatch, tmp_path, make_registry(mail(), notes()))
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert "no VM is current" in result.stderr
    # Nothing was asked of any VM (`stack WORD` only looked WORD up as a VM).
    assert daemon.vm_requests() in ([], [f"GET /api/v1/vms/{args[-1]}"])


def test_the_current_vm_on_another_device_than_asked(monkeypatch, tmp_path):
    registry = make_registry(mail(), notes())
    registry.select("emulator-5554/3101")
    serve(monkeypatch, tmp_path, registry)
    result = run("gc", "--device", "R58M")
    assert result.exit_code == 2
    assert result.stderr == (
        f"ddmd gc: the current VM ({MAIL}) is not on device R58M: give a TARGET\n"
    )


def test_a_scan_port_is_a_target(monkeypatch, tmp_path):
    registry = make_registry(mail(), notes())
    serve(monkeypatch, tmp_path, registry)
    result = run("select", "8001")
    assert result.exit_code == 0, result.output
    said = result.stdout.splitlines()[-1]  # after the registry's own log line
    assert said == f"current VM: {NOTES} (tcp:8001, pid ?); its own debugger port is 8602"
    handle = registry.current()
    assert handle is not None
    assert handle.vm_id == "tcp:8001"
    assert run("threads", "8001").exit_code == 0


def test_select_still_needs_a_target():
    result = CliRunner().invoke(main, ["select"])
    assert result.exit_code == 2
    assert "Missing argument 'TARGET'" in result.output


# ------------------------------------------------------------------------------ 6: messages


def test_an_unknown_device_is_named_not_the_vms_of_others(monkeypatch, tmp_path):
    registry = make_registry(mail(), notes())
    registry.set_device("emulator-5554", "device")
    serve(monkeypatch, tmp_path, registry)
    result = run("threads", "mail", "--device", "nosuch")
    assert result.exit_code == 2
    assert result.stderr == "ddmd threads: no device nosuch (devices: emulator-5554)\n"
    assert MAIL not in result.stderr


def test_stack_on_android_12_says_once_that_it_has_no_stack_traces(monkeypatch, tmp_path):
    vm = maps()
    serve(monkeypatch, tmp_path, make_registry(mail(), vm))
    sentence = (
        f"ddmd stack: {MAPS} does not report stack traces (newer Android versions removed the "
        "thread handlers)\n"
    )
    by_name = run("stack", "maps", "main")  # the first request about this VM
    assert by_name.exit_code == 1
    assert by_name.stderr == sentence
    assert "thread id" not in by_name.output
    by_id = run("stack", "maps", "1")
    assert by_id.exit_code == 1
    assert by_id.stderr == sentence
    assert vm.refresh_count == 1  # looked up once, for the name


def test_stack_takes_target_and_thread_or_thread_alone():
    result = CliRunner().invoke(main, ["stack", "a", "b", "c"])
    assert result.exit_code == 2
    assert "not 3 words" in result.output
    help_text = CliRunner().invoke(main, ["stack", "--help"]).output
    assert re.search(r"Usage: .*stack \[OPTIONS\] \[TARGET\] \[?THREAD", help_text)


@pytest.mark.parametrize(
    ("reached", "said"),
    [
        (
            True,
            "the adb server at 127.0.0.1:5037 has no devices (plug one in, or start an emulator)",
        ),
        (False, "no Android devices: no adb server answers at 127.0.0.1:5037"),
    ],
)
def test_devices_says_whether_the_adb_server_answers(monkeypatch, tmp_path, reached, said):
    registry = make_registry()
    registry.set_adb_server("127.0.0.1:5037", connected=reached)
    health = {"adb": {"enabled": "auto", "config": None}}
    serve(monkeypatch, tmp_path, registry, health=health)
    result = run("devices")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(said)
    assert "none plugged in, or no adb server" not in result.stdout  # the old guess
