"""``ddmd demo``: the daemon plus three simulated VMs, for a first look without a device.

Layer: imports daemon, config, errors and the simulator (`sim.config`, `sim.vm`): the one
module of `ddmd.sim` that knows the daemon, wiring both into one trio run. The simulated
VMs listen on free ports inside the configured scan range, so the daemon finds them exactly as
it finds real VMs: an app on ART 9+ (the sim's default flavour: requests with nothing to say
get no reply at all), a Dalvik-era app in the 2007 draft formats (empty replies), and an
Android 12+ app whose thread and heap handlers are gone (ddmd shows that plainly). All three
can be method-traced; the first two also give heap dumps and allocation lists, and the
Android 12+ app lacks those handlers, as a current phone does (`ddmd.sim.ddms`).
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import replace
from pathlib import Path

import click
import trio

from ddmd import daemon
from ddmd.config import Config, find_config_file
from ddmd.errors import ConfigError
from ddmd.sim.config import SimConfig
from ddmd.sim.vm import SimVm

MAIL = "com.example.mail"

DEMO_VMS = (
    # ART 9+ (flavor "art", the default)
    SimConfig(pid=3101, app_name=MAIL, package_name=MAIL),
    # Dalvik, speaking the 2007 draft formats
    SimConfig(
        pid=3102,
        app_name="com.example.notes",
        package_name="com.example.notes",
        vm_ident="Dalvik v1.6.0",
        flavor="legacy",
        draft=True,
        abi="32-bit (arm)",
        apnm_delay=2.0,
    ),
    SimConfig(
        pid=3103,
        app_name="com.example.maps:remote",
        package_name="com.example.maps",
        flavor="modern",  # Android 12+
        abi="64-bit (arm64)",
    ),
)


def free_scan_ports(config: Config, count: int) -> list[int]:
    """The first ``count`` ports of the scan range where nothing listens yet."""
    found: list[int] = []
    for port in config.scan.ports:
        with socket.socket() as probe:
            try:
                probe.bind((config.scan.host, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise click.ClickException(
        f"the scan range {config.scan.ports} has fewer than {count} free ports for the demo VMs; "
        "set [scan] ports in the config file to a range with free ports"
    )


async def run_demo(config: Config) -> None:
    ports = free_scan_ports(config, len(DEMO_VMS))
    sims = [
        SimVm(replace(c, host=config.scan.host, port=p))
        for c, p in zip(DEMO_VMS, ports, strict=True)
    ]
    async with trio.open_nursery() as nursery:
        for sim in sims:
            await nursery.start(sim.run)

        async def daemon_then_stop(
            task_status: trio.TaskStatus[daemon.Started] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            await daemon.run(config, task_status=task_status)
            # The daemon returns after SIGINT/SIGTERM; the simulated VMs go with it.
            nursery.cancel_scope.cancel()

        started: daemon.Started = await nursery.start(daemon_then_stop)
        if started.control is not None:
            control = "http://{}:{}/".format(*started.control)
        else:
            control = f"unix socket {started.control_socket}"
        click.echo(
            f"ddmd demo: {len(sims)} simulated VMs on {config.scan.host} ports "
            f"{', '.join(map(str, ports))}; control API {control}",
            err=True,
        )
        for line in hint_lines(config, started.current_port):
            click.echo(line, err=True)


def hint_lines(config: Config, current_port: int) -> list[str]:
    """What to try next: one command per line, ready to paste into a shell.

    The only other lines are comments starting with '#'. The client commands name the
    config file when they would not find the demo's one by themselves.
    """
    option = _config_option(config)
    return [
        "# In another terminal, try:",
        f"ddmd clients{option}",
        f"ddmd threads {MAIL}{option}",
        f"ddmd heap {MAIL}{option} --segments",
        f"ddmd stack {MAIL} 1{option}",
        f"ddmd gc {MAIL}{option}",
        f"ddmd attach {MAIL}{option}",
        # Three VMs and none selected: the current-VM port turns a debugger away until then.
        f"# port {current_port}: no current VM \u2014 'ddmd select TARGET', e.g.:",
        f"ddmd select {MAIL}{option}",
        f"jdb -attach localhost:{current_port}",
    ]


def _config_option(config: Config) -> str:
    """The ``--config FILE`` option (with a leading space) when the client commands would
    otherwise read another config file than the demo's, else ""."""
    source = config.source
    if source is None or source.startswith("<"):  # the built-in defaults
        return ""
    try:
        found = find_config_file(None, os.environ)
    except ConfigError:
        found = None
    path = Path(source).resolve()
    if found is not None and found.resolve() == path:
        return ""
    return f" --config {shlex.quote(str(path))}"
