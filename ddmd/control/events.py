"""The event stream: a fan-out hub, the registry notices it carries, and `GET /api/v1/events`.

Layer: imports registry and `protocol.sse` (and protocol.heap for a type); used by `daemon`
(which creates the hub and subscribes it to the registry) and served through
`control.create_app(extra_routes=...)`. No actor or protocol code imports this module: nothing
below the daemon knows the hub exists.

Design (why not a structlog processor): the stream carries the *state changes* the log also
reports, under the same dotted names (``vm.found``, ``vm.gone``, ``vm.renamed``,
``vm.waiting_for_debugger``, ``debugger.attached``/``detached``, ``current.changed``, ...: one
name per fact, ``ddmd.logs.Event`` has them all), derived in one place from the registry's
change notices (`RegistryEvents` diffs each VM's snapshot against the one it saw before). The
actors already notify the registry at every point that matters, so no publish call is scattered
through protocol or actor code; and the stream does not depend on the log level, the log
format, or a test's `capture_logs()`. The log remains the record of *why* (reasons, errors); the
stream says *what* changed, with the VM's snapshot JSON. While nobody subscribes, nothing is
computed.

Events (JSON object ``{"event": NAME, "ts": ISO-8601 UTC like the log's, "vm": ID, ...}``)::

    stream.opened            first event of every stream: vms [snapshot...], current
    vm.found / vm.gone       a VM joined / left the registry: snapshot
    vm.changed               its snapshot JSON changed: snapshot, changed [keys] (null = unknown)
    vm.renamed               app/package changed after it had a name: app, package, previous_*
    vm.waiting_for_debugger  the VM reported (WAIT) that it waits for a debugger
    debugger.attached        debugger ("PEER via current|vm-port")
    debugger.detached        debugger (the one that left)
    current.changed          vm (new current VM or null), previous
    threads.updated          threads [thread JSON as in /threads]: pushes (THCR/THDE/THNM)
                             and THST polls, which run only while someone watches the VM
    heap.info                heaps [HPIF heap JSON] after a GC or allocation report
    ext.updated              ext {handler: value}: a chunk handler (ddmd.ext) published
    heap.dumped              heaps [{heap_id, native, complete, bytes_used, ...}]: a new
                             heap segment image (after "Cause GC" with segments enabled)
    device.changed           device, state, model, product (adb device list)
    device.gone              device
    daemon.stopping          the last event before the daemon closes every stream
    overflow                 the last event of a stream that fell behind (it is then closed)

EventHub: ``publish(event)`` hands the dict to every subscriber's bounded trio memory channel
with ``send_nowait``; it never blocks and never waits for a reader. A subscriber whose buffer
is full is dropped: it receives a final ``overflow`` event (one slot is kept free for it) and
then the end of its channel. The SSE endpoint adds a ``: keepalive`` comment every 15 s and a
``retry:`` hint for EventSource.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum, unique
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ddmd.protocol import sse
from ddmd.protocol.heap import HeapImage
from ddmd.registry import VmRegistry, VmSnapshot

__all__ = [
    "EVENTS_PATH",
    "EventHub",
    "EventStreamResponse",
    "HubStatistics",
    "RegistryEvents",
    "StreamEvent",
    "events_route",
    "make_event",
]

EVENTS_PATH = "/api/v1/events"
#: Events buffered per subscriber before it counts as fallen behind.
DEFAULT_BUFFER = 512
KEEPALIVE_SECONDS = 15.0
RETRY_MILLISECONDS = 2000


@unique
class StreamEvent(StrEnum):
    """Every event name the stream carries; those the log also has use the log's name."""

    STREAM_OPENED = "stream.opened"
    VM_FOUND = "vm.found"
    VM_GONE = "vm.gone"
    VM_CHANGED = "vm.changed"
    VM_RENAMED = "vm.renamed"
    VM_WAITING_FOR_DEBUGGER = "vm.waiting_for_debugger"
    DEBUGGER_ATTACHED = "debugger.attached"
    DEBUGGER_DETACHED = "debugger.detached"
    CURRENT_CHANGED = "current.changed"
    THREADS_UPDATED = "threads.updated"
    HEAP_INFO = "heap.info"
    HEAP_DUMPED = "heap.dumped"
    DEVICE_CHANGED = "device.changed"
    DEVICE_GONE = "device.gone"
    EXT_UPDATED = "ext.updated"
    APP_CRASHED = "app.crashed"  # from a device's log (ddmd.logcat), also in the log
    DAEMON_STOPPING = "daemon.stopping"
    OVERFLOW = "overflow"


