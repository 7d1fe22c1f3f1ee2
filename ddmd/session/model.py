"""What ddmd knows about one VM, as plain data: the snapshots the registry serves, and the
``VmModel`` that the VM session updates from HELO, pushes and polls.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session.words`` (sans-IO).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.heap import HeapAssembler, HeapImage, HeapProblem, ProblemCode, SegmentKind
from ddmd.session.words import missing_sentence, no_logcat_sentence


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """One VM thread as ddmd last saw it (THCR/THNM/THDE pushes and THST polls)."""

    thread_id: int
    name: str
    status: int | None = None  # raw THST status value
    state: str | None = None  # DDMS label for status, e.g. "running", "wait"
    tid: int | None = None
    utime: int | None = None
    stime: int | None = None
    daemon: bool | None = None
    suspended: bool | None = None  # draft layout only

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.thread_id,
            "name": self.name,
            "status": self.status,
            "state": self.state,
            "tid": self.tid,
            "utime": self.utime,
            "stime": self.stime,
            "daemon": self.daemon,
            "suspended": self.suspended,
        }


@dataclass(frozen=True, slots=True)
class HeapInfoSnapshot:
    """One heap from the latest HPIF push."""

    heap_id: int
    timestamp_ms: int
    reason: int
    max_size: int
    size: int
    bytes_allocated: int
    objects_allocated: int

    def to_json(self) -> dict[str, Any]:
        return {
            "heap_id": self.heap_id,
            "timestamp_ms": self.timestamp_ms,
            "reason": self.reason,
            "max_size": self.max_size,
            "size": self.size,
            "bytes_allocated": self.bytes_allocated,
            "objects_allocated": self.objects_allocated,
        }


@dataclass(frozen=True, slots=True)
class DebuggerSnapshot:
    """One debugger attached to a VM: who, through which port, since when, how busy."""

    peer: str
    via: str  # "vm-port", "current", "front" (jdwp:PID at the adb front), "front-forward"
    port: int | None
    since: float | None  # wall-clock seconds since the epoch
    packets_in: int = 0  # commands it sent
    packets_out: int = 0  # replies and events it received
    suspensions: int = 0  # suspensions of the VM or its threads it holds now
    tool: str | None = None  # the program on the other end, when known ("Android Studio")
    debugging: bool = True  # False: a client of the adb front that speaks DDM only
    pid: int | None = None  # the client's process, when ddmd could find it
    # Wall-clock time since which it has held some suspension without a break (None: it holds
    # none); stamped by the driver, which has the clock.
    suspended_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "via": self.via,
            "tool": self.tool,
            "pid": self.pid,
            "debugging": self.debugging,
            "port": self.port,
            "since": self.since,
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "suspensions": self.suspensions,
            "suspended_since": self.suspended_since,
        }


_JVM_LINE = re.compile(r"JVM version (?P<version>\S+)(?: \((?P<vm>.*)\))?")
_NOISE = re.compile(r"\(TM\)|\(R\)|\b(?:Java|\d\d-Bit|Server|Client|VM)\b")
_DALVIK = re.compile(r"^Dalvik v(?P<major>\d+)\.")
_JDWP_LINE = re.compile(r"^Java Debug Wire Protocol\b.* version (?P<version>\S+)$")


def vm_label(vm_ident: str | None, description: str | None) -> str | None:
    """The one short name of a VM's kind, wherever it is shown: ``OpenJDK 17.0.15`` for a
    plain JVM (not the three lines of its JDWP banner), ``ART`` or ``Dalvik`` for an Android
    VM ("Dalvik v2.x" is how ART names itself), a DDM client's own name otherwise."""
    if vm_ident:
        match = _DALVIK.match(vm_ident)
        if match:
            return "ART" if int(match["major"]) >= 2 else "Dalvik"
        return vm_ident
    lines = [line.strip() for line in (description or "").splitlines() if line.strip()]
    if not lines:
        return None
    for line in lines:
        match = _JVM_LINE.search(line)
        if match:
            name = (match["vm"] or "").split(",")[0]
            vendor = " ".join(_NOISE.sub(" ", name).split())
            return f"{vendor or 'JVM'} {match['version']}"
    banner = _JDWP_LINE.search(lines[0])
    if banner:  # only JDWP's own line: the JDK's version, not a product name
        return f"JVM (JDWP {banner['version']})"
    first = lines[0]
    return first if len(first) <= 40 else first[:37] + "..."


