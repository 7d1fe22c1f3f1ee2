"""`ddmd check-config`, `ddmd run` and `ddmd demo`: argv -> Config -> the daemon under trio.

Layer: the top; imports config, errors, logs, netaddr, instance (the "already running" check)
and `cli.api`'s --config option; the daemon lazily inside `ddmd run` (`sim.demo` inside
`ddmd demo`). Imported by `cli.main` only when one of these commands runs. No protocol code.
Errors become one line on stderr and an exit code, from the one table of every command
(`cli.exits`'s docstring, docs/cli.md's "Exit codes"):

    0  success; also SIGTERM ending `run`/`demo`
    1  failure while running (a port in use, a VM or daemon problem)
    2  bad configuration (every problem of the file is listed, one a line), or a usage error
       (click's own code for those)
    4  a ddmd is already running for this control address (`ddmd.instance`); nothing was
       started
    130  Ctrl-C (SIGINT) ended it, after the daemon's graceful stop, as a shell reports it

The signals are this module's: the daemon (or the demo) runs without its own handlers
(``install_signal_handlers=False``), and SIGINT or SIGTERM asks it to stop (`Started.stop`,
its graceful shutdown) and is remembered for the exit code.
"""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from ddmd import instance
from ddmd.cli.api import config_option
from ddmd.cli.main import (
    EXIT_ALREADY_RUNNING,
    EXIT_CONFIG,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
)
from ddmd.config import LOG_LEVELS, Config, find_config_file, load_config
from ddmd.errors import ConfigError, DdmdError
from ddmd.logs import FORMATS, Event, configure, get_logger
from ddmd.netaddr import host_port

__all__ = ["check_config", "demo", "run"]

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


@click.command("check-config", short_help="Check a config file and show the ports it sets.")
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


@click.command("run", short_help="Run the daemon in the foreground until Ctrl-C or SIGTERM.")
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

    stopped_by: list[int] = []
    try:
        try:
            trio.run(_until_signal, main_function, config, stopped_by)
        except BaseExceptionGroup as group:
            raise _alone(group) from None
    except KeyboardInterrupt:  # before the signals were this module's (or a second one)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
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
    if signal.SIGINT in stopped_by:
        raise click.exceptions.Exit(EXIT_INTERRUPTED)


def _alone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside (nested) groups of one when it is one this module words
    (a DdmdError, a click exit or usage error, Ctrl-C), else the group itself (a bug shows
    whole)."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    worded = (DdmdError, click.ClickException, click.exceptions.Exit, KeyboardInterrupt)
    return inner if isinstance(inner, worded) else group


async def _until_signal(entry: Callable[..., Any], config: Config, stopped_by: list[int]) -> None:
    """Run ``entry(config)`` (the daemon, or the demo) with this command's own SIGINT/SIGTERM
    watcher: each signal asks it to stop (``Started.stop``: the daemon's graceful shutdown)
    and is appended to `stopped_by`; returns when `entry` returns."""
    import trio

    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def serve(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
                await entry(config, install_signal_handlers=False, task_status=task_status)
                nursery.cancel_scope.cancel()  # it stopped: no more signals to watch

            started = await nursery.start(serve)
            async for signum in signals:
                stopped_by.append(signum)
                log.info(Event.DAEMON_SIGNAL, signal=signal.Signals(signum).name)
                started.stop()


@click.command("demo", short_help="Run the daemon with three simulated VMs, no device needed.")
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
