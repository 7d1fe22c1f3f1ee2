"""``ddmd sysmon``: run the system monitor (`SystemMonitor`) until Ctrl-C or SIGTERM.

Without ``--port`` it listens on the first free port of ddmd's scan range (``[scan] ports`` of
the config file ``ddmd run`` would read; 8000-8040 by default), so a running ddmd finds it
within one scan interval.

Layer: a tool beside the daemon, like ``ddmd sim``: `ddmd.sysmon`, config and logs; registered
lazily by `ddmd.cli.main`.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Iterable

import click
import trio

from ddmd.cli.client import config_option
from ddmd.config import LOG_LEVELS, Config, find_config_file, load_config
from ddmd.config.schema import is_loopback_host
from ddmd.errors import ConfigError
from ddmd.logs import FORMATS, configure
from ddmd.sysmon.client import APP_NAME, SystemMonitor
from ddmd.sysmon.proc import PROC

__all__ = ["first_free_port", "sysmon_command"]

EXIT_CONFIG = 2


def first_free_port(host: str, ports: Iterable[int]) -> int | None:
    """The first of ``ports`` nothing uses on ``host``, or None.

    The bind is tried without SO_REUSEADDR, so a port still held by a connection counts as used:
    a VM connected to ddmd has closed its listening socket but will listen on that port again.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                raise
            return port
    return None


async def _serve_until_signal(monitor: SystemMonitor) -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(monitor.serve)
        click.echo(
            f'ddmd sysmon: "{APP_NAME}" (pid {monitor.client.pid}) listening on '
            f"{monitor.client.host}:{port}; while ddmd is connected it reports load, memory and "
            f"CPU use every {monitor.interval:g} s. Ctrl-C stops it.",
            err=True,
        )
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


@click.command("sysmon", short_help="Report this machine's load, memory and CPU use to ddmd.")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port to listen on (default: the first free port of ddmd's scan range, 8000-8040).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05, max=3600),
    default=1.0,
    show_default=True,
    help="Seconds between reports while ddmd is connected.",
)
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Minimum log level; overrides [log] level.",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default=None,
    help="Log output; overrides [log] format. auto = console on a terminal, JSON otherwise.",
)
@config_option
def sysmon_command(
    port: int | None,
    interval: float,
    log_level: str | None,
    log_format: str | None,
    config_file: str | None,
) -> None:
    """Report this machine's load average, memory and per-CPU use to ddmd.

    A DDM client that is not a VM: it listens on a port of ddmd's scan range, and the running
    ddmd finds it as it finds a VM. It then sends one report every --interval seconds, and
    answers ddmd's request for a report at once. Runs until Ctrl-C or SIGTERM.
    """
    try:
        config = load_config(find_config_file(config_file, os.environ), env=os.environ)
    except ConfigError as err:
        for problem in err.problems:
            click.echo(f"ddmd sysmon: {' '.join(str(problem).split())}", err=True)
        raise click.exceptions.Exit(EXIT_CONFIG) from None
    configure(fmt=log_format or config.log.format, level=(log_level or config.log.level).lower())
    if not all(os.access(PROC / name, os.R_OK) for name in ("loadavg", "meminfo", "stat")):
        raise click.ClickException(
            f"cannot read {PROC}/loadavg, meminfo and stat: the system monitor needs Linux's /proc"
        )
    host, chosen = _where(config, port)
    monitor = SystemMonitor(port=chosen, host=host, interval=interval)
    failure: OSError | None = None
    try:
        trio.run(_serve_until_signal, monitor)
    except* OSError as group:
        failure = _first_leaf(group)
    if failure is not None:
        raise click.ClickException(
            f"cannot listen on {host}:{chosen}: {failure} (choose another port with --port)"
        )
    click.echo(
        f"ddmd sysmon: stopped after {monitor.reports_pushed} reports pushed and "
        f"{monitor.reports_answered} sent on request",
        err=True,
    )


def _where(config: Config, port: int | None) -> tuple[str, int]:
    """The host and port to listen on: ddmd's scan host (if it is loopback) and ``port``, or
    the first free port of the scan range."""
    scan = config.scan
    host = scan.host if is_loopback_host(scan.host) else "127.0.0.1"
    if port is not None:
        return host, port
    found = first_free_port(host, range(scan.ports.start, scan.ports.end + 1))
    if found is None:
        raise click.ClickException(
            f"every port of ddmd's scan range {scan.ports.start}-{scan.ports.end} on {host} is "
            "in use; give one with --port (and add it to [scan] ports)"
        )
    return host, found


def _first_leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
