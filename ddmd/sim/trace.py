"""Deterministic method traces for the simulated VM: a recording of calls (thread, method,
enter/exit, thread-CPU and wall times) and the ``.trace`` bytes an ART VM would produce for
it, format version 3 with the dual clock.

Layer: imports ``ddmd.protocol.trace`` (the action values) and nothing else of ddmd; no I/O
and no clock. The simulator answers ``MPSE``/``SPSE`` with :func:`build_trace` of a
recording: what ART and Dalvik push in ``MPSE`` is the ordinary layout (text header, then
the binary part). ``build_trace(..., streaming=True)`` writes ART's streaming file layout
instead (binary header with ``0xF0`` in the version, threads and methods introduced inline,
the summary at the end), which ``ddmd trace-report`` reads too.

:func:`default_recording` is the recording the simulator uses: two threads (``main`` and a
worker), nested calls, a recursive method and one call left by an exception, with call
counts fixed here (:data:`DEFAULT_CALL_COUNTS`) so tests can compare.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ddmd.protocol.trace import Action, StreamCode

__all__ = [
    "DEFAULT_CALL_COUNTS",
    "DEFAULT_PID",
    "FETCH",
    "FIB",
    "LENGTH",
    "LOAD",
    "MESSAGE_INIT",
    "ON_CREATE",
    "PARSE",
    "RUN",
    "SimCall",
    "SimMethod",
    "SimTraceEvent",
    "SimTraceRecorder",
    "TraceRecording",
    "build_trace",
    "default_recording",
]

_MAGIC: Final = 0x574F4C53
_VERSION: Final = 3  # dual clock needs version 3
_STREAMING: Final = 0xF0
_HEADER_LEN: Final = 32
_RECORD_SIZE: Final = 14  # u2 thread, u4 method|action, u4 thread-cpu, u4 wall
_HEAD: Final = struct.Struct("<IHHQH")
_RECORD: Final = struct.Struct("<HIII")
_U4_MAX: Final = 0xFFFFFFFF
_CLOCK_OVERHEAD_NSEC: Final = 480

DEFAULT_PID: Final = 4242


@dataclass(frozen=True, slots=True)
class SimMethod:
    class_name: str  # dotted: com.example.mail.Inbox
    name: str
    signature: str  # JVM descriptor: (Ljava/lang/String;)V
    source: str  # Inbox.java

    @property
    def full_name(self) -> str:
        """The name ``ddmd.protocol.trace.TraceMethod.full_name`` gives the same method."""
        return f"{self.class_name}.{self.name}{self.signature}"


@dataclass(frozen=True, slots=True)
class SimTraceEvent:
    tid: int
    method: SimMethod
    action: Action
    thread_cpu_usec: int  # since the thread's first event
    wall_usec: int  # since the start of the trace


@dataclass(frozen=True, slots=True)
class TraceRecording:
    """What the simulated VM "ran" while tracing, in the order it happened."""

    pid: int
    start_usec: int  # wall-clock time of the start, µs since the epoch
    elapsed_usec: int
    threads: tuple[tuple[int, str], ...]  # (tid, name)
    events: tuple[SimTraceEvent, ...]

    def methods(self) -> tuple[SimMethod, ...]:
        """Every method, in the order of first use (their ids follow this order)."""
        seen: dict[SimMethod, None] = {}
        for event in self.events:
            seen.setdefault(event.method, None)
        return tuple(seen)

    def call_counts(self, tid: int | None = None) -> dict[str, int]:
        """Calls per method (``full_name``), of one thread or of all: every call is entered
        once."""
        counts: dict[str, int] = {}
        for event in self.events:
            if event.action == Action.ENTER and (tid is None or event.tid == tid):
                name = event.method.full_name
                counts[name] = counts.get(name, 0) + 1
        return counts


class SimTraceRecorder:
    """Builds a :class:`TraceRecording` call by call and checks it as it goes: an exit must
    leave the innermost open call of its thread, and times never go backwards."""

    def __init__(self, *, pid: int = DEFAULT_PID, start_usec: int = 1_700_000_000_000_000) -> None:
        self._pid = pid
        self._start = start_usec
        self._threads: dict[int, str] = {}
        self._events: list[SimTraceEvent] = []
        self._stacks: dict[int, list[SimMethod]] = {}
        self._last: dict[int, tuple[int, int]] = {}
        self._cursor: dict[int, tuple[int, int]] = {}  # for play(): next (cpu, wall) per thread

    def thread(self, tid: int, name: str, *, wall_usec: int = 0) -> None:
        """Name a thread; ``wall_usec`` is when :meth:`play` starts its first call."""
        if not 0 < tid < 0x8000:
            # dmtracedump keeps at most 32768 threads, indexed by id.
            raise ValueError(f"thread id {tid} is outside 1..32767")
        self._threads[tid] = name
        self._cursor.setdefault(tid, (0, wall_usec))

    def _add(self, tid: int, method: SimMethod, action: Action, cpu: int, wall: int) -> None:
        if tid not in self._threads:
            raise ValueError(f"thread {tid} was not named with thread() first")
        if not (0 <= cpu <= _U4_MAX and 0 <= wall <= _U4_MAX):
            raise ValueError(f"times {cpu}, {wall} do not fit the trace's 32-bit fields")
        last_cpu, last_wall = self._last.get(tid, (0, 0))
        if cpu < last_cpu or wall < last_wall:
            raise ValueError(f"thread {tid}: time goes backwards at {method.full_name}")
        self._last[tid] = (cpu, wall)
        self._events.append(SimTraceEvent(tid, method, action, cpu, wall))

    def enter(self, tid: int, method: SimMethod, *, cpu: int, wall: int) -> None:
        self._add(tid, method, Action.ENTER, cpu, wall)
        self._stacks.setdefault(tid, []).append(method)

    def exit(
        self, tid: int, method: SimMethod, *, cpu: int, wall: int, unroll: bool = False
    ) -> None:
        stack = self._stacks.get(tid)
        if not stack or stack[-1] != method:
            open_call = stack[-1].full_name if stack else "nothing"
            raise ValueError(
                f"thread {tid} cannot exit {method.full_name}: the innermost open call is "
                f"{open_call}"
            )
        stack.pop()
        self._add(tid, method, Action.UNROLL if unroll else Action.EXIT, cpu, wall)

    def play(self, tid: int, call: SimCall) -> None:
        """Record ``call`` and its children on ``tid``, after what the thread did so far.

        A call spends its own time (``cpu_usec``/``wall_usec``) before its first child, so
        its exclusive time is exactly that; its inclusive time adds its children's.
        """
        cpu, wall = self._cursor.get(tid, (0, 0))
        pending: list[tuple[SimCall, bool]] = [(call, True)]
        while pending:
            item, entering = pending.pop()
            if entering:
                self.enter(tid, item.method, cpu=cpu, wall=wall)
                cpu += item.cpu_usec
                wall += item.wall_usec
                pending.append((item, False))
                pending.extend((child, True) for child in reversed(item.children))
            else:
                self.exit(tid, item.method, cpu=cpu, wall=wall, unroll=item.unroll)
        self._cursor[tid] = (cpu, wall)

    def idle(self, tid: int, *, cpu_usec: int = 0, wall_usec: int) -> None:
        """Let time pass on ``tid`` outside any call (before the next :meth:`play`)."""
        cpu, wall = self._cursor.get(tid, (0, 0))
        self._cursor[tid] = (cpu + cpu_usec, wall + wall_usec)

    def recording(self, *, elapsed_usec: int | None = None) -> TraceRecording:
        open_calls = {tid: [m.full_name for m in s] for tid, s in self._stacks.items() if s}
        if open_calls:
            raise ValueError(f"calls are still open: {open_calls}")
        events = sorted(self._events, key=lambda e: e.wall_usec)  # stable: thread order kept
        last_wall = max((e.wall_usec for e in events), default=0)
        return TraceRecording(
            pid=self._pid,
            start_usec=self._start,
            elapsed_usec=last_wall + 100 if elapsed_usec is None else elapsed_usec,
            threads=tuple(sorted(self._threads.items())),
            events=tuple(events),
        )


@dataclass(frozen=True, slots=True)
class SimCall:
    """A call and the calls it makes, for :meth:`SimTraceRecorder.play`."""

    method: SimMethod
    cpu_usec: int  # its own thread-CPU time
    wall_usec: int  # its own wall time (at least cpu_usec)
    children: tuple[SimCall, ...] = field(default=())
    unroll: bool = False  # left by an exception


# --------------------------------------------------------------------------- the writer


def _method_ids(recording: TraceRecording) -> dict[SimMethod, int]:
    # ART numbers methods from 0 and shifts by the two action bits; 0 is avoided here.
    return {method: (index + 1) << 2 for index, method in enumerate(recording.methods())}


def _method_line(method: SimMethod, method_id: int) -> str:
    # ART's five columns (no line number); ``%#x`` for the id.
    return (
        f"{method_id:#x}\t{method.class_name}\t{method.name}\t{method.signature}\t{method.source}\n"
    )


def _summary(recording: TraceRecording, *, streaming: bool, methods: Iterable[str]) -> str:
    lines = [
        "*version",
        str(_VERSION),
        "data-file-overflow=false",
        "clock=dual",
        f"elapsed-time-usec={recording.elapsed_usec}",
    ]
    if not streaming:
        lines.append(f"num-method-calls={len(recording.events)}")
    lines += [
        f"clock-call-overhead-nsec={_CLOCK_OVERHEAD_NSEC}",
        "vm=art",
        f"pid={recording.pid}",
        "*threads",
    ]
    lines += [f"{tid}\t{name}" for tid, name in recording.threads]
    lines.append("*methods")
    text = "\n".join(lines) + "\n" + "".join(methods) + "*end\n"
    return text


def _binary_header(recording: TraceRecording, version: int) -> bytes:
    head = _HEAD.pack(_MAGIC, version, _HEADER_LEN, recording.start_usec, _RECORD_SIZE)
    return head.ljust(_HEADER_LEN, b"\0")


def _record(event: SimTraceEvent, ids: dict[SimMethod, int]) -> bytes:
    value = ids[event.method] | event.action
    return _RECORD.pack(event.tid, value, event.thread_cpu_usec, event.wall_usec)


def build_trace(recording: TraceRecording, *, streaming: bool = False) -> bytes:
    """The ``.trace`` bytes of ``recording``: format 3, dual clock (thread-CPU, then wall).

    ``streaming=False`` (what ``MPSE`` carries): text header, then the binary part.
    ``streaming=True``: ART's streaming file layout.
    """
    ids = _method_ids(recording)
    if not streaming:
        lines = [_method_line(m, i) for m, i in ids.items()]
        parts = [
            _summary(recording, streaming=False, methods=lines).encode(),
            _binary_header(recording, _VERSION),
        ]
        parts.extend(_record(event, ids) for event in recording.events)
        return b"".join(parts)
    parts = [_binary_header(recording, _VERSION | _STREAMING)]
    names = dict(recording.threads)
    threads_seen: set[int] = set()
    methods_seen: set[SimMethod] = set()
    for event in recording.events:
        if event.tid not in threads_seen:
            threads_seen.add(event.tid)
            name = names.get(event.tid, "").encode()
            parts.append(struct.pack("<HBHH", 0, StreamCode.THREAD, event.tid, len(name)) + name)
        if event.method not in methods_seen:
            methods_seen.add(event.method)
            line = _method_line(event.method, ids[event.method]).encode()
            parts.append(struct.pack("<HBH", 0, StreamCode.METHOD, len(line)) + line)
        parts.append(_record(event, ids))
    # ART's summary lists the threads but no methods (they came inline).
    summary = _summary(recording, streaming=True, methods=()).encode()
    parts.append(struct.pack("<HBI", 0, StreamCode.SUMMARY, len(summary)) + summary)
    return b"".join(parts)


# --------------------------------------------------------------------------- the default


def _m(class_name: str, name: str, signature: str) -> SimMethod:
    source = class_name.rsplit(".", 1)[-1].split("$", 1)[0] + ".java"
    return SimMethod(class_name, name, signature, source)


ON_CREATE: Final = _m("com.example.mail.MainActivity", "onCreate", "(Landroid/os/Bundle;)V")
LOAD: Final = _m("com.example.mail.Inbox", "load", "()V")
PARSE: Final = _m(
    "com.example.mail.Inbox", "parse", "(Ljava/lang/String;)Lcom/example/mail/Message;"
)
MESSAGE_INIT: Final = _m("com.example.mail.Message", "<init>", "(Ljava/lang/String;)V")
LENGTH: Final = _m("java.lang.String", "length", "()I")
FIB: Final = _m("com.example.mail.Stats", "fib", "(I)I")
RUN: Final = _m("com.example.mail.SyncWorker", "run", "()V")
FETCH: Final = _m("com.example.mail.Store", "fetch", "(I)[B")

#: Calls per method in :func:`default_recording` (all threads), by ``full_name``.
DEFAULT_CALL_COUNTS: Final[Mapping[str, int]] = MappingProxyType(
    {
        ON_CREATE.full_name: 1,
        LOAD.full_name: 1,
        PARSE.full_name: 4,
        MESSAGE_INIT.full_name: 4,
        LENGTH.full_name: 4,
        FIB.full_name: 5,
        RUN.full_name: 1,
        FETCH.full_name: 2,
    }
)


def _parse_call(cpu: int) -> SimCall:
    length = SimCall(LENGTH, 2, 3)
    return SimCall(PARSE, cpu, cpu + 10, (SimCall(MESSAGE_INIT, 20, 25, (length,)),))


def _fib(n: int) -> SimCall:
    children = () if n < 2 else (_fib(n - 1), _fib(n - 2))
    return SimCall(FIB, 5 + n, 6 + n, children)


def default_recording(pid: int = DEFAULT_PID) -> TraceRecording:
    """Two threads: ``main`` (tid = pid, as on Android) runs ``onCreate``, which loads the
    inbox (three messages parsed) and computes ``fib(3)`` (one call, four recursive ones);
    a worker fetches twice from the store (the second fetch throws: an unroll) and parses
    one message. :data:`DEFAULT_CALL_COUNTS` lists the calls."""
    main = pid if 0 < pid < 0x7FF0 else 1  # dmtracedump's thread table ends at 32767
    worker = main + 21
    recorder = SimTraceRecorder(pid=pid)
    recorder.thread(main, "main", wall_usec=100)
    recorder.thread(worker, "SyncWorker", wall_usec=400)
    load = SimCall(LOAD, 40, 60, (_parse_call(30), _parse_call(45), _parse_call(60)))
    recorder.play(main, SimCall(ON_CREATE, 120, 150, (load, _fib(3))))
    fetch_ok = SimCall(FETCH, 200, 900)
    fetch_failed = SimCall(FETCH, 80, 1500, unroll=True)
    run = SimCall(RUN, 15, 20, (fetch_ok, fetch_failed, _parse_call(35)))
    recorder.play(worker, run)
    return recorder.recording()
