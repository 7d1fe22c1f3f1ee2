"""The per-method profile of a method trace: calls, inclusive and exclusive time per clock,
per thread and overall, and each thread's call tree, computed by dmtracedump's rules (listed
in ``ddmd.protocol.trace``).

Layer: ``protocol`` (standard library only). Fed with :mod:`.decoder` events; keeps no
records, only open calls and totals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.trace.decoder import (
    DataStarted,
    HeaderRead,
    MethodNamed,
    Record,
    RecordsRead,
    ThreadNamed,
    TraceEvent,
)
from ddmd.protocol.trace.format import (
    ACTION_MASK,
    WALL,
    Action,
    DataHeader,
    TraceFormatError,
    TraceHeader,
    TraceMethod,
    TraceThread,
    clocks_for,
)

__all__ = [
    "CallNode",
    "MethodStats",
    "ThreadProfile",
    "TraceProfile",
    "TraceProfiler",
    "top_methods",
]

_ID_MASK: Final = 0xFFFFFFFF & ~ACTION_MASK


# --------------------------------------------------------------------------- the profile


@dataclass(frozen=True, slots=True)
class MethodStats:
    """Per method: times are one value per clock (``TraceProfile.clocks``), in µs."""

    method: TraceMethod
    calls: int
    recursive_calls: int
    inclusive: tuple[int, ...]
    exclusive: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CallNode:
    """One call path of a thread's call tree: the calls of ``method`` made from its parent
    path, merged."""

    method: TraceMethod
    calls: int
    inclusive: tuple[int, ...]
    exclusive: tuple[int, ...]
    children: tuple[CallNode, ...]


@dataclass(frozen=True, slots=True)
class ThreadProfile:
    thread: TraceThread
    records: int
    total: tuple[int, ...]  # last event minus first event, per clock
    methods: tuple[MethodStats, ...]  # by method id
    calls: tuple[CallNode, ...]  # the call tree's top level, in order of first call
    unmatched_exits: int  # exits with no call open (counted from time 0)
    open_calls: int  # calls still open at the end (closed at the last event)


@dataclass(frozen=True, slots=True)
class TraceProfile:
    header: TraceHeader | None  # None: a streaming trace without its summary
    data: DataHeader
    clocks: tuple[str, ...]
    threads: tuple[ThreadProfile, ...]  # by thread id; only threads with records
    methods: tuple[MethodStats, ...]  # every thread added together, by method id
    total: tuple[int, ...]  # the threads' totals added together, per clock
    records: int
    known_threads: tuple[TraceThread, ...]  # every thread the trace names
    known_methods: tuple[TraceMethod, ...]  # every method the trace names

    @property
    def time_clock(self) -> int:
        """The clock reports sort by: wall time when the trace has it, else its only one."""
        return self.clocks.index(WALL) if WALL in self.clocks else 0

    @property
    def clock(self) -> str:
        """The header's clock option, or what the records imply."""
        if self.header is not None and self.header.clock:
            return self.header.clock
        return "dual" if len(self.clocks) == 2 else self.clocks[0]


def top_methods(
    stats: Iterable[MethodStats],
    by: Literal["inclusive", "exclusive"],
    clock: int = 0,
    limit: int | None = None,
) -> list[MethodStats]:
    """The methods with the most time first (ties by name); those with no time and no call
    are left out."""

    def key(item: MethodStats) -> tuple[int, str, int]:
        times = item.inclusive if by == "inclusive" else item.exclusive
        return (-times[clock], item.method.full_name, item.method.id)

    ranked = sorted((s for s in stats if s.calls or any(s.exclusive)), key=key)
    return ranked if limit is None else ranked[:limit]


class _Stats:
    __slots__ = ("calls", "exclusive", "inclusive", "recursive")

    def __init__(self, clocks: int) -> None:
        self.calls = 0
        self.recursive = 0
        self.inclusive = [0] * clocks
        self.exclusive = [0] * clocks


class _Node:
    __slots__ = ("calls", "children", "exclusive", "inclusive", "method")

    def __init__(self, method: int, clocks: int) -> None:
        self.method = method
        self.calls = 0
        self.inclusive = [0] * clocks
        self.exclusive = [0] * clocks
        self.children: dict[int, _Node] = {}

    def child(self, method: int) -> _Node:
        node = self.children.get(method)
        if node is None:
            node = self.children[method] = _Node(method, len(self.inclusive))
        return node


