"""`DdmClient` over real loopback sockets, seen from a raw JDWP connection (the DDM server's
side written by hand with ``ddmd.protocol``): handshake, HELO/FEAT, handlers, unknown types,
non-DDM commands, pushes, callbacks, failures and bad input."""

from __future__ import annotations

import os
import struct

import pytest
import trio
import trio.lowlevel
from structlog.testing import capture_logs

from ddmd.client import VM_IDENT, DdmClient, NotConnectedError
from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer, judge
from ddmd.protocol.jdwp import CommandSet, ErrorCode, ReplyPacket, encode
from ddmd.session.model import VmModel
from tests.actors.rawpeers import wait_until
from tests.client.rawserver import connect, open_raw, type_code

CAP = 15  # seconds: absolute cap on every test


def unknown(name: str, data: bytes) -> ddm.UnknownChunk:
    return ddm.UnknownChunk(type_code(name), data)


async def test_a_small_client_answers_its_own_chunk_type(nursery) -> None:
    # The whole client: well under 30 lines.
    client = DdmClient("com.example.echo", port=0, pid=4321)
    seen: list[bytes] = []

    @client.on_chunk("ECHO")
    def echo(data: bytes) -> tuple[str, bytes]:
        seen.append(data)
        return ("ECHO", data[::-1])

    @client.on_chunk("NOPE")
    async def nothing(data: bytes) -> None:
        await trio.lowlevel.checkpoint()

    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        assert port == client.port
        assert port > 0
        async with connect(port) as server:
            assert await server.reply_chunks("ECHO", b"abc") == (unknown("ECHO", b"cba"),)
            assert await server.reply_chunks("ECHO", b"") == (unknown("ECHO", b""),)
            empty = await server.request("NOPE", b"x")
            assert empty == ReplyPacket(empty.id, 0, b"")  # None: an empty reply
    assert seen == [b"abc", b""]


async def test_hello_and_features_decode_with_ddmds_own_parsers(nursery) -> None:
    client = DdmClient("system monitor", port=0, package_name="ddmd.sysmon")
    client.on_chunk("SMON")(lambda data: None)
    client.on_chunk("ABCD")(lambda data: None)
    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        async with connect(port) as server:
            reply = await server.request("HELO", struct.pack(">I", 1))
            judgement = judge(reply)  # what ddmd's session does with the reply
            assert judgement.answer is Answer.DATA
            (hello,) = judgement.chunks
            assert isinstance(hello, ddm.HeloReply)
            assert hello.client_version == 1
            assert hello.pid == os.getpid() == client.pid
            assert hello.app_name == "system monitor"
            assert hello.vm_ident == VM_IDENT
            assert VM_IDENT.startswith("ddmd.client ")
            assert hello.user_id == os.getuid() // 100000
            assert hello.abi is not None
            assert hello.abi.endswith(")")
            assert hello.abi.startswith(("64-bit (", "32-bit ("))
            assert hello.jvm_flags == ""
            assert hello.native_debuggable is False
            assert hello.package_name == "ddmd.sysmon"
            assert hello.extra == b""
            # ... and the model ddmd builds from it.
            model = VmModel()
            model.apply_hello(hello)
            assert (model.pid, model.app, model.package) == (
                os.getpid(),
                "system monitor",
                "ddmd.sysmon",
            )

            (feat,) = await server.reply_chunks("FEAT")
            assert feat == ddm.FeatReply(("ABCD", "SMON"))
            assert client.chunk_types == ("ABCD", "SMON")