@dataclass(frozen=True, slots=True)
class ForesightSnapshot:
    """Foresight on one VM (``session/foresight.py``): whether it is on, the measured round trip
    of ddmd's own requests (seconds, smoothed), debuggers' commands answered here from replies
    kept and from ddmd's own speculative ones, speculative commands sent and wasted."""

    on: bool
    round_trip: float | None
    answered_cache: int
    answered_speculation: int
    speculated: int
    wasted: int

    def to_json(self) -> dict[str, Any]:
        return {
            "on": self.on,
            "round_trip": self.round_trip,
            "answered_cache": self.answered_cache,
            "answered_speculation": self.answered_speculation,
            "speculated": self.speculated,
            "wasted": self.wasted,
        }


@dataclass(frozen=True, slots=True)
class VmSnapshot:
    """Everything the control API shows about one VM. Built by its actor; immutable."""

    id: str
    source: str  # "tcp" or "adb"
    address: str  # "127.0.0.1:8000" or "SERIAL jdwp:PID"
    state: str  # "connecting", "identifying", "ready", "reconnecting"
    ddm: bool | None  # None until HELO is answered or refused
    pid: int | None = None
    app: str | None = None
    package: str | None = None
    user_id: int | None = None
    vm_ident: str | None = None
    abi: str | None = None
    jvm_flags: str | None = None
    native_debuggable: bool | None = None
    description: str | None = None  # VirtualMachine.Version description (non-DDM VMs)
    features: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()  # DDM requests that timed out or failed on this VM
    waiting_for_debugger: bool = False
    threads: tuple[ThreadSnapshot, ...] | None = None  # None: unknown / not supported
    heaps: tuple[HeapInfoSnapshot, ...] = ()
    device: str | None = None
    debugger_port: int | None = None
    debugger: str | None = None
    current: bool = False
    connected_at: float | None = None  # wall-clock seconds since the epoch
    # Why each feature in ``unsupported`` is missing, in a user's words (feature, reason).
    unsupported_reasons: tuple[tuple[str, str], ...] = ()
    debuggers: tuple[DebuggerSnapshot, ...] = ()  # every attached debugger
    foresight: ForesightSnapshot | None = None

    @property
    def display_name(self) -> str:
        """What to call this VM in a sentence: its app (process) or package name; for a plain
        JVM its main class (jps-style) once known, else "JVM pid N" or its address; never the
        JDWP Version banner (that stays in ``description``)."""
        for name in (self.app, self.package):  # the process name, as DDMS showed it
            if name and name not in ("<pre-initialized>",):
                return name
        if self.ddm is False and self.pid is not None:  # on this computer or behind adb
            return f"JVM pid {self.pid}"
        if self.ddm is False and self.source == "tcp":
            return f"JVM at {self.address}"
        return self.id

    def missing(self) -> dict[str, str]:
        """Feature -> the sentence a user reads about it (for ``unsupported``)."""
        reasons = dict(self.unsupported_reasons)
        return {
            f: missing_sentence(self.display_name, f, reasons.get(f, ""), ddm=self.ddm)
            for f in self.unsupported
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "source": self.source,
            "address": self.address,
            "state": self.state,
            "device": self.device,
            "pid": self.pid,
            "app": self.app,
            "package": self.package,
            "user_id": self.user_id,
            "vm_ident": self.vm_ident,
            "abi": self.abi,
            "jvm_flags": self.jvm_flags,
            "native_debuggable": self.native_debuggable,
            "description": self.description,
            "ddm": self.ddm,
            "features": list(self.features),
            "unsupported": list(self.unsupported),
            "waiting_for_debugger": self.waiting_for_debugger,
            "threads": None if self.threads is None else len(self.threads),
            "heaps": [h.to_json() for h in self.heaps],
            "debugger_port": self.debugger_port,
            "debugger": self.debugger,
            "debuggers": [d.to_json() for d in self.debuggers],
            "current": self.current,
            "connected_at": self.connected_at,
            "foresight": None if self.foresight is None else self.foresight.to_json(),
            "name": self.display_name,
            "vm_label": vm_label(self.vm_ident, self.description),
            "missing": self.missing(),
            # Why this VM has no logcat (a sentence), or None: it is on a device.
            "logcat": None if self.device else no_logcat_sentence(self.display_name),
        }


