"""Logcat's binary format (``ddmd.protocol.logcat``): golden vectors, the recording, error
cases, Hypothesis properties.

The golden vectors below were assembled by hand, field by field, from the ``struct
logger_entry`` layouts in AOSP ``liblog/include/log/log_read.h`` (see
``golden/README.md``); ddmd has no encoder for this format. Round trips use the test-side
writer ``tests/logcat/writer.py``, written from the same layouts.
"""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.protocol.logcat import (
    DEFAULT_MAX_PAYLOAD,
    EOF,
    LOGGER_ENTRY_MAX_LEN,
    LOGGER_ENTRY_MAX_PAYLOAD,
    MAX_HEADER_SIZE,
    NEED_DATA,
    Buffer,
    Level,
    LogcatDecoder,
    LogcatMalformed,
    LogEntry,
    buffer_name,
    level_letter,
    parse_level,
)
from tests.logcat import recording as rec
from tests.logcat.writer import Record, write_record, write_records

# --------------------------------------------------------------------------------------------
# Golden vectors: (name, bytes, the entry they hold). Header fields in the order of the struct,
# each little-endian; payloads as <priority><tag>\0<message>\0.

G_V1 = bytes.fromhex(
    "0b00"  # len 11
    "0000"  # __pad (v1: hdr_size 0)
    "d2040000"  # pid 1234
    "d8040000"  # tid 1240
    "00f15365"  # sec 1700000000
    "15cd5b07"  # nsec 123456789
    "04"  # INFO
    "54616700"  # "Tag\0"
    "68656c6c6f00"  # "hello\0"
)
G_V3 = bytes.fromhex(
    "2000"  # len 32
    "1800"  # hdr_size 24
    "58020000"  # pid 600
    "78020000"  # tid 632
    "01f15365"  # sec 1700000001
    "ffc99a3b"  # nsec 999999999
    "03000000"  # lid 3 (system)
    "05"  # WARN
    "41637469766974794d616e6167657200"  # "ActivityManager\0"
    "536c6f77206f7065726174696f6e00"  # "Slow operation\0"
)
G_V4 = bytes.fromhex(
    "1000"  # len 16
    "1c00"  # hdr_size 28
    "92100000"  # pid 4242
    "a1100000"  # tid 4257
    "02f15365"  # sec 1700000002
    "00000000"  # nsec 0
    "00000000"  # lid 0 (main)
    "8b270000"  # uid 10123
    "02"  # VERBOSE
    "4d61696c2053796e6300"  # "Mail Sync\0": a tag with a space
    "706f6c6c00"  # "poll\0"
)
G_MULTILINE = (
    bytes.fromhex(
        "4c00"  # len 76
        "1c00"  # hdr_size 28
        "cc100000"  # pid 4300
        "cc100000"  # tid 4300
        "07f15365"  # sec 1700000007
        "903e0000"  # nsec 16016
        "04000000"  # lid 4 (crash)
        "8c270000"  # uid 10124
    )
    + b"\x06"  # ERROR
    + b"AndroidRuntime\x00"
    + b"FATAL EXCEPTION: main\nProcess: com.example.maps, PID: 4300\n\x00"
)
G_BAD_UTF8 = bytes.fromhex(
    "1000"  # len 16
    "1c00"  # hdr_size 28
    "92100000"  # pid 4242
    "a3100000"  # tid 4259
    "01f15365"  # sec 1700000001
    "05000000"  # nsec 5
    "00000000"  # lid 0
    "8b270000"  # uid 10123
    "06"  # ERROR
    "4d61696c53746f726500"  # "MailStore\0"
    "636166e900"  # "caf" 0xe9 "\0": Latin-1, not UTF-8
)
G_NO_FINAL_NUL = bytes.fromhex(
    "0b00"  # len 11
    "1c00"  # hdr_size 28
    "01000000"  # pid 1
    "01000000"  # tid 1
    "00000000"  # sec 0
    "00000000"  # nsec 0
    "00000000"  # lid 0
    "00000000"  # uid 0
    "04"  # INFO
    "54616700"  # "Tag\0"
    "6e6f206e756c"  # "no nul", no final NUL
)
G_EXTENDED = bytes.fromhex(
    "0700"  # len 7
    "2000"  # hdr_size 32: a v4 header extended by 4 bytes (liblog since Android 11)
    "07000000"  # pid 7
    "08000000"  # tid 8
    "09000000"  # sec 9
    "0a000000"  # nsec 10
    "03000000"  # lid 3
    "d0070000"  # uid 2000
    "deadbeef"  # a field ddmd does not know
    "03"  # DEBUG
    "5400"  # "T\0"
    "6d736700"  # "msg\0"
)
G_EVENTS = bytes.fromhex(
    "0900"  # len 9
    "1c00"  # hdr_size 28
    "58020000"  # pid 600
    "bc020000"  # tid 700
    "00f15365"  # sec 1700000000
    "00000000"  # nsec 0
    "02000000"  # lid 2 (events): a binary payload
    "e8030000"  # uid 1000
    "31750000"  # event tag 30001
    "00"  # EVENT_TYPE_INT
    "05000000"  # 5
)

