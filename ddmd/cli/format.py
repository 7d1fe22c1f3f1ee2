"""Human output of the client commands: tables, labels, one-line events, JSON printing.

Layer: pure functions over the daemon's JSON (plain dicts and lists); imports click (for
`print_json` and `show`) and, lazily, `ports.parse_time`. No HTTP, no trio: every function
here can be tested with a dict. Used by `cli.client`, `cli.ports` and `cli.events`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

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


def format_clients(vms: list[dict[str, Any]]) -> str:
    if not vms:
        return "no VMs are known to the daemon"
    rows = [
        (
            vm["id"],
            vm.get("pid"),
            _app_column(vm),
            _vm_name(vm),
            yes_no(vm.get("ddm")),
            "yes" if vm.get("waiting_for_debugger") else "",
            vm.get("threads"),
            vm.get("debugger_port"),
            vm.get("debugger"),
            "*" if vm.get("current") else "",
        )
        for vm in vms
    ]
    headers = ("ID", "PID", "APP/PACKAGE", "VM", "DDM", "WAIT", "THREADS", "PORT", "DEBUGGER")
    if any(vm.get("kind", "VM") != "VM" for vm in vms):
        # Clients that are not VMs (ddmd.client, e.g. `ddmd sysmon`) say what they are.
        kinds = [(*row, vm.get("kind", "VM")) for row, vm in zip(rows, vms, strict=True)]
        return _with_debuggers(table((*headers, "CURRENT", "KIND"), kinds), vms)
    return _with_debuggers(table((*headers, "CURRENT"), rows), vms)


def _with_debuggers(text: str, vms: list[dict[str, Any]]) -> str:
    attached = [(vm, d) for vm in vms for d in vm.get("debuggers") or ()]
    if attached:
        text += "\n\ndebuggers attached:\n" + table(
            ("VM", "TOOL", "PEER", "VIA", "PORT", "SINCE", "CMDS", "REPLIES+EVENTS", "SUSPENSIONS"),
            [
                (
                    vm["id"],
                    (d.get("tool") or "") + ("" if d.get("debugging", True) else " (DDM only)"),
                    d.get("peer"),
                    d.get("via"),
                    d.get("port"),
                    _clock(d.get("since")),
                    d.get("packets_in"),
                    d.get("packets_out"),
                    d.get("suspensions"),
                )
                for vm, d in attached
            ],
        )
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


def format_threads(body: dict[str, Any]) -> str:
    vm, threads = body["vm"], body.get("threads")
    head = f"threads of VM {vm_label(vm)}"
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
    lines = [f"{head}:", table(("ID", "TID", "STATE", "UTIME", "STIME", "DAEMON", "NAME"), rows)]
    if not body.get("supported", True):
        why = _missing(vm, "THST") or "the VM does not report thread states"
        lines.append(f"(thread names only: {why})")
    return "\n".join(lines)


def _by(mapping: dict[str, int] | None) -> str:
    if not mapping:
        return "-"
    return ", ".join(f"{name} {size(n)}" for name, n in mapping.items())


def format_heap(body: dict[str, Any]) -> str:
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
    for image in images:
        s = image["summary"]
        kind = "native heap" if image.get("native") else "heap"
        state = "" if image.get("complete", True) else " (incomplete dump)"
        lines.append("")
        lines.append(f"{kind} {image['heap_id']} segments{state}:")
        lines.append(
            table(
                ("USED", "FREE", "LARGEST FREE", "FREE RUNS", "FRAGMENTATION", "OBJECTS"),
                [
                    (
                        size(s.get("bytes_used")),
                        size(s.get("bytes_free")),
                        size(s.get("largest_free_run")),
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
    if compact:
        click.echo(json.dumps(data, separators=(",", ":")))
    else:
        click.echo(json.dumps(data, indent=2))


def show(body: Any, as_json: bool, render: Callable[[Any], str]) -> None:
    """Print the API's JSON as it came (``--json``), else ``render(body)``."""
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
        return vm_label(snapshot) if isinstance(snapshot, dict) else str(vm)
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
        return f"{vm}: " + "; ".join(_heap_info(h) for h in heaps)
    if name == "heap.dumped":
        heaps = event.get("heaps") or []
        return f"{vm}: " + "; ".join(
            f"heap {h.get('heap_id')} used {size(h.get('bytes_used'))}, free "
            f"{size(h.get('bytes_free'))}, fragmentation "
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
