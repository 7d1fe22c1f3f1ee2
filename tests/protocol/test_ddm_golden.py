"""DDM chunk codec against the golden vectors of protocol.md section 5, plus rejection cases.

Every hex string below is copied from ../shared/docs/protocol.md section 5 (see
golden/README.md); none is produced by ddmd's own encoder. Each vector is parsed whole, one
byte at a time and several copies back to back, its fields are checked against the values
protocol.md states, and encoding the parsed result must give back the exact bytes.
"""

from __future__ import annotations

import zlib

import pytest

from ddmd.protocol import ddm
from ddmd.protocol.ddm import (
    AllocationEntry,
    AllocationFrame,
    Allocations,
    AppName,
    ChunkType,
    Direction,
    DraftThreadInfo,
    Fail,
    FeatReply,
    HeapInfo,
    HeapInfoEntry,
    HeapInfoRequest,
    HeapSegment,
    HeapSegmentRequest,
    HeloReply,
    HeloRequest,
    ResolvedAllocation,
    ResolvedFrame,
    StackFrame,
    StackTrace,
    StackTraceRequest,
    ThreadCreated,
    ThreadDied,
    ThreadInfo,
    ThreadNotify,
    ThreadState,
    ThreadStatus,
    ThreadStatusDraft,
    UnknownChunk,
    WaitForDebugger,
    Zlib,
)
from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.protocol.jdwp import (
    NEED_DATA,
    CommandPacket,
    PacketDecoder,
    ReplyPacket,
    decode_packet,
    encode,
)

TO_VM = Direction.TO_VM
FROM_VM = Direction.FROM_VM

# --------------------------------------------------------------------------------------------
# Vectors, copied from protocol.md section 5

V2 = "000000174000000100c70148454c4f0000000400000001"
V3 = (
    "000000c24000000180000048454c4f000000af00000001000010920000000d00"
    "00000f00440061006c00760069006b002000760032002e0031002e0030006300"
    "6f006d002e006500780061006d0070006c0065002e0061007000700000000000"
    "00000e00360034002d0062006900740020002800610072006d00360034002900"
    "00000e0043006800650063006b004a004e0049003d00660061006c0073006500"
    "0000000f0063006f006d002e006500780061006d0070006c0065002e00610070"
    "0070"
)
V4 = (
    "48454c4f0000004c000000010000013d0000000d0000001100440061006c0076"
    "0069006b002000760031002e0036002e0030003c007000720065002d0069006e"
    "0069007400690061006c0069007a00650064003e"
)
V5 = "0000000b40000001800063"
V6 = "0000000b40000002800000"
V7 = (
    "4645415400000046000000020000000e0076006900650077002d006800690065"
    "0072006100720063006800790000000f006800700072006f0066002d00680065"
    "00610070002d00640075006d0070"
)
V8 = "000000144000000200c7015448454e0000000101"
V9 = "000000238000000100c70154484352000000100000000100000004006d00610069006e"
V10 = "54484445000000040000000e"
V11 = (
    "544853540000002804120002000000010400001092000000550000001f000000"
    "000d01000010a4000000030000000101"
)
V12 = "5448535400000010000000020000000101000000000d0401"
V13 = "000000144000000300c701485049460000000101"
V14 = (
    "000000341000000700c701485049460000002100000001000000010000018bcf"
    "e5680001100000000180000000f424000001e240"
)
V15 = "000000154000000400c70148505347000000020100"
V16 = "4850534700000021000000010812c0000000000000000003920909010291ff91ff115780ff002b2100"
V17 = (
    "000000698000000200c70141504e4d00000056000000160063006f006d002e00"
    "6500780061006d0070006c0065002e006100700070003a00720065006d006f00"
    "7400650000000a0000000f0063006f006d002e006500780061006d0070006c00"
    "65002e006100700070"
)
V18 = "41504e4d00000026000000110063006f006d002e0061006e00640072006f00690064002e00700068006f006e0065"
V19 = "000000141000000100c701574149540000000100"
V20 = "000000174000000500c70153544b4c000000040000000e"
V21 = (
    "00000049400000058000004641494c0000003600000001000000170053007400"
    "610063006b00200074007200610063006500200075006e006100760061006900"
    "6c00610062006c0065"
)
V22 = (
    "53544b4c0000004400000000000000010000000100000010006a006100760061"
    "002e006c0061006e0067002e004f0062006a0065006300740000000400770061"
    "0069007400000000fffffffe"
)
V23 = (
    "5a4c49420000003954484352000000267801012600d9ff000000150000000f00"
    "70006f006f006c002d0031002d007400680072006500610064002d003155f105"
    "40"
)
V24 = (
    "000000451000001000c7015448435200000026000000150000000f0070006f00"
    "6f006c002d0031002d007400680072006500610064002d003154484445000000"
    "0400000015"
)