GOLDEN = [
    ("v1", G_V1, LogEntry(1700000000, 123456789, 1234, 1240, 4, "Tag", "hello", None, None)),
    (
        "v3",
        G_V3,
        LogEntry(1700000001, 999999999, 600, 632, 5, "ActivityManager", "Slow operation", 3, None),
    ),
    ("v4", G_V4, LogEntry(1700000002, 0, 4242, 4257, 2, "Mail Sync", "poll", 0, 10123)),
    (
        "multiline",
        G_MULTILINE,
        LogEntry(
            1700000007,
            16016,
            4300,
            4300,
            6,
            "AndroidRuntime",
            "FATAL EXCEPTION: main\nProcess: com.example.maps, PID: 4300\n",
            4,
            10124,
        ),
    ),
    (
        "bad_utf8",
        G_BAD_UTF8,
        LogEntry(1700000001, 5, 4242, 4259, 6, "MailStore", "caf\ufffd", 0, 10123),
    ),
    ("no_final_nul", G_NO_FINAL_NUL, LogEntry(0, 0, 1, 1, 4, "Tag", "no nul", 0, 0)),
    ("extended", G_EXTENDED, LogEntry(9, 10, 7, 8, 3, "T", "msg", 3, 2000)),
    ("events", G_EVENTS, LogEntry(1700000000, 0, 600, 700, 4, "[30001]", "0005000000", 2, 1000)),
]
GOLDEN_IDS = [g[0] for g in GOLDEN]


def drain(decoder: LogcatDecoder) -> list[LogEntry]:
    out: list[LogEntry] = []
    while True:
        event = decoder.next_entry()
        if event is NEED_DATA or event is EOF:
            return out
        assert isinstance(event, LogEntry)
        out.append(event)


def decode_all(data: bytes, *, pieces: int | None = None, **kw: int) -> list[LogEntry]:
    """Decode ``data`` whole (or in ``pieces``-byte steps), then EOF: the entries."""
    decoder = LogcatDecoder(**kw)
    out: list[LogEntry] = []
    step = pieces or max(len(data), 1)
    for i in range(0, len(data), step):
        decoder.receive_data(data[i : i + step])
        out += drain(decoder)
    decoder.receive_data(b"")
    out += drain(decoder)
    assert decoder.next_entry() is EOF
    assert decoder.buffered == 0
    return out


def test_golden_lengths_are_what_the_headers_say():
    # Guards the hand assembly: header size + len field == the bytes written.
    for name, raw, _ in GOLDEN:
        length, hdr_size = struct.unpack_from("<HH", raw)
        assert (hdr_size or 20) + length == len(raw), name


