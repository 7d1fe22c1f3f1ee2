"""The streaming HPROF reader on small hand-built dumps (tests/hprof/dumpbuilder.py): exact
histograms for 1.0.2 and Android 1.0.3 files, identifier sizes 4 and 8, any feed split."""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.hprof import (
    HprofFormatError,
    HprofReader,
    HprofSummary,
    java_class_name,
    summarise_file,
    summarise_stream,
)
from tests.hprof.dumpbuilder import (
    ANDROID,
    BOOLEAN,
    BYTE,
    CHAR,
    DOUBLE,
    FLOAT,
    INT,
    LONG,
    OBJECT,
    SHORT,
    Dump,
)

# --------------------------------------------------------------------------- the dumps


def standard_dump(id_size: int, heap_dump_tag: int = 0x1C) -> bytes:
    """A HotSpot-style 1.0.2 dump: internal class names, every standard root kind."""
    d = Dump(id_size=id_size, timestamp=1_234_567)
    names = {
        1: "java/lang/Object",
        2: "java/lang/String",
        3: "com/example/Node",
        4: "[Lcom/example/Node;",
        5: "value",
        6: "next",
        7: "[[I",
        8: "count",
    }
    for sid, text in names.items():
        d.string(sid, text)
    d.record(0x05, struct.pack(">III", 1, 0, 0))  # a stack trace, skipped
    for serial, (cid, sid) in enumerate(
        [(0x100, 1), (0x200, 2), (0x300, 3), (0x400, 4), (0x500, 7)], 1
    ):
        d.load_class(serial, cid, sid)
    d.segment(
        d.root(0xFF, 0x1000),
        d.root(0x01, 0x1000, extra_id=0x77),
        d.root(0x02, 0x1000, 1, 2),
        d.root(0x03, 0x1000, 1, 2),
        d.root(0x04, 0x1000, 1),
        d.root(0x05, 0x100),
        d.root(0x06, 0x1000, 1),
        d.root(0x07, 0x1000),
        d.root(0x08, 0x1000, 1, 2),
        d.class_dump(0x100),
        d.class_dump(
            0x200,
            0x100,
            id_size + 4,
            pool=((1, INT), (2, OBJECT)),
            statics=((8, INT), (5, OBJECT)),
            fields=((5, OBJECT), (8, INT)),
        ),
        d.class_dump(0x300, 0x100, 8 + id_size, fields=((5, LONG), (6, OBJECT))),
        d.class_dump(0x400, 0x100),
        d.class_dump(0x500, 0x100),
        *(d.instance(0x2000 + i, 0x100, 0) for i in range(2)),
        *(d.instance(0x3000 + i, 0x200, id_size + 4) for i in range(3)),
        *(d.instance(0x4000 + i, 0x300, 8 + id_size) for i in range(4)),
        tag=heap_dump_tag,
    )
    d.segment(
        d.object_array(0x5000, 0x400, 3),
        d.object_array(0x5001, 0x400, 0),
        d.object_array(0x5002, 0x500, 2),
        d.primitive_array(0x6000, INT, 5),
        d.primitive_array(0x6001, BYTE, 7),
        d.primitive_array(0x6002, CHAR, 3),
        d.primitive_array(0x6003, LONG, 2),
        d.primitive_array(0x6004, BOOLEAN, 1),
        d.primitive_array(0x6005, SHORT, 4),
        d.primitive_array(0x6006, FLOAT, 2),
        d.primitive_array(0x6007, DOUBLE, 1),
        tag=heap_dump_tag,
    )
    d.segment(tag=heap_dump_tag)  # an empty segment is fine
    d.end()
    return d.bytes()


def standard_expected(n: int) -> dict[str, tuple[int, int]]:
    """(instances, shallow bytes) per class of standard_dump, worked out by hand."""
    return {
        "java.lang.Class": (5, 4 + n),  # five class dumps; String's statics: an int and an id
        "java.lang.Object": (2, 0),
        "java.lang.String": (3, 3 * (n + 4)),
        "com.example.Node": (4, 4 * (8 + n)),
        "com.example.Node[]": (2, 3 * n),
        "int[][]": (1, 2 * n),
        "int[]": (1, 20),
        "byte[]": (1, 7),
        "char[]": (1, 6),
        "long[]": (1, 16),
        "boolean[]": (1, 1),
        "short[]": (1, 8),
        "float[]": (1, 8),
        "double[]": (1, 8),
    }


