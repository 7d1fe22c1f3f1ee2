"""The control API's routes for what DDMS users still reach for: method tracing, the
allocation tracker, HPROF heap dumps, kill, and downloading the files they bring.

Layer: like ``control.app`` (which mounts these routes through ``routes()``): the registry and
VM handles, ``protocol.trace``/``protocol.hprof`` to summarise a finished file (in a worker
thread: both readers stream). Routes (``{target}`` as in app.py)::

    GET  /api/v1/vms/{target}/profiling        {vm, features: {trace, allocs, hprof, kill:
                                               {available, reason, ...}}, trace}
    POST /api/v1/vms/{target}/trace/start[?sampling_us=N]   {trace, mode}
    POST /api/v1/vms/{target}/trace/stop       {file, bytes, download, report}
    GET  /api/v1/vms/{target}/trace            {trace: off|method|sampling|unknown}
    GET  /api/v1/vms/{target}/allocs[?top=N]   {enabled, allocations, by_class, by_site}
    POST /api/v1/vms/{target}/allocs/start|stop   {enabled}
    POST /api/v1/vms/{target}/hprof            {file, bytes, download, histogram}
    POST /api/v1/vms/{target}/kill[?status=N]  {killed, status}
    GET  /api/v1/captures/{name}               the file (application/octet-stream)
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from ddmd.control.server import scope_peer
from ddmd.errors import TargetError
from ddmd.logs import Event, get_logger
from ddmd.protocol.hprof import summarise_file
from ddmd.protocol.trace import TraceFormatError
from ddmd.protocol.trace.loader import load_profile
from ddmd.protocol.trace.report import report_json
from ddmd.registry import VmHandle

__all__ = ["routes"]

log = get_logger("ddmd.control")

Endpoint = Callable[[Request], Awaitable[Response]]
_NAME = re.compile(r"^[A-Za-z0-9._-]+\.(?:trace|hprof)$")
TOP = 20


def _descriptor_name(raw: str) -> str:
    """``Lcom/example/Foo;`` -> ``com.example.Foo``; ``[B`` -> ``byte[]`` (REAL sends the
    VM's descriptors)."""
    dims = 0
    while raw.startswith("["):
        dims, raw = dims + 1, raw[1:]
    primitive = {
        "Z": "boolean", "B": "byte", "C": "char", "S": "short",
        "I": "int", "J": "long", "F": "float", "D": "double",
    }  # fmt: skip
    if raw.startswith("L") and raw.endswith(";"):
        base = raw[1:-1].replace("/", ".")
    elif dims and raw in primitive:
        base = primitive[raw]
    else:
        base = raw.replace("/", ".")
    return base + "[]" * dims


def _allocations_json(value: dict[str, Any], top: int) -> dict[str, Any]:
    allocations = []
    by_class: dict[str, list[int]] = {}
    by_site: dict[str, list[int]] = {}
    for entry in value.get("allocations") or []:
        name = _descriptor_name(entry["class"])
        frames = [{**f, "class": _descriptor_name(f["class"])} for f in entry["frames"]]
        allocations.append({**entry, "class": name, "frames": frames})
        counts = by_class.setdefault(name, [0, 0])
        counts[0] += 1
        counts[1] += entry["size"]
        if frames:
            f = frames[0]
            where = f"{f['file']}:{f['line']}" if f["line"] >= 0 else f["file"] or "native"
            site = f"{f['class']}.{f['method']} ({where})"
            counts = by_site.setdefault(site, [0, 0])
            counts[0] += 1
            counts[1] += entry["size"]

    def ranked(table: dict[str, list[int]], key: str) -> list[dict[str, Any]]:
        rows = sorted(table.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
        return [{key: k, "count": c, "bytes": b} for k, (c, b) in rows[: top or None]]

    return {
        "enabled": value.get("enabled"),
        "allocations": allocations,
        "by_class": ranked(by_class, "class"),
        "by_site": ranked(by_site, "site"),
    }


def _requester(request: Request) -> dict[str, Any]:
    """Who asked, for the log: over the unix socket the process (SO_PEERCRED: user, uid,
    pid); over TCP the client's address (its owner is not looked up)."""
    peer = scope_peer(request.scope)
    if peer is not None:
        return {
            "requester": peer.describe(),
            "requester_uid": peer.uid,
            "requester_user": peer.user,
            "requester_pid": peer.pid,
        }
    client = request.client
    return {"requester": f"{client.host}:{client.port}" if client else "unknown"}


class _Profiling:
    def __init__(self, resolve: Callable[[Request], VmHandle], capture_dir: Path | None) -> None:
        self._resolve = resolve
        self._dir = capture_dir

    def _vm(self, request: Request, method: str = "GET") -> VmHandle:
        if request.method != method:
            raise _MethodNotAllowed(method)
        return self._resolve(request)

    async def profiling(self, request: Request) -> Response:
        handle = self._vm(request)
        return JSONResponse({"vm": handle.snapshot().to_json(), **handle.profiling()})

    async def trace_start(self, request: Request) -> Response:
        handle = self._vm(request, "POST")
        sampling = _int_query(request, "sampling_us", 1, 10_000_000)
        return JSONResponse(await handle.start_trace(sampling))

    async def trace_stop(self, request: Request) -> Response:
        handle = self._vm(request, "POST")
        result = await handle.stop_trace()
        try:
            profile = await trio.to_thread.run_sync(load_profile, result.path)
            report: dict[str, Any] | None = report_json(profile, top=TOP, file=result.path.name)
        except (OSError, TraceFormatError) as exc:
            report = {"error": f"the trace could not be read: {exc}"}
        return JSONResponse(
            {**result.to_json(), "download": _download(result.path), "report": report}
        )

    async def trace_state(self, request: Request) -> Response:
        return JSONResponse(await self._vm(request).trace_state())

    async def allocs(self, request: Request) -> Response:
        handle = self._vm(request)
        top = _int_query(request, "top", 0, 100_000)
        value = await handle.alloc_tracker("list")
        return JSONResponse(_allocations_json(value, TOP if top is None else top))

    async def allocs_start(self, request: Request) -> Response:
        return JSONResponse(await self._vm(request, "POST").alloc_tracker("start"))

    async def allocs_stop(self, request: Request) -> Response:
        return JSONResponse(await self._vm(request, "POST").alloc_tracker("stop"))

    async def hprof(self, request: Request) -> Response:
        handle = self._vm(request, "POST")
        result = await handle.dump_hprof()
        try:
            summary = await trio.to_thread.run_sync(summarise_file, result.path)
            histogram: dict[str, Any] = summary.to_json(TOP)
        except Exception as exc:  # a dump ddmd's reader cannot read is still a download
            histogram = {"error": f"the heap dump could not be read: {exc}"}
        return JSONResponse(
            {**result.to_json(), "download": _download(result.path), "histogram": histogram}
        )

    async def kill(self, request: Request) -> Response:
        handle = self._vm(request, "POST")
        status = _int_query(request, "status", 0, 0xFFFFFFFF)
        log.warning(
            Event.VM_KILL_REQUESTED,
            vm=handle.vm_id,
            status=1 if status is None else status,
            **_requester(request),
        )
        value = await handle.kill(1 if status is None else status)
        return JSONResponse({"killed": handle.vm_id, **value})

    async def capture(self, request: Request) -> Response:
        name = request.path_params["name"]
        if self._dir is None or not _NAME.match(name) or not (self._dir / name).is_file():
            return JSONResponse({"error": f"no capture file {name!r}"}, status_code=404)
        return FileResponse(self._dir / name, media_type="application/octet-stream", filename=name)


class _MethodNotAllowed(Exception):
    def __init__(self, allow: str) -> None:
        super().__init__("Method Not Allowed")
        self.allow = allow


def _download(path: Path) -> str:
    return f"/api/v1/captures/{path.name}"


def _int_query(request: Request, name: str, low: int, high: int) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise ValueError(f"query parameter {name}={value!r} is not a number in {low}..{high}")
    return int(value)


def routes(
    vm: str,
    resolve: Callable[[Request], VmHandle],
    guard: Callable[[Endpoint], Endpoint],
    capture_dir: Path | None,
    prefix: str,
) -> list[Route]:
    """The routes, each wrapped by ``guard`` (app.py's error mapping)."""
    api = _Profiling(resolve, capture_dir)
    post = ["GET", "POST", "PUT", "DELETE", "PATCH"]  # others get 405, not the bare VM route

    def wrap(handler: Endpoint) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except _MethodNotAllowed as exc:
                return JSONResponse(
                    {"error": str(exc)}, status_code=405, headers={"Allow": exc.allow}
                )
            except ValueError as exc:
                if isinstance(exc, TargetError):
                    raise
                return JSONResponse({"error": str(exc)}, status_code=400)

        endpoint.__name__ = handler.__name__
        return guard(endpoint)

    return [
        Route(vm + "/profiling", wrap(api.profiling), methods=["GET"]),
        Route(vm + "/trace/start", wrap(api.trace_start), methods=post),
        Route(vm + "/trace/stop", wrap(api.trace_stop), methods=post),
        Route(vm + "/trace", wrap(api.trace_state), methods=["GET"]),
        Route(vm + "/allocs/start", wrap(api.allocs_start), methods=post),
        Route(vm + "/allocs/stop", wrap(api.allocs_stop), methods=post),
        Route(vm + "/allocs", wrap(api.allocs), methods=["GET"]),
        Route(vm + "/hprof", wrap(api.hprof), methods=post),
        Route(vm + "/kill", wrap(api.kill), methods=post),
        Route(prefix + "/captures/{name}", partial(wrap(api.capture)), methods=["GET"]),
    ]
