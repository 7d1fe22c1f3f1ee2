"""What DDMS users pressed most after "Cause GC", as client commands over the control API:
``ddmd trace`` (method tracing), ``ddmd allocs`` (the allocation tracker), ``ddmd hprof`` (a
heap dump, its class histogram, ``--convert`` with the SDK's hprof-conv) and ``ddmd kill``.

Layer: imports `cli.client` (the daemon's address, the httpx client, failures and exit codes),
`cli.format`, `cli.trace` and `cli.hprof` (the reports of the files written here), and
`protocol.hprofwire` (class names in source form); httpx and trio lazily. Routes used
(``/api/v1/vms/{target}/...``)::

    GET  .../profiling            what the VM offers, and whether it traces / tracks now
    POST .../trace/start|stop     stop answers {file, bytes, download, report}
    GET  .../allocs[?top=N]       {enabled, allocations, by_class, by_site}
    POST .../allocs/start|stop    {enabled}
    POST .../hprof                {file, bytes, download, histogram}
    POST .../kill[?status=N]      {killed, status}
    GET  /api/v1/captures/NAME    the .trace / .hprof file itself

Each command first looks the VM up (``GET .../vms/TARGET``, or ``GET /api/v1/current`` when
TARGET is left out) and then uses its exact id, so a trace stopped by Ctrl-C is stopped on the
VM it was started on. Downloads are written to ``FILE.part`` as they arrive, then renamed: a
broken download never leaves a file that looks whole. Exit codes are `cli.client`'s table: 0,
1 (the API said no, the feature is not available -- `allocs --status` too --, or a local file
problem), 2 (TARGET, usage, an ``-o`` that cannot be written), 3 (no daemon).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from ddmd.cli.client import (
    API,
    CONNECT_TIMEOUT,
    EXIT_API_ERROR,
    EXIT_CONFIG,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    Failure,
    client_options,
    daemon_address,
    fail,
    json_option,
    no_daemon,
    run_with_api,
    target_argument,
    vm_of,
)
from ddmd.cli.format import print_json, size, table, vm_label
from ddmd.cli.hprof import format_histogram, format_histogram_json
from ddmd.cli.progress import Transfer, countdown, terminal, ticking
from ddmd.cli.trace import (
    format_report,
    load_profile,
    per_thread_option,
    report_json,
    verbose_option,
)
from ddmd.protocol.hprof import HprofFormatError, summarise_file
from ddmd.protocol.hprofwire import java_class_name
from ddmd.protocol.trace import TraceFormatError

__all__ = [
    "DDMS_COMMANDS",
    "DEBIAN_HPROF_CONV",
    "allocs",
    "converted_name",
    "find_hprof_conv",
    "format_allocations",
    "hprof",
    "java_name",
    "kill",
    "trace",
]

#: Seconds. A trace stop may pull a file from a device; a heap dump of a big app takes long.
STOP_READ_TIMEOUT = 120.0
HPROF_READ_TIMEOUT = 600.0
DOWNLOAD_READ_TIMEOUT = 60.0  # the longest pause between two pieces of a download
CONVERT_TIMEOUT = 600.0

#: Where Debian's package hprof-conv installs the program (not on PATH).
DEBIAN_HPROF_CONV = Path("/usr/lib/android-sdk/platform-tools/hprof-conv")
HPROF_CONV_HELP = "install the Debian package hprof-conv, or the Android SDK platform-tools"

#: What `ddmd allocs --top 0` asks the daemon for: more rows than one REAL chunk can list.
ALL_ROWS = 65535

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

output_option = click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the file (default: the daemon's name for it, in this directory; "
    "a directory: that name inside it).",
)


# --------------------------------------------------------------------------------------------------
# Shared steps


def _can_ask() -> bool:
    """Whether a question can be put to a person (stdin and stderr are terminals)."""
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


async def _vm(api: Api, target: str | None) -> dict[str, Any]:
    """The VM's JSON (``GET /api/v1/vms/TARGET``, the current VM's without TARGET): its exact
    id, name, pid, device."""
    return await vm_of(api, target)


async def _kind(api: Api, vm: Mapping[str, Any]) -> str:
    """What the client is: "VM", or what the daemon's list says of a DDM client that is not a
    VM ("system monitor"). A list that cannot be read counts as "VM": the daemon decides then."""
    if isinstance(vm.get("kind"), str):
        return str(vm["kind"])
    if vm.get("ddm") is False or str(vm.get("vm_ident") or "").startswith("Dalvik v"):
        return "VM"  # a plain JVM; an Android VM
    try:
        listed = await api.call("GET", f"{API}/vms")
    except Failure:
        return "VM"
    for other in listed if isinstance(listed, list) else []:
        if isinstance(other, dict) and other.get("id") == vm.get("id"):
            return str(other.get("kind") or "VM")
    return "VM"


#: What a DDM client that is not a VM does not have, by command.
_NOT_A_VM = {
    "allocs": "it has no allocations to track",
    "hprof": "it has no heap to dump",
    "kill": "ddmd does not stop it (stop it where it runs)",
}


async def _only_a_vm(api: Api, vm: Mapping[str, Any], command: str) -> None:
    """Refuse a DDM client that is not a VM (``ddmd sysmon``), in its own words (exit 1)."""
    kind = await _kind(api, vm)
    if kind != "VM":
        name = str(vm.get("name") or vm.get("id"))
        who = f"the {kind} is not a VM" if name == kind else f"{name} is a {kind}, not a VM"
        raise Failure(f"{who}: {_NOT_A_VM[command]}", EXIT_API_ERROR)


async def _refuse_unless_offered(api: Api, vm: Mapping[str, Any], feature: str) -> None:
    """Ask what the VM offers (``GET .../profiling``) and refuse, with the daemon's sentence,
    before the work is announced: a refusal never follows a "dumping..." line."""
    body = await api.call("GET", api.vm_path(str(vm["id"]), "/profiling"))
    features = body.get("features") if isinstance(body, dict) else None
    offer = features.get(feature) if isinstance(features, dict) else None
    if isinstance(offer, dict) and offer.get("available") is False:
        reason = offer.get("reason") or f"{vm.get('name') or vm['id']} does not offer it"
        raise Failure(str(reason), EXIT_API_ERROR)


def _check_output(command: str, output: Path | None) -> None:
    """Refuse an ``-o`` that cannot be written before anything is asked of the VM."""
    if output is None or output.is_dir():
        return
    parent = output.parent
    if not parent.is_dir():
        fail(command, f"cannot write {output}: the directory {parent} does not exist", EXIT_CONFIG)
    if not os.access(parent, os.W_OK):
        fail(command, f"cannot write {output}: no permission in {parent}", EXIT_CONFIG)


def _local_name(name: object, fallback: str) -> str:
    """The daemon's file name as a plain name in this directory (never a path)."""
    text = _SAFE_NAME.sub("_", Path(str(name or "")).name)
    return text if text.strip("._") else fallback


