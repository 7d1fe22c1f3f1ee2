"""HPROF heap dumps: a streaming reader that builds a class histogram.

Layer: ``protocol`` (sans-IO, standard library only). :class:`HprofReader` takes the bytes of
a dump in pieces of any size (``feed``) and gives a :class:`HprofSummary` at the end
(``finish``); :func:`summarise_file` is the one convenience that opens a file.

The format itself (records, sub-records, basic types) is described in
`ddmd.protocol.hprofwire`, which also holds the result types; this module re-exports them.

The reader parses; what it counts, and the names it needs for that, are kept by its
:class:`~ddmd.protocol.hproftally.HprofTally`, which also builds the summary.

Rules of this reader (its own decisions):

* **Memory.** It never holds the file, nor a whole heap-dump segment: sub-records are parsed
  one at a time as their fixed header arrives, and field values and array elements are
  skipped as they stream past (bytes that are skipped are not even copied when a fed piece
  lies wholly inside them). What it keeps: the piece being fed, at most one partial
  sub-record header or class-dump entry, the STRING records seen before the first heap
  dump (afterwards only those naming classes and heaps stay), and the per-class tallies.
* **Shallow size** is what the dump says about the object itself, without any object
  header (the dump does not record headers, and their size depends on the VM): an
  instance counts its field bytes (the INSTANCE DUMP byte count), an object array
  ``length * id size``, a primitive array ``length * element size`` (a NODATA array too:
  it had that length, only its contents were left out), and a class object
  (CLASS DUMP, counted as an instance of ``java.lang.Class``, as ``jmap -histo`` does) the
  bytes of its static field values.
* **Names.** Class names use dots; HotSpot's internal forms ("java/lang/String",
  "[I", "[[Ljava/lang/String;") become the Java source form ("java.lang.String", "int[]",
  "java.lang.String[][]"). Primitive arrays carry no class id, so they are named from
  their element type. Classes of the same name (several class loaders) share one row.
  Names come from LOAD CLASS records, which HotSpot and ART write before the first heap
  dump; there the reader drops the strings no class or heap needs, so a class loaded
  later with an earlier name string, or never loaded, is shown as ``class@0x...``.
* **Heaps.** Objects belong to the heap named by the last HEAP DUMP INFO record (the name
  string, or for an unknown string the heap type: 'A' app, 'I' image, 'Z' zygote, 0
  default); it stays in force across segments. Objects before any such record, and all
  objects of a 1.0.2 file, are in the heap "default".
* **Strictness.** A sub-record must end inside its segment; an unknown sub-record type,
  basic type, identifier size or header is an error (:class:`HprofFormatError`, with a
  sentence for the user and the byte offset). Unknown top-level records are skipped.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Final

from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.hproftally import HprofTally
from ddmd.protocol.hprofwire import (
    ANDROID_HEAPS,
    DEFAULT_HEAP,
    MAGIC_ANDROID,
    MAGIC_STANDARD,
    PRIMITIVE_SIZES,
    BasicType,
    ClassEntry,
    HeapShare,
    HeapTag,
    HprofFormatError,
    HprofSummary,
    RecordTag,
    basic_type_size,
    java_class_name,
    primitive_array_name,
)

__all__ = [
    "ANDROID_HEAPS",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_HEAP",
    "MAGIC_ANDROID",
    "MAGIC_STANDARD",
    "MAX_STRING_BYTES",
    "BasicType",
    "ClassEntry",
    "HeapShare",
    "HeapTag",
    "HprofFormatError",
    "HprofReader",
    "HprofSummary",
    "RecordTag",
    "basic_type_size",
    "java_class_name",
    "primitive_array_name",
    "summarise_file",
    "summarise_stream",
]


_MAGIC_PREFIX: Final = b"JAVA PROFILE "
_MAX_MAGIC: Final = 64  # the version string and its NUL fit in this

#: A STRING record longer than this is skipped, not kept (no class or heap name is that long).
MAX_STRING_BYTES: Final = 1 << 20
DEFAULT_CHUNK_SIZE: Final = 1 << 20

# Sub-record types as plain ints, for the hot loop.
_INSTANCE: Final = int(HeapTag.INSTANCE_DUMP)
_OBJECT_ARRAY: Final = int(HeapTag.OBJECT_ARRAY_DUMP)
_PRIMITIVE_ARRAY: Final = int(HeapTag.PRIMITIVE_ARRAY_DUMP)
_PRIMITIVE_NODATA: Final = int(HeapTag.PRIMITIVE_ARRAY_NODATA)
_HEAP_DUMP_INFO: Final = int(HeapTag.HEAP_DUMP_INFO)
_CLASS_DUMP: Final = int(HeapTag.CLASS_DUMP)


# --------------------------------------------------------------------------- the reader

_HEADER_TAIL = struct.Struct(">IQ")  # identifier size, timestamp
_RECORD_HEADER = struct.Struct(">BII")
_RECORD_HEADER_SIZE: Final = _RECORD_HEADER.size  # 9
_U2 = struct.Struct(">H")

_RECORD_WORDS: Final[dict[int, str]] = {
    RecordTag.STRING: "a string record",
    RecordTag.LOAD_CLASS: "a class record",
    RecordTag.STACK_FRAME: "a stack frame record",
    RecordTag.STACK_TRACE: "a stack trace record",
}

# Class-dump phases after the fixed part.
_CD_POOL, _CD_STATICS_COUNT, _CD_STATICS, _CD_FIELDS_COUNT, _CD_FIELDS = range(5)


class HprofReader:
    """Feed a dump in pieces (``feed``), then call ``finish`` for its :class:`HprofSummary`.

    Errors are :class:`HprofFormatError`; after one, the reader is spent. ``feed`` after
    ``finish`` is a :class:`LocalProtocolError`.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0  # next unread byte in _buf
        self._offset = 0  # file offset of _buf[_pos]
        self._skip = 0  # bytes still to pass over without reading
        self._state: Callable[[], bool] = self._file_header
        self._done = False
        self._failed = False

        self._version = ""
        self._id_size = 0
        self._timestamp_ms = 0
        self._record_tag = 0
        self._record_left = 0  # body bytes of the current buffered or heap record
        self._seen_heap_dump = False
        self._tally = HprofTally()  # names, per-heap counts, the summary

        # class dump in progress
        self._cd_phase = 0
        self._cd_left = 0
        self._cd_static_bytes = 0

    # ------------------------------------------------------------------ public

    @property
    def bytes_read(self) -> int:
        """Bytes of the dump taken in so far (fed, whether parsed yet or not)."""
        return self._offset + len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise LocalProtocolError("HprofReader.feed() called after finish()")
        if self._failed:
            raise LocalProtocolError("HprofReader.feed() called after a format error")
        view = memoryview(data).cast("B")
        if self._skip and self._pos >= len(self._buf):
            # Inside bytes to skip with nothing buffered: pass over them without copying.
            n = min(self._skip, len(view))
            self._skip -= n
            self._offset += n
            view = view[n:]
        if len(view):
            self._buf += view
        try:
            self._run()
        except HprofFormatError:
            self._failed = True
            raise
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0

    def finish(self) -> HprofSummary:
        if self._done:
            raise LocalProtocolError("HprofReader.finish() called twice")
        if self._failed:
            raise LocalProtocolError("HprofReader.finish() called after a format error")
        self._done = True
        pending = len(self._buf) - self._pos
        if self._state == self._file_header:
            if pending == 0:
                raise HprofFormatError("the file is empty: it is not an HPROF heap dump")
            raise HprofFormatError(
                f"the file is only {pending} bytes long: too short for an HPROF heap dump"
            )
        if self._state != self._record_header or pending or self._skip:
            if self._state in (self._heap_records, self._class_dump):
                where = "a heap dump segment"
            elif self._state == self._record_header and not self._skip:
                where = "a record header"
            else:
                where = _RECORD_WORDS.get(
                    self._record_tag, f"a record (type 0x{self._record_tag:02X})"
                )
            raise HprofFormatError(
                f"the file ends at byte {self._offset + pending} inside {where}: "
                "the dump is truncated"
            )
        return self._tally.summary(self._version, self._id_size, self._timestamp_ms)

    # ------------------------------------------------------------------ driving

    def _run(self) -> None:
        while True:
            if self._skip:
                avail = len(self._buf) - self._pos
                if not avail:
                    return
                n = min(avail, self._skip)
                self._pos += n
                self._offset += n
                self._skip -= n
                if self._skip:
                    return
            if not self._state():
                return

    def _take(self, n: int) -> int:
        """Consume n buffered bytes; return where they start in _buf."""
        at = self._pos
        self._pos += n
        self._offset += n
        return at

    def _error(self, message: str, at: int | None = None) -> HprofFormatError:
        where = self._offset if at is None else at
        return HprofFormatError(f"{message} (at byte {where})")

    # ------------------------------------------------------------------ header and records

    def _file_header(self) -> bool:
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        head = bytes(buf[pos : pos + min(avail, len(_MAGIC_PREFIX))])
        if not _MAGIC_PREFIX.startswith(head):
            raise HprofFormatError(
                "not an HPROF heap dump: the file does not start with 'JAVA PROFILE'"
            )
        nul = buf.find(0, pos, pos + _MAX_MAGIC)
        if nul < 0:
            if avail >= _MAX_MAGIC:
                raise HprofFormatError("not an HPROF heap dump: the version string never ends")
            return False
        need = nul + 1 - pos + _HEADER_TAIL.size
        if avail < need:
            return False
        version = bytes(buf[pos:nul])
        if not version.startswith(b"JAVA PROFILE 1.0.") or not version.isascii():
            raise HprofFormatError(
                f"unsupported HPROF version {version.decode('ascii', 'replace')!r}"
            )
        id_size, timestamp = _HEADER_TAIL.unpack_from(buf, nul + 1)
        if id_size not in (4, 8):
            raise HprofFormatError(
                f"unsupported identifier size {id_size} in the header (expected 4 or 8)"
            )
        self._take(need)
        self._version = version.decode("ascii")
        self._set_id_size(id_size)
        self._timestamp_ms = timestamp
        self._state = self._record_header
        return True

    def _set_id_size(self, ids: int) -> None:
        self._id_size = ids
        i = "I" if ids == 4 else "Q"
        self._id = struct.Struct(">" + i)
        self._load_class = struct.Struct(f">I{i}I{i}")
        self._instance_head = struct.Struct(f">{i}I{i}I")  # after the type byte
        self._obj_array_head = struct.Struct(f">{i}II{i}")
        self._prim_array_head = struct.Struct(f">{i}IIB")
        self._heap_info_body = struct.Struct(f">I{i}")
        self._class_head = struct.Struct(f">{i}I{i}{i}{i}{i}{i}{i}IH")
        self._root_sizes: dict[int, int] = {
            HeapTag.ROOT_UNKNOWN: ids,
            HeapTag.ROOT_JNI_GLOBAL: 2 * ids,
            HeapTag.ROOT_JNI_LOCAL: ids + 8,
            HeapTag.ROOT_JAVA_FRAME: ids + 8,
            HeapTag.ROOT_NATIVE_STACK: ids + 4,
            HeapTag.ROOT_STICKY_CLASS: ids,
            HeapTag.ROOT_THREAD_BLOCK: ids + 4,
            HeapTag.ROOT_MONITOR_USED: ids,
            HeapTag.ROOT_THREAD_OBJECT: ids + 8,
            HeapTag.ROOT_INTERNED_STRING: ids,
            HeapTag.ROOT_FINALIZING: ids,
            HeapTag.ROOT_DEBUGGER: ids,
            HeapTag.ROOT_REFERENCE_CLEANUP: ids,
            HeapTag.ROOT_VM_INTERNAL: ids,
            HeapTag.ROOT_JNI_MONITOR: ids + 8,
            HeapTag.UNREACHABLE: ids,
        }

    def _record_header(self) -> bool:
        if len(self._buf) - self._pos < _RECORD_HEADER_SIZE:
            return False
        at = self._offset
        tag, _time, length = _RECORD_HEADER.unpack_from(self._buf, self._take(_RECORD_HEADER_SIZE))
        self._record_tag = tag
        self._record_left = length
        if tag in (RecordTag.HEAP_DUMP, RecordTag.HEAP_DUMP_SEGMENT):
            if not self._seen_heap_dump:
                self._seen_heap_dump = True
                self._tally.prune_strings()
            self._state = self._heap_records
        elif tag == RecordTag.STRING:
            if length < self._id_size:
                raise self._error(f"a string record of {length} bytes is too short", at)
            if length > MAX_STRING_BYTES + self._id_size:
                self._skip = length  # far too long for a class or heap name: not kept
            else:
                self._state = self._string_body
        elif tag == RecordTag.LOAD_CLASS:
            if length < self._load_class.size:
                raise self._error(f"a class record of {length} bytes is too short", at)
            self._state = self._load_class_body
        else:
            self._skip = length
        return True

    def _string_body(self) -> bool:
        n = self._record_left
        if len(self._buf) - self._pos < n:
            return False
        at = self._take(n)
        (string_id,) = self._id.unpack_from(self._buf, at)
        self._tally.strings[string_id] = bytes(self._buf[at + self._id_size : at + n])
        self._state = self._record_header
        return True

    def _load_class_body(self) -> bool:
        n = self._record_left
        if len(self._buf) - self._pos < self._load_class.size:
            return False
        at = self._take(self._load_class.size)
        _serial, class_id, _stack, name_id = self._load_class.unpack_from(self._buf, at)
        self._tally.load_class(class_id, name_id)
        self._skip = n - self._load_class.size  # nothing else is defined; tolerate extra bytes
        self._state = self._record_header
        return True

    # ------------------------------------------------------------------ heap sub-records

    def _heap_records(self) -> bool:
        """Parse as many sub-records as are buffered (the hot loop of the reader)."""
        tally = self._tally
        tally.ensure_heap()
        buf = self._buf
        end = len(buf)
        pos = self._pos
        left = self._record_left
        ids = self._id_size
        counts = tally.counts
        sizes = tally.sizes
        progress = False
        try:
            while left:
                if pos >= end:
                    return progress
                tag = buf[pos]
                if tag == _INSTANCE:
                    head = self._instance_head
                    hl = 1 + head.size
                    if end - pos < hl:
                        self._check_room(tag, hl, left, pos)
                        return progress
                    _obj, _stack, key, payload = head.unpack_from(buf, pos + 1)
                    shallow = payload
                elif tag in (_PRIMITIVE_ARRAY, _PRIMITIVE_NODATA):
                    head = self._prim_array_head
                    hl = 1 + head.size
                    if end - pos < hl:
                        self._check_room(tag, hl, left, pos)
                        return progress
                    _obj, _stack, length, elem = head.unpack_from(buf, pos + 1)
                    elem_size = PRIMITIVE_SIZES.get(elem)
                    if elem_size is None:
                        raise self._error(
                            f"a primitive array has an unknown element type {elem}",
                            self._offset + pos - self._pos,
                        )
                    key, shallow = -elem, length * elem_size
                    payload = shallow if tag == _PRIMITIVE_ARRAY else 0
                elif tag == _OBJECT_ARRAY:
                    head = self._obj_array_head
                    hl = 1 + head.size
                    if end - pos < hl:
                        self._check_room(tag, hl, left, pos)
                        return progress
                    _obj, _stack, length, key = head.unpack_from(buf, pos + 1)
                    payload = shallow = length * ids
                else:
                    size = self._root_sizes.get(tag)
                    if size is not None:
                        hl = 1 + size
                        self._check_room(tag, hl, left, pos)
                        if end - pos < hl:
                            return progress
                        pos += hl
                        left -= hl
                        progress = True
                        continue
                    if tag == _HEAP_DUMP_INFO:
                        hl = 1 + self._heap_info_body.size
                        self._check_room(tag, hl, left, pos)
                        if end - pos < hl:
                            return progress
                        heap_type, name_id = self._heap_info_body.unpack_from(buf, pos + 1)
                        pos += hl
                        left -= hl
                        progress = True
                        tally.heap_info = True
                        tally.switch_heap(tally.heap_name(heap_type, name_id))
                        counts, sizes = tally.counts, tally.sizes
                        continue
                    if tag == _CLASS_DUMP:
                        hl = 1 + self._class_head.size
                        self._check_room(tag, hl, left, pos)
                        if end - pos < hl:
                            return progress
                        fields = self._class_head.unpack_from(buf, pos + 1)
                        pos += hl
                        left -= hl
                        self._cd_phase = _CD_POOL
                        self._cd_left = fields[-1]
                        self._cd_static_bytes = 0
                        self._state = self._class_dump
                        return True
                    raise self._error(
                        f"unknown heap dump sub-record type 0x{tag:02X}",
                        self._offset + pos - self._pos,
                    )
                # An object: tally it, then step over its payload (field values, elements).
                total = hl + payload
                self._check_room(tag, total, left, pos)
                counts[key] = counts.get(key, 0) + 1
                sizes[key] = sizes.get(key, 0) + shallow
                left -= total
                progress = True
                avail = end - pos - hl
                if payload <= avail:
                    pos += total
                else:
                    pos = end
                    self._skip = payload - avail
                    return True
            self._state = self._record_header
            return True
        finally:
            self._offset += pos - self._pos
            self._pos = pos
            self._record_left = left

    def _check_room(self, tag: int, total: int, left: int, pos: int) -> None:
        """A sub-record of ``total`` bytes must fit in the ``left`` bytes of its segment."""
        if total > left:
            raise self._error(
                f"{_sub_record_words(tag)} of {total} bytes runs past the end of its heap dump "
                f"segment ({left} bytes left)",
                self._offset + pos - self._pos,
            )

    def _class_dump(self) -> bool:
        """The variable part of a CLASS DUMP, one entry at a time."""
        buf = self._buf
        ids = self._id_size
        while True:
            avail = len(buf) - self._pos
            phase = self._cd_phase
            if phase in (_CD_STATICS_COUNT, _CD_FIELDS_COUNT):
                if not self._class_dump_room(2, avail):
                    return False
                (self._cd_left,) = _U2.unpack_from(buf, self._take(2))
                self._record_left -= 2
                self._cd_phase += 1
                continue
            if self._cd_left == 0:
                if phase == _CD_FIELDS:
                    self._finish_class_dump()
                    return True
                self._cd_phase += 1
                continue
            if phase == _CD_FIELDS:
                need = ids + 1
                if not self._class_dump_room(need, avail):
                    return False
                self._take(need)
            else:
                type_at = 2 if phase == _CD_POOL else ids
                if not self._class_dump_room(type_at + 1, avail):
                    return False
                code = buf[self._pos + type_at]
                value = basic_type_size(code, ids)
                if value is None:
                    raise self._error(f"a class dump names an unknown basic type {code}")
                need = type_at + 1 + value
                if not self._class_dump_room(need, avail):
                    return False
                self._take(need)
                if phase == _CD_STATICS:
                    self._cd_static_bytes += value
            self._record_left -= need
            self._cd_left -= 1

    def _class_dump_room(self, need: int, avail: int) -> bool:
        if need > self._record_left:
            raise self._error(
                f"a class dump runs past the end of its heap dump segment "
                f"({self._record_left} bytes left)"
            )
        return avail >= need

    def _finish_class_dump(self) -> None:
        self._tally.add_class_object(self._cd_static_bytes)
        self._state = self._heap_records


