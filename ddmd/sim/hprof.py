"""The simulated VM's heap dumps: deterministic Android "JAVA PROFILE 1.0.3" HPROF files.

Layer: ``sim``; imports only the wire constants of `ddmd.protocol.hprof`. No I/O: every
writer here is a generator of byte pieces, so a caller can push them as an HPDS chunk or
write them to a file without ever holding a large dump.

Two kinds of dump:

* :func:`dump_chunks` writes the objects of a :class:`HeapContent` (a recorded description
  with known instance counts per class and heap: :meth:`HeapContent.expected_instances`
  and :meth:`HeapContent.expected_by_heap` are what a reader must find). The layout
  follows ART's writer: 4-byte ids (hprof-conv only reads those), the STRING table, then
  LOAD CLASS records and an empty STACK TRACE, then HEAP DUMP SEGMENT records of at most
  128 objects or about 4 KiB each, a HEAP DUMP INFO record switching between the
  "zygote", "image" and "app" heaps (again at the start of every segment, as ART does),
  a CLASS DUMP for every class (array classes too), INSTANCE DUMP, OBJECT ARRAY DUMP and
  PRIMITIVE ARRAY DUMP records, and a few roots of the Android kinds as well as the
  standard ones. Every class object is one instance of ``java.lang.Class``.
* :class:`LargeDump` writes a dump of an exact size (say 1 GiB) made of big ``byte[]``
  arrays, one per segment, streaming the same element bytes again and again, for
  benchmarks of the streaming paths.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ddmd.protocol.hprof import MAGIC_ANDROID, BasicType, HeapTag, RecordTag

__all__ = [
    "ArraySpec",
    "ClassSpec",
    "HeapContent",
    "LargeDump",
    "dump_bytes",
    "dump_chunks",
    "sim_heap_content",
]

ID_SIZE: Final = 4
_ID = struct.Struct(">I")
_RECORD = struct.Struct(">BII")
_PRIMITIVE: Final[dict[str, tuple[BasicType, int]]] = {
    "boolean": (BasicType.BOOLEAN, 1),
    "char": (BasicType.CHAR, 2),
    "float": (BasicType.FLOAT, 4),
    "double": (BasicType.DOUBLE, 8),
    "byte": (BasicType.BYTE, 1),
    "short": (BasicType.SHORT, 2),
    "int": (BasicType.INT, 4),
    "long": (BasicType.LONG, 8),
}
_VALUE_SIZE: Final[dict[BasicType, int]] = {
    BasicType.OBJECT: ID_SIZE,
    **{basic: size for basic, size in _PRIMITIVE.values()},
}
#: ART's heap type codes (HEAP DUMP INFO) and the order its dumps walk the heaps in.
_HEAP_TYPES: Final = {"zygote": ord("Z"), "image": ord("I"), "app": ord("A")}
HEAPS: Final = ("zygote", "image", "app")
# Object addresses (the ids) of each heap, as on a 32-bit-reference ART heap.
_HEAP_BASE: Final = {"image": 0x7000_0000, "zygote": 0x12C0_0000, "app": 0x1340_0000}
_FIRST_STRING_ID: Final = 0x400000  # ART numbers its strings from here
_MAX_SEGMENT_OBJECTS: Final = 128  # ART starts a new segment at 128 objects or 4096 bytes
_MAX_SEGMENT_BYTES: Final = 4096
_TIMESTAMP_MS: Final = 1_700_000_000_000
# Bytes around each array of a LargeDump: segment record header, HEAP DUMP INFO, array header.
_PER_ARRAY: Final = 9 + 9 + 14  # a fixed time: the same content gives the same bytes


# --------------------------------------------------------------------------- content


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """One class: where its class object lives, its fields, and its instances per heap."""

    name: str  # Java source form: "com.example.mail.Message"
    heap: str  # the heap of the class object itself
    instances: tuple[tuple[str, int], ...] = ()  # (heap, count)
    fields: tuple[tuple[str, BasicType], ...] = ()  # declared instance fields, this class only
    statics: tuple[tuple[str, BasicType], ...] = ()
    super_name: str | None = "java.lang.Object"


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """``count`` arrays of ``length`` elements; ``element`` is a primitive type name
    ("int") or a class name (an object array)."""

    element: str
    heap: str
    count: int
    length: int

    @property
    def class_name(self) -> str:
        return self.element + "[]"


@dataclass(frozen=True, slots=True)
class HeapContent:
    """What a simulated heap holds. Array classes are added for every array element type."""

    classes: tuple[ClassSpec, ...]
    arrays: tuple[ArraySpec, ...] = ()
    timestamp_ms: int = _TIMESTAMP_MS

    def __post_init__(self) -> None:
        heaps = [spec.heap for spec in self.classes]
        heaps += [heap for spec in self.classes for heap, _ in spec.instances]
        heaps += [array.heap for array in self.arrays]
        unknown = sorted(set(heaps) - set(HEAPS))
        if unknown:
            raise ValueError(f"unknown heaps {unknown}: a simulated dump has {list(HEAPS)}")
        counts = [n for spec in self.classes for _, n in spec.instances]
        counts += [n for array in self.arrays for n in (array.count, array.length)]
        if any(n < 0 for n in counts):
            raise ValueError("instance counts and array lengths cannot be negative")

    def all_classes(self) -> tuple[ClassSpec, ...]:
        """The declared classes, then one array class per element type (its class object
        in "image" for primitive and java.* elements, like the boot image; else "app")."""
        known = {spec.name for spec in self.classes}
        extra: list[ClassSpec] = []
        for array in self.arrays:
            name = array.class_name
            if name in known:
                continue
            known.add(name)
            boot = array.element in _PRIMITIVE or array.element.startswith("java.")
            extra.append(ClassSpec(name, "image" if boot else "app"))
        return (*self.classes, *extra)

    def expected_by_heap(self) -> dict[str, dict[str, int]]:
        """class name -> heap -> instances, as a reader must count them (class objects are
        instances of java.lang.Class)."""
        out: dict[str, dict[str, int]] = {}

        def add(name: str, heap: str, n: int) -> None:
            if n:
                per_heap = out.setdefault(name, {})
                per_heap[heap] = per_heap.get(heap, 0) + n

        for spec in self.all_classes():
            add("java.lang.Class", spec.heap, 1)
            for heap, n in spec.instances:
                add(spec.name, heap, n)
        for array in self.arrays:
            add(array.class_name, array.heap, array.count)
        return out

    def expected_instances(self) -> dict[str, int]:
        return {name: sum(heaps.values()) for name, heaps in self.expected_by_heap().items()}


def sim_heap_content(package: str = "com.example.app") -> HeapContent:
    """The heap of a simulated app: boot classes in the image and zygote heaps, the app's
    own classes and most objects in the app heap. Deterministic for a given package."""
    obj, i32, i64, flag = BasicType.OBJECT, BasicType.INT, BasicType.LONG, BasicType.BOOLEAN
    return HeapContent(
        classes=(
            ClassSpec(
                "java.lang.Object",
                "image",
                (("image", 40), ("zygote", 12), ("app", 25)),
                fields=(("shadow$_klass_", obj), ("shadow$_monitor_", i32)),
                super_name=None,
            ),
            ClassSpec("java.lang.Class", "image", statics=(("serialVersionUID", i64),)),
            ClassSpec(
                "java.lang.String",
                "image",
                (("image", 300), ("zygote", 120), ("app", 180)),
                fields=(("count", i32), ("hash", i32)),
            ),
            ClassSpec(
                "java.lang.Thread",
                "image",
                (("app", 6),),
                fields=(("name", obj), ("priority", i32), ("daemon", flag)),
            ),
            ClassSpec(
                "java.util.ArrayList",
                "image",
                (("zygote", 20), ("app", 35)),
                fields=(("elementData", obj), ("size", i32)),
            ),
            ClassSpec(
                "java.util.HashMap",
                "image",
                (("zygote", 15), ("app", 22)),
                fields=(("table", obj), ("size", i32), ("threshold", i32)),
            ),
            ClassSpec(
                "android.view.View",
                "zygote",
                (("zygote", 10), ("app", 48)),
                fields=(("mParent", obj), ("mLeft", i32), ("mTop", i32)),
            ),
            ClassSpec(f"{package}.MainActivity", "app", (("app", 1),), fields=(("view", obj),)),
            ClassSpec(
                f"{package}.Message",
                "app",
                (("app", 250),),
                fields=(("subject", obj), ("body", obj), ("id", i64), ("unread", flag)),
                statics=(("count", i32),),
            ),
            ClassSpec(
                f"{package}.Folder", "app", (("app", 12),), fields=(("name", obj), ("items", obj))
            ),
        ),
        arrays=(
            ArraySpec("char", "image", 150, 24),
            ArraySpec("byte", "zygote", 30, 64),
            ArraySpec("byte", "app", 90, 512),
            ArraySpec("int", "app", 40, 100),
            ArraySpec("long", "image", 5, 16),
            ArraySpec("boolean", "app", 3, 7),
            ArraySpec("double", "app", 2, 9),
            ArraySpec("java.lang.Object", "app", 35, 10),
            ArraySpec("java.lang.String", "zygote", 8, 4),
            ArraySpec(f"{package}.Message", "app", 12, 25),
        ),
    )


# --------------------------------------------------------------------------- writing


def _record(tag: int, body: bytes) -> bytes:
    return _RECORD.pack(tag, 0, len(body)) + body


def _header(timestamp_ms: int) -> bytes:
    # ART writes the time as two u4 words, high then low: the same bytes as one u8.
    return MAGIC_ANDROID + b"\0" + struct.pack(">IQ", ID_SIZE, timestamp_ms)


@dataclass(slots=True)
class _Ids:
    """Deterministic ids: string ids in order of first use, object addresses per heap."""

    strings: dict[str, int] = field(default_factory=dict)
    next_address: dict[str, int] = field(default_factory=lambda: dict(_HEAP_BASE))

    def string(self, text: str) -> int:
        sid = self.strings.get(text)
        if sid is None:
            sid = self.strings[text] = _FIRST_STRING_ID + len(self.strings)
        return sid

    def address(self, heap: str, size: int) -> int:
        at = self.next_address[heap]
        self.next_address[heap] = at + max(16, (size + 8 + 7) // 8 * 8)
        return at


@dataclass(slots=True)
class _Segments:
    """Heap sub-records grouped into segments the way ART cuts them."""

    heap_names: dict[str, int]
    out: list[bytes] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    objects: int = 0
    heap: str | None = None

    def add(self, heap: str | None, sub_record: bytes) -> None:
        if self.objects >= _MAX_SEGMENT_OBJECTS or len(self.body) >= _MAX_SEGMENT_BYTES:
            self.flush()
        if heap is not None and heap != self.heap:
            self.body += bytes([HeapTag.HEAP_DUMP_INFO])
            self.body += struct.pack(">II", _HEAP_TYPES[heap], self.heap_names[heap])
            self.heap = heap
        self.body += sub_record
        self.objects += 1

    def flush(self) -> None:
        if self.body:
            self.out.append(_record(RecordTag.HEAP_DUMP_SEGMENT, bytes(self.body)))
        self.body = bytearray()
        self.objects = 0
        self.heap = None  # a new segment starts in the default heap (ART resets it too)


def _instance_bytes(spec: ClassSpec, by_name: dict[str, ClassSpec]) -> int:
    size = 0
    current: ClassSpec | None = spec
    while current is not None:
        size += sum(_VALUE_SIZE[basic] for _, basic in current.fields)
        current = by_name.get(current.super_name) if current.super_name else None
    return size


def _class_dump(
    spec: ClassSpec, class_id: int, ids: _Ids, class_ids: dict[str, int], instance_size: int
) -> bytes:
    super_id = class_ids.get(spec.super_name, 0) if spec.super_name else 0
    out = bytearray([HeapTag.CLASS_DUMP])
    out += struct.pack(">IIIIIIII", class_id, 0, super_id, 0, 0, 0, 0, 0)
    out += struct.pack(">IH", instance_size, 0)  # instance size, empty constant pool
    out += struct.pack(">H", len(spec.statics))
    for name, basic in spec.statics:
        out += struct.pack(">IB", ids.string(name), basic) + bytes(_VALUE_SIZE[basic])
    out += struct.pack(">H", len(spec.fields))
    for name, basic in spec.fields:
        out += struct.pack(">IB", ids.string(name), basic)
    return bytes(out)


_PATTERN: Final = bytes(i * 7 & 0xFF for i in range(256))


def _array_pattern(n: int) -> bytes:
    """``n`` deterministic element bytes."""
    return (_PATTERN * (n // 256 + 1))[:n]


def dump_chunks(content: HeapContent) -> Iterator[bytes]:
    """The dump of ``content``, as pieces of bytes (one or more records each)."""
    ids = _Ids()
    for heap in HEAPS:
        ids.string(heap)
    classes = content.all_classes()
    by_name = {spec.name: spec for spec in classes}
    class_ids = {spec.name: ids.address(spec.heap, 64) for spec in classes}
    for spec in classes:
        ids.string(spec.name)
        for name, _ in (*spec.statics, *spec.fields):
            ids.string(name)

    segments = _Segments({heap: ids.string(heap) for heap in HEAPS})
    first_object: dict[str, int] = {}
    # A few roots first (they belong to no heap).
    object_class = class_ids.get("java.lang.Object", 0)
    roots = bytearray()
    for spec in classes:
        roots += bytes([HeapTag.ROOT_STICKY_CLASS]) + _ID.pack(class_ids[spec.name])
    segments.add(None, bytes(roots))
    for heap in HEAPS:
        for spec in classes:
            if spec.heap == heap:
                size = _instance_bytes(spec, by_name) if not spec.name.endswith("[]") else 0
                segments.add(heap, _class_dump(spec, class_ids[spec.name], ids, class_ids, size))
        for spec in classes:
            count = sum(n for h, n in spec.instances if h == heap)
            nbytes = _instance_bytes(spec, by_name)
            values = bytes(nbytes)
            for _ in range(count):
                oid = ids.address(heap, nbytes)
                first_object.setdefault(spec.name, oid)
                head = struct.pack(
                    ">BIIII", HeapTag.INSTANCE_DUMP, oid, 0, class_ids[spec.name], nbytes
                )
                segments.add(heap, head + values)
        for array in content.arrays:
            if array.heap != heap:
                continue
            class_id = class_ids[array.class_name]
            primitive = _PRIMITIVE.get(array.element)
            for index in range(array.count):
                if primitive is None:
                    oid = ids.address(heap, array.length * ID_SIZE)
                    head = struct.pack(
                        ">BIIII", HeapTag.OBJECT_ARRAY_DUMP, oid, 0, array.length, class_id
                    )
                    elements = first_object.get("java.lang.String", 0) if index % 2 else 0
                    segments.add(heap, head + _ID.pack(elements) * array.length)
                else:
                    basic, size = primitive
                    oid = ids.address(heap, array.length * size)
                    head = struct.pack(
                        ">BIIIB", HeapTag.PRIMITIVE_ARRAY_DUMP, oid, 0, array.length, basic
                    )
                    segments.add(heap, head + _array_pattern(array.length * size))
    # Roots of the other kinds, pointing at objects that exist.
    thread = first_object.get("java.lang.Thread", object_class)
    string = first_object.get("java.lang.String", object_class)
    some = first_object.get("java.lang.Object", object_class)
    segments.add(
        None,
        b"".join(
            (
                struct.pack(">BII", HeapTag.ROOT_THREAD_OBJECT, thread, 1) + _ID.pack(0),
                struct.pack(">BIII", HeapTag.ROOT_JAVA_FRAME, some, 1, 0),
                struct.pack(">BII", HeapTag.ROOT_JNI_GLOBAL, some, 0x2001),
                struct.pack(">BIII", HeapTag.ROOT_JNI_LOCAL, some, 1, 0),
                struct.pack(">BI", HeapTag.ROOT_INTERNED_STRING, string),
                struct.pack(">BI", HeapTag.ROOT_VM_INTERNAL, some),
                struct.pack(">BI", HeapTag.ROOT_DEBUGGER, some),
                struct.pack(">BIII", HeapTag.ROOT_JNI_MONITOR, some, 1, 0xFFFFFFFF),
                struct.pack(">BI", HeapTag.ROOT_MONITOR_USED, some),
                struct.pack(">BI", HeapTag.ROOT_UNKNOWN, some),
            )
        ),
    )
    segments.flush()

    yield _header(content.timestamp_ms)
    yield b"".join(
        _record(RecordTag.STRING, _ID.pack(sid) + text.encode())
        for text, sid in ids.strings.items()
    )
    yield b"".join(
        _record(
            RecordTag.LOAD_CLASS,
            struct.pack(">IIII", serial, class_ids[spec.name], 0, ids.string(spec.name)),
        )
        for serial, spec in enumerate(classes, start=1)
    )
    yield _record(RecordTag.STACK_TRACE, struct.pack(">III", 0, 0, 0))
    yield from segments.out
    yield _record(RecordTag.HEAP_DUMP_END, b"")


def dump_bytes(content: HeapContent) -> bytes:
    """The whole dump of ``content`` (small by design: a few hundred KB)."""
    return b"".join(dump_chunks(content))


# --------------------------------------------------------------------------- large dumps


@dataclass(frozen=True, slots=True)
class LargeDump:
    """A dump of exactly ``size_bytes`` bytes: ``byte[]`` arrays of ``array_bytes`` bytes in
    the app heap, one per segment (the last one shorter or longer to hit the size).

    ``chunks()`` streams it; each array's elements are yielded as one piece, the same bytes
    object every time, so memory stays at about one array whatever the size.
    """

    size_bytes: int
    array_bytes: int = 1 << 20
    timestamp_ms: int = _TIMESTAMP_MS

    def _prefix(self) -> bytes:
        return b"".join(
            dump_chunks(
                HeapContent(
                    (ClassSpec("java.lang.Object", "image", super_name=None),),
                    (ArraySpec("byte", "app", 0, 0),),
                    self.timestamp_ms,
                )
            )
        )[: -_RECORD.size]  # everything but the HEAP DUMP END record

    def _plan(self) -> tuple[int, int, int]:
        """(prefix length, number of arrays, bytes of the last array)."""
        if self.array_bytes <= 0:
            raise ValueError(f"array_bytes must be positive, not {self.array_bytes}")
        fixed = len(self._prefix()) + _RECORD.size
        per = _PER_ARRAY + self.array_bytes
        room = self.size_bytes - fixed - _PER_ARRAY
        if room < 0:
            raise ValueError(f"a dump cannot be as small as {self.size_bytes} bytes")
        full, rest = divmod(self.size_bytes - fixed, per)
        if rest == 0:
            return fixed - _RECORD.size, full, self.array_bytes
        if rest >= _PER_ARRAY:
            return fixed - _RECORD.size, full + 1, rest - _PER_ARRAY
        return fixed - _RECORD.size, full, self.array_bytes + rest  # the last one grows

    @property
    def arrays(self) -> int:
        return self._plan()[1]

    def expected_instances(self) -> dict[str, int]:
        """What a reader must count: the arrays, and two class objects (Object, byte[])."""
        return {"byte[]": self.arrays, "java.lang.Class": 2}

    def chunks(self) -> Iterator[bytes]:
        _, arrays, last = self._plan()
        block = _array_pattern(self.array_bytes)
        app = _HEAP_TYPES["app"]
        app_name = _FIRST_STRING_ID + HEAPS.index("app")
        yield self._prefix()
        address = _HEAP_BASE["app"] + 0x100_0000
        for index in range(arrays):
            n = last if index == arrays - 1 else self.array_bytes
            body_len = 9 + 14 + n
            yield (
                _RECORD.pack(RecordTag.HEAP_DUMP_SEGMENT, 0, body_len)
                + struct.pack(">BII", HeapTag.HEAP_DUMP_INFO, app, app_name)
                + struct.pack(">BIIIB", HeapTag.PRIMITIVE_ARRAY_DUMP, address, 0, n, BasicType.BYTE)
            )
            address = (address + (n + 16 + 7) // 8 * 8) & 0xFFFF_FFFF  # ids stay 4 bytes
            if n == self.array_bytes:
                yield block
            elif n < self.array_bytes:
                yield block[:n]
            else:
                yield block
                yield _array_pattern(n - self.array_bytes)
        yield _record(RecordTag.HEAP_DUMP_END, b"")
