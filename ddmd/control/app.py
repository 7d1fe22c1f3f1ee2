"""The control API: a plain Starlette ASGI app over the VM registry, served by hypercorn under trio.

Layer: imports `registry`, `errors`, `logs`, `netaddr`, `ports` (the port book's plain logic) and
plain value types from `protocol`, plus `control.shapes` (JSON of stacks and heap images),
`control.heapimage` (heap pictures) and `control.web` (the page's static files); used by
`daemon`. It reads the registry and asks VM handles for data; it keeps no state of its own
(the port book it is given belongs to the daemon's `listeners.VmPorts`). Host, Origin and
token checks are `control.safety`'s middleware.

Routes (all JSON; VM ids of adb VMs contain a "/" such as "SERIAL/1234", hence `{target:path}`
and the sub-resource routes listed before the bare VM route)::

    GET  /api/v1/health                             {status, version, vms, pid[, current_port,
                                                    adb: {enabled, config[, server, connected]}]}
    GET  /api/v1/vms                                [VmSnapshot.to_json(), ...]
    GET  /api/v1/devices                            [{serial, state, model, product, vms}, ...]
    GET  /api/v1/vms/{target}                       {vm, threads: [...] | null}
    GET  /api/v1/vms/{target}/threads               {vm, threads: [...] | null, supported}
    GET  /api/v1/vms/{target}/heap[?segments=1]     {vm, heaps, images, origins[, run_fields, ...]}
    POST /api/v1/vms/{target}/gc                    {vm, gc: done|requested, heaps, origins, ...}
    GET  /api/v1/vms/{target}/threads/{thread}/stack   {vm, thread_id, thread_name, frames}
    GET  /api/v1/vms/{target}/stacks                every thread's stack (`control.jvm`)
    POST /api/v1/vms/{target}/heap/dump             GC + wait for the segment dump: as GET /heap
    GET  /api/v1/vms/{target}/heap.png[?width=&height=&heap=]   the last dump drawn (image/png)
    GET  /api/v1/heap/legend                        colours of heap.png (`control.heapimage`)
    GET  /api/v1/ports                              {path, ports: [{key, device, app, port,
                                                    last_seen, in_use, vm}, ...]}
    DELETE /api/v1/ports/{app}[?device=SERIAL]      {forgotten: {...}}; 409 while connected
    GET  /  and  /static/{name}                     the live web page (`control.web`)

The daemon adds (``extra_routes``) ``GET /api/v1/events`` (server-sent events,
`control.events`) and ``GET /metrics`` (Prometheus text, `control.metrics`).

`target` is a VM id, a pid, an app or a package name, or a unique part of one, resolved by
`VmRegistry.resolve`; the query parameter `device` narrows pid and name matches to one adb
serial. `thread` is a thread id or a thread name (`registry.resolve_thread`). `app` in the port
routes is an entry's key ("DEVICE|NAME") or its app name (`PortBook.match`). The port routes
need the daemon's port book (`create_app(ports=...)`); without one they answer 501.

Errors are `{"error": message, ...}` with a status that says what happened: 400 bad request,
404 unknown target, thread or app (with `candidates`), 409 ambiguous
target, thread or app (with `candidates`) or a port whose VM is connected (without), 410
VmGone, 501 FeatureUnsupported, 502 DdmFailed (and any other VmRequestError), 504
RequestTimedOut, 500 for anything unexpected (logged as `control.request_failed`; the server
keeps answering).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from ddmd import __version__
from ddmd.control import heapimage, profiling, web
from ddmd.control import jvm as plain_jvm
from ddmd.control import logcat as logcat_routes
from ddmd.control.origins import HeapOrigins, jvm_origin
from ddmd.control.server import ControlBound, serve_control
from ddmd.control.shapes import image_json, stack_json, threads_json
from ddmd.errors import (
    DdmdError,
    FeatureUnsupported,
    RequestTimedOut,
    TargetError,
    VmGone,
    VmRequestError,
    WrongState,
)
from ddmd.logcat.hub import LogcatHub
from ddmd.logs import Event, get_logger
from ddmd.peers import PeerGuard
from ddmd.portbook import PortBook, PortEntry
from ddmd.protocol.heap import Kind, Solidity
from ddmd.registry import VmHandle, VmRegistry, resolve_thread

__all__ = ["API_PREFIX", "create_app", "serve"]

log = get_logger("ddmd.control")

#: Logged once the socket listens (host, port). Not yet in `ddmd.logs.Event`.
LISTENING = Event.CONTROL_LISTENING

API_PREFIX = "/api/v1"

#: Order of the values in each compact run array of `?segments=1`.
RUN_FIELDS = ("address", "units", "kind", "solidity")

_ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

Endpoint = Callable[[Request], Awaitable[Response]]


class _BadRequest(Exception):
    """A request the API cannot make sense of (400)."""


class PortBookOwner(Protocol):
    """What the port routes need of the daemon's debugger ports (`ddmd.drive.ports.VmPorts`):
    the book, and a way to save it that does not race the daemon's own writes."""

    @property
    def book(self) -> PortBook: ...

    async def save(self) -> None: ...