async def test_unknown_types_get_an_empty_reply_and_other_jdwp_commands_error_99(nursery) -> None:
    client = DdmClient("com.example.few", port=0)
    client.on_chunk("ECHO")(lambda data: ("ECHO", data))
    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        async with connect(port) as server:
            # Types without a handler: an unknown one and Android ones (protocol.md 2.2).
            for name, data in (
                ("WHAT", b"\x01\x02"),
                ("THST", b""),
                ("THEN", b"\x01"),
                ("HPIF", b"\x01"),
            ):
                reply = await server.request(name, data)
                assert (reply.error_code, reply.data) == (0, b""), name
            # Non-DDM commands: VirtualMachine.Version, IDSizes, Dispose, an EventRequest.Set,
            # a vendor set: all NOT_IMPLEMENTED, no data.
            for command_set, command, data in (
                (1, 1, b""),
                (1, 7, b""),
                (1, 6, b""),
                (15, 1, b"\x08\x02\x00\x00\x00\x00"),
                (200, 3, b"xyz"),
                (CommandSet.DDM, 2, b""),
            ):
                reply = await server.command(command_set, command, data)
                assert reply.error_code == ErrorCode.NOT_IMPLEMENTED == 99
                assert reply.data == b""
            # The connection is still fine.
            assert await server.reply_chunks("ECHO", b"ok") == (unknown("ECHO", b"ok"),)
            assert server.pushes == []
    stats = client.statistics()
    assert (stats.ddm_requests, stats.unhandled_requests, stats.refused_commands) == (5, 4, 6)
    assert (stats.connections, stats.failed_requests, stats.pushes) == (1, 0, 0)


async def test_pushes_arrive_with_vm_side_ids(nursery) -> None:
    client = DdmClient("com.example.pusher", port=0)
    with trio.fail_after(CAP):
        with pytest.raises(NotConnectedError):
            await client.send_chunk("NOTE", b"too early")
        port = await nursery.start(client.serve)
        async with connect(port) as server:
            await wait_until(lambda: client.connected, 5, what="connected")
            await client.send_chunk("NOTE", b"one")
            await client.send_chunk("NOTE", bytearray(b"two"))
            await client.send_chunk("THDE", struct.pack(">I", 7))  # an Android type, its layout
            pushes = [await server.push() for _ in range(3)]
            for packet in pushes:
                assert (packet.command_set, packet.command) == (CommandSet.DDM, 1)
                assert packet.id & 0x80000000
            assert [p.id for p in pushes] == [0x80000001, 0x80000002, 0x80000003]
            chunks = [ddm.chunks_of(p, ddm.Direction.FROM_VM) for p in pushes]
            assert chunks == [
                (unknown("NOTE", b"one"),),
                (unknown("NOTE", b"two"),),
                (ddm.ThreadDied(7),),
            ]
            with pytest.raises(ValueError, match="not 4 printable ASCII"):
                await client.send_chunk("NOTES", b"")
            with pytest.raises(ValueError, match="layout"):
                await client.send_chunk("THDE", b"\x00")  # THDE is a u4 thread id
            with pytest.raises(ValueError, match="bytes"):
                await client.send_chunk("NOTE", "text")  # type: ignore[arg-type]
        await wait_until(lambda: not client.connected, 5, what="disconnected")
        with pytest.raises(NotConnectedError):
            await client.send_chunk("NOTE", b"too late")


async def test_connect_and_disconnect_callbacks(nursery) -> None:
    client = DdmClient("com.example.callbacks", port=0)
    calls: list[str] = []
    ticks: list[int] = []

    @client.on_connected
    def hello() -> None:
        calls.append("connected")

    @client.on_connected
    async def report() -> None:
        # Runs for as long as the connection lasts, then is cancelled.
        try:
            while True:
                await client.send_chunk("TICK", struct.pack(">I", len(ticks)))
                ticks.append(len(ticks))
                await trio.sleep(0.01)
        finally:
            calls.append("report ended")

    @client.on_disconnected
    async def bye() -> None:
        await trio.lowlevel.checkpoint()
        calls.append("disconnected")

    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        for round_ in (1, 2):
            async with connect(port) as server:
                first = await server.push()
                second = await server.push()
                for packet in (first, second):
                    (chunk,) = ddm.chunks_of(packet, ddm.Direction.FROM_VM)
                    assert isinstance(chunk, ddm.UnknownChunk)
                    assert ddm.type_name(chunk.chunk_type) == "TICK"
                assert second.id > first.id
                assert calls.count("connected") == round_
            await wait_until(lambda r=round_: calls.count("disconnected") == r, 5, what="bye")
            assert calls[-3:] == ["connected", "report ended", "disconnected"]