def _sub_record_words(tag: int) -> str:
    if tag == _INSTANCE:
        return "an object record"
    if tag == _OBJECT_ARRAY:
        return "an object array record"
    if tag in (_PRIMITIVE_ARRAY, _PRIMITIVE_NODATA):
        return "a primitive array record"
    if tag == _CLASS_DUMP:
        return "a class dump"
    if tag == _HEAP_DUMP_INFO:
        return "a heap switch record"
    return "a GC root record"


# --------------------------------------------------------------------------- conveniences


def summarise_stream(
    chunks: Iterable[bytes | bytearray | memoryview],
) -> HprofSummary:
    """Feed every piece of ``chunks`` to a fresh reader and return its summary."""
    reader = HprofReader()
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


def _read_pieces(stream: BinaryIO, chunk_size: int) -> Iterable[bytes]:
    while True:
        piece = stream.read(chunk_size)
        if not piece:
            return
        yield piece


def summarise_file(path: str | Path, chunk_size: int = DEFAULT_CHUNK_SIZE) -> HprofSummary:
    """Read the dump at ``path`` in pieces of ``chunk_size`` bytes (never whole).

    Raises :class:`HprofFormatError` for a bad dump, ``OSError`` when the file cannot be read.
    """
    if chunk_size <= 0:
        raise LocalProtocolError(f"chunk_size must be positive, not {chunk_size}")
    with open(path, "rb") as stream:
        return summarise_stream(_read_pieces(stream, chunk_size))
