"""Client commands of the `ddmd` CLI over the control API: clients, devices, threads, heap, gc,
select, stack; and the plumbing every client command shares (the daemon's address, one httpx
client per command, API errors turned into one line and an exit code). `ddmd ports` and
`ddmd events` live in `cli.ports` and `cli.events` and use this plumbing.

Layer: imports config, errors, netaddr and `cli.format`, and httpx/trio lazily so that
`ddmd --version` stays light; `cli.main` registers the commands on its group. No protocol
code: everything comes from the daemon's JSON.

Every command takes `--config FILE` (where to read `[control] host/port/token/socket`),
`--control HOST:PORT` (overrides the address) and `--device SERIAL` (narrows pid/name targets to
one adb device). `--json` prints the API's JSON unchanged. Without `--control`, the daemon's unix
socket (`[control] socket`) is used when it exists, or when `[control] tcp = false`; otherwise
TCP. A command about one VM takes TARGET, or without it the current VM (`vm_of`), as adb
takes its only device.

Exit codes: one table for every `ddmd` command (the README's "Exit codes"; each command and
situation is checked by tests/control/test_exit_codes.py), whatever the output format:

    0  done; also an empty list, a GC the VM did not confirm, and Ctrl-C ending --watch,
       `events` or `logcat` (and the daemon stopping during `events`)
    1  the VM or the daemon refused, or could not do it: the feature is not available for this
       VM (`threads`, `heap` and `allocs --status` too, though they print the reason as their
       answer), the VM went away, no answer in time, a bad token; or a file could not be read
       or written (`hprof-summary`, `trace-report`, a download, hprof-conv)
    2  the command line names nothing usable: usage errors and bad option values, an unknown or
       ambiguous TARGET, THREAD, APP or --device (the candidates follow, one per line), no
       TARGET while no VM is current, a bad config file
    3  no daemon is answering at the control address
    4  `run`/`demo` only: a ddmd already runs for this control address (`cli.main`)

Why this split: it is the table this module always had (the most commands), click's own 2 for
usage errors, and `cli.main`'s 4; "not available" joins the other refusals (a script that asks
for threads learns that it got none), and a file that cannot be read is work that failed (1),
while an `-o` into a missing directory is refused with the command line, before any work (2).

Test seam: `make_transport()` returns the httpx transport every command uses (None = the
network); tests replace it to route the commands to an in-process app.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote

import click

from ddmd.cli.format import (
    adb_off_message,
    format_clients,
    format_devices,
    format_select,
    format_threads,
    print_json,
    show,
)
from ddmd.cli.jvm import format_gc_any, format_heap_any, format_stack_any, format_stacks, stacks_of
from ddmd.config import find_config_file, load_config
from ddmd.errors import ConfigError
from ddmd.netaddr import connectable, host_port

if TYPE_CHECKING:
    import httpx

__all__ = [
    "EXIT_API_ERROR",
    "EXIT_CONFIG",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_TARGET",
    "NO_CURRENT_VM",
    "VM_COMMANDS",
    "Api",
    "DaemonAddress",
    "Failure",
    "app_name",
    "clients",
    "config_option",
    "current_vm",
    "daemon_address",
    "devices",
    "fail",
    "gc",
    "heap",
    "make_transport",
    "run_with_api",
    "select",
    "stack",
    "threads",
    "vm_of",
]

EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_TARGET = 2
EXIT_CONFIG = 2
EXIT_NO_DAEMON = 3

#: Seconds; connect covers "is a daemon there at all", read the daemon's own work.
CONNECT_TIMEOUT = 2.0
READ_TIMEOUT = 10.0
SEGMENTS_READ_TIMEOUT = 30.0  # a heap dump: enable HPSG, GC, wait for every segment

API = "/api/v1"

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def make_transport() -> httpx.AsyncBaseTransport | None:
    """The transport for every control API request; None means the real network.

    Tests replace this function (e.g. with one returning ``httpx.ASGITransport(app)``).
    """
    return None


# --------------------------------------------------------------------------------------------------
# Failures and the control address


class Failure(Exception):
    """Ends a command with one line on stderr (then `details`, one per line) and an exit code."""

    def __init__(self, message: str, code: int, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = tuple(details)


def fail(command: str, message: str, code: int, details: Sequence[str] = ()) -> NoReturn:
    click.echo(f"ddmd {command}: {' '.join(message.split())}", err=True)
    for detail in details:
        click.echo(f"  {' '.join(detail.split())}", err=True)
    raise click.exceptions.Exit(code)


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
        fail(command, str(err), EXIT_CONFIG)
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
                raise Failure(message, EXIT_TARGET)
            message += ":" if response.status_code == 409 else "; candidates:"
            raise Failure(message, EXIT_TARGET, candidates)
        if response.status_code == 401:
            message += TOKEN_HINT
        raise Failure(message, EXIT_API_ERROR)


def run_with_api(command: str, target: DaemonAddress, work: Callable[[Api], Awaitable[T]]) -> T:
    """Run `work` under trio with a client for `target`; failures become one line + exit code."""
    import httpx
    import trio

    async def main() -> T:
        headers = {"Accept": "application/json"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        transport = make_transport()
        if transport is None and target.uds is not None:
            transport = httpx.AsyncHTTPTransport(uds=target.uds)
        async with httpx.AsyncClient(
            base_url=target.base_url,
            transport=transport,
            headers=headers,
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
            trust_env=False,  # never send loopback requests through an HTTP(S)_PROXY
        ) as client:
            return await work(Api(client, target))

    try:
        return trio.run(main)
    except Failure as failure:
        fail(command, failure.message, failure.code, failure.details)


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
        raise Failure(NO_CURRENT_VM, EXIT_TARGET)
    vm = _vm_in(body, "the current VM")
    device = api.address.device
    if device and vm.get("device") != device:
        raise Failure(
            f"the current VM ({vm.get('name') or vm['id']}) is not on device {device}: "
            "give a TARGET",
            EXIT_TARGET,
        )
    return vm


async def vm_of(api: Api, target: str | None) -> dict[str, Any]:
    """The VM's JSON: TARGET's (``GET /api/v1/vms/TARGET``), or the current VM's without one."""
    if target is None:
        return await current_vm(api)
    return _vm_in(await api.call("GET", api.vm_path(target)), repr(target))