def utc_now_iso() -> str:
    """The log's timestamp format: ISO 8601, UTC, microseconds, "Z"."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    return now.replace("+00:00", "Z")


def make_event(name: str, *, ts: str | None = None, **fields: Any) -> dict[str, Any]:
    """``{"event": name, "ts": ..., **fields}``: the one shape every stream event has."""
    return {"event": str(name), "ts": ts if ts is not None else utc_now_iso(), **fields}


# --------------------------------------------------------------------------------------------------
# The hub


@dataclass(frozen=True, slots=True)
class HubStatistics:
    subscribers: int
    published: int  # events handed to publish() since the start
    dropped: int  # subscribers dropped because they fell behind


class EventHub:
    """Fan-out of event dicts to subscribers; sync, never blocks (see the module docstring).

    Subscribers must treat the dicts as read-only: one dict goes to every subscriber.
    """

    def __init__(
        self, *, buffer: int = DEFAULT_BUFFER, clock: Callable[[], str] = utc_now_iso
    ) -> None:
        if buffer < 1:
            raise ValueError(f"event buffer {buffer} must be at least 1")
        self._buffer = buffer
        self._clock = clock
        self._subscribers: list[trio.MemorySendChannel[dict[str, Any]]] = []
        self._on_first: list[Callable[[], None]] = []
        self._closed = False
        self._published = 0
        self._dropped = 0

    @property
    def has_subscribers(self) -> bool:
        return bool(self._subscribers)

    @property
    def closed(self) -> bool:
        return self._closed

    def statistics(self) -> HubStatistics:
        return HubStatistics(len(self._subscribers), self._published, self._dropped)

    def on_first_subscriber(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (sync) whenever the number of subscribers goes from 0 to 1."""
        self._on_first.append(callback)

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        """A new event dict stamped with this hub's clock."""
        return make_event(name, ts=self._clock(), **fields)

    def emit(self, name: str, **fields: Any) -> None:
        """``publish(self.event(name, **fields))``, skipped when nobody listens."""
        if self._subscribers:
            self.publish(self.event(name, **fields))

    def publish(self, event: Mapping[str, Any]) -> None:
        """Hand ``event`` to every subscriber now; drop those that fell behind."""
        if self._closed:
            return
        self._published += 1
        item = dict(event)
        for send in list(self._subscribers):
            if send.statistics().current_buffer_used >= self._buffer:
                # Full: the spare slot takes the final "overflow" event, then the stream ends.
                self._dropped += 1
                self._end(
                    send,
                    self.event(
                        StreamEvent.OVERFLOW,
                        reason=f"the reader fell {self._buffer} events behind; "
                        "the daemon closed this stream (reconnect to resume)",
                    ),
                )
                continue
            try:
                send.send_nowait(item)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._remove(send)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[dict[str, Any]]]:
        """A receive channel of every event published while the block runs.

        The channel ends (``EndOfChannel``) after an ``overflow`` event or when the hub closes.
        """
        send, receive = trio.open_memory_channel[dict[str, Any]](self._buffer + 1)
        if self._closed:
            send.close()
        else:
            self._subscribers.append(send)
            if len(self._subscribers) == 1:
                for callback in list(self._on_first):
                    callback()
        try:
            with receive:
                yield receive
        finally:
            self._remove(send)
            send.close()

    def close(self, final: Mapping[str, Any] | None = None) -> None:
        """End every stream (after ``final``, if given); later subscribers get an empty one."""
        if self._closed:
            return
        self._closed = True
        for send in list(self._subscribers):
            self._end(send, dict(final) if final is not None else None)

    def _end(
        self, send: trio.MemorySendChannel[dict[str, Any]], last: dict[str, Any] | None
    ) -> None:
        if last is not None:
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                send.send_nowait(last)
        send.close()
        self._remove(send)

    def _remove(self, send: trio.MemorySendChannel[dict[str, Any]]) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(send)


# --------------------------------------------------------------------------------------------------
# Registry notices -> events


@dataclass(frozen=True, slots=True)
class _Seen:
    snapshot: VmSnapshot
    json: dict[str, Any]
    images: tuple[int, ...]  # identities of the last heap images


def _image_ids(images: tuple[HeapImage, ...]) -> tuple[int, ...]:
    return tuple(id(i) for i in images)