@dataclass(frozen=True, slots=True)
class GcOutcome:
    """How a requested garbage collection ended. ``by``: "heap info" (the GC's heap-info push
    arrived) or "reply" (the VM answered after running it); None when the VM gave no sign."""

    confirmed: bool
    by: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "gc": "done" if self.confirmed else "requested",
            "confirmed": self.confirmed,
            "confirmed_by": self.by,
            "note": self.note,
        }


# DDMS labels for THST status values (protocol.md 3.3), shipped and draft layouts.
STATE_LABELS = {
    0: "zombie",
    1: "running",
    2: "timed-wait",
    3: "monitor",
    4: "wait",
    5: "init",
    6: "start",
    7: "native",
    8: "vmwait",
    9: "suspended",
}
DRAFT_LABELS = {
    1: "running",
    2: "sleeping",
    3: "monitor",
    4: "waiting",
    5: "init",
    6: "start",
    7: "native",
    8: "vmwait",
}
UNNAMED = ("", "<pre-initialized>")


@dataclass(frozen=True, slots=True)
class Note:
    """One log line the model wants written (the session turns it into a ``Log`` command)."""

    event: str
    level: str = "info"
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(slots=True)
class Applied:
    """What applying one chunk changed."""

    changed: bool = False  # the snapshot changed
    renamed: bool = False  # the selection key may have changed
    heap_info: bool = False  # a heap-info push arrived
    heap_end: bool = False  # a (Java) heap dump ended
    waiting: bool = False  # the VM started waiting for a debugger
    notes: list[Note] = field(default_factory=list)


