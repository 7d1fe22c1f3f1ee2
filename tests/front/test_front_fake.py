"""The adb front against a fake adb server and a fake hub: each rule of the conversation.

The wire itself is checked against the real server in test_front_real_adb.py; here the
front's decisions: what is relayed (byte for byte), what it answers itself, what it hands to
the hub, and how it survives bad clients and a dying server.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from structlog.testing import capture_logs

from ddmd.front import serve_front, statistics
from ddmd.front.forwards import FrontForwards
from ddmd.front.upstream import Upstream
from ddmd.peers import PeerGuard, PeerPolicy
from ddmd.protocol.adbrequests import fail
from tests.actors.rawpeers import wait_until
from tests.front.fakes import (
    HANDSHAKE,
    FakeHub,
    ForwardingFakeAdb,
    Front,
    ask,
    connect,
    front_config,
    jdwp_echo_listener,
    read_exactly,
    read_to_eof,
    running_front,
    wire,
)

CAP = 20  # seconds: every test
SERIAL = "emulator-5554"


@dataclass
class Rig:
    adb: ForwardingFakeAdb
    hub: FakeHub
    front: Front
    nursery: trio.Nursery
    vm_port: int  # a JDWP echo "VM" the fake server's pids lead to
    vm_connections: list[int]

    @property
    def port(self) -> int:
        return self.front.port


@asynccontextmanager
async def fake_rig(**front: object) -> AsyncIterator[Rig]:
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            adb = ForwardingFakeAdb()
            await nursery.start(adb.run)
            hub = FakeHub(nursery)
            vm_port, vm_connections = await jdwp_echo_listener(nursery, greeting=b"server")
            device = adb.add_device(SERIAL)
            device.add_pid(4242, ("127.0.0.1", vm_port))
            device.add_pid(4343, ("127.0.0.1", vm_port))
            async with running_front(adb.port, hub, **front) as running:  # type: ignore[arg-type]
                yield Rig(adb, hub, running, nursery, vm_port, vm_connections)
            nursery.cancel_scope.cancel()


def events(logs: list[dict], name: str) -> list[dict]:
    return [e for e in logs if e["event"] == name]


# --- relayed byte for byte


async def test_version_and_devices_come_from_the_server():
    async with fake_rig() as rig:
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"
        listing = await ask(rig.port, wire("host:devices"))
        assert listing == b"OKAY0015emulator-5554\tdevice\n"
        assert rig.adb.requests[:2] == ["host:version", "host:devices"]


async def test_upper_case_hex_is_relayed_as_sent():
    async with fake_rig() as rig:
        assert await ask(rig.port, wire("host:version", upper=True)) == b"OKAY00040029"
        long = "host:devices-l"
        await ask(rig.port, wire(long, upper=True))
        assert rig.adb.wires[-1] == b"000E"  # not re-encoded


async def test_unknown_services_get_the_servers_answer():
    async with fake_rig() as rig:
        reply = await ask(rig.port, wire("host:frobnicate"))
        message = b"unknown host service 'host:frobnicate'"
        assert reply == b"FAIL" + b"%04x" % len(message) + message


async def test_a_stream_is_relayed_until_the_server_ends_it():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire("host:track-devices"))
            first = await read_exactly(stream, 4 + 4 + 21)
            assert first == b"OKAY0015emulator-5554\tdevice\n"
            rig.adb.add_device("emulator-5556")
            second = await read_exactly(stream, 4 + 42)
            assert second == b"002aemulator-5554\tdevice\nemulator-5556\tdevice\n"
            await rig.adb.kill()  # the server dies: the client's stream ends
            assert await read_to_eof(stream) == b""


# --- transport switches


async def test_legacy_switch_is_sent_as_tport_and_the_id_stripped():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:transport:{SERIAL}", upper=True))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(wire("shell:echo hi"))
            assert await read_to_eof(stream) == b"OKAYecho hi\n"
        assert f"{SERIAL}:shell:echo hi" in rig.adb.requests
        assert rig.adb.wires[-1] == b"001f"  # host:tport:serial:emulator-5554


async def test_tport_switch_returns_the_transport_id():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire("host:tport:any"))
            assert await read_exactly(stream, 12) == b"OKAY\x01\x00\x00\x00\x00\x00\x00\x00"
            await stream.send_all(wire("jdwp"))
            assert await read_exactly(stream, 14) == b"OKAY4242\n4343\n"


async def test_a_failed_switch_passes_the_servers_message():
    async with fake_rig() as rig:
        reply = await ask(rig.port, wire("host:transport:nope"))
        assert reply == b"FAIL0017device 'nope' not found"
        reply = await ask(rig.port, wire("host:tport:serial:nope"))
        assert reply == b"FAIL0017device 'nope' not found"


async def test_switch_by_transport_id():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire("host:transport-id:1"))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(wire("jdwp:4242"))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(HANDSHAKE)
            assert await read_exactly(stream, len(HANDSHAKE)) == HANDSHAKE
        assert "host-transport-id:1:get-serialno" in rig.adb.requests


# --- jdwp:PID


async def test_jdwp_of_a_held_vm_is_handed_to_the_hub():
    async with fake_rig() as rig:
        target = rig.hub.hold(SERIAL, 4242, greeting=b"ddmd")
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:transport:{SERIAL}"))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(wire("jdwp:4242"))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(HANDSHAKE + b"ping")
            assert await read_exactly(stream, 14 + 4 + 4) == HANDSHAKE + b"ddmdping"
        assert len(target.adopted) == 1
        adopted = target.adopted[0]
        assert adopted.via == "front"
        assert adopted.peer.startswith("127.0.0.1:")
        assert adopted.tool is None  # handed over at once: ddmd's driver names it afterwards
        # the server never saw jdwp:4242, and the VM behind it no connection
        assert f"{SERIAL}:jdwp:4242" not in rig.adb.requests
        assert rig.vm_connections == []
    assert statistics() is None  # the front is gone with its rig


async def test_bytes_pipelined_after_jdwp_reach_the_vm():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:tport:serial:{SERIAL}"))
            await read_exactly(stream, 12)
            await stream.send_all(wire("jdwp:4242") + HANDSHAKE)  # no wait for the OKAY
            assert await read_exactly(stream, 4 + 14) == b"OKAY" + HANDSHAKE


async def test_jdwp_waits_for_ddmd_to_open_the_vm():
    async with fake_rig(open_timeout=5.0) as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:transport:{SERIAL}"))
            await read_exactly(stream, 4)
            await stream.send_all(wire("jdwp:4242"))
            await wait_until(lambda: rig.hub.waited, 2, what="the front waits for the VM")
            target = rig.hub.hold(SERIAL, 4242)
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(HANDSHAKE)
            assert await read_exactly(stream, 14) == HANDSHAKE
        assert len(target.adopted) == 1


async def test_jdwp_of_a_vm_ddmd_does_not_hold_is_relayed_after_the_wait():
    async with fake_rig(open_timeout=0.2) as rig:
        with capture_logs() as logs:
            stream = await connect(rig.port)
            async with stream:
                await stream.send_all(wire(f"host:transport:{SERIAL}"))
                await read_exactly(stream, 4)
                await stream.send_all(wire("jdwp:4343"))
                assert await read_exactly(stream, 4) == b"OKAY"
                await stream.send_all(HANDSHAKE)
                assert await read_exactly(stream, 14 + 6) == HANDSHAKE + b"server"
        assert f"{SERIAL}:jdwp:4343" in rig.adb.requests
        assert rig.vm_connections == [1]
        (relayed,) = events(logs, "front.jdwp_relayed")
        assert (relayed["serial"], relayed["pid"]) == (SERIAL, 4343)


async def test_malformed_jdwp_names_go_to_the_server():
    async with fake_rig() as rig:
        for name in ("jdwp:xyz", "jdwp:0", "jdwp:"):
            stream = await connect(rig.port)
            async with stream:
                await stream.send_all(wire(f"host:transport:{SERIAL}"))
                await read_exactly(stream, 4)
                await stream.send_all(wire(name))
                assert (await read_to_eof(stream)).startswith(b"FAIL")
            assert f"{SERIAL}:{name}" in rig.adb.requests
        assert rig.hub.asked == []


async def test_jdwp_without_a_switch_is_the_servers_business():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        reply = await ask(rig.port, wire("jdwp:4242"))
        assert reply.startswith(b"FAIL")  # the fake's words; the real server: "device offline"
        assert rig.hub.asked == []


# --- forwards


async def forward(port: int, service: str) -> bytes:
    return await ask(port, wire(service))


async def test_a_jdwp_forward_is_the_fronts_own():
    async with fake_rig() as rig:
        target = rig.hub.hold(SERIAL, 4242, greeting=b"!")
        reply = await forward(rig.port, "host:forward:tcp:0;jdwp:4242")
        assert reply.startswith(b"OKAYOKAY")
        size = int(reply[8:12], 16)
        bound = int(reply[12:])
        assert len(reply) == 12 + size
        assert rig.adb.forward_table == {}  # the server was not asked to forward
        for _ in range(2):  # every connection is one more consumer
            jdb = await trio.open_tcp_stream("127.0.0.1", bound)
            async with jdb:
                await jdb.send_all(HANDSHAKE)
                assert await read_exactly(jdb, 15) == HANDSHAKE + b"!"
        assert [a.via for a in target.adopted] == ["front-forward", "front-forward"]
        listing = await ask(rig.port, wire("host:list-forward"))
        line = f"{SERIAL} tcp:{bound} jdwp:4242\n".encode()
        assert listing == b"OKAY" + b"%04x" % len(line) + line
        assert await ask(rig.port, wire(f"host:killforward:tcp:{bound}")) == b"OKAYOKAY"
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", bound)
        assert await ask(rig.port, wire("host:list-forward")) == b"OKAY0000"


async def test_forward_on_a_fixed_port_with_every_prefix():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        prefixes = [
            "host:",
            f"host-serial:{SERIAL}:",
            "host-transport-id:1:",
            "host-usb:",
            "host-local:",
        ]
        for prefix in prefixes:
            port = 0
            while port in (0, rig.port):
                port = _free_port()
            reply = await forward(rig.port, f"{prefix}forward:tcp:{port};jdwp:4242")
            expected = str(port).encode()
            assert reply == b"OKAYOKAY" + b"%04x" % len(expected) + expected, prefix
        assert rig.adb.forward_table == {}
        listing = await ask(rig.port, wire("host:list-forward"))
        assert listing.count(b"jdwp:4242\n") == len(prefixes)


async def test_forward_after_a_switch_uses_the_switched_device():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:tport:serial:{SERIAL}"))
            await read_exactly(stream, 12)
            await stream.send_all(wire("host:forward:tcp:0;jdwp:4242"))
            reply = await read_to_eof(stream)
        assert reply.startswith(b"OKAYOKAY")
        assert "host-transport-id:1:get-serialno" in rig.adb.requests


async def test_forward_rules_norebind_rebind_and_taken_ports():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        rig.hub.hold(SERIAL, 4343)
        reply = await forward(rig.port, "host:forward:tcp:0;jdwp:4242")
        bound = int(reply[12:])
        again = await forward(rig.port, f"host:forward:norebind:tcp:{bound};jdwp:4343")
        assert again == b"FAIL001dcannot rebind existing socket"
        # without norebind the forward now leads to the other VM; no port string
        assert await forward(rig.port, f"host:forward:tcp:{bound};jdwp:4343") == b"OKAYOKAY"
        listing = await ask(rig.port, wire("host:list-forward"))
        assert f"tcp:{bound} jdwp:4343\n".encode() in listing
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            reply = await forward(rig.port, f"host:forward:tcp:{busy};jdwp:4242")
        message = b"cannot bind listener: Address already in use"
        assert reply == b"FAIL" + b"%04x" % len(message) + message


async def test_a_forward_held_by_the_server_moves_to_the_front():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        pretend = socket.socket()  # the server's listener on that port
        pretend.bind(("127.0.0.1", 0))
        pretend.listen()
        port = pretend.getsockname()[1]
        rig.adb.forward_table[f"tcp:{port}"] = (SERIAL, "tcp:9000")
        rig.adb.on_killforward = lambda local: pretend.close()
        try:
            refused = await forward(rig.port, f"host:forward:norebind:tcp:{port};jdwp:4242")
            assert refused == fail("cannot rebind existing socket")
            assert f"tcp:{port}" in rig.adb.forward_table
            reply = await forward(rig.port, f"host:forward:tcp:{port};jdwp:4242")
        finally:
            pretend.close()
        assert reply == b"OKAYOKAY" + b"%04x" % len(str(port)) + str(port).encode()
        assert f"host-serial:{SERIAL}:killforward:tcp:{port}" in rig.adb.requests
        assert rig.adb.forward_table == {}
        listing = await ask(rig.port, wire("host:list-forward"))
        assert f"{SERIAL} tcp:{port} jdwp:4242\n".encode() in listing


async def test_forwards_the_front_does_not_serve_are_relayed():
    async with fake_rig(open_timeout=0.1) as rig:
        reply = await forward(rig.port, "host:forward:tcp:0;tcp:9000")  # not jdwp
        assert reply.startswith(b"OKAYOKAY")
        reply = await forward(rig.port, "host:forward:tcp:0;jdwp:4343")  # not held
        assert reply.startswith(b"OKAYOKAY")
        assert sorted(r for _, r in rig.adb.forward_table.values()) == ["jdwp:4343", "tcp:9000"]
        reply = await forward(rig.port, "host:forward:localabstract:x;jdwp:4242")
        assert reply.startswith(b"OKAYOKAY")
        assert len(rig.adb.forward_table) == 3


async def test_list_forward_merges_the_servers_and_the_fronts_lines():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        rig.adb.forward_table["tcp:7000"] = (SERIAL, "tcp:9000")
        bound = int((await forward(rig.port, "host:forward:tcp:0;jdwp:4242"))[12:])
        listing = await ask(rig.port, wire("host:list-forward"))
        body = f"{SERIAL} tcp:7000 tcp:9000\n{SERIAL} tcp:{bound} jdwp:4242\n".encode()
        assert listing == b"OKAY" + b"%04x" % len(body) + body
        # killforward of a port the front does not own goes to the server
        assert await ask(rig.port, wire("host:killforward:tcp:7000")) == b"OKAYOKAY"
        assert rig.adb.forward_table == {}
        missing = await ask(rig.port, wire("host:killforward:tcp:7000"))
        assert missing == fail("listener 'tcp:7000' not found")
        # killforward-all: the front's forwards and the server's
        rig.adb.forward_table["tcp:7001"] = (SERIAL, "tcp:9001")
        assert await ask(rig.port, wire("host:killforward-all")) == b"OKAYOKAY"
        assert rig.adb.forward_table == {}
        assert await ask(rig.port, wire("host:list-forward")) == b"OKAY0000"
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", bound)


async def test_a_forward_connection_waits_for_the_vm_then_is_refused_cleanly():
    async with fake_rig(open_timeout=0.3) as rig:
        rig.hub.hold(SERIAL, 4242)
        bound = int((await forward(rig.port, "host:forward:tcp:0;jdwp:4242"))[12:])
        rig.hub.drop(SERIAL, 4242)  # the VM is gone
        with capture_logs() as logs:
            jdb = await trio.open_tcp_stream("127.0.0.1", bound)
            async with jdb:
                await jdb.send_all(HANDSHAKE)
                assert await read_to_eof(jdb) == b""  # EOF, as a device refusing jdwp:PID
        (refused,) = events(logs, "front.forward_refused")
        assert refused["vm"] == f"{SERIAL}/4242"
        # ... and one that comes back in time is served
        jdb = await trio.open_tcp_stream("127.0.0.1", bound)
        async with jdb:
            await jdb.send_all(HANDSHAKE)
            await trio.sleep(0.05)
            rig.hub.hold(SERIAL, 4242)
            assert await read_exactly(jdb, 14) == HANDSHAKE


async def test_forwards_go_when_their_device_goes():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        with capture_logs() as logs:
            bound = int((await forward(rig.port, "host:forward:tcp:0;jdwp:4242"))[12:])
            await trio.sleep(0.2)  # the front follows the device list now
            rig.adb.set_state(SERIAL, "offline")  # offline: kept, as adb keeps it
            await trio.sleep(0.2)
            assert b"jdwp:4242" in await ask(rig.port, wire("host:list-forward"))
            rig.adb.remove_device(SERIAL)

            async def gone() -> bool:
                return b"jdwp:4242" not in await ask(rig.port, wire("host:list-forward"))

            await wait_until(gone, 5, what="the forward removed")
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", bound)
        (removed,) = events(logs, "front.forward_removed")
        assert removed["reason"] == "its device is gone"


# --- kill


async def test_kill_is_refused_by_default_and_the_server_stays():
    async with fake_rig() as rig:
        with capture_logs() as logs:
            assert await ask(rig.port, wire("host:kill")) == b"OKAY"
        assert rig.adb.running
        assert "host:kill" not in rig.adb.requests
        (refused,) = events(logs, "front.kill_refused")
        assert refused["pid"] == os.getpid()  # the asking process, found by its socket
        assert refused["cmdline"]
        assert refused["key"] == "[front] on_kill"
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"


async def test_a_refused_kill_is_a_warning_the_first_time_naming_the_tool():
    # The user should learn which tool tries to stop the adb server; once is enough.
    async with fake_rig() as rig:
        with capture_logs() as logs:
            for _ in range(3):
                assert await ask(rig.port, wire("host:kill")) == b"OKAY"
        refused = events(logs, "front.kill_refused")
        assert [e["log_level"] for e in refused] == ["warning", "info", "info"]
        assert refused[0]["tool"]  # the asking program, named (here: python, this test)


async def test_kill_relayed_when_configured():
    async with fake_rig(on_kill="relay") as rig:
        with capture_logs() as logs:
            assert await ask(rig.port, wire("host:kill")) == b"OKAY"
            await wait_until(lambda: not rig.adb.running, 2, what="the server killed")
        assert events(logs, "front.kill_relayed")


# --- bad input: never disturbs anyone else


async def test_bad_lengths_close_the_socket_without_a_word():
    async with fake_rig() as rig:
        other = await connect(rig.port)
        async with other:
            await other.send_all(wire("host:track-devices"))
            assert await read_exactly(other, 8 + 0x15) == b"OKAY0015emulator-5554\tdevice\n"
            with capture_logs() as logs:
                for raw in (b"0000", b"zzzz", b"-001x", b"\xff\xff\xff\xffhost:version"):
                    assert await ask(rig.port, raw) == b""
            bad = events(logs, "front.bad_request")
            assert len(bad) == 4
            assert all(e["peer"].startswith("127.0.0.1:") for e in bad)
            assert "length 0" in bad[0]["reason"]
            # the other client is still served
            rig.adb.add_device("emulator-5556")
            assert (await read_exactly(other, 4 + 42)).endswith(b"emulator-5556\tdevice\n")
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"


async def test_half_a_request_then_eof():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(b"000chost:ver")
            await stream.send_eof()
            assert await read_to_eof(stream) == b""
        assert rig.adb.connections == 0  # the server never heard of it


async def test_a_client_sending_a_byte_a_second_is_cut_off():
    async with fake_rig(request_timeout=0.5) as rig:
        with capture_logs() as logs:
            stream = await connect(rig.port)
            async with stream:
                for byte in b"000":  # a byte every 0.2 s: 0.5 s pass before the request is whole
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.2)
                assert await read_to_eof(stream) == b""
        (late,) = events(logs, "front.request_timed_out")
        assert late["received"] >= 2
        assert late["key"] == "[front] request_timeout"
        # a client that sends nothing at all, too
        silent = await connect(rig.port)
        async with silent:
            assert await read_to_eof(silent) == b""


async def test_a_client_that_vanishes_mid_stream():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        await stream.send_all(wire("host:track-devices"))
        await read_exactly(stream, 8)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        await stream.aclose()  # a reset
        rig.adb.add_device("emulator-5556")  # the relay writes into the dead socket
        await trio.sleep(0.2)
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"


async def test_garbage_after_a_switch_is_the_servers_to_judge():
    async with fake_rig() as rig:
        stream = await connect(rig.port)
        async with stream:
            await stream.send_all(wire(f"host:transport:{SERIAL}"))
            await read_exactly(stream, 4)
            await stream.send_all(wire("\x00\x01garbage"))
            assert (await read_to_eof(stream)).startswith(b"FAIL")
        assert f"{SERIAL}:\x00\x01garbage" in rig.adb.requests


# --- the real server down, gone, or the front's port taken


async def test_server_down_closes_the_client_and_logs_once():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            hub = FakeHub(nursery)
            dead = _free_port()
            with capture_logs() as logs:
                async with running_front(dead, hub) as front:
                    for _ in range(3):
                        assert await ask(front.port, wire("host:version")) == b""
            down = events(logs, "front.upstream_unavailable")
            assert len(down) == 1
            assert "Connection refused" in down[0]["reason"]
            assert "was not started" in down[0]["reason"]  # no adb program here
            nursery.cancel_scope.cancel()


async def test_the_server_comes_back():
    async with fake_rig() as rig:
        await rig.adb.kill()
        assert await ask(rig.port, wire("host:version")) == b""
        await rig.nursery.start(rig.adb.run)
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"


async def test_port_taken_runs_on_without_the_front():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            hub = FakeHub(nursery)
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                port = taken.getsockname()[1]
                config = front_config(_free_port(), front_port=port)
                with capture_logs() as logs:
                    bound = await nursery.start(serve_front, config, hub, None)
            assert bound is None
            (warning,) = events(logs, "front.port_in_use")
            assert warning["log_level"] == "warning"
            assert warning["key"] == "[front] port"
            assert warning["port"] == port


async def test_front_on_the_servers_own_port_does_not_start():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            port = _free_port()
            config = front_config(_free_port(), front_port=port)
            # only ANDROID_ADB_SERVER_PORT can do this (a file saying so is a config error)
            config = dataclasses.replace(config, adb=dataclasses.replace(config.adb, port=port))
            with capture_logs() as logs:
                assert await nursery.start(serve_front, config, FakeHub(nursery), None) is None
            (disabled,) = events(logs, "front.disabled")
            assert "relay to itself" in disabled["reason"]


async def test_front_disabled():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            config = front_config(_free_port(), enabled=False)
            with capture_logs() as logs:
                assert await nursery.start(serve_front, config, FakeHub(nursery), None) is None
            assert logs == []


# --- the peer-uid check


async def test_refused_peers_get_nothing_on_the_front_and_its_forwards():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            adb = ForwardingFakeAdb()
            await nursery.start(adb.run)
            adb.add_device(SERIAL)
            hub = FakeHub(nursery)
            hub.hold(SERIAL, 4242)
            nobody = PeerGuard(PeerPolicy(frozenset({2**31})))  # not even us
            with capture_logs() as logs:
                async with running_front(adb.port, hub, guard=nobody) as front:
                    assert await ask(front.port, wire("host:version")) == b""
            assert adb.connections == 0
            assert nobody.refused_counts()["front"] == 1
            assert events(logs, "security.peer_refused")[0]["port_kind"] == "front"
            nursery.cancel_scope.cancel()


# --- statistics


async def test_statistics_count_what_happened():
    async with fake_rig() as rig:
        rig.hub.hold(SERIAL, 4242)
        await ask(rig.port, wire("host:version"))
        await ask(rig.port, wire("host:kill"))
        await ask(rig.port, b"0000")
        await forward(rig.port, "host:forward:tcp:0;jdwp:4242")
        stats = statistics()
        assert stats is not None
        assert stats.port == rig.port
        assert stats.connections == 4
        assert (stats.relayed, stats.kills_refused, stats.bad_requests) == (1, 1, 1)
        assert stats.forwards == 1


# --- helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- one client's trouble is that client's alone


async def test_a_failing_hub_costs_one_client_not_the_front():
    async with fake_rig() as rig:

        def broken(serial: str, pid: int) -> None:
            raise RuntimeError("a bug in the hub")

        rig.hub.find = broken  # type: ignore[method-assign]
        with capture_logs() as logs:
            stream = await connect(rig.port)
            async with stream:
                await stream.send_all(wire(f"host:transport:{SERIAL}"))
                await read_exactly(stream, 4)
                await stream.send_all(wire("jdwp:4242"))
                assert await read_to_eof(stream) == b""
        (failed,) = events(logs, "front.client_failed")
        assert failed["peer"].startswith("127.0.0.1:")
        assert await ask(rig.port, wire("host:version")) == b"OKAY00040029"


async def test_a_switch_too_long_for_its_tport_form_is_relayed_as_it_came():
    async with fake_rig() as rig:
        serial = "x" * (0xFFFF - len("host:transport:"))
        reply = await ask(rig.port, wire(f"host:transport:{serial}"))
        assert reply.startswith(b"FAIL")  # the fake's "not found", for the legacy form
        assert rig.adb.wires[-1] == b"ffff"


async def test_forward_connections_get_the_peer_uid_check():
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            hub = FakeHub(nursery)
            target = hub.hold(SERIAL, 4242)
            nobody = PeerGuard(PeerPolicy(frozenset({2**31})))
            config = front_config(_free_port())
            upstream = Upstream(config.adb, config.timeouts)
            forwards = FrontForwards(hub, upstream, nobody, open_timeout=0.1)
            await nursery.start(forwards.run)
            port = await forwards.add(SERIAL, 4242, 0)
            jdb = await trio.open_tcp_stream("127.0.0.1", port)
            async with jdb:
                await jdb.send_all(HANDSHAKE)
                assert await read_to_eof(jdb) == b""
            assert target.adopted == []
            assert nobody.refused_counts()["front_forward"] == 1
            nursery.cancel_scope.cancel()
