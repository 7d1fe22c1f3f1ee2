"""Client commands of the `ddmd` CLI: clients, devices, threads, heap, gc, stack, ports,
events, over the control API (`ports` reads and edits the port book file itself when no daemon
answers).

Layer: beside `cli` (which registers `COMMANDS` on its group); imports config and errors, and
httpx/trio lazily so that `ddmd --version` stays light. No protocol code: everything comes from
the daemon's JSON.

Every command takes `--config FILE` (where to read `[control] host/port/token`), `--control
HOST:PORT` (overrides the address) and `--device SERIAL` (narrows pid/name targets to one adb
device). `--json` prints the API's JSON unchanged. Exit codes:

    0  success (also Ctrl-C during --watch or `events`, and the daemon stopping during `events`)
    1  the API answered with an error (VM gone, feature unsupported, timeout, bad token, ...)
    2  unknown or ambiguous TARGET, THREAD or APP (the candidates follow, one per line); bad
       config or usage
    3  no daemon is answering at the control address

Test seam: `make_transport()` returns the httpx transport every command uses (None = the
network); tests replace it to route the commands to an in-process app.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote

import click

from ddmd.config import find_config_file, load_config
from ddmd.errors import ConfigError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "COMMANDS",
    "EXIT_API_ERROR",
    "EXIT_CONFIG",
    "EXIT_NO_DAEMON",
    "EXIT_OK",
    "EXIT_TARGET",
    "clients",
    "devices",
    "events",
    "format_event",
    "gc",
    "heap",
    "make_transport",
    "ports",
    "stack",
    "threads",
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


class _Failure(Exception):
    """Ends a command with one line on stderr (then `details`, one per line) and an exit code."""

    def __init__(self, message: str, code: int, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = tuple(details)


def _fail(command: str, message: str, code: int, details: Sequence[str] = ()) -> NoReturn:
    click.echo(f"ddmd {command}: {' '.join(message.split())}", err=True)
    for detail in details:
        click.echo(f"  {' '.join(detail.split())}", err=True)
    raise click.exceptions.Exit(code)


def _no_candidates(body: dict[str, Any]) -> str:
    """What an empty candidate list means, for the error that came with it."""
    if "thread" in body:
        return "the VM has reported no threads"
    if "app" in body:
        return "no debugger ports are remembered"
    return "no VMs are known to the daemon"


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the daemon is and how to talk to it."""

    base_url: str
    token: str
    device: str | None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _connectable(host: str) -> str:
    """A daemon listening on every address is reached on loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _parse_control(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(
            f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8710 or [::1]:8710)",
            param_hint="'--control'",
        )
    return host, int(port)


def _target(
    command: str, config_file: str | None, control: str | None, device: str | None
) -> _Target:
    try:
        config = load_config(find_config_file(config_file, os.environ), env=os.environ)
    except ConfigError as err:
        _fail(command, str(err), EXIT_CONFIG)
    host, port = config.control.host, config.control.port
    if control is not None:
        host, port = _parse_control(control)
    base = f"http://{_url_host(_connectable(host))}:{port}"
    return _Target(base, config.control.token, device or None)


# --------------------------------------------------------------------------------------------------
# HTTP


class _Api:
    """One httpx.AsyncClient for a command; every call returns decoded JSON or raises _Failure."""

    def __init__(self, client: httpx.AsyncClient, target: _Target) -> None:
        self._client = client
        self._target = target

    @staticmethod
    def vm_path(target: str, suffix: str = "") -> str:
        return f"{API}/vms/{quote(target, safe='/')}{suffix}"

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        read_timeout: float = READ_TIMEOUT,
    ) -> Any:
        import httpx

        query = dict(params or {})
        if self._target.device is not None:
            query["device"] = self._target.device
        base = self._target.base_url
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=read_timeout)
        try:
            response = await self._client.request(method, path, params=query, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise _Failure(
                f"no daemon is answering at {base} "
                "(start it with 'ddmd run', or pass --control HOST:PORT)",
                EXIT_NO_DAEMON,
            ) from None
        except httpx.TimeoutException:
            raise _Failure(
                f"the daemon at {base} did not answer within {read_timeout:g} s", EXIT_API_ERROR
            ) from None
        except httpx.TransportError as exc:
            raise _Failure(
                f"talking to {base} failed: {type(exc).__name__}: {exc}", EXIT_API_ERROR
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise _Failure(
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
                raise _Failure(f"{message} ({_no_candidates(body)})", EXIT_TARGET)
            message += ":" if response.status_code == 409 else "; candidates:"
            raise _Failure(message, EXIT_TARGET, candidates)
        if response.status_code == 401:
            message += " (set [control] token in the config file, or pass --config)"
        raise _Failure(message, EXIT_API_ERROR)


def _run(command: str, target: _Target, work: Callable[[_Api], Awaitable[T]]) -> T:
    """Run `work` under trio with a client for `target`; failures become one line + exit code."""
    import httpx
    import trio

    async def main() -> T:
        headers = {"Accept": "application/json"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        async with httpx.AsyncClient(
            base_url=target.base_url,
            transport=make_transport(),
            headers=headers,
            timeout=httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT),
            trust_env=False,  # never send loopback requests through an HTTP(S)_PROXY
        ) as client:
            return await work(_Api(client, target))

    try:
        return trio.run(main)
    except _Failure as failure:
        _fail(command, failure.message, failure.code, failure.details)


# --------------------------------------------------------------------------------------------------
# Human output


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    cells = [list(headers)] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [value.ljust(width) for value, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def _yes(value: object) -> str:
    if value is None:
        return "?"
    return "yes" if value else "no"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


_MAX_VM_NAME = 60


def _vm_name(vm: dict[str, Any]) -> str | None:
    """vm_ident, else one line of a JDWP version description (it has three)."""
    if vm.get("vm_ident"):
        return str(vm["vm_ident"])
    lines = [line.strip() for line in str(vm.get("description") or "").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return None
    name = next((line for line in lines if line.startswith("JVM version")), lines[0])
    return name if len(name) <= _MAX_VM_NAME else name[: _MAX_VM_NAME - 3] + "..."


def _vm_label(vm: dict[str, Any]) -> str:
    """The VM's name (package/app, a plain JVM's main class or "JVM pid N"), id and pid."""
    name = vm.get("name") or vm.get("app") or vm.get("package") or vm["id"]
    pid = vm.get("pid")
    if name == vm["id"]:
        return f"{name} (pid {pid if pid is not None else '?'})"
    return f"{name} ({vm['id']}, pid {pid if pid is not None else '?'})"


def _app_column(vm: dict[str, Any]) -> str | None:
    app, package = vm.get("app"), vm.get("package")
    if app and package and package != app:
        return f"{app} [{package}]"
    return app or package or (vm.get("name") if vm.get("name") != vm.get("id") else None)


def _missing(vm: dict[str, Any], feature: str) -> str | None:
    """The daemon's sentence saying why this VM lacks ``feature`` (None: it has it)."""
    missing = vm.get("missing") or {}
    if feature in missing:
        return str(missing[feature])
    if vm.get("ddm") is False:
        return f"{vm.get('name') or vm['id']} does not speak DDM (a plain JVM has none)"
    return None


