"""The plumbing every client command shares, under the `cli.client` commands: failures turned
into one line and an exit code (`Failure`, `fail`), the daemon's address from the config file
and `--control` (`DaemonAddress`, `daemon_address`), the control API client (`Api`: decoded JSON
or a Failure), TARGET or the current VM (`current_vm`, `vm_of`), and the options every client
command takes (`config_option`, `client_options`, `json_option`, `target_argument`).

Without `--control`, the daemon's unix socket (`[control] socket`) is used when it exists, or
when `[control] tcp = false`; otherwise TCP. A command about one VM takes TARGET, or without it
the current VM (`vm_of`), as adb takes its only device.

Layer: imports config, errors, netaddr and `cli.exits`; httpx lazily (so that `ddmd --version`
stays light). `cli.client` re-exports these names and runs the work (`run_with_api`, with its
test seam `make_transport`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote

import click

from ddmd.cli.exits import EXIT_API_ERROR, EXIT_CONFIG, EXIT_NO_DAEMON, EXIT_TARGET
from ddmd.config import find_config_file, load_config
from ddmd.errors import ConfigError
from ddmd.netaddr import connectable, host_port

if TYPE_CHECKING:
    import httpx

__all__ = [
    "API",
    "CONNECT_TIMEOUT",
    "ERROR_KINDS",
    "NO_CURRENT_VM",
    "READ_TIMEOUT",
    "TOKEN_HINT",
    "Api",
    "DaemonAddress",
    "Failure",
    "client_options",
    "config_option",
    "current_vm",
    "daemon_address",
    "error_json",
    "fail",
    "json_option",
    "json_wanted",
    "no_daemon",
    "not_available",
    "target_argument",
    "target_id",
    "vm_of",
]

#: Seconds; connect covers "is a daemon there at all", read the daemon's own work.
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 10.0

API = "/api/v1"

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------------------------------
# Failures and the control address


#: The ``kind`` of an error with ``--json`` (docs/cli.md's "Errors with --json"), by exit code
#: when the failure does not name one: "target" (an unknown or ambiguous TARGET, THREAD, APP or
#: --device, or no TARGET while no VM is current; exit 2, with the candidates), "usage" (the
#: command line asks for something unusable, exit 2), "config" (a bad config file, exit 2),
#: "not-available" (the VM lacks the feature, exit 1), "failed" (anything else that went
#: wrong: the VM went away, no answer in time, a refusal, a file; exit 1), "no-daemon" (exit 3).
ERROR_KINDS = ("target", "usage", "config", "not-available", "failed", "no-daemon")
_KIND_OF_CODE = {EXIT_API_ERROR: "failed", EXIT_TARGET: "usage", EXIT_NO_DAEMON: "no-daemon"}


class Failure(Exception):
    """Ends a command with one line on stderr (then `details`, the candidates, one per line)
    and an exit code; with ``--json`` also `error_json` on stdout."""

    def __init__(
        self, message: str, code: int, details: Sequence[str] = (), kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = tuple(details)
        self.kind = kind


def error_json(kind: str, message: str, candidates: Sequence[str] = ()) -> dict[str, Any]:
    """The one shape of every error and "not available" with ``--json`` (on stdout)."""
    return {"error": {"kind": kind, "message": message, "candidates": list(candidates)}}


def json_wanted() -> bool:
    """Whether the command running was given ``--json`` (its ``as_json`` parameter)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("as_json"))


def fail(
    command: str,
    message: str,
    code: int,
    details: Sequence[str] = (),
    kind: str | None = None,
) -> NoReturn:
    """One line on stderr ("ddmd COMMAND: message", then the details indented) and exit
    `code`; with ``--json`` the error is also printed on stdout as `error_json` (`kind`: by
    default the exit code's, `ERROR_KINDS`)."""
    text = " ".join(message.split())
    lines = [" ".join(detail.split()) for detail in details]
    if json_wanted():
        body = error_json(kind or _KIND_OF_CODE.get(code, "failed"), text, lines)
        click.echo(json.dumps(body))  # one line: also in a stream of JSON lines
    click.echo(f"ddmd {command}: {text}", err=True)
    for line in lines:
        click.echo(f"  {line}", err=True)
    raise click.exceptions.Exit(code)