class VmModel:
    """Identity, threads and heaps of one VM, updated from chunks (no I/O, no clock)."""

    def __init__(self, *, expected_pid: int | None = None, max_inflated: int = 64 << 20) -> None:
        self.expected_pid = expected_pid
        self.max_inflated = max_inflated
        self.ddm: bool | None = None
        self.pid: int | None = expected_pid
        self.app: str | None = None
        self.package: str | None = None
        self.user_id: int | None = None
        self.vm_ident: str | None = None
        self.abi: str | None = None
        self.jvm_flags: str | None = None
        self.native_debuggable: bool | None = None
        self.description: str | None = None
        self.features: tuple[str, ...] = ()
        self.unsupported: dict[str, str] = {}
        self.waiting = False
        self.threads: dict[int, ThreadSnapshot] = {}
        self.threads_known = False
        # thread id -> (its last THST entry, the snapshot made from it): an entry that repeats
        # keeps its snapshot, with no decoding (``apply_thread_rows``).
        self._rows: dict[int, tuple[bytes, ThreadSnapshot]] = {}
        self.heaps: tuple[HeapInfoSnapshot, ...] = ()
        self.assembler = HeapAssembler()
        self.heap_images: tuple[HeapImage, ...] = ()
        self.heap_info_seq = 0
        self.heap_end_seq = 0
        self._unknown_logged: set[int] = set()

    # ------------------------------------------------------------------ identity

    def apply_hello(self, hello: ddm.HeloReply) -> Applied:
        out = Applied(changed=True)
        if self.expected_pid is not None and hello.pid != self.expected_pid:
            out.notes.append(
                Note(
                    "vm.pid_mismatch",
                    "warning",
                    (("expected", self.expected_pid), ("reported", hello.pid)),
                )
            )
        self.ddm = True
        self.pid = hello.pid
        self.vm_ident = hello.vm_ident
        self.abi = hello.abi
        self.jvm_flags = hello.jvm_flags
        self.native_debuggable = hello.native_debuggable
        out.renamed = self._names(hello.app_name, hello.package_name, hello.user_id)
        out.notes.append(
            Note(
                "vm.hello",
                fields=(
                    ("pid", self.pid),
                    ("app", self.app),
                    ("package", self.package),
                    ("vm_ident", self.vm_ident),
                ),
            )
        )
        return out

    def _names(self, app: str | None, package: str | None, user_id: int | None) -> bool:
        old = (self.app, self.package)
        if app is not None and (app not in UNNAMED or self.app is None):
            self.app = app
        if package is not None and (package not in UNNAMED or self.package is None):
            self.package = package
        if user_id is not None:
            self.user_id = user_id
        return (self.app, self.package) != old

    def mark_unsupported(self, feature: str, why: str) -> bool:
        """Record that this VM lacks ``feature``; False if it was known already."""
        if feature in self.unsupported:
            return False
        self.unsupported[feature] = why
        return True

    # ------------------------------------------------------------------ pushes and replies

    def apply(self, chunk: ddm.Chunk) -> Applied:
        """Apply one chunk the VM pushed (or carried in a reply)."""
        out = Applied()
        if isinstance(chunk, ddm.Zlib):
            try:
                inner = ddm.inflate_chunk(
                    chunk, ddm.Direction.FROM_VM, max_length=self.max_inflated
                )
            except ProtocolError as exc:
                out.notes.append(
                    Note("ddm.chunk_malformed", "warning", (("type", "ZLIB"), ("error", str(exc))))
                )
                return out
            return self.apply(inner)
        if isinstance(chunk, ddm.AppName):
            out.renamed = out.changed = self._names(
                chunk.app_name, chunk.package_name, chunk.user_id
            )
            if out.renamed:
                out.notes.append(
                    Note("vm.renamed", fields=(("app", self.app), ("package", self.package)))
                )
        elif isinstance(chunk, ddm.WaitForDebugger):
            out.waiting = not self.waiting
            if out.waiting:
                out.notes.append(
                    Note("vm.waiting_for_debugger", fields=(("reason", chunk.reason),))
                )
            self.waiting = out.changed = True
        elif isinstance(chunk, ddm.ThreadCreated | ddm.ThreadRenamed):
            old = self.threads.get(chunk.thread_id)
            self.threads[chunk.thread_id] = (
                ThreadSnapshot(chunk.thread_id, chunk.name)
                if old is None
                else replace(old, name=chunk.name)
            )
            self.threads_known = out.changed = True
        elif isinstance(chunk, ddm.ThreadDied):
            out.changed = self.threads.pop(chunk.thread_id, None) is not None
        elif isinstance(chunk, ddm.ThreadStatus | ddm.ThreadStatusDraft):
            self.apply_thread_status(chunk)
            out.changed = True
        elif isinstance(chunk, ddm.HeapInfo):
            self.heap_info_seq += 1
            out.heap_info = out.changed = True
            self.heaps = tuple(
                HeapInfoSnapshot(
                    h.heap_id,
                    h.timestamp_ms,
                    h.reason,
                    h.max_size,
                    h.size,
                    h.bytes_allocated,
                    h.objects_allocated,
                )
                for h in chunk.heaps
            )
        elif isinstance(chunk, ddm.HeapStart | ddm.NativeHeapStart):
            native = isinstance(chunk, ddm.NativeHeapStart)
            # start() returns the previous image of this heap if it was never ended: only the
            # RESTARTED problem it adds is new (the others were reported when found).
            previous = self.assembler.start(chunk.heap_id, native=native)
            if previous is not None:
                self._problems(
                    out, (p for p in previous.problems if p.code is ProblemCode.RESTARTED)
                )
        elif isinstance(chunk, ddm.HeapSegment | ddm.HeapSegmentObjects | ddm.NativeHeapSegment):
            kind = _SEGMENT_KINDS[type(chunk)]
            self._problems(
                out,
                self.assembler.segment(
                    kind,
                    chunk.heap_id,
                    chunk.unit_size,
                    chunk.start,
                    chunk.offset,
                    chunk.units,
                    chunk.usage,
                ),
            )
        elif isinstance(chunk, ddm.HeapEnd | ddm.NativeHeapEnd):
            native = isinstance(chunk, ddm.NativeHeapEnd)
            image = self.assembler.end(chunk.heap_id, native=native)
            self._problems(
                out, (p for p in image.problems if p.code is ProblemCode.END_WITHOUT_START)
            )
            if not native:
                others = tuple(i for i in self.heap_images if i.heap_id != image.heap_id)
                self.heap_images = (*others, image)
                self.heap_end_seq += 1
                out.heap_end = out.changed = True
        elif isinstance(chunk, ddm.UnknownChunk):
            if chunk.chunk_type not in self._unknown_logged:
                self._unknown_logged.add(chunk.chunk_type)
                out.notes.append(
                    Note(
                        "ddm.chunk_unknown",
                        fields=(
                            ("type", ddm.type_name(chunk.chunk_type)),
                            ("length", len(chunk.data)),
                        ),
                    )
                )
        else:
            out.notes.append(Note("ddm.push_ignored", "debug", (("type", type(chunk).__name__),)))
        return out

    @staticmethod
    def _problems(out: Applied, problems: Iterable[HeapProblem]) -> None:
        for problem in problems:
            out.notes.append(
                Note(
                    "heap.dump_problem",
                    "warning",
                    (
                        ("code", problem.code.value),
                        ("heap", problem.heap_id),
                        ("native", problem.native),
                        ("problem", problem.message),
                    ),
                )
            )

    def apply_thread_rows(self, rows: list[tuple[int, bytes]]) -> bool:
        """A thread-state poll read quickly (``ddm.thread_status_rows``): the same result as
        ``apply_thread_status`` of the decoded chunk, but an entry whose bytes repeat keeps the
        snapshot made from them last time (unless a notice has replaced it since). Returns
        whether anything changed."""
        threads = self.threads
        last = self._rows
        seen: dict[int, ThreadSnapshot] = {}
        rows_now: dict[int, tuple[bytes, ThreadSnapshot]] = {}
        changed = not self.threads_known or len(rows) != len(threads)
        for thread_id, entry in rows:
            old = threads.get(thread_id)
            before = last.get(thread_id)
            if before is not None and before[0] == entry and before[1] is old:
                snapshot = before[1]
            else:
                t = ddm.thread_info(entry)
                snapshot = ThreadSnapshot(
                    t.thread_id,
                    old.name if old else "",
                    status=t.status,
                    state=STATE_LABELS.get(t.status, str(t.status)),
                    tid=t.tid,
                    utime=t.utime,
                    stime=t.stime,
                    daemon=t.daemon,
                )
                changed = changed or snapshot != old
            seen[thread_id] = snapshot
            rows_now[thread_id] = (entry, snapshot)
        if not changed and seen.keys() != threads.keys():
            changed = True
        self.threads = seen
        self._rows = rows_now
        self.threads_known = True
        return changed

    def apply_thread_status(self, chunk: ddm.ThreadStatus | ddm.ThreadStatusDraft) -> None:
        self._rows = {}
        seen: dict[int, ThreadSnapshot] = {}
        if isinstance(chunk, ddm.ThreadStatus):
            for t in chunk.threads:
                old = self.threads.get(t.thread_id)
                seen[t.thread_id] = ThreadSnapshot(
                    t.thread_id,
                    old.name if old else "",
                    status=t.status,
                    state=STATE_LABELS.get(t.status, str(t.status)),
                    tid=t.tid,
                    utime=t.utime,
                    stime=t.stime,
                    daemon=t.daemon,
                )
        else:
            for d in chunk.threads:
                old = self.threads.get(d.thread_id)
                seen[d.thread_id] = ThreadSnapshot(
                    d.thread_id,
                    old.name if old else "",
                    status=d.state,
                    state=DRAFT_LABELS.get(d.state, str(d.state)),
                    suspended=d.suspended,
                )
        self.threads = seen
        self.threads_known = True

    def forget_threads(self) -> None:
        """A new connection: thread notices start again from the VM's THCR burst."""
        self._rows = {}
        self.threads = {}
        self.threads_known = False

    def thread_tuple(self) -> tuple[ThreadSnapshot, ...] | None:
        if not self.threads_known:
            return None
        return tuple(self.threads[k] for k in sorted(self.threads))


_SEGMENT_KINDS: dict[type, SegmentKind] = {
    ddm.HeapSegment: SegmentKind.HPSG,
    ddm.HeapSegmentObjects: SegmentKind.HPSO,
    ddm.NativeHeapSegment: SegmentKind.NHSG,
}
