"""ddmd.cli.main: --version, check-config, run (config errors, a missing or fake daemon)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import types
from pathlib import Path

import click
import pytest
import trio
from click.testing import CliRunner

from ddmd import __version__, instance, logs
from ddmd.cli.main import COMMANDS, EXIT_ALREADY_RUNNING, main
from ddmd.config import load_config
from ddmd.errors import PortInUse

# The module of `run`, `demo` and `check-config` (imported when one of them runs).
cli = importlib.import_module("ddmd.cli.serve")

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No real user config, no real adb port: each test sees an empty home. Lock files go to
    a runtime directory of the test's own, and a ddmd the developer runs on 8710 does not
    count as "already running" (tests that want one say so)."""
    for name in ("DDMD_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "ANDROID_ADB_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(instance, "probe", lambda host, port, token: None)
    yield
    logs.reset()


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def bad_config(tmp_path):
    file = tmp_path / "bad.toml"
    file.write_text('[scan]\nports = "9000-8000"\n')
    return file


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def as_entry(run):
    """A stand-in for `daemon.run` (or `sim.demo.run_demo`) from ``async def run(config)``:
    it says it started (with a `stop` that does nothing), then runs ``run``."""

    async def entry(config, *, install_signal_handlers=True, task_status=trio.TASK_STATUS_IGNORED):
        assert install_signal_handlers is False  # the CLI watches the signals itself
        task_status.started(types.SimpleNamespace(stop=lambda: None))
        await run(config)

    return entry


def fake_daemon(monkeypatch, run):
    module = types.ModuleType("ddmd.daemon")
    module.run = as_entry(run)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ddmd.daemon", module)


def test_version(runner):
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"ddmd {__version__}\n"
    assert __version__ == "0.1.0"


def test_help_lists_commands(runner):
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "check-config" in result.output
    assert "run" in result.output


def test_help_shows_every_command_with_a_whole_one_line_summary(runner):
    result = runner.invoke(main, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    section = result.output.split("Commands:\n", 1)[1].splitlines()
    assert not [line for line in section if "..." in line]  # no summary cut short
    rows = [re.fullmatch(r"  (\S+) +(\S.*)", line) for line in section if line.strip()]
    assert all(rows), section  # no wrapped continuation lines: one line per command
    summaries = {row[1]: row[2] for row in rows if row}
    ctx = click.Context(main)
    listed = {
        name
        for name in main.list_commands(ctx)
        if not (command := main.get_command(ctx, name)) or not command.hidden
    }
    assert set(summaries) == listed
    assert {"check-config", "run", "demo", "clients", "devices", "threads", "sim"} <= listed
    for name, summary in summaries.items():
        # A sentence that says what the command does, starting with its verb.
        assert summary[0].isupper(), (name, summary)
        assert summary.endswith((".", ")")), (name, summary)


def test_the_command_table_has_each_commands_own_short_help():
    # `ddmd --help` and completion read the summaries from cli.main's table, not the commands.
    ctx = click.Context(main)
    for name, (module, attribute, summary) in COMMANDS.items():
        command = getattr(importlib.import_module(module), attribute)
        assert command.name == name
        assert command.get_short_help_str(limit=1_000) == summary, name
        assert main.get_command(ctx, name) is command


def test_completion_of_a_command_name_and_of_a_commands_options():
    ctx = click.Context(main, info_name="ddmd")
    items = {item.value: item.help for item in main.shell_complete(ctx, "th")}
    assert items == {"threads": COMMANDS["threads"][2]}
    assert "--version" in {item.value for item in main.shell_complete(ctx, "--v")}
    # Inside a command: its own options (the command is imported then).
    threads = main.get_command(ctx, "threads")
    sub = click.Context(threads, parent=ctx, info_name="threads")
    assert "--watch" in {item.value for item in threads.shell_complete(sub, "--w")}


def test_shell_completion_through_the_environment(monkeypatch):
    # What bash asks (`_DDMD_COMPLETE=bash_complete`): every command starting with "lo".
    monkeypatch.setenv("_DDMD_COMPLETE", "bash_complete")
    monkeypatch.setenv("COMP_WORDS", "ddmd lo")
    monkeypatch.setenv("COMP_CWORD", "1")
    result = CliRunner().invoke(main, [], prog_name="ddmd", complete_var="_DDMD_COMPLETE")
    assert result.exit_code == 0
    assert result.output.split() == ["plain,logcat"]


# --- check-config


def test_check_config_ok(runner, tmp_path):
    file = tmp_path / "config.toml"
    shutil.copy(EXAMPLE, file)
    result = runner.invoke(main, ["check-config", str(file)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{file}: ok"
    text = result.stdout
    assert "127.0.0.1 ports 8000-8040" in text
    assert "127.0.0.1 ports 8600-8699" in text
    assert "127.0.0.1:8700" in text
    assert "control API: 127.0.0.1:8710" in text
    assert "adb:         auto, server 127.0.0.1:5037" in text
    assert result.stderr == ""


def test_check_config_summary_follows_the_file(runner, tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(
        '[scan]\nenabled = false\n[adb]\nenabled = "off"\n'
        '[control]\nhost = "::1"\nport = 9000\ntoken = "s3cret"\n'
    )
    result = runner.invoke(main, ["check-config", str(file)])
    assert result.exit_code == 0, result.output
    assert "scan:        off" in result.stdout
    assert "adb:         off" in result.stdout
    assert "control API: [::1]:9000, token required" in result.stdout
    assert "s3cret" not in result.stdout


def test_check_config_bad_value(runner, bad_config):
    result = runner.invoke(main, ["check-config", str(bad_config)])
    assert result.exit_code == 2
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert str(bad_config) in line
    assert "[scan] ports = '9000-8000'" in line
    assert "start port is above end port" in line


def test_check_config_unknown_key(runner, tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("[debugger]\ncurent_port = 8700\n")
    result = runner.invoke(main, ["check-config", str(file)])
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "[debugger] curent_port = 8700" in line
    assert "did you mean 'current_port'" in line


def test_check_config_invalid_toml(runner, tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("[scan\n")
    result = runner.invoke(main, ["check-config", str(file)])
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "not valid TOML" in line
    assert "line 1" in line


def test_check_config_missing_file(runner, tmp_path):
    missing = tmp_path / "missing.toml"
    result = runner.invoke(main, ["check-config", str(missing)])
    assert result.exit_code == 2
    assert one_line(result.stderr) == f"ddmd check-config: {missing}: no such file"


def test_check_config_without_argument_is_a_usage_error(runner):
    result = runner.invoke(main, ["check-config"])
    assert result.exit_code == 2
    assert "Missing argument 'FILE'" in result.stderr


# --- run


def test_run_bad_config(runner, bad_config):
    result = runner.invoke(main, ["run", "--config", str(bad_config)])
    assert result.exit_code == 2
    assert f"using config file {bad_config}" in result.stderr
    assert "[scan] ports = '9000-8000'" in result.stderr.splitlines()[-1]


def test_run_missing_explicit_config(runner, tmp_path):
    missing = tmp_path / "nope.toml"
    result = runner.invoke(main, ["run", "--config", str(missing)])
    assert result.exit_code == 2
    assert str(missing) in result.stderr
    assert "--config" in result.stderr


def test_run_bad_config_from_ddmd_config(runner, monkeypatch, bad_config):
    monkeypatch.setenv("DDMD_CONFIG", str(bad_config))
    result = runner.invoke(main, ["run"])
    assert result.exit_code == 2
    assert "[scan] ports = '9000-8000'" in result.stderr


def test_run_calls_the_daemon_with_the_config(runner, monkeypatch, tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('[control]\nport = 9710\n[log]\nlevel = "warning"\nformat = "console"\n')
    seen = []

    async def run(config):
        seen.append(config)

    fake_daemon(monkeypatch, run)
    configured = []
    monkeypatch.setattr(cli, "configure", lambda **kw: configured.append(kw))
    result = runner.invoke(main, ["run", "--config", str(file), "--log-level", "DEBUG"])
    assert result.exit_code == 0, result.output
    assert f"using config file {file}" in result.stderr
    assert seen[0].control.port == 9710
    # The CLI option beats [log] level; [log] format applies when no option is given.
    assert configured == [{"fmt": "console", "level": "debug"}]


def test_run_finds_the_user_config(runner, monkeypatch, tmp_path):
    user_file = tmp_path / "home" / ".config" / "ddmd" / "config.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text("[control]\nport = 9711\n")
    seen = []

    async def run(config):
        seen.append(config)

    fake_daemon(monkeypatch, run)
    result = runner.invoke(main, ["run", "--log-format", "json"])
    assert result.exit_code == 0, result.output
    assert f"using config file {user_file}" in result.stderr
    assert seen[0].control.port == 9711


def test_run_port_in_use_is_one_line_exit_1(runner, monkeypatch):
    async def run(config):
        raise PortInUse(8700, "debugger.current_port", host="127.0.0.1")

    fake_daemon(monkeypatch, run)
    result = runner.invoke(main, ["run", "--log-format", "json"])
    assert result.exit_code == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("ddmd run: 127.0.0.1 port 8700 is already in use")
    assert "[debugger] current_port" in last


def test_run_errors_in_a_group_are_reported(runner, monkeypatch):
    async def run(config):
        raise ExceptionGroup("daemon", [PortInUse(8710, "control.port")])

    fake_daemon(monkeypatch, run)
    result = runner.invoke(main, ["run", "--log-format", "json"])
    assert result.exit_code == 1
    assert "[control] port" in result.stderr.splitlines()[-1]


def test_run_unexpected_errors_are_not_hidden(runner, monkeypatch):
    async def run(config):
        raise ExceptionGroup("daemon", [RuntimeError("bug")])

    fake_daemon(monkeypatch, run)
    result = runner.invoke(main, ["run", "--log-format", "json"])
    assert result.exit_code == 1
    assert isinstance(result.exception, ExceptionGroup)


def test_run_rejects_bad_log_options(runner):
    result = runner.invoke(main, ["run", "--log-format", "xml"])
    assert result.exit_code == 2
    assert "--log-format" in result.stderr


# --- the errors the CLI translates


def test_error_tree_and_messages():
    from ddmd import errors

    for name in ("VmGone", "FeatureUnsupported", "RequestTimedOut", "DdmFailed"):
        assert issubclass(getattr(errors, name), errors.VmRequestError)
    for name in ("ConfigError", "PortInUse", "VmRequestError"):
        assert issubclass(getattr(errors, name), errors.DdmdError)
    assert issubclass(errors.TargetError, errors.DdmdError)

    in_use = PortInUse(8700, "debugger.current_port")
    assert "port 8700" in str(in_use)
    assert "[debugger] current_port" in str(in_use)
    assert "[control] port" in str(PortInUse(8710, "[control] port"))
    assert str(errors.RequestTimedOut("no heap segment dump arrived")) == (
        "no heap segment dump arrived"
    )
    assert "vm=emulator-5554/1234" in str(errors.VmGone("gone", vm="emulator-5554/1234"))
    target = errors.TargetError("'app' matches several VMs", candidates=("1 a", "2 b"))
    assert target.message == "'app' matches several VMs"
    assert target.candidates == ("1 a", "2 b")
    assert str(target) == "'app' matches several VMs (candidates: 1 a, 2 b)"


# --- every problem of a config file


# Five problems: an unknown key, a wrong type, a port range holding the current-VM port, a
# non-loopback host without permission, an out-of-range value.
MANY_PROBLEMS = (
    '[scan]\nprots = "8000-8040"\ninterval = "fast"\n'
    '[debugger]\nports = "8690-8705"\n'
    '[control]\nhost = "0.0.0.0"\n'
    "[limits]\nmax_vms = 0\n"
)
MANY_EXPECTED = (
    "[scan] prots = '8000-8040': unknown key; did you mean 'ports'?",
    "[scan] interval = 'fast': expected a number of seconds, got a string",
    "[control] host = '0.0.0.0': not a loopback address",
    "[limits] max_vms = 0: must be >= 1",
    "[debugger] current_port = 8700: inside [debugger] ports (8690-8705)",
)


def assert_every_problem(command: str, stderr: str, file: Path) -> None:
    lines = stderr.splitlines()
    assert lines[-1] == f"ddmd {command}: {len(MANY_EXPECTED)} problems in {file}"
    problems = lines[-1 - len(MANY_EXPECTED) : -1]
    for line, expected in zip(problems, MANY_EXPECTED, strict=True):
        assert line.startswith(f"ddmd {command}: {file}: {expected}"), (line, expected)


def test_check_config_lists_every_problem(runner, tmp_path):
    file = tmp_path / "many.toml"
    file.write_text(MANY_PROBLEMS)
    result = runner.invoke(main, ["check-config", str(file)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == len(MANY_EXPECTED) + 1
    assert_every_problem("check-config", result.stderr, file)


def test_run_lists_every_problem_and_starts_nothing(runner, monkeypatch, tmp_path):
    file = tmp_path / "many.toml"
    file.write_text(MANY_PROBLEMS)
    started = []

    async def run(config):
        started.append(config)

    fake_daemon(monkeypatch, run)
    result = runner.invoke(main, ["run", "--config", str(file)])
    assert result.exit_code == 2
    assert_every_problem("run", result.stderr, file)
    assert started == []


# --- a second daemon


def control_config(tmp_path: Path, port: int) -> Path:
    file = tmp_path / f"control-{port}.toml"
    file.write_text(f"[control]\nport = {port}\n")
    return file


def test_run_refuses_while_another_holds_the_control_address(runner, monkeypatch, tmp_path):
    file = control_config(tmp_path, 9712)
    started = []

    async def run(config):
        started.append(config)

    fake_daemon(monkeypatch, run)
    with instance.claim(load_config(file)):  # as a running daemon holds it
        result = runner.invoke(main, ["run", "--config", str(file)])
    assert result.exit_code == EXIT_ALREADY_RUNNING == 4
    assert result.stderr.splitlines()[-1].startswith(
        f"ddmd run: ddmd is already running (pid {os.getpid()}, control 127.0.0.1:9712); "
    )
    assert started == []
    # Another control port is another daemon; and once the first is gone, the start goes on.
    other = control_config(tmp_path, 9713)
    assert runner.invoke(main, ["run", "--config", str(other)]).exit_code == 0
    assert runner.invoke(main, ["run", "--config", str(file)]).exit_code == 0
    assert [c.control.port for c in started] == [9713, 9712]


def test_demo_refuses_when_a_ddmd_answers_at_the_control_address(runner, monkeypatch, tmp_path):
    asked = []

    def answering(host, port, token):
        asked.append((host, port))
        return instance.Running(pid=4321)

    monkeypatch.setattr(instance, "probe", answering)
    demos = []
    module = types.ModuleType("ddmd.sim.demo")

    async def run_demo(config):
        demos.append(config)

    module.run_demo = as_entry(run_demo)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ddmd.sim.demo", module)
    result = runner.invoke(main, ["demo"])
    assert result.exit_code == EXIT_ALREADY_RUNNING
    last = result.stderr.splitlines()[-1]
    assert "ddmd demo: ddmd is already running (pid 4321, control 127.0.0.1:8710)" in last
    assert asked == [("127.0.0.1", 8710)]
    assert demos == []  # no simulated VM was started
    # The refused start left no lock behind.
    monkeypatch.setattr(instance, "probe", lambda host, port, token: None)
    assert runner.invoke(main, ["demo"]).exit_code == 0
    assert len(demos) == 1
