"""ddmd.protocol.adbwire, the client side: requests as adb clients send them to a server, the
service names the front acts on, and the replies it builds. Golden bytes from
/work/shared/docs/adb-front.md (captured from Debian's adb 29.0.6 server and client) and from
adb's own ``parse_host_service`` cases.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol.adbrequests import (
    ANY,
    MAX_PAYLOAD,
    NEED_DATA,
    AdbBadRequest,
    BadHostPrefix,
    DeviceService,
    Forward,
    HostQuery,
    JdwpPid,
    Kill,
    KillForward,
    KillForwardAll,
    ListForward,
    Request,
    RequestDecoder,
    Selector,
    TransportSwitch,
    Version,
    fail,
    forward_line,
    frame,
    jdwp_pid,
    merge_forward_list,
    okay,
    okay_okay_port,
    parse_host_service,
    parse_service,
    parse_transport_id,
    request,
    tcp_port,
    transport_id_bytes,
)
from ddmd.protocol.adbwire import AdbMalformed
from ddmd.protocol.errors import LocalProtocolError, ProtocolError

# What clients were seen sending (adb-front.md sections 3 and 4): upper- and lower-case hex.
GOLDEN_REQUESTS = [
    (b"000chost:version", "host:version"),
    (b"001Chost:transport:emulator-5554", "host:transport:emulator-5554"),
    (b"000Atrack-jdwp", "track-jdwp"),
    (b"000ehost:tport:any", "host:tport:any"),
    (b"001fhost:tport:serial:emulator-5554", "host:tport:serial:emulator-5554"),
    (b"0004jdwp", "jdwp"),
    (b"0009jdwp:4242", "jdwp:4242"),
    (b"0020host:forward:tcp:19000;jdwp:4242", "host:forward:tcp:19000;jdwp:4242"),
    (b"0011host:list-forward", "host:list-forward"),
    (b"0009host:kill", "host:kill"),
    (b"000Dshell:getprop", "shell:getprop"),
    (b"0014host:track-devices-l", "host:track-devices-l"),
]


def decode_all(data: bytes, decoder: RequestDecoder | None = None) -> list[str]:
    decoder = decoder or RequestDecoder()
    decoder.receive_data(data)
    out = []
    while (got := decoder.next_request()) is not NEED_DATA:
        assert isinstance(got, Request)
        out.append(got.service)
    return out


# --- requests: whole, a byte at a time, back to back


@pytest.mark.parametrize(("wire", "service"), GOLDEN_REQUESTS)
def test_golden_requests_whole(wire, service):
    decoder = RequestDecoder()
    decoder.receive_data(wire)
    got = decoder.next_request()
    assert isinstance(got, Request)
    assert got.wire == wire  # relayed byte for byte, the case of the hex digits included
    assert got.service == service
    assert got.payload == service.encode()
    assert decoder.next_request() is NEED_DATA
    assert decoder.buffered == 0


@pytest.mark.parametrize(("wire", "service"), GOLDEN_REQUESTS)
def test_golden_requests_one_byte_at_a_time(wire, service):
    decoder = RequestDecoder()
    for i, byte in enumerate(wire):
        assert decoder.next_request() is NEED_DATA
        decoder.receive_data(bytes([byte]))
        if i < len(wire) - 1:
            assert decoder.next_request() is NEED_DATA
    got = decoder.next_request()
    assert isinstance(got, Request)
    assert (got.wire, got.service) == (wire, service)


def test_golden_requests_back_to_back():
    stream = b"".join(wire for wire, _ in GOLDEN_REQUESTS)
    assert decode_all(stream) == [service for _, service in GOLDEN_REQUESTS]


def test_bytes_after_a_request_stay_buffered_for_the_relay():
    decoder = RequestDecoder()
    decoder.receive_data(b"0009jdwp:4242JDWP-Handshake")
    got = decoder.next_request()
    assert isinstance(got, Request)
    assert got.service == "jdwp:4242"
    # The handshake is no request (asked for one, "JDWP" is a bad length): whoever serves the
    # stream takes the bytes as they are.
    assert decoder.buffered == len(b"JDWP-Handshake")
    assert decoder.take_buffer() == b"JDWP-Handshake"
    assert decoder.buffered == 0


def test_needed_never_reads_past_a_request():
    wire = b"0009jdwp:4242JDWP-Handshake"
    decoder = RequestDecoder()
    at = 0
    while (got := decoder.next_request()) is NEED_DATA:
        step = decoder.needed
        assert step >= 1
        decoder.receive_data(wire[at : at + step])
        at += step
    assert isinstance(got, Request)
    assert got.service == "jdwp:4242"
    assert wire[at:] == b"JDWP-Handshake"  # still "in the socket"
    assert decoder.buffered == 0
    assert decoder.needed == 4


def test_request_builder_is_what_adb_sends():
    assert request("host:version") == b"000chost:version"
    assert request("host-transport-id:1:get-serialno") == b"0020host-transport-id:1:get-serialno"


# --- bad requests (adb's server closes the socket without a reply)


@pytest.mark.parametrize(
    ("wire", "fragment"),
    [
        (b"0000", "length 0"),
        (b"zzzz", "not 4 hex digits"),
        (b"+00c", "not 4 hex digits"),  # int(..., 16) would take these
        (b" 00c", "not 4 hex digits"),
        (b"0x0c", "not 4 hex digits"),
        (b"1_00", "not 4 hex digits"),
        (b"\xff\xff\xff\xff", "not 4 hex digits"),
        (b"\xd9\xa3\xd9\xa3", "not 4 hex digits"),  # Arabic-Indic digits are not hex digits
    ],
)
def test_bad_lengths(wire, fragment):
    decoder = RequestDecoder()
    decoder.receive_data(wire + b"host:version")
    with pytest.raises(AdbBadRequest) as info:
        decoder.next_request()
    assert fragment in info.value.reason
    assert isinstance(info.value, AdbMalformed)
    assert isinstance(info.value, ProtocolError)


def test_a_bad_length_is_known_only_with_four_bytes():
    decoder = RequestDecoder()
    decoder.receive_data(b"zz")
    assert decoder.next_request() is NEED_DATA  # the server waits for 4 bytes too
    decoder.receive_data(b"z")
    assert decoder.next_request() is NEED_DATA
    decoder.receive_data(b"z")
    with pytest.raises(AdbBadRequest):
        decoder.next_request()


def test_over_the_limit():
    # Four hex digits cannot say more than 0xffff < MAX_PAYLOAD; a lower limit shows the rule.
    assert MAX_PAYLOAD == 1024 * 1024
    decoder = RequestDecoder(max_length=8)
    decoder.receive_data(b"0009jdwp:4242")
    with pytest.raises(AdbBadRequest, match="over the limit"):
        decoder.next_request()
    decoder = RequestDecoder()
    decoder.receive_data(b"ffff")
    assert decoder.next_request() is NEED_DATA  # 65535 bytes to come: the server waits too


def test_half_a_request_stays_need_data():
    decoder = RequestDecoder()
    decoder.receive_data(b"000chost:ver")
    assert decoder.next_request() is NEED_DATA
    assert decoder.buffered == 12


# --- service names


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("host:version", Version(ANY)),
        ("host-serial:emulator-5554:version", Version(Selector("serial", "emulator-5554"))),
        ("host:kill", Kill(ANY)),
        ("host:devices", HostQuery(ANY, "devices")),
        ("host:devices-l", HostQuery(ANY, "devices-l")),
        ("host:track-devices", HostQuery(ANY, "track-devices")),
        ("host:host-features", HostQuery(ANY, "host-features")),
        ("host:connect:127.0.0.1:5555", HostQuery(ANY, "connect:127.0.0.1:5555")),
        ("host:versionXYZ", HostQuery(ANY, "versionXYZ")),
        ("host:", HostQuery(ANY, "")),
        # switches
        ("host:transport:emulator-5554", TransportSwitch("serial", "emulator-5554")),
        ("host:transport:127.0.0.1:5555", TransportSwitch("serial", "127.0.0.1:5555")),
        ("host:transport-any", TransportSwitch("any")),
        ("host:transport-usb", TransportSwitch("usb")),
        ("host:transport-local", TransportSwitch("local")),
        ("host:transport-id:7", TransportSwitch("transport_id", transport_id=7)),
        ("host:tport:any", TransportSwitch("any", tport=True)),
        ("host:tport:usb", TransportSwitch("usb", tport=True)),
        ("host:tport:local", TransportSwitch("local", tport=True)),
        (
            "host:tport:serial:emulator-5554",
            TransportSwitch("serial", "emulator-5554", tport=True),
        ),
        ("host:tport:serial:", TransportSwitch("serial", "", tport=True)),
        # switches the front does not follow: relayed as they are
        ("host:transport-id:abc", HostQuery(ANY, "transport-id:abc")),
        ("host:transport-id:", HostQuery(ANY, "transport-id:")),
        ("host:transportfoo", HostQuery(ANY, "transportfoo")),
        ("host:tport:bogus", HostQuery(ANY, "tport:bogus")),
        ("host-usb:transport-any", HostQuery(Selector("usb"), "transport-any")),
        # forwards
        (
            "host:forward:tcp:19000;jdwp:4242",
            Forward(ANY, False, "tcp:19000", "jdwp:4242"),
        ),
        (
            "host:forward:norebind:tcp:0;jdwp:4242",
            Forward(ANY, True, "tcp:0", "jdwp:4242"),
        ),
        (
            "host-serial:emulator-5554:forward:tcp:8000;tcp:9000",
            Forward(Selector("serial", "emulator-5554"), False, "tcp:8000", "tcp:9000"),
        ),
        (
            "host-serial:127.0.0.1:5555:forward:tcp:1;jdwp:2",
            Forward(Selector("serial", "127.0.0.1:5555"), False, "tcp:1", "jdwp:2"),
        ),
        (
            "host-transport-id:3:forward:tcp:1;jdwp:2",
            Forward(Selector("transport_id", transport_id=3), False, "tcp:1", "jdwp:2"),
        ),
        ("host-usb:forward:tcp:1;jdwp:2", Forward(Selector("usb"), False, "tcp:1", "jdwp:2")),
        (
            "host-local:forward:tcp:1;jdwp:2",
            Forward(Selector("local"), False, "tcp:1", "jdwp:2"),
        ),
        ("host:forward:tcp:1", HostQuery(ANY, "forward:tcp:1")),  # "bad forward" from the server
        ("host:forward:tcp:1;", HostQuery(ANY, "forward:tcp:1;")),
        ("host:forward:tcp:1;*smartsocket*", HostQuery(ANY, "forward:tcp:1;*smartsocket*")),
        ("host:forward:a;b;c", HostQuery(ANY, "forward:a;b;c")),
        ("host:killforward:tcp:19000", KillForward(ANY, "tcp:19000")),
        ("host:killforward:", HostQuery(ANY, "killforward:")),
        ("host:killforward-all", KillForwardAll(ANY)),
        ("host-serial:x:killforward-all", KillForwardAll(Selector("serial", "x"))),
        ("host:list-forward", ListForward(ANY)),
        # device services
        ("jdwp:4242", JdwpPid(4242)),
        ("jdwp", DeviceService("jdwp")),
        ("track-jdwp", DeviceService("track-jdwp")),
        ("jdwp:xyz", DeviceService("jdwp:xyz")),
        ("jdwp:0", DeviceService("jdwp:0")),
        ("jdwp:-1", DeviceService("jdwp:-1")),
        ("jdwp:12345678901", DeviceService("jdwp:12345678901")),
        ("jdwp:\u0663", DeviceService("jdwp:\u0663")),
        ("jdwp:", DeviceService("jdwp:")),
        ("shell:echo hi", DeviceService("shell:echo hi")),
        ("HOST:version", DeviceService("HOST:version")),  # the server: "device offline"
        # prefixes the server cannot read
        ("host-serial:nocolon", BadHostPrefix("host-serial:nocolon")),
        ("host-serial:[::1]", BadHostPrefix("host-serial:[::1]")),
        ("host-transport-id:x:y", BadHostPrefix("host-transport-id:x:y")),
        ("host-transport-id:5", BadHostPrefix("host-transport-id:5")),
    ],
)
def test_parse_service(text, parsed):
    assert parse_service(text) == parsed


@pytest.mark.parametrize(
    ("full", "split"),
    [
        # adb's own cases (adb_test / sockets_test.cpp parse_host_service), 29.x behaviour
        ("foo:bar", ("foo", "bar")),
        ("foo:bar:baz", ("foo", "bar:baz")),
        ("100.100.100.100:5555:foo", ("100.100.100.100:5555", "foo")),
        ("[0123:4567:89ab:CDEF:0:9:a:f]:5555:foo", ("[0123:4567:89ab:CDEF:0:9:a:f]:5555", "foo")),
        ("[::1]:5555:features", ("[::1]:5555", "features")),
        ("[::1]:features", ("[::1]", "features")),
        ("tcp:localhost:5555:foo", ("tcp:localhost:5555", "foo")),
        ("udp:localhost:5555:foo", ("udp:localhost:5555", "foo")),
        ("usb:1-1:foo", ("usb:1-1", "foo")),
        ("product:x:foo", ("product:x", "foo")),
        ("model:x:foo", ("model:x", "foo")),
        ("device:x:foo", ("device:x", "foo")),
        ("vsock:1234:5678:foo", ("vsock:1234:5678", "foo")),
        ("emulator-5554:forward:tcp:1;jdwp:2", ("emulator-5554", "forward:tcp:1;jdwp:2")),
        ("127.0.0.1:5555:forward:tcp:1;jdwp:2", ("127.0.0.1:5555", "forward:tcp:1;jdwp:2")),
        # cannot be split: the server closes the socket
        ("", None),
        ("foo", None),
        ("foo:", None),
        ("tcp:", None),
        ("[::1]", None),
        ("[::1]x:foo", None),
        ("usb:1-1", None),
        (":0", ("", "0")),
    ],
)
def test_parse_host_service_like_adb(full, split):
    assert parse_host_service(full) == split


def test_selector_prefixes_round_trip():
    for selector in (
        ANY,
        Selector("usb"),
        Selector("local"),
        Selector("serial", "127.0.0.1:5555"),
        Selector("transport_id", transport_id=12),
    ):
        parsed = parse_service(selector.prefix + "get-serialno")
        assert parsed == HostQuery(selector, "get-serialno")


def test_forward_fields():
    forward = parse_service("host:forward:tcp:0;jdwp:4242")
    assert isinstance(forward, Forward)
    assert (forward.local_port, forward.jdwp_pid) == (0, 4242)
    other = parse_service("host:forward:tcp:65536;tcp:5")
    assert isinstance(other, Forward)
    assert (other.local_port, other.jdwp_pid) == (None, None)
    named = parse_service("host:forward:localabstract:x;jdwp:notapid")
    assert isinstance(named, Forward)
    assert (named.local_port, named.jdwp_pid) == (None, None)
    kill = parse_service("host:killforward:tcp:19000")
    assert isinstance(kill, KillForward)
    assert kill.local_port == 19000


def test_switch_upstream_forms():
    assert TransportSwitch("serial", "emulator-5554").upstream == "host:tport:serial:emulator-5554"
    assert TransportSwitch("any").upstream == "host:tport:any"
    assert TransportSwitch("usb").upstream == "host:tport:usb"
    assert TransportSwitch("local", tport=True).upstream == "host:tport:local"
    assert TransportSwitch("transport_id", transport_id=3).upstream is None


# --- replies


def test_golden_replies():
    assert okay() == b"OKAY"
    assert fail("device 'nope' not found") == b"FAIL0017device 'nope' not found"
    assert fail("cannot rebind existing socket") == b"FAIL001dcannot rebind existing socket"
    assert fail("unknown host service") == b"FAIL0014unknown host service"
    assert fail("closed") == b"FAIL0006closed"
    assert okay_okay_port(19000) == b"OKAYOKAY000519000"
    assert okay_okay_port(33103) == b"OKAYOKAY000533103"
    assert okay() + frame(b"0029") == b"OKAY00040029"  # host:version of a 41 server
    assert frame(b"") == b"0000"


def test_transport_id_bytes():
    assert transport_id_bytes(1) == b"\x01\x00\x00\x00\x00\x00\x00\x00"
    assert parse_transport_id(b"\x01\x00\x00\x00\x00\x00\x00\x00") == 1
    assert parse_transport_id(transport_id_bytes(2**64 - 1)) == 2**64 - 1
    with pytest.raises(AdbMalformed):
        parse_transport_id(b"\x01\x00")


def test_list_forward_is_framed_again_with_the_fronts_lines():
    server = b"emulator-5554 tcp:19000 tcp:9000\n"
    merged = merge_forward_list(server, [forward_line("emulator-5554", "tcp:19001", "jdwp:4242")])
    assert merged == b"0043emulator-5554 tcp:19000 tcp:9000\nemulator-5554 tcp:19001 jdwp:4242\n"
    assert merge_forward_list(b"", []) == b"0000"
    assert merge_forward_list(b"", [forward_line("emulator-5554", "tcp:19000", "jdwp:4242")]) == (
        b"0022emulator-5554 tcp:19000 jdwp:4242\n"  # the OBS line, 0x22 bytes
    )


def test_frame_refuses_what_does_not_fit():
    with pytest.raises(LocalProtocolError):
        frame(b"x" * 0x10000)
    assert len(fail("x" * 70000)) == 4 + 4 + 0xFFFF


# --- fuzz: any bytes give requests, NEED_DATA or AdbBadRequest; never anything else


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=6))
def test_any_bytes_only_yield_requests_need_data_or_the_protocol_error(data, cuts):
    whole = RequestDecoder()
    whole.receive_data(data)
    expected: list[bytes] = []
    expected_error = False
    try:
        while (got := whole.next_request()) is not NEED_DATA:
            assert isinstance(got, Request)
            assert 1 <= len(got.payload) <= MAX_PAYLOAD
            assert int(got.wire[:4], 16) == len(got.payload)
            expected.append(got.wire)
            parse_service(got.service)  # never raises
    except AdbBadRequest:
        expected_error = True
    # Fed in pieces, the same requests come out, then the same end.
    pieces = RequestDecoder()
    seen: list[bytes] = []
    error = False
    at = 0
    try:
        for cut in [*sorted(cuts), len(data)]:
            pieces.receive_data(data[at:cut] if cut > at else b"")
            at = max(at, cut)
            while (got := pieces.next_request()) is not NEED_DATA:
                assert isinstance(got, Request)
                seen.append(got.wire)
    except AdbBadRequest:
        error = True
    assert seen == expected
    assert error == expected_error
    if not error:
        assert b"".join(seen) + pieces.take_buffer() == data


@given(st.text(max_size=80))
def test_any_service_text_parses(text):
    parsed = parse_service(text)
    assert parsed is not None
    if text.startswith("host-serial:") and not isinstance(parsed, BadHostPrefix):
        # the serial and the rest put back together give the request again
        assert isinstance(parsed.selector, Selector)  # type: ignore[union-attr]


@given(st.text(alphabet="ab:[]0159tcpusbvsock-", max_size=30))
def test_parse_host_service_splits_are_exact(full):
    split = parse_host_service(full)
    if split is not None:
        serial, command = split
        assert f"{serial}:{command}" == full
        assert command  # the serial may be empty, as in adb (":0" is serial "", command "0")


@pytest.mark.parametrize(
    "template",
    [
        "host:transport-id:{}",
        "host-transport-id:{}:version",
        "host:tport:transport-id:{}",
        "host:forward:tcp:{};jdwp:42",
        "host:forward:tcp:1;jdwp:{}",
        "host:killforward:tcp:{}",
        "jdwp:{}",
    ],
)
def test_parse_service_reads_numbers_longer_than_int_accepts_as_any_number_too_large(template):
    # int() refuses more than 4,300 digits with a ValueError; adb's server answers such a
    # request (FAIL), and so must the front: a huge number reads as any number out of range.
    huge = parse_service(template.format("9" * 5000))
    assert type(huge) is type(parse_service(template.format("9" * 30)))


def test_numbers_with_many_leading_zeros_keep_their_value():
    # adb reads numbers with strtol: leading zeros do not make a number large.
    assert tcp_port("tcp:" + "0" * 5000 + "7") == 7
    assert tcp_port("tcp:" + "9" * 5000) is None
    assert jdwp_pid("jdwp:" + "0" * 5000 + "7") is None  # a pid has at most 10 digits