def format_clients(vms: list[dict[str, Any]]) -> str:
    if not vms:
        return "no VMs are known to the daemon"
    rows = [
        (
            vm["id"],
            vm.get("pid"),
            _app_column(vm),
            _vm_name(vm),
            _yes(vm.get("ddm")),
            "yes" if vm.get("waiting_for_debugger") else "",
            vm.get("threads"),
            vm.get("debugger_port"),
            vm.get("debugger"),
            "*" if vm.get("current") else "",
        )
        for vm in vms
    ]
    headers = ("ID", "PID", "APP/PACKAGE", "VM", "DDM", "WAIT", "THREADS", "PORT", "DEBUGGER")
    return _table((*headers, "CURRENT"), rows)


def format_devices(devices: list[dict[str, Any]]) -> str:
    if not devices:
        return (
            "no Android devices are known to the daemon "
            "(none plugged in, or no adb server: see adb.* events in the daemon's log)"
        )
    rows = [(d["serial"], d.get("state"), d.get("model"), d.get("vms", 0)) for d in devices]
    return _table(("SERIAL", "STATE", "MODEL", "VMS"), rows)


def format_threads(body: dict[str, Any]) -> str:
    vm, threads = body["vm"], body.get("threads")
    head = f"threads of VM {_vm_label(vm)}"
    if threads is None:
        why = _missing(vm, "THST") or _missing(vm, "THEN") or "the VM has reported no threads yet"
        return f"{head}: not available: {why}"
    rows = [
        (
            t["id"],
            t.get("tid"),
            t.get("state") or (None if t.get("status") is None else f"status {t['status']}"),
            t.get("utime"),
            t.get("stime"),
            "" if t.get("daemon") is None else ("daemon" if t["daemon"] else ""),
            t.get("name"),
        )
        for t in threads
    ]
    lines = [f"{head}:", _table(("ID", "TID", "STATE", "UTIME", "STIME", "DAEMON", "NAME"), rows)]
    if not body.get("supported", True):
        why = _missing(vm, "THST") or "the VM does not report thread states"
        lines.append(f"(thread names only: {why})")
    return "\n".join(lines)


