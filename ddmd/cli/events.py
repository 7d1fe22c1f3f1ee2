"""`ddmd events`: follow the daemon's event stream (server-sent events, ``GET /api/v1/events``).

Layer: imports `cli.client` (address, httpx client, failures), `cli.format` and
`protocol.sse` (the wire format, standard library only); httpx lazily.

Filters, applied in the client (the stream carries every event):

- ``TARGET`` (a VM id, a pid, an app or package name, the end of one at a dot or colon, or a
  part of one, ignoring case: the rules of every other command, except that a target may match
  several VMs, and keeps matching the VMs that start later): only events about those VMs
  (``current.changed`` when the new or the previous current VM matches). The stream's own
  events (``stream.opened``, ``daemon.stopping``, ``overflow``) always pass. Names are looked
  up in the snapshots the stream carries (``stream.opened``, ``vm.found``, ``vm.changed``).
  A TARGET that names no VM the daemon lists and no app with a remembered debugger port is
  refused before the stream opens, with the candidates (exit 2), as every command refuses it.
- ``--type PATTERN`` (repeatable, or comma-separated; shell-style: ``'debugger.*'``): only
  events whose name matches one of them.
- ``--device SERIAL``: only events of that device's VMs and devices.

Human lines are one line per event, a VM's app named next to its id once known
(``tcp:8000 (com.example.mail)``): an ``ext.updated`` value is summarised (``ddmd sysmon``'s
report: load, memory, CPU; its five-minute history only in ``--json``), and thread counts add
up (every state is listed; threads whose state is not known yet are counted as "other").
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import click

from ddmd.cli.client import (
    API,
    CONNECT_TIMEOUT,
    EXIT_API_ERROR,
    EXIT_OK,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    Failure,
    client_options,
    daemon_address,
    no_daemon,
    run_with_api,
)
from ddmd.cli.format import format_event, size

__all__ = ["EVENTS_READ_TIMEOUT", "EventFilter", "event_line", "events"]

#: The daemon sends a keepalive comment every 15 s; three missed ones mean it is gone.
EVENTS_READ_TIMEOUT = 45.0


async def _tail_events(
    api: Api, show: Callable[[dict[str, Any]], bool | None], count: int | None
) -> None:
    """Read the stream until it ends (daemon stopping: return; otherwise Failure). ``count``:
    stop after that many events shown (``show`` returns False for one it filtered out)."""
    import httpx

    from ddmd.protocol.sse import SseDecoder

    base = api.address.shown
    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=EVENTS_READ_TIMEOUT)
    headers = {"Accept": "text/event-stream"}
    decoder = SseDecoder()
    last = ""
    seen = 0
    try:
        async with api.client.stream(
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
                    message += TOKEN_HINT
                raise Failure(message, EXIT_API_ERROR)
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
                if show(event) is False:
                    continue
                seen += 1
                if count is not None and seen >= count:
                    return
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise no_daemon(base) from None
    except httpx.ReadTimeout:
        raise Failure(
            f"the daemon at {base} sent nothing for {EVENTS_READ_TIMEOUT:g} s "
            "(not even a keepalive)",
            EXIT_API_ERROR,
        ) from None
    except httpx.TransportError as exc:
        raise Failure(
            f"the event stream from {base} broke: {type(exc).__name__}: {exc}", EXIT_API_ERROR
        ) from None
    if last == "daemon.stopping":
        return
    if last == "overflow":
        raise Failure("the daemon dropped this stream: it fell behind", EXIT_API_ERROR)
    raise Failure(f"the daemon at {base} closed the event stream", EXIT_API_ERROR)


# ------------------------------------------------------------------------------ filters

#: Events about the stream itself: never filtered out by a target.
STREAM_EVENTS = frozenset({"stream.opened", "daemon.stopping", "overflow"})
_UNNAMED = frozenset({"", "<pre-initialized>"})
_SEPARATORS = (".", ":")


def _names(vm: dict[str, Any]) -> list[str]:
    return [str(n) for n in (vm.get("app"), vm.get("package")) if n]


def target_matches(target: str, vm: dict[str, Any]) -> bool:
    """Whether ``vm`` (a snapshot's JSON) is one the target names: its id, its pid, an app or
    package name, the end of one at a dot or colon, or a part of one (ignoring case)."""
    target = target.strip()
    if not target:
        return False
    if vm.get("id") == target:
        return True
    if target.isascii() and target.isdigit():
        return vm.get("pid") == int(target)
    names = _names(vm)
    if target in names:
        return True
    real = [n.casefold() for n in names if n not in _UNNAMED]
    needle = target.casefold()
    bare = needle.lstrip("".join(_SEPARATORS))
    if bare and any(n.endswith(sep + bare) for n in real for sep in _SEPARATORS):
        return True
    return any(needle in n for n in real)


def _patterns(types: Iterable[str]) -> tuple[str, ...]:
    return tuple(p.strip() for t in types for p in t.split(",") if p.strip())


class EventFilter:
    """Which events to show (see the module docstring); follows the VMs' snapshots.

    Call it with every event, in order (it learns names from them), then `forget_gone`."""

    def __init__(
        self, target: str | None = None, types: Sequence[str] = (), device: str | None = None
    ) -> None:
        self.target = target
        self.types = _patterns(types)
        self.device = device
        self._vms: dict[str, dict[str, Any]] = {}  # vm id -> its latest snapshot JSON

    def __call__(self, event: dict[str, Any]) -> bool:
        name = str(event.get("event", ""))
        self._learn(name, event)
        if self.types and not any(fnmatch.fnmatchcase(name, p) for p in self.types):
            return False
        if name in STREAM_EVENTS:
            return True
        vms = self._vms_of(event)
        if self.device is not None:
            if event.get("device") not in (None, self.device):
                return False
            if vms and all(vm.get("device") not in (None, self.device) for vm in vms):
                return False  # only VMs of other devices
        if self.target is None:
            return True
        # An event about no VM (device.changed) never matches a target.
        return any(self._matches(vm) for vm in vms)

    def _learn(self, name: str, event: dict[str, Any]) -> None:
        if name == "stream.opened":
            for vm in event.get("vms") or []:
                if isinstance(vm, dict) and vm.get("id"):
                    self._vms[str(vm["id"])] = vm
            return
        vm_id = event.get("vm")
        if not isinstance(vm_id, str):
            return
        snapshot = event.get("snapshot")
        if isinstance(snapshot, dict) and name != "vm.gone":
            self._vms[vm_id] = {"id": vm_id, **self._vms.get(vm_id, {}), **snapshot}
        elif name == "vm.renamed":
            known = self._vms.setdefault(vm_id, {"id": vm_id})
            known.update(app=event.get("app"), package=event.get("package"))

    def apps(self) -> dict[str, str]:
        """VM id -> the name of its app (or package), for the VMs known by a name."""
        named = {}
        for vm_id, vm in self._vms.items():
            name = next((n for n in _names(vm) if n not in _UNNAMED), None)
            if name is not None:
                named[vm_id] = name
        return named

    def matches_any(self, vms: Iterable[dict[str, Any]]) -> bool:
        """Whether the target names one of ``vms`` (the VM list's JSON)."""
        return any(self._matches(vm) for vm in vms if isinstance(vm, dict))

    def forget_gone(self, event: dict[str, Any]) -> None:
        """After a ``vm.gone`` was judged: its snapshot is no longer needed."""
        if event.get("event") == "vm.gone" and isinstance(event.get("vm"), str):
            self._vms.pop(event["vm"], None)

    def _vms_of(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        ids = [event.get("vm")]
        if event.get("event") == "current.changed":
            ids.append(event.get("previous"))
        found = []
        for vm_id in ids:
            if not isinstance(vm_id, str):
                continue
            snapshot = event.get("snapshot") if event.get("event") == "vm.gone" else None
            vm = snapshot if isinstance(snapshot, dict) else self._vms.get(vm_id)
            found.append({"id": vm_id, **(vm or {})})
        return found

    def _matches(self, vm: dict[str, Any]) -> bool:
        if self.target is None or not target_matches(self.target, vm):
            return False
        # --device narrows pid and name matches to that device's VMs, as for other commands.
        return (
            self.device is None
            or vm.get("id") == self.target.strip()
            or (vm.get("device") == self.device)
        )


# ------------------------------------------------------------------------------ lines


def thread_states(threads: list[dict[str, Any]]) -> str:
    """``12 threads (running 1, timed-wait 1, wait 6, 4 other)``: the counts add up."""
    counts: dict[str, int] = {}
    other = 0
    for t in threads:
        state = t.get("state") if isinstance(t, dict) else None
        if state:
            counts[str(state)] = counts.get(str(state), 0) + 1
        else:
            other += 1
    parts = [f"{name} {n}" for name, n in sorted(counts.items())]
    if other and parts:
        parts.append(f"{other} other")
    noun = "thread" if len(threads) == 1 else "threads"
    return f"{len(threads)} {noun}" + (f" ({', '.join(parts)})" if parts else "")


def _number(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "?"
    return f"{value:.{digits}f}"


def _system_monitor(value: dict[str, Any]) -> str:
    """``ddmd sysmon``'s report in one line; its history is left to --json."""
    found = value.get("latest")
    latest: dict[str, Any] = found if isinstance(found, dict) else {}
    parts = []
    loads = latest.get("load")
    if isinstance(loads, list) and loads:
        parts.append("load " + " ".join(_number(x) for x in loads))
    share, total = latest.get("mem_used_share"), latest.get("mem_total_kib")
    if isinstance(share, int | float) and isinstance(total, int):
        parts.append(f"memory {100 * share:.0f} % used of {size(total * 1024)}")
    busy = [b for b in latest.get("cpu_busy") or [] if isinstance(b, int | float)]
    if busy:
        parts.append(f"CPU {100 * sum(busy) / len(busy):.0f} % ({len(busy)} CPUs)")
    history = value.get("history")
    if isinstance(history, list):
        parts.append(f"{len(history)} history points (--json)")
    return f"{value.get('kind')}: " + ", ".join(parts) if parts else str(value.get("kind"))


_SHORT = 40
_LINE_BUDGET = 160


def _summary(value: Any) -> str:
    """A handler's published value in a few words: its scalars, sizes of the rest."""
    if isinstance(value, dict):
        if value.get("kind") == "system monitor":
            return _system_monitor(value)
        parts = [str(value["kind"])] if isinstance(value.get("kind"), str) else []
        for key, item in value.items():
            if key == "kind":
                continue
            if isinstance(item, list):
                parts.append(f"{key}: {len(item)} items")
            elif isinstance(item, dict):
                parts.append(f"{key}: {len(item)} keys")
            else:
                text = json.dumps(item)
                parts.append(f"{key}={text if len(text) <= _SHORT else text[: _SHORT - 3] + '...'}")
        return ", ".join(parts)
    if isinstance(value, list):
        return f"{len(value)} items"
    text = json.dumps(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def event_line(event: dict[str, Any], apps: Mapping[str, str] | None = None) -> str:
    """The human line of one event (``format_event``, with ext.updated summarised and
    thread counts that add up); ``apps`` (VM id -> app name) names the app next to the VM."""
    name = str(event.get("event", ""))
    if name not in ("ext.updated", "threads.updated"):
        return format_event(event, apps)
    ts = str(event.get("ts") or "")
    clock = ts[11:19] if len(ts) >= 19 and ts[10] == "T" else ts
    vm_id = event.get("vm")
    app = (apps or {}).get(vm_id) if isinstance(vm_id, str) else None
    vm = f"{vm_id} ({app})" if app else (vm_id or "-")
    if name == "threads.updated":
        threads = event.get("threads")
        detail = thread_states(threads if isinstance(threads, list) else [])
    else:
        ext = event.get("ext")
        values = ext if isinstance(ext, dict) else {}
        detail = "; ".join(f"{handler}: {_summary(v)}" for handler, v in values.items())
        if len(detail) > _LINE_BUDGET:
            detail = detail[: _LINE_BUDGET - 3] + "..."
    return f"{clock} {name:<24} {vm}: {detail}".rstrip()


# ------------------------------------------------------------------------------ the command


async def _known_target(api: Api, wanted: EventFilter, target: str) -> None:
    """Refuse a TARGET that names nothing the daemon knows, as every command does (exit 2,
    the candidates): no VM now (by `target_matches`, which may name several), and no app
    with a remembered debugger port (an app that is not running now but ran before: its
    events are shown when it starts again)."""
    listed = await api.call("GET", f"{API}/vms")
    if wanted.matches_any(listed if isinstance(listed, list) else []):
        return
    try:
        book = await api.call("GET", f"{API}/ports")
    except Failure:
        book = None
    entries = book.get("ports") if isinstance(book, dict) else None
    apps = [
        {"id": "", "app": e.get("app"), "device": e.get("device")}
        for e in entries or []
        if isinstance(e, dict) and e.get("app")
    ]
    if wanted.matches_any(apps):
        return
    # The daemon's own refusal, with its candidates (a target it finds after all: go on).
    await api.call("GET", api.vm_path(target))


@click.command("events", short_help="Print the daemon's events as they happen, until Ctrl-C.")
@click.argument("target", required=False)
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@click.option(
    "--type",
    "types",
    metavar="PATTERN",
    multiple=True,
    help="Only events whose name matches (e.g. 'debugger.*'; repeat it or use commas).",
)
@click.option("--json", "as_json", is_flag=True, help="Print each event as one JSON line.")
@client_options
def events(
    target: str | None,
    count: int | None,
    types: tuple[str, ...],
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Follow the daemon's events (VMs found and gone, debuggers, current VM, threads, heaps)
    until Ctrl-C: one line per event, or one JSON object per line with --json.

    TARGET (a VM id, pid, app or package name, or part of one) shows only the events of the
    VMs it names, also of those that start later; a TARGET that names no VM and no app with a
    remembered debugger port is refused, with the candidates. Examples:

    \b
      ddmd events mail --type 'debugger.*'
      ddmd events --type vm.found,vm.gone --json
    """
    where = daemon_address("events", config_file, control, None)
    wanted = EventFilter(target, types, device)

    def show(event: dict[str, Any]) -> bool:
        shown = wanted(event)
        wanted.forget_gone(event)
        if not shown:
            return False
        if as_json:
            click.echo(json.dumps(event, separators=(",", ":")))
        else:
            click.echo(event_line(event, wanted.apps()))
        return True

    async def work(api: Api) -> None:
        if target is not None:
            await _known_target(api, wanted, target)
        await _tail_events(api, show, count)

    try:
        run_with_api("events", where, work)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_OK) from None
