"""A simulated DDM-speaking VM reached over TCP: ``ddmd sim``.

Layer: a tool beside the daemon. It imports ``ddmd.protocol`` (JDWP framing, DDM chunks)
and trio/structlog/click, and nothing else from ddmd; nothing in the daemon imports it.

``SimVm`` behaves like a debuggable Android VM (protocol.md sections 1-3, peers.md):

- one listening socket on 127.0.0.1; ONE JDWP connection at a time. While a connection is
  open the listening socket is closed, so a second connect is refused (as HotSpot does);
  after the connection ends it listens again on the same port;
- handshake echo (5 s deadline; a bad handshake closes the connection);
- DDM commands (199/1) answered with the same id; pushes carry VM ids ``0x80000000 | n``
  (ART 9+ numbering), one chunk per packet, the whole packet in one send;
- the flavour says which handlers exist and how a request ends when its handler returns
  nothing, there is no handler for its type, or the packet is malformed (protocol.md 2.2,
  3.1, 3.8):

  - ``flavor="art"`` (the default: a current phone, ART on Android 9-11): handlers for HELO
    FEAT THEN THST STKL HPIF HPSG NHSG HPGC EXIT. Such requests (THEN, HPIF, HPSG, NHSG,
    HPGC, DBGD, unknown types, malformed DDM) get **no reply at all** while the debugger
    agent is not loaded. The first non-DDM command (a debugger) loads the agent, and ART
    keeps it for the life of the process, so from then on, on this and every later
    connection, they get an empty reply; a packet whose chunk runs past its end then gets
    a JDWP error reply (INTERNAL; the document has this from source only).
  - ``flavor="legacy"`` (Dalvik, ART on Android 5-8): the same handlers; every such
    request gets an empty reply. With an ART VM ident (``Dalvik v2.x``) a packet whose first
    chunk is not exactly the rest of the packet is not handled (empty reply), as ART 5-8
    does; Dalvik (``Dalvik v1.x``) handles the first chunk and ignores trailing bytes.
  - ``flavor="modern"`` (Android 12+): only HELO, FEAT, EXIT and the APNM/WAIT pushes; THEN
    THST STKL HPIF HPSG NHSG HPGC have no handler, so they go unanswered exactly as in
    ``art`` (empty replies once the agent is loaded).

  Types the sim does not implement in any flavour (REAE REAQ REAL NHGT HPDU HPDS, MPxx,
  SPxx, VUxx) are treated as unknown types. A handler never returns a zero-length chunk
  here, so the table's last row does not arise (``ack_dbgd`` excepted: its DBGD chunk is
  always sent as a chunk);
- ``fail_types=("HPGC", ...)``: a VM that refuses those features: each request of a listed
  type is answered with a FAIL chunk (code 1, a short message) instead of being handled,
  in every flavour;
- ``ack_dbgd=True``: DBGD is answered with a DBGD chunk (the draft's acknowledgement) and
  the debugger's suspensions are released; no shipped VM does this;
- ``draft=True`` (independent of the flavour) uses the 2007 draft layouts: HELO and APNM
  without trailers, THST in the draft layout, HPIF data in the reply, heap pieces sharing
  one start address with offsets;
- heap figures agree with the heap layout: after every GC the HPIF data's *bytes allocated*
  is exactly the used bytes of the layout the HPST..HPEN dump of that GC describes (units x
  8 of every non-free run) and *objects allocated* is its number of used logical runs (P
  pieces joined), which is what an HPSO decoder counts as objects; *heap size* is the whole
  layout. HPIF with when = 1 reports the same current figures;
- plain JDWP just deep enough for ``jdb -attach`` (Version, IDSizes, threads and their one
  group, event requests, Suspend/Resume, Dispose, Exit); error 99 for everything else.

Per-request work is small: chunk bytes that do not change are cached, thread status is
packed with one ``struct`` per thread, and the heap layout is built once (lazily, when heap
info or a dump is first needed) and then only lightly mutated at each GC, its used bytes and
object count kept up to date with it. ``serve_many`` runs many VMs in one
trio nursery (``bench/monitor_scale.py`` runs 500).
"""

from __future__ import annotations

import math
import random
import signal
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal

import click
import structlog
import trio

from ddmd.protocol.ddm import (
    AppName,
    Chunk,
    ChunkType,
    Dbgd,
    Direction,
    ExitRequest,
    Fail,
    FeatReply,
    FeatRequest,
    GcRequest,
    HeapEnd,
    HeapInfo,
    HeapInfoEntry,
    HeapInfoRequest,
    HeapSegmentRequest,
    HeapStart,
    HeloReply,
    HeloRequest,
    NativeHeapEnd,
    NativeHeapSegmentRequest,
    NativeHeapStart,
    StackFrame,
    StackTrace,
    StackTraceRequest,
    ThreadCreated,
    ThreadDied,
    ThreadNotify,
    ThreadRenamed,
    ThreadStatusRequest,
    WaitForDebugger,
    decode_chunk,
    encode_chunk,
    type_name,
)
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    ErrorCode,
    Handshake,
    IdSizes,
    PacketDecoder,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)

__all__ = [
    "ART_FEATURES",
    "FLAVORS",
    "SimConfig",
    "SimStatistics",
    "SimVm",
    "make_configs",
    "serve_many",
    "sim_command",
]

logger = structlog.get_logger()

Flavor = Literal["art", "legacy", "modern"]
FLAVORS: Final[tuple[Flavor, ...]] = ("art", "legacy", "modern")

ART_FEATURES: Final = (
    "hprof-heap-dump-streaming",
    "hprof-heap-dump",
    "method-sample-profiling",
    "method-trace-profiling-streaming",
    "method-trace-profiling",
    "view-hierarchy",
    "opengl-tracing",
)
PRE_INITIALIZED: Final = "<pre-initialized>"

_PUSH_HEADER = struct.Struct(">IIBBB")
_CHUNK_HEADER = struct.Struct(">II")
_THST_HEAD = struct.Struct(">BBH")
_THST_ENTRY = struct.Struct(">IBIIIB")  # 18 bytes
_DRAFT_ENTRY = struct.Struct(">IBB")
_U4 = struct.Struct(">I")
_S4 = struct.Struct(">i")
_U8 = struct.Struct(">Q")
_SEGMENT_HEAD = struct.Struct(">IBIII")

_DDM_SET: Final = int(CommandSet.DDM)
_VM_ID_BIT: Final = 0x80000000
_MAX_PACKET: Final = 1 << 20  # commands a debugger sends are small; reject absurd lengths
_U4_MASK: Final = 0xFFFFFFFF
# A command id seen again within this many commands of one connection counts as a
# duplicate: ids are only unique among outstanding commands, but a well-behaved multiplexer
# (one counter per VM connection) never comes back to an id that soon.
_ID_WINDOW: Final = 4096

# Heap geometry (protocol.md 3.4 / 4).
_HEAP_BASE: Final = 0x12C00000
_UNIT: Final = 8
_HEAP_ID: Final = 1
_MAX_CHUNK: Final = 16368  # a whole HPSG chunk, 8-byte header included, stays within this
_MAX_PAIRS: Final = (_MAX_CHUNK - 8 - _SEGMENT_HEAD.size) // 2
_HARD: Final = 1
_PARTIAL: Final = 0x80