def _destination(output: Path | None, name: str) -> Path:
    if output is None:
        return Path(name)
    if output.is_dir():
        return output / name
    return output


def _download_path(body: Mapping[str, Any], name: str) -> str:
    """Where the daemon serves the file: its ``download`` when that is a path of this API."""
    download = body.get("download")
    if isinstance(download, str) and download.startswith(f"{API}/captures/"):
        return download
    return f"{API}/captures/{quote(name, safe='')}"


def _error_message(status: int, content: bytes) -> str:
    import json

    try:
        body = json.loads(content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = str(error) if error else f"HTTP {status}"
    return message + TOKEN_HINT if status == 401 else message


async def _fetch_capture(
    api: Api, answer: dict[str, Any], output: Path | None, fallback: str, what: str
) -> tuple[Path, int]:
    """Download the file a trace stop or a heap dump answered with; returns where it went and
    its size. A failed download says the daemon still keeps the file."""
    name = _local_name(answer["file"], fallback)
    dest = _destination(output, name)
    expected = answer.get("bytes")
    try:
        written = await _download(
            api, _download_path(answer, name), dest, expected if isinstance(expected, int) else None
        )
    except Failure as failure:
        raise Failure(
            f"{failure.message} (the daemon keeps the {what} as {answer['file']})", failure.code
        ) from None
    return dest, written


async def _download(api: Api, path: str, dest: Path, expected: int | None) -> int:
    """Write the file at ``path`` to ``dest`` piece by piece; return its size in bytes."""
    import httpx
    import trio

    base = api.address.shown
    part = dest.with_name(dest.name + ".part")
    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=DOWNLOAD_READ_TIMEOUT)
    written = 0
    try:
        async with api.client.stream(
            "GET", path, headers={"Accept": "application/octet-stream"}, timeout=timeout
        ) as response:
            if not response.is_success:
                message = _error_message(response.status_code, await response.aread())
                raise Failure(f"downloading {path} failed: {message}", EXIT_API_ERROR)
            try:
                handle = await trio.open_file(part, "wb")
            except OSError as exc:
                raise Failure(
                    f"cannot write {part}: {exc.strerror or exc}", EXIT_API_ERROR
                ) from None
            progress = Transfer(f"downloading {dest.name}", expected, terminal())
            async with handle:
                try:
                    async for piece in response.aiter_bytes():
                        await handle.write(piece)
                        written += len(piece)
                        progress.update(written)
                finally:
                    progress.finish()
        if expected is not None and written != expected:
            raise Failure(
                f"the download of {path} ended after {written} of {expected} bytes",
                EXIT_API_ERROR,
            )
        await trio.Path(part).replace(dest)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await trio.Path(part).unlink(missing_ok=True)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise no_daemon(base) from None
        if isinstance(exc, httpx.TimeoutException):
            raise Failure(
                f"the daemon at {base} sent nothing for {DOWNLOAD_READ_TIMEOUT:g} s "
                f"while {path} was downloading",
                EXIT_API_ERROR,
            ) from None
        if isinstance(exc, httpx.TransportError):
            raise Failure(
                f"downloading {path} from {base} failed: {type(exc).__name__}: {exc}",
                EXIT_API_ERROR,
            ) from None
        if isinstance(exc, OSError):
            raise Failure(f"cannot write {dest}: {exc.strerror or exc}", EXIT_API_ERROR) from None
        raise
    return written


