"""Human output of the client commands: tables, labels, one-line events, JSON printing.

What a person reads is in words (`cli.words`): heap kinds as the web page names them, thread
states in one vocabulary, CPU times in seconds, debuggers by their program, a JVM by its short
name; details for experts (segment units and runs, fragmentation, a debugger's address, the
whole JDWP banner) only with ``verbose``. ``--json`` (`print_json`) prints the daemon's JSON with
its times in ISO 8601 and heap-info reasons named (`cli.words.json_words`).

Layer: pure functions over the daemon's JSON (plain dicts and lists); imports click (for
`print_json` and `show`), `cli.words` and, lazily, `portbook.parse_time`. No HTTP, no trio:
every function here can be tested with a dict. Used by `cli.client`, `cli.ports` and
`cli.events`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import click

from ddmd.cli.words import (
    cpu_time,
    debugger_words,
    heap_info_reason,
    heap_kind,
    json_words,
    short_vm_name,
    thread_state,
)

__all__ = [
    "adb_off_message",
    "forgotten_line",
    "format_clients",
    "format_devices",
    "format_event",
    "format_frame",
    "format_gc",
    "format_heap",
    "format_ports",
    "format_select",
    "format_stack",
    "format_threads",
    "origin_lines",
    "print_json",
    "show",
    "size",
    "table",
    "vm_label",
    "yes_no",
]


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart; the last column is not padded."""
    cells = [list(headers)] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [value.ljust(width) for value, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def yes_no(value: object) -> str:
    if value is None:
        return "?"
    return "yes" if value else "no"


def size(n: int | None) -> str:
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


def _vm_name(vm: dict[str, Any], *, verbose: bool = False) -> str | None:
    """The short name (`short_vm_name`: ``OpenJDK 17.0.15``, ``ART``); with ``verbose``
    vm_ident, else the JVM line of a JDWP version description (it has three)."""
    if not verbose:
        return short_vm_name(vm)
    if vm.get("vm_ident"):
        return str(vm["vm_ident"])
    lines = [line.strip() for line in str(vm.get("description") or "").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return None
    name = next((line for line in lines if line.startswith("JVM version")), lines[0])
    return name if len(name) <= _MAX_VM_NAME else name[: _MAX_VM_NAME - 3] + "..."


def _is_vm(vm: dict[str, Any]) -> bool:
    """False for a DDM client that is not a VM (``kind``, e.g. "system monitor")."""
    return bool(vm.get("kind", "VM") == "VM")


def _sort_key(vm: dict[str, Any]) -> tuple[object, ...]:
    """Local VMs first, then by device; by name (case ignored), pid and id within each."""
    name = str(vm.get("name") or vm.get("app") or vm.get("package") or vm.get("id") or "")
    pid = vm.get("pid")
    return (
        vm.get("device") is not None,
        str(vm.get("device") or ""),
        name.casefold(),
        pid if isinstance(pid, int) else -1,
        str(vm.get("id")),
    )


def _debuggers_cell(vm: dict[str, Any]) -> str | None:
    """Who debugs the VM: each attached debugger's program (``jdb pid 1234``)."""
    attached = vm.get("debuggers") or []
    if attached:
        return ", ".join(debugger_words(d) for d in attached)
    return "yes" if vm.get("debugger") else None


def vm_label(vm: dict[str, Any]) -> str:
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


def format_clients(vms: list[dict[str, Any]], *, verbose: bool = False) -> str:
    """The VMs, sorted (`_sort_key`). A DDM client that is not a VM (``ddmd sysmon``) has no
    debugger port and cannot be current: those cells stay empty. ``verbose``: the whole VM
    name and each debugger's address."""
    if not vms:
        return "no VMs are known to the daemon"
    vms = sorted(vms, key=_sort_key)
    rows = [
        (
            vm["id"],
            vm.get("pid"),
            _app_column(vm),
            _vm_name(vm, verbose=verbose),
            yes_no(vm.get("ddm")),
            "yes" if vm.get("waiting_for_debugger") else "",
            vm.get("threads"),
            vm.get("debugger_port") if _is_vm(vm) else "",
            _debuggers_cell(vm),
            "*" if vm.get("current") and _is_vm(vm) else "",
        )
        for vm in vms
    ]
    headers = ("ID", "PID", "APP/PACKAGE", "VM", "DDM", "WAIT", "THREADS", "PORT", "DEBUGGER")
    if not all(_is_vm(vm) for vm in vms):
        # Clients that are not VMs (ddmd.client, e.g. `ddmd sysmon`) say what they are.
        kinds = [(*row, vm.get("kind", "VM")) for row, vm in zip(rows, vms, strict=True)]
        return _with_debuggers(table((*headers, "CURRENT", "KIND"), kinds), vms, verbose)
    return _with_foresight(
        _with_debuggers(table((*headers, "CURRENT"), rows), vms, verbose), vms, verbose
    )


def _with_foresight(text: str, vms: list[dict[str, Any]], verbose: bool) -> str:
    """``verbose``: per VM with foresight figures, its round trip and what ddmd answered."""
    rows = []
    for vm in vms:
        f = vm.get("foresight")
        if not verbose or not isinstance(f, dict) or (f.get("round_trip") is None and not f["on"]):
            continue
        trip = f.get("round_trip")
        rows.append(
            (
                vm["id"],
                "on" if f.get("on") else "off",
                None if trip is None else f"{trip * 1000:.2f} ms",
                f.get("answered_cache"),
                f.get("answered_speculation"),
                f.get("speculated"),
                f.get("wasted"),
            )
        )
    if rows:
        headers = ("VM", "FORESIGHT", "ROUND TRIP", "CACHED", "FORESEEN", "ASKED", "WASTED")
        text += "\n\nforesight (answered by ddmd):\n" + table(headers, rows)
    return text


def _with_debuggers(text: str, vms: list[dict[str, Any]], verbose: bool = False) -> str:
    attached = [(vm, d) for vm in vms for d in vm.get("debuggers") or ()]
    if attached:
        headers = ("VM", "DEBUGGER", "VIA", "PORT", "SINCE", "CMDS", "REPLIES+EVENTS")
        rows = [
            (
                vm["id"],
                debugger_words(d),
                d.get("via"),
                d.get("port"),
                _clock(d.get("since")),
                d.get("packets_in"),
                d.get("packets_out"),
                d.get("suspensions"),
                *((d.get("peer"),) if verbose else ()),
            )
            for vm, d in attached
        ]
        more = ("SUSPENSIONS", "PEER") if verbose else ("SUSPENSIONS",)
        text += "\n\ndebuggers attached:\n" + table((*headers, *more), rows)
    return text


def _clock(epoch: object) -> str | None:
    """Local wall-clock time of an epoch timestamp (HH:MM:SS), or None."""
    if not isinstance(epoch, int | float):
        return None
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def format_devices(devices: list[dict[str, Any]]) -> str:
    if not devices:
        return (
            "no Android devices are known to the daemon "
            "(none plugged in, or no adb server: see adb.* events in the daemon's log)"
        )
    rows = [(d["serial"], d.get("state"), d.get("model"), d.get("vms", 0)) for d in devices]
    return table(("SERIAL", "STATE", "MODEL", "VMS"), rows)


def format_threads(body: dict[str, Any], *, verbose: bool = False) -> str:
    """The thread table: states in one vocabulary (`cli.words.thread_state`), CPU times in
    seconds; ``verbose`` adds THST's raw status value and the ticks."""
    vm, threads = body["vm"], body.get("threads")
    head = f"threads of VM {vm_label(vm)}"
    if threads is None:
        why = _missing(vm, "THST") or _missing(vm, "THEN") or "the VM has reported no threads yet"
        return f"{head}: not available: {why}"
    rows = [
        (
            t["id"],
            t.get("tid"),
            _state(t, verbose),
            _cpu(t.get("utime"), verbose),
            _cpu(t.get("stime"), verbose),
            "\u2014" if t.get("daemon") is None else ("daemon" if t["daemon"] else ""),
            t.get("name"),
        )
        for t in threads
    ]
    headers = ("ID", "TID", "STATE", "USER CPU", "SYSTEM CPU", "DAEMON", "NAME")
    source = body.get("source")
    if source == "Thread.print":
        head += ", from its thread dump (IDs as jstack's #N)"
    lines = [f"{head}:", table(headers, rows)]
    left_out = body.get("left_out")
    if isinstance(left_out, dict):
        lines.append(_left_out(left_out, verbose))
    if not body.get("supported", True):
        why = _missing(vm, "THST") or "the VM does not report thread states"
        lines.append(f"(thread names only: {why})")
    return "\n".join(lines)


def _left_out(left_out: dict[str, Any], verbose: bool) -> str:
    """The threads the list leaves out and why: ``(left out: 7 threads, ...: names)``."""
    count, names = left_out.get("count"), left_out.get("names") or []
    what = "" if count is None else f"{count} thread{'' if count == 1 else 's'}, "
    shown = names if verbose or len(names) <= 8 else [*names[:8], f"{len(names) - 8} more"]
    listed = f": {', '.join(shown)}" if shown else ""
    return f"(left out: {what}{left_out.get('why')}{listed})"


def _state(thread: dict[str, Any], verbose: bool) -> str | None:
    java = thread.get("java_state")
    if java:  # a plain JVM's thread dump: ddmd's word and jstack's
        return f"{thread_state(thread.get('state'))} ({java})"
    state = thread_state(thread.get("state"))
    status = thread.get("status")
    if state is None:
        return None if status is None else f"status {status}"
    return f"{state} ({status})" if verbose and status is not None else state


def _cpu(ticks: object, verbose: bool) -> str | None:
    text = cpu_time(ticks)
    return f"{text} ({ticks} ticks)" if verbose and text is not None else text


def _by(mapping: dict[str, int] | None) -> str:
    if not mapping:
        return "-"
    return ", ".join(f"{heap_kind(name)} {size(n)}" for name, n in mapping.items())


def _reported(heaps: list[dict[str, Any]]) -> str | None:
    """When and why the VM sent the heap figures: "reported at 12:01:02, after a GC"."""
    said = []
    for h in heaps:
        stamp = h.get("timestamp_ms")
        clock = _clock(stamp / 1000) if isinstance(stamp, int | float) and stamp else None
        reason = heap_info_reason(h.get("reason"), human=True)
        parts = [f"at {clock}" if clock else None, reason if isinstance(reason, str) else None]
        text = ", ".join(p for p in parts if p)
        if text and text not in said:
            said.append(text)
    return "reported " + "; ".join(said) if said else None


def _free_space(s: dict[str, Any], verbose: bool) -> str:
    """The free space in words, so that a high fragmentation on a healthy heap does not alarm."""
    runs = s.get("free_run_count")
    line = (
        f"  free: {size(s.get('bytes_free'))} in {runs} runs between objects, the largest "
        f"{size(s.get('largest_free_run'))}"
    )
    if runs and runs > 1:
        line += (
            " (many small runs are usual between collections; they matter only when an "
            "object larger than the largest run cannot be allocated)"
        )
    if verbose:
        line += (
            f"; fragmentation {100 * float(s.get('fragmentation') or 0.0):.1f} % "
            "(the share of free bytes outside the largest run)"
        )
    return line


def format_heap(body: dict[str, Any], *, verbose: bool = False) -> str:
    """Heap sizes, and each segment dump's summary; ``verbose`` adds fragmentation and every
    segment's units and runs."""
    vm = body["vm"]
    lines = [f"heap of VM {vm_label(vm)}:"]
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
                size(h.get("max_size")),
                size(h.get("size")),
                size(h.get("bytes_allocated")),
                h.get("objects_allocated"),
            )
            for h in heaps
        ]
        lines.append(table(("HEAP", "MAX", "SIZE", "ALLOCATED", "OBJECTS"), rows))
        origins = body.get("origins")
        said = origin_lines(origins.get("heaps")) if isinstance(origins, dict) else None
        if said is None:  # a daemon from before `origins`: HPIF's own time and reason
            reported = _reported(heaps)
            said = [f"  {reported}"] if reported else []
        lines.extend(said)
    images_origin = (body.get("origins") or {}).get("images")
    for image in images:
        s = image["summary"]
        kind = "native heap" if image.get("native") else "heap"
        state = "" if image.get("complete", True) else " (incomplete dump)"
        lines.append("")
        lines.append(f"{kind} {image['heap_id']} segments{state}:")
        lines.append(
            table(
                ("USED", "FREE", "LARGEST FREE", "FREE RUNS", "OBJECTS"),
                [
                    (
                        size(s.get("bytes_used")),
                        size(s.get("bytes_free")),
                        size(s.get("largest_free_run")),
                        s.get("free_run_count"),
                        s.get("object_count"),
                    )
                ],
            )
        )
        lines.append(f"  used by kind: {_by(s.get('bytes_by_kind'))}")
        lines.append(_free_space(s, verbose))
        segments = image.get("segments") or []
        if verbose:
            lines.extend(
                f"  segment 0x{seg['address']:08x}-0x{seg['end']:08x}: {seg['units']} units "
                f"of {seg['unit_size']} B, {len(seg.get('runs') or [])} runs"
                for seg in segments
            )
        elif segments:
            lines.append(f"  {len(segments)} segments (--json gives their units and runs)")
        lines.extend(f"  problem: {p['message']}" for p in image.get("problems") or [])
    if images:
        lines.extend(origin_lines(images_origin) or [])
    return "\n".join(lines)


