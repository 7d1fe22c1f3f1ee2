"""`ddmd logcat`: an app's log, pidcat-style, followed across the app's restarts.

Layer: imports `cli.client` (the daemon's address, the httpx client, failures and exit codes)
and `protocol.sse` (the wire format, standard library only); httpx and trio lazily. No protocol
code: lines come filtered and attributed from the daemon. Routes used::

    GET /api/v1/vms/TARGET                 which VM TARGET is: its device and app name
    GET /api/v1/current                    the current VM (no TARGET)
    GET /api/v1/logcat?device=&app=|all=   recent lines (--no-follow)
    GET /api/v1/logcat/stream?...          SSE: logcat.opened, then logcat.lines batches

The target is resolved once, to (device, app name); the log is then followed by that name, so
it goes on when the app dies (a restart separator, then the next pid's lines). A broken
connection is reopened with ``after=`` the last item seen, a few times, with a message. A VM
without a name yet, or a workstation JVM (no device), is asked through its VM route once, so
the daemon's own sentence is printed (exit 1, as for other features a VM lacks).

Exit codes are `cli.exits`': 0 (also Ctrl-C), 1 (the API said no, the stream could not be
reopened), 2 (TARGET, usage), 3 (no daemon).
"""

from __future__ import annotations

import json
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import click

from ddmd.cli.client import (
    API,
    CONNECT_TIMEOUT,
    EXIT_API_ERROR,
    EXIT_NO_DAEMON,
    EXIT_OK,
    EXIT_TARGET,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    Failure,
    app_name,
    client_options,
    daemon_address,
    no_daemon,
    run_with_api,
)

__all__ = [
    "LEVELS",
    "RECONNECT_DELAYS",
    "LogcatPrinter",
    "Source",
    "logcat",
    "parse_since",
]

LEVELS = ("V", "D", "I", "W", "E", "F")
#: The daemon sends a keepalive comment every 15 s; three missed ones mean the stream is dead.
STREAM_READ_TIMEOUT = 45.0
#: Seconds to wait before each attempt to reopen a broken stream (then give up).
RECONNECT_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)

TAG_WIDTH = 23  # pidcat's default
APP_WIDTH = 24
#: Tag colours (pidcat's palette); a tag's colour comes from a hash of it, so it never changes.
TAG_COLORS = ("red", "green", "yellow", "blue", "magenta", "cyan")
#: Level badges: (foreground, background), as pidcat draws them (F: red on white).
LEVEL_STYLES: dict[str, tuple[str, str]] = {
    "V": ("white", "black"),
    "D": ("black", "blue"),
    "I": ("black", "green"),
    "W": ("black", "yellow"),
    "E": ("black", "red"),
    "F": ("red", "white"),
}
CRASH_WORDS = {"java": "CRASH", "native": "NATIVE CRASH", "anr": "ANR", "died": "DIED"}

_SINCE = re.compile(r"(\d+(?:\.\d+)?)\s*([smh]?)")


def parse_since(text: str) -> str:
    """``--since``: "200" (the last lines) or "30s"/"5m"/"2h" (as the daemon reads it)."""
    if _SINCE.fullmatch(text.strip().lower()) is None:
        raise ValueError(
            f"--since {text!r}: give a number of lines (200) or a duration (30s, 5m, 2h)"
        )
    return text.strip().lower()


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _grep_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"{value!r} is not a regular expression: {exc}") from None
    return value


# --------------------------------------------------------------------------------------------------
# Output


def _tag_color(tag: str) -> str:
    return TAG_COLORS[zlib.crc32(tag.encode("utf-8", "replace")) % len(TAG_COLORS)]


def _local_time(stamp: object) -> str:
    """The API's "2024-03-14T12:00:01.123456Z" as logcat shows it: "03-14 13:00:01.123"."""
    try:
        when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).astimezone()
    except ValueError:
        return str(stamp)[:18].ljust(18)
    return when.strftime("%m-%d %H:%M:%S.") + f"{when.microsecond // 1000:03d}"


