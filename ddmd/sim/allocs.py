"""The simulated VM's allocation tracker (DDMS's "Allocation Tracker"): which objects the app
allocated while tracking was on, and the REAL chunk listing them.

Layer: imports `ddmd.protocol.ddm` (the REAL layout) and `sim.threads` (who allocated); no
I/O and no clock. The VM calls `AllocationTracker.record_pass` when its app "does some work"
(tracking switched on, and every GC after that), so the list is deterministic: the same
calls give the same allocations, whatever the timing.

What a pass records: one allocation per entry of a fixed catalogue of allocation sites of
the app (its messages, strings, buffers, lists, a binder parcel, an allocation with no Java
frames), the sizes varying from pass to pass in a fixed pattern. As on the VMs themselves:

- class names are JVM descriptors (``Lcom/example/app/Message;``, ``[B``), for the
  allocated class and for each frame's class; frames are innermost first, line -1 when
  unknown and -2 for a native method;
- the thread id is the VM thread id on Dalvik (``Dalvik v1.x``) and the low 16 bits of the
  Linux tid on ART;
- switching tracking off drops what was recorded (Dalvik and ART both free their records),
  and switching it on while on changes nothing;
- the list keeps the newest ``MAX_ENTRIES`` (65535, what one REAL chunk can carry).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ddmd.protocol.ddm import (
    AllocationEntry,
    AllocationFrame,
    Allocations,
    ResolvedAllocation,
    ResolvedFrame,
    encode_chunk,
)
from ddmd.sim.threads import SimThread

__all__ = ["MAX_ENTRIES", "AllocationTracker"]

MAX_ENTRIES: Final = 0xFFFF


@dataclass(frozen=True, slots=True)
class _Site:
    """One place where the app allocates: the class, its size, who runs it, the stack."""

    class_name: str  # descriptor; "{app}" stands for the app's package path
    size: int
    step: int  # bytes added per pass (in a cycle of four), so sizes differ between passes
    role: str  # the thread role (`sim.threads`) that allocates here; main if none is alive
    frames: tuple[tuple[str, str, str, int], ...]  # (class, method, file, line), innermost first


_MAIN_FRAMES: Final = (
    ("L{app}/MainActivity;", "onCreate", "MainActivity.java", 57),
    ("Landroid/app/Activity;", "performCreate", "Activity.java", 8305),
    ("Landroid/app/ActivityThread;", "performLaunchActivity", "ActivityThread.java", 3611),
)
_LOAD_FRAMES: Final = (("L{app}/Inbox;", "load", "Inbox.java", 41), *_MAIN_FRAMES)

_SITES: Final = (
    _Site(
        "L{app}/Message;",
        32,
        0,
        "main",
        (
            ("L{app}/Message;", "<init>", "Message.java", 24),
            ("L{app}/Inbox;", "parse", "Inbox.java", 88),
            *_LOAD_FRAMES,
        ),
    ),
    _Site(
        "Ljava/lang/String;",
        40,
        8,
        "main",
        (
            ("Ljava/lang/StringFactory;", "newStringFromBytes", "StringFactory.java", -2),
            ("L{app}/Inbox;", "parse", "Inbox.java", 86),
            *_LOAD_FRAMES,
        ),
    ),
    _Site(
        "[B",
        8208,
        1024,
        "binder",
        (
            ("L{app}/Store;", "fetch", "Store.java", 112),
            ("L{app}/SyncService;", "onTransact", "SyncService.java", 30),
            ("Landroid/os/Binder;", "execTransact", "Binder.java", 1280),
        ),
    ),
    _Site(
        "Ljava/util/ArrayList;",
        24,
        0,
        "main",
        (
            ("L{app}/Folder;", "<init>", "Folder.java", 15),
            ("L{app}/Inbox;", "load", "Inbox.java", 38),
            *_MAIN_FRAMES,
        ),
    ),
    _Site(
        "[Ljava/lang/Object;",
        56,
        16,
        "main",
        (
            ("Ljava/util/ArrayList;", "grow", "ArrayList.java", 237),
            ("Ljava/util/ArrayList;", "add", "ArrayList.java", 467),
            ("L{app}/Folder;", "add", "Folder.java", 22),
            *_LOAD_FRAMES,
        ),
    ),
    _Site(
        "Landroid/os/Parcel;",
        48,
        0,
        "binder",
        (
            ("Landroid/os/Parcel;", "obtain", "Parcel.java", 427),
            ("Landroid/os/Binder;", "execTransact", "Binder.java", 1280),
        ),
    ),
    _Site(
        "[I",
        416,
        64,
        "main",
        (
            ("L{app}/Stats;", "histogram", "Stats.java", -1),
            ("L{app}/MainActivity;", "onResume", "MainActivity.java", 73),
        ),
    ),
    _Site("Ljava/lang/ref/WeakReference;", 32, 0, "daemon", ()),
)


class AllocationTracker:
    """Allocation tracking of one simulated VM: on/off, the recorded list, the REAL chunk.

    ``package`` names the app's classes; ``dalvik`` picks the thread id REAL carries (VM
    thread id on Dalvik, low 16 bits of the Linux tid on ART).
    """

    def __init__(self, package: str, *, dalvik: bool) -> None:
        self._app = package.replace(".", "/")
        self._dalvik = dalvik
        self._enabled = False
        self._passes = 0
        self._records: deque[ResolvedAllocation] = deque(maxlen=MAX_ENTRIES)  # oldest first
        self._chunk: bytes | None = None  # the REAL chunk of the list as it is now

    @property
    def enabled(self) -> bool:
        return self._enabled

    def enable(self, on: bool, threads: Iterable[SimThread]) -> None:
        """REAE: switch tracking on (recording a first pass: the app is running) or off
        (dropping the list)."""
        if on == self._enabled:
            return
        self._enabled = on
        if on:
            self.record_pass(threads)
        else:
            self._records.clear()
            self._chunk = None

    def record_pass(self, threads: Iterable[SimThread]) -> None:
        """The app does some work: one allocation per site, if tracking is on."""
        if not self._enabled:
            return
        live = sorted(threads, key=lambda t: t.thread_id)
        variant = self._passes % 4
        self._passes += 1
        for site in _SITES:
            thread = next((t for t in live if t.role == site.role), None)
            if thread is None:
                thread = next((t for t in live if t.role == "main"), live[0] if live else None)
            self._records.append(
                ResolvedAllocation(
                    size=site.size + site.step * variant,
                    thread_id=self._thread_id(thread),
                    class_name=self._name(site.class_name),
                    frames=tuple(
                        ResolvedFrame(self._name(c), m, f, line) for c, m, f, line in site.frames
                    ),
                )
            )
        self._chunk = None

    def recorded(self) -> tuple[ResolvedAllocation, ...]:
        """What REAL reports now, newest first (class names as descriptors)."""
        return tuple(reversed(self._records))

    def chunk(self) -> bytes:
        """The REAL chunk for the list as it is now (empty when tracking is off)."""
        if self._chunk is None:
            self._chunk = encode_chunk(_allocations(self.recorded()))
        return self._chunk

    def _name(self, template: str) -> str:
        return template.replace("{app}", self._app)

    def _thread_id(self, thread: SimThread | None) -> int:
        if thread is None:
            return 0
        return thread.thread_id & 0xFFFF if self._dalvik else thread.tid & 0xFFFF


def _allocations(records: tuple[ResolvedAllocation, ...]) -> Allocations:
    """``records`` (newest first) with their strings gathered into the three sorted tables,
    as ART sends them."""
    class_names = sorted(
        {r.class_name for r in records} | {f.class_name for r in records for f in r.frames}
    )
    method_names = sorted({f.method_name for r in records for f in r.frames})
    file_names = sorted({f.file_name for r in records for f in r.frames})
    classes = {name: i for i, name in enumerate(class_names)}
    methods = {name: i for i, name in enumerate(method_names)}
    files = {name: i for i, name in enumerate(file_names)}
    entries = tuple(
        AllocationEntry(
            r.size,
            r.thread_id,
            classes[r.class_name],
            tuple(
                AllocationFrame(
                    classes[f.class_name], methods[f.method_name], files[f.file_name], f.line
                )
                for f in r.frames
            ),
        )
        for r in records
    )
    return Allocations(entries, tuple(class_names), tuple(method_names), tuple(file_names))