# The values protocol.md states for each vector.
HELO_ART = HeloReply(
    client_version=1,
    pid=4242,
    vm_ident="Dalvik v2.1.0",
    app_name="com.example.app",
    user_id=0,
    abi="64-bit (arm64)",
    jvm_flags="CheckJNI=false",
    native_debuggable=False,
    package_name="com.example.app",
)
HELO_DALVIK = HeloReply(
    client_version=1, pid=317, vm_ident="Dalvik v1.6.0", app_name="<pre-initialized>"
)
THST_SHIPPED = ThreadStatus(
    threads=(
        ThreadInfo(thread_id=1, status=4, tid=4242, utime=85, stime=31, daemon=False),
        ThreadInfo(thread_id=13, status=1, tid=4260, utime=3, stime=1, daemon=True),
    ),
    header_length=4,
    entry_length=18,
)
THST_DRAFT = ThreadStatusDraft(
    threads=(
        DraftThreadInfo(thread_id=1, state=1, suspended=False),
        DraftThreadInfo(thread_id=13, state=4, suspended=True),
    )
)
HPIF_DATA = HeapInfo(
    heaps=(
        HeapInfoEntry(
            heap_id=1,
            timestamp_ms=1_700_000_000_000,
            reason=1,
            max_size=268_435_456,
            size=25_165_824,
            bytes_allocated=16_000_000,
            objects_allocated=123_456,
        ),
    )
)
HPSG_DATA = HeapSegment(
    heap_id=1,
    unit_size=8,
    start=0x12C00000,
    offset=0,
    units=914,
    usage=bytes.fromhex("0909 0102 91ff 91ff 1157 80ff 002b 2100"),
)
POOL_THREAD = ThreadCreated(thread_id=21, name="pool-1-thread-1")
STKL_REPLY = StackTrace(
    thread_id=1,
    frames=(StackFrame(class_name="java.lang.Object", method_name="wait", file_name="", line=-2),),
    reserved=0,
)

# (name, hex, direction, packet id, is_reply, expected chunks)
PACKET_VECTORS = [
    ("V2", V2, TO_VM, 0x40000001, False, (HeloRequest(version=1),)),
    ("V3", V3, FROM_VM, 0x40000001, True, (HELO_ART,)),
    ("V5", V5, FROM_VM, 0x40000001, True, ()),
    ("V6", V6, FROM_VM, 0x40000002, True, ()),
    ("V8", V8, TO_VM, 0x40000002, False, (ThreadNotify(enable=True),)),
    ("V9", V9, FROM_VM, 0x80000001, False, (ThreadCreated(thread_id=1, name="main"),)),
    ("V13", V13, TO_VM, 0x40000003, False, (HeapInfoRequest(when=1),)),
    ("V14", V14, FROM_VM, 0x10000007, False, (HPIF_DATA,)),
    ("V15", V15, TO_VM, 0x40000004, False, (HeapSegmentRequest(when=1, what=0),)),
    (
        "V17",
        V17,
        FROM_VM,
        0x80000002,
        False,
        (AppName("com.example.app:remote", user_id=10, package_name="com.example.app"),),
    ),
    ("V19", V19, FROM_VM, 0x10000001, False, (WaitForDebugger(reason=0),)),
    ("V20", V20, TO_VM, 0x40000005, False, (StackTraceRequest(thread_id=14),)),
    ("V21", V21, FROM_VM, 0x40000005, True, (Fail(code=1, message="Stack trace unavailable"),)),
    ("V24", V24, FROM_VM, 0x10000010, False, (POOL_THREAD, ThreadDied(thread_id=21))),
]

# (name, hex, direction, expected chunk)
CHUNK_VECTORS = [
    ("V4", V4, FROM_VM, HELO_DALVIK),
    ("V7", V7, FROM_VM, FeatReply(features=("view-hierarchy", "hprof-heap-dump"))),
    ("V10", V10, FROM_VM, ThreadDied(thread_id=14)),
    ("V11", V11, FROM_VM, THST_SHIPPED),
    ("V12", V12, FROM_VM, THST_DRAFT),
    ("V16", V16, FROM_VM, HPSG_DATA),
    ("V18", V18, FROM_VM, AppName(app_name="com.android.phone")),
    ("V22", V22, FROM_VM, STKL_REPLY),
    (
        "V23",
        V23,
        FROM_VM,
        Zlib(
            original_type=ChunkType.THCR,
            original_length=38,
            stream=bytes.fromhex(V23[32:]),
        ),
    ),
]

PACKET_IDS = [v[0] for v in PACKET_VECTORS]
CHUNK_IDS = [v[0] for v in CHUNK_VECTORS]


def _packets_from(decoder: PacketDecoder) -> list[CommandPacket | ReplyPacket]:
    out: list[CommandPacket | ReplyPacket] = []
    while (event := decoder.next_packet()) is not NEED_DATA:
        assert isinstance(event, CommandPacket | ReplyPacket)
        out.append(event)
    return out