def _dump_json(image: HeapImage) -> dict[str, Any]:
    s = image.summary()
    return {
        "heap_id": image.heap_id,
        "native": image.native,
        "complete": image.complete,
        "bytes_used": s.bytes_used,
        "bytes_free": s.bytes_free,
        "largest_free_run": s.largest_free_run,
        "fragmentation": s.fragmentation,
        "object_count": s.object_count,
    }


class RegistryEvents:
    """The registry listener that turns change notices into stream events (sync, no I/O).

    While nobody subscribes it does nothing (no snapshots taken); when the first subscriber
    arrives it records every VM's current snapshot, so later differences are exact.
    """

    def __init__(self, registry: VmRegistry, hub: EventHub) -> None:
        self._registry = registry
        self._hub = hub
        self._seen: dict[str, _Seen] = {}
        self._devices: dict[str, dict[str, Any]] = {}
        self._current: str | None = None
        self._active = False
        hub.on_first_subscriber(self.prime)

    def prime(self) -> None:
        self._seen = {}
        for handle in self._registry.handles():
            self._remember(handle.vm_id)
        self._devices = {d.serial: d.to_json(vms=0) for d in self._devices_now()}
        current = self._registry.current()
        self._current = None if current is None else current.vm_id
        self._active = True

    def opened(self) -> dict[str, Any]:
        """The first event of a new stream: every VM's snapshot and the current VM."""
        current = self._registry.current()
        return self._hub.event(
            StreamEvent.STREAM_OPENED,
            current=None if current is None else current.vm_id,
            vms=[s.to_json() for s in self._registry.snapshots()],
        )

    def __call__(self, kind: str, key: str) -> None:
        if not self._hub.has_subscribers:
            if self._active:
                self._active = False
                self._seen.clear()
                self._devices.clear()
            return
        if not self._active:
            self.prime()
        if kind == "added":
            seen = self._remember(key)
            if seen is not None:
                self._hub.emit(StreamEvent.VM_FOUND, vm=key, snapshot=seen.json)
        elif kind == "removed":
            old = self._seen.pop(key, None)
            self._hub.emit(StreamEvent.VM_GONE, vm=key, snapshot=None if old is None else old.json)
        elif kind == "changed":
            self._changed(key)
        elif kind == "current":
            now = key or None
            if now != self._current:
                previous, self._current = self._current, now
                self._hub.emit(StreamEvent.CURRENT_CHANGED, vm=now, previous=previous)
            self._refresh_current_flags()
        elif kind == "device":
            self._device(key)
        elif kind == "ext":
            handle = self._registry.get(key)
            if handle is not None:
                self._hub.emit(StreamEvent.EXT_UPDATED, vm=key, ext=dict(handle.ext_values))

    # ------------------------------------------------------------------ helpers

    def _devices_now(self) -> list[Any]:
        devices = getattr(self._registry, "devices", None)
        return list(devices()) if callable(devices) else []

    def _remember(self, vm_id: str) -> _Seen | None:
        handle = self._registry.get(vm_id)
        if handle is None:
            return None
        snapshot = handle.snapshot()
        seen = _Seen(snapshot, snapshot.to_json(), _image_ids(handle.last_heap_images()))
        self._seen[vm_id] = seen
        return seen

    def _refresh_current_flags(self) -> None:
        """The "current" flag of the old and new current VM changed without a notice of
        their own; take it in silently (current.changed said it)."""
        current = self._registry.current()
        current_id = None if current is None else current.vm_id
        for vm_id, seen in list(self._seen.items()):
            if seen.json.get("current") != (vm_id == current_id):
                self._remember(vm_id)

    def _changed(self, vm_id: str) -> None:
        handle = self._registry.get(vm_id)
        if handle is None:
            return
        old = self._seen.get(vm_id)
        images = handle.last_heap_images()
        new = self._remember(vm_id)
        if new is None:
            return
        emit, snap = self._hub.emit, new.snapshot
        if old is None:
            emit(StreamEvent.VM_CHANGED, vm=vm_id, snapshot=new.json, changed=None)
            return
        changed = [k for k, v in new.json.items() if old.json.get(k) != v]
        if changed:
            emit(StreamEvent.VM_CHANGED, vm=vm_id, snapshot=new.json, changed=changed)
        before = old.snapshot
        if (snap.app, snap.package) != (before.app, before.package) and (
            before.app or before.package
        ):
            emit(
                StreamEvent.VM_RENAMED,
                vm=vm_id,
                app=snap.app,
                package=snap.package,
                previous_app=before.app,
                previous_package=before.package,
            )
        # One event per debugger that came or went (several may share a VM).
        now_attached = {(d.peer, d.via): d for d in snap.debuggers}
        was_attached = {(d.peer, d.via): d for d in before.debuggers}
        for key, gone in was_attached.items():
            if key not in now_attached:
                emit(
                    StreamEvent.DEBUGGER_DETACHED,
                    vm=vm_id,
                    debugger=f"{gone.peer} via {gone.via}",
                    details=gone.to_json(),
                )
        for key, came in now_attached.items():
            if key not in was_attached:
                emit(
                    StreamEvent.DEBUGGER_ATTACHED,
                    vm=vm_id,
                    debugger=f"{came.peer} via {came.via}",
                    details=came.to_json(),
                )
        if snap.waiting_for_debugger and not before.waiting_for_debugger:
            emit(StreamEvent.VM_WAITING_FOR_DEBUGGER, vm=vm_id)
        if snap.threads is not None and snap.threads != before.threads:
            emit(StreamEvent.THREADS_UPDATED, vm=vm_id, threads=[t.to_json() for t in snap.threads])
        if snap.heaps != before.heaps:
            emit(StreamEvent.HEAP_INFO, vm=vm_id, heaps=[h.to_json() for h in snap.heaps])
        if images and new.images != old.images:
            emit(StreamEvent.HEAP_DUMPED, vm=vm_id, heaps=[_dump_json(i) for i in images])

    def _device(self, serial: str) -> None:
        now = {d.serial: d for d in self._devices_now()}
        device = now.get(serial)
        if device is None:
            if self._devices.pop(serial, None) is not None:
                self._hub.emit(StreamEvent.DEVICE_GONE, device=serial)
            return
        body = device.to_json(vms=0)
        if self._devices.get(serial) != body:
            self._devices[serial] = body
            fields = {k: v for k, v in body.items() if k not in ("serial", "vms")}
            self._hub.emit(StreamEvent.DEVICE_CHANGED, device=serial, **fields)