def _fit(text: str, width: int) -> str:
    """At most `width` characters, keeping the end (the distinctive part of a package name)."""
    return text if len(text) <= width else "\u2026" + text[-(width - 1) :]


@dataclass
class LogcatPrinter:
    """Turns the API's items into pidcat-style lines. Keeps what pidcat keeps between lines:
    the last tag (repeated tags are blanked) and, per pid and app, whether a crash block is
    open (its first line gets the crash's name, every line a red "!!")."""

    color: bool = False
    show_time: bool = False
    show_app: bool = False
    _last: tuple[object, ...] | None = None  # (pid, app, tag) of the previous line
    _crash: dict[tuple[object, object], str | None] = field(default_factory=dict)

    def _style(self, text: str, **style: Any) -> str:
        return click.style(text, **style) if self.color else text

    def lines(self, item: Mapping[str, Any]) -> list[str]:
        kind = item.get("kind")
        if kind == "restart":
            self._last = None
            text = str(item.get("text") or f"{item.get('app')} restarted")
            return [self._style(f"\u2500\u2500 {text} \u2500\u2500", bold=True)]
        if kind != "line":
            other = item.get("text")  # a kind this version does not know: its text, if any
            return [] if other is None else [str(other)]
        return self._line(item)

    def _line(self, item: Mapping[str, Any]) -> list[str]:
        pid, tag = item.get("pid"), str(item.get("tag") or "")
        key = (pid, item.get("app"), tag)
        level = str(item.get("level") or "?")
        head: list[str] = []
        width = 0
        if self.show_time:
            stamp = _local_time(item.get("time"))
            head.append(self._style(stamp, dim=True) + " ")
            width += len(stamp) + 1
        if self.show_app:
            app = item.get("app") or f"pid {pid}"
            text = _fit(str(app), APP_WIDTH).ljust(APP_WIDTH)
            head.append(self._style(text, fg=_tag_color(str(app))) + " ")
            width += APP_WIDTH + 1
        if self._last == key:
            head.append(" " * (TAG_WIDTH + 1))  # pidcat blanks a repeated tag
        else:
            head.append(
                self._style(_fit(tag, TAG_WIDTH).rjust(TAG_WIDTH), fg=_tag_color(tag)) + " "
            )
        self._last = key
        fg, bg = LEVEL_STYLES.get(level, ("white", "black"))
        head.append(self._style(f" {level} ", fg=fg, bg=bg, bold=level == "F" or None) + " ")
        width += TAG_WIDTH + 1 + 3 + 1

        crash = item.get("crash")
        mark = ""
        if crash:
            mark = self._style("!!", fg="red", bold=True) + " "
        first_mark = mark
        if crash and self._crash.get(key[:2]) != crash:  # a new block of (pid, app)
            word = CRASH_WORDS.get(str(crash), str(crash).upper())
            badge = f" {word} " if self.color else word  # a padded badge, or the word alone
            first_mark += self._style(badge, fg="white", bg="red", bold=True) + " "
        self._crash[key[:2]] = str(crash) if crash else None

        # Lines that end with a line break (a tombstone's) print as logcat prints them.
        message = str(item.get("message") or "").rstrip("\r\n").split("\n")
        out = ["".join(head) + first_mark + message[0]]
        out.extend(" " * width + mark + rest for rest in message[1:])
        return out


# --------------------------------------------------------------------------------------------------
# What to follow


@dataclass(frozen=True, slots=True)
class Source:
    """Where the lines come from: a route (recent lines; ``/stream`` after it for SSE) and its
    query (``device`` and ``app``, or ``all``), plus what messages call it."""

    path: str
    query: tuple[tuple[str, str], ...]
    label: str

    def params(self, filters: list[tuple[str, str]]) -> dict[str, str | list[str]]:
        """The query with `filters` (a repeated key, such as ``tag``, becomes a list)."""
        out: dict[str, str | list[str]] = {}
        for key, value in [*self.query, *filters]:
            known = out.get(key)
            if known is None:
                out[key] = value
            elif isinstance(known, list):
                known.append(value)
            else:
                out[key] = [known, value]
        return out