# --------------------------------------------------------------------------------------------
# Packet vectors


@pytest.mark.parametrize(
    ("name", "hexs", "direction", "pid", "is_reply", "chunks"), PACKET_VECTORS, ids=PACKET_IDS
)
def test_packet_vector_whole(name, hexs, direction, pid, is_reply, chunks):
    raw = bytes.fromhex(hexs)
    packet = decode_packet(raw)
    assert packet.id == pid
    assert isinstance(packet, ReplyPacket) == is_reply
    if not is_reply:
        assert ddm.is_ddm(packet)
    assert ddm.chunks_of(packet, direction) == chunks


@pytest.mark.parametrize(
    ("name", "hexs", "direction", "pid", "is_reply", "chunks"), PACKET_VECTORS, ids=PACKET_IDS
)
def test_packet_vector_byte_at_a_time_and_back_to_back(
    name, hexs, direction, pid, is_reply, chunks
):
    raw = bytes.fromhex(hexs)
    decoder = PacketDecoder()
    seen: list[CommandPacket | ReplyPacket] = []
    for i in range(len(raw)):
        decoder.receive_data(raw[i : i + 1])
        seen += _packets_from(decoder)
        assert len(seen) == (1 if i == len(raw) - 1 else 0)
    copies = 6
    decoder = PacketDecoder()
    decoder.receive_data(raw * copies)
    seen += _packets_from(decoder)
    assert len(seen) == 1 + copies
    for packet in seen:
        assert packet == decode_packet(raw)
        assert ddm.chunks_of(packet, direction) == chunks


@pytest.mark.parametrize(
    ("name", "hexs", "direction", "pid", "is_reply", "chunks"), PACKET_VECTORS, ids=PACKET_IDS
)
def test_packet_vector_encodes_exactly(name, hexs, direction, pid, is_reply, chunks):
    raw = bytes.fromhex(hexs)
    if is_reply:
        error = 99 if name == "V5" else 0
        rebuilt = encode(ReplyPacket(pid, error, ddm.encode_chunks(chunks)))
    elif len(chunks) == 1:
        rebuilt = encode(ddm.ddm_command(pid, chunks[0]))
    else:
        rebuilt = encode(CommandPacket(pid, 199, 1, ddm.encode_chunks(chunks)))
    assert rebuilt == raw


def test_v2_ddm_command_fields():
    packet = ddm.ddm_command(0x40000001, HeloRequest())
    assert (packet.command_set, packet.command) == (199, 1)
    assert encode(packet) == bytes.fromhex(V2)


def test_v24_decodes_two_chunks_in_order():
    data = decode_packet(bytes.fromhex(V24)).data
    chunks = ddm.decode_chunks(data, FROM_VM)
    assert [type(c) for c in chunks] == [ThreadCreated, ThreadDied]
    assert [c.chunk_type for c in chunks] == [ChunkType.THCR, ChunkType.THDE]


def test_is_ddm_and_chunks_of_on_other_packets():
    assert not ddm.is_ddm(ReplyPacket(1, 0, b""))
    assert not ddm.is_ddm(CommandPacket(1, 1, 7))
    assert not ddm.is_ddm(CommandPacket(1, 199, 2))
    assert not ddm.is_ddm(b"not a packet")
    with pytest.raises(LocalProtocolError, match="not DDM"):
        ddm.chunks_of(CommandPacket(1, 1, 7), FROM_VM)


# --------------------------------------------------------------------------------------------
# Chunk-only vectors


@pytest.mark.parametrize(("name", "hexs", "direction", "expected"), CHUNK_VECTORS, ids=CHUNK_IDS)
def test_chunk_vector_whole(name, hexs, direction, expected):
    raw = bytes.fromhex(hexs)
    assert ddm.decode_chunks(raw, direction) == (expected,)
    length = int.from_bytes(raw[4:8], "big")
    assert length == len(raw) - 8
    chunk_type = int.from_bytes(raw[:4], "big")
    assert ddm.decode_chunk(chunk_type, raw[8:], direction) == expected


@pytest.mark.parametrize(("name", "hexs", "direction", "expected"), CHUNK_VECTORS, ids=CHUNK_IDS)
def test_chunk_vector_every_prefix_is_rejected(name, hexs, direction, expected):
    """The codec is not incremental: each proper prefix must be refused, never misread."""
    raw = bytes.fromhex(hexs)
    assert ddm.decode_chunks(raw[:0], direction) == ()
    for cut in range(1, len(raw)):
        with pytest.raises(RemoteProtocolError):
            ddm.decode_chunks(raw[:cut], direction)