def port_users(registry: VmRegistry, entries: list[PortEntry]) -> dict[str, str]:
    """Entry key -> the id of the connected VM that uses it (by its key or its port)."""
    by_key: dict[str, str] = {}
    by_port: dict[int, str] = {}
    for handle in registry.handles():
        snapshot = handle.snapshot()
        key = handle.selection_key()
        if key is not None:
            by_key.setdefault(key, snapshot.id)
        if snapshot.debugger_port is not None:
            by_port.setdefault(snapshot.debugger_port, snapshot.id)
    users: dict[str, str] = {}
    for entry in entries:
        vm = by_key.get(entry.key) or by_port.get(entry.port)
        if vm is not None:
            users[entry.key] = vm
    return users


# --------------------------------------------------------------------------------------------------
# Errors


def _error(status: int, message: str, *, allow: str | None = None, **extra: Any) -> JSONResponse:
    headers = None if allow is None else {"Allow": allow}
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _leaf(exc: Exception) -> Exception:
    """The one exception inside nested single-member groups (a nursery's wrapping), else exc."""
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _error_response(request: Request, exc: Exception) -> JSONResponse:
    exc = _leaf(exc)
    target = request.path_params.get("target")
    where: dict[str, Any] = {} if target is None else {"target": target}
    if isinstance(exc, TargetError):
        status = 409 if exc.ambiguous else 404
        return _error(status, exc.message, **where, candidates=list(exc.candidates))
    if isinstance(exc, _BadRequest):
        return _error(400, str(exc), **where)
    if isinstance(exc, FeatureUnsupported):
        return _error(501, str(exc), **where)
    if isinstance(exc, RequestTimedOut):
        return _error(504, str(exc), **where)
    if isinstance(exc, VmGone):
        return _error(410, str(exc), **where)
    if isinstance(exc, WrongState):
        return _error(409, str(exc), **where)
    if isinstance(exc, VmRequestError):  # DdmFailed, or a future kind of failed request
        return _error(502, str(exc), **where)
    log.error(
        Event.CONTROL_REQUEST_FAILED,
        method=request.method,
        path=request.url.path,
        error=f"{type(exc).__name__}: {exc}",
        exc_info=exc,
    )
    if isinstance(exc, DdmdError):
        return _error(500, str(exc), **where)
    return _error(
        500, f"internal error ({type(exc).__name__}); see the daemon log for details", **where
    )


def _guarded(handler: Endpoint) -> Endpoint:
    """Turn every exception of `handler` into a JSON error response, so none reaches hypercorn."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            return _error_response(request, exc)

    endpoint.__name__ = handler.__name__
    return endpoint


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route) and 405 (wrong method), as JSON like every other error."""
    assert isinstance(exc, HTTPException)
    return JSONResponse(
        {"error": exc.detail}, status_code=exc.status_code, headers=dict(exc.headers or {})
    )


# --------------------------------------------------------------------------------------------------
# Endpoints


