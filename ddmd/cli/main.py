"""The `ddmd` command line: the click group, `check-config`, and `run`/`demo` (argv -> Config ->
daemon.run()); the client commands come from `cli.client`, `cli.ports` and `cli.events`.

Layer: the top; imports config, errors, logs, netaddr, instance (the "already running" check)
and the client command modules, and the daemon lazily inside `ddmd run` (`sim.demo` inside
`ddmd demo`, `sim.cli` for `ddmd sim`). No protocol code.
Errors become one line on stderr and an exit code, from the one table of every command
(`cli.exits`'s docstring, docs/cli.md's "Exit codes"):

    0  success
    1  failure while running (a port in use, a VM or daemon problem)
    2  bad configuration (every problem of the file is listed, one a line), or a usage error
       (click's own code for those)
    3  (client commands) no daemon answers at the control address
    4  `run`/`demo`: a ddmd is already running for this control address (`ddmd.instance`);
       nothing was started

Each subcommand is one function on the `main` group; client commands (clients, threads, heap, gc,
stack, select, attach, ports, devices, events, and `cli.profiling`'s trace, allocs, hprof, kill)
and the sim/demo tools are added the same way.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ddmd import __version__, instance
from ddmd.cli import client, debuggers, events, ext, logcat, ports, profiling
from ddmd.cli.client import config_option
from ddmd.cli.hprof import hprof_summary
from ddmd.cli.trace import trace_report
from ddmd.config import LOG_LEVELS, Config, find_config_file, load_config
from ddmd.errors import ConfigError, DdmdError
from ddmd.logs import FORMATS, Event, configure, get_logger
from ddmd.netaddr import host_port

__all__ = ["COMMANDS", "EXIT_ALREADY_RUNNING", "EXIT_CONFIG", "EXIT_FAILURE", "EXIT_OK", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_ALREADY_RUNNING = 4

_CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

F = TypeVar("F", bound=Callable[..., Any])

log = get_logger("ddmd.cli")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(command: str, message: object, code: int) -> NoReturn:
    """Print "ddmd COMMAND: message" on stderr and leave with `code`."""
    click.echo(f"ddmd {command}: {_one_line(str(message))}", err=True)
    raise click.exceptions.Exit(code)


def _fail_config(command: str, err: ConfigError) -> NoReturn:
    """Every problem of a config, one a line ("ddmd COMMAND: FILE: [key] = value: ..."), then
    how many there were when there are several; exit 2."""
    problems = err.problems
    for problem in problems:
        click.echo(f"ddmd {command}: {_one_line(str(problem))}", err=True)
    if len(problems) > 1:
        where = f" in {err.path}" if err.path else ""
        click.echo(f"ddmd {command}: {len(problems)} problems{where}", err=True)
    raise click.exceptions.Exit(EXIT_CONFIG)


def _summary(config: Config) -> Iterator[str]:
    """The effective ports and modes, one line each, for `check-config`."""
    scan, dbg, ctl, adb = config.scan, config.debugger, config.control, config.adb
    if scan.enabled:
        yield f"scan:        {scan.host} ports {scan.ports}, every {scan.interval:g} s"
    else:
        yield "scan:        off"
    yield f"debuggers:   {dbg.host} ports {dbg.ports} (one per VM)"
    yield f"current VM:  {host_port(dbg.host, dbg.current_port)}"
    token = ", token required" if ctl.token else ""
    tcp = host_port(ctl.host, ctl.port) if ctl.tcp else "no TCP listener"
    unix = f", unix socket {ctl.socket}" if ctl.socket is not None else ""
    yield f"control API: {tcp}{token}{unix}"
    sec = config.security
    others = ", ".join(str(uid) for uid in sec.allowed_uids)
    yield (
        f"connections: this user and root{' and uids ' + others if others else ''}; "
        f"unknown owner: {sec.unknown_peer}"
    )
    if adb.enabled == "off":
        yield "adb:         off"
    else:
        yield f"adb:         {adb.enabled}, server {host_port(adb.host, adb.port)}"
        front = config.front
        if not front.enabled:
            yield "adb front:   off"
        else:
            mode = " (transparent: every adb tool goes through ddmd)" if front.port == 5037 else ""
            where = host_port(front.host, front.port)
            yield f"adb front:   {where}{mode}, kill-server: {front.on_kill}"


_WHOLE = 1_000  # a summary length limit no summary reaches: never cut


class _Group(click.Group):
    """A group whose command list shows each command's summary whole.

    click cuts a summary taken from the docstring at about 45 characters ("..."); here a
    command's `short_help`, or else the first sentence of its docstring, is shown as it is
    (wrapped if it is long). Commands keep their summaries short.
    """

    #: name -> (module, attribute) of commands imported on first use.
    lazy: dict[str, tuple[str, str]] = {
        "sim": ("ddmd.sim.cli", "sim_command"),
        "sysmon": ("ddmd.sysmon.cli", "sysmon_command"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in self.lazy:
            module, attribute = self.lazy[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=_WHOLE)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Group, context_settings=_CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="ddmd", message="%(prog)s %(version)s")
def main() -> None:
    """ddmd: a debug monitor for Java and Android VMs.

    It keeps one JDWP connection per VM and lets debuggers in through per-VM ports and the
    current-VM port.
    """


def _serve_options(func: F) -> F:
    """--config, --log-format and --log-level of the commands that run the daemon."""
    func = click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=None,
        help="Minimum log level; overrides [log] level.",
    )(func)
    func = click.option(
        "--log-format",
        type=click.Choice(FORMATS),
        default=None,
        help="Log output; overrides [log] format. auto = console on a terminal, JSON otherwise.",
    )(func)
    return config_option(func)


@main.command("check-config", short_help="Check a config file and show the ports it sets.")
@click.argument("file", type=click.Path(path_type=str))
def check_config(file: str) -> None:
    """Check a config FILE and show the ports it sets.

    Every problem of the file is listed, one a line, with the key, the value and what is
    wrong (exit 2).
    """
    try:
        config = load_config(file, env=os.environ)
    except ConfigError as err:
        _fail_config("check-config", err)
    click.echo(f"{file}: ok")
    for line in _summary(config):
        click.echo(f"  {line}")


@main.command("run", short_help="Run the daemon in the foreground until Ctrl-C or SIGTERM.")
@_serve_options
def run(config_file: str | None, log_format: str | None, log_level: str | None) -> None:
    """Run the daemon in the foreground until SIGINT or SIGTERM.

    Exits 4 without starting anything when a ddmd already runs for the same control address.
    """
    _serve("run", config_file, log_format, log_level, "ddmd.daemon", "run")


def _serve(
    command: str,
    config_file: str | None,
    log_format: str | None,
    log_level: str | None,
    module: str,
    entry: str,
) -> None:
    """Resolve the config; make sure no other ddmd serves its control address (the claim is
    held until the daemon ends); then configure logs and run ``module.entry(config)``."""
    env = os.environ
    try:
        path = find_config_file(config_file, env)
        if path is None:
            click.echo(
                f"ddmd {command}: no config file found; using the built-in defaults", err=True
            )
        else:
            click.echo(f"ddmd {command}: using config file {path}", err=True)
        config = load_config(path, env=env)
    except ConfigError as err:
        _fail_config(command, err)

    # Before any port is bound or any simulated VM started: is a ddmd already running?
    try:
        claim = instance.claim(config, env)
    except instance.AlreadyRunning as err:
        _fail(command, err, EXIT_ALREADY_RUNNING)
    if claim.problem is not None:
        click.echo(
            f"ddmd {command}: {claim.problem}; only the control address was checked for "
            "another ddmd",
            err=True,
        )
    with claim:
        _start(command, config, path, log_format, log_level, module, entry)


def _start(
    command: str,
    config: Config,
    path: Path | None,
    log_format: str | None,
    log_level: str | None,
    module: str,
    entry: str,
) -> None:
    """Configure logs and run ``module.entry(config)`` under trio; errors become exit codes."""
    configure(fmt=log_format or config.log.format, level=(log_level or config.log.level).lower())
    if path is None:
        log.info(Event.CONFIG_DEFAULTS_USED)
    else:
        log.info(Event.CONFIG_LOADED, path=str(path))

    main_function = getattr(importlib.import_module(module), entry)

    import trio  # only the daemon commands need it; keeps client commands light

    try:
        trio.run(main_function, config)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    except DdmdError as err:
        _fail(command, err, EXIT_CONFIG if isinstance(err, ConfigError) else EXIT_FAILURE)
    except click.ClickException:
        raise
    except BaseExceptionGroup as group:
        errors = _ddmd_errors(group)
        if errors is None:
            raise
        for error in errors:
            click.echo(f"ddmd {command}: {_one_line(str(error))}", err=True)
        code = EXIT_CONFIG if any(isinstance(e, ConfigError) for e in errors) else EXIT_FAILURE
        raise click.exceptions.Exit(code) from None


@main.command("demo", short_help="Run the daemon with three simulated VMs, no device needed.")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Show the daemon's log at info level (the demo shows warnings and errors only).",
)
@_serve_options
def demo(
    verbose: bool, config_file: str | None, log_format: str | None, log_level: str | None
) -> None:
    """Run the daemon with three simulated VMs (no device needed) until Ctrl-C.

    It prints the commands to try once the daemon has found the VMs. The log shows warnings
    and errors only, unless -v (or --log-level). Exits 4 without starting anything when a
    ddmd already runs for the same control address.
    """
    level = log_level or ("info" if verbose else "warning")
    _serve("demo", config_file, log_format, level, "ddmd.sim.demo", "run_demo")


def _ddmd_errors(group: BaseExceptionGroup[BaseException]) -> list[DdmdError] | None:
    """The DdmdErrors in a (nested) exception group, or None if it holds anything else."""
    found: list[DdmdError] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _ddmd_errors(exc)
            if inner is None:
                return None
            found.extend(inner)
        elif isinstance(exc, DdmdError):
            found.append(exc)
        else:
            return None
    return found


#: The control-API client commands (cheap to import, so registered now). The simulator is
#: registered lazily (`_Group.lazy`: imported only when ``ddmd sim`` or ``--help`` runs, so
#: client commands such as ``ddmd gc`` start quickly).
COMMANDS: list[click.Command] = [
    *client.VM_COMMANDS,
    ports.ports,
    events.events,
    ext.extensions,
    *profiling.DDMS_COMMANDS,
]
#: Commands that read a file and need no daemon.
FILE_COMMANDS: list[click.Command] = [hprof_summary, trace_report]

for _command in (*COMMANDS, *FILE_COMMANDS):
    main.add_command(_command)
# A client command too; not in COMMANDS while tests/control/test_cli_client.py pins that list.
main.add_command(logcat.logcat)
main.add_command(debuggers.attach)  # `ddmd attach`: jdb's line, an IDE's settings