async def _only_device(api: Api) -> str | None:
    """The serial of the one device online (adb's ``device`` state), None unless exactly one."""
    try:
        listed = await api.call("GET", f"{API}/devices")
    except Failure as failure:
        if failure.code == EXIT_NO_DAEMON:
            raise
        return None  # no device list (adb off, an older daemon): as without --all
    online = [
        str(d["serial"])
        for d in (listed if isinstance(listed, list) else [])
        if isinstance(d, dict) and d.get("serial") and d.get("state") == "device"
    ]
    return online[0] if len(online) == 1 else None


async def _resolve(
    api: Api, target: str | None, device: str | None, whole: bool, filters: list[tuple[str, str]]
) -> Source:
    """TARGET (or the current VM, or ``--device`` with ``--all``) as a `Source`. ``--all``
    alone takes the only device when exactly one is online, as adb does; otherwise the device
    of the current VM."""
    if target is None and whole and not device:
        device = await _only_device(api)
    if target is None and whole and device:
        return Source(f"{API}/logcat", (("device", device), ("all", "1")), f"device {device}")
    if target is not None:
        body = await api.call("GET", api.vm_path(target))
        vm = body.get("vm") if isinstance(body, dict) else None
    else:
        body = await api.call("GET", f"{API}/current")
        vm = body.get("vm") if isinstance(body, dict) else None
        if not isinstance(vm, dict):
            raise Failure(
                "no VM is current: give a TARGET (see 'ddmd clients'), or --device SERIAL --all",
                EXIT_TARGET,
                kind="target",
            )
        if device and vm.get("device") != device:
            raise Failure(
                f"the current VM ({vm.get('name') or vm.get('id')}) is not on device {device}: "
                "give a TARGET, or --all for the whole device",
                EXIT_TARGET,
                kind="target",
            )
    if not isinstance(vm, dict) or not isinstance(vm.get("id"), str):
        raise Failure(f"the daemon's answer for {target!r} names no VM", EXIT_API_ERROR)
    serial, app = vm.get("device"), app_name(vm)
    if serial and whole:
        return Source(f"{API}/logcat", (("device", serial), ("all", "1")), f"device {serial}")
    if serial and app:
        return Source(f"{API}/logcat", (("device", serial), ("app", app)), app)
    # A workstation JVM, or a VM that has not said its name: the daemon says why not (its VM
    # route answers 501/409); should it serve the VM after all, follow it by that route.
    by_vm = Source(
        api.vm_path(vm["id"], "/logcat"), (("all", "1"),) if whole else (), str(vm["id"])
    )
    await api.call("GET", by_vm.path, params=by_vm.params([*filters, ("since", "1")]))
    return by_vm


# --------------------------------------------------------------------------------------------------
# The stream


class _Dropped(Exception):
    """The stream broke or ended: worth reopening (``failure`` if it cannot be)."""

    def __init__(self, why: str, failure: Failure) -> None:
        super().__init__(why)
        self.why = why
        self.failure = failure


def _error_of(status: int, content: bytes) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = str(error) if error else f"HTTP {status}"
    return message + (TOKEN_HINT if status == 401 else "")