async def test_a_failing_handler_gives_a_fail_chunk_and_the_client_keeps_serving(nursery) -> None:
    client = DdmClient("com.example.fragile", port=0, handler_timeout=0.2)

    @client.on_chunk("BOOM")
    def boom(data: bytes) -> tuple[str, bytes]:
        raise RuntimeError(f"cannot handle {data!r}")

    @client.on_chunk("SLOW")
    async def slow(data: bytes) -> None:
        await trio.sleep_forever()

    @client.on_chunk("ODD1")
    def odd(data: bytes) -> object:
        return b"not a tuple"

    @client.on_chunk("ODD2")
    def odd_layout(data: bytes) -> tuple[str, bytes]:
        return ("STKL", b"\x00")  # a known type without its layout

    @client.on_chunk("ECHO")
    def echo(data: bytes) -> tuple[str, bytes]:
        return ("ECHO", data)

    @client.on_connected
    def broken_callback() -> None:
        raise ValueError("callback bug")

    with capture_logs() as logs, trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        async with connect(port) as server:
            (fail,) = await server.reply_chunks("BOOM", b"x")
            assert fail == ddm.Fail(1, "RuntimeError: cannot handle b'x'")
            assert await server.reply_chunks("ECHO", b"still here") == (
                unknown("ECHO", b"still here"),
            )
            (fail,) = await server.reply_chunks("SLOW")
            assert isinstance(fail, ddm.Fail)
            assert "did not finish within 0.2 s" in fail.message
            for name in ("ODD1", "ODD2"):
                (fail,) = await server.reply_chunks(name)
                assert isinstance(fail, ddm.Fail), name
                assert fail.code == 1
            assert await server.reply_chunks("ECHO", b"and here") == (unknown("ECHO", b"and here"),)
    failed = [e for e in logs if e["event"] == "client.handler_failed"]
    assert [e["type"] for e in failed] == ["BOOM", "SLOW", "ODD1", "ODD2"]
    assert [e["callback"] for e in logs if e["event"] == "client.callback_failed"] == [
        "broken_callback"
    ]


async def test_dbgd_is_acknowledged(nursery) -> None:
    client = DdmClient("com.example.dbgd", port=0)
    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        async with connect(port) as server:
            assert await server.reply_chunks("DBGD") == (ddm.Dbgd(),)


def test_registration_is_checked() -> None:
    client = DdmClient("x", port=0)
    client.on_chunk("ECHO")(lambda data: None)
    for name, match in (
        ("HELO", "answered by DdmClient itself"),
        ("FEAT", "answered by DdmClient itself"),
        ("ECHO", "already has a handler"),
        ("ECH", "not 4 printable ASCII"),
        ("EC O", "not 4 printable ASCII"),
        ("ÉCHO", "not 4 printable ASCII"),
    ):
        with pytest.raises(ValueError, match=match):
            client.on_chunk(name)
    for kwargs, match in (
        ({"port": 70000}, "port"),
        ({"port": -1}, "port"),
        ({"port": 0, "pid": -1}, "pid"),
        ({"port": 0, "send_timeout": 0}, "send_timeout"),
        ({"port": 0, "max_packet": 5}, "max_packet"),
    ):
        with pytest.raises(ValueError, match=match):
            DdmClient("x", **kwargs)  # type: ignore[arg-type]