class _Api:
    def __init__(
        self, registry: VmRegistry, version: str, ports: PortBookOwner | None = None
    ) -> None:
        self._registry = registry
        self._version = version
        self._ports = ports
        self._origins = HeapOrigins()  # the GCs this API ran (`control.origins`)

    def resolve(self, request: Request) -> VmHandle:
        target = request.path_params["target"]
        device = request.query_params.get("device") or None
        return self._registry.resolve(target, device=device)

    #: More keys for the health answer (the daemon adds `adb`: its mode and config file).
    health_extra: Mapping[str, Any] = MappingProxyType({})

    async def health(self, request: Request) -> Response:
        # `pid` lets a second `ddmd run` name the daemon that is already running.
        body = {
            "status": "ok",
            "version": self._version,
            "vms": len(self._registry),
            "pid": os.getpid(),
        }
        extra = dict(self.health_extra)
        if self._registry.current_port is not None:
            body["current_port"] = self._registry.current_port  # where debuggers reach it
        adb = extra.get("adb")
        reached = self._registry.adb_server()  # {server, connected} once it was tried
        if isinstance(adb, Mapping) and reached is not None:
            extra["adb"] = {**adb, **reached}
        return JSONResponse({**body, **extra})

    async def vms(self, request: Request) -> Response:
        return JSONResponse(
            [{**h.snapshot().to_json(), "kind": _kind(h)} for h in self._registry.handles()]
        )

    async def devices(self, request: Request) -> Response:
        counts: dict[str, int] = {}
        for snapshot in self._registry.snapshots():
            if snapshot.device is not None:
                counts[snapshot.device] = counts.get(snapshot.device, 0) + 1
        return JSONResponse(
            [d.to_json(vms=counts.get(d.serial, 0)) for d in self._registry.devices()]
        )

    #: What ``GET /api/v1/extensions`` answers (the daemon passes the loaded handlers).
    extensions: Mapping[str, Any] = MappingProxyType({"loaded": [], "failed": [], "disabled": []})

    async def ext_list(self, request: Request) -> Response:
        return JSONResponse(dict(self.extensions))

    async def ext(self, request: Request) -> Response:
        """What each chunk handler last published for this VM."""
        handle = self.resolve(request)
        return JSONResponse({"vm": handle.vm_id, "ext": dict(handle.ext_values)})

    async def vm(self, request: Request) -> Response:
        snapshot = self.resolve(request).snapshot()
        return JSONResponse({"vm": snapshot.to_json(), "threads": threads_json(snapshot)})

    async def threads(self, request: Request) -> Response:
        handle = self.resolve(request)
        try:
            snapshot = await handle.refresh_threads()
        except FeatureUnsupported:
            snapshot = handle.snapshot()
            supported = False
        else:
            # A VM without DDM may answer without error and still have no thread list.
            supported = snapshot.threads is not None
        body: dict[str, Any] = {"threads": threads_json(snapshot)}
        dumped = await plain_jvm.threads_json(handle)  # a plain JVM: from its thread dump
        if dumped is not None:
            body.update(dumped)
            supported = body["threads"] is not None
        return JSONResponse({"vm": snapshot.to_json(), **body, "supported": supported})

    async def heap(self, request: Request) -> Response:
        handle = self.resolve(request)
        segments = _flag(request, "segments")
        images = await self._dump(handle) if segments else handle.last_heap_images()
        snapshot = handle.snapshot()
        body: dict[str, Any] = {
            "vm": snapshot.to_json(),
            "heaps": [h.to_json() for h in snapshot.heaps],
            "images": [image_json(i, segments=segments) for i in images],
            "origins": self._origins.origins(handle.vm_id, snapshot.heaps, images),
        }
        if segments:
            body["run_fields"] = list(RUN_FIELDS)
            body["kinds"] = {str(int(k)): k.name.lower() for k in Kind}
            body["solidities"] = {str(int(s)): s.name.lower() for s in Solidity}
        jvm_heap = await plain_jvm.heap_json(handle)  # a plain JVM: GC.heap_info's figures
        if jvm_heap is not None:
            body["jvm_heap"] = jvm_heap
            body["origins"] = {"heaps": jvm_origin(jvm_heap, time.time()), "images": None}
        return JSONResponse(body)

    async def _dump(self, handle: VmHandle) -> tuple[Any, ...]:
        """A fresh segment dump (HPSG on, a GC, wait, HPSG off), remembered as ddmd's GC."""
        before = handle.snapshot().heaps
        images = await handle.heap_segments()
        after = handle.snapshot().heaps
        self._origins.dumped(handle.vm_id, images, (before, after), time.time())
        return images

    async def heap_dump(self, request: Request) -> Response:
        """Like ``GET /heap`` after a fresh dump (HPSG on, GC, wait, HPSG off), without the
        runs: what the web page's "Cause GC" needs, without megabytes of JSON."""
        if request.method != "POST":
            return _error(405, "Method Not Allowed", allow="POST")
        handle = self.resolve(request)
        images = await self._dump(handle)
        snapshot = handle.snapshot()
        return JSONResponse(
            {
                "vm": snapshot.to_json(),
                "heaps": [h.to_json() for h in snapshot.heaps],
                "images": [image_json(i, segments=False) for i in images],
                "origins": self._origins.origins(handle.vm_id, snapshot.heaps, images),
            }
        )

    async def heap_png(self, request: Request) -> Response:
        """The last heap dump drawn by `control.heapimage` (rendered in a worker thread)."""
        handle = self.resolve(request)
        width = _int_param(
            request, "width", heapimage.DEFAULT_WIDTH, heapimage.MIN_WIDTH, heapimage.MAX_WIDTH
        )
        height = _int_param(
            request, "height", heapimage.DEFAULT_MAX_HEIGHT, 1, heapimage.MAX_HEIGHT
        )
        heap_id = _int_param(request, "heap", None, 0, 0xFFFF_FFFF)
        target = request.path_params["target"]
        images = [i for i in handle.last_heap_images() if not i.native]
        if heap_id is not None:
            images = [i for i in images if i.heap_id == heap_id]
        if not images:
            which = "" if heap_id is None else f" of heap {heap_id}"
            return _error(
                404,
                f"no heap dump{which} from {handle.vm_id} yet: POST "
                f"{API_PREFIX}/vms/{{target}}/heap/dump (or 'ddmd heap --segments') takes one",
                target=target,
            )
        image = min(images, key=lambda i: i.heap_id)
        rendered = await trio.to_thread.run_sync(
            partial(
                heapimage.render_png,
                image,
                width=width,
                max_height=height,
                unless_etag=request.headers.get("if-none-match"),
            )
        )
        if rendered is None:
            return _error(
                404, f"heap {image.heap_id} of {handle.vm_id} has no segments", target=target
            )
        headers = {
            "ETag": rendered.etag,
            "Cache-Control": "no-cache",
            "X-Heap-Id": str(image.heap_id),
            "X-Heap-Complete": "1" if image.complete else "0",
            "X-Heap-Layout": json.dumps(rendered.layout.to_json(), separators=(",", ":")),
        }
        if rendered.png is None:
            return Response(status_code=304, headers=headers)
        return Response(rendered.png, media_type="image/png", headers=headers)

    async def heap_legend(self, request: Request) -> Response:
        return JSONResponse(heapimage.legend())

    async def gc(self, request: Request) -> Response:
        if request.method != "POST":
            # Routed for every method: a GET would otherwise fall through to the bare VM route
            # and come back as "no VM matches '.../gc'".
            return _error(405, "Method Not Allowed", allow="POST")
        handle = self.resolve(request)
        outcome = await handle.cause_gc()
        snapshot = handle.snapshot()
        if outcome.by == "heap info":  # the figures now are the ones this GC brought
            self._origins.gc_ran(handle.vm_id, snapshot.heaps)
        jvm_heap = await plain_jvm.heap_json(handle)  # a plain JVM: the heap after its GC
        images = handle.last_heap_images()
        origins = (
            self._origins.origins(handle.vm_id, snapshot.heaps, images)
            if jvm_heap is None
            else {"heaps": jvm_origin(jvm_heap, time.time(), after_gc=True), "images": None}
        )
        return JSONResponse(
            {
                "vm": snapshot.to_json(),
                **outcome.to_json(),
                "heaps": [h.to_json() for h in snapshot.heaps],
                **({} if jvm_heap is None else {"jvm_heap": jvm_heap}),
                "origins": origins,
            }
        )

    async def select(self, request: Request) -> Response:
        if request.method != "POST":
            return _error(405, "Method Not Allowed", allow="POST")
        handle = self.resolve(request)
        self._registry.select(handle.vm_id, reason="selected through the control API")
        return JSONResponse(
            {"vm": handle.snapshot().to_json(), "selected": self._registry.selected_key}
        )

    async def current(self, request: Request) -> Response:
        handle = self._registry.current()
        return JSONResponse(
            {
                "vm": None if handle is None else handle.snapshot().to_json(),
                "selected": self._registry.selected_key,
            }
        )

    async def stack(self, request: Request) -> Response:
        raw = request.path_params["thread"]
        handle = self.resolve(request)
        plain = await plain_jvm.stack_json(handle, raw)  # a plain JVM: from its thread dump
        if plain is not None:
            return JSONResponse(plain)
        snapshot = handle.snapshot()
        try:
            thread_id = resolve_thread(snapshot, raw)
        except ValueError as exc:
            raise _BadRequest(str(exc)) from None
        except TargetError as exc:
            status = 409 if exc.ambiguous else 404
            return _error(
                status,
                exc.message,
                target=request.path_params["target"],
                thread=raw,
                candidates=list(exc.candidates),
            )
        trace = await handle.stack_trace(thread_id)
        snapshot = handle.snapshot()
        names = {t.thread_id: t.name for t in snapshot.threads or ()}
        return JSONResponse(
            {
                "vm": snapshot.to_json(),
                "thread_id": thread_id,
                "thread_name": names.get(thread_id),
                "frames": stack_json(trace),
            }
        )

    def _book_owner(self) -> PortBookOwner:
        if self._ports is None:
            raise FeatureUnsupported("this daemon keeps no debugger port book")
        return self._ports

    async def ports(self, request: Request) -> Response:
        owner = self._book_owner()
        entries = owner.book.entries()
        users = port_users(self._registry, entries)
        path = owner.book.path
        return JSONResponse(
            {
                "path": None if path is None else str(path),
                "ports": [e.to_json(in_use=e.key in users, vm=users.get(e.key)) for e in entries],
            }
        )

    async def forget_port(self, request: Request) -> Response:
        owner = self._book_owner()
        app = request.path_params["app"]
        device = request.query_params.get("device") or None
        book = owner.book
        try:
            entry = book.resolve(app, device=device)
        except TargetError as exc:
            status = 409 if exc.ambiguous else 404
            return _error(status, exc.message, app=app, candidates=list(exc.candidates))
        vm = port_users(self._registry, [entry]).get(entry.key)
        if vm is not None:
            return _error(
                409,
                f"{entry.name} ({entry.device}) is connected now as VM {vm} and uses port "
                f"{entry.port}; it can be forgotten once its VM is gone",
                app=app,
                vm=vm,
            )
        book.forget(entry.key)
        await owner.save()
        return JSONResponse({"forgotten": entry.to_json(in_use=False)})


