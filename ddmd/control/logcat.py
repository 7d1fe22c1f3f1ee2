"""The logcat routes of the control API: recent lines of an app (or a whole device), and a live
stream of them (server-sent events, filtered in ddmd).

    GET /api/v1/vms/ID/logcat?since=&level=&tag=&grep=&all=&after=     recent lines (JSON)
    GET /api/v1/vms/ID/logcat/stream?...                               recent, then live (SSE)
    GET /api/v1/logcat?device=SERIAL&app=NAME&...                      the same by device/app,
    GET /api/v1/logcat/stream?device=SERIAL&app=NAME&...               for an app not running

``since``: "200" (the last lines) or "5m"/"30s"/"2h"; ``level``: V D I W E F (minimum);
``tag``: repeatable, "-TAG" excludes; ``grep``: a regular expression; ``all``: the whole device
instead of the VM's app; ``after``: items after this sequence number (resuming a stream).
A VM's lines are its app's (package, else app name), across restarts: the stream goes on when
the app dies and picks up its next pid.

Layer: starlette, trio, the registry, ``ddmd.logcat`` and ``sse``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ddmd.control.events import make_event
from ddmd.logcat.device import DeviceLogcat, Viewer
from ddmd.logcat.hub import LogcatHub, NoLog
from ddmd.logcat.lines import Item, LineFilter, parse_since
from ddmd.protocol import sse
from ddmd.registry import VmHandle
from ddmd.session.words import no_logcat_sentence

__all__ = ["LOGCAT_EVENT", "routes"]

Endpoint = Callable[[Request], Any]
LOGCAT_EVENT = "logcat.lines"
LOGCAT_DROPPED = "logcat.dropped"  # the viewer was too slow: these many lines were lost
KEEPALIVE = 15.0
#: How long a request for recent lines waits for a closed stream to open and catch up, and
#: the quiet that says it has.
CATCH_UP = 2.0
QUIET = 0.2
#: Lines sent at most before the stream goes live, when ``since`` does not say.
DEFAULT_BACKLOG = 200


class _NoLogcat(Exception):
    """A 404/501 answer with a sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Logcat:
    def __init__(self, resolve: Callable[[Request], VmHandle], hub: LogcatHub | None) -> None:
        self._resolve = resolve
        self._hub = hub

    # ------------------------------------------------------------------ what is asked

    def _where(self, request: Request, *, by_vm: bool) -> tuple[DeviceLogcat, str | None]:
        q = request.query_params
        whole = q.get("all", "").lower() in ("1", "true", "yes")
        if by_vm:
            snap = self._resolve(request).snapshot()
            if snap.device is None:
                raise _NoLogcat(501, no_logcat_sentence(snap.display_name))
            serial = snap.device
            app = None if whole else (snap.package or snap.app)
            if app is None and not whole:
                raise _NoLogcat(
                    409,
                    f"{snap.display_name} has not said its name yet: add all=1 for the whole "
                    "device's log",
                )
        else:
            serial = q.get("device") or ""
            if not serial:
                raise _NoLogcat(400, "say which device: device=SERIAL (see `ddmd devices`)")
            app = None if whole else (q.get("app") or None)
        if self._hub is None:
            raise _NoLogcat(501, "ddmd is not reading device logs: adb is off ([adb] enabled)")
        try:
            return self._hub.device(serial), app
        except NoLog as exc:
            raise _NoLogcat(404, str(exc)) from None

    @staticmethod
    def _filter(request: Request, app: str | None) -> LineFilter:
        q = request.query_params
        return LineFilter.parse(
            app=app, level=q.get("level") or None, tags=q.getlist("tag"), grep=q.get("grep")
        )

    @staticmethod
    def backlog(
        device: DeviceLogcat, wanted: LineFilter, request: Request, default: int | None
    ) -> list[Item]:
        q = request.query_params
        after = int(q.get("after") or 0)
        since = q.get("since")
        if since:
            unit, amount = parse_since(since)
            if unit == "lines":
                return device.select(wanted, after=after, last=int(amount))
            newest = device.ring.newest_time()
            start = None if newest is None else newest - amount
            return device.select(wanted, after=after, since_time=start)
        if after:
            return device.select(wanted, after=after)
        return device.select(wanted, last=default)

    # ------------------------------------------------------------------ routes

    async def recent(self, request: Request, *, by_vm: bool) -> Response:
        try:
            device, app = self._where(request, by_vm=by_vm)
            wanted = self._filter(request, app)
            self.backlog(device, wanted, request, None)  # checks `since` early
        except _NoLogcat as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        if not device.streaming:
            # Nobody follows this device's log now: open it (this request is its viewer) and
            # give it a moment to bring the ring up to date.
            with device.subscribe(wanted) as viewer, trio.move_on_after(CATCH_UP):
                await viewer.next_batch()
                while True:
                    with trio.move_on_after(QUIET) as quiet:
                        await viewer.next_batch()
                    if quiet.cancelled_caught:
                        break
        items = self.backlog(device, wanted, request, None)
        return JSONResponse(
            {
                "device": device.serial,
                "app": app,
                "items": [item.to_json() for item in items],
                "next": device.ring.next_seq - 1,
            }
        )

    async def stream(self, request: Request, *, by_vm: bool) -> Response:
        try:
            device, app = self._where(request, by_vm=by_vm)
            wanted = self._filter(request, app)
            self.backlog(device, wanted, request, DEFAULT_BACKLOG)  # checks `since` early
        except _NoLogcat as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return _LogcatStream(self, device, app, wanted, request)


