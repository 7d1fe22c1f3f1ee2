"""The simulated VM's threads: the usual Android set (main, the daemons, binder threads, a
render thread, pools), their states drawn per role, CPU times, thread churn, stack traces and
the thread status (THST) chunk.

Layer: imports `ddmd.protocol.ddm` and `sim.config`; no I/O and no clock (the caller passes
the time to `ThreadTable.evolve` and pushes the chunks).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Final

from ddmd.protocol.ddm import (
    ChunkType,
    StackFrame,
    StackTrace,
    ThreadCreated,
    ThreadDied,
    ThreadRenamed,
    encode_chunk,
)
from ddmd.sim.config import U4_MASK, SimConfig

__all__ = ["FIRST_THREAD_OBJECT", "SimThread", "ThreadTable"]

#: JDWP object ids of threads start here, above the thread group and class ids of `sim.jdwp`.
FIRST_THREAD_OBJECT: Final = 0x10

_CHUNK_HEADER = struct.Struct(">II")
_THST_HEAD = struct.Struct(">BBH")
_THST_ENTRY = struct.Struct(">IBIIIB")  # 18 bytes
_DRAFT_ENTRY = struct.Struct(">IBB")
_U4 = struct.Struct(">I")

# Status palettes per role: (status, weight). ART sends 0-4 only; Dalvik uses 0-9.
# ART: 1 running (also native), 2 Thread.sleep, 3 monitor, 4 any other wait.
# Dalvik: 1 running, 2 sleeping, 3 monitor, 4 Object.wait, 7 native, 8 vmwait, 9 suspended.
_ART_STATES: Final[dict[str, tuple[tuple[int, int], ...]]] = {
    "main": ((1, 6), (4, 3), (3, 1)),
    "signal": ((4, 1),),
    "daemon": ((4, 12), (1, 1)),
    "watchdog": ((2, 6), (4, 2)),
    "binder": ((1, 10), (4, 1)),
    "render": ((1, 5), (4, 5)),
    "worker": ((4, 6), (1, 3), (3, 1), (2, 1)),
}
_DALVIK_STATES: Final[dict[str, tuple[tuple[int, int], ...]]] = {
    "main": ((7, 6), (1, 2), (4, 2), (3, 1)),
    "signal": ((8, 1),),
    "daemon": ((4, 12), (1, 1), (9, 1)),
    "watchdog": ((2, 6), (4, 2)),
    "binder": ((7, 10), (1, 1), (9, 1)),
    "render": ((7, 5), (4, 4), (1, 1)),
    "worker": ((4, 6), (1, 3), (3, 1), (2, 1), (9, 1)),
}
# Draft states 1-8 (no 0, no 9: suspension is a separate byte).
_DRAFT_STATES: Final[dict[str, tuple[tuple[int, int], ...]]] = {
    "main": ((7, 6), (1, 2), (4, 2), (3, 1)),
    "signal": ((8, 1),),
    "daemon": ((4, 12), (1, 1)),
    "watchdog": ((2, 6), (4, 2)),
    "binder": ((7, 10), (1, 1)),
    "render": ((7, 5), (4, 4), (1, 1)),
    "worker": ((4, 6), (1, 3), (3, 1), (2, 1), (5, 1)),
}
# How readily a role changes state (chance per second of drawing a new state).
_VOLATILITY: Final = {
    "main": 0.6,
    "signal": 0.0,
    "daemon": 0.1,
    "watchdog": 0.3,
    "binder": 0.3,
    "render": 0.8,
    "worker": 0.7,
}
# CPU ticks (100 Hz) per second of wall time in a running state, and otherwise.
_RUNNING_STATES: Final = frozenset({1, 5, 6, 7})
_TICKS_RUNNING: Final = 35.0
_TICKS_IDLE: Final = 0.05

_CORE_THREADS: Final = (
    ("main", "main", False),
    ("Signal Catcher", "signal", True),
    ("HeapTaskDaemon", "daemon", True),
    ("ReferenceQueueDaemon", "daemon", True),
    ("FinalizerDaemon", "daemon", True),
    ("FinalizerWatchdogDaemon", "watchdog", True),
    ("Binder:{pid}_1", "binder", False),
    ("Binder:{pid}_2", "binder", False),
    ("RenderThread", "render", False),
    ("Binder:{pid}_3", "binder", False),
    ("Profile Saver", "daemon", True),
    ("queued-work-looper", "worker", False),
    ("OkHttp ConnectionPool", "worker", True),
)
_RENAMES: Final = (
    "AsyncTask #{n}",
    "OkHttp Dispatcher",
    "glide-source-thread-{n}",
    "WM.task-{n}",
    "arch_disk_io_{n}",
)


def _frames(*spec: tuple[str, str, str, int]) -> tuple[StackFrame, ...]:
    return tuple(StackFrame(*f) for f in spec)


_WAIT_FRAMES: Final = (
    ("java.lang.Object", "wait", "", -2),
    ("java.lang.Object", "wait", "Object.java", 442),
)
_STACKS: Final[dict[str, tuple[StackFrame, ...]]] = {
    "main": _frames(
        ("android.os.MessageQueue", "nativePollOnce", "", -2),
        ("android.os.MessageQueue", "next", "MessageQueue.java", 335),
        ("android.os.Looper", "loopOnce", "Looper.java", 161),
        ("android.os.Looper", "loop", "Looper.java", 288),
        ("android.app.ActivityThread", "main", "ActivityThread.java", 7872),
        ("java.lang.reflect.Method", "invoke", "", -2),
        ("com.android.internal.os.RuntimeInit$MethodAndArgsCaller", "run", "RuntimeInit.java", 548),
        ("com.android.internal.os.ZygoteInit", "main", "ZygoteInit.java", 936),
    ),
    "signal": (),
    "daemon": _frames(
        *_WAIT_FRAMES,
        ("java.lang.ref.ReferenceQueue", "remove", "ReferenceQueue.java", 203),
        ("java.lang.Daemons$FinalizerDaemon", "runInternal", "Daemons.java", 273),
        ("java.lang.Daemons$Daemon", "run", "Daemons.java", 139),
        ("java.lang.Thread", "run", "Thread.java", 1012),
    ),
    "watchdog": _frames(
        ("java.lang.Thread", "sleep", "", -2),
        ("java.lang.Thread", "sleep", "Thread.java", 450),
        ("java.lang.Daemons$FinalizerWatchdogDaemon", "sleepForNanos", "Daemons.java", 395),
        ("java.lang.Daemons$FinalizerWatchdogDaemon", "runInternal", "Daemons.java", 340),
        ("java.lang.Daemons$Daemon", "run", "Daemons.java", 139),
        ("java.lang.Thread", "run", "Thread.java", 1012),
    ),
    "binder": (),
    "render": (),
    "worker": _frames(
        ("jdk.internal.misc.Unsafe", "park", "", -2),
        ("java.util.concurrent.locks.LockSupport", "park", "LockSupport.java", 341),
        (
            "java.util.concurrent.locks.AbstractQueuedSynchronizer$ConditionNode",
            "block",
            "AbstractQueuedSynchronizer.java",
            506,
        ),
        ("java.util.concurrent.LinkedBlockingQueue", "take", "LinkedBlockingQueue.java", 435),
        ("java.util.concurrent.ThreadPoolExecutor", "getTask", "ThreadPoolExecutor.java", 1070),
        ("java.util.concurrent.ThreadPoolExecutor", "runWorker", "ThreadPoolExecutor.java", 1130),
        ("java.util.concurrent.ThreadPoolExecutor$Worker", "run", "ThreadPoolExecutor.java", 642),
        ("java.lang.Thread", "run", "Thread.java", 1012),
    ),
}


@dataclass(slots=True)
class SimThread:
    thread_id: int  # the VM's small internal id (1 = main), reused after death
    object_id: int  # the JDWP threadID, never reused
    name: str
    role: str
    tid: int
    daemon: bool
    status: int
    transient: bool = False
    utime: float = 0.0
    stime: float = 0.0
    suspend_count: int = 0
    thcr: bytes = field(default=b"", repr=False)  # cached encoded THCR chunk

    def thcr_chunk(self) -> bytes:
        if not self.thcr:
            self.thcr = encode_chunk(ThreadCreated(self.thread_id, self.name))
        return self.thcr


class ThreadTable:
    """The VM's live threads by internal id (`by_id`) and by JDWP object id (`by_object`).

    It draws from the VM's own random generator, so one seed drives the whole VM.
    """

    def __init__(self, config: SimConfig, rng: random.Random) -> None:
        self._rng = rng
        self.by_id: dict[int, SimThread] = {}
        self.by_object: dict[int, SimThread] = {}
        self._next_tid = config.pid
        self._next_object_id = FIRST_THREAD_OBJECT
        self._worker_serial = 0
        #: When `evolve` last advanced the states (the caller's clock).
        self.last_evolve = 0.0
        self._palette = (
            _DRAFT_STATES if config.draft else _DALVIK_STATES if config.is_dalvik else _ART_STATES
        )
        pid = config.pid
        for index in range(config.threads):
            if index < len(_CORE_THREADS):
                name, role, daemon = _CORE_THREADS[index]
                name = name.format(pid=pid)
            else:
                self._worker_serial += 1
                name, role, daemon = f"pool-1-thread-{self._worker_serial}", "worker", False
            self.add(name, role, daemon, transient=False)

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, name: str, role: str, daemon: bool, *, transient: bool) -> SimThread:
        thread_id = 1
        while thread_id in self.by_id:  # ids are reused after a thread dies
            thread_id += 1
        tid = self._next_tid
        self._next_tid = self._next_tid + 1 if self._next_tid < 0x3FFFFF else 2
        thread = SimThread(
            thread_id=thread_id,
            object_id=self._next_object_id,
            name=name,
            role=role,
            tid=tid,
            daemon=daemon,
            status=self._draw_status(role),
            transient=transient,
            utime=self._rng.uniform(0, 30) if role != "signal" else 0.0,
        )
        thread.stime = thread.utime * self._rng.uniform(0.1, 0.5)
        self._next_object_id += 1
        self.by_id[thread_id] = thread
        self.by_object[thread.object_id] = thread
        return thread

    def _draw_status(self, role: str) -> int:
        palette = self._palette[role]
        total = sum(w for _, w in palette)
        pick = self._rng.random() * total
        for status, weight in palette:
            pick -= weight
            if pick < 0:
                return status
        return palette[-1][0]

    def evolve(self, now: float) -> None:
        """Advance thread states and CPU times to ``now`` (cheap; called per THST)."""
        elapsed = now - self.last_evolve
        if elapsed <= 0:
            return
        self.last_evolve = now
        rng = self._rng
        for t in self.by_id.values():
            if rng.random() < min(1.0, elapsed * _VOLATILITY[t.role]):
                t.status = self._draw_status(t.role)
            rate = _TICKS_RUNNING if t.status in _RUNNING_STATES else _TICKS_IDLE
            ticks = elapsed * rate * rng.random()
            t.utime += ticks
            t.stime += ticks * 0.3

    def churn(self) -> bytes:
        """One thread event: a thread starts, dies or is renamed; returns its chunk (THCR,
        THDE or THNM) for the caller to push when thread notification is on."""
        rng = self._rng
        transient = [t for t in self.by_id.values() if t.transient]
        r = rng.random()
        if transient and (r < 0.35 or len(transient) >= 4):
            victim = rng.choice(transient)
            del self.by_id[victim.thread_id]
            del self.by_object[victim.object_id]
            return encode_chunk(ThreadDied(victim.thread_id))
        if transient and r < 0.55:
            thread = rng.choice(transient)
            thread.name = rng.choice(_RENAMES).format(n=rng.randint(1, 9))
            thread.thcr = b""
            return encode_chunk(ThreadRenamed(thread.thread_id, thread.name))
        self._worker_serial += 1
        name = rng.choice((f"pool-2-thread-{self._worker_serial}", f"Thread-{self._worker_serial}"))
        return self.add(name, "worker", False, transient=True).thcr_chunk()

    def release_suspensions(self) -> None:
        """A debugger's thread suspensions end (its connection closed, or DBGD)."""
        for thread in self.by_id.values():
            thread.suspend_count = 0

    def status_chunk(self, *, draft: bool, vm_suspended: bool) -> bytes:
        """The THST chunk for every thread (the draft layout with ``draft``)."""
        threads = self.by_id.values()
        if draft:
            body = [_U4.pack(len(self.by_id))]
            body.extend(
                _DRAFT_ENTRY.pack(
                    t.thread_id, t.status, 1 if t.suspend_count or vm_suspended else 0
                )
                for t in threads
            )
        else:
            body = [_THST_HEAD.pack(4, 18, len(self.by_id))]
            body.extend(
                _THST_ENTRY.pack(
                    t.thread_id,
                    t.status,
                    t.tid,
                    int(t.utime) & U4_MASK,
                    int(t.stime) & U4_MASK,
                    1 if t.daemon else 0,
                )
                for t in threads
            )
        data = b"".join(body)
        return _CHUNK_HEADER.pack(ChunkType.THST, len(data)) + data

    def stack_trace(self, thread_id: int) -> StackTrace | None:
        """The STKL reply for a thread (its role's usual stack), None for an unknown id."""
        thread = self.by_id.get(thread_id)
        if thread is None:
            return None
        return StackTrace(thread.thread_id, _STACKS[thread.role])