def android_dump(id_size: int) -> bytes:
    """An ART-style 1.0.3 dump: source-form names, heap switches, Android roots, NODATA."""
    d = Dump(ANDROID, id_size=id_size)
    for sid, text in {
        10: "app",
        11: "image",
        12: "zygote",
        13: "java.lang.Object",
        14: "com.example.Thing",
        15: "byte[]",
        16: "com.example.Thing[]",
    }.items():
        d.string(sid, text)
    for serial, (cid, sid) in enumerate([(0x100, 13), (0x300, 14), (0x500, 15), (0x600, 16)], 1):
        d.load_class(serial, cid, sid)
    d.segment(
        d.instance(0x1000, 0x100, 0),  # before any heap record: the default heap
        d.heap_info(ord("I"), 11),
        d.class_dump(0x100),
        d.class_dump(0x500, 0x100),
        d.instance(0x1001, 0x100, 0),
        d.instance(0x1002, 0x100, 0),
        d.heap_info(ord("Z"), 12),
        d.instance(0x1003, 0x300, 12),
        d.primitive_array(0x1004, BYTE, 10),
        d.root(0x89, 0x1001),
        d.root(0x8A, 0x1001),
        d.root(0x8B, 0x1001),
        d.root(0x8C, 0x1001),
        d.root(0x8D, 0x1001),
        d.root(0x8E, 0x1001, 3, 0xFFFFFFFF),
        d.root(0x90, 0x1001),
    )
    d.segment(
        d.instance(0x1005, 0x300, 12),  # still the zygote heap: a heap lasts across segments
        d.heap_info(ord("A"), 10),
        d.class_dump(0x300, 0x100, 12, statics=((13, LONG),), fields=((14, INT), (15, LONG))),
        d.class_dump(0x600, 0x100),
        *(d.instance(0x2000 + i, 0x300, 12) for i in range(3)),
        d.primitive_array(0x3000, BYTE, 100),
        d.primitive_array(0x3001, BYTE, 100),
        d.primitive_array(0x3002, BYTE, 50, nodata=True),
        d.object_array(0x3003, 0x600, 4),
        d.heap_info(ord("Z"), 999),  # unknown name string: named by the heap type
        d.primitive_array(0x3004, BYTE, 1),
        d.heap_info(ord("Q"), 998),
        d.instance(0x3005, 0x100, 0),
    )
    d.end()
    return d.bytes()


def android_expected(n: int) -> dict[str, dict[str, tuple[int, int]]]:
    """class -> heap -> (instances, shallow bytes) of android_dump, worked out by hand."""
    return {
        "java.lang.Object": {"default": (1, 0), "image": (2, 0), "heap 0x51": (1, 0)},
        "java.lang.Class": {"image": (2, 0), "app": (2, 8)},  # Thing's static long
        "com.example.Thing": {"zygote": (2, 24), "app": (3, 36)},
        "byte[]": {"zygote": (2, 11), "app": (3, 250)},  # the NODATA array counts its length
        "com.example.Thing[]": {"app": (1, 4 * n)},
    }


def histogram(summary: HprofSummary) -> dict[str, tuple[int, int]]:
    return {e.name: (e.instances, e.shallow_bytes) for e in summary.classes}


def per_heap(summary: HprofSummary) -> dict[str, dict[str, tuple[int, int]]]:
    return {
        e.name: {s.heap: (s.instances, s.shallow_bytes) for s in e.heaps} for e in summary.classes
    }


def read_in_pieces(data: bytes, cuts: list[int]) -> HprofSummary:
    reader = HprofReader()
    last = 0
    for cut in [*sorted(cuts), len(data)]:
        reader.feed(data[last:cut])
        last = cut
    return reader.finish()


# --------------------------------------------------------------------------- golden


@pytest.mark.parametrize("id_size", [4, 8])
@pytest.mark.parametrize("tag", [0x1C, 0x0C])
def test_standard_dump_histogram(id_size, tag):
    summary = summarise_stream([standard_dump(id_size, tag)])
    assert histogram(summary) == standard_expected(id_size)
    assert summary.version == "JAVA PROFILE 1.0.2"
    assert summary.id_size == id_size
    assert summary.timestamp_ms == 1_234_567
    assert summary.heap_info is False
    assert summary.heaps == ("default",)
    assert summary.instances == sum(n for n, _ in standard_expected(id_size).values())
    assert summary.shallow_bytes == sum(b for _, b in standard_expected(id_size).values())


@pytest.mark.parametrize("id_size", [4, 8])
def test_android_dump_histogram_per_heap(id_size):
    summary = summarise_stream([android_dump(id_size)])
    assert per_heap(summary) == android_expected(id_size)
    assert summary.version == "JAVA PROFILE 1.0.3"
    assert summary.heap_info is True
    assert summary.heaps == ("app", "image", "zygote", "default", "heap 0x51")
    thing = summary.by_name()["com.example.Thing"]
    assert (thing.instances, thing.shallow_bytes) == (5, 60)
    assert thing.in_heap("image").instances == 0


