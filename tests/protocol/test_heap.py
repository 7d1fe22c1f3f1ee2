"""Heap segment decoding, assembly and summary (protocol.md 3.4 and 4)."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.protocol.heap import (
    HeapAssembler,
    Kind,
    ProblemCode,
    Run,
    Segment,
    SegmentKind,
    Solidity,
    decode_runs,
    parse_segment_data,
)

# V16, the whole chunk including its 8-byte chunk header (type 'HPSG', length 33).
V16 = bytes.fromhex(
    "4850534700000021000000010812c0000000000000000003920909010291ff91ff115780ff002b2100"
)
V16_DATA = V16[8:]
V16_USAGE = V16_DATA[17:]
HEADER = struct.Struct(">IBIII")


def chunk_data(heap_id, unit, start, offset, units, usage):
    return HEADER.pack(heap_id, unit, start, offset, units) + usage


# --------------------------------------------------------------------------- V16


def test_v16_chunk_framing():
    assert V16[:4] == b"HPSG"
    assert struct.unpack(">I", V16[4:8])[0] == len(V16_DATA) == 33


def test_v16_header():
    seg = parse_segment_data(V16_DATA)
    assert (seg.heap_id, seg.unit_size, seg.start, seg.offset, seg.units) == (
        1,
        8,
        0x12C00000,
        0,
        914,
    )
    assert seg.usage == bytes.fromhex("09090102 91ff91ff1157 80ff002b 2100")
    assert seg.pair_count == 8
    assert seg.address == 0x12C00000
    assert seg.end == 0x12C01C90


def test_v16_runs_match_the_table():
    runs = parse_segment_data(V16_DATA).runs()
    assert runs == (
        Run(0x12C00000, 10, Kind.CLASS_OBJECT, Solidity.HARD),
        Run(0x12C00050, 3, Kind.OBJECT, Solidity.HARD),
        Run(0x12C00068, 600, Kind.ARRAY_1, Solidity.HARD),  # 91 FF, 91 FF, 11 57 joined
        Run(0x12C01328, 300, Kind.OBJECT, Solidity.FREE),  # 80 FF, 00 2B joined
        Run(0x12C01C88, 1, Kind.ARRAY_4, Solidity.HARD),
    )
    # Last bytes covered per the 4.4 table.
    ends = [r.address + r.units * 8 - 1 for r in runs]
    assert ends == [0x12C0004F, 0x12C00067, 0x12C01327, 0x12C01C87, 0x12C01C8F]
    assert [r.free for r in runs] == [False, False, False, True, False]


def test_v16_decode_runs_from_fields_equals_parse():
    assert decode_runs(1, 8, 0x12C00000, 0, 914, V16_USAGE) == parse_segment_data(V16_DATA)


def test_v16_summary():
    s = parse_segment_data(V16_DATA).summary()
    assert s.heap_id == 1
    assert s.unit_size == 8
    assert s.bytes_used == (10 + 3 + 600 + 1) * 8 == 4912
    assert s.bytes_free == 2400
    assert s.largest_free_run == 2400
    assert s.free_run_count == 1
    assert s.fragmentation == 0.0
    assert s.bytes_by_kind == (
        (Kind.OBJECT, 24),
        (Kind.CLASS_OBJECT, 80),
        (Kind.ARRAY_1, 4800),
        (Kind.ARRAY_4, 8),
    )
    assert s.bytes_by_solidity == ((Solidity.FREE, 2400), (Solidity.HARD, 4912))
    assert s.object_count is None
    assert s.span == (0x12C00000, 0x12C01C90)
    assert s.segment_count == 1


def test_v16_through_the_assembler_as_hpsg_and_hpso():
    for kind, objects in ((SegmentKind.HPSG, None), (SegmentKind.HPSO, 4)):
        asm = HeapAssembler()
        assert asm.start(1) is None
        assert asm.segment(kind, 1, 8, 0x12C00000, 0, 914, V16_USAGE) == ()
        image = asm.end(1)
        assert image.complete
        assert image.problems == ()
        assert image.data_kind is kind
        assert image.unit_size == 8
        assert not image.native
        s = image.summary()
        assert (s.bytes_used, s.bytes_free, s.largest_free_run) == (4912, 2400, 2400)
        assert s.object_count == objects


# --------------------------------------------------------------------------- rejections


def reject(data):
    with pytest.raises(RemoteProtocolError) as info:
        parse_segment_data(data)
    return str(info.value)


def test_reject_drop_last_byte_odd_usage():
    msg = reject(V16_DATA[:-1])
    assert "4.3.2" in msg
    assert "odd usage data" in msg


def test_reject_drop_last_pair_one_unit_missing():
    msg = reject(V16_DATA[:-2])
    assert "4.3.3" in msg
    assert "913" in msg
    assert "fewer than the declared 914" in msg


def test_reject_declared_915_data_ends_early():
    msg = reject(chunk_data(1, 8, 0x12C00000, 0, 915, V16_USAGE))
    assert "4.3.3" in msg
    assert "fewer than the declared 915" in msg


def test_reject_declared_913_last_pair_overruns():
    msg = reject(chunk_data(1, 8, 0x12C00000, 0, 913, V16_USAGE))
    assert "4.3.2" in msg
    assert "pair 7" in msg
    assert "more units than declared" in msg


def test_reject_last_pair_with_partial_bit():
    msg = reject(V16_DATA[:-2] + bytes.fromhex("a100"))
    assert "4.3.4" in msg
    assert "0xa1" in msg
    assert "partial bit" in msg


def test_reject_unused_bit():
    data = bytearray(V16_DATA)
    data[17 + 2] = 0x41  # the state of pair 1 (01 02)
    msg = reject(bytes(data))
    assert "4.3.2" in msg
    assert "pair 1 state 0x41" in msg
    assert "unused bit" in msg


def test_reject_unit_size_zero():
    msg = reject(chunk_data(1, 0, 0x12C00000, 0, 914, V16_USAGE))
    assert "4.3.1" in msg
    assert "unit size 0" in msg


@pytest.mark.parametrize("size", [0, 1, 16])
def test_reject_short_header(size):
    msg = reject(V16_DATA[:size])
    assert "4.3.1" in msg
    assert f"{size} bytes" in msg


def test_earliest_violation_wins():
    # Pair 0 overruns (N=5, 10 units) before pair 1 shows a U bit: the walk stops at pair 0.
    msg = reject(chunk_data(1, 8, 0, 0, 5, bytes.fromhex("0909 4100")))
    assert "more units than declared" in msg
    # U bit and overrun on the same pair: U is checked first.
    msg = reject(chunk_data(1, 8, 0, 0, 5, bytes.fromhex("4909")))
    assert "unused bit" in msg
    # Odd length is reported only after the complete pairs passed.
    msg = reject(chunk_data(1, 8, 0, 0, 1, bytes.fromhex("4100 01")))
    assert "unused bit" in msg


def test_direct_construction_raises_local_error():
    with pytest.raises(LocalProtocolError, match=r"4\.3\.3"):
        Segment(1, 8, 0, 0, 915, V16_USAGE)
    with pytest.raises(LocalProtocolError, match="unit size 256"):
        Segment(1, 256, 0, 0, 914, V16_USAGE)
    with pytest.raises(LocalProtocolError, match="must be bytes"):
        Segment(1, 8, 0, 0, 914, bytearray(V16_USAGE))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="start address -1"):
        decode_runs(1, 8, -1, 0, 914, V16_USAGE)


def test_empty_segment_is_valid():
    seg = parse_segment_data(chunk_data(1, 8, 0x1000, 0, 0, b""))
    assert seg.runs() == ()
    s = seg.summary()
    assert (s.bytes_used, s.bytes_free, s.span, s.fragmentation) == (0, 0, None, 0.0)


def test_partial_piece_followed_by_another_state_ends_the_run():
    # 0x91 P piece, then a plain object: not joinable, so two runs (not rejected: 4.3 is silent).
    seg = decode_runs(1, 8, 0, 0, 256 + 3, bytes.fromhex("91ff 0102"))
    assert seg.runs() == (
        Run(0, 256, Kind.ARRAY_1, Solidity.HARD),
        Run(2048, 3, Kind.OBJECT, Solidity.HARD),
    )


def test_undefined_solidity_seven_is_carried_as_int():
    seg = decode_runs(1, 8, 0, 0, 1, bytes.fromhex("0f00"))
    (run,) = seg.runs()
    assert run.solidity == 7
    assert not isinstance(run.solidity, Solidity)
    assert seg.summary().bytes_by_solidity == ((7, 8),)


def test_adjacent_free_runs_merge_into_one_region():
    seg = decode_runs(1, 8, 0, 0, 2 + 3 + 1 + 4, bytes.fromhex("0001 0002 0100 0003"))
    s = seg.summary()
    assert (s.bytes_free, s.largest_free_run, s.free_run_count) == (72, 40, 2)
    assert s.fragmentation == pytest.approx(1 - 40 / 72)


# --------------------------------------------------------------------------- assembly

# Three contiguous pieces of one heap (offset 0, own start addresses: shipped layout).
P1 = (1, 8, 0x1000, 0, 4, bytes.fromhex("0101 0001"))  # obj 2u, free 2u
P2 = (1, 8, 0x1020, 0, 3, bytes.fromhex("0002"))  # free 3u
P3 = (1, 8, 0x1038, 0, 2, bytes.fromhex("0100 2100"))  # obj 1u, int[] 1u


def test_assembly_normal_series_joins_contiguous_pieces():
    asm = HeapAssembler()
    asm.start(1)
    for piece in (P1, P2, P3):
        assert asm.segment(SegmentKind.HPSG, *piece) == ()
    assert asm.open_heaps == ((1, False),)
    image = asm.end(1)
    assert asm.open_heaps == ()
    assert image.complete
    assert len(image.segments) == 3
    assert image.spans() == ((0x1000, 0x1048),)
    s = image.summary()
    assert s.bytes_used == 4 * 8
    assert s.bytes_free == 5 * 8
    assert s.largest_free_run == 40  # 2 units + 3 units across the piece boundary
    assert s.free_run_count == 1
    assert s.span == (0x1000, 0x1048)
    assert s.segment_count == 3


def test_assembly_gap_between_pieces_keeps_free_regions_apart():
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSG, *P1)
    asm.segment(SegmentKind.HPSG, 1, 8, 0x2000, 0, 3, bytes.fromhex("0002"))
    image = asm.end(1)
    assert image.spans() == ((0x1000, 0x1020), (0x2000, 0x2018))
    s = image.summary()
    assert (s.largest_free_run, s.free_run_count, s.bytes_free) == (24, 2, 40)
    assert s.span == (0x1000, 0x2018)


def test_assembly_offset_pieces_per_the_draft():
    # Draft: pieces of one segment share the start address and differ by offset (in units).
    asm = HeapAssembler()
    asm.start(1)
    first = bytes.fromhex("81ff 81ff 01ff")  # 0x300 units of hard objects (P-split)
    second = bytes.fromhex("00ff")  # 0x100 units free
    assert asm.segment(SegmentKind.HPSG, 1, 8, 0x40000000, 0, 0x300, first) == ()
    assert asm.segment(SegmentKind.HPSG, 1, 8, 0x40000000, 0x300, 0x100, second) == ()
    image = asm.end(1)
    a, b = image.segments
    assert b.address == 0x40000000 + 0x300 * 8 == a.end
    assert b.runs() == (Run(0x40001800, 0x100, Kind.OBJECT, Solidity.FREE),)
    assert image.spans() == ((0x40000000, 0x40002000),)
    s = image.summary()
    assert (s.bytes_used, s.bytes_free, s.largest_free_run) == (0x300 * 8, 0x800, 0x800)


def test_assembly_second_start_before_end():
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSG, *P1)
    cut = asm.start(1)
    assert cut is not None
    assert not cut.complete
    assert [p.code for p in cut.problems] == [ProblemCode.RESTARTED]
    assert "HPST for heap 1 before HPEN" in cut.problems[0].message
    assert len(cut.segments) == 1
    asm.segment(SegmentKind.HPSG, *P2)
    image = asm.end(1)
    assert image.complete
    assert image.problems == ()
    assert len(image.segments) == 1


def test_assembly_segment_without_start():
    asm = HeapAssembler()
    problems = asm.segment(SegmentKind.HPSG, *P1)
    assert [p.code for p in problems] == [ProblemCode.MISSING_START]
    asm.segment(SegmentKind.HPSG, *P2)
    image = asm.end(1)
    assert not image.complete  # the beginning of the dump may be missing
    assert image.problems == problems
    assert len(image.segments) == 2


def test_assembly_end_without_start():
    image = HeapAssembler().end(1)
    assert not image.complete
    assert image.segments == ()
    assert [p.code for p in image.problems] == [ProblemCode.END_WITHOUT_START]
    assert image.problems[0].message == "HPEN for heap 1 without HPST"
    s = image.summary()
    assert (s.bytes_used, s.bytes_free, s.unit_size, s.span) == (0, 0, None, None)


def test_assembly_end_never_comes():
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSG, *P1)
    asm.start(1, native=True)
    left = asm.abandon()
    assert [(i.heap_id, i.native, i.complete) for i in left] == [
        (1, False, False),
        (1, True, False),
    ]
    assert all(i.problems[-1].code is ProblemCode.NOT_ENDED for i in left)
    assert "NHEN for heap 1 never came" in left[1].problems[-1].message
    assert left[0].summary().bytes_used == 16
    assert asm.abandon() == ()
    assert asm.open_heaps == ()


def test_assembly_rejected_middle_segment_is_dropped_rest_used():
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSG, *P1)
    bad = asm.segment(SegmentKind.HPSG, 1, 8, 0x1020, 0, 4, bytes.fromhex("0002"))
    assert [p.code for p in bad] == [ProblemCode.SEGMENT_REJECTED]
    assert "4.3.3" in bad[0].message
    assert "0x00001020" in bad[0].message
    assert asm.segment(SegmentKind.HPSG, *P3) == ()
    image = asm.end(1)
    assert image.complete
    assert image.problems == bad
    assert len(image.segments) == 2
    assert image.summary().bytes_used == 32


def test_assembly_hpso_object_count():
    usage = bytes.fromhex("0101 0001 0900 0002 3900 2100 91ff 1100")  # 4 objects + non-object
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSO, 1, 8, 0, 0, 2 + 2 + 1 + 3 + 1 + 1 + 257, usage)
    s = asm.end(1).summary()
    assert s.object_count == 4  # object, class, int[], byte[] (257 units, one run)
    assert s.bytes_by_kind[-1] == (Kind.NON_OBJECT, 8)


def test_assembly_native_series_is_separate():
    asm = HeapAssembler()
    asm.start(1)
    asm.start(1, native=True)
    asm.segment(SegmentKind.NHSG, 1, 8, 0x7000, 0, 2, bytes.fromhex("3900 0000"))
    asm.segment(SegmentKind.HPSG, *P1)
    native = asm.end(1, native=True)
    managed = asm.end(1)
    assert native.native
    assert native.data_kind is SegmentKind.NHSG
    assert native.summary().bytes_by_kind == ((Kind.NON_OBJECT, 8),)
    assert managed.data_kind is SegmentKind.HPSG
    assert managed.summary().bytes_used == 16
    assert HeapAssembler().end(1, native=True).problems[0].message == (
        "NHEN for heap 1 without NHST"
    )


def test_assembly_unit_size_and_data_kind_changes_are_dropped():
    asm = HeapAssembler()
    asm.start(1)
    asm.segment(SegmentKind.HPSG, *P1)
    (p,) = asm.segment(SegmentKind.HPSG, 1, 16, 0x1020, 0, 3, bytes.fromhex("0002"))
    assert p.code is ProblemCode.UNIT_SIZE_CHANGED
    (p,) = asm.segment(SegmentKind.HPSO, *P2)
    assert p.code is ProblemCode.DATA_KIND_CHANGED
    image = asm.end(1)
    assert image.complete
    assert len(image.segments) == 1
    assert len(image.problems) == 2


def test_assembly_heaps_are_independent():
    asm = HeapAssembler()
    asm.start(1)
    asm.start(2)
    asm.segment(SegmentKind.HPSG, 2, 8, 0, 0, 1, bytes.fromhex("0100"))
    assert asm.end(1).segments == ()
    assert len(asm.end(2).segments) == 1


# --------------------------------------------------------------------------- properties
#
# A test-side encoder (independent of heap.py) and a slow reference decoder that walks
# the 4.3 rule literally.


def encode(runs):
    """runs: (state without P, units >= 1) in order -> usage pairs, P-split every 256."""
    out = bytearray()
    for state, units in runs:
        while units > 256:
            out += bytes((state | 0x80, 255))
            units -= 256
        out += bytes((state, units - 1))
    return bytes(out)


def reference_rule(unit_size, declared, usage):
    """The rule violated first (a keyword heap.py's message must contain), or None."""
    if unit_size == 0:
        return "unit size 0"
    left = declared
    last = None
    for i in range(0, len(usage), 2):
        if i + 1 >= len(usage):
            return "odd usage data"
        state, n = usage[i], usage[i + 1]
        if state & 0x40:
            return "unused bit"
        if n + 1 > left:
            return "more units than declared"
        left -= n + 1
        last = state
    if left:
        return "fewer than the declared"
    if last is not None and last & 0x80:
        return "partial bit"
    return None


def expected_figures(pieces, unit):
    """pieces: [(address, [(state, units), ...])] in arrival order -> summary figures."""
    used = free = 0
    by_kind: dict[int, int] = {}
    regions: list[int] = []
    open_free = 0
    prev_end = None
    objects = 0
    for address, runs in pieces:
        total = sum(u for _, u in runs)
        if total == 0:
            continue
        if address != prev_end and open_free:
            regions.append(open_free)
            open_free = 0
        for state, units in runs:
            size = units * unit
            if state & 7 == 0:
                free += size
                open_free += units
            else:
                used += size
                by_kind[state >> 3] = by_kind.get(state >> 3, 0) + size
                objects += state >> 3 != 7
                if open_free:
                    regions.append(open_free)
                    open_free = 0
        prev_end = address + total * unit
    if open_free:
        regions.append(open_free)
    largest = max(regions, default=0) * unit
    return {
        "bytes_used": used,
        "bytes_free": free,
        "bytes_by_kind": tuple(sorted(by_kind.items())),
        "largest_free_run": largest,
        "free_run_count": len(regions),
        "fragmentation": 1 - largest / free if free else 0.0,
        "object_count": objects,
    }


states = st.integers(0, 0x3F)  # kind and solidity; U and P clear
runs_st = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([0x00, 0x01, 0x09, 0x11, 0x21, 0x39]), states),
        st.one_of(st.integers(1, 8), st.integers(1, 1200)),
    ),
    max_size=16,
)


