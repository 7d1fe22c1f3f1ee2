"""What `ddmd stack`, `ddmd heap` and `ddmd gc` print for what the HotSpot Attach API gives
(a plain JVM's thread dump and heap figures), and every thread's stack (`ddmd stack TARGET`
without THREAD: jstack's output for a plain JVM, one STKL per thread for a DDM VM).

Layer: `cli.format` for the shared pieces (sizes, frames, VM labels) and `cli.api` (`Api`,
`Failure`; httpx only lazily, inside `Api`); `cli.client` imports this module. No protocol
code: everything comes from the daemon's JSON (``GET .../stacks``, ``.../threads/T/stack``,
``.../heap``, ``POST .../gc``; `control.jvm`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ddmd.cli.api import Api, Failure
from ddmd.cli.format import (
    format_frame,
    format_gc,
    format_heap,
    format_stack,
    origin_lines,
    size,
    vm_label,
)

__all__ = [
    "all_stacks",
    "format_gc_any",
    "format_heap_any",
    "format_stack_any",
    "format_stacks",
    "heap_words",
    "stacks_of",
]


#: Seconds for every thread's stack (a DDM VM: one STKL per thread, each within its timeout).
STACKS_TIMEOUT = 60.0

# --------------------------------------------------------------------------------------------------
# Stacks


def _thread_head(thread: dict[str, Any]) -> str:
    """A DDM thread's first line, in jstack's manner: ``"main" #1 daemon tid=42 running``."""
    head = f'"{thread.get("name") or ""}" #{thread.get("id")}'
    if thread.get("daemon"):
        head += " daemon"
    if thread.get("tid") is not None:
        head += f" tid={thread['tid']}"
    return f"{head} {thread.get('state') or 'unknown state'}"


def format_stacks(body: dict[str, Any]) -> str:
    """Every thread's stack: a plain JVM's thread dump as jstack prints it; for a DDM VM one
    block per thread, its frames as StackTraceElement prints them."""
    vm = body["vm"]
    if body.get("text"):
        return f"threads of VM {vm_label(vm)}, from its thread dump:\n{body['text'].rstrip()}"
    lines = [f"threads of VM {vm_label(vm)}:"]
    for thread in body.get("threads") or []:
        lines.append("")
        lines.append(_thread_head(thread))
        if thread.get("error"):
            lines.append(f"  (no stack: {thread['error']})")
            continue
        frames = thread.get("frames") or []
        lines.extend(format_frame(f) for f in frames)
        if not frames:
            lines.append("  (no frames)")
    return "\n".join(lines)


def format_stack_any(body: dict[str, Any]) -> str:
    """One thread: a plain JVM's block of its thread dump, else `format_stack`."""
    if not body.get("text"):
        return format_stack(body)
    name, number = body.get("thread_name"), body.get("thread_id")
    thread = f"{number} ({name})" if name else str(number)
    if number is None:  # one of the JVM's own threads (GC, compiler): no Java thread id
        thread = repr(name)
    return f"thread {thread} of VM {vm_label(body['vm'])}:\n{body['text'].rstrip()}"


async def all_stacks(api: Api, vm_id: str) -> Any:
    """``GET .../stacks`` (a thread dump of thousands of threads may take a while)."""
    return await api.call("GET", api.vm_path(vm_id, "/stacks"), read_timeout=STACKS_TIMEOUT)


async def stacks_of(
    api: Api, words: tuple[str, ...], current: Callable[[Api], Awaitable[dict[str, Any]]]
) -> Any | None:
    """`ddmd stack` with at most one word: every thread's stack of the VM the word names, or
    of the current VM (``current``) without a word; None when the word names no VM (it is
    then a THREAD of the current VM)."""
    if not words:
        return await all_stacks(api, (await current(api))["id"])
    try:
        body = await api.call("GET", api.vm_path(words[0]))
    except Failure as failure:
        if failure.message.startswith("no VM matches"):
            return None
        raise
    return await all_stacks(api, body["vm"]["id"])


# --------------------------------------------------------------------------------------------------
# Heap figures (GC.heap_info)


def _figures(used: Any, committed: Any, most: Any, *, reserved: bool = False) -> str:
    text = f"{size(used)} used"
    if committed is not None:
        text += f" of {size(committed)} committed"
    if most is not None:
        text += f", {size(most)} reserved" if reserved else f", at most {size(most)}"
    return text


def heap_words(heap: dict[str, Any]) -> list[str]:
    """``jvm_heap`` in words: the Java heap's totals, then each space that has sizes."""
    spaces = heap.get("spaces") or []
    java = [s for s in spaces if s.get("kind") == "heap" and not s.get("part_of")]
    lines = []
    if heap.get("used") is not None:
        totals = _figures(heap["used"], heap.get("committed"), heap.get("max"))
        lines.append(f"Java heap: {totals}")
    for space in spaces:
        if space.get("kind") == "heap" and len(java) < 2:
            continue  # the Java heap's line says it all
        reserved = space.get("kind") == "metaspace"  # address space, not a limit
        text = _figures(
            space.get("used"), space.get("committed"), space.get("max"), reserved=reserved
        )
        indent = "    " if space.get("part_of") else "  " if space.get("kind") == "heap" else ""
        lines.append(f"{indent}{space['name']}: {text}")
    if not lines:  # a collector whose lines ddmd does not read: its own words
        lines.extend(line.rstrip() for line in str(heap.get("text") or "").splitlines())
    return lines


def format_heap_any(body: dict[str, Any], *, verbose: bool = False) -> str:
    """`ddmd heap`: a plain JVM's GC.heap_info in words, else `format_heap` (``verbose``:
    units, runs and fragmentation too)."""
    heap = body.get("jvm_heap")
    if not isinstance(heap, dict):
        return format_heap(body, verbose=verbose)
    collector = f" ({heap['collector']} collector)" if heap.get("collector") else ""
    head = f"heap of VM {vm_label(body['vm'])}, from GC.heap_info{collector}:"
    origins = body.get("origins")
    said = origin_lines(origins.get("heaps")) if isinstance(origins, dict) else None
    return "\n".join([head, *heap_words(heap), *(said or [])])


def format_gc_any(body: dict[str, Any]) -> str:
    """`ddmd gc`: a plain JVM's GC.run with the Java heap after it, else `format_gc`."""
    heap = body.get("jvm_heap")
    if not isinstance(heap, dict) or not body.get("confirmed"):
        return format_gc(body)
    line = f"GC done on {vm_label(body['vm'])} ({body.get('confirmed_by') or 'GC.run'})"
    words = heap_words(heap)
    return f"{line}: {words[0]}" if words else line