def _wrote(path: Path, written: int) -> str:
    return f"wrote {path} ({size(written)}, {written:,} bytes)"


def _with_path(body: Any, **paths: Path) -> dict[str, Any]:
    extra = {key: str(value) for key, value in paths.items()}
    return {**body, **extra} if isinstance(body, dict) else {"answer": body, **extra}


# --------------------------------------------------------------------------------------------------
# ddmd trace


async def _wait_for_the_end(seconds: float | None) -> None:
    """Sleep ``seconds`` (on a terminal counting down the seconds left), or until Ctrl-C
    (KeyboardInterrupt) when None."""
    import trio

    if seconds is None:
        await trio.sleep_forever()
    else:
        await countdown("tracing", seconds, terminal())


def _trimmed_report(report: Any, top: int, file: str) -> dict[str, Any] | None:
    """The daemon's trace report cut to ``top`` rows a table, or None when it has fewer rows
    than asked for (then the file is read here)."""
    if not isinstance(report, dict):
        return None
    server_top = report.get("top")
    if not isinstance(server_top, int) or (server_top and (not top or server_top < top)):
        return None
    limit = top or None

    def cut(ranking: dict[str, Any]) -> dict[str, Any]:
        return {
            **ranking,
            "by_inclusive": list(ranking["by_inclusive"])[:limit],
            "by_exclusive": list(ranking["by_exclusive"])[:limit],
        }

    try:
        return {
            **report,
            "file": file,
            "top": top,
            "all_threads": cut(report["all_threads"]),
            "threads": [cut(thread) for thread in report["threads"]],
        }
    except (KeyError, TypeError):
        return None


def _trace_text(
    stopped: dict[str, Any], dest: Path, top: int, per_thread: bool = False, verbose: bool = False
) -> tuple[str | None, str | None]:
    """(the report, None), or (None, why it cannot be shown)."""
    body = _trimmed_report(stopped.get("report"), top, str(dest))
    if body is not None:
        try:
            return format_report(body, per_thread=per_thread, verbose=verbose), None
        except (KeyError, TypeError, IndexError):
            pass
    try:
        profile = load_profile(dest)
    except OSError as exc:
        return None, f"cannot read {dest}: {exc.strerror or exc}"
    except TraceFormatError as exc:
        return None, f"{dest}: {exc}"
    report = report_json(profile, top=top, file=str(dest))
    return format_report(report, per_thread=per_thread, verbose=verbose), None