def origin_lines(origin: object) -> list[str] | None:
    """Which GC a heap table or the segment summaries come from (``origins`` of the heap
    JSON, worded by the daemon as the web page shows them): "  taken at 12:01:02, after the GC
    ddmd ran", and its note when the other part comes from another GC. None: not said."""
    if not isinstance(origin, dict) or not isinstance(origin.get("why"), str):
        return None
    clock = _clock(origin.get("at"))
    when = f"taken at {clock}" if clock else "taken at a time ddmd does not know"
    lines = [f"  {when}, {origin['why']}"]
    if isinstance(origin.get("note"), str):
        lines.append(f"  note: {origin['note']}")
    return lines


def _heap_info(heap: dict[str, Any]) -> str:
    return (
        f"heap {heap.get('heap_id')} {size(heap.get('bytes_allocated'))} allocated "
        f"of {size(heap.get('size'))}"
    )


def format_gc(body: dict[str, Any]) -> str:
    """What `ddmd gc` says: done (with the heaps after it) or only requested (and why)."""
    label = vm_label(body["vm"])
    if not body.get("confirmed"):
        note = body.get("note") or "the VM gave no confirmation"
        return f"GC requested on {label}; {note}"
    line = f"GC done on {label}"
    heaps = body.get("heaps") or []
    if heaps:
        line += ": " + ", ".join(_heap_info(h) for h in heaps)
    return line