# JDWP ids: the one thread group, then the classes the sim admits to. JDI cannot live with
# an empty class list (VirtualMachineImpl.allClasses() hits a null map, jdb dies on
# attach), so the sim reports the few classes its own objects need.
_GROUP_ID: Final = 1
_OBJECT_CLASS_ID: Final = 2
_STRING_CLASS_ID: Final = 3
_THREAD_CLASS_ID: Final = 4
_GROUP_CLASS_ID: Final = 5
_FIRST_THREAD_OBJECT: Final = 0x10
_CLASS_SIGNATURES: Final = {
    _OBJECT_CLASS_ID: "Ljava/lang/Object;",
    _STRING_CLASS_ID: "Ljava/lang/String;",
    _THREAD_CLASS_ID: "Ljava/lang/Thread;",
    _GROUP_CLASS_ID: "Ljava/lang/ThreadGroup;",
}
_CLASS_STATUS: Final = 7  # VERIFIED | PREPARED | INITIALIZED
_TYPE_TAG_CLASS: Final = 1

# The FAIL message of a refused request (``fail_types``): short, in the framework's manner
# (its own failures say e.g. "Stack trace unavailable").
_REFUSALS: Final = {
    "HELO": "Hello refused",
    "FEAT": "Feature list unavailable",
    "THEN": "Thread notifications unavailable",
    "THST": "Thread status unavailable",
    "STKL": "Stack trace unavailable",
    "HPIF": "Heap info unavailable",
    "HPSG": "Heap segment dumps unavailable",
    "NHSG": "Native heap segment dumps unavailable",
    "HPGC": "Garbage collection unavailable",
    "HPDU": "Heap dump unavailable",
    "HPDS": "Heap dump unavailable",
    "REAE": "Allocation tracking unavailable",
    "REAQ": "Allocation tracking unavailable",
    "REAL": "Allocation list unavailable",
}


def check_type_name(name: object) -> str:
    """``name`` if it can be a DDM request type (four printable ASCII characters), else
    ValueError with a message fit for the user."""
    if not (isinstance(name, str) and len(name) == 4 and all("!" <= c <= "~" for c in name)):
        raise ValueError(
            f"{name!r} is not a request type: give four ASCII characters, such as HPGC or THST"
        )
    return name


# --------------------------------------------------------------------------------------------
# Configuration and statistics


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated VM. ``port=0`` picks a free port (the real one is reported by ``run``).

    ``seed=None`` derives the seed from the pid, so runs are reproducible either way.
    ``gc_interval``/``churn_interval`` of 0 switch the periodic GC / thread churn off
    (``HPGC`` and the test hooks still work). ``flavor`` and ``fail_types``: see the module
    docstring; ``fail_types`` holds request type names such as ``"HPGC"``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    pid: int = 4242
    app_name: str = "com.example.sim"
    package_name: str = "com.example.sim"
    user_id: int = 0
    vm_ident: str = "Dalvik v2.1.0"
    abi: str = "64-bit (x86_64)"
    jvm_flags: str = "CheckJNI=false"
    native_debuggable: bool = False
    features: tuple[str, ...] = ART_FEATURES
    draft: bool = False
    wait_for_debugger: bool = False
    apnm_delay: float = 0.0
    threads: int = 8
    churn_interval: float = 4.0
    gc_interval: float = 3.0
    heap_mb: int = 4
    flavor: Flavor = "art"
    seed: int | None = None
    handshake_timeout: float = 5.0
    send_timeout: float = 10.0
    ack_dbgd: bool = False
    fail_types: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"sim host {self.host!r}: the sim binds loopback addresses only")
        if not 0 <= self.port <= 0xFFFF:
            raise ValueError(f"sim port {self.port} is outside 0..65535")
        if not 0 < self.pid <= _U4_MASK:
            raise ValueError(f"sim pid {self.pid} is outside 1..{_U4_MASK}")
        if self.flavor not in FLAVORS:
            raise ValueError(
                f"sim flavor {self.flavor!r} is not one of {', '.join(map(repr, FLAVORS))}"
            )
        if isinstance(self.fail_types, str) or not isinstance(self.fail_types, tuple | list):
            raise ValueError(
                f"sim fail_types {self.fail_types!r} must be a tuple of request type names"
            )
        for name in self.fail_types:
            check_type_name(name)
        object.__setattr__(self, "fail_types", tuple(self.fail_types))
        if not 1 <= self.threads <= 10000:
            raise ValueError(f"sim threads {self.threads} is outside 1..10000")
        if not 1 <= self.heap_mb <= 2047:
            raise ValueError(f"sim heap_mb {self.heap_mb} is outside 1..2047")
        for name in ("apnm_delay", "churn_interval", "gc_interval"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"sim {name} {value!r} must be a finite number >= 0")
        for name in ("handshake_timeout", "send_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sim {name} must be > 0")

    @property
    def is_dalvik(self) -> bool:
        """VM ident version 1.x is Dalvik (status values 0-9), 2.x is ART (0-4)."""
        return self.vm_ident.startswith("Dalvik v1.")


@dataclass(frozen=True, slots=True)
class SimStatistics:
    """An immutable snapshot of one simulated VM (trio's ``statistics()`` convention)."""

    port: int | None
    pid: int
    app_name: str
    listening: bool
    connected: bool
    exited: bool
    connections_accepted: int
    packets_received: int
    ddm_requests: int
    jdwp_requests: int
    thst_requests: int
    replies_sent: int
    replies_received: int  # reply packets sent TO the VM: a correct server sends none
    duplicate_outstanding_ids: int  # command ids reused within ``_ID_WINDOW`` commands
    pushes_sent: int
    gcs: int
    live_threads: int
    thread_notify: bool


# --------------------------------------------------------------------------------------------
# Threads

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
class _SimThread:
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


# --------------------------------------------------------------------------------------------
# Heap layout


@dataclass(slots=True)
class _Piece:
    start: int  # address of the piece (shipped) or of the whole heap (draft)
    offset: int  # in units; 0 in the shipped layout
    units: int
    usage: bytearray  # (state, n) pairs
    used_units: int = 0  # units of every non-free run
    objects: int = 0  # non-free logical runs (P pieces joined): one per object

    def __post_init__(self) -> None:
        self.recount()

    def recount(self) -> None:
        """Work out ``used_units`` and ``objects`` from the pairs (once, at build time)."""
        used = objects = 0
        continued = False  # the previous pair had P set: this pair continues its run
        usage = self.usage
        for state, n in zip(usage[0::2], usage[1::2], strict=True):
            if state & 0x07:
                used += n + 1
                if not continued:
                    objects += 1
            continued = bool(state & _PARTIAL)
        self.used_units, self.objects = used, objects

    def data(self) -> bytes:
        return _SEGMENT_HEAD.pack(_HEAP_ID, _UNIT, self.start, self.offset, self.units) + bytes(
            self.usage
        )


