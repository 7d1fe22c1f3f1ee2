"""What DDMS users pressed most after "Cause GC", as client commands over the control API:
``ddmd trace`` (method tracing), ``ddmd allocs`` (the allocation tracker), ``ddmd hprof`` (a
heap dump, its class histogram, ``--convert`` with the SDK's hprof-conv) and ``ddmd kill``.

Layer: imports `cli.client` (the daemon's address, the httpx client, failures and exit codes),
`cli.capture` (the steps these commands share: the VM checks, the download), `cli.format`,
`cli.progress`, `cli.trace` and `cli.hprof` (the reports of the files written here); httpx and
trio lazily. `ddmd allocs` lives in `cli.allocs` and is re-exported here. Routes used
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
broken download never leaves a file that looks whole. Exit codes are `cli.exits`' table: 0,
1 (the API said no, the feature is not available -- `allocs --status` too --, or a local file
problem), 2 (TARGET, usage, an ``-o`` that cannot be written), 3 (no daemon).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ddmd.cli.allocs import allocs, format_allocations, java_name, thread_names
from ddmd.cli.capture import (
    check_output,
    fetch_capture,
    only_a_vm,
    output_option,
    refuse_unless_offered,
    with_path,
    wrote,
)
from ddmd.cli.client import (
    EXIT_API_ERROR,
    EXIT_CONFIG,
    Api,
    Failure,
    client_options,
    daemon_address,
    fail,
    json_option,
    run_with_api,
    target_argument,
    vm_of,
)
from ddmd.cli.format import print_json, size, vm_label
from ddmd.cli.hprof import histogram_text
from ddmd.cli.progress import countdown, terminal, ticking
from ddmd.cli.trace import per_thread_option, trace_text, verbose_option

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
    "thread_names",
    "trace",
]

#: Seconds. A trace stop may pull a file from a device; a heap dump of a big app takes long.
STOP_READ_TIMEOUT = 120.0
HPROF_READ_TIMEOUT = 600.0
CONVERT_TIMEOUT = 600.0

#: Where Debian's package hprof-conv installs the program (not on PATH).
DEBIAN_HPROF_CONV = Path("/usr/lib/android-sdk/platform-tools/hprof-conv")
HPROF_CONV_HELP = "install the Debian package hprof-conv, or the Android SDK platform-tools"


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
    check_output("trace", output)
    where = daemon_address("trace", config_file, control, device)

    async def work(api: Api) -> tuple[dict[str, Any], Path, int]:
        import trio

        vm = await vm_of(api, target)
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
        dest, written = await fetch_capture(api, stopped, output, "vm.trace", "trace", terminal())
        return stopped, dest, written

    stopped, dest, written = run_with_api("trace", where, work)
    if as_json:
        print_json(with_path(stopped, path=dest))
        return
    click.echo(wrote(dest, written))
    text, problem = trace_text(stopped, dest, top, per_thread, verbose)
    if text is not None:
        click.echo("")
        click.echo(text)
    else:
        click.echo(f"ddmd trace: cannot list the methods: {problem}", err=True)


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
    check_output("hprof", output)
    where = daemon_address("hprof", config_file, control, device)

    async def work(api: Api) -> tuple[dict[str, Any], Path, int]:
        vm = await vm_of(api, target)
        await only_a_vm(api, vm, "hprof")
        await refuse_unless_offered(api, vm, "hprof")
        # A big heap over adb takes minutes: on a terminal the time it has taken so far.
        async with ticking(f"dumping the heap of {vm_label(vm)}", terminal()):
            dumped = await api.call(
                "POST", api.vm_path(vm["id"], "/hprof"), read_timeout=HPROF_READ_TIMEOUT
            )
        if not isinstance(dumped, dict) or not dumped.get("file"):
            raise Failure("the daemon's answer names no heap dump file", EXIT_API_ERROR)
        dest, written = await fetch_capture(api, dumped, output, "vm.hprof", "dump", terminal())
        return dumped, dest, written

    dumped, dest, written = run_with_api("hprof", where, work)
    if not as_json:
        click.echo(wrote(dest, written))
        text, problem = histogram_text(dumped.get("histogram"), dest, top)
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
            print_json(with_path(dumped, path=dest))
        return
    converted = _convert(dest)
    if as_json:
        print_json(with_path(dumped, path=dest, converted=converted))
        return
    click.echo("")
    click.echo(
        f"converted for standard HPROF tools: {converted} ({size(converted.stat().st_size)})"
    )


# --------------------------------------------------------------------------------------------------
# ddmd kill


def _can_ask() -> bool:
    """Whether a question can be put to a person (stdin and stderr are terminals)."""
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


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
        vm = await vm_of(api, target)
        await only_a_vm(api, vm, "kill")
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