@pytest.mark.parametrize(("name", "raw", "entry"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_whole(name, raw, entry):
    assert decode_all(raw) == [entry]


@pytest.mark.parametrize(("name", "raw", "entry"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_one_byte_at_a_time(name, raw, entry):
    decoder = LogcatDecoder()
    got: list[LogEntry] = []
    for i in range(len(raw)):
        decoder.receive_data(raw[i : i + 1])
        got += drain(decoder)
        if i < len(raw) - 1:
            assert got == []
            assert decoder.buffered == i + 1
    assert got == [entry]
    assert decoder.buffered == 0


@pytest.mark.parametrize(("name", "raw", "entry"), GOLDEN, ids=GOLDEN_IDS)
def test_golden_back_to_back(name, raw, entry):
    assert decode_all(raw * 6) == [entry] * 6
    assert decode_all(raw * 6, pieces=7) == [entry] * 6


def test_all_golden_in_one_stream():
    stream = b"".join(raw for _, raw, _ in GOLDEN)
    want = [entry for _, _, entry in GOLDEN]
    assert decode_all(stream) == want
    assert decode_all(stream, pieces=1) == want


def test_golden_details():
    v1, v3, v4, multi, bad, _, _, events = (e for _, _, e in GOLDEN)
    assert (v1.buffer, v1.uid, v1.buffer_name) == (None, None, None)
    assert (v3.buffer_name, v3.uid) == ("system", None)
    assert (v4.buffer_name, v4.uid, v4.tag) == ("main", 10123, "Mail Sync")
    assert multi.message.splitlines()[1] == "Process: com.example.maps, PID: 4300"
    assert multi.buffer_name == "crash"
    assert bad.message == "caf\N{REPLACEMENT CHARACTER}"
    assert events.level == Level.INFO


def test_v2_euid_reads_as_the_buffer_id():
    # hdr_size 24 is v2 (euid, Android 4.x kernel logger) or v3 (lid, logd): the same bytes.
    # exec: needs Android 5+, so ddmd reads v3; a v2 euid would show as the buffer id.
    raw = write_record(Record(1, 2, 3, 4, 4, "T", b"m", lid=0, uid=1000), version=2)
    assert decode_all(raw) == [LogEntry(1, 2, 3, 4, 4, "T", "m", 1000, None)]


# --------------------------------------------------------------------------------------------
# The recording (tests/logcat/recording.py)


def test_recording_decodes_to_its_entries():
    assert decode_all(rec.STREAM) == list(rec.ENTRIES)
    assert decode_all(rec.STREAM, pieces=1) == list(rec.ENTRIES)
    assert decode_all(rec.STREAM * 3, pieces=4093) == list(rec.ENTRIES) * 3


def test_recording_has_what_it_promises():
    entries = rec.ENTRIES
    assert {e.level for e in entries} >= {2, 3, 4, 5, 6, 7}
    assert {e.buffer_name for e in entries} == {"main", "system", "crash"}
    assert any(" " in e.tag for e in entries)
    assert any("\ufffd" in e.message for e in entries)
    assert any(e.message.count("\n") >= 3 for e in entries)
    stamps = [(e.sec, e.nsec) for e in entries]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)
    java = [entries[i] for i in rec.crash_lines("java", rec.MAPS)]
    assert len(java) == 1  # one multi-line entry, as Log.printlns writes it
    assert java[0].message.startswith("FATAL EXCEPTION: main\nProcess: com.example.maps, PID: 4300")
    tombstone = [
        entries[i] for i in rec.crash_lines("native", rec.MAIL) if entries[i].tag == "DEBUG"
    ]
    assert tombstone[0].message.startswith("*** *** ***")
    assert {e.pid for e in tombstone} == {rec.CRASH_DUMP_PID}
    by_pid = {e.pid for i, e in enumerate(entries) if i in rec.lines_of(rec.MAIL)}
    assert by_pid == {rec.MAIL_PID, rec.MAIL_PID_2}
    other = [entries[i] for i in rec.lines_of(rec.OTHER)]
    assert other
    assert {e.pid for e in other} == {rec.MAIL_PID}  # pid 4242, reused


# --------------------------------------------------------------------------------------------
# Payload edges (logprint's reading)


def one(payload: bytes, *, hdr_size: int = 28, lid: int = 0) -> LogEntry:
    head = struct.pack("<HHiIIIII", len(payload), hdr_size, 1, 2, 3, 4, lid, 5)
    (entry,) = decode_all(head[: hdr_size or 20] + payload)
    return entry


def test_bytes_after_the_message_nul_are_ignored():
    assert one(b"\x04T\x00msg\x00trailing junk").message == "msg"


def test_payload_without_any_nul_splits_the_tag_at_an_odd_byte():
    e = one(b"\x04MyTag: the message")
    assert (e.tag, e.message) == ("MyTag", " the message")
    e = one(b"\x04Tag message")
    assert (e.tag, e.message) == ("Tag", "message")
    e = one(b"\x04OnlyATag")
    assert (e.tag, e.message) == ("OnlyATag", "")


def test_tiny_payloads():
    assert one(b"\x05") == LogEntry(3, 4, 1, 2, 5, "", "", 0, 5)
    assert (one(b"\x05\x00").tag, one(b"\x05\x00").message) == ("", "")
    assert (one(b"\x05T\x00").tag, one(b"\x05T\x00").message) == ("T", "")


def test_newlines_and_tabs_are_kept():
    e = one(b"\x06AndroidRuntime\x00a\n\tat b\r\nc\n\x00")
    assert e.message == "a\n\tat b\r\nc\n"


def test_invalid_utf8_in_the_tag_is_replaced():
    assert one(b"\x04T\xff\x00m\x00").tag == "T\ufffd"


def test_binary_buffers():
    assert one(b"\x31\x75\x00\x00\x02", lid=Buffer.STATS) == LogEntry(
        3, 4, 1, 2, Level.INFO, "[30001]", "02", 5, 5
    )
    security = one(b"\x01\x00\x00\x00", lid=Buffer.SECURITY)
    assert (security.level, security.tag, security.message) == (Level.WARN, "[1]", "")
    short = one(b"\x01\x02", lid=Buffer.EVENTS)
    assert (short.tag, short.message) == ("", "0102")


def test_unknown_buffer_ids_are_data():
    e = one(b"\x04T\x00m\x00", lid=99)
    assert (e.buffer, e.buffer_name, e.message) == (99, "99", "m")


def test_hdr_size_20_is_a_v1_header():
    assert one(b"\x04T\x00m\x00", hdr_size=20) == LogEntry(3, 4, 1, 2, 4, "T", "m", None, None)


# --------------------------------------------------------------------------------------------
# Errors


def header(length: int, hdr_size: int, nsec: int = 0) -> bytes:
    return struct.pack("<HHiIIIII", length, hdr_size, 1, 2, 3, nsec, 0, 0)[: hdr_size or 20]


def malformed(data: bytes, *, eof: bool = False, **kw: int) -> str:
    decoder = LogcatDecoder(**kw)
    decoder.receive_data(data)
    if eof:
        decoder.receive_data(b"")
    with pytest.raises(LogcatMalformed) as caught:
        drain(decoder)
    # The decoder stays broken: the same error again.
    with pytest.raises(LogcatMalformed) as again:
        decoder.next_entry()
    assert again.value is caught.value
    assert isinstance(caught.value, RemoteProtocolError)
    return str(caught.value)


@pytest.mark.parametrize("hdr_size", [1, 4, 19, 21, 23, 25, 27, MAX_HEADER_SIZE + 1, 0xFFFF])
def test_bad_header_size(hdr_size):
    text = malformed(struct.pack("<HH", 5, hdr_size) + bytes(40))
    assert f"header size {hdr_size} " in text


def test_bad_header_size_is_seen_from_the_first_four_bytes():
    assert "header size 3" in malformed(struct.pack("<HH", 5, 3))


def test_payload_length_zero():
    assert "payload length 0 " in malformed(header(0, 28))


def test_payload_length_over_the_cap():
    assert "payload length 101 is outside 1..100" in malformed(header(101, 28), max_payload=100)
    assert f"payload length {DEFAULT_MAX_PAYLOAD + 1} " in malformed(
        header(DEFAULT_MAX_PAYLOAD + 1, 28)
    )


def test_the_largest_payload_is_accepted():
    body = b"\x04T\x00" + b"x" * (DEFAULT_MAX_PAYLOAD - 4) + b"\x00"
    (entry,) = decode_all(header(len(body), 28) + body)
    assert len(entry.message) == DEFAULT_MAX_PAYLOAD - 4


def test_limits_are_androids():
    assert LOGGER_ENTRY_MAX_PAYLOAD == 4068
    assert LOGGER_ENTRY_MAX_LEN == DEFAULT_MAX_PAYLOAD == 5 * 1024


def test_nsec_out_of_range():
    body = b"\x04T\x00m\x00"
    assert "nsec 1000000000" in malformed(header(len(body), 28, nsec=10**9) + body)


@pytest.mark.parametrize("cut", [1, 3, 4, 19, 27, 28, 30])
def test_truncated_at_eof(cut):
    raw = rec.RECORD_BYTES[1]
    text = malformed(raw[:cut], eof=True)
    assert f"({cut} bytes buffered)" in text
    # And after whole entries:
    decoder = LogcatDecoder()
    decoder.receive_data(rec.RECORD_BYTES[0] + raw[:cut])
    decoder.receive_data(b"")
    assert decoder.next_entry() == rec.ENTRIES[0]
    with pytest.raises(LogcatMalformed, match="ended inside an entry"):
        decoder.next_entry()


def test_data_after_eof_is_a_local_error():
    decoder = LogcatDecoder()
    decoder.receive_data(b"")
    decoder.receive_data(b"")  # a second EOF is harmless
    with pytest.raises(LocalProtocolError):
        decoder.receive_data(b"x")
    assert decoder.next_entry() is EOF


@pytest.mark.parametrize("cap", [0, -1, 0x10000])
def test_bad_cap(cap):
    with pytest.raises(LocalProtocolError, match=str(cap)):
        LogcatDecoder(max_payload=cap)


def test_log_entry_checks_nsec():
    with pytest.raises(LocalProtocolError, match="nsec"):
        LogEntry(0, 10**9, 1, 1, 4, "T", "m")


# --------------------------------------------------------------------------------------------
# Levels and buffers


def test_level_letters():
    assert [level_letter(n) for n in range(10)] == list("??VDIWEF??")
    assert level_letter(Level.ERROR) == "E"
    assert level_letter(-1) == "?"


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("V", Level.VERBOSE),
        ("d", Level.DEBUG),
        ("Info", Level.INFO),
        ("w", Level.WARN),
        ("WARNING", Level.WARN),
        ("error", Level.ERROR),
        ("F", Level.FATAL),
        ("assert", Level.FATAL),
        ("silent", Level.SILENT),
        (" e ", Level.ERROR),
    ],
)
def test_parse_level(text, level):
    assert parse_level(text) is level


@pytest.mark.parametrize("text", ["", "x", "7", "warnings", "VERBOSE!"])
def test_parse_level_refuses(text):
    with pytest.raises(ValueError, match="unknown log level") as caught:
        parse_level(text)
    assert repr(text) in str(caught.value)
    assert "V, D, I, W, E, F" in str(caught.value)


def test_level_values_are_androids():
    assert [int(x) for x in Level] == list(range(9))
    assert (Level.VERBOSE, Level.FATAL) == (2, 7)


def test_buffer_names():
    names = [buffer_name(n) for n in range(8)]
    assert names == ["main", "radio", "events", "system", "crash", "stats", "security", "kernel"]
    assert buffer_name(None) is None
    assert buffer_name(8) == "8"


# --------------------------------------------------------------------------------------------
# Bounded, linear


def test_memory_stays_bounded_while_draining():
    decoder = LogcatDecoder()
    chunk = rec.STREAM * 4
    for _ in range(50):
        for i in range(0, len(chunk), 1000):
            decoder.receive_data(chunk[i : i + 1000])
            drain(decoder)
            # consumed bytes are dropped once they are half the buffer
            assert len(decoder._buf) <= 2 * (1000 + LOGGER_ENTRY_MAX_LEN)
    assert decoder.buffered == 0


def test_protocol_logcat_loads_no_io_library():
    code = (
        "import sys, ddmd.protocol.logcat\n"
        "bad = ('trio', 'structlog', 'adbutils', 'socket')\n"
        "print(','.join(m for m in bad if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------------------------
# Hypothesis

u32 = st.integers(0, 2**32 - 1)
i31 = st.integers(0, 2**31 - 1)
TEXT_BUFFERS = st.sampled_from([0, 1, 3, 4, 7]) | st.integers(8, 2**32 - 1)


@st.composite
def records(draw: st.DrawFn) -> Record:
    return Record(
        sec=draw(i31),
        nsec=draw(st.integers(0, 999_999_999)),
        pid=draw(i31),
        tid=draw(i31),
        level=draw(st.integers(0, 255)),
        tag=draw(
            st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=30)
        ),
        message=draw(st.binary(max_size=300)).replace(b"\0", b"."),
        lid=draw(TEXT_BUFFERS),
        uid=draw(u32),
    )


def expected(record: Record, version: int) -> LogEntry:
    entry = rec.entry_of(record)
    return LogEntry(
        entry.sec,
        entry.nsec,
        entry.pid,
        entry.tid,
        entry.level,
        entry.tag,
        entry.message,
        record.lid if version in (3, 4) else None,
        record.uid if version == 4 else None,
    )


@given(st.lists(records(), max_size=12), st.sampled_from([1, 3, 4]))
def test_round_trip_through_the_test_writer(recs, version):
    raw = write_records(recs, version=version)
    assert decode_all(raw) == [expected(r, version) for r in recs]


@given(st.lists(records(), min_size=1, max_size=8), st.data())
def test_split_anywhere(recs, data):
    raw = write_records(recs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    decoder = LogcatDecoder()
    got: list[LogEntry] = []
    last = 0
    for cut in [*cuts, len(raw)]:
        if cut == last:
            continue  # b"" would say EOF
        decoder.receive_data(raw[last:cut])
        got += drain(decoder)
        last = cut
    decoder.receive_data(b"")
    got += drain(decoder)
    assert got == [expected(r, 4) for r in recs]


def _fuzz(pieces: list[bytes], max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
    decoder = LogcatDecoder(max_payload=max_payload)
    try:
        for piece in [*pieces, b""]:
            decoder.receive_data(piece)
            while True:
                event = decoder.next_entry()
                if event is NEED_DATA or event is EOF:
                    break
                assert isinstance(event, LogEntry)
                assert isinstance(event.tag, str)
                assert isinstance(event.message, str)
                assert 0 <= event.nsec < 10**9
    except LogcatMalformed:
        pass


@given(st.lists(st.binary(min_size=1, max_size=600), max_size=4), st.integers(1, 2000))
def test_fuzz_any_bytes(pieces, max_payload):
    _fuzz(pieces, max_payload)


@given(st.integers(0, len(rec.STREAM) - 1), st.integers(0, 255), st.integers(1, len(rec.STREAM)))
def test_fuzz_one_byte_changed_in_the_recording(position, value, keep):
    raw = bytearray(rec.STREAM[:keep])
    if position < len(raw):
        raw[position] = value
    _fuzz([bytes(raw)])
