"""ddmd's .trace parser (``ddmd.protocol.trace``) on hand-built traces: every format version,
one and two clocks, the streaming layout, dmtracedump's rules, and bad input."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.trace import (
    Action,
    DataStarted,
    HeaderRead,
    MethodNamed,
    RecordsRead,
    ThreadNamed,
    TraceDecoder,
    TraceFormatError,
    TraceProfile,
    iter_records,
    parse_trace,
    read_trace,
    top_methods,
)
from tests.trace import traces
from tests.trace.traces import (
    ENTER,
    EXIT,
    EXPECTED,
    MAIN,
    NAMES,
    TOTALS,
    WALL_FACTOR,
    WORKER,
    A,
    B,
    C,
    D,
    build,
    build_streaming,
    data_header,
    record,
    text_header,
)

# (version, clock option, record size or None, clock names, line numbers in *methods)
LAYOUTS = [
    pytest.param(1, None, None, ("thread-cpu",), True, id="v1-no-clock-key"),
    pytest.param(2, "wall", None, ("wall",), True, id="v2-wall"),
    pytest.param(2, "thread-cpu", None, ("thread-cpu",), False, id="v2-thread-cpu"),
    pytest.param(3, "thread-cpu", 10, ("thread-cpu",), False, id="v3-single"),
    pytest.param(3, "dual", 14, ("thread-cpu", "wall"), False, id="v3-dual"),
    pytest.param(3, "dual", 18, ("thread-cpu", "wall"), False, id="v3-dual-wide-records"),
]


def check_scenario(profile: TraceProfile, clocks: tuple[str, ...]) -> None:
    """The numbers of ``traces.EXPECTED`` for every clock (the second one is 3x)."""
    assert profile.clocks == clocks
    factors = (1, WALL_FACTOR)[: len(clocks)]
    assert profile.records == len(traces.EVENTS)
    by_tid = {t.thread.tid: t for t in profile.threads}
    assert sorted(by_tid) == [MAIN, WORKER]
    assert by_tid[MAIN].thread.name == "main"
    assert by_tid[WORKER].thread.name == "worker"
    for tid, expected in EXPECTED.items():
        thread = by_tid[tid]
        assert thread.total == tuple(TOTALS[tid] * f for f in factors)
        got = {s.method.id: s for s in thread.methods}
        assert sorted(got) == sorted(expected)
        for method, (calls, inclusive, exclusive) in expected.items():
            stats = got[method]
            assert stats.method.full_name == NAMES[method]
            assert stats.calls == calls
            assert stats.recursive_calls == 0
            assert stats.inclusive == tuple(inclusive * f for f in factors)
            assert stats.exclusive == tuple(exclusive * f for f in factors)
    assert by_tid[WORKER].unmatched_exits == 1
    assert by_tid[WORKER].open_calls == 2
    assert by_tid[MAIN].unmatched_exits == by_tid[MAIN].open_calls == 0
    overall = {s.method.id: (s.calls, s.inclusive[0], s.exclusive[0]) for s in profile.methods}
    assert overall == {A: (2, 62, 37), B: (2, 25, 17), C: (2, 8, 8), D: (1, 5, 0)}
    assert profile.total == tuple(65 * f for f in factors)


@pytest.mark.parametrize(("version", "clock", "size", "clocks", "lines"), LAYOUTS)
def test_each_layout_gives_the_scenario_numbers(version, clock, size, clocks, lines):
    data = build(version, clock, record_size=size, line_numbers=lines)
    profile = parse_trace(data)
    check_scenario(profile, clocks)
    assert profile.data.version == version
    assert profile.data.streaming is False
    assert profile.data.record_size == (size or {1: 9, 2: 10}[version])
    assert profile.header is not None
    assert profile.header.vm == "art"
    assert profile.header.pid == 4242
    assert profile.header.num_method_calls == len(traces.EVENTS)
    assert profile.data.start_usec == 0x0005_F000_1234_5678


def test_method_lines_with_and_without_line_numbers():
    six = parse_trace(build(2, "wall", line_numbers=True))
    five = parse_trace(build(2, "wall", line_numbers=False))
    method = {m.id: m for m in six.known_methods}[B]
    assert (method.class_name, method.name, method.signature) == ("com.example.App", "b", "(I)I")
    assert (method.source, method.line) == ("App.java", B)
    method = {m.id: m for m in five.known_methods}[B]
    assert (method.source, method.line) == ("App.java", None)


# A literal vector, written out by hand: format 3, dual clock, one thread (5 "t"), one
# method (0x4 Foo.bar()V) entered at cpu 1 / wall 2 and left at cpu 11 / wall 40.
GOLDEN_V3_DUAL = (
    b"*version\n3\nclock=dual\n*threads\n5\tt\n*methods\n0x4\tFoo\tbar\t()V\tFoo.java\n*end\n"
    b"SLOW\x03\x00\x20\x00"
    + bytes(8)
    + b"\x0e\x00"
    + bytes(14)
    # thread 5, method 0x4 enter, cpu 1, wall 2
    + b"\x05\x00\x04\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00"
    # thread 5, method 0x4 exit (0x5), cpu 11, wall 40
    + b"\x05\x00\x05\x00\x00\x00\x0b\x00\x00\x00\x28\x00\x00\x00"
)


def test_golden_literal_vector():
    profile = parse_trace(GOLDEN_V3_DUAL)
    assert profile.clocks == ("thread-cpu", "wall")
    assert profile.data.offset == 32
    [thread] = profile.threads
    assert thread.thread.label == "5 t"
    [stats] = thread.methods
    assert stats.method.full_name == "Foo.bar()V"
    assert (stats.calls, stats.inclusive, stats.exclusive) == (1, (10, 38), (10, 38))
    assert list(iter_records(GOLDEN_V3_DUAL)) == [
        (5, Action.ENTER, 4, (1, 2)),
        (5, Action.EXIT, 4, (11, 40)),
    ]


def test_streaming_layout_gives_the_same_profile_as_the_ordinary_one():
    plain = parse_trace(build(3, "dual"))
    streaming = parse_trace(build_streaming())
    check_scenario(streaming, ("thread-cpu", "wall"))
    assert streaming.data.streaming is True
    assert streaming.data.version == 3
    assert streaming.header is not None
    assert streaming.header.clock == "dual"
    assert streaming.methods == plain.methods
    assert streaming.threads == plain.threads


def test_streaming_trace_without_its_summary_is_read():
    # ART before Android 8 wrote the summary to a separate .sec file.
    profile = parse_trace(build_streaming(summary=False))
    check_scenario(profile, ("thread-cpu", "wall"))
    assert profile.header is None
    assert profile.clock == "dual"


def test_streaming_single_clock():
    profile = parse_trace(build_streaming(dual=False))
    check_scenario(profile, ("thread-cpu",))


def test_decoder_events_of_the_streaming_layout():
    events = TraceDecoder().feed(build_streaming())
    kinds = [type(e) for e in events]
    assert kinds[0] is DataStarted
    assert kinds[-1] is HeaderRead
    assert ThreadNamed in kinds
    assert MethodNamed in kinds
    # a method is named before the first record that uses it
    first_record = kinds.index(RecordsRead)
    assert kinds.index(MethodNamed) < first_record
    assert isinstance(events[-1], HeaderRead)
    assert events[-1].summary is True


@pytest.mark.parametrize("data", [build(1, None), build(3, "dual"), build_streaming()])
def test_any_split_gives_the_same_profile(data):
    whole = parse_trace(data)
    assert read_trace(data[i : i + 1] for i in range(len(data))) == whole
    assert read_trace([data, data[:0]]) == whole
    assert read_trace(data[i : i + 7] for i in range(0, len(data), 7)) == whole


@given(st.data())
def test_split_anywhere_property(draw):
    data = build_streaming() if draw.draw(st.booleans()) else build(3, "dual")
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=8)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert read_trace(pieces) == parse_trace(data)


# --------------------------------------------------------------------------- dmtracedump rules


def events_trace(*events: tuple[int, int, int, int]) -> TraceProfile:
    return parse_trace(build(3, "thread-cpu", events=events))


def test_recursion_counts_calls_but_not_inclusive_time_twice():
    profile = events_trace(
        (MAIN, A, ENTER, 0),
        (MAIN, A, ENTER, 10),
        (MAIN, A, ENTER, 20),
        (MAIN, A, EXIT, 25),
        (MAIN, A, EXIT, 30),
        (MAIN, A, EXIT, 40),
    )
    [stats] = profile.methods
    assert (stats.calls, stats.recursive_calls) == (3, 2)
    assert stats.inclusive == (40,)
    assert stats.exclusive == (40,)
    [root] = profile.threads[0].calls
    assert root.calls == 1
    assert root.inclusive == (40,)
    [inner] = root.children
    assert inner.calls == 1
    assert inner.inclusive == (20,)


def test_call_tree_merges_calls_of_one_path():
    profile = parse_trace(build(3, "thread-cpu"))
    main = next(t for t in profile.threads if t.thread.tid == MAIN)
    [a] = main.calls
    assert (a.method.id, a.calls, a.inclusive, a.exclusive) == (A, 1, (50,), (25,))
    [b] = a.children
    assert (b.method.id, b.calls, b.inclusive, b.exclusive) == (B, 2, (25,), (17,))
    [c] = b.children
    assert (c.method.id, c.calls, c.inclusive) == (C, 1, (8,))
    worker = next(t for t in profile.threads if t.thread.tid == WORKER)
    assert [(n.method.id, n.calls, n.inclusive) for n in worker.calls] == [
        (D, 1, (5,)),
        (A, 1, (12,)),
    ]


def test_unroll_is_an_exit():
    profile = events_trace((MAIN, A, ENTER, 0), (MAIN, A, traces.UNROLL, 9))
    [stats] = profile.methods
    assert (stats.calls, stats.inclusive) == (1, (9,))


def test_unknown_method_ids_are_kept_apart():
    profile = events_trace((MAIN, 0x400, ENTER, 0), (MAIN, 0x400, EXIT, 9))
    [stats] = profile.methods
    assert stats.method.full_name == "(unknown method 0x400)"
    assert stats.method.known is False
    assert stats.calls == 1


def test_time_going_backwards_counts_as_zero():
    profile = events_trace((MAIN, A, ENTER, 50), (MAIN, B, ENTER, 40), (MAIN, B, EXIT, 45))
    got = {s.method.id: s for s in profile.methods}
    assert got[B].inclusive == (5,)
    assert got[A].exclusive == (0,)


def test_top_methods_orders_by_time_then_name():
    profile = parse_trace(build(3, "dual"))
    inclusive = [s.method.id for s in top_methods(profile.methods, "inclusive", clock=1)]
    assert inclusive == [A, B, C, D]
    exclusive = [s.method.id for s in top_methods(profile.methods, "exclusive", clock=0, limit=2)]
    assert exclusive == [A, B]
    assert profile.time_clock == 1  # wall


# --------------------------------------------------------------------------- bad input


def fails(data: bytes, *words: str) -> str:
    with pytest.raises(TraceFormatError) as info:
        parse_trace(data)
    message = str(info.value)
    for word in words:
        assert word in message, message
    return message


def test_empty_file():
    fails(b"", "empty")


def test_not_a_trace():
    fails(b"PK\x03\x04 a zip file", "not a method trace", "'*version' or 'SLOW'")


def test_text_header_without_end():
    fails(text_header(3, "dual").replace(b"*end\n", b""), "no *end line")


@pytest.mark.parametrize("cut", [1, 5, 13, 14, 20])
def test_truncated_records(cut):
    data = build(3, "dual")
    fails(data[:-cut], "cut short")


def test_records_missing_at_a_record_boundary():
    data = build(3, "dual")
    fails(data[:-28], "cut short", "header says 11 records", "holds 9")


def test_truncated_binary_header():
    data = text_header(3, "dual") + data_header(3)[:20]
    fails(data, "binary header")


def test_no_binary_part():
    fails(text_header(3, "dual"), "no binary data")


def test_wrong_magic():
    data = build(3, "dual").replace(b"SLOW", b"FAST", 1)
    fails(data, "magic", "SLOW")


def test_exit_without_enter_of_that_method():
    # B exits while A is the innermost open call: dmtracedump stops with "does not match stack".
    message = fails(
        build(3, "thread-cpu", events=((MAIN, A, ENTER, 0), (MAIN, B, EXIT, 5))),
        "thread 7 exits com.example.App.b(I)I",
        "com.example.App.a()V",
    )
    assert message.startswith("record 2:")


@pytest.mark.parametrize(
    ("clock", "size", "words"),
    [
        ("thread-cpu", 6, ("record size of 6 bytes is too small",)),
        ("dual", 10, ("clock=dual needs records of at least 14 bytes",)),
        (None, 9, ("record size of 9 bytes",)),
    ],
)
def test_bad_record_size(clock, size, words):
    data = text_header(3, clock) + data_header(3, record_size=size)
    fails(data, *words)


def test_version_mismatch_between_text_and_binary():
    data = text_header(2, "wall") + data_header(3, record_size=10)
    fails(data, "text header says format version 2", "binary data says 3")


@pytest.mark.parametrize("version", [4, 5])
def test_newer_art_format_is_refused_plainly(version):
    fails(
        text_header(version, "dual") + data_header(version), f"format version {version}", "1 to 3"
    )


def test_unknown_version():
    fails(text_header(9, "dual"), "format version 9 is not supported")


def test_dual_clock_needs_version_3():
    fails(text_header(2, "dual") + data_header(2), "clock=dual needs format version 3")


def test_records_offset_inside_the_header():
    fails(text_header(3, "dual") + data_header(3, offset=10) + bytes(32), "inside its own 18 bytes")


def test_action_3_is_refused():
    data = text_header(3, "thread-cpu") + data_header(3, record_size=10)
    data += record(3, MAIN, A, 3, (1,), 10)
    fails(data, "action 3")


def test_data_only_file_is_refused():
    fails(data_header(3) + record(3, MAIN, A, ENTER, (1, 2), 14), "without the text header")


def test_streaming_garbage_after_the_summary():
    fails(build_streaming() + b"\x00", "follow the summary")


def test_streaming_unknown_block_code():
    data = data_header(3, flag=0xF0) + struct.pack("<HB", 0, 7) + bytes(8)
    fails(data, "unknown block code 7")


def test_streaming_summary_that_contradicts_the_records():
    text = text_header(3, "wall", streaming_summary=True)
    data = data_header(3, record_size=14, flag=0xF0) + struct.pack("<HBI", 0, 3, len(text)) + text
    fails(data, "clock=wall", "14-byte records")


def test_streaming_block_cut_short():
    data = build_streaming(summary=False) + struct.pack("<HBH", 0, 1, 40) + b"0x4\t"
    fails(data, "cut short")


def test_bad_method_and_thread_lines():
    header = text_header(3, "dual").replace(b"0x10\t", b"zz\t")
    fails(header + data_header(3), "'zz' is not a method id")
    header = text_header(3, "dual").replace(b"7\tmain", b"seven")
    fails(header + data_header(3), "line", "is not a thread line")


def test_feed_after_close_is_a_local_error():
    decoder = TraceDecoder()
    decoder.feed(build(3, "dual"))
    decoder.close()
    with pytest.raises(Exception, match="after close"):
        decoder.feed(b"x")


def error_of(data: bytes) -> str | None:
    """None when ``data`` parses; the message of a TraceFormatError (any other exception
    fails the test)."""
    try:
        parse_trace(data)
    except TraceFormatError as exc:
        return str(exc)
    return None


VALID = [build(1, None), build(2, "wall"), build(3, "dual"), build_streaming(), GOLDEN_V3_DUAL]


@given(st.sampled_from(VALID), st.data())
def test_damaged_traces_only_raise_trace_format_error(data, draw):
    damaged = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        where = draw.draw(st.integers(0, len(damaged) - 1))
        damaged[where] = draw.draw(st.integers(0, 255))
    cut = draw.draw(st.integers(0, len(damaged)))
    message = error_of(bytes(damaged[:cut]))
    assert message is None or message


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_trace_format_error(data):
    for prefix in (b"", b"*version\n", b"SLOW\xf3\x00"):
        message = error_of(prefix + data)
        assert message is None or message


def test_importing_the_parser_loads_no_io_libraries():
    code = (
        "import sys, ddmd.protocol.trace\n"
        "bad = ('trio', 'structlog', 'adbutils', 'httpx', 'click', 'socket')\n"
        "print(','.join(m for m in bad if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""