# --------------------------------------------------------------------------------------------------
# GET /api/v1/events


class EventStreamResponse(Response):
    """A ``text/event-stream`` response fed by one hub subscription (a raw ASGI response).

    It ends when the subscription ends (overflow, daemon stopping) or the client goes away;
    the subscription is removed in every case, within this request's task.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        hub: EventHub,
        *,
        opened: Callable[[], Mapping[str, Any]] | None = None,
        keepalive: float = KEEPALIVE_SECONDS,
        retry_ms: int = RETRY_MILLISECONDS,
    ) -> None:
        super().__init__(
            status_code=200,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        # A stream has no length: drop the Content-Length: 0 the base class adds.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._hub = hub
        self._opened = opened
        self._keepalive = keepalive
        self._retry_ms = retry_ms

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self._hub.subscribe() as events:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            gone = False
            async with trio.open_nursery() as nursery:

                async def watch_disconnect() -> None:
                    nonlocal gone
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            gone = True
                            nursery.cancel_scope.cancel()
                            return

                nursery.start_soon(watch_disconnect)
                await self._pump(events, send)
                nursery.cancel_scope.cancel()
            if not gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, events: trio.MemoryReceiveChannel[dict[str, Any]], send: Send) -> None:
        async def write(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await write(sse.retry_frame(self._retry_ms) + sse.comment("ddmd event stream"))
        if self._opened is not None:
            await write(sse.event_frame(self._opened()))
        while True:
            event: dict[str, Any] | None = None
            with trio.move_on_after(self._keepalive):
                try:
                    event = await events.receive()
                except trio.EndOfChannel:
                    return
            await write(sse.comment("keepalive") if event is None else sse.event_frame(event))


def events_route(
    hub: EventHub,
    source: RegistryEvents | None = None,
    *,
    keepalive: float = KEEPALIVE_SECONDS,
    retry_ms: int = RETRY_MILLISECONDS,
) -> Route:
    """``GET /api/v1/events`` over ``hub``; ``source`` supplies the ``stream.opened`` event."""

    async def events(request: Request) -> Response:
        if request.method == "HEAD":  # the headers only; a stream would never end
            return Response(media_type=EventStreamResponse.media_type)
        return EventStreamResponse(
            hub,
            opened=None if source is None else source.opened,
            keepalive=keepalive,
            retry_ms=retry_ms,
        )

    return Route(EVENTS_PATH, events, methods=["GET"])