@dataclass
class _Follower:
    """Reads the stream and hands each new item to `show`; when the stream breaks, reopens it
    with ``after=`` the last item seen, up to len(RECONNECT_DELAYS) times in a row."""

    api: Api
    source: Source
    filters: list[tuple[str, str]]
    since: str | None
    show: Callable[[Mapping[str, Any]], None]
    count: int | None = None
    last_seq: int = 0
    shown: int = 0
    _opened: bool = False

    def _params(self) -> dict[str, str | list[str]]:
        filters = list(self.filters)
        if self.last_seq:
            filters.append(("after", str(self.last_seq)))
        elif self.since is not None:
            filters.append(("since", self.since))
        return self.source.params(filters)

    async def run(self) -> None:
        """Until --count items were shown (else until cancelled, or a Failure)."""
        import trio

        attempt = 0
        while True:
            try:
                await self._read(reconnecting=attempt > 0)
                return
            except _Dropped as dropped:
                if self._opened:
                    attempt = 0  # it was open: this is a new break, with a fresh count
                if attempt >= len(RECONNECT_DELAYS):
                    raise dropped.failure from None
                delay = RECONNECT_DELAYS[attempt]
                attempt += 1
                click.echo(
                    f"ddmd logcat: {dropped.why}; reconnecting in {delay:g} s "
                    f"({attempt}/{len(RECONNECT_DELAYS)})",
                    err=True,
                )
                await trio.sleep(delay)

    async def _read(self, *, reconnecting: bool) -> None:
        """One connection. The first one fails at once (Failure); a reopened one and any
        break of an open one raise _Dropped."""
        import httpx

        from ddmd.protocol.sse import SseDecoder

        self._opened = False
        base = self.api.address.shown
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=STREAM_READ_TIMEOUT)
        decoder = SseDecoder()

        def dropped(why: str, failure: Failure) -> _Dropped | Failure:
            return _Dropped(why, failure) if reconnecting or self._opened else failure

        try:
            async with self.api.client.stream(
                "GET",
                self.source.path + "/stream",
                params=self._params(),
                headers={"Accept": "text/event-stream"},
                timeout=timeout,
            ) as response:
                if not response.is_success:
                    message = _error_of(response.status_code, await response.aread())
                    raise dropped(message, Failure(message, EXIT_API_ERROR))
                async for line in response.aiter_lines():
                    event = decoder.feed(line)
                    if event is not None and self._event(event.name, event.data, reconnecting):
                        return
        except (httpx.ConnectError, httpx.ConnectTimeout):
            raise dropped(f"no daemon is answering at {base}", no_daemon(base)) from None
        except httpx.ReadTimeout:
            why = f"the daemon at {base} sent nothing for {STREAM_READ_TIMEOUT:g} s"
            raise dropped(why, Failure(why, EXIT_API_ERROR)) from None
        except httpx.TransportError as exc:
            why = f"the log stream from {base} broke ({type(exc).__name__}: {exc})"
            raise dropped(why, Failure(why, EXIT_API_ERROR)) from None
        why = f"the daemon at {base} closed the log stream"
        raise _Dropped(why, Failure(why, EXIT_API_ERROR))

    def _event(self, name: str, data: str, reconnecting: bool) -> bool:
        """Handle one event; True once --count items were shown."""
        try:
            event = json.loads(data)
        except ValueError:
            return False
        if not isinstance(event, dict):
            return False
        if name == "logcat.opened":
            self._opened = True
            if reconnecting:
                click.echo(f"ddmd logcat: reconnected to {self.source.label}", err=True)
            return False
        if name == "logcat.dropped":
            lines = event.get("lines")
            click.echo(
                f"ddmd logcat: {lines} line(s) dropped: this viewer fell behind the device's log",
                err=True,
            )
            return False
        if name != "logcat.lines":
            return False
        for item in event.get("items") or []:
            seq = item.get("seq") if isinstance(item, dict) else None
            if not isinstance(seq, int) or seq <= self.last_seq:
                continue
            self.last_seq = seq
            self.show(item)
            self.shown += 1
            if self.count is not None and self.shown >= self.count:
                return True
        return False


# --------------------------------------------------------------------------------------------------
# The command


def _is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _use_color(forced: bool | None, env: Mapping[str, str] | None = None) -> bool:
    """--color/--no-color if given; else colours on a terminal, unless NO_COLOR is set."""
    if forced is not None:
        return forced
    return "NO_COLOR" not in (os.environ if env is None else env) and _is_tty()


def _filters(level: str | None, tags: tuple[str, ...], grep: str | None) -> list[tuple[str, str]]:
    out = [("level", level.upper())] if level else []
    out += [("tag", tag) for tag in tags if tag]
    if grep:
        out.append(("grep", grep))
    return out


