"""`ddmd attach [TARGET]`: how a debugger reaches a VM through ddmd -- the exact jdb command
line and IntelliJ IDEA's "Remote JVM Debug" settings for the VM's own debugger port -- and,
with ``--jdb``, jdb itself, attached.

Layer: imports `cli.client` (the daemon's address, the httpx client, failures, exit codes, the
current VM) and `cli.format`; no daemon code. Routes used: ``GET /api/v1/vms/TARGET`` (or
``GET /api/v1/current`` without TARGET) and ``GET /api/v1/health`` (the current-VM port as
bound). Exit codes are `cli.exits`' table: 0; 1 the VM has no debugger port, or jdb is not
installed; 2 TARGET (or no current VM), usage; 3 no daemon. With ``--jdb`` this process becomes
jdb (exec), so the exit status is jdb's.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any, NoReturn

import click

from ddmd.cli.client import (
    API,
    EXIT_API_ERROR,
    Api,
    client_options,
    daemon_address,
    fail,
    json_option,
    run_with_api,
    target_argument,
    vm_of,
)
from ddmd.cli.format import print_json, vm_label

__all__ = ["attach", "attach_lines", "debugger_host", "exec_program"]

#: What IntelliJ IDEA calls the run configuration and its mode.
STUDIO_CONFIGURATION = "Remote JVM Debug"
STUDIO_MODE = "Attach to remote JVM"

#: Binds a debugger on this computer reaches as "localhost": loopback, or every address.
_THIS_COMPUTER = frozenset({"127.0.0.1", "::1", "localhost", "0.0.0.0", "::", ""})


def debugger_host(configured: str) -> str:
    """The host a debugger on this computer names: "localhost" for a loopback or every-address
    bind (``[debugger] host``), else that host."""
    return "localhost" if configured in _THIS_COMPUTER else configured


def exec_program(path: str, argv: list[str]) -> NoReturn:
    """Replace this process with ``argv`` (the test seam for ``--jdb``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, argv)
    raise AssertionError("unreachable")  # pragma: no cover


def jdb_command(host: str, port: int) -> list[str]:
    return ["jdb", "-attach", f"{host}:{port}"]


def attach_lines(vm: dict[str, Any], host: str, port: int, current_port: int | None) -> list[str]:
    """What `ddmd attach` prints: the VM, the jdb line, IntelliJ IDEA's settings, where Android
    Studio goes instead (the adb front: README, "Share an app with Android Studio"), and how the
    current-VM port relates to this VM."""
    lines = [
        f"attach your debugger to {host}:{port} for {vm_label(vm)}",
        "",
        "jdb:",
        f"  {' '.join(jdb_command(host, port))}",
        "",
        f"IntelliJ IDEA: Run > Edit Configurations > + > {STUDIO_CONFIGURATION}",
        f"  Debugger mode:  {STUDIO_MODE}",
        f"  Host:           {host}",
        f"  Port:           {port}",
        "",
        "Android Studio: point its adb at ddmd's adb front instead, then Attach Debugger to",
        '  Android Process (docs/android-tools.md, "The adb front").',
    ]
    if current_port is not None and current_port != port:
        lines.append("")
        if vm.get("current"):
            lines.append(f"It is the current VM too: {host}:{current_port} reaches it as well.")
        else:
            lines.append(
                f"Port {current_port} leads to the current VM, not to this one "
                "('ddmd select TARGET' changes that)."
            )
    return lines


@click.command("attach", short_help="Show how jdb or an IDE attaches to a VM (--jdb: run jdb).")
@target_argument
@click.option("--jdb", "run_jdb", is_flag=True, help="Run jdb, attached to the VM.")
@json_option
@client_options
def attach(
    target: str | None,
    run_jdb: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show how a debugger attaches to the VM TARGET (or the current VM) through ddmd: the
    exact jdb command line, and IntelliJ IDEA's "Remote JVM Debug" settings (host, port,
    debugger mode "Attach to remote JVM") for the VM's own debugger port; Android Studio
    attaches through ddmd's adb front instead. With --jdb, run
    jdb attached to it (it must be on PATH; it comes with every JDK)."""
    where = daemon_address("attach", config_file, control, device)

    async def work(api: Api) -> tuple[dict[str, Any], Any]:
        vm = await vm_of(api, target)
        return vm, await api.call("GET", f"{API}/health")

    vm, health = run_with_api("attach", where, work)
    bound = health.get("current_port") if isinstance(health, dict) else None
    current_port = bound if isinstance(bound, int) else where.current_port
    host = debugger_host(where.debugger_host)
    port = vm.get("debugger_port")
    is_current = bool(vm.get("current")) or target is None  # without TARGET: the current VM
    if not isinstance(port, int):
        if is_current and current_port is not None:
            port = current_port  # no port of its own yet, but the current-VM port reaches it
        else:
            fail(
                "attach",
                f"{vm_label(vm)} has no debugger port of its own yet (its app is not named yet, "
                "or every [debugger] port is taken): make it current with 'ddmd select TARGET' "
                f"and attach to port {current_port}",
                EXIT_API_ERROR,
            )
    command = jdb_command(host, port)
    if run_jdb:
        program = shutil.which("jdb")
        if program is None:
            fail(
                "attach",
                "jdb is not installed (it comes with a JDK: 'apt install default-jdk-headless' "
                f"on Debian/Ubuntu); or attach another debugger to {host}:{port}",
                EXIT_API_ERROR,
            )
        click.echo(f"ddmd attach: running {' '.join(command)} for {vm_label(vm)}", err=True)
        exec_program(program, command)
    if as_json:
        print_json(
            {
                "vm": vm,
                "host": host,
                "port": port,
                "current_port": current_port,
                "jdb": command,
                "android_studio": {
                    "configuration": STUDIO_CONFIGURATION,
                    "debugger_mode": STUDIO_MODE,
                    "host": host,
                    "port": port,
                },
            }
        )
        return
    click.echo("\n".join(attach_lines({**vm, "current": is_current}, host, port, current_port)))
