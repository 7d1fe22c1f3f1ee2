"""``ddmd sim``: run simulated VMs from the command line; `serve_many` and `make_configs` run
many VMs in one trio nursery (``bench/monitor_scale.py`` runs 500).

Layer: imports `sim.config` and `sim.vm`, trio and click; nothing of the daemon.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from dataclasses import replace

import click
import trio

from ddmd.sim.config import (
    FLAVORS,
    HPROF_BYTES_MAX,
    HPROF_BYTES_MIN,
    Flavor,
    SimConfig,
    check_type_name,
)
from ddmd.sim.vm import SimVm

__all__ = ["make_configs", "serve_many", "sim_command"]


async def serve_many(
    configs: Iterable[SimConfig],
    *,
    task_status: trio.TaskStatus[tuple[SimVm, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every VM in one nursery; report the ``SimVm`` objects once all are listening.

    Each VM's ``port`` is then known. Returns when every VM has exited (EXIT).
    """
    vms = tuple(SimVm(c) for c in configs)
    async with trio.open_nursery() as nursery:
        for vm in vms:
            await nursery.start(vm.run)
        task_status.started(vms)


def make_configs(base: SimConfig, count: int) -> list[SimConfig]:
    """``count`` configs from ``base``: consecutive ports (unless 0), pids and app names."""
    if count == 1:
        return [base]
    out = []
    for i in range(count):
        port = base.port + i if base.port else 0
        if port > 0xFFFF:
            raise ValueError(f"--port {base.port} with --count {count} runs past port 65535")
        out.append(
            replace(
                base,
                port=port,
                pid=base.pid + i * 7,
                app_name=f"{base.app_name}{i + 1}",
                package_name=f"{base.package_name}{i + 1}",
                seed=None if base.seed is None else base.seed + i,
            )
        )
    return out


async def _run_cli(configs: Sequence[SimConfig]) -> None:
    async with trio.open_nursery() as outer:

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    outer.cancel_scope.cancel()
                    return

        outer.start_soon(watch_signals)
        async with trio.open_nursery() as inner:
            vms: tuple[SimVm, ...] = await inner.start(serve_many, configs)
            for vm in vms:
                click.echo(
                    f"sim VM pid={vm.config.pid} app={vm.config.app_name} "
                    f"listening on {vm.config.host}:{vm.port}"
                )
        outer.cancel_scope.cancel()  # every VM exited


