"""``ddmd demo``: the daemon plus three simulated VMs, for a first look without a device.

Layer: beside daemon (it wires the simulator and the daemon into one trio run). The simulated
VMs listen on free ports inside the configured scan range, so the daemon finds them exactly as
it finds real VMs: an ART-style app, a Dalvik-era app in the 2007 draft formats, and an
Android 12+-style app whose thread and heap handlers are gone (ddmd shows that plainly).
"""

from __future__ import annotations

import socket
from dataclasses import replace

import click
import trio

from ddmd import daemon
from ddmd.config import Config
from ddmd.sim import SimConfig, SimVm

DEMO_VMS = (
    SimConfig(pid=3101, app_name="com.example.mail", package_name="com.example.mail"),
    SimConfig(
        pid=3102,
        app_name="com.example.notes",
        package_name="com.example.notes",
        vm_ident="Dalvik v1.6.0",
        draft=True,
        abi="32-bit (arm)",
        apnm_delay=2.0,
    ),
    SimConfig(
        pid=3103,
        app_name="com.example.maps:remote",
        package_name="com.example.maps",
        flavor="modern",
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
        host, port = started.control
        click.echo(
            f"ddmd demo: {len(sims)} simulated VMs on {config.scan.host} ports "
            f"{', '.join(map(str, ports))}; control API http://{host}:{port}/",
            err=True,
        )
        click.echo(
            "try: ddmd clients | ddmd threads com.example.mail | ddmd heap com.example.mail "
            f"--segments | ddmd select com.example.mail && jdb -attach "
            f"localhost:{started.current_port}",
            err=True,
        )