def format_select(body: dict[str, Any]) -> str:
    """What `ddmd select` says: the VM now current, and its own debugger port."""
    port = body["vm"].get("debugger_port")
    extra = f"; its own debugger port is {port}" if port else ""
    return f"current VM: {vm_label(body['vm'])}{extra}"


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
    lines = [f"thread {thread} of VM {vm_label(body['vm'])}:"]
    lines.extend(format_frame(f) for f in frames)
    if not frames:
        lines.append("  (no frames)")
    return "\n".join(lines)


def print_json(data: Any, *, compact: bool = False) -> None:
    """``data`` as JSON, its times in ISO 8601 and heap-info reasons named (`json_words`)."""
    data = json_words(data)
    if compact:
        click.echo(json.dumps(data, separators=(",", ":")))
    else:
        click.echo(json.dumps(data, indent=2))


def show(body: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print the API's JSON (``--json``: `print_json`), else ``render(body)``."""
    if as_json:
        print_json(body)
    else:
        click.echo(render(body))


def adb_off_message(health: Any) -> str | None:
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
    from ddmd.portbook import parse_time

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
        if e.get("in_use"):
            shown = "connected now"
        else:
            shown = seen if when is None else f"{seen} ({_age(max(0.0, now - when))})"
        in_use = f"yes ({e['vm']})" if e.get("in_use") and e.get("vm") else yes_no(e.get("in_use"))
        rows.append((e.get("app"), e.get("device"), e.get("port"), shown, in_use))
    return "\n".join([f"{head}:", table(("APP", "DEVICE", "PORT", "LAST SEEN", "IN USE"), rows)])


def forgotten_line(entry: dict[str, Any]) -> str:
    return (
        f"forgot debugger port {entry.get('port')} of {entry.get('app')} "
        f"({entry.get('device')}); the app gets a port again when its VM is next seen"
    )


_SHORT_VALUE = 40


def _short(value: object) -> bool:
    return (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= _SHORT_VALUE)
    )