def test_rows_are_sorted_by_shallow_bytes_then_instances_then_name():
    summary = summarise_stream([standard_dump(8)])
    keys = [(-e.shallow_bytes, -e.instances, e.name) for e in summary.classes]
    assert keys == sorted(keys)
    assert summary.classes[0].name == "com.example.Node"  # 4 * 16 bytes
    assert [e.name for e in summary.top(2)] == ["com.example.Node", "java.lang.String"]
    assert summary.top(0) == ()


@pytest.mark.parametrize("dump", [standard_dump(4), android_dump(8)], ids=["1.0.2", "1.0.3"])
def test_one_byte_at_a_time_and_every_two_way_split(dump):
    whole = summarise_stream([dump])
    assert summarise_stream(dump[i : i + 1] for i in range(len(dump))) == whole
    for cut in range(len(dump) + 1):
        assert read_in_pieces(dump, [cut]) == whole, cut


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_split_gives_the_same_histogram(data):
    dump = data.draw(st.sampled_from([standard_dump(4), standard_dump(8), android_dump(4)]))
    cuts = data.draw(st.lists(st.integers(0, len(dump)), max_size=12))
    assert read_in_pieces(dump, cuts) == summarise_stream([dump])


def test_feed_takes_bytes_bytearray_and_memoryview():
    dump = android_dump(4)
    reader = HprofReader()
    reader.feed(bytearray(dump[:100]))
    reader.feed(memoryview(dump)[100:300])
    reader.feed(dump[300:])
    assert reader.bytes_read == len(dump)
    assert per_heap(reader.finish()) == android_expected(4)


def test_summarise_file_reads_in_chunks(tmp_path):
    path = tmp_path / "x.hprof"
    path.write_bytes(android_dump(4))
    for chunk in (1, 7, 4096):
        assert per_heap(summarise_file(path, chunk_size=chunk)) == android_expected(4)
    with pytest.raises(LocalProtocolError):
        summarise_file(path, chunk_size=0)


def test_a_class_named_after_its_load_class_record_and_one_never_named():
    d = Dump()
    d.load_class(1, 0x100, 1)  # its name string comes later, still before the heap dump
    d.string(1, "late/Name")
    d.segment(d.instance(0x1, 0x100, 4), d.instance(0x2, 0x999, 0))
    d.end()
    assert histogram(summarise_stream([d.bytes()])) == {"late.Name": (1, 4), "class@0x999": (1, 0)}


def test_long_strings_are_skipped_and_do_not_stop_the_reader():
    d = Dump()
    d.string(1, "x" * (2 << 20))  # 2 MiB: longer than any name, passed over
    d.string(2, "a/B")
    d.load_class(1, 0x100, 2)
    d.segment(d.instance(0x1, 0x100, 0))
    assert histogram(summarise_stream([d.bytes()])) == {"a.B": (1, 0)}


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("java/lang/String", "java.lang.String"),
        ("java.lang.String", "java.lang.String"),
        ("[I", "int[]"),
        ("[Z", "boolean[]"),
        ("[[J", "long[][]"),
        ("[Ljava/lang/Object;", "java.lang.Object[]"),
        ("[[Ljava.lang.String;", "java.lang.String[][]"),
        ("byte[]", "byte[]"),
        ("Outer$Inner", "Outer$Inner"),
        ("[X", "[X"),  # not a descriptor: left alone
        ("[L;", "[L;"),
    ],
)
def test_java_class_name(raw, name):
    assert java_class_name(raw) == name


# --------------------------------------------------------------------------- streaming memory


def test_a_huge_array_streams_through_without_being_buffered():
    d = Dump(ANDROID)
    d.string(1, "app")
    d.segment(d.heap_info(ord("A"), 1), d.primitive_array(0x10, LONG, 2 << 20))  # 16 MiB
    d.end()
    dump = d.bytes()
    view = memoryview(dump)
    tracemalloc.start()
    try:
        reader = HprofReader()
        for at in range(0, len(dump), 65536):
            reader.feed(view[at : at + 65536])
        summary = reader.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert histogram(summary) == {"long[]": (1, 16 << 20)}
    assert peak < 1 << 20, f"the reader held {peak} bytes while reading a 16 MiB segment"


# --------------------------------------------------------------------------- bad input


def _dump_with(*subs: bytes, id_size: int = 4) -> bytes:
    d = Dump(id_size=id_size)
    d.segment(*subs)
    return d.bytes()