def _by(mapping: dict[str, int] | None) -> str:
    if not mapping:
        return "-"
    return ", ".join(f"{name} {_size(n)}" for name, n in mapping.items())


def format_heap(body: dict[str, Any]) -> str:
    vm = body["vm"]
    lines = [f"heap of VM {_vm_label(vm)}:"]
    heaps = body.get("heaps") or []
    images = body.get("images") or []
    if not heaps and not images:
        why = _missing(vm, "HPIF")
        if why is not None:
            lines.append(f"not available: {why}")
        else:
            # Suggest only what can work for this VM.
            tries = [
                command
                for feature, command in (
                    ("HPGC", "ddmd gc TARGET"),
                    ("HPSG", "ddmd heap TARGET --segments"),
                )
                if _missing(vm, feature) is None
            ]
            hint = f" (try {' or '.join(repr(t) for t in tries)})" if tries else ""
            lines.append(f"no heap information yet{hint}")
        return "\n".join(lines)
    if heaps:
        rows = [
            (
                h["heap_id"],
                _size(h.get("max_size")),
                _size(h.get("size")),
                _size(h.get("bytes_allocated")),
                h.get("objects_allocated"),
            )
            for h in heaps
        ]
        lines.append(_table(("HEAP", "MAX", "SIZE", "ALLOCATED", "OBJECTS"), rows))
    for image in images:
        s = image["summary"]
        kind = "native heap" if image.get("native") else "heap"
        state = "" if image.get("complete", True) else " (incomplete dump)"
        lines.append("")
        lines.append(f"{kind} {image['heap_id']} segments{state}:")
        lines.append(
            _table(
                ("USED", "FREE", "LARGEST FREE", "FREE RUNS", "FRAGMENTATION", "OBJECTS"),
                [
                    (
                        _size(s.get("bytes_used")),
                        _size(s.get("bytes_free")),
                        _size(s.get("largest_free_run")),
                        s.get("free_run_count"),
                        f"{100 * float(s.get('fragmentation') or 0.0):.1f} %",
                        s.get("object_count"),
                    )
                ],
            )
        )
        lines.append(f"  by kind: {_by(s.get('bytes_by_kind'))}")
        lines.extend(
            f"  segment 0x{seg['address']:08x}-0x{seg['end']:08x}: {seg['units']} units "
            f"of {seg['unit_size']} B, {len(seg.get('runs') or [])} runs"
            for seg in image.get("segments") or []
        )
        lines.extend(f"  problem: {p['message']}" for p in image.get("problems") or [])
    return "\n".join(lines)


def format_frame(frame: dict[str, Any]) -> str:
    """Like java.lang.StackTraceElement.toString(); STKL line -2 = native, -1 = unknown."""
    file_name, line = frame.get("file_name") or None, frame.get("line")
    if line == -2:
        where = "Native Method"
    elif file_name and line is not None and line >= 0:
        where = f"{file_name}:{line}"
    elif file_name:
        where = file_name
    else:
        where = "Unknown Source"
    return f"  at {frame['class_name']}.{frame['method_name']}({where})"


def format_stack(body: dict[str, Any]) -> str:
    frames = body.get("frames") or []
    name = body.get("thread_name")
    thread = f"{body['thread_id']} ({name})" if name else str(body["thread_id"])
    lines = [f"thread {thread} of VM {_vm_label(body['vm'])}:"]
    lines.extend(format_frame(f) for f in frames)
    if not frames:
        lines.append("  (no frames)")
    return "\n".join(lines)


def _print_json(data: Any, *, compact: bool = False) -> None:
    if compact:
        click.echo(json.dumps(data, separators=(",", ":")))
    else:
        click.echo(json.dumps(data, indent=2))