def not_available(command: str, message: str) -> NoReturn:
    """The VM lacks what was asked for: with ``--json`` the error (kind "not-available", on
    stdout and stderr), else the answer already printed said why; exit 1."""
    if json_wanted():
        fail(command, message, EXIT_API_ERROR, kind="not-available")
    raise click.exceptions.Exit(EXIT_API_ERROR)


def no_daemon(base: str) -> Failure:
    """The failure for "nothing answers at the control address"."""
    return Failure(
        f"no daemon is answering at {base} (start it with 'ddmd run', or pass --control HOST:PORT)",
        EXIT_NO_DAEMON,
    )


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


#: Added to a 401 answer's message.
TOKEN_HINT = " (set [control] token in the config file, or pass --config)"


def _no_candidates(body: dict[str, Any]) -> str:
    """What an empty candidate list means, for the error that came with it."""
    if "thread" in body:
        return "the VM has reported no threads"
    if "app" in body:
        return "no debugger ports are remembered"
    return "no VMs are known to the daemon"


@dataclass(frozen=True, slots=True)
class DaemonAddress:
    """Where the daemon is and how to talk to it."""

    base_url: str
    token: str
    device: str | None
    uds: str | None = None  # the daemon's unix socket, when the commands go through it
    # From the same config: where debuggers connect (a daemon's health answer says better).
    debugger_host: str = "127.0.0.1"
    current_port: int | None = None

    @property
    def shown(self) -> str:
        """Where the daemon is, for messages."""
        return self.base_url if self.uds is None else f"unix socket {self.uds}"


def _parse_control(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(
            f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8710 or [::1]:8710)",
            param_hint="'--control'",
        )
    return host, int(port)


def daemon_address(
    command: str, config_file: str | None, control: str | None, device: str | None
) -> DaemonAddress:
    try:
        config = load_config(find_config_file(config_file, os.environ), env=os.environ)
    except ConfigError as err:
        fail(command, str(err), EXIT_CONFIG, kind="config")
    host, port = config.control.host, config.control.port
    uds: str | None = None
    if control is not None:
        host, port = _parse_control(control)
    elif config.control.socket is not None:
        # The unix socket is the way in when it is there (or when TCP is off: then a missing
        # socket is named in the "no daemon" message).
        path = os.fspath(config.control.socket)
        if _is_socket(path) or not config.control.tcp:
            uds = path
    # Through the socket too: the Host header names loopback (the API's Host rule).
    base = f"http://{host_port(connectable(host), port)}"
    return DaemonAddress(
        base,
        config.control.token,
        device or None,
        uds,
        debugger_host=config.debugger.host,
        current_port=config.debugger.current_port,
    )


# --------------------------------------------------------------------------------------------------
# HTTP