@pytest.mark.parametrize(("name", "hexs", "direction", "expected"), CHUNK_VECTORS, ids=CHUNK_IDS)
def test_chunk_vector_back_to_back(name, hexs, direction, expected):
    raw = bytes.fromhex(hexs)
    assert ddm.decode_chunks(raw * 5, direction) == (expected,) * 5
    assert ddm.decode_chunks(memoryview(raw * 3), direction) == (expected,) * 3


@pytest.mark.parametrize(("name", "hexs", "direction", "expected"), CHUNK_VECTORS, ids=CHUNK_IDS)
def test_chunk_vector_inside_packet_byte_at_a_time(name, hexs, direction, expected):
    raw = encode(CommandPacket(0x10000001, 199, 1, bytes.fromhex(hexs)))
    decoder = PacketDecoder()
    packets: list[CommandPacket | ReplyPacket] = []
    for i in range(len(raw)):
        decoder.receive_data(raw[i : i + 1])
        packets += _packets_from(decoder)
    assert len(packets) == 1
    assert ddm.chunks_of(packets[0], direction) == (expected,)


@pytest.mark.parametrize(("name", "hexs", "direction", "expected"), CHUNK_VECTORS, ids=CHUNK_IDS)
def test_chunk_vector_encodes_exactly(name, hexs, direction, expected):
    raw = bytes.fromhex(hexs)
    assert ddm.encode_chunk(expected) == raw
    assert ddm.encode_chunks([expected, expected]) == raw * 2


# --------------------------------------------------------------------------------------------
# Field details protocol.md spells out


def test_v3_trailers_and_type():
    (chunk,) = ddm.chunks_of(decode_packet(bytes.fromhex(V3)), FROM_VM)
    assert isinstance(chunk, HeloReply)
    assert chunk.chunk_type == ChunkType.HELO == 0x48454C4F
    assert chunk.native_debuggable is False
    assert chunk.extra == b""


def test_v4_has_no_trailers():
    (chunk,) = ddm.decode_chunks(bytes.fromhex(V4), FROM_VM)
    assert isinstance(chunk, HeloReply)
    assert (chunk.user_id, chunk.abi, chunk.jvm_flags) == (None, None, None)
    assert (chunk.native_debuggable, chunk.package_name) == (None, None)


def test_v11_statuses_are_thread_states():
    (chunk,) = ddm.decode_chunks(bytes.fromhex(V11), FROM_VM)
    assert isinstance(chunk, ThreadStatus)
    assert [t.status for t in chunk.threads] == [ThreadState.WAIT, ThreadState.RUNNING]
    assert [ddm.thread_state_label(t.status) for t in chunk.threads] == ["wait", "running"]
    assert ThreadState.TIMED_WAIT.label == "timed-wait"
    assert ddm.thread_state_label(9) == "suspended"
    assert ddm.thread_state(42) == 42
    assert ddm.thread_state_label(42) == "42"


def test_v23_inflates_to_thcr():
    (chunk,) = ddm.decode_chunks(bytes.fromhex(V23), FROM_VM)
    assert isinstance(chunk, Zlib)
    assert ddm.inflate_chunk(chunk, FROM_VM, max_length=38) == POOL_THREAD
    assert ddm.inflate_chunk(chunk, TO_VM, max_length=1 << 20) == POOL_THREAD


def test_v23_stream_matches_v24_thcr_data():
    """The stored block in V23 holds exactly the THCR data of V24."""
    v24_thcr_data = bytes.fromhex(V24)[19 : 19 + 38]
    z = Zlib(ChunkType.THCR, 38, bytes.fromhex(V23[32:]))
    assert zlib.decompress(z.stream) == v24_thcr_data


def test_single_layout_types_decode_the_same_both_ways():
    for hexs in (V10, V18):
        raw = bytes.fromhex(hexs)
        assert ddm.decode_chunks(raw, TO_VM) == ddm.decode_chunks(raw, FROM_VM)
    assert ddm.chunks_of(decode_packet(bytes.fromhex(V9)), TO_VM) == (
        ThreadCreated(thread_id=1, name="main"),
    )


def test_chunk_type_values_are_their_ascii_names():
    for member in ChunkType:
        assert member.value == int.from_bytes(member.name.encode("ascii"), "big")
        assert ddm.type_name(member) == member.name
    assert len(ChunkType) == 42
    assert ddm.type_name(0x00010203) == "0x00010203"


def test_unknown_and_debug_types_pass_through():
    for chunk_type in (ChunkType.TEST, ChunkType.DTRC, 0x51525354, 0):
        raw = chunk_type.to_bytes(4, "big") + bytes.fromhex("00000003 aabbcc")
        for direction in Direction:
            (chunk,) = ddm.decode_chunks(raw, direction)
            assert chunk == UnknownChunk(chunk_type, b"\xaa\xbb\xcc")
            assert ddm.encode_chunk(chunk) == raw
    with pytest.raises(LocalProtocolError):
        UnknownChunk(ChunkType.HELO, b"")


