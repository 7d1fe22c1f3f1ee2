"""`ddmd ports`: the debugger port each app gets, kept in the state file
(``GET``/``DELETE /api/v1/ports``; without a daemon, the file is read and edited here).

Layer: imports `cli.client` (address, httpx client, failures), `cli.format`, config and errors;
`ports` (the port book) lazily, for the no-daemon path.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import click

from ddmd.cli.client import (
    API,
    EXIT_API_ERROR,
    EXIT_CONFIG,
    EXIT_NO_DAEMON,
    EXIT_TARGET,
    Api,
    Failure,
    client_options,
    daemon_address,
    fail,
    json_option,
    run_with_api,
)
from ddmd.cli.format import forgotten_line, format_ports, print_json
from ddmd.config import find_config_file, load_config
from ddmd.errors import ConfigError

__all__ = ["ports"]


def _ports_from_file(
    config_file: str | None, forget: str | None, device: str | None, as_json: bool, base: str
) -> None:
    """`ddmd ports` without a daemon: the state file is read, and edited for --forget, here
    (atomically, as the daemon writes it). No VM is connected through ddmd then."""
    from ddmd.config import PortRange
    from ddmd.errors import TargetError
    from ddmd.portbook import PortBook

    try:
        config = load_config(find_config_file(config_file, os.environ), env=os.environ)
    except ConfigError as err:
        fail("ports", str(err), EXIT_CONFIG, kind="config")
    path = config.debugger.state_file
    # Every port, not only [debugger] ports: an edit here must not drop entries of another range.
    book = PortBook(path, PortRange(1, 65535))
    for problem in book.problems:
        click.echo(f"ddmd ports: {problem}", err=True)
    note = f"(no daemon answers at {base}: read from the file)"
    if forget is None:
        entries = [e for e in book.entries() if device is None or e.device == device]
        body: dict[str, Any] = {
            "path": str(path),
            "ports": [e.to_json(in_use=False) for e in entries],
        }
        if as_json:
            print_json(body)
        else:
            click.echo(format_ports(body, note=note))
        return
    try:
        entry = book.resolve(forget, device=device)
    except TargetError as exc:
        if not exc.candidates:
            fail(
                "ports",
                f"{exc.message} (no debugger ports are remembered)",
                EXIT_TARGET,
                kind="target",
            )
        suffix = ":" if exc.ambiguous else "; candidates:"
        fail("ports", exc.message + suffix, EXIT_TARGET, exc.candidates, kind="target")
    book.forget(entry.key)
    try:
        book.save()
    except OSError as exc:
        fail("ports", f"cannot write {path}: {exc}", EXIT_API_ERROR)
    body = {"forgotten": entry.to_json(in_use=False)}
    if as_json:
        print_json(body)
    else:
        click.echo(f"{forgotten_line(body['forgotten'])} (edited {path}: no daemon is running)")


@click.command("ports", short_help="List the remembered debugger ports, or forget one.")
@click.option(
    "--forget",
    metavar="APP",
    default=None,
    help="Forget the port of APP (app or package name, or DEVICE|NAME as listed); refused "
    "while its VM is connected.",
)
@json_option
@client_options
def ports(
    forget: str | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """List the debugger port each app gets (kept across restarts in the state file), when
    its VM was last seen, and whether it is connected now; or forget one app's port.

    The daemon drops entries not seen for [debugger] forget_after_days by itself. When no
    daemon answers, the state file is read (and, for --forget, edited) directly.
    """
    where = daemon_address("ports", config_file, control, device)

    async def work(api: Api) -> Any:
        try:
            if forget is None:
                return await api.call("GET", f"{API}/ports")
            return await api.call("DELETE", f"{API}/ports/{quote(forget.strip(), safe='')}")
        except Failure as failure:
            if failure.code == EXIT_NO_DAEMON:
                return None
            raise

    body = run_with_api("ports", where, work)
    if body is None:
        _ports_from_file(config_file, forget, device, as_json, where.shown)
        return
    if forget is None and device:
        body = {**body, "ports": [e for e in body.get("ports") or [] if e.get("device") == device]}
    if as_json:
        print_json(body)
    elif forget is None:
        click.echo(format_ports(body))
    else:
        click.echo(forgotten_line(body["forgotten"]))