@given(
    runs=runs_st,
    unit=st.integers(1, 255),
    start=st.integers(0, 0xFFFFFFFF),
    offset=st.integers(0, 0xFFFFFFFF),
)
def test_round_trip_single_segment(runs, unit, start, offset):
    usage = encode(runs)
    total = sum(u for _, u in runs)
    seg = decode_runs(7, unit, start, offset, total, usage)
    address = start + offset * unit
    expected = []
    for state, units in runs:
        expected.append(Run(address, units, Kind(state >> 3), state & 7))
        address += units * unit
    assert seg.runs() == tuple(expected)
    s = seg.summary()
    figures = expected_figures([(start + offset * unit, runs)], unit)
    figures["object_count"] = None
    assert {k: getattr(s, k) for k in figures} == figures
    assert s.span == ((start + offset * unit, address) if total else None)


@given(
    runs=runs_st,
    cuts=st.sets(st.integers(0, 16), max_size=4),
    gaps=st.integers(0, 31),
    hpso=st.booleans(),
)
def test_round_trip_assembled_pieces(runs, cuts, gaps, hpso):
    # Cut one run list into pieces; a set bit in `gaps` leaves a hole before that piece.
    bounds = [0, *sorted(c for c in cuts if c <= len(runs)), len(runs)]
    parts = [runs[lo:hi] for lo, hi in itertools.pairwise(bounds)]
    kind = SegmentKind.HPSO if hpso else SegmentKind.HPSG
    asm = HeapAssembler()
    asm.start(3)
    address = 0x12C00000
    pieces = []
    for i, part in enumerate(parts):
        if gaps >> i & 1:
            address += 0x100
        total = sum(u for _, u in part)
        assert asm.segment(kind, 3, 8, address, 0, total, encode(part)) == ()
        pieces.append((address, part))
        address += total * 8
    image = asm.end(3)
    assert image.complete
    assert len(image.segments) == len(parts)
    s = image.summary()
    figures = expected_figures(pieces, 8)
    if not hpso:
        figures["object_count"] = None
    assert {k: getattr(s, k) for k in figures} == figures
    flat = [r for seg in image.segments for r in seg.runs()]
    assert flat == [
        Run(a, u, Kind(state >> 3), state & 7)
        for address, part in pieces
        for state, u, a in _addressed(address, part, 8)
    ]