def _fails(data: bytes) -> str:
    with pytest.raises(HprofFormatError) as info:
        summarise_stream([data])
    return str(info.value)


_D = Dump()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "the file is empty"),
        (b"JAVA PRO", "too short"),
        (b"GIF89a" + bytes(40), "does not start with 'JAVA PROFILE'"),
        (b"JAVA PROFILE 1.0.2" + b"x" * 64, "version string never ends"),
        (b"JAVA PROFILE 2.0\0" + bytes(12), "unsupported HPROF version"),
        (b"JAVA PROFILE 1.0.2\0" + struct.pack(">IQ", 3, 0), "identifier size 3"),
        (b"JAVA PROFILE 1.0.2\0" + struct.pack(">I", 4), "too short"),
        (_dump_with(b"\x42" + bytes(8)), "unknown heap dump sub-record type 0x42"),
        (
            _dump_with(_D.primitive_array(1, INT, 0)[:-1] + bytes([OBJECT])),
            "unknown element type 2",
        ),
        (_dump_with(_D.class_dump(1, statics=((5, 3),))), "unknown basic type 3"),
        (_dump_with(_D.instance(1, 2, 10)[:-1]), "runs past the end of its heap dump segment"),
        (_dump_with(_D.instance(1, 2, 10)[:10]), "runs past the end of its heap dump segment"),
        (_dump_with(_D.root(0x08, 1, 2, 3)[:-1]), "runs past the end of its heap dump segment"),
        (_dump_with(_D.class_dump(1, fields=((5, INT),))[:-1]), "class dump runs past the end"),
        (_dump_with(_D.heap_info(65, 1)[:-1]), "runs past the end of its heap dump segment"),
        (Dump().record(0x01, b"\0\0\0").bytes(), "string record of 3 bytes is too short"),
        (Dump().record(0x02, bytes(12)).bytes(), "class record of 12 bytes is too short"),
        (standard_dump(4)[:-20], "inside a heap dump segment: the dump is truncated"),
        (standard_dump(4)[:40], "inside a string record: the dump is truncated"),
        (standard_dump(4)[:35], "inside a record header: the dump is truncated"),
    ],
)
def test_bad_input_is_a_format_error_with_a_sentence(data, words):
    assert words in _fails(data)


def test_errors_say_where():
    message = _fails(_dump_with(b"\x42"))
    # header 31 bytes + record header 9: the sub-record starts at byte 40
    assert message.endswith("(at byte 40)"), message


def _record_ends(dump: bytes, id_size: int) -> set[int]:
    """Offsets where a record ends (test-side walk over the record headers)."""
    at = dump.index(b"\0") + 1 + 12
    ends = {at}
    while at < len(dump):
        (length,) = struct.unpack_from(">I", dump, at + 5)
        at += 9 + length
        ends.add(at)
    return ends


@pytest.mark.parametrize(("dump", "id_size"), [(standard_dump(8), 8), (android_dump(4), 4)])
def test_every_prefix_is_a_dump_or_a_format_error(dump, id_size):
    ends = _record_ends(dump, id_size)
    for length in range(len(dump)):
        reader = HprofReader()
        reader.feed(dump[:length])
        if length in ends:
            reader.finish()  # a shorter but whole dump
        else:
            with pytest.raises(HprofFormatError):
                reader.finish()


@settings(max_examples=500, deadline=None)
@given(st.data())
def test_damaged_dumps_give_a_summary_or_a_format_error_only(data):
    dump = bytearray(data.draw(st.sampled_from([standard_dump(4), android_dump(8)])))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(dump) - 1))
        dump[at] = data.draw(st.integers(0, 255))
    tail = data.draw(st.binary(max_size=64))
    with contextlib.suppress(HprofFormatError):
        summarise_stream([bytes(dump) + tail])


def test_misuse_is_a_local_error():
    reader = HprofReader()
    reader.feed(standard_dump(4))
    reader.finish()
    with pytest.raises(LocalProtocolError):
        reader.feed(b"x")
    with pytest.raises(LocalProtocolError):
        reader.finish()
    broken = HprofReader()
    with pytest.raises(HprofFormatError):
        broken.feed(b"NOT A DUMP")
    with pytest.raises(LocalProtocolError):
        broken.feed(b"more")


def test_the_reader_loads_no_io_library():
    code = (
        "import sys, ddmd.protocol.hprof, ddmd.protocol.hprofwire\n"
        "bad = [m for m in ('trio', 'structlog', 'adbutils', 'httpx', 'click', 'socket')"
        " if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "", f"ddmd.protocol.hprof pulled in: {out.stdout.strip()}"