def test_lone_surrogates_round_trip_byte_exact():
    # THCR, thread 7, name of 3 units: lone high surrogate, "a", lone low surrogate.
    raw = bytes.fromhex("54484352 0000000e 00000007 00000003 d800 0061 dc00")
    (chunk,) = ddm.decode_chunks(raw, FROM_VM)
    assert isinstance(chunk, ThreadCreated)
    assert chunk.name == "\ud800a\udc00"
    assert ddm.encode_chunk(chunk) == raw


# --------------------------------------------------------------------------------------------
# REAL: no section 5 vector, so a hand-typed one from the layout in protocol.md 3.4

# header: lengths 15/9/8, 1 entry, tables at 0x20, 1 class, 1 method, 1 file
# entry: size 16, thread 5, class 0, 1 frame; frame: class 0, method 0, file 0, line 42
# tables: "C", "m", "F"
REAL_CANONICAL = (
    "0f0908 0001 00000020 0001 0001 0001"
    "00000010 0005 0000 01"
    "0000 0000 0000 002a"
    "00000001 0043  00000001 006d  00000001 0046"
)
# the same with header 16, entry header 10, frame 9 (one unknown 0xee byte each)
REAL_LONGER = (
    "100a09 0001 00000023 0001 0001 0001 ee"
    "00000010 0005 0000 01 ee"
    "0000 0000 0000 002a ee"
    "00000001 0043  00000001 006d  00000001 0046"
)
REAL_EXPECTED = Allocations(
    entries=(
        AllocationEntry(
            size=16, thread_id=5, class_index=0, frames=(AllocationFrame(0, 0, 0, 42),)
        ),
    ),
    class_names=("C",),
    method_names=("m",),
    file_names=("F",),
)


def test_real_canonical_and_longer_layouts():
    canonical = bytes.fromhex(REAL_CANONICAL)
    assert ddm.decode_chunk(ChunkType.REAL, canonical, FROM_VM) == REAL_EXPECTED
    assert REAL_EXPECTED.encode_data() == canonical
    assert ddm.decode_chunk(ChunkType.REAL, bytes.fromhex(REAL_LONGER), FROM_VM) == REAL_EXPECTED
    assert REAL_EXPECTED.resolved() == (
        ResolvedAllocation(16, 5, "C", (ResolvedFrame("C", "m", "F", 42),)),
    )


@pytest.mark.parametrize(
    ("hexs", "message"),
    [
        # method index 1 in a one-entry table
        (
            REAL_CANONICAL.replace("0000 0000 0000 002a", "0000 0001 0000 002a"),
            "method-name index 1",
        ),
        # entry class index 3
        (REAL_CANONICAL.replace("0005 0000 01", "0005 0003 01"), "class-name index 3"),
        # string table offset past the end
        (REAL_CANONICAL.replace("00000020", "00000099"), "string table offset"),
        # string table offset inside the entries
        (REAL_CANONICAL.replace("00000020", "0000001c"), "past the string table offset"),
        # header length below 15
        ("0e" + REAL_CANONICAL[2:], "header length 14"),
        # two class names declared, only one present
        (REAL_CANONICAL.replace("0001 0001 0001", "0002 0001 0001", 1), "runs past the end"),
        # trailing garbage after the tables
        (REAL_CANONICAL + "00", "unexpected bytes"),
    ],
)
def test_real_rejections(hexs, message):
    with pytest.raises(RemoteProtocolError, match=message):
        ddm.decode_chunk(ChunkType.REAL, bytes.fromhex(hexs), FROM_VM)


# --------------------------------------------------------------------------------------------
# Framing rejections (protocol.md 2.4)


def test_truncated_chunk_header_is_rejected():
    raw = bytes.fromhex(V10)
    with pytest.raises(RemoteProtocolError, match="left over"):
        ddm.decode_chunks(raw + raw[:3], FROM_VM)


@pytest.mark.parametrize("leftover", range(1, 8))
def test_one_to_seven_leftover_bytes_are_rejected(leftover):
    raw = bytes.fromhex(V10)
    with pytest.raises(RemoteProtocolError, match=f"{leftover} bytes left over"):
        ddm.decode_chunks(raw + bytes(leftover), FROM_VM)


def test_chunk_data_past_the_end_is_rejected():
    raw = bytes.fromhex(V16)
    with pytest.raises(RemoteProtocolError, match="HPSG chunk at offset 0 declares 33"):
        ddm.decode_chunks(raw[:-1], FROM_VM)
    huge = bytes.fromhex("54484445ffffffff0000000e")
    with pytest.raises(RemoteProtocolError, match="declares 4294967295"):
        ddm.decode_chunks(huge, FROM_VM)


