"""Client commands of the `ddmd` CLI over the control API: clients, devices, threads, heap, gc,
select, stack; and `run_with_api`, which every client command runs its work with (one httpx
client per command, API errors turned into one line and an exit code). `ddmd ports`,
`ddmd events`, `ddmd logcat` and the DDMS commands live in their own modules and use it.

The shared plumbing (the daemon's address, `Api`, TARGET or the current VM, the options) is in
`cli.api` and the exit-code table in `cli.exits`; both are re-exported here, where the other
modules and the tests import them from.

Layer: imports `cli.api`, `cli.exits`, `cli.format` and `cli.jvm`, and httpx/trio lazily so that
`ddmd --version` stays light; `cli.main` registers the commands on its group. No protocol code:
everything comes from the daemon's JSON.

Every command takes `--config FILE` (where to read `[control] host/port/token/socket`),
`--control HOST:PORT` (overrides the address) and `--device SERIAL` (narrows pid/name targets to
one adb device). `--json` prints the API's JSON unchanged. A command about one VM takes TARGET,
or without it the current VM, as adb takes its only device. Exit codes: `cli.exits`.

Test seam: `make_transport()` returns the httpx transport every command uses (None = the
network); tests replace it to route the commands to an in-process app.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import click

from ddmd.cli.api import (
    API,
    CONNECT_TIMEOUT,
    NO_CURRENT_VM,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    DaemonAddress,
    Failure,
    client_options,
    config_option,
    current_vm,
    daemon_address,
    error_json,
    fail,
    json_option,
    json_wanted,
    no_daemon,
    not_available,
    target_argument,
    target_id,
    vm_of,
)
from ddmd.cli.exits import EXIT_API_ERROR, EXIT_CONFIG, EXIT_NO_DAEMON, EXIT_OK, EXIT_TARGET
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

if TYPE_CHECKING:
    import httpx

__all__ = [
    "API",
    "CONNECT_TIMEOUT",
    "EXIT_API_ERROR",
    "EXIT_CONFIG",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_TARGET",
    "NO_CURRENT_VM",
    "READ_TIMEOUT",
    "TOKEN_HINT",
    "VM_COMMANDS",
    "Api",
    "DaemonAddress",
    "Failure",
    "app_name",
    "client_options",
    "clients",
    "config_option",
    "current_vm",
    "daemon_address",
    "devices",
    "error_json",
    "fail",
    "gc",
    "heap",
    "json_option",
    "json_wanted",
    "make_transport",
    "no_daemon",
    "not_available",
    "run_with_api",
    "select",
    "stack",
    "target_argument",
    "threads",
    "vm_of",
]

SEGMENTS_READ_TIMEOUT = 30.0  # seconds; a heap dump: enable HPSG, GC, wait for every segment

T = TypeVar("T")


def make_transport() -> httpx.AsyncBaseTransport | None:
    """The transport for every control API request; None means the real network.

    Tests replace this function (e.g. with one returning ``httpx.ASGITransport(app)``).
    """
    return None


def run_with_api(command: str, target: DaemonAddress, work: Callable[[Api], Awaitable[T]]) -> T:
    """Run `work` under trio with a client for `target`; failures become one line + exit code."""
    import httpx
    import trio

    async def main() -> T:
        headers = {"Accept": "application/json"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        transport = make_transport()
        if transport is None:
            # Plain HTTP only (base_url is http://, loopback or the unix socket): no TLS, so
            # no CA bundle to load (httpx's default verify=True costs ~60 ms at every start).
            transport = httpx.AsyncHTTPTransport(uds=target.uds, verify=False)
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
        fail(command, failure.message, failure.code, failure.details, failure.kind)


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


@click.command("clients", short_help="List the VMs the daemon knows, with their debugger ports.")
@click.option("-v", "--verbose", is_flag=True, help="More detail (units, runs, full names).")
@json_option
@client_options
def clients(
    verbose: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
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
    show(vms, as_json, functools.partial(format_clients, verbose=verbose))
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
@click.option("-v", "--verbose", is_flag=True, help="More detail (units, runs, full names).")
@json_option
@client_options
def threads(
    target: str | None,
    watch: bool,
    interval: float,
    count: int | None,
    verbose: bool,
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
    unavailable = ""  # the sentence saying why the VM reports no threads

    def note(text: str) -> None:
        """A line about the app watched (restarted, waiting); kept in a redrawn header."""
        nonlocal last_note
        last_note = f" -- {text}"
        click.echo(text, err=as_json)

    def show(body: Any, frame: int) -> None:
        if as_json:
            print_json(body, compact=watch)
            return
        text = format_threads(body, verbose=verbose)
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
        path = api.vm_path(await target_id(api, target), "/threads")
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
            if vm is not None and body.get("threads") is None and _lacks(vm, "THST", "THEN"):
                # Said once (watching would only say it again); with --json as an error.
                unavailable = format_threads(body)
                if not as_json:
                    click.echo(unavailable)
                return
            show(body, frame)
            frame += 1
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
        not_available("threads", unavailable)


@click.command("heap", short_help="Show a VM's heap sizes and heap segment summaries.")
@target_argument
@click.option(
    "--segments",
    is_flag=True,
    help="Ask for a fresh heap segment dump (runs a GC) and show its layout.",
)
@click.option("-v", "--verbose", is_flag=True, help="More detail (units, runs, full names).")
@json_option
@client_options
def heap(
    target: str | None,
    segments: bool,
    verbose: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show heap sizes of the VM TARGET (or the current VM), and heap segment summaries once a
    dump exists. A VM that reports no heap information says why (exit status 1)."""
    where = daemon_address("heap", config_file, control, device)

    async def work(api: Api) -> Any:
        path = api.vm_path(await target_id(api, target), "/heap")
        if segments:
            return await api.call(
                "GET", path, params={"segments": "1"}, read_timeout=SEGMENTS_READ_TIMEOUT
            )
        return await api.call("GET", path)

    body = run_with_api("heap", where, work)
    vm = body.get("vm") if isinstance(body, dict) else None
    nothing = not body.get("heaps") and not body.get("images") and "jvm_heap" not in body
    if isinstance(vm, dict) and nothing and _lacks(vm, "HPIF"):
        said = format_heap_any(body, verbose=verbose)
        if not as_json:
            click.echo(said)
        not_available("heap", said)  # exit 1; with --json the error's shape
    # A plain JVM: GC.heap_info's figures (cli.jvm).
    show(body, as_json, functools.partial(format_heap_any, verbose=verbose))


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
        return await api.call("POST", api.vm_path(await target_id(api, target), "/gc"))

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
        vm_id = await target_id(api, target)
        if not thread.strip().isdigit():
            # A name is looked up in the thread list: ask for it now, so that a VM that has
            # none (no thread handlers) is known as such and says so once, in its words.
            await api.call("GET", api.vm_path(vm_id, "/threads"))
        return await api.call("GET", api.vm_path(vm_id, f"/threads/{quote(thread, safe='')}/stack"))

    body = run_with_api("stack", where, work)
    show(body, as_json, format_stack_any)


#: The commands of this module, in the order `ddmd --help` and the tests list them.
VM_COMMANDS: list[click.Command] = [clients, devices, threads, heap, gc, select, stack]