def _feature_words(codes: object) -> str:
    """DDM request types ("HPIF") as what they give a user ("heap information")."""
    from ddmd.session.words import words

    items = codes if isinstance(codes, list | tuple) else ()
    named = dict.fromkeys(words(str(code)) for code in items)
    return ", ".join(named) or "none"


def _changes(event: dict[str, Any]) -> str:
    snapshot = event.get("snapshot") or {}
    keys = event.get("changed")
    if not keys:
        return "snapshot"
    shown = []
    for k in keys:
        value = snapshot.get(k)
        if k == "unsupported":
            shown.append(f"not available: {_feature_words(value)}")
        elif k == "missing":
            continue  # the same features as "unsupported", with their sentences
        elif _short(value):
            shown.append(f"{k}={'-' if value is None else value}")
        else:
            shown.append(k)
    return ", ".join(shown) or "snapshot"


def _thread_states(threads: list[dict[str, Any]]) -> str:
    """``12 threads (running 1, timed-wait 1, wait 6, 4 other)``: the counts add up."""
    counts: dict[str, int] = {}
    unknown = 0
    for t in threads:
        state = thread_state(t.get("state"))
        if state is None:
            unknown += 1
        else:
            counts[state] = counts.get(state, 0) + 1
    parts = [f"{name} {n}" for name, n in sorted(counts.items())]
    if counts and unknown:
        parts.append(f"{unknown} other")
    return f"{len(threads)} threads" + (f" ({', '.join(parts)})" if parts else "")


