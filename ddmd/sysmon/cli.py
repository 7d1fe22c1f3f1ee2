"""``ddmd sysmon``: run the system monitor (`SystemMonitor`) until Ctrl-C or SIGTERM; with
``--show``, print the figures the running daemon has from the monitors connected to it.

Without ``--port`` it listens on the first free port of ddmd's scan range (``[scan] ports`` of
the config file ``ddmd run`` would read; 8000-8040 by default), so a running ddmd finds it
within one scan interval.

Layer: a tool beside the daemon, like ``ddmd sim``: `ddmd.sysmon`, config and logs, and for
``--show`` the CLI's API client (`cli.client`, `cli.format`); registered lazily by
`ddmd.cli.main`.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

import click
import trio

from ddmd.cli.client import (
    API,
    EXIT_API_ERROR,
    Api,
    config_option,
    daemon_address,
    fail,
    run_with_api,
)
from ddmd.cli.format import print_json, size
from ddmd.config import LOG_LEVELS, Config, find_config_file, load_config
from ddmd.config.schema import is_loopback_host
from ddmd.errors import ConfigError
from ddmd.logs import FORMATS, configure
from ddmd.sysmon.client import APP_NAME, SystemMonitor
from ddmd.sysmon.proc import PROC

__all__ = ["first_free_port", "format_figures", "sysmon_command"]

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
@click.option(
    "--show",
    is_flag=True,
    help="Print the figures the running daemon has from its system monitors, then exit.",
)
@click.option("--json", "as_json", is_flag=True, help="With --show: print them as JSON.")
@click.option(
    "--control",
    metavar="HOST:PORT",
    default=None,
    help="With --show: the daemon's control API address (default: the config's).",
)
@config_option
def sysmon_command(
    port: int | None,
    interval: float,
    log_level: str | None,
    log_format: str | None,
    show: bool,
    as_json: bool,
    control: str | None,
    config_file: str | None,
) -> None:
    """Report this machine's load average, memory and per-CPU use to ddmd.

    A DDM client that is not a VM: it listens on a port of ddmd's scan range, and the running
    ddmd finds it as it finds a VM. It then sends one report every --interval seconds, and
    answers ddmd's request for a report at once. Runs until Ctrl-C or SIGTERM. With --show it
    prints the latest figures of every system monitor the running daemon knows, and exits.
    """
    if show:
        _show(config_file, control, as_json)
        return
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


# --------------------------------------------------------------------------------------------------
# --show


async def _monitors(api: Api) -> list[dict[str, Any]]:
    """Each system monitor the daemon lists: its VM JSON and what its handler published."""
    listed = await api.call("GET", f"{API}/vms")
    found: list[dict[str, Any]] = []
    for vm in listed if isinstance(listed, list) else []:
        if not isinstance(vm, dict) or vm.get("kind") != "system monitor":
            continue
        ext = await api.call("GET", api.vm_path(str(vm["id"]), "/ext"))
        values = ext.get("ext") if isinstance(ext, dict) else None
        found.extend(
            {"vm": vm, **value}
            for value in (values or {}).values()
            if isinstance(value, dict) and value.get("kind") == "system monitor"
        )
    return found


def _show(config_file: str | None, control: str | None, as_json: bool) -> None:
    where = daemon_address("sysmon", config_file, control, None)
    monitors = run_with_api("sysmon", where, _monitors)
    if as_json:
        print_json(
            [
                {"id": m["vm"]["id"], "pid": m["vm"].get("pid"), **_without(m, "vm")}
                for m in monitors
            ]
        )
        return
    if not monitors:
        fail(
            "sysmon",
            "the daemon knows no system monitor: start one with 'ddmd sysmon' (it is listed "
            "within one scan interval)",
            EXIT_API_ERROR,
        )
    click.echo("\n\n".join(format_figures(m["vm"], m.get("latest")) for m in monitors))


def _without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k != key}


def _share(part: object) -> str:
    return f"{100 * float(part):.0f} %" if isinstance(part, int | float) else "?"


def _kib(n: object) -> int | None:
    return int(n) * 1024 if isinstance(n, int) and not isinstance(n, bool) else None


def format_figures(vm: Mapping[str, Any], latest: object) -> str:
    """One monitor's latest report as the web page's card shows it: load, memory, swap, CPUs."""
    name = vm.get("name") or vm.get("app") or vm.get("id")
    head = f"{name} ({vm.get('id')}, pid {vm.get('pid')})"
    if not isinstance(latest, dict):
        return f"{head}: no report yet"
    stamp = latest.get("timestamp_ms")
    when = (
        time.strftime(" at %H:%M:%S", time.localtime(stamp / 1000))
        if isinstance(stamp, int | float) and stamp
        else ""
    )
    lines = [f"{head}, report{when}:"]
    loads = [f"{x:.2f}" for x in latest.get("load") or [] if isinstance(x, int | float)]
    lines.append(f"  load average  {' / '.join(loads) or '?'} (1 / 5 / 15 min)")
    total = _kib(latest.get("mem_total_kib"))
    available = _kib(latest.get("mem_available_kib"))
    if total:
        memory = f"{_share(latest.get('mem_used_share'))} used of {size(total)}"
        if available is not None:
            memory += f", {size(available)} available"
        lines.append(f"  memory        {memory}")
    swap_total, swap_free = _kib(latest.get("swap_total_kib")), _kib(latest.get("swap_free_kib"))
    if swap_total and swap_free is not None:
        lines.append(
            f"  swap          {_share(1 - swap_free / swap_total)} used of {size(swap_total)}"
        )
    elif swap_total == 0:
        lines.append("  swap          none")
    busy = latest.get("cpu_busy") or []
    cpus = " ".join("?" if b is None else f"{100 * b:.0f}%" for b in busy)
    period = latest.get("cpu_period_ms")
    over = f" (busy over {period / 1000:g} s)" if isinstance(period, int | float) else ""
    lines.append(f"  CPUs          {cpus or '?'}{over}")
    return "\n".join(lines)