class _LogcatStream(Response):
    """``text/event-stream``: the backlog, then every new batch; ends when the client goes."""

    media_type = "text/event-stream"

    def __init__(
        self,
        api: _Logcat,
        device: DeviceLogcat,
        app: str | None,
        wanted: LineFilter,
        request: Request,
    ) -> None:
        super().__init__(
            status_code=200,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._api, self._device, self._app = api, device, app
        self._wanted, self._request = wanted, request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        device = self._device
        with device.subscribe(self._wanted) as viewer:
            backlog = self._api.backlog(device, self._wanted, self._request, DEFAULT_BACKLOG)
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async with trio.open_nursery() as nursery:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_disconnect)
                await self._pump(backlog, viewer, send)
                nursery.cancel_scope.cancel()

    async def _pump(self, backlog: list[Item], viewer: Viewer, send: Send) -> None:
        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await write(sse.retry_frame(2000) + sse.comment("ddmd logcat"))
        head = {"device": self._device.serial, "app": self._app}
        await write(sse.event_frame(make_event("logcat.opened", **head)))
        seen = backlog[-1].seq if backlog else 0
        if backlog:
            await write(self._frame(backlog))
        while True:
            batch: list[Item] | None = None
            dropped = 0
            with trio.move_on_after(KEEPALIVE):
                try:
                    batch, dropped = await viewer.next_batch()
                except trio.EndOfChannel:
                    return
            if batch is None:
                await write(sse.comment("keepalive"))
                continue
            if dropped:
                # This viewer fell behind by more than [logcat]'s budget: say what it lost.
                await write(sse.event_frame(make_event(LOGCAT_DROPPED, lines=dropped)))
            fresh = [item for item in batch if item.seq > seen]
            if fresh:
                seen = fresh[-1].seq
                await write(self._frame(fresh))

    def _frame(self, items: list[Item]) -> bytes:
        """One ``logcat.lines`` event; each item's JSON is made once for every viewer."""
        head = make_event(LOGCAT_EVENT, device=self._device.serial, app=self._app)
        opening = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1]
        data = f'{opening},"items":[{",".join(item.json_text() for item in items)}]}}'
        return f"event: {LOGCAT_EVENT}\ndata: {data}\n\n".encode()


def routes(
    vm: str,
    prefix: str,
    resolve: Callable[[Request], VmHandle],
    guard: Callable[[Endpoint], Endpoint],
    hub: LogcatHub | None,
) -> list[Route]:
    """The routes (VM ones first: the bare VM route would swallow them)."""
    api = _Logcat(resolve, hub)

    async def vm_recent(request: Request) -> Response:
        return await api.recent(request, by_vm=True)

    async def vm_stream(request: Request) -> Response:
        return await api.stream(request, by_vm=True)

    async def device_recent(request: Request) -> Response:
        return await api.recent(request, by_vm=False)

    async def device_stream(request: Request) -> Response:
        return await api.stream(request, by_vm=False)

    return [
        Route(vm + "/logcat/stream", guard(vm_stream), methods=["GET"]),
        Route(vm + "/logcat", guard(vm_recent), methods=["GET"]),
        Route(prefix + "/logcat/stream", guard(device_stream), methods=["GET"]),
        Route(prefix + "/logcat", guard(device_recent), methods=["GET"]),
    ]
