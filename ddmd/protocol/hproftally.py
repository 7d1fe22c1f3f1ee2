"""What an HPROF reader has counted, and the names it needs: the part of
`ddmd.protocol.hprof.HprofReader` that turns parsed records into a :class:`HprofSummary`.

Layer: ``protocol`` (sans-IO, standard library only). The reader parses bytes and hands
:class:`HprofTally` what it found (strings, class names, heap switches, objects); the tally
keeps the per-heap, per-class counts and builds the summary at the end. The naming and
heap rules are the reader's, described in the `ddmd.protocol.hprof` docstring.
"""

from __future__ import annotations

from typing import Final

from ddmd.protocol.hprofwire import (
    ANDROID_HEAPS,
    DEFAULT_HEAP,
    HEAP_TYPE_NAMES,
    ClassEntry,
    HeapShare,
    HprofSummary,
    java_class_name,
    primitive_array_name,
)

__all__ = ["CLASS_KEY", "HprofTally"]

#: Tally key of class objects (CLASS DUMP). Instances and object arrays are keyed by their
#: class id; a primitive array by minus its element type.
CLASS_KEY: Final = -1

_KNOWN_HEAP_NAMES: Final = frozenset(n.encode() for n in (*ANDROID_HEAPS, DEFAULT_HEAP))


class HprofTally:
    """Strings, class names and heaps seen so far, and per heap: objects and shallow bytes
    per tally key.

    The reader's hot loop adds to ``counts`` and ``sizes`` (the current heap's dicts) itself,
    and fetches them again after every `switch_heap`.
    """

    def __init__(self) -> None:
        self.strings: dict[int, bytes] = {}
        self._class_names: dict[int, str | int] = {}  # class id -> name, or its string id
        self._heap_names: list[str] = []
        self._heap_of: dict[str, int] = {}
        self._counts: list[dict[int, int]] = []
        self._sizes: list[dict[int, int]] = []
        #: The current heap's tallies: key -> objects, key -> shallow bytes.
        self.counts: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        #: A HEAP DUMP INFO record was seen (the summary's ``heap_info``).
        self.heap_info = False
        self._current_heap = -1

    # ------------------------------------------------------------------ names

    def load_class(self, class_id: int, name_id: int) -> None:
        """A LOAD CLASS record: the class is named by string ``name_id``."""
        raw = self.strings.get(name_id)
        self._class_names[class_id] = name_id if raw is None else _class_name(raw)

    def prune_strings(self) -> None:
        """At the first heap dump: keep only the strings that may still be asked for."""
        wanted = {ref for ref in self._class_names.values() if isinstance(ref, int)}
        self.strings = {
            sid: raw
            for sid, raw in self.strings.items()
            if sid in wanted or raw in _KNOWN_HEAP_NAMES
        }

    def heap_name(self, heap_type: int, name_id: int) -> str:
        raw = self.strings.get(name_id)
        if raw:
            return raw.decode("utf-8", "replace")
        return HEAP_TYPE_NAMES.get(heap_type, f"heap 0x{heap_type:X}")

    def name_of(self, key: int) -> str:
        if key == CLASS_KEY:
            return "java.lang.Class"
        if key < 0:
            return primitive_array_name(-key)
        ref = self._class_names.get(key)
        if isinstance(ref, str):
            return ref
        raw = self.strings.get(ref) if ref is not None else None
        if raw is not None:
            return _class_name(raw)
        return f"class@0x{key:x}"

    # ------------------------------------------------------------------ heaps and objects

    def ensure_heap(self) -> None:
        """Objects before any HEAP DUMP INFO record are in the heap "default"."""
        if self._current_heap < 0:
            self.switch_heap(DEFAULT_HEAP)

    def switch_heap(self, name: str) -> None:
        index = self._heap_of.get(name)
        if index is None:
            index = len(self._heap_names)
            self._heap_names.append(name)
            self._heap_of[name] = index
            self._counts.append({})
            self._sizes.append({})
        self._current_heap = index
        self.counts = self._counts[index]
        self.sizes = self._sizes[index]

    def add_class_object(self, static_bytes: int) -> None:
        """A CLASS DUMP: one more ``java.lang.Class`` of ``static_bytes`` shallow bytes."""
        self.ensure_heap()
        counts, sizes = self.counts, self.sizes
        counts[CLASS_KEY] = counts.get(CLASS_KEY, 0) + 1
        sizes[CLASS_KEY] = sizes.get(CLASS_KEY, 0) + static_bytes

    # ------------------------------------------------------------------ the result

    def summary(self, version: str, id_size: int, timestamp_ms: int) -> HprofSummary:
        totals: dict[str, list[int]] = {}  # name -> [instances, bytes, then per heap pairs]
        heap_count = len(self._heap_names)
        for index in range(heap_count):
            sizes = self._sizes[index]
            for key, count in self._counts[index].items():
                name = self.name_of(key)
                row = totals.get(name)
                if row is None:
                    row = totals[name] = [0] * (2 + 2 * heap_count)
                shallow = sizes[key]
                row[0] += count
                row[1] += shallow
                row[2 + 2 * index] += count
                row[3 + 2 * index] += shallow
        used = [i for i in range(heap_count) if self._counts[i]]
        order = sorted(used, key=lambda i: _heap_rank(self._heap_names[i], i))
        entries = []
        for name, row in totals.items():
            shares = tuple(
                HeapShare(self._heap_names[i], row[2 + 2 * i], row[3 + 2 * i])
                for i in order
                if row[2 + 2 * i]
            )
            entries.append(ClassEntry(name, row[0], row[1], shares))
        entries.sort(key=lambda e: (-e.shallow_bytes, -e.instances, e.name))
        return HprofSummary(
            version=version,
            id_size=id_size,
            timestamp_ms=timestamp_ms,
            heap_info=self.heap_info,
            heaps=tuple(self._heap_names[i] for i in order),
            classes=tuple(entries),
            instances=sum(e.instances for e in entries),
            shallow_bytes=sum(e.shallow_bytes for e in entries),
        )


def _heap_rank(name: str, index: int) -> tuple[int, int]:
    order = (*ANDROID_HEAPS, DEFAULT_HEAP)
    return (order.index(name), 0) if name in order else (len(order), index)


def _class_name(raw: bytes) -> str:
    return java_class_name(raw.decode("utf-8", "replace"))
