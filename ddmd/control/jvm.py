"""The control API's answers that come from the HotSpot Attach API for a plain JVM (one that
does not speak DDM), and every thread's stack for any VM.

Layer: like ``control.app`` (which calls these and mounts ``routes()``): the registry's VM
handles, nothing of the attach API itself. A VM's driver offers these through its ``jvm``
part (``drive.jvmtools.JvmTools``); a handle without one (the tests' fakes, a VM that is not
driven by ddmd) keeps the DDM answers. Routes (``{target}`` as in app.py)::

    GET  /api/v1/vms/{target}/stacks      {vm, source: "Thread.print" | "STKL", threads: [{id,
                                          name, tid, state, daemon, frames, ...}], text,
                                          deadlocked}

and, for a plain JVM, in the routes of app.py:

    GET  .../threads                      its Java threads from its thread dump, ids jstack's
                                          #N: {vm, source: "Thread.print", threads: [{id,
                                          name, tid, state, java_state, daemon, ...}],
                                          left_out: {count, names, why}, supported}
    GET  .../threads/{thread}/stack       the thread from the JVM's thread dump (by its #N
                                          Java id, the id of .../threads, or name): {vm, thread_id,
                                          thread_name, java_id, state, java_state, frames, text}
    GET  .../heap                         adds jvm_heap: {source: "GC.heap_info", collector,
                                          used, committed, max, spaces: [...], text}
    POST .../gc                           GC.run; adds jvm_heap as after it

A JVM that cannot be attached answers 501 with the sentence that says why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut
from ddmd.registry import VmHandle

__all__ = ["JvmPart", "heap_json", "jvm_part", "routes", "stack_json", "threads_json"]

Endpoint = Callable[[Request], Awaitable[Response]]


@runtime_checkable
class JvmPart(Protocol):
    """What these answers need of a VM driver's ``jvm`` part."""

    def applies(self) -> bool: ...

    async def stacks(self) -> dict[str, Any]: ...

    async def threads(self) -> dict[str, Any]: ...

    async def stack(self, key: str) -> dict[str, Any]: ...

    async def heap(self) -> dict[str, Any]: ...


def jvm_part(handle: VmHandle) -> JvmPart | None:
    part = getattr(handle, "jvm", None)
    return part if isinstance(part, JvmPart) else None


def _plain(handle: VmHandle) -> JvmPart | None:
    """The attach part of a plain JVM's handle; None for a DDM VM (or a handle without one)."""
    part = jvm_part(handle)
    return part if part is not None and part.applies() else None


async def stack_json(handle: VmHandle, thread: str) -> dict[str, Any] | None:
    """One thread's stack from a plain JVM's thread dump (the route's body); None: not a plain
    JVM (the DDM route answers)."""
    part = _plain(handle)
    if part is None:
        return None
    body = await part.stack(thread)
    return {"vm": handle.snapshot().to_json(), **body}


async def threads_json(handle: VmHandle) -> dict[str, Any] | None:
    """A plain JVM's thread list from its thread dump (``source``, ``threads``, ``left_out``),
    numbered as jstack and the stack route number it; None: not a plain JVM. A JVM that
    cannot be attached keeps ddmd's JDWP list, which says what it leaves out and why."""
    part = _plain(handle)
    if part is None:
        return None
    try:
        return await part.threads()
    except (FeatureUnsupported, DdmFailed, RequestTimedOut) as exc:
        return {
            "source": "JDWP",
            "left_out": {
                "count": None,
                "names": [],
                "why": "JDWP lists no thread of the JVM itself and hides some Java threads "
                f"(compiler, JDWP agent); whether a thread is a daemon is unknown: {exc}",
            },
        }


async def heap_json(handle: VmHandle) -> dict[str, Any] | None:
    """``GC.heap_info``'s figures for a plain JVM; None otherwise."""
    part = _plain(handle)
    return None if part is None else await part.heap()


class _Stacks:
    def __init__(self, resolve: Callable[[Request], VmHandle]) -> None:
        self._resolve = resolve

    async def stacks(self, request: Request) -> Response:
        handle = self._resolve(request)
        part = jvm_part(handle)
        if part is None:
            raise FeatureUnsupported(f"{handle.vm_id} cannot list every thread's stack")
        body = await part.stacks()
        return JSONResponse({"vm": handle.snapshot().to_json(), **body})


def routes(
    vm: str, resolve: Callable[[Request], VmHandle], guard: Callable[[Endpoint], Endpoint]
) -> list[Route]:
    """The routes, each wrapped by ``guard`` (app.py's error mapping)."""
    api = _Stacks(resolve)
    return [Route(vm + "/stacks", guard(api.stacks), methods=["GET"])]
