"""``ddmd allocs``: DDMS's "Allocation Tracker" as a client command over the control API. It
switches the tracker on and off, says whether it is on, and shows what it recorded: the newest
allocations (class, size, thread, where) and the totals by class and by allocation site.

Routes (``/api/v1/vms/{target}/...``): ``GET .../allocs[?top=N]``, ``POST .../allocs/start|stop``,
``GET .../profiling`` (for ``--status``) and ``GET .../threads`` (the allocating threads' names).

Layer: imports `cli.client`, `cli.capture` (a DDM client that is not a VM is refused),
`cli.format` and `protocol.hprofwire` (class names in source form); trio lazily (through
`run_with_api`). `cli.profiling` re-exports the names here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from ddmd.cli.capture import only_a_vm
from ddmd.cli.client import (
    Api,
    Failure,
    client_options,
    daemon_address,
    json_option,
    not_available,
    run_with_api,
    target_argument,
    vm_of,
)
from ddmd.cli.format import print_json, table, vm_label
from ddmd.protocol.hprofwire import java_class_name

__all__ = ["ALL_ROWS", "allocs", "format_allocations", "java_name", "thread_names"]

#: What `ddmd allocs --top 0` asks the daemon for: more rows than one REAL chunk can list.
ALL_ROWS = 65535

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
        vm = await vm_of(api, target)
        await only_a_vm(api, vm, "allocs")
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
    label = vm_label(vm)
    if action == "status" and _allocs_feature(body).get("available") is False:
        feature = _allocs_feature(body)
        reason = str(feature.get("reason") or "the VM does not offer the allocation tracker")
        name = str(vm.get("name") or vm["id"])
        # The daemon's sentence may name the VM itself; then it is said once.
        sentence = reason if name in reason else f"{label}: {reason}"
        if not as_json:
            click.echo(sentence)
        not_available("allocs", sentence)  # the table's 1; with --json the error's shape
    if as_json:
        print_json(body)
        return
    if action in ("start", "stop"):
        enabled = body.get("enabled") if isinstance(body, dict) else None
        click.echo(f"allocation tracking {_tracking_words(enabled)} for {label}")
    elif action == "status":
        click.echo(f"allocation tracking {_tracking_words(body.get('allocs'))} for {label}")
    else:
        click.echo(format_allocations(body, label, top, threads=names, verbose=verbose))