def _draw_allocation(rng: random.Random) -> tuple[int, int]:
    """One allocation: (state byte without P, units). Sizes in 8-byte units."""
    r = rng.random()
    if r < 0.50:  # plain objects: 16-128 bytes, a few bigger
        kind, units = 0, min(64, 2 + int(rng.expovariate(0.3)))
    elif r < 0.53:  # class objects
        kind, units = 1, rng.randint(12, 120)
    elif r < 0.65:  # byte[] / boolean[]: buffers, sometimes large (bitmaps, I/O buffers)
        kind = 2
        units = rng.randint(257, 2600) if rng.random() < 0.012 else rng.randint(2, 64)
    elif r < 0.82:  # char[] / short[]: string bodies
        kind = 3
        units = rng.randint(300, 1200) if rng.random() < 0.004 else rng.randint(3, 40)
    elif r < 0.96:  # int[] / float[] / Object[]
        kind = 4
        units = rng.randint(257, 1024) if rng.random() < 0.01 else rng.randint(2, 40)
    else:  # long[] / double[]
        kind = 5
        units = rng.randint(257, 700) if rng.random() < 0.01 else rng.randint(2, 24)
    return (kind << 3) | _HARD, units


def _append_run(out: bytearray, state: int, units: int) -> None:
    """Encode one run: 256-unit pieces with P set, then the rest without (protocol.md 4.2)."""
    while units > 256:
        out += bytes((state | _PARTIAL, 255))
        units -= 256
    out += bytes((state, units - 1))


def _pairs_for(units: int) -> int:
    return (units + 255) // 256


def _build_heap(rng: random.Random, heap_bytes: int, *, draft: bool) -> list[_Piece]:
    """A few-MB heap of objects, class objects, arrays of each width and free gaps.

    Pieces are contiguous, each at most ``_MAX_CHUNK`` bytes as a whole chunk; every piece
    ends with an allocation (no free space at the end, no split run across pieces). The
    shipped layout gives each piece its own start address with offset 0; the draft layout
    gives them all the heap's start address and an offset in units.
    """
    total = heap_bytes // _UNIT
    pieces: list[_Piece] = []
    done = 0
    while done < total:
        usage = bytearray()
        units = 0
        budget = min(_MAX_PAIRS, 8192)
        while done + units < total:
            left = total - done - units
            gap = 0
            g = rng.random()
            if g < 0.05:
                gap = rng.randint(1, 48)
            elif g < 0.0515:
                gap = rng.randint(257, 2000)
            state, size = _draw_allocation(rng)
            if gap >= left:
                gap = 0
            size = min(size, left - gap)
            need = (_pairs_for(gap) if gap else 0) + _pairs_for(size)
            if len(usage) // 2 + need > budget:
                if gap:  # try without the gap
                    gap, need = 0, _pairs_for(size)
                    if len(usage) // 2 + need <= budget:
                        _append_run(usage, state, size)
                        units += size
                        continue
                break
            if gap:
                _append_run(usage, 0, gap)
            _append_run(usage, state, size)
            units += gap + size
        if draft:
            pieces.append(_Piece(_HEAP_BASE, done, units, usage))
        else:
            pieces.append(_Piece(_HEAP_BASE + done * _UNIT, 0, units, usage))
        done += units
    return pieces


