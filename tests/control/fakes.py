"""FakeVm: a scripted `VmHandle` for control API and CLI tests (and later tests that need VMs).

Everything is plain data set by the test: the snapshot, the threads, which features raise
`FeatureUnsupported`, the stack traces, the heap images (decoded by the real
`ddmd.protocol.heap` from a small hand-made HPSG chunk), and counters of what was asked.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from ddmd.errors import DdmFailed, FeatureUnsupported
from ddmd.portbook import vm_key
from ddmd.protocol.ddm import StackFrame, StackTrace
from ddmd.protocol.heap import HeapAssembler, HeapImage, SegmentKind, parse_segment_data
from ddmd.registry import GcOutcome, HeapInfoSnapshot, ThreadSnapshot, VmRegistry, VmSnapshot

# One HPSG chunk: heap 1, 8-byte units at 0x10000000, 278 units in six (state, n) pairs:
#   0x01 n=3    4 units  object, hard          32 B used
#   0x00 n=1    2 units  free                  16 B free
#   0x09 n=0    1 unit   class object, hard     8 B used
#   0x00 n=4    5 units  free                  40 B free
#   0x91 n=255  256 units array_1, hard, P ...
#   0x11 n=9    ... + 10 units = one run of 266 units, 2128 B used
HPSG_UNITS = 278
HPSG_DATA = struct.pack(">IBIII", 1, 8, 0x1000_0000, 0, HPSG_UNITS) + bytes(
    [0x01, 3, 0x00, 1, 0x09, 0, 0x00, 4, 0x91, 255, 0x11, 9]
)
#: The figures `HeapImage.summary()` gives for HPSG_DATA.
HPSG_USED = 32 + 8 + 2128
HPSG_FREE = 16 + 40
HPSG_LARGEST_FREE = 40
HPSG_BY_KIND = {"object": 32, "class_object": 8, "array_1": 2128}
HPSG_RUNS = [
    [0x1000_0000, 4, 0, 1],
    [0x1000_0020, 2, 0, 0],
    [0x1000_0030, 1, 1, 1],
    [0x1000_0038, 5, 0, 0],
    [0x1000_0060, 266, 2, 1],
]

#: VirtualMachine.Version of a real JDK 17, as a plain JVM reports it (three lines).
JDWP_DESCRIPTION = (
    "Java Debug Wire Protocol (Reference Implementation) version 17.0\n"
    "JVM Debug Interface version 17.0\n"
    "JVM version 17.0.9 (OpenJDK 64-Bit Server VM, mixed mode, sharing)"
)

FEATURES = ("threads", "gc", "stack", "heap_segments")


def heap_image(data: bytes = HPSG_DATA) -> HeapImage:
    """A complete image (HPST, one HPSG, HPEN) assembled by the real decoder."""
    seg = parse_segment_data(data)
    assembler = HeapAssembler()
    assembler.start(seg.heap_id)
    problems = assembler.segment(
        SegmentKind.HPSG, seg.heap_id, seg.unit_size, seg.start, seg.offset, seg.units, seg.usage
    )
    assert not problems, problems
    return assembler.end(seg.heap_id)


def sample_threads() -> tuple[ThreadSnapshot, ...]:
    return (
        ThreadSnapshot(
            1, "main", status=1, state="running", tid=1234, utime=52, stime=7, daemon=False
        ),
        ThreadSnapshot(
            2, "HeapTaskDaemon", status=5, state="wait", tid=1240, utime=3, stime=1, daemon=True
        ),
        ThreadSnapshot(
            9, "Binder:1234_1", status=4, state="native", tid=1245, utime=0, stime=0, daemon=False
        ),
    )


def sample_stack(thread_id: int = 1) -> StackTrace:
    return StackTrace(
        thread_id,
        (
            StackFrame("java.lang.Object", "wait", "", -2),
            StackFrame("com.example.app.Worker", "run", "Worker.java", 42),
            StackFrame("com.example.app.Gen", "lambda$0", "", -1),
            StackFrame("java.lang.Thread", "run", "Thread.java", -1),
        ),
    )


def sample_heap_info() -> tuple[HeapInfoSnapshot, ...]:
    return (
        HeapInfoSnapshot(
            heap_id=1,
            timestamp_ms=1_700_000_000_000,
            reason=0,
            max_size=64 * 1024 * 1024,
            size=10 * 1024 * 1024,
            bytes_allocated=5 * 1024 * 1024 + 512 * 1024,
            objects_allocated=12345,
        ),
    )


def make_snapshot(vm_id: str = "tcp:8000", **fields: Any) -> VmSnapshot:
    """A ready VM snapshot: "tcp:PORT" (127.0.0.1) or adb's "SERIAL/PID"."""
    serial, slash, pid = vm_id.partition("/")
    defaults: dict[str, Any] = {
        "id": vm_id,
        "source": "adb" if slash else "tcp",
        "address": f"{serial} jdwp:{pid}" if slash else "127.0.0.1:" + vm_id.partition(":")[2],
        "state": "ready",
        "ddm": True,
    }
    if slash:
        defaults["device"] = serial
        defaults["pid"] = int(pid)
    defaults.update(fields)
    return VmSnapshot(**defaults)


