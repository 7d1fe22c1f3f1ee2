"""The SMON chunk codec: golden bytes written out by hand from the layout, round trips, and a
clear error for every kind of bad input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.sysmon import CHUNK_TYPE, CHUNK_TYPE_CODE, SystemReport, decode_report, encode_report
from ddmd.sysmon.chunk import thousandths

# Layout version 1, three CPUs (offsets as in ddmd/sysmon/chunk.py's docstring and in
# docs/protocol-notes.md).
GOLDEN_HEX = (
    "01"  # 0   layout version 1
    "0000018bcfe5687b"  # 1   timestamp 1700000000123 ms
    "000004e2"  # 9   load 1 min 1.250
    "000001f4"  # 13  load 5 min 0.500
    "00000000"  # 17  load 15 min 0.000
    "0000000000fa0000"  # 21  MemTotal 16384000 KiB
    "00000000007d0000"  # 29  MemAvailable 8192000 KiB
    "00000000003e8000"  # 37  MemFree 4096000 KiB
    "00000000001ffffc"  # 45  SwapTotal 2097148 KiB
    "ffffffffffffffff"  # 53  SwapFree: not reported
    "000003e8"  # 61  CPU sample period 1000 ms
    "0003"  # 65  3 CPUs
    "007d"  # 67  CPU 0: 125 thousandths busy
    "03e8"  # 69  CPU 1: all busy
    "ffff"  # 71  CPU 2: not known
)
GOLDEN = bytes.fromhex(GOLDEN_HEX)
REPORT = SystemReport(
    timestamp_ms=1_700_000_000_123,
    load1=1250,
    load5=500,
    load15=0,
    mem_total=16_384_000,
    mem_available=8_192_000,
    mem_free=4_096_000,
    swap_total=2_097_148,
    swap_free=None,
    cpu_period_ms=1000,
    cpu_busy=(125, 1000, None),
)


def test_the_type_is_four_ascii_letters_android_does_not_use() -> None:
    assert CHUNK_TYPE == "SMON"
    assert CHUNK_TYPE_CODE == 0x534D4F4E
    from ddmd.protocol.ddm import ChunkType

    assert CHUNK_TYPE_CODE not in set(ChunkType)


def test_golden_bytes() -> None:
    assert len(GOLDEN) == 67 + 2 * 3
    assert decode_report(GOLDEN) == REPORT
    assert encode_report(REPORT) == GOLDEN
    assert REPORT.encode() == GOLDEN
    assert SystemReport.decode(memoryview(GOLDEN)) == REPORT
    assert REPORT.loads == (1.25, 0.5, 0.0)
    assert REPORT.cpu_busy_mean == pytest.approx(0.5625)


def test_no_cpus() -> None:
    data = GOLDEN[:65] + b"\x00\x00"
    report = decode_report(data)
    assert report.cpu_busy == ()
    assert report.cpu_busy_mean is None
    assert encode_report(report) == data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty data"),
        (b"\x02" + GOLDEN[1:], "layout version 2 is not known"),
        (b"\x00" + GOLDEN[1:], "layout version 0 is not known"),
        (GOLDEN[:66], "shorter than the 67-byte fixed part"),
        (GOLDEN[:-1], "3 CPUs make a 73-byte report"),
        (GOLDEN + b"\x00", "3 CPUs make a 73-byte report"),
        (GOLDEN[:65] + b"\x00\x04" + GOLDEN[67:], "4 CPUs make a 75-byte report"),
        (GOLDEN[:-2] + b"\x03\xe9", "CPU 2 busy share 1001 is above 1000"),
    ],
)
def test_bad_input_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message) as caught:
        decode_report(data)
    assert str(caught.value).startswith("SMON: ")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("load1", -1),
        ("load5", 1 << 32),
        ("mem_total", 0xFFFFFFFFFFFFFFFF),  # the "not reported" marker is not a value
        ("cpu_busy", (1001,)),
        ("cpu_busy", [1, 2]),
        ("timestamp_ms", 1.5),
        ("cpu_period_ms", True),
    ],
)
def test_impossible_reports_are_refused(field: str, value: object) -> None:
    fields = {name: getattr(REPORT, name) for name in REPORT.__dataclass_fields__}
    fields[field] = value
    with pytest.raises(LocalProtocolError, match=field):
        SystemReport(**fields)  # type: ignore[arg-type]


def test_thousandths() -> None:
    assert thousandths(1.2345) == 1234
    assert thousandths(1.2355) == 1236
    assert thousandths(-0.5) == 0
    assert thousandths(float("nan")) == 0
    assert thousandths(5e9) == 0xFFFFFFFF
    assert thousandths(1.5, 1000) == 1000


kib = st.none() | st.integers(0, 0xFFFFFFFFFFFFFFFE)
reports = st.builds(
    SystemReport,
    timestamp_ms=st.integers(0, 0xFFFFFFFFFFFFFFFF),
    load1=st.integers(0, 0xFFFFFFFF),
    load5=st.integers(0, 0xFFFFFFFF),
    load15=st.integers(0, 0xFFFFFFFF),
    mem_total=kib,
    mem_available=kib,
    mem_free=kib,
    swap_total=kib,
    swap_free=kib,
    cpu_period_ms=st.integers(0, 0xFFFFFFFF),
    cpu_busy=st.lists(st.none() | st.integers(0, 1000), max_size=300).map(tuple),
)


@given(reports)
def test_round_trip(report: SystemReport) -> None:
    assert decode_report(encode_report(report)) == report


@given(st.binary(max_size=200) | st.binary(min_size=66, max_size=200).map(lambda b: b"\x01" + b))
def test_any_bytes_decode_or_raise_the_protocol_error(data: bytes) -> None:
    try:
        report = decode_report(data)
    except RemoteProtocolError:
        return
    assert encode_report(report) == data