class _Frame:
    __slots__ = ("entry", "method", "node")

    def __init__(self, method: int, entry: Sequence[int], node: _Node) -> None:
        self.method = method
        self.entry = entry
        self.node = node


class _Thread:
    __slots__ = ("first", "last", "open", "records", "root", "stack", "stats", "unmatched")

    def __init__(self, times: Sequence[int]) -> None:
        self.first = tuple(times)
        self.last: Sequence[int] = self.first
        self.stack: list[_Frame] = []
        self.open: dict[int, int] = {}  # method id -> frames of it on the stack
        self.stats: dict[int, _Stats] = {}
        self.root = _Node(-1, len(times))
        self.records = 0
        self.unmatched = 0

    def method(self, method: int) -> _Stats:
        stats = self.stats.get(method)
        if stats is None:
            stats = self.stats[method] = _Stats(len(self.first))
        return stats


class TraceProfiler:
    """Builds the :class:`TraceProfile` from decoder events, one batch at a time."""

    def __init__(self) -> None:
        self._header: TraceHeader | None = None
        self._data: DataHeader | None = None
        self._threads: dict[int, TraceThread] = {}
        self._methods: dict[int, TraceMethod] = {}
        self._state: dict[int, _Thread] = {}
        self._records = 0
        self._finished = False

    def add(self, event: TraceEvent) -> None:
        if self._finished:
            raise LocalProtocolError("add() after result()")
        if isinstance(event, RecordsRead):
            self._add_records(event.records)
        elif isinstance(event, HeaderRead):
            self._header = event.header
            for thread in event.header.threads:
                self._threads.setdefault(thread.tid, thread)
            for method in event.header.methods:
                self._methods[method.id] = method
        elif isinstance(event, DataStarted):
            self._data = event.data
        elif isinstance(event, ThreadNamed):
            self._threads[event.thread.tid] = event.thread
        elif isinstance(event, MethodNamed):
            self._methods[event.method.id] = event.method

    def add_all(self, events: Iterable[TraceEvent]) -> None:
        for event in events:
            self.add(event)

    def _mismatch(self, tid: int, method: int, frame: _Frame) -> TraceFormatError:
        def name(method_id: int) -> str:
            known = self._methods.get(method_id)
            return known.full_name if known else f"method {method_id:#x}"

        return TraceFormatError(
            f"record {self._records + 1}: thread {tid} exits {name(method)} while the "
            f"innermost open call is {name(frame.method)} (dmtracedump stops here too)"
        )

    def _add_records(self, records: Iterable[Record]) -> None:
        states = self._state
        for record in records:
            tid = record[0]
            value = record[1]
            times = record[2:]
            action = value & ACTION_MASK
            method = value & _ID_MASK
            state = states.get(tid)
            if state is None:
                state = states[tid] = _Thread(times)
            last = state.last
            clocks = range(len(times))
            delta = [t - p if t > p else 0 for t, p in zip(times, last, strict=True)]
            stack = state.stack
            if action == Action.ENTER:
                if stack:
                    top = stack[-1]
                    owner = state.method(top.method)
                    node = top.node
                    for i in clocks:
                        owner.exclusive[i] += delta[i]
                        node.exclusive[i] += delta[i]
                    parent = top.node
                else:
                    parent = state.root
                stack.append(_Frame(method, times, parent.child(method)))
                state.open[method] = state.open.get(method, 0) + 1
            elif action in (Action.EXIT, Action.UNROLL):
                if stack:
                    frame = stack[-1]
                    if frame.method != method:
                        raise self._mismatch(tid, method, frame)
                    stack.pop()
                    state.open[method] -= 1
                    entry: Sequence[int] = frame.entry
                    node = frame.node
                else:
                    entry = (0,) * len(times)
                    node = state.root.child(method)
                    state.unmatched += 1
                stats = state.method(method)
                stats.calls += 1
                node.calls += 1
                recursive = state.open.get(method, 0) > 0
                if recursive:
                    stats.recursive += 1
                for i in clocks:
                    spent = times[i] - entry[i] if times[i] > entry[i] else 0
                    if not recursive:
                        stats.inclusive[i] += spent
                    node.inclusive[i] += spent
                    stats.exclusive[i] += delta[i]
                    node.exclusive[i] += delta[i]
            else:
                raise TraceFormatError(
                    f"record {self._records + 1} (thread {tid}) has action {action}, which no "
                    "VM writes (0 enter, 1 exit, 2 unroll)"
                )
            state.last = times
            state.records += 1
            self._records += 1

    def _method(self, method_id: int) -> TraceMethod:
        method = self._methods.get(method_id)
        if method is None:
            method = self._methods[method_id] = TraceMethod.unknown(method_id)
        return method

    def _close_open_calls(self, state: _Thread) -> None:
        """dmtracedump's end of trace: every open call ends at the thread's last event."""
        last = state.last
        for index, frame in enumerate(state.stack):
            stats = state.method(frame.method)
            stats.calls += 1
            recursive = any(f.method == frame.method for f in state.stack[:index])
            if recursive:
                stats.recursive += 1
            for i, now in enumerate(last):
                spent = now - frame.entry[i] if now > frame.entry[i] else 0
                if not recursive:
                    stats.inclusive[i] += spent
                frame.node.inclusive[i] += spent
            frame.node.calls += 1

    def _tree(self, root: _Node) -> tuple[CallNode, ...]:
        """Freeze the call tree without recursion (call stacks can be deep)."""
        done: dict[int, CallNode] = {}
        order: list[_Node] = []
        pending = [root]
        while pending:
            node = pending.pop()
            order.append(node)
            pending.extend(node.children.values())
        for node in reversed(order):
            if node is root:
                continue
            done[id(node)] = CallNode(
                self._method(node.method),
                node.calls,
                tuple(node.inclusive),
                tuple(node.exclusive),
                tuple(done[id(child)] for child in node.children.values()),
            )
        return tuple(done[id(child)] for child in root.children.values())

    def result(self) -> TraceProfile:
        """The profile of everything added so far; the profiler takes no more events."""
        if self._data is None:
            raise TraceFormatError("the trace has no binary data header")
        self._finished = True
        data = self._data
        clocks = data.clocks
        if data.streaming and self._header is not None:
            clocks = clocks_for(data.version, data.record_size, self._header.clock)
        width = len(clocks)
        overall: dict[int, _Stats] = {}
        threads: list[ThreadProfile] = []
        total = [0] * width
        for tid in sorted(self._state):
            state = self._state[tid]
            self._close_open_calls(state)
            span = tuple(
                last - first if last > first else 0
                for last, first in zip(state.last, state.first, strict=True)
            )
            for i in range(width):
                total[i] += span[i]
            methods = []
            for method_id in sorted(state.stats):
                stats = state.stats[method_id]
                methods.append(self._freeze(method_id, stats))
                merged = overall.get(method_id)
                if merged is None:
                    merged = overall[method_id] = _Stats(width)
                merged.calls += stats.calls
                merged.recursive += stats.recursive
                for i in range(width):
                    merged.inclusive[i] += stats.inclusive[i]
                    merged.exclusive[i] += stats.exclusive[i]
            thread = self._threads.get(tid) or TraceThread(tid, "")
            threads.append(
                ThreadProfile(
                    thread,
                    state.records,
                    span,
                    tuple(methods),
                    self._tree(state.root),
                    state.unmatched,
                    len(state.stack),
                )
            )
        return TraceProfile(
            header=self._header,
            data=data,
            clocks=clocks,
            threads=tuple(threads),
            methods=tuple(self._freeze(m, overall[m]) for m in sorted(overall)),
            total=tuple(total),
            records=self._records,
            known_threads=tuple(self._threads[t] for t in sorted(self._threads)),
            known_methods=tuple(m for m in self._methods.values() if m.known),
        )

    def _freeze(self, method_id: int, stats: _Stats) -> MethodStats:
        return MethodStats(
            self._method(method_id),
            stats.calls,
            stats.recursive,
            tuple(stats.inclusive),
            tuple(stats.exclusive),
        )
