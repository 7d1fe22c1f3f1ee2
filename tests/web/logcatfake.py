"""A tiny stand-in for ddmd's control API, enough for the web page's Logcat panel: the page's
files (the real ones, with the real headers), a VM list (an app on a device and a workstation
JVM), the general event stream, and the logcat routes as ``ddmd/control/logcat.py`` documents
them (recent lines as JSON, a server-sent event stream, filtered here by level, tag, regex and
app; the workstation JVM answers 501 with a sentence). Lines are added by the test
(`FakeLogcatApi.add`), which wakes every open stream.

Standard library only (a threading HTTP server), so a Playwright test can drive it from its
own thread. Every request is recorded (`requests`), and so is every stream's query (`streams`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from ddmd.control.web import PAGE_HEADERS, load_assets

LEVELS = "VDIWEF"
SERIAL = "emulator-5554"
APP = "com.example.mail"
APP_PID = 4242
APP_VM = f"{SERIAL}/{APP_PID}"
JVM_VM = "tcp:8000"
JVM_NAME = "Counter"
NAMELESS_PID = 5000
NAMELESS_VM = f"{SERIAL}/{NAMELESS_PID}"
NAMELESS = f"pid {NAMELESS_PID} has not said its name yet: add all=1 for the whole device's log"
WORKSTATION = (
    f"{JVM_NAME} runs on a local port, not on an Android device: it has no device log "
    "(only Android devices and emulators keep a log ddmd can read)"
)


def _vm(vm_id: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": vm_id,
        "app": None,
        "package": None,
        "name": None,
        "pid": None,
        "device": None,
        "source": "scan",
        "address": vm_id,
        "ddm": False,
        "vm_ident": None,
        "debugger_port": None,
        "debugger": None,
        "debuggers": [],
        "waiting_for_debugger": False,
        "state": "ready",
        "current": False,
        "missing": {},
        "heaps": [],
    }
    return {**base, **fields}


VMS = [
    _vm(
        APP_VM,
        app=APP,
        package=APP,
        name=APP,
        pid=APP_PID,
        device=SERIAL,
        source="adb",
        address=f"{SERIAL} jdwp:{APP_PID}",
    ),
    _vm(JVM_VM, name=JVM_NAME, pid=8123, address="127.0.0.1:8000"),
    _vm(
        NAMELESS_VM,
        name=f"pid {NAMELESS_PID}",
        pid=NAMELESS_PID,
        device=SERIAL,
        source="adb",
        address=f"{SERIAL} jdwp:{NAMELESS_PID}",
    ),
]


def line(
    message: str,
    *,
    level: str = "I",
    tag: str = "MailApp",
    app: str | None = APP,
    pid: int = APP_PID,
    tid: int | None = None,
    crash: str | None = None,
    buffer: str = "main",
) -> dict[str, Any]:
    """A line item as the API gives it (``seq`` and ``time`` are set by `add`)."""
    return {
        "kind": "line",
        "device": SERIAL,
        "pid": pid,
        "tid": pid if tid is None else tid,
        "level": level,
        "tag": tag,
        "message": message,
        "app": app,
        "buffer": buffer,
        "crash": crash,
    }


def restart(old_pid: int, new_pid: int, app: str = APP) -> dict[str, Any]:
    return {
        "kind": "restart",
        "device": SERIAL,
        "app": app,
        "old_pid": old_pid,
        "new_pid": new_pid,
        "text": f"{app} restarted (pid {old_pid} \u2192 {new_pid})",
    }


@dataclass(frozen=True)
class Wanted:
    """A viewer's filter (ddmd.logcat.lines.LineFilter's rules)."""

    app: str | None
    level: int = 0
    tags: frozenset[str] = frozenset()
    excluded: frozenset[str] = frozenset()
    grep: re.Pattern[str] | None = None

    @classmethod
    def of(cls, query: Mapping[str, list[str]]) -> Wanted:
        whole = (query.get("all") or [""])[0] in ("1", "true", "yes")
        level = (query.get("level") or ["V"])[0].upper()[:1] or "V"
        tags = query.get("tag") or []
        grep = (query.get("grep") or [""])[0]
        return cls(
            None if whole else APP,
            LEVELS.index(level),
            frozenset(t for t in tags if t and not t.startswith("-")),
            frozenset(t[1:] for t in tags if t.startswith("-") and len(t) > 1),
            re.compile(grep) if grep else None,
        )

    def matches(self, item: Mapping[str, Any]) -> bool:
        if item["kind"] == "restart":
            return self.app is None or item["app"] == self.app
        if self.app is not None and item["app"] != self.app:
            return False
        if LEVELS.index(item["level"]) < self.level and item["crash"] is None:
            return False
        if self.tags and item["tag"] not in self.tags:
            return False
        if item["tag"] in self.excluded:
            return False
        return self.grep is None or bool(
            self.grep.search(item["message"]) or self.grep.search(item["tag"])
        )


@dataclass
class FakeLogcatApi:
    base: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    streams: list[dict[str, list[str]]] = field(default_factory=list)  # queries, as opened
    open_streams: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)  # for /api/v1/events
    closing: bool = False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def add(self, items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Number and stamp ``items`` and hand them to every open stream."""
        added = []
        with self.cond:
            for item in items:
                seq = len(self.items) + 1
                stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
                full = {**item, "seq": seq}
                if full["kind"] == "line":
                    full.setdefault("time", stamp)
                self.items.append(full)
                added.append(full)
            self.cond.notify_all()
        return added

    def publish(self, event: Mapping[str, Any]) -> None:
        """An event on the general stream (``app.crashed``, ...)."""
        with self.cond:
            self.events.append(dict(event))
            self.cond.notify_all()

    def stream_with(self, **wanted: str) -> bool:
        """Has a logcat stream been opened with these query values (the last one opened)?"""
        with self.cond:
            if not self.streams:
                return False
            last = self.streams[-1]
        return all((last.get(k) or [""])[0] == v for k, v in wanted.items())

    def select(self, wanted: Wanted, after: int) -> list[dict[str, Any]]:
        with self.cond:
            return [i for i in self.items if i["seq"] > after and wanted.matches(i)]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ------------------------------------------------------------------ plumbing

    def _send(self, status: int, body: bytes, media_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache")
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, body: Any) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _event(self, name: str, data: Mapping[str, Any]) -> None:
        payload = json.dumps({"event": name, **data}, separators=(",", ":"))
        self.wfile.write(f"event: {name}\ndata: {payload}\n\n".encode())
        self.wfile.flush()

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        api = self.server.api
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        api.requests.append(self.path)
        assets = self.server.assets
        try:
            if path == "/" or path.startswith("/static/"):
                name = "index.html" if path == "/" else path.removeprefix("/static/")
                asset = assets.get(name)
                if asset is None:
                    self._json(404, {"error": f"no page file {name!r}"})
                    return
                headers = {k.replace("-", "_"): v for k, v in PAGE_HEADERS.items()}
                self._send(200, asset.body, asset.media_type, **headers)
            elif path == "/api/v1/health":
                self._json(200, {"version": "fake"})
            elif path == "/api/v1/vms":
                self._json(200, VMS)
            elif path == "/api/v1/events":
                self._general_events()
            elif path.startswith("/api/v1/vms/"):
                self._vm_route(path.removeprefix("/api/v1/vms/"), query)
            else:
                self._json(404, {"error": "no such route"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _vm_route(self, rest: str, query: dict[str, list[str]]) -> None:
        api = self.server.api
        vm = next((v for v in VMS if rest == v["id"] or rest.startswith(v["id"] + "/")), None)
        if vm is None:
            self._json(404, {"error": "no such VM", "target": rest})
            return
        sub = rest.removeprefix(vm["id"])
        if sub in ("/logcat", "/logcat/stream"):
            if vm["device"] is None:
                self._json(501, {"error": WORKSTATION})
                return
            whole = (query.get("all") or [""])[0] in ("1", "true", "yes")
            if vm["app"] is None and not whole:
                self._json(409, {"error": NAMELESS})
                return
            try:
                wanted = Wanted.of(query)
            except (re.error, ValueError) as exc:
                self._json(400, {"error": f"--grep is not a regular expression: {exc}"})
                return
            after = int((query.get("after") or ["0"])[0] or 0)
            if sub == "/logcat":
                items = api.select(wanted, after)
                since = (query.get("since") or [""])[0]
                if since.isdigit():
                    items = items[-int(since) :]
                body = {"device": SERIAL, "app": wanted.app, "items": items, "next": len(api.items)}
                self._json(200, body)
            else:
                self._logcat_stream(wanted, after, query)
        elif sub == "/threads":
            self._json(200, {"vm": vm, "threads": None, "supported": False})
        elif sub == "/profiling":
            self._json(200, {"vm": vm, "features": {}, "trace": "off", "allocs": None})
        elif sub == "/ext":
            self._json(200, {"ext": {}})
        elif sub == "/heap":
            self._json(200, {"vm": vm, "heaps": [], "images": []})
        else:
            self._json(404, {"error": "not in the fake", "target": rest})

    def _logcat_stream(self, wanted: Wanted, after: int, query: dict[str, list[str]]) -> None:
        api = self.server.api
        with api.cond:  # before the page hears of it
            api.streams.append(query)
            api.open_streams += 1
        seen = after
        try:
            self._start_events()
            self.wfile.write(b"retry: 500\n\n")
            self._event("logcat.opened", {"device": SERIAL, "app": wanted.app})
            while not api.closing:
                with api.cond:  # (a re-entrant lock: select takes it too)
                    fresh = api.select(wanted, seen)
                    seen = max(seen, len(api.items))
                if fresh:
                    self._event(
                        "logcat.lines", {"device": SERIAL, "app": wanted.app, "items": fresh}
                    )
                with api.cond:
                    if len(api.items) == seen and not api.closing:
                        api.cond.wait(0.5)
                if not fresh:
                    self.wfile.write(b": keepalive\n\n")
                    self.wfile.flush()
        finally:
            with api.cond:
                api.open_streams -= 1

    def _general_events(self) -> None:
        api = self.server.api
        self._start_events()
        self._event("stream.opened", {})
        sent = 0
        while not api.closing:
            with api.cond:
                if len(api.events) == sent:
                    api.cond.wait(0.5)
                fresh = api.events[sent:]
                sent = len(api.events)
            for event in fresh:
                self._event(str(event["event"]), event)
            if not fresh:
                self.wfile.write(b": keepalive\n\n")
                self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: FakeLogcatApi
    assets: dict[str, Any]


@contextmanager
def fake_api() -> Iterator[FakeLogcatApi]:
    """The fake API on a free port of 127.0.0.1, stopped at the end."""
    server = _Server(("127.0.0.1", 0), _Handler)
    api = FakeLogcatApi()
    server.api = api
    server.assets = load_assets()
    api.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        with api.cond:
            api.closing = True
            api.cond.notify_all()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