def test_fixed_layout_trailing_bytes_are_rejected():
    with pytest.raises(RemoteProtocolError, match="THDE: 1 unexpected bytes"):
        ddm.decode_chunk(ChunkType.THDE, bytes.fromhex("0000000e00"), FROM_VM)
    with pytest.raises(RemoteProtocolError, match="HELO"):
        ddm.decode_chunk(ChunkType.HELO, bytes.fromhex("000001"), TO_VM)


def test_empty_packet_data_has_no_chunks():
    assert ddm.chunks_of(decode_packet(bytes.fromhex(V6)), FROM_VM) == ()


# --------------------------------------------------------------------------------------------
# Strings: a count running past the data


def test_feat_string_count_past_end():
    raw = bytearray(bytes.fromhex(V7))
    raw[0x2C:0x30] = (16).to_bytes(4, "big")  # second feature claims 16 units, 15 present
    with pytest.raises(RemoteProtocolError, match=r"FEAT: feature \[1\]: string length 16"):
        ddm.decode_chunks(bytes(raw), FROM_VM)


def test_feature_count_past_end():
    raw = bytearray(bytes.fromhex(V7))
    raw[8:12] = (0xFFFFFFFF).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="feature count 4294967295"):
        ddm.decode_chunks(bytes(raw), FROM_VM)


def test_thread_name_count_past_end():
    data = bytes.fromhex("00000001 ffffffff 006d")
    with pytest.raises(RemoteProtocolError, match="THCR: thread name: string length 4294967295"):
        ddm.decode_chunk(ChunkType.THCR, data, FROM_VM)


def test_helo_vm_ident_length_past_end():
    data = bytearray(bytes.fromhex(V4)[8:])
    data[8:12] = (1000).to_bytes(4, "big")
    with pytest.raises(RemoteProtocolError, match="HELO: VM ident: 1000 UTF-16 units"):
        ddm.decode_chunk(ChunkType.HELO, bytes(data), FROM_VM)


def test_helo_truncated_trailers_are_rejected():
    data = bytes.fromhex(V3)[19:]
    # cut inside trailer 1 (user id), inside the ABI string, inside package name's length
    for cut, what in ((0x5D - 19, "user id"), (0x70 - 19, "ABI"), (0xA2 - 19, "package name")):
        with pytest.raises(RemoteProtocolError, match=what):
            ddm.decode_chunk(ChunkType.HELO, data[:cut], FROM_VM)


def test_helo_trailers_stop_where_data_stops():
    data = bytes.fromhex(V3)[19:]
    after_abi = 0x7F - 19
    chunk = ddm.decode_chunk(ChunkType.HELO, data[:after_abi], FROM_VM)
    assert isinstance(chunk, HeloReply)
    assert (chunk.user_id, chunk.abi, chunk.jvm_flags) == (0, "64-bit (arm64)", None)
    extended = ddm.decode_chunk(ChunkType.HELO, data + b"\x01\x02", FROM_VM)
    assert isinstance(extended, HeloReply)
    assert extended.extra == b"\x01\x02"
    assert extended.encode_data() == data + b"\x01\x02"


def test_helo_native_debuggable_reads_one_as_true_only():
    data = bytearray(bytes.fromhex(V3)[19:])
    for byte, expected in ((1, True), (0, False), (2, False), (0xFF, False)):
        data[0x9F - 19] = byte
        chunk = ddm.decode_chunk(ChunkType.HELO, bytes(data), FROM_VM)
        assert isinstance(chunk, HeloReply)
        assert chunk.native_debuggable is expected


def test_apnm_extra_bytes_kept():
    data = bytes.fromhex(V17)[19:] + b"\xfe"
    chunk = ddm.decode_chunk(ChunkType.APNM, data, FROM_VM)
    assert isinstance(chunk, AppName)
    assert chunk.extra == b"\xfe"
    assert chunk.encode_data() == data


# --------------------------------------------------------------------------------------------
# THST rule T (protocol.md 3.9)


def test_thst_shipped_with_longer_header_and_entries():
    # header length 6 (2 unknown bytes), 20 bytes per entry (2 unknown bytes), 1 entry
    data = bytes.fromhex("06 14 0001 abab 0000002a 03 00000064 00000005 00000006 01 cdcd")
    chunk = ddm.decode_chunk(ChunkType.THST, data, FROM_VM)
    assert chunk == ThreadStatus(
        threads=(ThreadInfo(42, ThreadState.MONITOR, 100, 5, 6, True),),
        header_length=6,
        entry_length=20,
    )
    assert chunk.encode_data() == bytes.fromhex(
        "06 14 0001 0000 0000002a 03 00000064 00000005 00000006 01 0000"
    )


def test_thst_shipped_trailing_bytes_are_ignored():
    data = bytes.fromhex(V11)[8:] + b"\x00\x00\x00"
    assert ddm.decode_chunk(ChunkType.THST, data, FROM_VM) == THST_SHIPPED


