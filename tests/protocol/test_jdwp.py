"""JDWP framing: golden vectors from protocol.md section 5, error cases, Hypothesis properties.

The hex strings below are typed in from ../shared/docs/protocol.md; they are never produced by
ddmd's own encoder.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from ddmd.protocol.jdwp import (
    EOF,
    HANDSHAKE,
    MAX_LENGTH,
    NEED_DATA,
    CommandPacket,
    Handshake,
    IdSizes,
    PacketDecoder,
    PacketHeader,
    PacketPiece,
    PacketStart,
    ReplyPacket,
    decode_packet,
    encode,
    encode_header,
)

V1 = "4a4457502d48616e647368616b65"

# (name, hex, id, is_reply, command set / error code, command, data length)
PACKET_VECTORS = [
    ("V2", "000000174000000100c70148454c4f0000000400000001", 0x40000001, False, 199, 1, 12),
    (
        "V3",
        "000000c24000000180000048454c4f000000af00000001000010920000000d0000000f00440061006c0076"
        "0069006b002000760032002e0031002e00300063006f006d002e006500780061006d0070006c0065002e00"
        "6100700070000000000000000e00360034002d0062006900740020002800610072006d0036003400290000"
        "000e0043006800650063006b004a004e0049003d00660061006c00730065000000000f0063006f006d002e"
        "006500780061006d0070006c0065002e006100700070",
        0x40000001,
        True,
        0,
        None,
        183,
    ),
    ("V5", "0000000b40000001800063", 0x40000001, True, 99, None, 0),
    ("V6", "0000000b40000002800000", 0x40000002, True, 0, None, 0),
    ("V8", "000000144000000200c7015448454e0000000101", 0x40000002, False, 199, 1, 9),
    (
        "V9",
        "000000238000000100c70154484352000000100000000100000004006d00610069006e",
        0x80000001,
        False,
        199,
        1,
        24,
    ),
    ("V13", "000000144000000300c701485049460000000101", 0x40000003, False, 199, 1, 9),
    (
        "V14",
        "000000341000000700c701485049460000002100000001000000010000018bcfe5680001100000000180"
        "000000f424000001e240",
        0x10000007,
        False,
        199,
        1,
        41,
    ),
    ("V15", "000000154000000400c70148505347000000020100", 0x40000004, False, 199, 1, 10),
    (
        "V17",
        "000000698000000200c70141504e4d00000056000000160063006f006d002e006500780061006d007000"
        "6c0065002e006100700070003a00720065006d006f007400650000000a0000000f0063006f006d002e00"
        "6500780061006d0070006c0065002e006100700070",
        0x80000002,
        False,
        199,
        1,
        94,
    ),
    ("V19", "000000141000000100c701574149540000000100", 0x10000001, False, 199, 1, 9),
    ("V20", "000000174000000500c70153544b4c000000040000000e", 0x40000005, False, 199, 1, 12),
    (
        "V21",
        "00000049400000058000004641494c0000003600000001000000170053007400610063006b002000740072"
        "00610063006500200075006e0061007600610069006c00610062006c0065",
        0x40000005,
        True,
        0,
        None,
        62,
    ),
    (
        "V24",
        "000000451000001000c7015448435200000026000000150000000f0070006f006f006c002d0031002d00"
        "7400680072006500610064002d0031544844450000000400000015",
        0x10000010,
        False,
        199,
        1,
        58,
    ),
    (
        "V25",
        "0000001f000000028000000000000800000008000000080000000800000008",
        2,
        True,
        0,
        None,
        20,
    ),
    ("V26", "000000150000002a00406400000000016300000000", 0x2A, False, 64, 100, 10),
    (
        "V27",
        "0000001d0000000000406402000000015a000000000000000000000001",
        0,
        False,
        64,
        100,
        18,
    ),
]

IDS = [v[0] for v in PACKET_VECTORS]


def _drain(decoder: PacketDecoder) -> list[object]:
    out: list[object] = []
    while True:
        event = decoder.next_event()
        if event is NEED_DATA or event is EOF:
            return out
        out.append(event)


def _check_fields(packet: object, pid: int, is_reply: bool, word: int, cmd: int | None, n: int):
    assert packet.id == pid
    assert len(packet.data) == n
    if is_reply:
        assert isinstance(packet, ReplyPacket)
        assert packet.error_code == word
    else:
        assert isinstance(packet, CommandPacket)
        assert packet.command_set == word
        assert packet.command == cmd


@pytest.mark.parametrize(
    ("name", "hexs", "pid", "is_reply", "word", "cmd", "n"), PACKET_VECTORS, ids=IDS
)
def test_vector_whole(name, hexs, pid, is_reply, word, cmd, n):
    raw = bytes.fromhex(hexs)
    packet = decode_packet(raw)
    _check_fields(packet, pid, is_reply, word, cmd, n)
    assert encode(packet) == raw
    decoder = PacketDecoder()
    decoder.receive_data(raw)
    assert _drain(decoder) == [packet]


@pytest.mark.parametrize(
    ("name", "hexs", "pid", "is_reply", "word", "cmd", "n"), PACKET_VECTORS, ids=IDS
)
def test_vector_byte_at_a_time(name, hexs, pid, is_reply, word, cmd, n):
    raw = bytes.fromhex(hexs)
    decoder = PacketDecoder()
    got: list[object] = []
    for i in range(len(raw)):
        if i >= 11:
            header = decoder.peek_header()
            assert header is not None
            assert header.length == len(raw)
            assert header.id == pid
        decoder.receive_data(raw[i : i + 1])
        got.extend(_drain(decoder))
        if i < len(raw) - 1:
            assert got == []
    assert len(got) == 1
    _check_fields(got[0], pid, is_reply, word, cmd, n)


@pytest.mark.parametrize(
    ("name", "hexs", "pid", "is_reply", "word", "cmd", "n"), PACKET_VECTORS, ids=IDS
)
def test_vector_back_to_back(name, hexs, pid, is_reply, word, cmd, n):
    raw = bytes.fromhex(hexs)
    decoder = PacketDecoder()
    decoder.receive_data(raw * 6)
    got = _drain(decoder)
    assert len(got) == 6
    for packet in got:
        _check_fields(packet, pid, is_reply, word, cmd, n)
    decoder.receive_data(b"")
    assert decoder.next_event() is EOF


def test_all_vectors_in_one_stream_after_handshake():
    stream = bytes.fromhex(V1) + b"".join(bytes.fromhex(v[1]) for v in PACKET_VECTORS)
    decoder = PacketDecoder(expect_handshake=True)
    for i in range(0, len(stream), 7):
        decoder.receive_data(stream[i : i + 7])
    got = _drain(decoder)
    assert got[0] == Handshake()
    assert [p.id for p in got[1:]] == [v[2] for v in PACKET_VECTORS]


def test_v1_handshake():
    assert bytes.fromhex(V1) == HANDSHAKE == b"JDWP-Handshake"
    decoder = PacketDecoder(expect_handshake=True)
    for b in HANDSHAKE[:-1]:
        decoder.receive_data(bytes([b]))
        assert decoder.next_event() is NEED_DATA
    decoder.receive_data(HANDSHAKE[-1:])
    assert decoder.next_event() == Handshake()
    assert decoder.next_event() is NEED_DATA


def test_bad_handshake_is_remote_error_and_sticky():
    decoder = PacketDecoder(expect_handshake=True)
    decoder.receive_data(b"JDWX")
    with pytest.raises(RemoteProtocolError, match="handshake"):
        decoder.next_event()
    with pytest.raises(RemoteProtocolError, match="handshake"):
        decoder.next_event()


def test_handshake_parsed_as_packet_names_length():
    # A second handshake sent to a VM would be read as a packet of length 0x4A445750.
    decoder = PacketDecoder(max_length=1 << 30)
    decoder.receive_data(HANDSHAKE)
    with pytest.raises(RemoteProtocolError, match=str(0x4A445750)):
        decoder.next_event()


def test_v25_idsizes():
    packet = decode_packet(bytes.fromhex(PACKET_VECTORS[IDS.index("V25")][1]))
    sizes = IdSizes.decode(packet.data)
    assert sizes == IdSizes(8, 8, 8, 8, 8)
    assert sizes.encode() == packet.data


@pytest.mark.parametrize("length", [0, 1, 10])
def test_length_below_header_is_error(length):
    decoder = PacketDecoder()
    decoder.receive_data(length.to_bytes(4, "big") + bytes(7))
    with pytest.raises(RemoteProtocolError, match=f"length {length} < header size 11"):
        decoder.next_event()


def test_length_above_cap_is_error_naming_value():
    decoder = PacketDecoder(max_length=4096)
    decoder.receive_data((4097).to_bytes(4, "big") + bytes(7))
    with pytest.raises(RemoteProtocolError, match="4097"):
        decoder.next_event()


def test_default_cap_is_one_gib():
    decoder = PacketDecoder()
    decoder.receive_data(((1 << 30) + 1).to_bytes(4, "big") + bytes(7))
    with pytest.raises(RemoteProtocolError, match=str((1 << 30) + 1)):
        decoder.next_event()
    ok = PacketDecoder()
    ok.receive_data((1 << 30).to_bytes(4, "big") + bytes(7))
    assert ok.next_event() is NEED_DATA


def test_bad_flags_is_error():
    decoder = PacketDecoder()
    decoder.receive_data(bytes.fromhex("0000000b0000000140c701"))
    with pytest.raises(RemoteProtocolError, match="flags 0x40"):
        decoder.next_event()


def test_eof_mid_packet_is_error():
    decoder = PacketDecoder()
    decoder.receive_data(bytes.fromhex("0000000c000000010001"))
    assert decoder.next_event() is NEED_DATA
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="closed in the middle"):
        decoder.next_event()


def test_decode_packet_rejects_wrong_sizes():
    raw = bytes.fromhex("0000000b40000002800000")
    with pytest.raises(RemoteProtocolError):
        decode_packet(raw + b"x")
    with pytest.raises(RemoteProtocolError):
        decode_packet(raw[:-1])
    with pytest.raises(RemoteProtocolError):
        decode_packet(raw[:5])


def test_local_errors_on_bad_construction():
    with pytest.raises(LocalProtocolError):
        CommandPacket(-1, 1, 1)
    with pytest.raises(LocalProtocolError):
        CommandPacket(1, 256, 1)
    with pytest.raises(LocalProtocolError):
        ReplyPacket(1, 0x10000)
    with pytest.raises(LocalProtocolError):
        CommandPacket(1, 1, 1, bytearray(b"x"))  # type: ignore[arg-type]
    decoder = PacketDecoder()
    decoder.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        decoder.receive_data(b"x")


def test_streamed_packet_header_before_body():
    body = bytes(range(256)) * 40  # 10240 bytes
    packet = ReplyPacket(77, 0, body)
    raw = encode(packet)
    decoder = PacketDecoder(stream_threshold=1024)
    decoder.receive_data(raw[:11])
    start = decoder.next_event()
    assert start == PacketStart(PacketHeader(len(raw), 77, 0x80, 0, 0))
    assert decoder.next_event() is NEED_DATA
    pieces: list[PacketPiece] = []
    for i in range(11, len(raw), 3000):
        decoder.receive_data(raw[i : i + 3000])
        pieces.extend(_drain(decoder))
    assert all(isinstance(p, PacketPiece) for p in pieces)
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert b"".join(p.data for p in pieces) == body
    assert encode_header(start.header) + b"".join(p.data for p in pieces) == raw
    # Small packets after it are still whole packets.
    decoder.receive_data(encode(CommandPacket(1, 1, 1)))
    assert decoder.next_event() == CommandPacket(1, 1, 1)


def test_the_cap_bounds_packets_held_whole_and_max_streamed_those_streamed():
    # max_length caps what the decoder would buffer; a streamed packet is capped by
    # max_streamed (default: max_length), up to the length field's own 4 GiB.
    head = encode_header(PacketHeader(0xFFFF_FFFF, 3, 0, 199, 1))
    decoder = PacketDecoder(max_length=4096, stream_threshold=1024, max_streamed=MAX_LENGTH)
    decoder.receive_data(head)
    assert decoder.next_event() == PacketStart(PacketHeader(0xFFFF_FFFF, 3, 0, 199, 1))
    for decoder in (
        PacketDecoder(max_length=4096, stream_threshold=1024),
        PacketDecoder(max_length=4096, stream_threshold=1024, max_streamed=8192),
        PacketDecoder(max_length=4096, max_streamed=MAX_LENGTH),  # nothing streamed
    ):
        decoder.receive_data(encode_header(PacketHeader(10000, 3, 0, 199, 1)))
        with pytest.raises(RemoteProtocolError, match="exceeds the configured cap"):
            decoder.next_event()


def test_streamed_header_with_new_id():
    header = PacketHeader(11, 5, 0, 1, 7)
    assert encode_header(header.with_id(9)) == encode(CommandPacket(9, 1, 7))


# ---------------------------------------------------------------- Hypothesis properties

u4 = st.integers(0, 0xFFFFFFFF)
commands = st.builds(
    CommandPacket, u4, st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300)
)
replies = st.builds(ReplyPacket, u4, st.integers(0, 0xFFFF), st.binary(max_size=300))
packets = st.one_of(commands, replies)


@given(packets)
def test_round_trip(packet):
    raw = encode(packet)
    assert decode_packet(raw) == packet
    decoder = PacketDecoder()
    decoder.receive_data(raw)
    assert decoder.next_event() == packet


@given(st.lists(packets, max_size=8), st.lists(st.integers(0, 4000), max_size=10))
def test_split_anywhere(plist, cuts):
    stream = b"".join(encode(p) for p in plist)
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = PacketDecoder()
    got: list[object] = []
    prev = 0
    for point in [*points, len(stream)]:
        if point > prev:
            decoder.receive_data(stream[prev:point])
        got.extend(_drain(decoder))
        prev = point
    decoder.receive_data(b"")
    assert decoder.next_event() is EOF
    assert got == plist


@given(
    st.lists(packets, max_size=6),
    st.lists(st.integers(0, 4000), max_size=10),
    st.sampled_from([None, 11, 40]),
    st.booleans(),
)
def test_held_is_empty_exactly_when_nothing_is_buffered(plist, cuts, threshold, handshake):
    # The relay lane tests ``held`` for "nothing buffered" (router.py): after every event and
    # every feed it must say what ``buffered`` says.
    stream = (HANDSHAKE if handshake else b"") + b"".join(encode(p) for p in plist)
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = PacketDecoder(stream_threshold=threshold, expect_handshake=handshake)
    prev = 0
    for point in [*points, len(stream)]:
        if point > prev:
            decoder.receive_data(stream[prev:point])
            assert bool(decoder.held) == (decoder.buffered > 0)
        while decoder.next_event() is not NEED_DATA:
            assert bool(decoder.held) == (decoder.buffered > 0)
        prev = point
    assert decoder.buffered == 0
    assert not decoder.held


@given(
    st.lists(packets, max_size=6),
    st.lists(st.integers(0, 4000), max_size=10),
    st.integers(11, 64),
)
def test_split_anywhere_streaming(plist, cuts, threshold):
    stream = b"".join(encode(p) for p in plist)
    points = sorted({min(c, len(stream)) for c in cuts})
    decoder = PacketDecoder(stream_threshold=threshold)
    events: list[object] = []
    prev = 0
    for point in [*points, len(stream)]:
        if point > prev:
            decoder.receive_data(stream[prev:point])
        events.extend(_drain(decoder))
        prev = point
    rebuilt = b""
    for event in events:
        if isinstance(event, PacketStart):
            rebuilt += encode_header(event.header)
        elif isinstance(event, PacketPiece):
            rebuilt += event.data
        else:
            assert event.length <= threshold
            rebuilt += encode(event)
    assert rebuilt == stream


@given(st.binary(max_size=2000), st.booleans(), st.sampled_from([None, 11, 40]))
def test_fuzz_decoder(data, handshake, threshold):
    decoder = PacketDecoder(
        max_length=1 << 16, expect_handshake=handshake, stream_threshold=threshold
    )
    try:
        for i in range(0, len(data), 97):
            decoder.receive_data(data[i : i + 97])
            _drain(decoder)
        decoder.receive_data(b"")
        _drain(decoder)
    except ProtocolError:
        pass


@given(st.binary(max_size=200))
def test_fuzz_decode_packet(data):
    with contextlib.suppress(ProtocolError):
        decode_packet(data)
