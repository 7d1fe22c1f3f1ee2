"""Event requests and event packets: golden vectors typed in by hand from the layouts of OpenJDK's
jdwp.spec (never produced by ddmd's encoder), error cases, and Hypothesis round trips.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ddmd.protocol.jdwp import EventKind, IdSizes
from ddmd.protocol.jdwpevents import (
    CLEARABLE_KINDS,
    Composite,
    Event,
    EventRequestClear,
    EventRequestSet,
    UnknownEventKind,
    decode_composite,
    decode_int,
    decode_object_id,
    encode_composite,
    encode_int,
    encode_object_id,
    event_thread,
    peek_composite,
    strongest,
)

HOTSPOT = IdSizes(8, 8, 8, 8, 8)
DALVIK = IdSizes(4, 4, 8, 8, 8)  # field and method ids of 4 bytes (protocol.md 1.5)

THREAD_1 = "0000000000000001"
# A location: type tag 1 (class), class 0x10, method 0x20, index 5 (8-byte ids).
LOCATION = "01" + "0000000000000010" + "0000000000000020" + "0000000000000005"
# The same with Dalvik's 4-byte method ids.
LOCATION_4 = "01" + "0000000000000010" + "00000020" + "0000000000000005"
OBJECT_2 = "4c" + "0000000000000002"  # a tagged object: 'L', id 2
FOO = "00000005" + "4c466f6f3b"  # the string "LFoo;"


def fields(*parts: str) -> str:
    """One event or packet, field by field (hex)."""
    return "".join(parts)


# (name, Event.Composite body in hex, id sizes, (policy, ((kind, request, body hex), ...)))
VECTORS = [
    (
        "VM_START of a suspend=y JVM (protocol.md V27)",
        fields("02", "00000001", "5a", "00000000", THREAD_1),
        None,
        (2, ((90, 0, THREAD_1),)),
    ),
    (
        "VM_DEATH (protocol.md V26)",
        fields("00", "00000001", "63", "00000000"),
        None,
        (0, ((99, 0, ""),)),
    ),
    (
        "two breakpoints of two requests at one location",
        fields(
            "02",
            "00000002",
            fields("02", "00000005", THREAD_1, LOCATION),
            fields("02", "00000007", THREAD_1, LOCATION),
        ),
        HOTSPOT,
        (2, ((2, 5, THREAD_1 + LOCATION), (2, 7, THREAD_1 + LOCATION))),
    ),
    (
        "step, method entry and method exit with an int return value",
        fields(
            "01",
            "00000003",
            fields("01", "00000009", THREAD_1, LOCATION),
            fields("28", "0000000a", THREAD_1, LOCATION),
            fields("2a", "0000000b", THREAD_1, LOCATION, "49", "0000002a"),
        ),
        HOTSPOT,
        (
            1,
            (
                (1, 9, THREAD_1 + LOCATION),
                (40, 10, THREAD_1 + LOCATION),
                (42, 11, fields(THREAD_1, LOCATION, "49", "0000002a")),
            ),
        ),
    ),
    (
        "method exits returning void, an object and a long",
        fields(
            "00",
            "00000003",
            fields("2a", "00000001", THREAD_1, LOCATION, "56"),
            fields("2a", "00000002", THREAD_1, LOCATION, "4c", "00000000000000ff"),
            fields("2a", "00000003", THREAD_1, LOCATION, "4a", "0000000000000007"),
        ),
        HOTSPOT,
        (
            0,
            (
                (42, 1, fields(THREAD_1, LOCATION, "56")),
                (42, 2, fields(THREAD_1, LOCATION, "4c", "00000000000000ff")),
                (42, 3, fields(THREAD_1, LOCATION, "4a", "0000000000000007")),
            ),
        ),
    ),
    (
        "an exception with its catch location",
        fields("02", "00000001", "04", "00000004", THREAD_1, LOCATION, OBJECT_2, LOCATION),
        None,  # one event: no sizes needed
        (2, ((4, 4, fields(THREAD_1, LOCATION, OBJECT_2, LOCATION)),)),
    ),
    (
        "exception and thread start (sizes needed)",
        fields(
            "02",
            "00000002",
            fields("04", "00000004", THREAD_1, LOCATION, OBJECT_2, LOCATION),
            fields("06", "00000003", THREAD_1),
        ),
        HOTSPOT,
        (2, ((4, 4, fields(THREAD_1, LOCATION, OBJECT_2, LOCATION)), (6, 3, THREAD_1))),
    ),
    (
        "two class prepares of one class (signature LFoo;, status 7)",
        fields(
            "00",
            "00000002",
            fields("08", "00000002", THREAD_1, "01", "0000000000000033", FOO, "00000007"),
            fields("08", "00000006", THREAD_1, "01", "0000000000000033", FOO, "00000007"),
        ),
        HOTSPOT,
        (
            0,
            (
                (8, 2, fields(THREAD_1, "01", "0000000000000033", FOO, "00000007")),
                (8, 6, fields(THREAD_1, "01", "0000000000000033", FOO, "00000007")),
            ),
        ),
    ),
    (
        "two class unloads",
        fields("00", "00000002", fields("09", "00000002", FOO), fields("09", "00000003", FOO)),
        HOTSPOT,
        (0, ((9, 2, FOO), (9, 3, FOO))),
    ),
    (
        "monitor wait (timeout 1000) and waited (timed out), Dalvik id sizes",
        fields(
            "01",
            "00000002",
            fields("2d", "00000001", THREAD_1, OBJECT_2, LOCATION_4, "00000000000003e8"),
            fields("2e", "00000002", THREAD_1, OBJECT_2, LOCATION_4, "01"),
        ),
        DALVIK,
        (
            1,
            (
                (45, 1, fields(THREAD_1, OBJECT_2, LOCATION_4, "00000000000003e8")),
                (46, 2, fields(THREAD_1, OBJECT_2, LOCATION_4, "01")),
            ),
        ),
    ),
    (
        "monitor contended enter and entered",
        fields(
            "01",
            "00000002",
            fields("2b", "00000001", THREAD_1, OBJECT_2, LOCATION),
            fields("2c", "00000002", THREAD_1, OBJECT_2, LOCATION),
        ),
        HOTSPOT,
        (
            1,
            (
                (43, 1, fields(THREAD_1, OBJECT_2, LOCATION)),
                (44, 2, fields(THREAD_1, OBJECT_2, LOCATION)),
            ),
        ),
    ),
    (
        "field access, and a modification to a char, Dalvik id sizes (4-byte field ids)",
        fields(
            "02",
            "00000002",
            fields("14", "00000001", THREAD_1, LOCATION_4, "01", "0000000000000010"),
            fields("00000030", OBJECT_2),
            fields("15", "00000002", THREAD_1, LOCATION_4, "01", "0000000000000010"),
            fields("00000030", OBJECT_2, "43", "0041"),
        ),
        DALVIK,
        (
            2,
            (
                (
                    20,
                    1,
                    fields(THREAD_1, LOCATION_4, "01", "0000000000000010", "00000030", OBJECT_2),
                ),
                (
                    21,
                    2,
                    fields(THREAD_1, LOCATION_4, "01", "0000000000000010", "00000030", OBJECT_2)
                    + "430041",
                ),
            ),
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "hexs", "sizes", "expected"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_composite_vectors_decode_and_encode_back(name, hexs, sizes, expected):
    raw = bytes.fromhex(hexs)
    composite = decode_composite(raw, sizes)
    policy, events = expected
    assert composite.suspend_policy == policy
    assert [(e.kind, e.request_id, e.body.hex()) for e in composite.events] == list(events)
    assert encode_composite(composite) == raw


@pytest.mark.parametrize(
    ("name", "hexs", "sizes", "expected"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_composite_vectors_cut_short_are_refused(name, hexs, sizes, expected):
    raw = bytes.fromhex(hexs)
    for cut in range(len(raw)):
        if len(expected[1]) == 1 and cut >= 10:
            continue  # one event: its data is whatever follows, any length
        with pytest.raises(ProtocolError):
            decode_composite(raw[:cut], sizes)


def test_a_byte_after_the_last_event_is_refused():
    raw = bytes.fromhex(VECTORS[2][1]) + b"\x00"
    with pytest.raises(RemoteProtocolError, match="1 bytes after its 2 events"):
        decode_composite(raw, HOTSPOT)


def test_peek_reads_the_first_event_without_sizes():
    raw = bytes.fromhex(VECTORS[2][1])
    assert peek_composite(raw) == (2, 2, 2, 5)
    with pytest.raises(RemoteProtocolError):
        peek_composite(raw[:9])


def test_an_event_of_unknown_length_makes_a_composite_unsplittable():
    user_defined = fields("05", "00000001", THREAD_1)
    raw = bytes.fromhex(fields("00", "00000002", user_defined, user_defined))
    with pytest.raises(UnknownEventKind) as caught:
        decode_composite(raw, HOTSPOT)
    assert caught.value.kind == EventKind.USER_DEFINED
    # Alone in its composite, it needs no length.
    single = fields("00", "00000001", user_defined)
    (event,) = decode_composite(bytes.fromhex(single), None).events
    assert (event.kind, event.body.hex()) == (5, THREAD_1)


def test_a_value_with_an_unknown_tag_makes_a_composite_unsplittable():
    bad = fields("2a", "00000001", THREAD_1, LOCATION, "51", "00")  # 'Q' is no tag
    raw = bytes.fromhex(fields("00", "00000002", bad, bad))
    with pytest.raises(UnknownEventKind, match="unknown tag 81"):
        decode_composite(raw, HOTSPOT)


def test_without_sizes_only_a_single_event_can_be_read():
    raw = bytes.fromhex(VECTORS[2][1])
    with pytest.raises(UnknownEventKind, match="id sizes are not known"):
        decode_composite(raw, None)


def test_a_composite_of_no_events_is_refused():
    with pytest.raises(RemoteProtocolError, match="with 0 events"):
        decode_composite(bytes.fromhex(fields("00", "00000000")), HOTSPOT)


def test_the_thread_of_an_event():
    bp = Event(2, 5, bytes.fromhex(THREAD_1 + LOCATION))
    assert event_thread(bp, HOTSPOT) == 1
    assert event_thread(bp, None) is None
    assert event_thread(Event(99, 0), HOTSPOT) is None  # VM_DEATH has none
    assert event_thread(Event(9, 2, bytes.fromhex("00000000")), HOTSPOT) is None  # CLASS_UNLOAD


# ------------------------------------------------------------------------------ requests


def test_set_of_a_breakpoint_with_a_location_modifier():
    # eventKind 2, suspendPolicy ALL, 1 modifier: LocationOnly (7) with a location.
    raw = bytes.fromhex(fields("02", "02", "00000001", "07", LOCATION))
    request = EventRequestSet.decode(raw)
    assert (request.event_kind, request.suspend_policy, request.modifier_count) == (2, 2, 1)
    assert request.modifiers == bytes.fromhex(fields("07", LOCATION))
    assert request.encode() == raw
    with pytest.raises(RemoteProtocolError):
        EventRequestSet.decode(raw[:5])


def test_clear_and_the_request_id_of_a_set_reply():
    raw = bytes.fromhex(fields("02", "00000005"))
    assert EventRequestClear.decode(raw) == EventRequestClear(2, 5)
    assert EventRequestClear(2, 5).encode() == raw
    with pytest.raises(RemoteProtocolError):
        EventRequestClear.decode(raw + b"\x00")
    assert decode_int(bytes.fromhex("00000005")) == 5
    assert encode_int(5) == bytes.fromhex("00000005")
    assert decode_int(bytes.fromhex("ffffffff")) == -1


def test_object_ids():
    assert decode_object_id(bytes.fromhex("00000000000000ff"), 8) == 255
    assert decode_object_id(bytes.fromhex("aa000000ff"), 4, 1) == 255
    assert encode_object_id(255, 4) == bytes.fromhex("000000ff")
    with pytest.raises(RemoteProtocolError):
        decode_object_id(b"\x00" * 7, 8)
    with pytest.raises(LocalProtocolError):
        encode_object_id(1 << 32, 4)


def test_impossible_values_are_refused_when_built():
    with pytest.raises(LocalProtocolError):
        Event(256, 1)
    with pytest.raises(LocalProtocolError):
        Event(2, 1 << 31)
    with pytest.raises(LocalProtocolError):
        EventRequestSet(2, 300)
    with pytest.raises(LocalProtocolError):
        Composite(3 << 8, ())


def test_clearable_kinds_are_those_the_agent_knows():
    # jdwp2EventIndex in OpenJDK's libjdwp util.c: USER_DEFINED is not among them.
    assert EventKind.USER_DEFINED not in CLEARABLE_KINDS
    assert {EventKind.BREAKPOINT, EventKind.VM_DEATH, EventKind.FRAME_POP} <= CLEARABLE_KINDS


def test_the_strongest_policy_wins():
    assert strongest([0, 1, 0]) == 1
    assert strongest([1, 2]) == 2
    assert strongest([]) == 0


# ------------------------------------------------------------------------------ properties

id_sizes = st.builds(IdSizes, *[st.sampled_from((4, 8))] * 5)


def _object_id(draw, size: int) -> bytes:
    return draw(st.integers(0, (1 << (8 * size)) - 1)).to_bytes(size, "big")


def _location(draw, sizes: IdSizes) -> bytes:
    return (
        bytes([draw(st.integers(1, 3))])
        + _object_id(draw, sizes.reference_type_id)
        + _object_id(draw, sizes.method_id)
        + _object_id(draw, 8)
    )


_PRIMITIVES = {"B": 1, "C": 2, "D": 8, "F": 4, "I": 4, "J": 8, "S": 2, "V": 0, "Z": 1}


def _value(draw, sizes: IdSizes) -> bytes:
    tag = draw(st.sampled_from("BCDFIJSVZ[Lstglc"))
    size = _PRIMITIVES.get(tag, sizes.object_id)
    return tag.encode() + draw(st.binary(min_size=size, max_size=size))


def _tagged(draw, sizes: IdSizes) -> bytes:
    return draw(st.sampled_from(b"[Lstglc")).to_bytes(1, "big") + _object_id(draw, sizes.object_id)


def _string(draw) -> bytes:
    text = draw(st.text(max_size=12)).encode()
    return len(text).to_bytes(4, "big") + text


@st.composite
def events(draw, sizes: IdSizes) -> Event:
    """One event of a kind the spec defines, its data built field by field."""
    kind = draw(st.sampled_from(sorted(k for k in EventKind if k not in (3, 5, 10, 30, 100))))
    thread = _object_id(draw, sizes.object_id)
    loc = _location(draw, sizes)
    tagged = _tagged(draw, sizes)
    field = (
        bytes([draw(st.integers(1, 3))])
        + _object_id(draw, sizes.reference_type_id)
        + _object_id(draw, sizes.field_id)
    )
    body = {
        1: thread + loc,
        2: thread + loc,
        40: thread + loc,
        41: thread + loc,
        42: thread + loc + _value(draw, sizes),
        43: thread + tagged + loc,
        44: thread + tagged + loc,
        45: thread + tagged + loc + draw(st.binary(min_size=8, max_size=8)),
        46: thread + tagged + loc + draw(st.binary(min_size=1, max_size=1)),
        4: thread + loc + tagged + loc,
        6: thread,
        7: thread,
        90: thread,
        8: thread + field[:1] + field[1 : 1 + sizes.reference_type_id] + _string(draw) + b"\0" * 4,
        9: _string(draw),
        20: thread + loc + field + tagged,
        21: thread + loc + field + tagged + _value(draw, sizes),
        99: b"",
    }[kind]
    return Event(kind, draw(st.integers(0, (1 << 31) - 1)), body)


@st.composite
def composites(draw) -> tuple[Composite, IdSizes]:
    sizes = draw(id_sizes)
    items = draw(st.lists(events(sizes), min_size=1, max_size=6))
    return Composite(draw(st.integers(0, 2)), tuple(items)), sizes


@given(composites())
def test_composites_round_trip(item):
    composite, sizes = item
    raw = encode_composite(composite)
    assert decode_composite(raw, sizes) == composite
    policy, count, kind, request_id = peek_composite(raw)
    assert (policy, count, kind, request_id) == (
        composite.suspend_policy,
        len(composite.events),
        composite.events[0].kind,
        composite.events[0].request_id,
    )


@given(
    st.integers(0, 255),
    st.integers(0, 2),
    st.integers(-(1 << 31), (1 << 31) - 1),
    st.binary(max_size=40),
)
def test_sets_round_trip(kind, policy, count, modifiers):
    request = EventRequestSet(kind, policy, count, modifiers)
    assert EventRequestSet.decode(request.encode()) == request


@given(st.integers(0, 255), st.integers(-(1 << 31), (1 << 31) - 1))
def test_clears_round_trip(kind, request_id):
    clear = EventRequestClear(kind, request_id)
    assert EventRequestClear.decode(clear.encode()) == clear


@given(st.binary(max_size=200), st.one_of(st.none(), id_sizes))
def test_any_bytes_give_a_composite_or_a_protocol_error(data, sizes):
    try:
        composite = decode_composite(data, sizes)
    except ProtocolError:
        return
    assert encode_composite(composite) == data