def _parse_fail_types(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """``--fail A,B --fail C`` -> ("A", "B", "C"), upper-cased, each checked, no repeats."""
    names: list[str] = []
    for value in values:
        for raw in value.split(","):
            name = raw.strip().upper()
            try:
                check_type_name(name)
            except ValueError as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
            if name not in names:
                names.append(name)
    return tuple(names)


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _parse_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int:
    """``--hprof-bytes 20M`` -> 20971520 (K, M, G: powers of 1024); None -> 0 (off)."""
    if value is None:
        return 0
    text = value.strip().upper().removesuffix("IB").removesuffix("B")
    suffix = text[-1:] if text[-1:] in _SIZE_SUFFIXES else ""
    digits = text[: len(text) - len(suffix)]
    if not digits.isdigit():
        raise click.BadParameter(
            f"{value!r} is not a size: give bytes, or a number with K, M or G (e.g. 1G)",
            ctx=ctx,
            param=param,
        )
    size = int(digits) * _SIZE_SUFFIXES[suffix]
    if not HPROF_BYTES_MIN <= size <= HPROF_BYTES_MAX:
        raise click.BadParameter(
            f"{value} is {size} bytes; a streamed heap dump is {HPROF_BYTES_MIN} to "
            f"{HPROF_BYTES_MAX} bytes",
            ctx=ctx,
            param=param,
        )
    return size


@click.command("sim", short_help="Run simulated DDM-speaking VMs for experiments and tests.")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="First port (0: free ports).",
)
@click.option(
    "--count",
    type=click.IntRange(1, 5000),
    default=1,
    show_default=True,
    help="Number of VMs, on consecutive ports from --port.",
)
@click.option("--pid", type=click.IntRange(1, 0x3FFFFFFF), default=4242, show_default=True)
@click.option("--app", default="com.example.sim", show_default=True, help="Process name.")
@click.option("--package", default=None, help="Package name (default: the --app value).")
@click.option(
    "--vm-ident",
    default="Dalvik v2.1.0",
    show_default=True,
    help='"Dalvik v1.6.0" gives Dalvik thread states.',
)
@click.option("--draft", is_flag=True, help="Use the 2007 draft chunk layouts.")
@click.option("--wait", is_flag=True, help="Wait for a debugger (WAIT before the HELO reply).")
@click.option(
    "--flavor",
    type=click.Choice(FLAVORS),
    default="art",
    show_default=True,
    help="art: Android 9-11, no reply when a handler returns nothing (until a debugger "
    "attaches); legacy: Dalvik and Android 5-8, empty replies; modern: Android 12+, no thread "
    "or heap handlers.",
)
@click.option(
    "--fail",
    "fail",
    metavar="TYPE[,TYPE...]",
    multiple=True,
    callback=_parse_fail_types,
    help="Refuse these request types with a FAIL chunk, e.g. --fail HPGC,HPSG.",
)
@click.option(
    "--apnm-delay",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds as <pre-initialized> before APNM names the app.",
)
@click.option("--threads", type=click.IntRange(1, 10000), default=8, show_default=True)
@click.option(
    "--churn-interval",
    type=click.FloatRange(0),
    default=4.0,
    show_default=True,
    help="Mean seconds between thread start/death/rename events (0: none).",
)
@click.option(
    "--gc-interval",
    type=click.FloatRange(0),
    default=3.0,
    show_default=True,
    help="Seconds between GCs (0: only on HPGC).",
)
@click.option("--heap-mb", type=click.IntRange(1, 2047), default=4, show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed (default: from the pid).")
@click.option(
    "--ack-dbgd",
    is_flag=True,
    help="Answer DBGD with a DBGD chunk (the draft's acknowledgement), as no shipped VM does.",
)
@click.option(
    "--hprof-bytes",
    metavar="SIZE",
    default=None,
    callback=_parse_size,
    help="Make the streamed heap dump a generated one of exactly SIZE bytes (e.g. 1G), sent "
    "in pieces and never held in memory (default: the small dump of the simulated heap).",
)
def sim_command(
    port: int,
    count: int,
    pid: int,
    app: str,
    package: str | None,
    vm_ident: str,
    draft: bool,
    wait: bool,
    flavor: Flavor,
    apnm_delay: float,
    threads: int,
    churn_interval: float,
    gc_interval: float,
    heap_mb: int,
    seed: int | None,
    ack_dbgd: bool,
    fail: tuple[str, ...],
    hprof_bytes: int,
) -> None:
    """Run simulated DDM-speaking VMs on 127.0.0.1 until Ctrl-C or SIGTERM."""
    base = SimConfig(
        port=port,
        pid=pid,
        app_name=app,
        package_name=package if package is not None else app.partition(":")[0],
        vm_ident=vm_ident,
        draft=draft,
        wait_for_debugger=wait,
        flavor=flavor,
        apnm_delay=apnm_delay,
        threads=threads,
        churn_interval=churn_interval,
        gc_interval=gc_interval,
        heap_mb=heap_mb,
        seed=seed,
        ack_dbgd=ack_dbgd,
        fail_types=fail,
        hprof_bytes=hprof_bytes,
    )
    try:
        configs = make_configs(base, count)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    failure: OSError | None = None
    try:
        trio.run(_run_cli, configs)
    except* OSError as group:
        failure = _first_leaf(group)
    if failure is not None:
        last = port + count - 1
        where = f"port {port}" if last == port else f"ports {port}..{last}"
        raise click.ClickException(
            f"cannot listen on 127.0.0.1 {where}: {failure} "
            "(choose other ports with --port, or --port 0 for free ones)"
        )


def _first_leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
