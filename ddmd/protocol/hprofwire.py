"""HPROF wire values, class-name forms and the class-histogram result types.

Layer: ``protocol`` (standard library only). The streaming reader is `ddmd.protocol.hprof`,
which re-exports everything here; the simulated VM's writer (`ddmd.sim.hprof`) uses the
same values.

The format (every integer big-endian; "id" is the identifier size from the header)::

    header   "JAVA PROFILE 1.0.2\\0" (HotSpot) or "JAVA PROFILE 1.0.3\\0" (Android),
             u4 identifier size (4 or 8), u8 milliseconds since the epoch (ART writes
             it as two u4 halves, high first: the same bytes)
    record   u1 tag, u4 time offset, u4 body length, body
      0x01 STRING             id, UTF-8 bytes (the rest of the body)
      0x02 LOAD CLASS         u4 class serial, id class object, u4 stack serial, id name string
      0x0C HEAP DUMP, 0x1C HEAP DUMP SEGMENT: a run of heap sub-records (below)
      0x2C HEAP DUMP END      empty; every other tag is skipped by its length
    heap sub-record: u1 type, then
      0xFF ROOT UNKNOWN id | 0x01 JNI GLOBAL id, id | 0x02 JNI LOCAL id, u4, u4
      0x03 JAVA FRAME id, u4, u4 | 0x04 NATIVE STACK id, u4 | 0x05 STICKY CLASS id
      0x06 THREAD BLOCK id, u4 | 0x07 MONITOR USED id | 0x08 THREAD OBJECT id, u4, u4
      0x20 CLASS DUMP  id class, u4 stack, id super, id loader, id signers, id protection
                       domain, id, id (reserved), u4 instance size, u2 n + n * (u2 index,
                       u1 type, value), u2 n + n * (id name, u1 type, value),
                       u2 n + n * (id name, u1 type)
      0x21 INSTANCE DUMP  id, u4 stack, id class, u4 n, n bytes of field values
      0x22 OBJECT ARRAY   id, u4 stack, u4 n, id array class, n ids
      0x23 PRIMITIVE ARRAY id, u4 stack, u4 n, u1 element type, n elements
      Android (1.0.3): 0xFE HEAP DUMP INFO u4 heap type ('A' app, 'I' image, 'Z' zygote,
      0 default), id heap name string; the objects after it belong to that heap;
      0x89 INTERNED STRING,
      0x8A FINALIZING, 0x8B DEBUGGER, 0x8C REFERENCE CLEANUP, 0x8D VM INTERNAL and
      0x90 UNREACHABLE roots: id; 0x8E JNI MONITOR: id, u4, u4;
      0xC3 PRIMITIVE ARRAY NODATA: the 0x23 header without the elements.
    basic types and sizes: 2 object (id), 4 boolean 1, 5 char 2, 6 float 4, 7 double 8,
    8 byte 1, 9 short 2, 10 int 4, 11 long 8 (1, an old "array object" code, is read as
    an id too).

Checked against OpenJDK's heap dumper (``src/hotspot/share/services/heapDumper.cpp``), ART's
writer (``runtime/hprof/hprof.cc``), ART's reader ahat (``tools/ahat/.../Parser.java``) and
the Android SDK's ``hprof-conv`` (``dalvik/tools/hprof-conv/HprofConv.c``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from ddmd.protocol.errors import RemoteProtocolError

__all__ = [
    "ANDROID_HEAPS",
    "DEFAULT_HEAP",
    "HEAP_TYPE_NAMES",
    "MAGIC_ANDROID",
    "MAGIC_STANDARD",
    "PRIMITIVE_SIZES",
    "BasicType",
    "ClassEntry",
    "HeapShare",
    "HeapTag",
    "HprofFormatError",
    "HprofSummary",
    "RecordTag",
    "basic_type_size",
    "java_class_name",
    "primitive_array_name",
]


class HprofFormatError(RemoteProtocolError):
    """The bytes are not a heap dump this reader can follow (the message is for the user)."""


# --------------------------------------------------------------------------- wire values


class RecordTag(IntEnum):
    STRING = 0x01
    LOAD_CLASS = 0x02
    UNLOAD_CLASS = 0x03
    STACK_FRAME = 0x04
    STACK_TRACE = 0x05
    ALLOC_SITES = 0x06
    HEAP_SUMMARY = 0x07
    START_THREAD = 0x0A
    END_THREAD = 0x0B
    HEAP_DUMP = 0x0C
    CPU_SAMPLES = 0x0D
    CONTROL_SETTINGS = 0x0E
    HEAP_DUMP_SEGMENT = 0x1C
    HEAP_DUMP_END = 0x2C


class HeapTag(IntEnum):
    """Sub-record types inside HEAP DUMP / HEAP DUMP SEGMENT records."""

    ROOT_UNKNOWN = 0xFF
    ROOT_JNI_GLOBAL = 0x01
    ROOT_JNI_LOCAL = 0x02
    ROOT_JAVA_FRAME = 0x03
    ROOT_NATIVE_STACK = 0x04
    ROOT_STICKY_CLASS = 0x05
    ROOT_THREAD_BLOCK = 0x06
    ROOT_MONITOR_USED = 0x07
    ROOT_THREAD_OBJECT = 0x08
    CLASS_DUMP = 0x20
    INSTANCE_DUMP = 0x21
    OBJECT_ARRAY_DUMP = 0x22
    PRIMITIVE_ARRAY_DUMP = 0x23
    # Android 1.0.3
    HEAP_DUMP_INFO = 0xFE
    ROOT_INTERNED_STRING = 0x89
    ROOT_FINALIZING = 0x8A
    ROOT_DEBUGGER = 0x8B
    ROOT_REFERENCE_CLEANUP = 0x8C
    ROOT_VM_INTERNAL = 0x8D
    ROOT_JNI_MONITOR = 0x8E
    UNREACHABLE = 0x90
    PRIMITIVE_ARRAY_NODATA = 0xC3


class BasicType(IntEnum):
    OBJECT = 2
    BOOLEAN = 4
    CHAR = 5
    FLOAT = 6
    DOUBLE = 7
    BYTE = 8
    SHORT = 9
    INT = 10
    LONG = 11


MAGIC_STANDARD: Final = b"JAVA PROFILE 1.0.2"
MAGIC_ANDROID: Final = b"JAVA PROFILE 1.0.3"

DEFAULT_HEAP: Final = "default"
#: The Android heaps, in the order reports list them.
ANDROID_HEAPS: Final = ("app", "image", "zygote")
HEAP_TYPE_NAMES: Final = {ord("A"): "app", ord("I"): "image", ord("Z"): "zygote", 0: DEFAULT_HEAP}

#: Primitive basic types: code -> (Java name, bytes per value, JVM descriptor letter).
_PRIMITIVES: Final[dict[int, tuple[str, int, str]]] = {
    BasicType.BOOLEAN: ("boolean", 1, "Z"),
    BasicType.CHAR: ("char", 2, "C"),
    BasicType.FLOAT: ("float", 4, "F"),
    BasicType.DOUBLE: ("double", 8, "D"),
    BasicType.BYTE: ("byte", 1, "B"),
    BasicType.SHORT: ("short", 2, "S"),
    BasicType.INT: ("int", 4, "I"),
    BasicType.LONG: ("long", 8, "J"),
}
PRIMITIVE_SIZES: Final = {code: size for code, (_, size, _) in _PRIMITIVES.items()}
_DESCRIPTOR_PRIMITIVES: Final = {letter: name for name, _, letter in _PRIMITIVES.values()}
_OLD_ARRAY_OBJECT: Final = 1  # pre-1.0.2 code for an object field; sized as an id


def basic_type_size(code: int, id_size: int) -> int | None:
    """Bytes of one value of basic type ``code``, or None for a code the format lacks."""
    if code in (BasicType.OBJECT, _OLD_ARRAY_OBJECT):
        return id_size
    return PRIMITIVE_SIZES.get(code)


def primitive_array_name(code: int) -> str:
    """``int[]`` for the basic type INT, and so on."""
    return _PRIMITIVES[code][0] + "[]"


def java_class_name(raw: str) -> str:
    """The Java source form of a class name as a dump (or ``jmap``) writes it.

    ``java/lang/String`` -> ``java.lang.String``; ``[I`` -> ``int[]``;
    ``[[Ljava/lang/Object;`` -> ``java.lang.Object[][]``; names already in source form are
    returned as they are.
    """
    name = raw.replace("/", ".")
    if not name.startswith("["):
        return name
    element = name.lstrip("[")
    dims = len(name) - len(element)
    if element in _DESCRIPTOR_PRIMITIVES:
        base = _DESCRIPTOR_PRIMITIVES[element]
    elif element.startswith("L") and element.endswith(";") and len(element) > 2:
        base = element[1:-1]
    else:
        return name  # not a descriptor: leave it alone
    return base + "[]" * dims


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class HeapShare:
    """One class's objects in one heap."""

    heap: str
    instances: int
    shallow_bytes: int


@dataclass(frozen=True, slots=True)
class ClassEntry:
    """One row of the class histogram: every object of one class name."""

    name: str
    instances: int
    shallow_bytes: int
    heaps: tuple[HeapShare, ...]  # the heaps holding some of them, in HprofSummary.heaps order

    def in_heap(self, heap: str) -> HeapShare:
        for share in self.heaps:
            if share.heap == heap:
                return share
        return HeapShare(heap, 0, 0)


@dataclass(frozen=True, slots=True)
class HprofSummary:
    """The class histogram of one dump.

    ``classes`` is sorted by shallow bytes (largest first), then instances, then name.
    ``heaps`` lists the heaps that hold objects: app, image, zygote first, then default,
    then any other in order of appearance. ``heap_info`` says whether the dump had Android
    heap records (HEAP DUMP INFO) at all.
    """

    version: str
    id_size: int
    timestamp_ms: int
    heap_info: bool
    heaps: tuple[str, ...]
    classes: tuple[ClassEntry, ...]
    instances: int
    shallow_bytes: int

    def top(self, n: int | None) -> tuple[ClassEntry, ...]:
        return self.classes if n is None else self.classes[: max(n, 0)]

    def by_name(self) -> dict[str, ClassEntry]:
        return {entry.name: entry for entry in self.classes}

    def instance_counts(self) -> dict[str, int]:
        return {entry.name: entry.instances for entry in self.classes}

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """Plain JSON data: the header facts, the totals and the first ``top`` rows."""
        rows = self.top(top)
        return {
            "format": self.version,
            "id_size": self.id_size,
            "timestamp_ms": self.timestamp_ms,
            "heap_info": self.heap_info,
            "heaps": list(self.heaps),
            "sorted_by": "shallow_bytes",
            "class_count": len(self.classes),
            "shown": len(rows),
            "instances": self.instances,
            "shallow_bytes": self.shallow_bytes,
            "classes": [
                {
                    "class": entry.name,
                    "instances": entry.instances,
                    "shallow_bytes": entry.shallow_bytes,
                    "heaps": {
                        share.heap: {
                            "instances": share.instances,
                            "shallow_bytes": share.shallow_bytes,
                        }
                        for share in entry.heaps
                    },
                }
                for entry in rows
            ],
        }