@click.command("trace", short_help="Method-trace a VM for N seconds or until Ctrl-C.")
@target_argument
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Trace this long (default: until Ctrl-C).",
)
@click.option(
    "--sampling-us",
    type=click.IntRange(min=1),
    default=None,
    metavar="US",
    help="Sample the stacks every US microseconds instead of recording every call.",
)
@output_option
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many methods each table lists (0: all).",
)
@per_thread_option
@verbose_option
@json_option
@client_options
def trace(
    target: str | None,
    seconds: float | None,
    sampling_us: int | None,
    output: Path | None,
    top: int,
    per_thread: bool,
    verbose: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Method-trace the VM TARGET (or the current VM): every method entry and exit (or, with
    --sampling-us, a sample of the stacks), for --seconds or until Ctrl-C. The trace is written as
    the VM sent it (default APP-YYYYmmdd-HHMMSS.trace here), for Android Studio, Perfetto's UI and
    dmtracedump, and its top methods are printed ('ddmd trace-report FILE' shows them again).
    """
    _check_output("trace", output)
    where = daemon_address("trace", config_file, control, device)

    async def work(api: Api) -> tuple[dict[str, Any], Path, int]:
        import trio

        vm = await _vm(api, target)
        label = vm_label(vm)
        params = {} if sampling_us is None else {"sampling_us": str(sampling_us)}
        start_path = api.vm_path(vm["id"], "/trace/start")

        # A second Ctrl-C must not leave the VM tracing: the stop request is protected.
        @trio.lowlevel.enable_ki_protection
        async def stop() -> Any:
            path = api.vm_path(vm["id"], "/trace/stop")
            tty = terminal()
            if tty is None:
                return await api.call("POST", path, read_timeout=STOP_READ_TIMEOUT)
            # A trace pulled from the device can take long: the time it has taken, on a tty.
            async with ticking("stopping the trace", tty):
                return await api.call("POST", path, read_timeout=STOP_READ_TIMEOUT)

        # Ctrl-C can come at any moment, even before the wait begins: every moment after
        # the start request was sent is covered, and the trace is stopped on the way out.
        started: Any = None
        stopped: Any = None
        try:
            started = await api.call("POST", start_path, params=params)
            kind = "sampling" if started.get("trace") == "sampling" else "method tracing"
            how = " into a file on the device" if started.get("mode") == "file" else ""
            if seconds is None:
                click.echo(f"tracing {label} ({kind}{how})... press Ctrl-C to stop", err=True)
            else:
                click.echo(f"tracing {label} for {seconds:g} s ({kind}{how})...", err=True)
            await _wait_for_the_end(seconds)
        except KeyboardInterrupt:
            if started is None:
                # Interrupted while the start was under way: the VM may be tracing now.
                with contextlib.suppress(Exception):
                    await stop()
                raise
            click.echo("stopping the trace...", err=True)
        finally:
            if started is not None:
                stopped = await stop()
        if not isinstance(stopped, dict) or not stopped.get("file"):
            raise Failure("the daemon's answer to the stop names no trace file", EXIT_API_ERROR)
        dest, written = await _fetch_capture(api, stopped, output, "vm.trace", "trace")
        return stopped, dest, written

    stopped, dest, written = run_with_api("trace", where, work)
    if as_json:
        print_json(_with_path(stopped, path=dest))
        return
    click.echo(_wrote(dest, written))
    text, problem = _trace_text(stopped, dest, top, per_thread, verbose)
    if text is not None:
        click.echo("")
        click.echo(text)
    else:
        click.echo(f"ddmd trace: cannot list the methods: {problem}", err=True)


# --------------------------------------------------------------------------------------------------
# ddmd allocs

_PRIMITIVE_DESCRIPTORS = frozenset("ZBCSIJFDV")


def java_name(name: object) -> str:
    """A class name in source form: ``Lcom/example/Foo;`` -> ``com.example.Foo``,
    ``[B`` -> ``byte[]``, ``[[Ljava/lang/String;`` -> ``java.lang.String[][]``. A name that
    is not a descriptor (already ``com.example.Foo``) is returned as it is."""
    text = str(name)
    if len(text) > 2 and text.startswith("L") and text.endswith(";") and "." not in text:
        return text[1:-1].replace("/", ".")
    if text.startswith("["):
        return java_class_name(text)
    return text


def _site_name(site: object) -> str:
    """``Lcom/example/Inbox;.parse (Inbox.java:88)`` -> ``com.example.Inbox.parse (...)``."""
    text = str(site)
    if text.startswith("L") and ";." in text:
        descriptor, rest = text.split(";.", 1)
        return f"{java_name(descriptor + ';')}.{rest}"
    return text


def _frame_text(frame: Mapping[str, Any]) -> str:
    """Like java.lang.StackTraceElement.toString(): line -2 is native, below 0 unknown."""
    line = frame.get("line")
    file_name = frame.get("file") or None
    if line == -2:
        where = "Native Method"
    elif file_name and isinstance(line, int) and line >= 0:
        where = f"{file_name}:{line}"
    else:
        where = file_name or "Unknown Source"
    return f"{java_name(frame.get('class', '?'))}.{frame.get('method', '?')}({where})"


def _allocs_feature(profiling: Any) -> dict[str, Any]:
    """``features.allocs`` of a ``GET .../profiling`` answer ({} when it has none)."""
    features = profiling.get("features") if isinstance(profiling, dict) else None
    feature = features.get("allocs") if isinstance(features, dict) else None
    return feature if isinstance(feature, dict) else {}


def _tracking_words(enabled: object) -> str:
    if enabled is None:
        return "may be on or off (the VM does not say)"
    return "is on" if enabled else "is off"


def thread_names(vm: Mapping[str, Any], threads: object) -> dict[int, str]:
    """REAL's thread number -> the thread's name, from the VM's thread list. Dalvik sends the
    VM thread id (THCR's), ART the low 16 bits of the Linux tid (protocol.md 3.4)."""
    ident = str(vm.get("vm_ident") or "")
    dalvik = ident.startswith("Dalvik v1.")
    names: dict[int, str] = {}
    for t in threads if isinstance(threads, list) else []:
        if not isinstance(t, dict) or not t.get("name"):
            continue
        key = t.get("id") if dalvik else t.get("tid")
        if isinstance(key, int):
            names.setdefault(key if dalvik else key & 0xFFFF, str(t["name"]))
    return names


def _thread_cell(number: object, names: Mapping[int, str], verbose: bool) -> object:
    name = names.get(number) if isinstance(number, int) else None
    if name is None:
        return number
    return f"{name} ({number})" if verbose else name


def format_allocations(
    body: Mapping[str, Any],
    label: str,
    top: int,
    *,
    threads: Mapping[int, str] | None = None,
    verbose: bool = False,
) -> str:
    """``ddmd allocs --show``: the newest allocations, then the totals by class and by site.
    ``threads`` names the allocating threads (`thread_names`); ``verbose`` adds their numbers."""
    names = threads or {}
    allocations = list(body.get("allocations") or [])
    lines = [f"allocation tracking {_tracking_words(body.get('enabled'))} for {label}"]
    if not allocations:
        if body.get("enabled") is False:
            lines.append(
                "No allocations recorded. Switch tracking on with --start, let the app work, "
                "then look again."
            )
        else:
            lines.append("No allocations recorded yet.")
        return "\n".join(lines)
    shown = allocations[: top or None]
    which = "all" if len(shown) == len(allocations) else f"the newest {len(shown)} of"
    lines += ["", f"{which} {len(allocations):,} allocations, newest first:"]
    rows = []
    for entry in shown:
        frames = entry.get("frames") or []
        rows.append(
            [
                f"{entry.get('size', 0):,}",
                java_name(entry.get("class", "?")),
                _thread_cell(entry.get("thread"), names, verbose),
                _frame_text(frames[0]) if frames else "(no Java frames)",
            ]
        )
    lines.append(table(["BYTES", "CLASS", "THREAD", "ALLOCATED IN"], rows))
    for key, label, heading, name in (
        ("by_class", "CLASS", "by class", java_name),
        ("by_site", "SITE", "by allocation site", _site_name),
    ):
        summary = list(body.get(key) or [])[: top or None]
        if summary:
            lines += ["", f"{heading} (most bytes first):"]
            rows = [
                [
                    name(row.get(label.lower(), "?")),
                    f"{row.get('count', 0):,}",
                    f"{row.get('bytes', 0):,}",
                ]
                for row in summary
            ]
            lines.append(table([label, "COUNT", "BYTES"], rows))
    return "\n".join(lines)


@click.command("allocs", short_help="The allocation tracker: start, stop, status, show.")
@target_argument
@click.option("--start", is_flag=True, help="Switch allocation tracking on.")
@click.option("--stop", is_flag=True, help="Switch it off (the VM drops what it recorded).")
@click.option("--status", is_flag=True, help="Say whether tracking is on.")
@click.option("--show", is_flag=True, help="Show the allocations recorded (the default).")
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many allocations, classes and sites to list (0: all).",
)
@click.option("-v", "--verbose", is_flag=True, help="Give each thread's number beside its name.")
@json_option
@client_options
def allocs(
    target: str | None,
    start: bool,
    stop: bool,
    status: bool,
    show: bool,
    top: int,
    verbose: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """The allocation tracker of the VM TARGET or the current VM (DDMS's "Allocation Tracker"):
    --start records every allocation the app makes from now on (class, size, thread, stack), --show
    lists the newest ones and the totals by class and by allocation site, --stop ends it."""
    chosen = [name for name, on in (("start", start), ("stop", stop), ("status", status)) if on]
    if show:
        chosen.append("show")
    if len(chosen) > 1:
        raise click.UsageError(
            f"choose one of --start, --stop, --status, --show (got {', '.join(chosen)})"
        )
    action = chosen[0] if chosen else "show"
    where = daemon_address("allocs", config_file, control, device)
    names: dict[int, str] = {}  # the allocating threads' names, for --show

    async def work(api: Api) -> tuple[dict[str, Any], Any]:
        vm = await _vm(api, target)
        await _only_a_vm(api, vm, "allocs")
        if action in ("start", "stop"):
            return vm, await api.call("POST", api.vm_path(vm["id"], f"/allocs/{action}"))
        if action == "status":
            body = await api.call("GET", api.vm_path(vm["id"], "/profiling"))
            feature = _allocs_feature(body)
            if feature.get("available") is not False and not isinstance(body.get("allocs"), bool):
                # The profiling answer does not say: the tracker's own answer does.
                listed = await api.call(
                    "GET", api.vm_path(vm["id"], "/allocs"), params={"top": "1"}
                )
                body = {**body, "allocs": listed.get("enabled")}
            return vm, body
        rows = str(top) if top else str(ALL_ROWS)
        body = await api.call("GET", api.vm_path(vm["id"], "/allocs"), params={"top": rows})
        if not as_json and isinstance(body, dict) and body.get("allocations"):
            try:
                listed = await api.call("GET", api.vm_path(vm["id"], "/threads"))
            except Failure:
                listed = None  # no thread list (no thread handlers): numbers, then
            if isinstance(listed, dict):
                names.update(thread_names(vm, listed.get("threads")))
        return vm, body

    vm, body = run_with_api("allocs", where, work)
    if as_json:
        print_json(body)
        return
    label = vm_label(vm)
    if action in ("start", "stop"):
        enabled = body.get("enabled") if isinstance(body, dict) else None
        click.echo(f"allocation tracking {_tracking_words(enabled)} for {label}")
    elif action == "status":
        feature = _allocs_feature(body)
        if feature.get("available") is False:
            reason = str(feature.get("reason") or "the VM does not offer the allocation tracker")
            name = str(vm.get("name") or vm["id"])
            # The daemon's sentence may name the VM itself; then it is said once.
            click.echo(reason if name in reason else f"{label}: {reason}")
            raise click.exceptions.Exit(EXIT_API_ERROR)  # not available: the table's 1
        else:
            click.echo(f"allocation tracking {_tracking_words(body.get('allocs'))} for {label}")
    else:
        click.echo(format_allocations(body, label, top, threads=names, verbose=verbose))


# --------------------------------------------------------------------------------------------------
# ddmd hprof


def find_hprof_conv(env: Mapping[str, str] | None = None) -> Path | None:
    """The Android SDK's hprof-conv: on PATH, under ``$ANDROID_HOME/platform-tools`` (or
    ``$ANDROID_SDK_ROOT``), or where Debian's package puts it; None when none is there."""
    env = os.environ if env is None else env
    found = shutil.which("hprof-conv", path=env.get("PATH"))
    if found:
        return Path(found)
    candidates = [
        Path(env[var]) / "platform-tools" / "hprof-conv"
        for var in ("ANDROID_HOME", "ANDROID_SDK_ROOT")
        if env.get(var)
    ]
    candidates.append(DEBIAN_HPROF_CONV)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def converted_name(dump: Path) -> Path:
    """``x.hprof`` -> ``x-conv.hprof``; any other name gets ``-conv.hprof`` added."""
    if dump.suffix == ".hprof":
        return dump.with_name(f"{dump.stem}-conv.hprof")
    return dump.with_name(f"{dump.name}-conv.hprof")


def _convert(dump: Path) -> Path:
    """Run hprof-conv on ``dump``; the converted file's path, or a one-line failure."""
    program = find_hprof_conv()
    if program is None:
        fail(
            "hprof",
            f"cannot convert {dump}: hprof-conv is not installed (looked on PATH, in "
            f"$ANDROID_HOME/platform-tools and {DEBIAN_HPROF_CONV.parent}): {HPROF_CONV_HELP}",
            EXIT_API_ERROR,
        )
    out = converted_name(dump)
    try:
        done = subprocess.run(
            [str(program), str(dump), str(out)],
            capture_output=True,
            text=True,
            timeout=CONVERT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        fail("hprof", f"{program} did not finish within {CONVERT_TIMEOUT:g} s", EXIT_API_ERROR)
    except OSError as exc:
        fail("hprof", f"cannot run {program}: {exc.strerror or exc}", EXIT_API_ERROR)
    if done.returncode != 0 or not out.is_file():
        said = " ".join((done.stderr or done.stdout or "").split()) or f"exit {done.returncode}"
        fail("hprof", f"{program} could not convert {dump}: {said}", EXIT_API_ERROR)
    return out


def _standard(dumped: Mapping[str, Any]) -> bool:
    """A dump in the standard format already (a plain JVM's, ``JAVA PROFILE 1.0.2``)."""
    histogram = dumped.get("histogram")
    return isinstance(histogram, dict) and histogram.get("format") == "JAVA PROFILE 1.0.2"


def _histogram_text(histogram: Any, dump: Path, top: int) -> tuple[str | None, str | None]:
    """The daemon's histogram when it has the rows asked for, else the file's, read here."""
    try:
        if isinstance(histogram, dict):
            rows = list(histogram["classes"])
            whole = len(rows) >= int(histogram["class_count"])
            if whole or (top and len(rows) >= top):
                cut = rows[: top or None]
                return format_histogram_json(
                    {**histogram, "classes": cut, "shown": len(cut)}, str(dump)
                ), None
    except (KeyError, TypeError, ValueError):
        pass
    try:
        summary = summarise_file(dump)
    except HprofFormatError as err:
        return None, f"{dump}: {err}"
    except OSError as err:
        return None, f"cannot read {dump}: {err.strerror or err}"
    return format_histogram(summary, top or None, str(dump)), None


@click.command("hprof", short_help="Dump a VM's heap (HPROF) and show its class histogram.")
@target_argument
@output_option
@click.option(
    "--convert",
    is_flag=True,
    help="Also write a standard HPROF file (FILE-conv.hprof) with the Android SDK's hprof-conv.",
)
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many classes to show, largest shallow size first (0: all).",
)
@json_option
@client_options
def hprof(
    target: str | None,
    output: Path | None,
    convert: bool,
    top: int,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Dump the heap of the VM TARGET or the current VM (DDMS's "Dump HPROF file") to FILE (default
    APP-YYYYmmdd-HHMMSS.hprof here) and show its class histogram. The file is Android's HPROF as the
    VM wrote it ('ddmd hprof-summary' reads it); --convert also writes the standard form other heap
    tools need, with the Android SDK's hprof-conv."""
    _check_output("hprof", output)
    where = daemon_address("hprof", config_file, control, device)

    async def work(api: Api) -> tuple[dict[str, Any], Path, int]:
        vm = await _vm(api, target)
        await _only_a_vm(api, vm, "hprof")
        await _refuse_unless_offered(api, vm, "hprof")
        # A big heap over adb takes minutes: on a terminal the time it has taken so far.
        async with ticking(f"dumping the heap of {vm_label(vm)}", terminal()):
            dumped = await api.call(
                "POST", api.vm_path(vm["id"], "/hprof"), read_timeout=HPROF_READ_TIMEOUT
            )
        if not isinstance(dumped, dict) or not dumped.get("file"):
            raise Failure("the daemon's answer names no heap dump file", EXIT_API_ERROR)
        dest, written = await _fetch_capture(api, dumped, output, "vm.hprof", "dump")
        return dumped, dest, written

    dumped, dest, written = run_with_api("hprof", where, work)
    if not as_json:
        click.echo(_wrote(dest, written))
        text, problem = _histogram_text(dumped.get("histogram"), dest, top)
        if text is not None:
            click.echo("")
            click.echo(text)
        else:
            click.echo(f"ddmd hprof: cannot show the class histogram: {problem}", err=True)
    if not convert or _standard(dumped):
        if convert and not as_json:  # a plain JVM's dump: hprof-conv would refuse it
            click.echo("")
            click.echo(f"{dest} is a standard HPROF already (HotSpot's): nothing to convert")
        if as_json:
            print_json(_with_path(dumped, path=dest))
        return
    converted = _convert(dest)
    if as_json:
        print_json(_with_path(dumped, path=dest, converted=converted))
        return
    click.echo("")
    click.echo(
        f"converted for standard HPROF tools: {converted} ({size(converted.stat().st_size)})"
    )


# --------------------------------------------------------------------------------------------------
# ddmd kill


@click.command("kill", short_help="Stop a VM's process (DDMS's 'Stop Process').")
@target_argument
@click.option(
    "--status",
    "exit_status",
    type=click.IntRange(min=-(2**31), max=2**31 - 1),
    default=None,
    metavar="N",
    help="The exit status the process ends with (default: the daemon's).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
@client_options
def kill(
    target: str | None,
    exit_status: int | None,
    yes: bool,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Stop the process of the VM TARGET (or the current VM) at once, as if it called System.exit:
    unsaved work of the app is lost and its debuggers are disconnected. Asks first, unless --yes."""
    where = daemon_address("kill", config_file, control, device)

    async def look_up(api: Api) -> dict[str, Any]:
        vm = await _vm(api, target)
        await _only_a_vm(api, vm, "kill")
        return vm

    vm = run_with_api("kill", where, look_up)
    name = vm.get("name") or vm.get("app") or vm.get("package") or vm["id"]
    pid = f" (pid {vm['pid']})" if vm.get("pid") is not None else ""
    on = vm.get("device") or "this computer"
    if not yes:
        if not _can_ask():
            fail(
                "kill",
                f"not killing {vm_label(vm)} without a confirmation: there is no terminal to "
                "ask on; pass --yes to kill it without asking",
                EXIT_CONFIG,
            )
        if not click.confirm(f"Kill {name}{pid} on {on}?", default=False, err=True):
            fail("kill", f"{vm_label(vm)} was not killed", EXIT_API_ERROR)

    async def kill_it(api: Api) -> Any:
        params = {} if exit_status is None else {"status": str(exit_status)}
        return await api.call("POST", api.vm_path(vm["id"], "/kill"), params=params)

    body = run_with_api("kill", where, kill_it)
    if as_json:
        print_json(body)
        return
    status = body.get("status") if isinstance(body, dict) else None
    with_status = "" if status is None else f" (exit status {status})"
    click.echo(f"killed {vm_label(vm)}{with_status}")


#: The commands of this module, in the order `ddmd --help` and the tests list them.
DDMS_COMMANDS: list[click.Command] = [trace, allocs, hprof, kill]