class Api:
    """One httpx.AsyncClient for a command; every call returns decoded JSON or raises Failure."""

    def __init__(self, client: httpx.AsyncClient, address: DaemonAddress) -> None:
        self.client = client
        self.address = address

    @staticmethod
    def vm_path(target: str, suffix: str = "") -> str:
        return f"{API}/vms/{quote(target, safe='/')}{suffix}"

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | Sequence[str]] | None = None,
        read_timeout: float = READ_TIMEOUT,
    ) -> Any:
        import httpx

        query: dict[str, str | Sequence[str]] = dict(params or {})
        if self.address.device is not None:
            query["device"] = self.address.device
        base = self.address.shown
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=read_timeout)
        try:
            response = await self.client.request(method, path, params=query, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise no_daemon(base) from None
        except httpx.TimeoutException:
            raise Failure(
                f"the daemon at {base} did not answer within {read_timeout:g} s", EXIT_API_ERROR
            ) from None
        except httpx.TransportError as exc:
            raise Failure(
                f"talking to {base} failed: {type(exc).__name__}: {exc}", EXIT_API_ERROR
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise Failure(
                f"{base} did not answer like a ddmd daemon "
                f"(HTTP {response.status_code}, {response.headers.get('content-type', '?')})",
                EXIT_API_ERROR,
            ) from None
        if response.is_success:
            return body
        error = body.get("error") if isinstance(body, dict) else None
        message = str(error) if error else f"HTTP {response.status_code}"
        if response.status_code in (404, 409) and isinstance(body, dict) and "candidates" in body:
            candidates = [str(c) for c in body["candidates"] or []]
            if not candidates:
                # A message that ends in its own "(...)" already says why there are none
                # ("no device X (devices: ...)").
                if not message.endswith(")"):
                    message += f" ({_no_candidates(body)})"
                raise Failure(message, EXIT_TARGET, kind="target")
            message += ":" if response.status_code == 409 else "; candidates:"
            raise Failure(message, EXIT_TARGET, candidates, kind="target")
        if response.status_code == 401:
            message += TOKEN_HINT
        kind = "not-available" if response.status_code == 501 else "failed"
        raise Failure(message, EXIT_API_ERROR, kind=kind)


# --------------------------------------------------------------------------------------------------
# TARGET, or the current VM

#: What a command without TARGET says when no VM is current (exit 2).
NO_CURRENT_VM = (
    "no TARGET given and no VM is current: name one (see 'ddmd clients'), or make one "
    "current with 'ddmd select TARGET'"
)


def _vm_in(body: Any, what: str) -> dict[str, Any]:
    vm = body.get("vm") if isinstance(body, dict) else None
    if not isinstance(vm, dict) or not isinstance(vm.get("id"), str):
        raise Failure(f"the daemon's answer for {what} names no VM", EXIT_API_ERROR)
    return vm


async def current_vm(api: Api) -> dict[str, Any]:
    """The current VM's JSON (``GET /api/v1/current``), for a command whose TARGET was left
    out; exit 2 when no VM is current, or when it is not on the ``--device`` asked for."""
    body = await api.call("GET", f"{API}/current")
    if not isinstance(body, dict) or body.get("vm") is None:
        raise Failure(NO_CURRENT_VM, EXIT_TARGET, kind="target")
    vm = _vm_in(body, "the current VM")
    device = api.address.device
    if device and vm.get("device") != device:
        raise Failure(
            f"the current VM ({vm.get('name') or vm['id']}) is not on device {device}: "
            "give a TARGET",
            EXIT_TARGET,
            kind="target",
        )
    return vm


async def vm_of(api: Api, target: str | None) -> dict[str, Any]:
    """The VM's JSON: TARGET's (``GET /api/v1/vms/TARGET``), or the current VM's without one."""
    if target is None:
        return await current_vm(api)
    return _vm_in(await api.call("GET", api.vm_path(target)), repr(target))


async def target_id(api: Api, target: str | None) -> str:
    """TARGET as the API takes it, or the current VM's id without one."""
    return target if target is not None else str((await current_vm(api))["id"])


# --------------------------------------------------------------------------------------------------
# Options


#: ``--config FILE``: every command that reads the config file (client commands, run, demo).
config_option = click.option(
    "--config",
    "config_file",
    metavar="FILE",
    type=click.Path(path_type=str),
    default=None,
    help="Config file (default: $DDMD_CONFIG, then ~/.config/ddmd/config.toml, else built-in).",
)


def client_options(func: F) -> F:
    """--config, --control and --device, shared by every client command."""
    func = click.option(
        "--device",
        metavar="SERIAL",
        default=None,
        help="Only match VMs on this adb device (for pid and name targets).",
    )(func)
    func = click.option(
        "--control",
        metavar="HOST:PORT",
        default=None,
        help="Control API address of the daemon (default: [control] host/port of the config).",
    )(func)
    return config_option(func)


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
#: TARGET of a command about one VM: optional, the current VM without it.
target_argument = click.argument("target", required=False)