@dataclass
class FakeVm:
    """A `VmHandle` whose answers are set by the test.

    `unsupported` names features (see FEATURES) that raise FeatureUnsupported; `failures` maps
    a method name ("refresh_threads", "cause_gc", "stack_trace", "heap_segments") to an
    exception it raises instead. `dump` is what `heap_segments()` returns (and then keeps as
    the last images).
    """

    snap: VmSnapshot
    unsupported: frozenset[str] = frozenset()
    stacks: dict[int, StackTrace] = field(default_factory=dict)
    images: tuple[HeapImage, ...] = ()
    dump: tuple[HeapImage, ...] = field(default_factory=lambda: (heap_image(),))
    failures: dict[str, BaseException] = field(default_factory=dict)
    gc_count: int = 0
    refresh_count: int = 0
    segment_requests: int = 0
    # The selection key (VmHandle.selection_key); None: "DEVICE|NAME" from the snapshot.
    key: str | None = None
    ext_values: dict[str, Any] = field(default_factory=dict)  # what chunk handlers published

    @classmethod
    def plain_jvm(cls, vm_id: str = "tcp:8000", **fields: Any) -> FakeVm:
        """A JVM without DDM: no threads, GC, stacks or heap segments."""
        defaults: dict[str, Any] = {
            "ddm": False,
            "pid": 4242,
            "vm_ident": None,
            "description": JDWP_DESCRIPTION,
        }
        defaults.update(fields)
        return cls(make_snapshot(vm_id, **defaults), unsupported=frozenset(FEATURES))

    @classmethod
    def android(cls, vm_id: str = "emulator-5554/1234", **fields: Any) -> FakeVm:
        """A DDM VM with threads, stacks for thread 1 and heap info."""
        defaults: dict[str, Any] = {
            "app": "com.example.app",
            "package": "com.example.app",
            "vm_ident": "Dalvik v1.6.0",
            "features": ("hprof-heap-dump", "method-trace-profiling"),
            "threads": sample_threads(),
            "heaps": sample_heap_info(),
            "debugger_port": 8600,
        }
        defaults.update(fields)
        return cls(make_snapshot(vm_id, **defaults), stacks={1: sample_stack(1)})

    @property
    def vm_id(self) -> str:
        return self.snap.id

    def snapshot(self) -> VmSnapshot:
        return self.snap

    def update(self, **fields: Any) -> None:
        self.snap = replace(self.snap, **fields)

    def selection_key(self) -> str | None:
        if self.key is not None:
            return self.key
        # As VmActor.selection_key: the package, else the app; "<pre-initialized>" is no name.
        for name in (self.snap.package, self.snap.app):
            if name and name != "<pre-initialized>":
                return vm_key(self.snap.device, name)
        return None

    async def _enter(self, method: str, feature: str) -> None:
        await trio.lowlevel.checkpoint()
        failure = self.failures.get(method)
        if failure is not None:
            raise failure
        if feature in self.unsupported:
            raise FeatureUnsupported(f"{self.vm_id} does not support {feature}")

    async def refresh_threads(self) -> VmSnapshot:
        await self._enter("refresh_threads", "threads")
        self.refresh_count += 1
        return self.snap

    async def cause_gc(self) -> GcOutcome:
        await self._enter("cause_gc", "gc")
        self.gc_count += 1
        return GcOutcome(confirmed=True, by="heap info")

    async def stack_trace(self, thread_id: int) -> StackTrace:
        await self._enter("stack_trace", "stack")
        try:
            return self.stacks[thread_id]
        except KeyError:
            raise DdmFailed(f"STKL failed on {self.vm_id}: no thread {thread_id}") from None

    async def heap_segments(self) -> tuple[HeapImage, ...]:
        await self._enter("heap_segments", "heap_segments")
        self.segment_requests += 1
        self.images = self.dump
        return self.images

    def last_heap_images(self) -> tuple[HeapImage, ...]:
        return self.images


def make_registry(*vms: FakeVm) -> VmRegistry:
    registry = VmRegistry()
    for vm in vms:
        registry.add(vm)
    return registry


def standard_vms() -> dict[str, FakeVm]:
    """Four VMs that exercise target resolution.

    * "jvm": tcp:8000 (127.0.0.1:8000), pid 4242, no DDM
    * "app": emulator-5554/1234, com.example.app, current
    * "remote": emulator-5554/2000, app com.example.app:remote, package com.example.app
      (so the package name alone is ambiguous)
    * "phone": R58M/1234 on another device, app org.other (so pid 1234 alone is ambiguous)
    """
    return {
        "jvm": FakeVm.plain_jvm(),
        "app": FakeVm.android(current=True),
        "remote": FakeVm.android(
            "emulator-5554/2000", app="com.example.app:remote", debugger_port=8601
        ),
        "phone": FakeVm.android(
            "R58M/1234",
            app="org.other",
            package="org.other",
            debugger_port=8602,
            waiting_for_debugger=True,
            debugger="127.0.0.1:51234",
        ),
    }