def test_thst_unknown_status_stays_an_int():
    data = bytearray(bytes.fromhex(V11)[8:])
    data[8] = 77
    chunk = ddm.decode_chunk(ChunkType.THST, bytes(data), FROM_VM)
    assert isinstance(chunk, ThreadStatus)
    status = chunk.threads[0].status
    assert status == 77
    assert not isinstance(status, ThreadState)


def test_thst_empty_draft_is_four_zero_bytes():
    assert ddm.decode_chunk(ChunkType.THST, bytes(4), FROM_VM) == ThreadStatusDraft(())


@pytest.mark.parametrize(
    ("hexs", "message"),
    [
        ("", "0 bytes of data; both THST layouts need at least 4"),
        ("041200", "3 bytes of data"),
        (V11[16:-2], "shipped layout: 39 bytes"),  # last byte of the last entry dropped
        ("04 12 0001", "shipped layout: 4 bytes"),  # one entry declared, none present
        (V12[16:-2], "draft layout: 15 bytes"),  # one byte short
        (V12[16:] + "00", "draft layout: 17 bytes"),  # one byte too many
        ("00 00 00 01", "draft layout: 4 bytes"),  # one entry declared, none present
        ("03 12 0000", "header length 3 / entry length 18"),  # header length below 4
        ("04 11 0000", "header length 4 / entry length 17"),  # entry length below 18
        ("01 ff ffff", "header length 1 / entry length 255 match neither layout"),
    ],
)
def test_thst_rule_t_rejections(hexs, message):
    with pytest.raises(RemoteProtocolError, match=f"THST: {message}"):
        ddm.decode_chunk(ChunkType.THST, bytes.fromhex(hexs), FROM_VM)


def test_thst_request_layouts():
    assert ddm.decode_chunk(ChunkType.THST, b"", TO_VM) == ddm.ThreadStatusRequest()
    assert ddm.decode_chunk(ChunkType.THST, bytes.fromhex("000003e8"), TO_VM) == (
        ddm.ThreadStatusRequest(interval=1000)
    )
    with pytest.raises(RemoteProtocolError, match="neither 0"):
        ddm.decode_chunk(ChunkType.THST, b"\x00\x00", TO_VM)


# --------------------------------------------------------------------------------------------
# HPSG framing


def test_segment_shorter_than_header_is_rejected():
    data = bytes.fromhex(V16)[8 : 8 + 16]
    with pytest.raises(RemoteProtocolError, match="HPSG: 16 bytes"):
        ddm.decode_chunk(ChunkType.HPSG, data, FROM_VM)
    header_only = ddm.decode_chunk(ChunkType.HPSO, bytes.fromhex(V16)[8:25], FROM_VM)
    assert isinstance(header_only, ddm.HeapSegmentObjects)
    assert header_only.usage == b""


# --------------------------------------------------------------------------------------------
# ZLIB (protocol.md 2.6)


def _v23_with(
    *, original_type: str = "54484352", original_length: int = 38, stream: str = ""
) -> bytes:
    stream_hex = stream or V23[32:]
    data = (
        bytes.fromhex(original_type)
        + original_length.to_bytes(4, "big")
        + bytes.fromhex(stream_hex)
    )
    return bytes.fromhex("5a4c4942") + len(data).to_bytes(4, "big") + data


@pytest.mark.parametrize("length", [37, 39, 0])
def test_zlib_wrong_original_length_is_rejected(length):
    (chunk,) = ddm.decode_chunks(_v23_with(original_length=length), FROM_VM)
    assert isinstance(chunk, Zlib)
    with pytest.raises(RemoteProtocolError, match="ZLIB: stream for THCR inflates to"):
        ddm.inflate_chunk(chunk, FROM_VM, max_length=1 << 20)


def test_zlib_bad_stream_is_rejected():
    bad_adler = V23[32:-8] + "00000000"
    (chunk,) = ddm.decode_chunks(_v23_with(stream=bad_adler), FROM_VM)
    assert isinstance(chunk, Zlib)
    with pytest.raises(RemoteProtocolError, match="ZLIB: bad zlib stream"):
        ddm.inflate_chunk(chunk, FROM_VM, max_length=100)
    (truncated,) = ddm.decode_chunks(_v23_with(stream=V23[32:-8]), FROM_VM)
    assert isinstance(truncated, Zlib)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        ddm.inflate_chunk(truncated, FROM_VM, max_length=100)
    garbage = Zlib(ChunkType.THCR, 38, b"not zlib at all")
    with pytest.raises(RemoteProtocolError, match="bad zlib stream"):
        ddm.inflate_chunk(garbage, FROM_VM, max_length=100)
    trailing = Zlib(ChunkType.THCR, 38, bytes.fromhex(V23[32:]) + b"\x00")
    with pytest.raises(RemoteProtocolError, match="follow the end of the stream"):
        ddm.inflate_chunk(trailing, FROM_VM, max_length=100)