def _kind(handle: VmHandle) -> str:
    """What a DDM client is: "VM", or what a chunk handler said it is (a published value with
    a "kind", e.g. the system monitor's handler says "system monitor")."""
    for value in handle.ext_values.values():
        if isinstance(value, dict) and isinstance(value.get("kind"), str):
            return str(value["kind"])
    return "VM"


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> Any:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise _BadRequest(f"query parameter {name}={value!r} is not a number in {low}..{high}")
    return int(value)


def _page_routes() -> list[Route]:
    """``GET /`` and ``GET /static/{name}``: the web page, read once, served from memory."""
    assets = web.load_assets()

    def respond(name: str) -> Response:
        asset = assets[name]
        return Response(asset.body, media_type=asset.media_type, headers=dict(web.PAGE_HEADERS))

    async def index(request: Request) -> Response:
        return respond("index.html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets:
            return _error(404, f"no page file {name!r}")
        return respond(name)

    return [
        Route("/", index, methods=["GET"]),
        Route("/index.html", index, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
    ]


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return False
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _BadRequest(f"query parameter {name}={value!r} is not one of 1/0, true/false")


def create_app(
    registry: VmRegistry,
    *,
    version: str = __version__,
    middleware: Sequence[Middleware] = (),
    extra_routes: Sequence[BaseRoute] = (),
    ports: PortBookOwner | None = None,
    health: Mapping[str, Any] | None = None,
    extensions: Mapping[str, Any] | None = None,
    capture_dir: Path | None = None,
    logcat: LogcatHub | None = None,
) -> Starlette:
    """The control API over `registry`.

    `middleware` wraps every route (first in the list is outermost): the daemon passes
    `control.safety.control_middleware`, which checks Host, Origin and the token before
    anything else runs. `extra_routes` are served after the API's own (the daemon adds the
    event stream and /metrics). `health` adds keys to ``GET /api/v1/health`` (which always has
    status, version, vms and pid).
    """
    api = _Api(registry, version, ports)
    if health:
        api.health_extra = MappingProxyType(dict(health))
    if extensions is not None:
        api.extensions = MappingProxyType(dict(extensions))
    vm = API_PREFIX + "/vms/{target:path}"
    routes = [
        Route(API_PREFIX + "/health", _guarded(api.health), methods=["GET"]),
        Route(API_PREFIX + "/vms", _guarded(api.vms), methods=["GET"]),
        Route(API_PREFIX + "/devices", _guarded(api.devices), methods=["GET"]),
        # Sub-resources before the bare VM route: `{target:path}` would swallow them.
        Route(vm + "/threads/{thread:path}/stack", _guarded(api.stack), methods=["GET"]),
        Route(vm + "/threads", _guarded(api.threads), methods=["GET"]),
        *plain_jvm.routes(vm, api.resolve, _guarded),  # GET .../stacks
        Route(vm + "/heap", _guarded(api.heap), methods=["GET"]),
        Route(vm + "/ext", _guarded(api.ext), methods=["GET"]),
        *profiling.routes(vm, api.resolve, _guarded, capture_dir, API_PREFIX),
        *logcat_routes.routes(vm, API_PREFIX, api.resolve, _guarded, logcat),
        Route(API_PREFIX + "/extensions", _guarded(api.ext_list), methods=["GET"]),
        Route(vm + "/heap/dump", _guarded(api.heap_dump), methods=_ALL_METHODS),
        Route(vm + "/heap.png", _guarded(api.heap_png), methods=["GET"]),
        Route(API_PREFIX + "/heap/legend", _guarded(api.heap_legend), methods=["GET"]),
        Route(vm + "/gc", _guarded(api.gc), methods=_ALL_METHODS),  # see _Api.gc
        Route(vm + "/select", _guarded(api.select), methods=_ALL_METHODS),
        Route(API_PREFIX + "/current", _guarded(api.current), methods=["GET"]),
        Route(API_PREFIX + "/ports", _guarded(api.ports), methods=["GET"]),
        Route(API_PREFIX + "/ports/{app:path}", _guarded(api.forget_port), methods=["DELETE"]),
        Route(vm, _guarded(api.vm), methods=["GET"]),
        *_page_routes(),
        *extra_routes,
    ]
    return Starlette(
        routes=routes,
        middleware=list(middleware),
        exception_handlers={HTTPException: _http_exception},
    )


# --------------------------------------------------------------------------------------------------
# Serving


async def serve(
    app: ASGIApp,
    host: str,
    port: int,
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    graceful_timeout: float = 3.0,
    guard: PeerGuard | None = None,
) -> None:
    """Serve `app` on TCP host:port until cancelled or `shutdown_trigger` returns (then open
    requests get `graceful_timeout` seconds to finish); `control.server.serve_control` does the
    work (and serves the unix socket too, for the daemon).

    `task_status.started((host, port))` is called once the socket listens; port 0 reports the
    port the system picked. A bind failure (port in use, address not available) is raised as
    the plain `OSError`, so the daemon can name the port. With a `guard`, connections from
    users who may not connect are closed before anything is read (`ddmd.peers`).
    """

    class _Started:
        def started(self, value: ControlBound | None = None) -> None:
            assert value is not None
            assert value.tcp is not None
            task_status.started(value.tcp)

    await serve_control(
        app,
        tcp=(host, port),
        guard=guard,
        shutdown_trigger=shutdown_trigger,
        graceful_timeout=graceful_timeout,
        task_status=_Started(),
    )