async def test_bad_input_ends_only_that_connection(nursery) -> None:
    client = DdmClient("com.example.sturdy", port=0, handshake_timeout=0.3)
    client.on_chunk("ECHO")(lambda data: ("ECHO", data))
    disconnects: list[int] = []
    client.on_disconnected(lambda: disconnects.append(1))

    async def still_serving() -> None:
        async with connect(port) as server:
            assert await server.reply_chunks("ECHO", b"ok") == (unknown("ECHO", b"ok"),)

    with capture_logs() as logs, trio.fail_after(CAP):
        port = await nursery.start(client.serve)

        # A wrong handshake: closed at once.
        stream = await open_raw(port, handshake=False)
        await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")
        assert await stream.receive_some(100) == b""
        await stream.aclose()
        await still_serving()

        # No handshake at all: closed after handshake_timeout.
        stream = await open_raw(port, handshake=False)
        assert await stream.receive_some(100) == b""
        await stream.aclose()
        await still_serving()

        async with connect(port) as server:
            # A DDM packet whose chunk claims more data than there is: an empty reply.
            reply = await server.command(
                CommandSet.DDM, 1, struct.pack(">II", type_code("ECHO"), 99) + b"ab"
            )
            assert (reply.error_code, reply.data) == (0, b"")
            # A DDM packet with 3 bytes, and one with none: empty replies too.
            for data in (b"abc", b""):
                reply = await server.command(CommandSet.DDM, 1, data)
                assert (reply.error_code, reply.data) == (0, b"")
            # Two chunks: only the first is handled (protocol.md 2.4).
            two = ddm.encode_chunks([unknown("ECHO", b"1"), unknown("ECHO", b"2")])
            reply = await server.command(CommandSet.DDM, 1, two)
            assert ddm.chunks_of(reply, ddm.Direction.FROM_VM) == (unknown("ECHO", b"1"),)
            # A reply packet from the server is dropped; the connection goes on.
            await server.send(encode(ReplyPacket(5, 0, b"")))
            assert await server.reply_chunks("ECHO", b"after") == (unknown("ECHO", b"after"),)
            # Bad flags break JDWP framing: the client closes this connection.
            await server.send(b"\x00\x00\x00\x0b\x00\x00\x00\x09\x42\x01\x01")
            await server.wait_closed()

        # A length field below the header size, after the handshake.
        async with connect(port) as server:
            await server.send(b"\x00\x00\x00\x05\x00\x00\x00\x01\x00\x01\x01")
            await server.wait_closed()
        await still_serving()
        # A packet longer than max_packet is refused too.
        async with connect(port) as server:
            await server.send(b"\x7f\x00\x00\x00\x00\x00\x00\x01\x00\xc7\x01")
            await server.wait_closed()
        await still_serving()
        await wait_until(
            lambda: len(disconnects) == [e["event"] for e in logs].count("client.connected"),
            5,
            what="a disconnect for every connection",
        )

    events = [e["event"] for e in logs]
    assert events.count("client.handshake_failed") == 2
    assert events.count("client.protocol_error") == 3
    assert events.count("client.request_malformed") == 3
    assert events.count("client.connected") == 7
    stats = client.statistics()
    assert (stats.connections, stats.malformed_requests, stats.connected) == (7, 3, False)


async def test_one_server_at_a_time(nursery) -> None:
    client = DdmClient("com.example.single", port=0)
    client.on_chunk("ECHO")(lambda data: ("ECHO", data))
    with trio.fail_after(CAP):
        port = await nursery.start(client.serve)
        async with connect(port) as first:
            assert await first.reply_chunks("ECHO", b"1") == (unknown("ECHO", b"1"),)
            # While connected the port is closed, as a VM's is: a second server is refused.
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
        # After the first leaves, the same port serves the next one.
        async with connect(port) as second:
            assert await second.reply_chunks("ECHO", b"2") == (unknown("ECHO", b"2"),)


async def test_serve_reports_a_port_in_use(nursery) -> None:
    first = DdmClient("a", port=0)
    port = await nursery.start(first.serve)
    second = DdmClient("b", port=port)
    with pytest.raises(OSError):
        await second.serve()
    with pytest.raises(RuntimeError, match="already running"):
        await first.serve()