def _mutate_piece(rng: random.Random, piece: _Piece) -> None:
    """Light GC churn inside one piece: free ~1% of its runs, or reuse a gap.

    Only single-pair runs are touched (never a P piece or the pair after one), never the
    last pair (a piece ends with an allocation), and unit counts never change, so the
    piece always satisfies the parse rule of protocol.md 4.3. The piece's used units and
    object count follow every change.
    """
    usage = piece.usage
    pairs = len(usage) // 2
    if pairs < 3:
        return
    for _ in range(max(1, pairs // 100)):
        i = rng.randrange(1, pairs - 1)
        state = usage[2 * i]
        if state & _PARTIAL or usage[2 * i - 2] & _PARTIAL:
            continue
        units = usage[2 * i + 1] + 1
        if state & 0x07:
            usage[2 * i] = 0  # the object died: a free gap
            piece.used_units -= units
            piece.objects -= 1
        else:
            usage[2 * i] = (rng.choice((0, 0, 2, 3, 4)) << 3) | _HARD  # a new allocation
            piece.used_units += units
            piece.objects += 1


# --------------------------------------------------------------------------------------------
# One connection


class _ConnectionBrokenError(Exception):
    """A send failed or timed out; the connection is being torn down."""


class _Connection:
    """Per-connection state: the stream, its send lock, and what the client enabled."""

    def __init__(self, stream: trio.SocketStream, send_timeout: float) -> None:
        self.stream = stream
        self.send_timeout = send_timeout
        self.lock = trio.StrictFIFOLock()
        self.cancel_scope = trio.CancelScope()
        self.broken = False
        self.close_after_reply = False
        self.thread_notify = False
        self.hpif_when = 0
        self.hpsg_when = 0
        self.hpsg_what = 0
        self.nhsg_when = 0
        self.suspend_count = 0  # VirtualMachine.Suspend minus Resume
        self.next_request_id = 1
        self.recent_ids: dict[int, None] = {}  # insertion-ordered, at most _ID_WINDOW

    def note_id(self, packet_id: int) -> bool:
        """Remember a command id; True when it was already among the recent ones."""
        recent = self.recent_ids
        duplicate = packet_id in recent
        if duplicate:
            del recent[packet_id]
        recent[packet_id] = None
        if len(recent) > _ID_WINDOW:
            del recent[next(iter(recent))]
        return duplicate

    async def send(self, data: bytes) -> None:
        """Write one whole packet; on failure mark the connection broken and cancel it."""
        if self.broken:
            raise _ConnectionBrokenError
        async with self.lock:
            await self.send_locked(data)

    async def send_locked(self, data: bytes) -> None:
        """``send`` for a caller that already holds ``lock``."""
        try:
            with trio.fail_after(self.send_timeout):
                await self.stream.send_all(data)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
            self.cancel_scope.cancel()
            raise _ConnectionBrokenError from None


# --------------------------------------------------------------------------------------------
# The VM


class _Halt(Exception):
    """Raised inside a handler: the VM halts (DDM EXIT, VirtualMachine.Exit)."""


# A DDM handler's outcome: the reply's chunk bytes, or None for "returned nothing".
_DdmResult = bytes | None
_JdwpHandler = Callable[["_Connection", bytes], Awaitable[tuple[int, bytes]]]


class SimVm:
    """One simulated VM. ``await vm.run()`` serves until EXIT or cancellation."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        seed = config.seed if config.seed is not None else config.pid
        self._rng = random.Random(seed)
        self._port: int | None = None
        self._listening = False
        self._conn: _Connection | None = None
        self._exited = False
        self._waiting = config.wait_for_debugger
        # ART 9+ loads its debugger agent at the first non-DDM command and keeps it until the
        # process dies: per VM, not per connection (flavours art and modern).
        self._agent_loaded = False
        # ART 5-8 handles a DDM packet only if its one chunk fills it exactly (2.4).
        self._strict_framing = config.flavor == "legacy" and not config.is_dalvik
        self._fail_types = frozenset(
            int.from_bytes(name.encode("ascii"), "big") for name in config.fail_types
        )
        named = config.apnm_delay <= 0
        self._app_name = config.app_name if named else PRE_INITIALIZED
        self._package_name = config.package_name if named else PRE_INITIALIZED
        self._helo_cache: bytes | None = None
        self._feat_chunk = encode_chunk(FeatReply(tuple(config.features)))
        self._push_serial = 0
        self._gc_lock = trio.Lock()
        self._heap: list[_Piece] | None = None
        self._log = logger.bind(sim_pid=config.pid)
        # counters
        self._connections_accepted = 0
        self._packets_received = 0
        self._ddm_requests = 0
        self._jdwp_requests = 0
        self._thst_requests = 0
        self._replies_sent = 0
        self._replies_received = 0
        self._duplicate_ids = 0
        self._pushes_sent = 0
        self._gcs = 0
        # threads
        self._threads: dict[int, _SimThread] = {}
        self._threads_by_object: dict[int, _SimThread] = {}
        self._next_tid = config.pid
        self._next_object_id = _FIRST_THREAD_OBJECT
        self._worker_serial = 0
        self._last_evolve = 0.0
        self._palette = (
            _DRAFT_STATES if config.draft else _DALVIK_STATES if config.is_dalvik else _ART_STATES
        )
        self._init_threads()
        self._ddm_handlers = self._make_ddm_handlers()
        self._jdwp_handlers = self._make_jdwp_handlers()

    # ----------------------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """The listening port once known (after ``run`` reported it)."""
        return self._port

    @property
    def connections_accepted(self) -> int:
        return self._connections_accepted

    @property
    def app_name(self) -> str:
        return self._app_name

    def statistics(self) -> SimStatistics:
        conn = self._conn
        return SimStatistics(
            port=self._port,
            pid=self.config.pid,
            app_name=self._app_name,
            listening=self._listening,
            connected=conn is not None,
            exited=self._exited,
            connections_accepted=self._connections_accepted,
            packets_received=self._packets_received,
            ddm_requests=self._ddm_requests,
            jdwp_requests=self._jdwp_requests,
            thst_requests=self._thst_requests,
            replies_sent=self._replies_sent,
            replies_received=self._replies_received,
            duplicate_outstanding_ids=self._duplicate_ids,
            pushes_sent=self._pushes_sent,
            gcs=self._gcs,
            live_threads=len(self._threads),
            thread_notify=conn is not None and conn.thread_notify,
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, serve one connection at a time, until EXIT (or cancellation).

        Reports the real port with ``task_status.started(port)`` once listening.
        """
        self._last_evolve = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                if self.config.apnm_delay > 0:
                    nursery.start_soon(self._apnm_timer)
                if self.config.gc_interval > 0:
                    nursery.start_soon(self._gc_loop)
                if self.config.churn_interval > 0:
                    nursery.start_soon(self._churn_loop)
                try:
                    await self._serve(task_status)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._listening = False
            self._log.info("sim.stopped", exited=self._exited)

    async def force_gc(self) -> None:
        """Run a GC now (pushes HPIF/HPSG/NHSG data as the connection enabled them)."""
        await self._gc()

    async def push_wait(self) -> None:
        """Push WAIT now (the app just called ``Debug.waitForDebugger()``)."""
        self._waiting = True
        await self._push(encode_chunk(WaitForDebugger(0)))

    async def rename(self, app_name: str, package_name: str | None = None) -> None:
        """The process is (re)named: later HELO replies use it, and APNM is pushed now."""
        self._app_name = app_name
        self._package_name = package_name if package_name is not None else app_name
        self._helo_cache = None
        await self._push(self._apnm_chunk())

    async def churn(self) -> None:
        """One thread event now: a thread starts, dies or is renamed (pushed if THEN is on)."""
        await self._churn_once()

    # ----------------------------------------------------------------------------- listening

    async def _open_listener(self) -> trio.SocketListener:
        port = self._port if self._port is not None else self.config.port
        delay = 0.01
        for attempt in range(60):
            try:
                listeners = await trio.open_tcp_listeners(port, host=self.config.host, backlog=4)
            except OSError:
                if self._port is None or attempt == 59:  # first bind: report at once
                    raise
                # our own port, briefly taken (e.g. by an outgoing connection): retry
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            listener = listeners[0]
            for extra in listeners[1:]:
                await extra.aclose()
            return listener
        raise AssertionError("unreachable")  # pragma: no cover

    async def _serve(self, task_status: trio.TaskStatus[int]) -> None:
        reported = False
        while not self._exited:
            listener = await self._open_listener()
            self._listening = True
            if self._port is None:
                self._port = listener.socket.getsockname()[1]
                self._log = self._log.bind(port=self._port)
            if not reported:
                self._log.info("sim.listening", host=self.config.host, app=self._app_name)
                task_status.started(self._port)
                reported = True
            try:
                stream = await listener.accept()
            finally:
                # A VM admits one JDWP connection at a time: stop listening while it is open,
                # so a second connect is refused (what HotSpot does).
                self._listening = False
                await listener.aclose()
            self._connections_accepted += 1
            self._log.info("sim.connection_accepted", n=self._connections_accepted)
            try:
                await self._handle(stream)
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
            self._log.info("sim.connection_closed")

    # ----------------------------------------------------------------------------- connection

    async def _handle(self, stream: trio.SocketStream) -> None:
        decoder = PacketDecoder(expect_handshake=True, max_length=_MAX_PACKET)
        conn = _Connection(stream, self.config.send_timeout)
        with trio.move_on_after(self.config.handshake_timeout) as scope:
            if not await self._read_handshake(stream, decoder):
                return
        if scope.cancelled_caught:
            self._log.info("sim.handshake_timed_out")
            return
        try:
            async with conn.lock:
                # Publish the connection while holding its send lock: a push from another
                # task (GC, churn, APNM, a test hook) queues up behind the echo.
                self._conn = conn
                await conn.send_locked(HANDSHAKE)
            with conn.cancel_scope:
                await self._read_loop(conn, decoder)
        except _ConnectionBrokenError:
            self._log.info("sim.send_failed")
        finally:
            # Thread notification and heap pushes end with the connection, and (as on every
            # real VM) a debugger's suspensions are released when its connection closes.
            self._conn = None
            for thread in self._threads.values():
                thread.suspend_count = 0

    async def _read_handshake(self, stream: trio.SocketStream, decoder: PacketDecoder) -> bool:
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                self._log.info("sim.handshake_failed", error=str(exc))
                return False
            if isinstance(event, Handshake):
                return True
            if event is not NEED_DATA:  # EOF before the handshake
                self._log.info("sim.handshake_failed", error="connection closed")
                return False
            data = await self._receive(stream)
            decoder.receive_data(data)

    async def _receive(self, stream: trio.SocketStream) -> bytes:
        try:
            return await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""

    async def _read_loop(self, conn: _Connection, decoder: PacketDecoder) -> None:
        # No read deadline here on purpose: a VM waits for its debugger's next command for
        # as long as the connection stays open. Sends are bounded by ``send_timeout``.
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                self._log.info("sim.protocol_error", error=str(exc))
                return
            if event is NEED_DATA:
                decoder.receive_data(await self._receive(conn.stream))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, ReplyPacket):
                # The VM never expects replies (protocol.md 1.6): count it, then drop it.
                self._replies_received += 1
                self._log.info("sim.reply_received", id=event.id)
                continue
            if not isinstance(event, CommandPacket):  # pragma: no cover - no streaming here
                continue
            self._packets_received += 1
            if conn.note_id(event.id):
                self._duplicate_ids += 1
                self._log.info("sim.duplicate_id", id=event.id)
            try:
                if event.command_set == _DDM_SET and event.command == 1:
                    await self._on_ddm(conn, event)
                else:
                    await self._on_jdwp(conn, event)
            except _Halt:
                self._halt()
                return
            if conn.close_after_reply:
                return

    async def _reply(self, conn: _Connection, packet_id: int, data: bytes, error: int = 0) -> None:
        await conn.send(encode(ReplyPacket(packet_id, error, data)))
        self._replies_sent += 1

    def _halt(self) -> None:
        self._exited = True
        self._log.info("sim.exited")

    # ----------------------------------------------------------------------------- pushes

    def _next_push_id(self) -> int:
        self._push_serial = (self._push_serial % 0x7FFFFFFF) + 1
        return _VM_ID_BIT | self._push_serial

    def _push_packet(self, chunk: bytes) -> bytes:
        return _PUSH_HEADER.pack(11 + len(chunk), self._next_push_id(), 0, _DDM_SET, 1) + chunk

    async def _push(self, chunk: bytes, conn: _Connection | None = None) -> bool:
        """Push one chunk on ``conn`` (default: the current connection). False if none."""
        conn = conn or self._conn
        if conn is None or conn.broken:
            return False
        try:
            await conn.send(self._push_packet(chunk))
        except _ConnectionBrokenError:
            return False
        self._pushes_sent += 1
        return True

    def _apnm_chunk(self) -> bytes:
        if self.config.draft:
            return encode_chunk(AppName(self._app_name))
        return encode_chunk(AppName(self._app_name, self.config.user_id, self._package_name))

    async def _apnm_timer(self) -> None:
        await trio.sleep(self.config.apnm_delay)
        if self._app_name == PRE_INITIALIZED:
            await self.rename(self.config.app_name, self.config.package_name)

    # ----------------------------------------------------------------------------- DDM

    def _make_ddm_handlers(
        self,
    ) -> dict[type[Chunk], Callable[[_Connection, Chunk], Awaitable[_DdmResult]]]:
        handlers: dict[type[Chunk], Callable[[_Connection, Chunk], Awaitable[_DdmResult]]] = {
            HeloRequest: self._ddm_helo,
            FeatRequest: self._ddm_feat,
            ExitRequest: self._ddm_exit,
        }
        if self.config.flavor != "modern":  # Android 12+ lost the thread and heap handlers
            handlers |= {
                ThreadNotify: self._ddm_then,
                ThreadStatusRequest: self._ddm_thst,
                StackTraceRequest: self._ddm_stkl,
                HeapInfoRequest: self._ddm_hpif,
                HeapSegmentRequest: self._ddm_hpsg,
                NativeHeapSegmentRequest: self._ddm_nhsg,
                GcRequest: self._ddm_hpgc,
            }
        if self.config.ack_dbgd:
            handlers[Dbgd] = self._ddm_dbgd
        return handlers

    async def _on_ddm(self, conn: _Connection, packet: CommandPacket) -> None:
        self._ddm_requests += 1
        data = packet.data
        result: _DdmResult = None
        chunk_type = -1
        framed = False  # the first chunk's header and data lie within the packet
        if len(data) >= 8:
            chunk_type, length = _CHUNK_HEADER.unpack_from(data)
            framed = 8 + length <= len(data)
            if framed and self._strict_framing and 8 + length != len(data):
                framed = False  # ART 5-8: the chunk must be exactly the rest of the packet
                self._log.debug("sim.ddm_trailing_bytes", extra=len(data) - 8 - length)
            elif framed and chunk_type in self._fail_types:
                # A VM that refuses this feature (``fail_types``).
                message = _REFUSALS.get(type_name(chunk_type), "Request refused")
                result = encode_chunk(Fail(1, message))
            elif framed:  # only the first chunk counts; trailing bytes are ignored
                try:
                    chunk = decode_chunk(chunk_type, data[8 : 8 + length], Direction.TO_VM)
                except ProtocolError as exc:  # as if the handler threw
                    self._log.debug("sim.ddm_malformed", error=str(exc))
                else:
                    handler = self._ddm_handlers.get(type(chunk))
                    if handler is not None:
                        result = await handler(conn, chunk)
        self._log.debug(
            "sim.ddm_received",
            id=packet.id,
            chunk_type=type_name(chunk_type) if chunk_type >= 0 else "-",
            len=len(data),
            answered=result is not None,
        )
        if result is not None:
            await self._reply(conn, packet.id, result)
            return
        # The handler returned nothing, or there is none, or it threw, or the packet is
        # malformed: protocol.md 2.2 says what each VM writes back then.
        if self.config.flavor == "legacy":
            await self._reply(conn, packet.id, b"")
        elif not self._agent_loaded:
            self._log.debug("sim.ddm_unanswered", id=packet.id)  # ART 9+: nothing at all
        elif not framed:
            # ART 9+ with its agent: a chunk running past the packet is a JDWP error.
            await self._reply(conn, packet.id, b"", ErrorCode.INTERNAL)
        else:
            await self._reply(conn, packet.id, b"")

    async def _ddm_helo(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        if self._waiting:  # Debug.waitingForDebugger(): WAIT goes out while building HELO
            await self._push(encode_chunk(WaitForDebugger(0)), conn)
        if self._helo_cache is None:
            c = self.config
            if c.draft:
                reply = HeloReply(1, c.pid, c.vm_ident, self._app_name)
            else:
                reply = HeloReply(
                    1,
                    c.pid,
                    c.vm_ident,
                    self._app_name,
                    c.user_id,
                    c.abi,
                    c.jvm_flags,
                    c.native_debuggable,
                    self._package_name,
                )
            self._helo_cache = encode_chunk(reply)
        return self._helo_cache

    async def _ddm_feat(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        return self._feat_chunk

    async def _ddm_exit(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, ExitRequest)
        self._log.info("sim.exit_requested", status=chunk.status)
        raise _Halt  # Runtime.halt: no reply, the connection just ends

    async def _ddm_then(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, ThreadNotify)
        if chunk.enable:
            conn.thread_notify = True
            for thread in list(self._threads.values()):  # the burst comes before the reply
                await self._push(thread.thcr_chunk(), conn)
        else:
            conn.thread_notify = False
        return None

    async def _ddm_dbgd(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        # The draft's DBGD: drop the debugger's state, then acknowledge with a DBGD chunk.
        conn.suspend_count = 0
        for thread in self._threads.values():
            thread.suspend_count = 0
        return encode_chunk(Dbgd())

    async def _ddm_thst(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        self._thst_requests += 1
        self._evolve_threads()
        threads = self._threads.values()
        if self.config.draft:
            body = [_U4.pack(len(self._threads))]
            body.extend(
                _DRAFT_ENTRY.pack(
                    t.thread_id, t.status, 1 if t.suspend_count or conn.suspend_count else 0
                )
                for t in threads
            )
        else:
            body = [_THST_HEAD.pack(4, 18, len(self._threads))]
            body.extend(
                _THST_ENTRY.pack(
                    t.thread_id,
                    t.status,
                    t.tid,
                    int(t.utime) & _U4_MASK,
                    int(t.stime) & _U4_MASK,
                    1 if t.daemon else 0,
                )
                for t in threads
            )
        data = b"".join(body)
        return _CHUNK_HEADER.pack(ChunkType.THST, len(data)) + data

    async def _ddm_stkl(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, StackTraceRequest)
        thread = self._threads.get(chunk.thread_id)
        if thread is None:
            return encode_chunk(Fail(1, "Stack trace unavailable"))
        return encode_chunk(StackTrace(thread.thread_id, _STACKS[thread.role]))

    async def _ddm_hpif(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, HeapInfoRequest)
        when = chunk.when
        if when > 3:
            return encode_chunk(Fail(1, f"Unknown HPIF WHEN value {when}"))
        if when == 1:
            info = self._heap_info(1)
            if self.config.draft:  # the draft put the data in the reply
                return info
            await self._push(info, conn)  # shipped: pushed before the (empty) reply
            return None
        conn.hpif_when = when
        return None

    async def _ddm_hpsg(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, HeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown HPSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.hpsg_when, conn.hpsg_what = chunk.when, chunk.what
        return None

    async def _ddm_nhsg(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, NativeHeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown NHSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.nhsg_when = chunk.when
        return None

    async def _ddm_hpgc(self, conn: _Connection, chunk: Chunk) -> _DdmResult:
        await self._gc()
        return None

    # ----------------------------------------------------------------------------- heap

    def _heap_info(self, reason: int) -> bytes:
        """HPIF data for the heap as it is now: the very layout a segment dump would send."""
        pieces = self._heap_pieces()
        size = sum(p.units for p in pieces) * _UNIT
        allocated = sum(p.used_units for p in pieces) * _UNIT
        entry = HeapInfoEntry(
            heap_id=_HEAP_ID,
            timestamp_ms=int(time.time() * 1000),
            reason=reason,
            max_size=min(max(256 << 20, size), _U4_MASK),
            size=size & _U4_MASK,
            bytes_allocated=allocated & _U4_MASK,
            objects_allocated=sum(p.objects for p in pieces) & _U4_MASK,
        )
        return encode_chunk(HeapInfo((entry,)))

    def _heap_pieces(self) -> list[_Piece]:
        if self._heap is None:
            self._heap = _build_heap(self._rng, self.config.heap_mb << 20, draft=self.config.draft)
        return self._heap

    async def _gc(self) -> None:
        async with self._gc_lock:  # one dump sequence at a time: HPST ... HPEN never interleave
            self._gcs += 1
            if self._heap is not None:  # built once someone asks for heap info or a dump
                index = self._rng.randrange(len(self._heap))
                _mutate_piece(self._rng, self._heap[index])
            conn = self._conn
            if conn is None:
                return
            if conn.hpif_when in (2, 3):
                reason = conn.hpif_when
                if reason == 2:
                    conn.hpif_when = 0  # one shot
                await self._push(self._heap_info(reason), conn)
            if conn.hpsg_when:
                seg_type = ChunkType.HPSO if conn.hpsg_what else ChunkType.HPSG
                await self._push(encode_chunk(HeapStart(_HEAP_ID)), conn)
                for piece in self._heap_pieces():
                    data = piece.data()
                    await self._push(_CHUNK_HEADER.pack(seg_type, len(data)) + data, conn)
                await self._push(encode_chunk(HeapEnd(_HEAP_ID)), conn)
            if conn.nhsg_when:  # ART never walks the native heap: start and end only
                await self._push(encode_chunk(NativeHeapStart(_HEAP_ID)), conn)
                await self._push(encode_chunk(NativeHeapEnd(_HEAP_ID)), conn)

    async def _gc_loop(self) -> None:
        interval = self.config.gc_interval
        await trio.sleep(interval * self._rng.uniform(0.5, 1.0))  # spread many VMs out
        while True:
            await self._gc()
            await trio.sleep(interval * self._rng.uniform(0.8, 1.2))

    # ----------------------------------------------------------------------------- threads

    def _init_threads(self) -> None:
        pid = self.config.pid
        for index in range(self.config.threads):
            if index < len(_CORE_THREADS):
                name, role, daemon = _CORE_THREADS[index]
                name = name.format(pid=pid)
            else:
                self._worker_serial += 1
                name, role, daemon = f"pool-1-thread-{self._worker_serial}", "worker", False
            self._add_thread(name, role, daemon, transient=False)

    def _add_thread(self, name: str, role: str, daemon: bool, *, transient: bool) -> _SimThread:
        thread_id = 1
        while thread_id in self._threads:  # ids are reused after a thread dies
            thread_id += 1
        tid = self._next_tid
        self._next_tid = self._next_tid + 1 if self._next_tid < 0x3FFFFF else 2
        thread = _SimThread(
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
        self._threads[thread_id] = thread
        self._threads_by_object[thread.object_id] = thread
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

    def _evolve_threads(self) -> None:
        """Advance thread states and CPU times to now (cheap; called per THST)."""
        now = trio.current_time()
        elapsed = now - self._last_evolve
        if elapsed <= 0:
            return
        self._last_evolve = now
        rng = self._rng
        for t in self._threads.values():
            if rng.random() < min(1.0, elapsed * _VOLATILITY[t.role]):
                t.status = self._draw_status(t.role)
            rate = _TICKS_RUNNING if t.status in _RUNNING_STATES else _TICKS_IDLE
            ticks = elapsed * rate * rng.random()
            t.utime += ticks
            t.stime += ticks * 0.3

    async def _churn_once(self) -> None:
        rng = self._rng
        transient = [t for t in self._threads.values() if t.transient]
        r = rng.random()
        if transient and (r < 0.35 or len(transient) >= 4):
            victim = rng.choice(transient)
            del self._threads[victim.thread_id]
            del self._threads_by_object[victim.object_id]
            await self._push_thread_event(encode_chunk(ThreadDied(victim.thread_id)))
        elif transient and r < 0.55:
            thread = rng.choice(transient)
            thread.name = rng.choice(_RENAMES).format(n=rng.randint(1, 9))
            thread.thcr = b""
            await self._push_thread_event(
                encode_chunk(ThreadRenamed(thread.thread_id, thread.name))
            )
        else:
            self._worker_serial += 1
            name = rng.choice(
                (f"pool-2-thread-{self._worker_serial}", f"Thread-{self._worker_serial}")
            )
            thread = self._add_thread(name, "worker", False, transient=True)
            await self._push_thread_event(thread.thcr_chunk())

    async def _push_thread_event(self, chunk: bytes) -> None:
        conn = self._conn
        if conn is not None and conn.thread_notify:
            await self._push(chunk, conn)

    async def _churn_loop(self) -> None:
        interval = self.config.churn_interval
        while True:
            await trio.sleep(self._rng.expovariate(1.0 / interval))
            await self._churn_once()

    # ----------------------------------------------------------------------------- plain JDWP

    def _make_jdwp_handlers(self) -> dict[tuple[int, int], _JdwpHandler]:
        vm = CommandSet.VIRTUAL_MACHINE
        v = VirtualMachineCommand
        tr = CommandSet.THREAD_REFERENCE
        tg = CommandSet.THREAD_GROUP_REFERENCE
        er = CommandSet.EVENT_REQUEST
        return {
            (vm, v.VERSION): self._jdwp_version,
            (vm, v.CLASSES_BY_SIGNATURE): self._jdwp_classes_by_signature,
            (vm, v.ALL_CLASSES): self._jdwp_all_classes,
            (vm, v.ALL_CLASSES_WITH_GENERIC): self._jdwp_all_classes_with_generic,
            (vm, v.ALL_THREADS): self._jdwp_all_threads,
            (vm, v.TOP_LEVEL_THREAD_GROUPS): self._jdwp_top_groups,
            (vm, v.DISPOSE): self._jdwp_dispose,
            (vm, v.ID_SIZES): self._jdwp_id_sizes,
            (vm, v.SUSPEND): self._jdwp_vm_suspend,
            (vm, v.RESUME): self._jdwp_vm_resume,
            (vm, v.EXIT): self._jdwp_exit,
            (vm, v.CAPABILITIES): self._jdwp_capabilities,
            (vm, v.CAPABILITIES_NEW): self._jdwp_capabilities_new,
            (vm, v.CLASS_PATHS): self._jdwp_class_paths,
            (vm, v.DISPOSE_OBJECTS): self._jdwp_empty,
            (vm, v.HOLD_EVENTS): self._jdwp_empty,
            (vm, v.RELEASE_EVENTS): self._jdwp_empty,
            (CommandSet.REFERENCE_TYPE, 1): self._jdwp_signature,
            (CommandSet.REFERENCE_TYPE, 13): self._jdwp_signature_with_generic,
            (CommandSet.OBJECT_REFERENCE, 1): self._jdwp_object_reference_type,
            (tr, 1): self._jdwp_thread_name,
            (tr, 2): self._jdwp_thread_suspend,
            (tr, 3): self._jdwp_thread_resume,
            (tr, 4): self._jdwp_thread_status,
            (tr, 5): self._jdwp_thread_group,
            (tr, 6): self._jdwp_thread_frames,
            (tr, 7): self._jdwp_thread_frame_count,
            (tr, 12): self._jdwp_thread_suspend_count,
            (tg, 1): self._jdwp_group_name,
            (tg, 2): self._jdwp_group_parent,
            (tg, 3): self._jdwp_group_children,
            (er, 1): self._jdwp_event_set,
            (er, 2): self._jdwp_empty,
            (er, 3): self._jdwp_empty,
        }

    async def _on_jdwp(self, conn: _Connection, packet: CommandPacket) -> None:
        self._jdwp_requests += 1
        if not self._agent_loaded:
            # ART 9+ loads its debugger agent at the first non-DDM packet, and
            # Debug.waitForDebugger() counts a debugger as present from then on.
            self._agent_loaded = True
            self._waiting = False
        self._log.debug(
            "sim.jdwp_received",
            id=packet.id,
            command_set=packet.command_set,
            command=packet.command,
            len=len(packet.data),
        )
        handler = self._jdwp_handlers.get((packet.command_set, packet.command))
        if handler is None:
            self._log.debug(
                "sim.jdwp_not_implemented", command_set=packet.command_set, command=packet.command
            )
            await self._reply(conn, packet.id, b"", ErrorCode.NOT_IMPLEMENTED)
            return
        try:
            error, data = await handler(conn, packet.data)
        except (struct.error, IndexError):
            error, data = ErrorCode.ILLEGAL_ARGUMENT, b""
        except _Halt:
            await self._reply(conn, packet.id, b"")  # VirtualMachine.Exit replies first
            raise
        await self._reply(conn, packet.id, data if error == 0 else b"", error)

    def _thread_of(self, data: bytes) -> _SimThread | None:
        (object_id,) = _U8.unpack_from(data)
        return self._threads_by_object.get(object_id)

    async def _jdwp_empty(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, b""

    async def _jdwp_version(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        version = self.config.vm_ident.rpartition(" v")[2] or "2.1.0"
        return 0, (
            _jstr(f"Android DalvikVM {version} (ddmd sim)")
            + _S4.pack(1)
            + _S4.pack(8)
            + _jstr("1.8.0")
            + _jstr("Dalvik")
        )

    async def _jdwp_id_sizes(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, IdSizes(8, 8, 8, 8, 8).encode()

    async def _jdwp_capabilities(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, bytes(7)

    async def _jdwp_capabilities_new(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, bytes(32)

    async def _jdwp_class_paths(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, _jstr("/") + _S4.pack(0) + _S4.pack(0)

    async def _jdwp_all_classes(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, _class_list(generic=False)

    async def _jdwp_all_classes_with_generic(
        self, conn: _Connection, data: bytes
    ) -> tuple[int, bytes]:
        return 0, _class_list(generic=True)

    async def _jdwp_classes_by_signature(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        (size,) = _U4.unpack_from(data)
        wanted = data[4 : 4 + size].decode("utf-8", "replace")
        found = [
            bytes((_TYPE_TAG_CLASS,)) + _U8.pack(type_id) + _S4.pack(_CLASS_STATUS)
            for type_id, signature in _CLASS_SIGNATURES.items()
            if signature == wanted
        ]
        return 0, _S4.pack(len(found)) + b"".join(found)

    async def _jdwp_all_threads(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        ids = [_U8.pack(t.object_id) for t in self._threads.values()]
        return 0, _S4.pack(len(ids)) + b"".join(ids)

    async def _jdwp_top_groups(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        return 0, _S4.pack(1) + _U8.pack(_GROUP_ID)

    async def _jdwp_dispose(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        conn.close_after_reply = True  # OpenJDK's agent replies, then closes the connection
        return 0, b""

    async def _jdwp_exit(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        self._log.info("sim.exit_requested", status=_S4.unpack_from(data)[0])
        raise _Halt

    async def _jdwp_vm_suspend(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        conn.suspend_count += 1
        return 0, b""

    async def _jdwp_vm_resume(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        conn.suspend_count = max(0, conn.suspend_count - 1)
        return 0, b""

    async def _jdwp_signature(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        signature = _CLASS_SIGNATURES.get(_U8.unpack_from(data)[0])
        if signature is None:
            return ErrorCode.INVALID_CLASS, b""
        return 0, _jstr(signature)

    async def _jdwp_signature_with_generic(
        self, conn: _Connection, data: bytes
    ) -> tuple[int, bytes]:
        error, body = await self._jdwp_signature(conn, data)
        if error:
            return error, b""
        return 0, body + _jstr("")  # signature, then an empty generic signature

    async def _jdwp_object_reference_type(
        self, conn: _Connection, data: bytes
    ) -> tuple[int, bytes]:
        (object_id,) = _U8.unpack_from(data)
        if object_id == _GROUP_ID:
            return 0, bytes((_TYPE_TAG_CLASS,)) + _U8.pack(_GROUP_CLASS_ID)
        if object_id in self._threads_by_object:
            return 0, bytes((_TYPE_TAG_CLASS,)) + _U8.pack(_THREAD_CLASS_ID)
        return ErrorCode.INVALID_OBJECT, b""

    async def _jdwp_thread_name(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _jstr(thread.name)

    async def _jdwp_thread_suspend(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        thread.suspend_count += 1
        return 0, b""

    async def _jdwp_thread_resume(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        thread.suspend_count = max(0, thread.suspend_count - 1)
        return 0, b""

    async def _jdwp_thread_status(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        self._evolve_threads()
        status = _JDWP_THREAD_STATUS.get(thread.status, 1)
        suspended = 1 if thread.suspend_count or conn.suspend_count or thread.status == 9 else 0
        return 0, _S4.pack(status) + _S4.pack(suspended)

    async def _jdwp_thread_group(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _U8.pack(_GROUP_ID)

    async def _jdwp_thread_frames(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(0)

    async def _jdwp_thread_frame_count(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(0)

    async def _jdwp_thread_suspend_count(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(thread.suspend_count + conn.suspend_count)

    def _check_group(self, data: bytes) -> bool:
        return bool(_U8.unpack_from(data)[0] == _GROUP_ID)

    async def _jdwp_group_name(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        return 0, _jstr("main")

    async def _jdwp_group_parent(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        return 0, _U8.pack(0)

    async def _jdwp_group_children(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        ids = [_U8.pack(t.object_id) for t in self._threads.values()]
        return 0, _S4.pack(len(ids)) + b"".join(ids) + _S4.pack(0)

    async def _jdwp_event_set(self, conn: _Connection, data: bytes) -> tuple[int, bytes]:
        request_id = conn.next_request_id
        conn.next_request_id += 1
        return 0, _S4.pack(request_id)


# DDM status value -> JDWP ThreadStatus (0 zombie, 1 running, 2 sleeping, 3 monitor, 4 wait).
_JDWP_THREAD_STATUS: Final = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 1, 6: 1, 7: 1, 8: 4, 9: 1}


def _class_list(*, generic: bool) -> bytes:
    parts = [_S4.pack(len(_CLASS_SIGNATURES))]
    for type_id, signature in _CLASS_SIGNATURES.items():
        parts.append(bytes((_TYPE_TAG_CLASS,)) + _U8.pack(type_id) + _jstr(signature))
        if generic:
            parts.append(_jstr(""))
        parts.append(_S4.pack(_CLASS_STATUS))
    return b"".join(parts)


def _jstr(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return _U4.pack(len(raw)) + raw


# --------------------------------------------------------------------------------------------
# Many VMs in one process


async def serve_many(
    configs: Iterable[SimConfig],
    *,
    task_status: trio.TaskStatus[tuple[SimVm, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run every VM in one nursery; report the ``SimVm`` objects once all are listening.

    Each VM's ``port`` is then known. Returns when every VM has exited (EXIT).
    """
    vms = tuple(SimVm(c) for c in configs)
    async with trio.open_nursery() as nursery:
        for vm in vms:
            await nursery.start(vm.run)
        task_status.started(vms)


def make_configs(base: SimConfig, count: int) -> list[SimConfig]:
    """``count`` configs from ``base``: consecutive ports (unless 0), pids and app names."""
    if count == 1:
        return [base]
    out = []
    for i in range(count):
        port = base.port + i if base.port else 0
        if port > 0xFFFF:
            raise ValueError(f"--port {base.port} with --count {count} runs past port 65535")
        out.append(
            replace(
                base,
                port=port,
                pid=base.pid + i * 7,
                app_name=f"{base.app_name}{i + 1}",
                package_name=f"{base.package_name}{i + 1}",
                seed=None if base.seed is None else base.seed + i,
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# CLI: ``ddmd sim``


async def _run_cli(configs: Sequence[SimConfig]) -> None:
    async with trio.open_nursery() as outer:

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    outer.cancel_scope.cancel()
                    return

        outer.start_soon(watch_signals)
        async with trio.open_nursery() as inner:
            vms: tuple[SimVm, ...] = await inner.start(serve_many, configs)
            for vm in vms:
                click.echo(
                    f"sim VM pid={vm.config.pid} app={vm.config.app_name} "
                    f"listening on {vm.config.host}:{vm.port}"
                )
        outer.cancel_scope.cancel()  # every VM exited


def _parse_fail_types(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """``--fail A,B --fail C`` -> ("A", "B", "C"), upper-cased, each checked, no repeats."""
    names: list[str] = []
    for value in values:
        for raw in value.split(","):
            name = raw.strip().upper()
            try:
                check_type_name(name)
            except ValueError as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
            if name not in names:
                names.append(name)
    return tuple(names)


@click.command("sim", short_help="Run simulated DDM-speaking VMs for experiments and tests.")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="First port (0: free ports).",
)
@click.option(
    "--count",
    type=click.IntRange(1, 5000),
    default=1,
    show_default=True,
    help="Number of VMs, on consecutive ports from --port.",
)
@click.option("--pid", type=click.IntRange(1, 0x3FFFFFFF), default=4242, show_default=True)
@click.option("--app", default="com.example.sim", show_default=True, help="Process name.")
@click.option("--package", default=None, help="Package name (default: the --app value).")
@click.option(
    "--vm-ident",
    default="Dalvik v2.1.0",
    show_default=True,
    help='"Dalvik v1.6.0" gives Dalvik thread states.',
)
@click.option("--draft", is_flag=True, help="Use the 2007 draft chunk layouts.")
@click.option("--wait", is_flag=True, help="Wait for a debugger (WAIT before the HELO reply).")
@click.option(
    "--flavor",
    type=click.Choice(FLAVORS),
    default="art",
    show_default=True,
    help="art: Android 9-11, no reply when a handler returns nothing (until a debugger "
    "attaches); legacy: Dalvik and Android 5-8, empty replies; modern: Android 12+, no thread "
    "or heap handlers.",
)
@click.option(
    "--fail",
    "fail",
    metavar="TYPE[,TYPE...]",
    multiple=True,
    callback=_parse_fail_types,
    help="Refuse these request types with a FAIL chunk, e.g. --fail HPGC,HPSG.",
)
@click.option(
    "--apnm-delay",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds as <pre-initialized> before APNM names the app.",
)
@click.option("--threads", type=click.IntRange(1, 10000), default=8, show_default=True)
@click.option(
    "--churn-interval",
    type=click.FloatRange(0),
    default=4.0,
    show_default=True,
    help="Mean seconds between thread start/death/rename events (0: none).",
)
@click.option(
    "--gc-interval",
    type=click.FloatRange(0),
    default=3.0,
    show_default=True,
    help="Seconds between GCs (0: only on HPGC).",
)
@click.option("--heap-mb", type=click.IntRange(1, 2047), default=4, show_default=True)
@click.option("--seed", type=int, default=None, help="Random seed (default: from the pid).")
@click.option(
    "--ack-dbgd",
    is_flag=True,
    help="Answer DBGD with a DBGD chunk (the draft's acknowledgement), as no shipped VM does.",
)
def sim_command(
    port: int,
    count: int,
    pid: int,
    app: str,
    package: str | None,
    vm_ident: str,
    draft: bool,
    wait: bool,
    flavor: Flavor,
    apnm_delay: float,
    threads: int,
    churn_interval: float,
    gc_interval: float,
    heap_mb: int,
    seed: int | None,
    ack_dbgd: bool,
    fail: tuple[str, ...],
) -> None:
    """Run simulated DDM-speaking VMs on 127.0.0.1 until Ctrl-C or SIGTERM."""
    base = SimConfig(
        port=port,
        pid=pid,
        app_name=app,
        package_name=package if package is not None else app.partition(":")[0],
        vm_ident=vm_ident,
        draft=draft,
        wait_for_debugger=wait,
        flavor=flavor,
        apnm_delay=apnm_delay,
        threads=threads,
        churn_interval=churn_interval,
        gc_interval=gc_interval,
        heap_mb=heap_mb,
        seed=seed,
        ack_dbgd=ack_dbgd,
        fail_types=fail,
    )
    try:
        configs = make_configs(base, count)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    failure: OSError | None = None
    try:
        trio.run(_run_cli, configs)
    except* OSError as group:
        failure = _first_leaf(group)
    if failure is not None:
        last = port + count - 1
        where = f"port {port}" if last == port else f"ports {port}..{last}"
        raise click.ClickException(
            f"cannot listen on 127.0.0.1 {where}: {failure} "
            "(choose other ports with --port, or --port 0 for free ones)"
        )


def _first_leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