def _named(vm_id: Any, apps: Mapping[str, str]) -> str:
    """A VM id with its app's name next to it when known: ``tcp:8000 (com.example.mail)``."""
    app = apps.get(vm_id) if isinstance(vm_id, str) else None
    return f"{vm_id} ({app})" if app else str(vm_id)


def _event_detail(event: dict[str, Any], apps: Mapping[str, str]) -> str:
    name = str(event.get("event", ""))
    vm = _named(event.get("vm"), apps) if event.get("vm") else "-"
    snapshot = event.get("snapshot")
    if name == "stream.opened":
        return f"{len(event.get('vms') or [])} VMs, current VM {event.get('current') or 'none'}"
    if name in ("vm.found", "vm.gone"):
        return vm_label(snapshot) if isinstance(snapshot, dict) else str(vm)
    if name == "vm.changed":
        return f"{vm}: {_changes(event)}"
    if name == "vm.renamed":
        before = event.get("previous_package") or event.get("previous_app")
        return f"{vm}: {before} -> {event.get('package') or event.get('app')}"
    if name in ("debugger.attached", "debugger.detached"):
        return f"{vm}: {event.get('debugger')}"
    if name == "current.changed":
        now = _named(event["vm"], apps) if event.get("vm") else "none"
        was = _named(event["previous"], apps) if event.get("previous") else "none"
        return f"{now} (was {was})"
    if name == "threads.updated":
        return f"{vm}: {_thread_states(event.get('threads') or [])}"
    if name == "heap.info":
        heaps = event.get("heaps") or []
        return f"{vm}: " + "; ".join(_heap_info(h) for h in heaps)
    if name == "heap.dumped":
        heaps = event.get("heaps") or []
        return f"{vm}: " + "; ".join(
            f"heap {h.get('heap_id')} used {size(h.get('bytes_used'))}, free "
            f"{size(h.get('bytes_free'))}, largest free run {size(h.get('largest_free_run'))}"
            for h in heaps
        )
    if name in ("device.changed", "device.gone"):
        parts = [event.get("device"), event.get("state"), event.get("model")]
        return " ".join(str(p) for p in parts if p)
    if name in ("overflow", "daemon.stopping"):
        return str(event.get("reason") or "")
    # The port book's keys ("local|com.example.mail") are ddmd's own: never shown.
    rest = {k: v for k, v in event.items() if k not in ("event", "ts", "vm", "key", "selected")}
    return " ".join(p for p in (str(vm) if event.get("vm") else "", json.dumps(rest)) if p)


def format_event(event: dict[str, Any], apps: Mapping[str, str] | None = None) -> str:
    """One line per event: time (HH:MM:SS, UTC as sent), name, what it says; ``apps`` (VM id
    -> app name) puts the app's name next to a VM's id."""
    ts = str(event.get("ts") or "")
    clock = ts[11:19] if len(ts) >= 19 and ts[10] == "T" else ts
    name = str(event.get("event", "?"))
    return f"{clock} {name:<24} {_event_detail(event, apps or {})}".rstrip()
