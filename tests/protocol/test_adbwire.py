"""ddmd.protocol.adbwire: the adb host protocol's records, answers and lists, as bytes only.

The device and pid list tests came from tests/adb/test_adb_discovery.py when the parsing moved
here from discovery/adb.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.adbwire import (
    AdbMalformed,
    DeviceLine,
    RecordDecoder,
    parse_devices,
    parse_length,
    parse_pids,
    parse_status,
    parse_version,
)
from ddmd.protocol.errors import RemoteProtocolError


def record(payload: bytes) -> bytes:
    """Written here by hand (4 lowercase hex digits, then the payload), not by ddmd."""
    return b"%04x" % len(payload) + payload


def test_parse_device_lists_short_and_long():
    devices, problems = parse_devices(
        b"emulator-5554\tdevice\n"
        b"R58M123ABC             device usb:1-1 product:beyond1 model:SM_G973F device:beyond1"
        b" transport_id:3\n"
        b"0123456789ABCDEF       no permissions (user in plugdev group); see [http://x/y]"
        b" usb:1-2 transport_id:4\n"
        b"192.168.1.7:5555\tunauthorized\n"
        b"lonely\n"
    )
    assert devices == (
        DeviceLine("emulator-5554", "device"),
        DeviceLine("R58M123ABC", "device", "SM_G973F", "beyond1"),
        DeviceLine("0123456789ABCDEF", "no permissions (user in plugdev group); see [http://x/y]"),
        DeviceLine("192.168.1.7:5555", "unauthorized"),
    )
    assert len(problems) == 1
    assert "lonely" in problems[0]


def test_parse_pids_skips_what_is_not_a_pid():
    assert parse_pids(b"") == ((), ())
    assert parse_pids(b"1234\n99\n1234\n") == ((1234, 99), ())
    assert parse_pids(b"12\nabc\n-5\n0\n\xd9\xa3\n99999999999\n34\n") == (
        (12, 34),
        ("abc", "-5", "0", "\u0663", "99999999999"),
    )


def test_parse_length():
    assert parse_length(b"001a") == 26
    assert parse_length(b"FFFF") == 65535
    for bad in (b"zz12", b"+0a1", b" 12 ", b"12", b"0x1f"):
        with pytest.raises(AdbMalformed):
            parse_length(bad)


@given(st.binary(max_size=300))
def test_parsers_never_crash(data):
    parse_devices(data)
    parse_pids(data)


def test_status_okay_fail_and_anything_else():
    assert parse_status("host:version", b"OKAY") is True
    assert parse_status("jdwp:1234", b"FAIL") is False
    for bad in (b"OKAX", b"okay", b"FAI", b"\x00\x00\x00\x00"):
        with pytest.raises(AdbMalformed, match="jdwp:1234: expected OKAY or FAIL"):
            parse_status("jdwp:1234", bad)


def test_version_is_hex():
    assert parse_version(b"0029") == 41
    assert parse_version(b"001F") == 31
    for bad in (b"", b"zz", b"\xff\xfe", b"12 34"):
        with pytest.raises(AdbMalformed, match="is not a hex number"):
            parse_version(bad)


def test_malformed_is_a_remote_protocol_error():
    assert issubclass(AdbMalformed, RemoteProtocolError)


def test_records_whole_and_empty():
    decoder = RecordDecoder()
    assert decoder.next_record() is None
    decoder.receive_data(record(b"emulator-5554\tdevice\n") + record(b"") + record(b"12\n"))
    assert decoder.next_record() == b"emulator-5554\tdevice\n"
    assert decoder.next_record() == b""
    assert decoder.next_record() == b"12\n"
    assert decoder.next_record() is None
    assert decoder.buffered == 0


def test_record_byte_by_byte():
    wire = record(b"1234\n5678\n")
    decoder = RecordDecoder()
    for i in range(len(wire) - 1):
        decoder.receive_data(wire[i : i + 1])
        assert decoder.next_record() is None
        assert decoder.buffered == i + 1
    decoder.receive_data(wire[-1:])
    assert decoder.next_record() == b"1234\n5678\n"
    assert decoder.buffered == 0


def test_record_with_a_bad_length():
    decoder = RecordDecoder()
    decoder.receive_data(b"0x1fabc")
    with pytest.raises(AdbMalformed, match="is not 4 hex digits"):
        decoder.next_record()


@given(st.lists(st.binary(max_size=40), max_size=6), st.data())
def test_records_split_anywhere(payloads, data):
    wire = b"".join(record(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = RecordDecoder()
    got = []
    start = 0
    for cut in [*cuts, len(wire)]:
        decoder.receive_data(wire[start:cut])
        start = cut
        while (item := decoder.next_record()) is not None:
            got.append(item)
    assert got == payloads
    assert decoder.buffered == 0


@given(st.binary(max_size=300))
def test_record_decoder_never_crashes(data):
    decoder = RecordDecoder()
    decoder.receive_data(data)
    try:
        while decoder.next_record() is not None:
            pass
    except AdbMalformed:
        pass