async def _vm_id(api: Api, target: str | None) -> str:
    """TARGET as the API takes it, or the current VM's id without one."""
    return target if target is not None else str((await current_vm(api))["id"])


def no_current_line(port: object) -> str:
    """What `ddmd clients` (and `ddmd demo`, and the web page) say while VMs are known and none
    is current: a debugger on the current-VM port would be turned away."""
    where = f"port {port}" if port is not None else "the current-VM port"
    return f"{where}: no current VM \u2014 'ddmd select TARGET'"


def _lacks(vm: Mapping[str, Any], *features: str) -> bool:
    """Whether the daemon says this VM lacks every way to give one of these (`missing`)."""
    missing = vm.get("missing") or {}
    return vm.get("ddm") is False or any(feature in missing for feature in features)


# --------------------------------------------------------------------------------------------------
# Commands


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


@click.command("clients", short_help="List the VMs the daemon knows, with their debugger ports.")
@json_option
@client_options
def clients(
    as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """List the VMs the daemon knows, and say when none is current (port 8700 would turn a
    debugger away)."""
    target = daemon_address("clients", config_file, control, None)

    async def work(api: Api) -> tuple[Any, Any]:
        listed = await api.call("GET", f"{API}/vms")
        known = [vm for vm in listed if isinstance(vm, dict)] if isinstance(listed, list) else []
        none_current = bool(known) and not any(vm.get("current") for vm in known)
        # The port as the daemon bound it (its health answer), for the "no current VM" line.
        health = await api.call("GET", f"{API}/health") if none_current and not as_json else None
        return listed, health

    vms, health = run_with_api("clients", target, work)
    if device:
        vms = [vm for vm in vms if vm.get("device") == device]
    show(vms, as_json, format_clients)
    if health is not None:
        port = health.get("current_port") if isinstance(health, dict) else None
        click.echo(no_current_line(port if port is not None else target.current_port))


@click.command("devices", short_help="List the Android devices and emulators seen through adb.")
@json_option
@client_options
def devices(
    as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """List the Android devices and emulators the daemon sees through adb."""
    target = daemon_address("devices", config_file, control, None)

    async def work(api: Api) -> tuple[Any, Any]:
        found = await api.call("GET", f"{API}/devices")
        # No devices: the health answer tells whether adb is turned off, and where.
        health = None if found or as_json else await api.call("GET", f"{API}/health")
        return found, health

    listed, health = run_with_api("devices", target, work)
    if device:
        listed = [d for d in listed if d.get("serial") == device]
    if as_json:
        print_json(listed)
        return
    off = None if listed else (adb_off_message(health) or _no_devices_message(health))
    click.echo(off if off is not None else format_devices(listed))


def _no_devices_message(health: Any) -> str | None:
    """Why the device list is empty, from the health answer's ``adb: {server, connected}``
    (None when the daemon does not say: `format_devices` words it then)."""
    adb = health.get("adb") if isinstance(health, dict) else None
    if not isinstance(adb, dict) or not isinstance(adb.get("connected"), bool):
        return None
    server = adb.get("server") or "?"
    if adb["connected"]:
        return f"the adb server at {server} has no devices (plug one in, or start an emulator)"
    return (
        f"no Android devices: no adb server answers at {server} (the daemon keeps trying; "
        "see adb.* events in its log for how to start one)"
    )


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def app_name(vm: Mapping[str, Any]) -> str | None:
    """The name a VM's app is known by across restarts: its package, else its app name."""
    for name in (vm.get("package"), vm.get("app")):
        if name and not str(name).startswith("<"):
            return str(name)
    return None


async def _app_again(
    api: Api,
    vm: dict[str, Any],
    failure: Failure,
    interval: float,
    note: Callable[[str], None],
) -> dict[str, Any]:
    """After `failure` of a request about `vm`: the VM its app runs in now (same device, same
    name). `failure` is raised again when `vm` is still there (it was about something else) or
    has no name to follow; while the app is not running, the list is asked every `interval`.
    """
    import trio

    name = app_name(vm)
    if name is None:
        raise failure
    waiting = False
    while True:
        listed = await api.call("GET", f"{API}/vms")
        found = [
            other
            for other in (listed if isinstance(listed, list) else [])
            if isinstance(other, dict)
            and other.get("device") == vm.get("device")
            and app_name(other) == name
        ]
        if any(other.get("id") == vm["id"] for other in found):
            raise failure
        if found:
            again = found[-1]
            note(f"{name} restarted (pid {vm.get('pid')} \u2192 {again.get('pid')})")
            return again
        if not waiting:
            note(f"waiting for {name} to start again")
            waiting = True
        await trio.sleep(interval)


@click.command("threads", short_help="Show a VM's threads and their states (--watch: live).")
@target_argument
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=0.5,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@json_option
@client_options
def threads(
    target: str | None,
    watch: bool,
    interval: float,
    count: int | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show the threads of the VM TARGET (id, pid, port, app or package name; without it, the
    current VM).

    With --watch, an app that dies is waited for and followed into its next process. A VM
    that does not report threads (Android 12+) says why, and the exit status is 1.
    """
    where = daemon_address("threads", config_file, control, device)
    tty = _is_tty()
    last_note = ""
    unavailable = False

    def note(text: str) -> None:
        """A line about the app watched (restarted, waiting); kept in a redrawn header."""
        nonlocal last_note
        last_note = f" -- {text}"
        click.echo(text, err=as_json)

    def show(body: Any, frame: int) -> None:
        if as_json:
            print_json(body, compact=watch)
            return
        text = format_threads(body)
        if watch and tty:
            stamp = time.strftime("%H:%M:%S")
            click.echo(
                f"\x1b[H\x1b[2Jevery {interval:g} s, {stamp}  (Ctrl-C to stop){last_note}\n{text}"
            )
        elif watch:
            # A pipe or a file: no terminal codes; a time line before each table instead.
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            click.echo(("\n" if frame else "") + f"--- {stamp} ---\n{text}")
        else:
            click.echo(text)

    async def work(api: Api) -> None:
        import trio

        nonlocal unavailable
        frame = 0
        path = api.vm_path(await _vm_id(api, target), "/threads")
        vm: dict[str, Any] | None = None  # the VM watched (--watch follows its app by name)
        while True:
            try:
                body = await api.call("GET", path)
            except Failure as failure:
                if vm is None or not watch:
                    raise
                vm = await _app_again(api, vm, failure, interval, note)
                path = api.vm_path(vm["id"], "/threads")
                continue
            if isinstance(body, dict) and isinstance(body.get("vm"), dict):
                vm = body["vm"]
                path = api.vm_path(body["vm"]["id"], "/threads")
            show(body, frame)
            frame += 1
            if vm is not None and body.get("threads") is None and _lacks(vm, "THST", "THEN"):
                unavailable = True  # said once: watching would only say it again
                return
            if not watch or (count is not None and frame >= count):
                return
            await trio.sleep(interval)

    try:
        run_with_api("threads", where, work)
    except KeyboardInterrupt:
        if not watch:
            raise
        raise click.exceptions.Exit(EXIT_OK) from None
    if unavailable:
        raise click.exceptions.Exit(EXIT_API_ERROR)


@click.command("heap", short_help="Show a VM's heap sizes and heap segment summaries.")
@target_argument
@click.option(
    "--segments",
    is_flag=True,
    help="Ask for a fresh heap segment dump (runs a GC) and show its layout.",
)
@json_option
@client_options
def heap(
    target: str | None,
    segments: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show heap sizes of the VM TARGET (or the current VM), and heap segment summaries once a
    dump exists. A VM that reports no heap information says why (exit status 1)."""
    where = daemon_address("heap", config_file, control, device)

    async def work(api: Api) -> Any:
        path = api.vm_path(await _vm_id(api, target), "/heap")
        if segments:
            return await api.call(
                "GET", path, params={"segments": "1"}, read_timeout=SEGMENTS_READ_TIMEOUT
            )
        return await api.call("GET", path)

    body = run_with_api("heap", where, work)
    show(body, as_json, format_heap_any)  # a plain JVM: GC.heap_info's figures (cli.jvm)
    vm = body.get("vm") if isinstance(body, dict) else None
    nothing = not body.get("heaps") and not body.get("images") and "jvm_heap" not in body
    if isinstance(vm, dict) and nothing and _lacks(vm, "HPIF"):
        raise click.exceptions.Exit(EXIT_API_ERROR)  # not available: said above, exit 1


@click.command("gc", short_help="Ask a VM to run a garbage collection.")
@target_argument
@json_option
@client_options
def gc(
    target: str | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Ask the VM TARGET (or the current VM) to run a garbage collection."""
    where = daemon_address("gc", config_file, control, device)

    async def work(api: Api) -> Any:
        return await api.call("POST", api.vm_path(await _vm_id(api, target), "/gc"))

    body = run_with_api("gc", where, work)
    show(body, as_json, format_gc_any)


@click.command("select", short_help="Make a VM current: debuggers on port 8700 reach it.")
@click.argument("target")
@json_option
@client_options
def select(
    target: str, as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """Make the VM TARGET current: debuggers on the current-VM port (8700) reach it.

    The choice sticks to the app: when it restarts with a new pid, 8700 follows it.
    """
    where = daemon_address("select", config_file, control, device)

    async def work(api: Api) -> Any:
        return await api.call("POST", api.vm_path(target, "/select"))

    body = run_with_api("select", where, work)
    show(body, as_json, format_select)


@click.command("stack", short_help="Show a VM's stacks: every thread (like jstack) or one.")
@click.argument("words", nargs=-1, metavar="[TARGET] [THREAD]")
@json_option
@client_options
def stack(
    words: tuple[str, ...],
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show the stack trace of THREAD (a thread id or name from 'ddmd threads') in the VM
    TARGET, or in the current VM without TARGET. A name may be a unique part of one ('ddmd
    stack mail main'). Without THREAD, every thread's stack, like jstack (TARGET alone: a word
    that names no VM is a THREAD of the current VM). A plain JVM's come from its thread dump
    (the HotSpot attach API); a VM without stack traces (Android 12+) says so."""
    if len(words) > 2:
        raise click.UsageError(f"give [TARGET] [THREAD], not {len(words)} words (quote a name)")
    where = daemon_address("stack", config_file, control, device)
    if len(words) < 2:  # every thread's stack (cli.jvm), unless the word names no VM
        every = run_with_api("stack", where, lambda api: stacks_of(api, words, current_vm))
        if every is not None:
            show(every, as_json, format_stacks)
            return
    target, thread = (None, words[0]) if len(words) == 1 else words

    async def work(api: Api) -> Any:
        vm_id = await _vm_id(api, target)
        if not thread.strip().isdigit():
            # A name is looked up in the thread list: ask for it now, so that a VM that has
            # none (no thread handlers) is known as such and says so once, in its words.
            await api.call("GET", api.vm_path(vm_id, "/threads"))
        return await api.call("GET", api.vm_path(vm_id, f"/threads/{quote(thread, safe='')}/stack"))

    body = run_with_api("stack", where, work)
    show(body, as_json, format_stack_any)


#: The commands of this module, in the order `ddmd --help` and the tests list them.
VM_COMMANDS: list[click.Command] = [clients, devices, threads, heap, gc, select, stack]