def test_zlib_over_limit_is_rejected_before_inflating():
    (chunk,) = ddm.decode_chunks(bytes.fromhex(V23), FROM_VM)
    assert isinstance(chunk, Zlib)
    with pytest.raises(
        RemoteProtocolError, match="original length 38 of THCR exceeds the limit 37"
    ):
        ddm.inflate_chunk(chunk, FROM_VM, max_length=37)
    # a stream that would be garbage is never looked at when the declared size is over the limit
    bomb_header = Zlib(ChunkType.THCR, 0xFFFFFFFF, b"\x00")
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        ddm.inflate_chunk(bomb_header, FROM_VM, max_length=1 << 20)


def test_zlib_bomb_stops_at_declared_length():
    bomb = zlib.compress(bytes(20_000_000), 9)  # about 20 kB inflating to 20 MB
    chunk = Zlib(ChunkType.HPDS, 100, bomb)
    with pytest.raises(RemoteProtocolError, match="more than the declared 100 bytes"):
        ddm.inflate_chunk(chunk, FROM_VM, max_length=1 << 30)


def test_zlib_inner_zlib_is_rejected():
    with pytest.raises(RemoteProtocolError, match="ZLIB: original type is ZLIB"):
        ddm.decode_chunks(_v23_with(original_type="5a4c4942"), FROM_VM)
    with pytest.raises(LocalProtocolError):
        Zlib(ChunkType.ZLIB, 0, b"")
    with pytest.raises(LocalProtocolError):
        ddm.compress_chunk(Zlib(ChunkType.THCR, 38, bytes.fromhex(V23[32:])))


def test_zlib_inner_chunk_errors_surface():
    # a valid stream whose content is not valid THDE data
    stream = zlib.compress(b"\x00\x00\x00")
    chunk = Zlib(ChunkType.THDE, 3, stream)
    with pytest.raises(RemoteProtocolError, match="THDE: thread id"):
        ddm.inflate_chunk(chunk, FROM_VM, max_length=100)


def test_zlib_shorter_than_its_header_is_rejected():
    with pytest.raises(RemoteProtocolError, match="ZLIB: original length"):
        ddm.decode_chunk(ChunkType.ZLIB, bytes.fromhex("54484352 0000"), FROM_VM)


def test_compress_chunk_round_trips_through_inflate():
    z = ddm.compress_chunk(POOL_THREAD, level=9)
    assert z.original_type == ChunkType.THCR
    assert z.original_length == 38
    assert ddm.inflate_chunk(z, FROM_VM, max_length=38) == POOL_THREAD


# --------------------------------------------------------------------------------------------
# Local validation


@pytest.mark.parametrize(
    "build",
    [
        lambda: HeloRequest(version=-1),
        lambda: HeloRequest(version=1 << 32),
        lambda: HeloReply(1, 2, "a", "b", abi="x"),  # trailer 2 without trailer 1
        lambda: HeloReply(1, 2, "a", "b", user_id=0, extra=b"\x00"),  # extra too early
        lambda: HeloReply(1, 2, "a", "b", user_id=1 << 31),
        lambda: AppName("a", package_name="p"),
        lambda: ThreadNotify(enable=1),
        lambda: ThreadDied(thread_id=-1),
        lambda: ThreadStatus(threads=(), header_length=3),
        lambda: ThreadStatus(threads=(), entry_length=17),
        lambda: ThreadStatus(threads=[]),
        lambda: ThreadInfo(1, 256, 1, 1, 1, False),
        lambda: StackFrame("a", "b", "c", 1 << 31),
        lambda: HeapSegment(1, 256, 0, 0, 0, b""),
        lambda: HeapSegment(1, 8, 0, 0, 0, bytearray()),
        lambda: HeapInfoEntry(1, 1 << 64, 0, 0, 0, 0, 0),
        lambda: Fail(code=1 << 31, message=""),
        lambda: ddm.ViewDebug(ChunkType.HELO, b""),
        lambda: AllocationFrame(0, 0, 0, 1 << 15),
        lambda: AllocationEntry(0, 0, 0, tuple(AllocationFrame(0, 0, 0, 0) for _ in range(256))),
        lambda: Allocations((AllocationEntry(0, 0, 0, ()),), (), (), ()),
    ],
)
def test_local_validation(build):
    with pytest.raises(LocalProtocolError):
        build()


def test_decode_chunk_argument_checks():
    with pytest.raises(LocalProtocolError):
        ddm.decode_chunk(-1, b"", FROM_VM)
    with pytest.raises(LocalProtocolError):
        ddm.decode_chunk(ChunkType.HELO, b"", "from_vm")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        ddm.inflate_chunk(Zlib(ChunkType.THCR, 0, b""), FROM_VM, max_length=-1)