# --------------------------------------------------------------------------------------------------
# Commands


def _client_options(func: F) -> F:
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
    func = click.option(
        "--config",
        "config_file",
        metavar="FILE",
        type=click.Path(path_type=str),
        default=None,
        help="Config file (default: $DDMD_CONFIG, then ~/.config/ddmd/config.toml, else built-in).",
    )(func)
    return func


_json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
_target_argument = click.argument("target")


@click.command("clients", short_help="List the VMs the daemon knows, with their debugger ports.")
@_json_option
@_client_options
def clients(
    as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """List the VMs the daemon knows."""
    target = _target("clients", config_file, control, None)

    async def work(api: _Api) -> Any:
        return await api.call("GET", f"{API}/vms")

    vms = _run("clients", target, work)
    if device:
        vms = [vm for vm in vms if vm.get("device") == device]
    if as_json:
        _print_json(vms)
    else:
        click.echo(format_clients(vms))


@click.command("devices", short_help="List the Android devices and emulators seen through adb.")
@_json_option
@_client_options
def devices(
    as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """List the Android devices and emulators the daemon sees through adb."""
    target = _target("devices", config_file, control, None)

    async def work(api: _Api) -> tuple[Any, Any]:
        found = await api.call("GET", f"{API}/devices")
        # No devices: the health answer tells whether adb is turned off, and where.
        health = None if found or as_json else await api.call("GET", f"{API}/health")
        return found, health

    listed, health = _run("devices", target, work)
    if device:
        listed = [d for d in listed if d.get("serial") == device]
    if as_json:
        _print_json(listed)
        return
    off = None if listed else _adb_off_message(health)
    click.echo(off if off is not None else format_devices(listed))


def _adb_off_message(health: Any) -> str | None:
    """What to say when the daemon's health answer reports ``adb: {"enabled": "off", ...}``."""
    adb = health.get("adb") if isinstance(health, dict) else None
    if not isinstance(adb, dict) or adb.get("enabled") != "off":
        return None
    source = adb.get("config")
    where = f" in {source}" if source else ""
    return (
        f'adb is turned off: [adb] enabled = "off"{where}; set it to "auto" (or "on") and '
        "restart the daemon to list Android devices"
    )


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@click.command("threads", short_help="Show a VM's threads and their states (--watch: live).")
@_target_argument
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    default=0.5,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@_json_option
@_client_options
def threads(
    target: str,
    watch: bool,
    interval: float,
    count: int | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show the threads of the VM TARGET (id, pid, app or package name)."""
    where = _target("threads", config_file, control, device)
    tty = _is_tty()

    def show(body: Any, frame: int) -> None:
        if as_json:
            _print_json(body, compact=watch)
            return
        text = format_threads(body)
        if watch and tty:
            stamp = time.strftime("%H:%M:%S")
            click.echo(f"\x1b[H\x1b[2Jevery {interval:g} s, {stamp}  (Ctrl-C to stop)\n{text}")
        elif watch:
            # A pipe or a file: no terminal codes; a time line before each table instead.
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            click.echo(("\n" if frame else "") + f"--- {stamp} ---\n{text}")
        else:
            click.echo(text)

    async def work(api: _Api) -> None:
        import trio

        frame = 0
        path = api.vm_path(target, "/threads")
        while True:
            show(await api.call("GET", path), frame)
            frame += 1
            if not watch or (count is not None and frame >= count):
                return
            await trio.sleep(interval)

    try:
        _run("threads", where, work)
    except KeyboardInterrupt:
        if not watch:
            raise
        raise click.exceptions.Exit(EXIT_OK) from None


@click.command("heap", short_help="Show a VM's heap sizes and heap segment summaries.")
@_target_argument
@click.option(
    "--segments",
    is_flag=True,
    help="Ask for a fresh heap segment dump (runs a GC) and show its layout.",
)
@_json_option
@_client_options
def heap(
    target: str,
    segments: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show heap sizes of the VM TARGET, and heap segment summaries once a dump exists."""
    where = _target("heap", config_file, control, device)

    async def work(api: _Api) -> Any:
        path = api.vm_path(target, "/heap")
        if segments:
            return await api.call(
                "GET", path, params={"segments": "1"}, read_timeout=SEGMENTS_READ_TIMEOUT
            )
        return await api.call("GET", path)

    body = _run("heap", where, work)
    if as_json:
        _print_json(body)
    else:
        click.echo(format_heap(body))


@click.command("gc", short_help="Ask a VM to run a garbage collection.")
@_target_argument
@_json_option
@_client_options
def gc(
    target: str, as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """Ask the VM TARGET to run a garbage collection."""
    where = _target("gc", config_file, control, device)

    async def work(api: _Api) -> Any:
        return await api.call("POST", api.vm_path(target, "/gc"))

    body = _run("gc", where, work)
    if as_json:
        _print_json(body)
        return
    label = _vm_label(body["vm"])
    if not body.get("confirmed"):
        note = body.get("note") or "the VM gave no confirmation"
        click.echo(f"GC requested on {label}; {note}")
        return
    line = f"GC done on {label}"
    heaps = body.get("heaps") or []
    if heaps:
        line += ": " + ", ".join(
            f"heap {h['heap_id']} {_size(h.get('bytes_allocated'))} allocated of "
            f"{_size(h.get('size'))}"
            for h in heaps
        )
    click.echo(line)


@click.command("select", short_help="Make a VM current: debuggers on port 8700 reach it.")
@_target_argument
@_json_option
@_client_options
def select(
    target: str, as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """Make the VM TARGET current: debuggers on the current-VM port (8700) reach it.

    The choice sticks to the app: when it restarts with a new pid, 8700 follows it.
    """
    where = _target("select", config_file, control, device)

    async def work(api: _Api) -> Any:
        return await api.call("POST", api.vm_path(target, "/select"))

    body = _run("select", where, work)
    if as_json:
        _print_json(body)
    else:
        port = body["vm"].get("debugger_port")
        extra = f"; its own debugger port is {port}" if port else ""
        click.echo(f"current VM: {_vm_label(body['vm'])}{extra}")


@click.command("stack", short_help="Show the stack trace of one thread of a VM.")
@_target_argument
@click.argument("thread")
@_json_option
@_client_options
def stack(
    target: str,
    thread: str,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Show the stack trace of THREAD (a thread id or name from 'ddmd threads') in the VM
    TARGET. A name may be a unique part of one ('ddmd stack mail main')."""
    where = _target("stack", config_file, control, device)

    async def work(api: _Api) -> Any:
        return await api.call(
            "GET", api.vm_path(target, f"/threads/{quote(thread, safe='')}/stack")
        )

    body = _run("stack", where, work)
    if as_json:
        _print_json(body)
    else:
        click.echo(format_stack(body))


# --------------------------------------------------------------------------------------------------
# ddmd ports: the debugger port each app gets, kept in the state file (GET/DELETE /api/v1/ports)


def _age(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    days = int(seconds // 86400)
    return f"{days} day{'s' if days != 1 else ''} ago"


def format_ports(body: dict[str, Any], *, now: float | None = None, note: str = "") -> str:
    """The port book as a table (by port); ``note`` says where it was read from."""
    from ddmd.ports import parse_time

    now = time.time() if now is None else now
    path = body.get("path")
    head = f"debugger ports remembered in {path}" if path else "debugger ports remembered"
    head += f" {note}" if note else ""
    entries = sorted(body.get("ports") or [], key=lambda e: (e.get("port") or 0, e.get("key")))
    if not entries:
        return f"{head}: none"
    rows = []
    for e in entries:
        seen = e.get("last_seen")
        when = parse_time(seen)
        shown = seen if when is None else f"{seen} ({_age(max(0.0, now - when))})"
        in_use = f"yes ({e['vm']})" if e.get("in_use") and e.get("vm") else _yes(e.get("in_use"))
        rows.append((e.get("app"), e.get("device"), e.get("port"), shown, in_use))
    return "\n".join([f"{head}:", _table(("APP", "DEVICE", "PORT", "LAST SEEN", "IN USE"), rows)])


def _forgotten_line(entry: dict[str, Any]) -> str:
    return (
        f"forgot debugger port {entry.get('port')} of {entry.get('app')} "
        f"({entry.get('device')}); the app gets a port again when its VM is next seen"
    )


def _ports_from_file(
    config_file: str | None, forget: str | None, device: str | None, as_json: bool, base: str
) -> None:
    """`ddmd ports` without a daemon: the state file is read, and edited for --forget, here
    (atomically, as the daemon writes it). No VM is connected through ddmd then."""
    from ddmd.config import PortRange
    from ddmd.errors import TargetError
    from ddmd.ports import PortBook

    try:
        config = load_config(find_config_file(config_file, os.environ), env=os.environ)
    except ConfigError as err:
        _fail("ports", str(err), EXIT_CONFIG)
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
            _print_json(body)
        else:
            click.echo(format_ports(body, note=note))
        return
    try:
        entry = book.resolve(forget, device=device)
    except TargetError as exc:
        if not exc.candidates:
            _fail("ports", f"{exc.message} (no debugger ports are remembered)", EXIT_TARGET)
        suffix = ":" if exc.ambiguous else "; candidates:"
        _fail("ports", exc.message + suffix, EXIT_TARGET, exc.candidates)
    book.forget(entry.key)
    try:
        book.save()
    except OSError as exc:
        _fail("ports", f"cannot write {path}: {exc}", EXIT_API_ERROR)
    body = {"forgotten": entry.to_json(in_use=False)}
    if as_json:
        _print_json(body)
    else:
        click.echo(f"{_forgotten_line(body['forgotten'])} (edited {path}: no daemon is running)")


@click.command("ports", short_help="List the remembered debugger ports, or forget one.")
@click.option(
    "--forget",
    metavar="APP",
    default=None,
    help="Forget the port of APP (app or package name, or DEVICE|NAME as listed); refused "
    "while its VM is connected.",
)
@_json_option
@_client_options
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
    where = _target("ports", config_file, control, device)

    async def work(api: _Api) -> Any:
        try:
            if forget is None:
                return await api.call("GET", f"{API}/ports")
            return await api.call("DELETE", f"{API}/ports/{quote(forget.strip(), safe='')}")
        except _Failure as failure:
            if failure.code == EXIT_NO_DAEMON:
                return None
            raise

    body = _run("ports", where, work)
    if body is None:
        _ports_from_file(config_file, forget, device, as_json, where.base_url)
        return
    if forget is None and device:
        body = {**body, "ports": [e for e in body.get("ports") or [] if e.get("device") == device]}
    if as_json:
        _print_json(body)
    elif forget is None:
        click.echo(format_ports(body))
    else:
        click.echo(_forgotten_line(body["forgotten"]))


# --------------------------------------------------------------------------------------------------
# ddmd events: tail the daemon's event stream (server-sent events, GET /api/v1/events)

#: The daemon sends a keepalive comment every 15 s; three missed ones mean it is gone.
EVENTS_READ_TIMEOUT = 45.0
_SHORT_VALUE = 40


def _short(value: object) -> bool:
    return (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= _SHORT_VALUE)
    )


def _changes(event: dict[str, Any]) -> str:
    snapshot = event.get("snapshot") or {}
    keys = event.get("changed")
    if not keys:
        return "snapshot"
    return ", ".join(
        f"{k}={'-' if snapshot.get(k) is None else snapshot.get(k)}"
        if _short(snapshot.get(k))
        else k
        for k in keys
    )


def _thread_states(threads: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for t in threads:
        if t.get("state"):
            counts[str(t["state"])] = counts.get(str(t["state"]), 0) + 1
    states = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
    return f"{len(threads)} threads" + (f" ({states})" if states else "")


def _event_detail(event: dict[str, Any]) -> str:
    name = str(event.get("event", ""))
    vm = event.get("vm") or "-"
    snapshot = event.get("snapshot")
    if name == "stream.opened":
        return f"{len(event.get('vms') or [])} VMs, current VM {event.get('current') or 'none'}"
    if name in ("vm.found", "vm.gone"):
        return _vm_label(snapshot) if isinstance(snapshot, dict) else str(vm)
    if name == "vm.changed":
        return f"{vm}: {_changes(event)}"
    if name == "vm.renamed":
        before = event.get("previous_package") or event.get("previous_app")
        return f"{vm}: {before} -> {event.get('package') or event.get('app')}"
    if name in ("debugger.attached", "debugger.detached"):
        return f"{vm}: {event.get('debugger')}"
    if name == "current.changed":
        return f"{event.get('vm') or 'none'} (was {event.get('previous') or 'none'})"
    if name == "threads.updated":
        return f"{vm}: {_thread_states(event.get('threads') or [])}"
    if name == "heap.info":
        heaps = event.get("heaps") or []
        return f"{vm}: " + "; ".join(
            f"heap {h.get('heap_id')} {_size(h.get('bytes_allocated'))} allocated "
            f"of {_size(h.get('size'))}"
            for h in heaps
        )
    if name == "heap.dumped":
        heaps = event.get("heaps") or []
        return f"{vm}: " + "; ".join(
            f"heap {h.get('heap_id')} used {_size(h.get('bytes_used'))}, free "
            f"{_size(h.get('bytes_free'))}, fragmentation "
            f"{100 * float(h.get('fragmentation') or 0.0):.1f} %"
            for h in heaps
        )
    if name in ("device.changed", "device.gone"):
        parts = [event.get("device"), event.get("state"), event.get("model")]
        return " ".join(str(p) for p in parts if p)
    if name in ("overflow", "daemon.stopping"):
        return str(event.get("reason") or "")
    rest = {k: v for k, v in event.items() if k not in ("event", "ts", "vm")}
    return " ".join(p for p in (str(vm) if event.get("vm") else "", json.dumps(rest)) if p)


def format_event(event: dict[str, Any]) -> str:
    """One line per event: time (HH:MM:SS, UTC as sent), name, what it says."""
    ts = str(event.get("ts") or "")
    clock = ts[11:19] if len(ts) >= 19 and ts[10] == "T" else ts
    name = str(event.get("event", "?"))
    return f"{clock} {name:<24} {_event_detail(event)}".rstrip()


async def _tail_events(
    api: _Api, show: Callable[[dict[str, Any]], None], count: int | None
) -> None:
    """Read the stream until it ends (daemon stopping: return; otherwise _Failure)."""
    import httpx

    from ddmd.sse import SseDecoder

    base = api._target.base_url
    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=EVENTS_READ_TIMEOUT)
    headers = {"Accept": "text/event-stream"}
    decoder = SseDecoder()
    last = ""
    seen = 0
    try:
        async with api._client.stream(
            "GET", f"{API}/events", headers=headers, timeout=timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                try:
                    body = response.json()
                except ValueError:
                    body = None
                error = body.get("error") if isinstance(body, dict) else None
                message = str(error) if error else f"HTTP {response.status_code}"
                if response.status_code == 401:
                    message += " (set [control] token in the config file, or pass --config)"
                raise _Failure(message, EXIT_API_ERROR)
            async for line in response.aiter_lines():
                sse_event = decoder.feed(line)
                if sse_event is None:
                    continue
                try:
                    event = json.loads(sse_event.data)
                except ValueError:
                    event = {"event": sse_event.name, "data": sse_event.data}
                if not isinstance(event, dict):
                    event = {"event": sse_event.name, "data": event}
                last = str(event.get("event", sse_event.name))
                show(event)
                seen += 1
                if count is not None and seen >= count:
                    return
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise _Failure(
            f"no daemon is answering at {base} "
            "(start it with 'ddmd run', or pass --control HOST:PORT)",
            EXIT_NO_DAEMON,
        ) from None
    except httpx.ReadTimeout:
        raise _Failure(
            f"the daemon at {base} sent nothing for {EVENTS_READ_TIMEOUT:g} s "
            "(not even a keepalive)",
            EXIT_API_ERROR,
        ) from None
    except httpx.TransportError as exc:
        raise _Failure(
            f"the event stream from {base} broke: {type(exc).__name__}: {exc}", EXIT_API_ERROR
        ) from None
    if last == "daemon.stopping":
        return
    if last == "overflow":
        raise _Failure("the daemon dropped this stream: it fell behind", EXIT_API_ERROR)
    raise _Failure(f"the daemon at {base} closed the event stream", EXIT_API_ERROR)


@click.command("events", short_help="Print the daemon's events as they happen, until Ctrl-C.")
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print each event as one JSON line.")
@_client_options
def events(
    count: int | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Follow the daemon's events (VMs found and gone, debuggers, current VM, threads, heaps)
    until Ctrl-C: one line per event, or one JSON object per line with --json."""
    where = _target("events", config_file, control, None)

    def show(event: dict[str, Any]) -> None:
        if device and event.get("device") not in (None, device):
            return
        if as_json:
            click.echo(json.dumps(event, separators=(",", ":")))
        else:
            click.echo(format_event(event))

    async def work(api: _Api) -> None:
        await _tail_events(api, show, count)

    try:
        _run("events", where, work)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_OK) from None


COMMANDS: list[click.Command] = [clients, devices, threads, heap, gc, select, stack, ports, events]