def _items(body: Any) -> Iterator[Mapping[str, Any]]:
    items = body.get("items") if isinstance(body, dict) else None
    for item in items or []:
        if isinstance(item, dict):
            yield item


@click.command("logcat", short_help="Follow an app's log (pidcat-style), across its restarts.")
@click.argument("target", required=False)
@click.option(
    "--all",
    "whole",
    is_flag=True,
    help="The whole device's log, every app (adds an app column): the device of TARGET or "
    "--device; without them the only device online (as adb), else the current VM's.",
)
@click.option(
    "--level",
    "-l",
    type=click.Choice(LEVELS, case_sensitive=False),
    metavar="V|D|I|W|E|F",
    default=None,
    help="Minimum level: V D I W E F (crash lines always show).",
)
@click.option(
    "--tag",
    "-t",
    "tags",
    multiple=True,
    metavar="[-]TAG",
    help="Only lines with this tag (repeatable); --tag=-TAG hides a tag instead.",
)
@click.option(
    "--grep",
    "-g",
    metavar="REGEX",
    default=None,
    callback=_grep_option,
    help="Only lines whose message or tag matches this regular expression.",
)
@click.option(
    "--since",
    "-s",
    metavar="N|30s|5m|2h",
    default=None,
    callback=_since_option,
    help="Start with the last N lines, or those of the last 30s/5m/2h (default: the last 200; "
    "with -d everything ddmd kept).",
)
@click.option(
    "--no-follow",
    "-d",
    "dump",
    is_flag=True,
    help="Print the recent lines and exit (as 'adb logcat -d').",
)
@click.option("--time", "show_time", is_flag=True, help="Show each line's time (local time).")
@click.option(
    "--color/--no-color",
    "color",
    default=None,
    help="Colours on or off (default: on a terminal, unless NO_COLOR is set).",
)
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object a line: the API's items, unchanged (fields above).",
)
@client_options
def logcat(
    target: str | None,
    whole: bool,
    level: str | None,
    tags: tuple[str, ...],
    grep: str | None,
    since: str | None,
    dump: bool,
    show_time: bool,
    color: bool | None,
    count: int | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Follow the log of TARGET's app (a VM id, pid, app or package name, or a part of one;
    without TARGET: the current VM's app) until Ctrl-C. The app is followed by its name: when
    it dies and starts again, a line "── APP restarted (pid OLD → NEW) ──" comes, then the new
    process's lines. Filtering happens in ddmd.

    \b
    Text output (pidcat-style): [time] [app] TAG LEVEL MESSAGE. Repeated tags are blanked;
    the lines of a crash are marked "!!", the first one with CRASH, NATIVE CRASH, ANR or DIED.

    \b
    --json items, one a line:
      {"kind": "line", "seq", "device", "time" (UTC, ISO 8601), "pid", "tid",
       "level" (V..F), "tag", "message", "app" (or null), "buffer" (main, system, crash
       or null), "crash" (java, native, anr, died or null)}
      {"kind": "restart", "seq", "device", "app", "old_pid", "new_pid", "text"}
    """
    where = daemon_address("logcat", config_file, control, device)
    use_color = _use_color(color)
    printer = LogcatPrinter(color=use_color, show_time=show_time, show_app=whole)
    filters = _filters(level, tags, grep)

    def show(item: Mapping[str, Any]) -> None:
        if as_json:
            click.echo(json.dumps(item, separators=(",", ":")))
            return
        for line in printer.lines(item):
            click.echo(line, color=use_color)

    async def work(api: Api) -> None:
        source = await _resolve(api, target, device, whole, filters)
        # From here on the query names the device itself: --device must not be added again.
        plain = Api(api.client, replace(api.address, device=None))
        if dump:
            extra = [] if since is None else [("since", since)]
            body = await plain.call("GET", source.path, params=source.params([*filters, *extra]))
            for item in list(_items(body))[:count]:
                show(item)
            return
        await _Follower(plain, source, filters, since, show, count).run()

    try:
        run_with_api("logcat", where, work)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_OK) from None