def _addressed(address, runs, unit):
    for state, units in runs:
        yield state, units, address
        address += units * unit


@given(data=st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(data):
    try:
        seg = parse_segment_data(data)
    except RemoteProtocolError:
        return
    assert sum(r.units for r in seg.runs()) == seg.units
    s = seg.summary()
    assert s.bytes_used + s.bytes_free == seg.units * seg.unit_size


pairs_st = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([0x00, 0x80, 0x01, 0x81, 0x41, 0xC1]), st.integers(0, 255)),
        st.integers(0, 255),
    ),
    max_size=30,
)


@given(
    pairs=pairs_st,
    unit=st.sampled_from([0, 1, 8]),
    delta=st.sampled_from([0, 0, 0, -1, 1, -300]),
    odd=st.sampled_from([b"", b"", b"\x01"]),
)
def test_fuzz_rule_matches_reference_walk(pairs, unit, delta, odd):
    usage = b"".join(bytes(p) for p in pairs) + odd
    declared = max(0, sum(n + 1 for _, n in pairs) + delta)
    want = reference_rule(unit, declared, usage)
    try:
        seg = decode_runs(1, unit, 0x1000, 0, declared, usage)
    except RemoteProtocolError as exc:
        message = str(exc)
    else:
        message = None
    if message is not None:
        assert want is not None
        assert want in message
        return
    assert want is None
    runs = seg.runs()
    assert sum(r.units for r in runs) == declared
    s = seg.summary()
    assert s.bytes_used + s.bytes_free == declared * unit
    # Logical runs: a P piece joins the next pair only when the states match.
    expected_runs = 0
    for i, (state, _) in enumerate(pairs):
        if not state & 0x80 or (state ^ pairs[i + 1][0]) & 0x3F:
            expected_runs += 1
    assert len(runs) == expected_runs
    # Free regions straight from the pairs.
    regions = []
    current = 0
    for state, n in pairs:
        if state & 7 == 0:
            current += n + 1
        elif current:
            regions.append(current)
            current = 0
    if current:
        regions.append(current)
    assert s.free_run_count == len(regions)
    assert s.largest_free_run == max(regions, default=0) * unit


def test_assembly_unknown_segment_kind_is_api_misuse():
    with pytest.raises(LocalProtocolError, match="0x48504946 is not a heap segment"):
        HeapAssembler().segment(0x48504946, *P1)  # 'HPIF'
