"""`ddmd.sim.adbd.FakeDevice` through the REAL adb server (Debian ``adb``) and the real ``adb``
CLI, on a private port (`tests.adb.device`), and its transport codec and input checks alone.

Behind pid 4242 runs a real HotSpot JVM (JDWP agent on ``127.0.0.1:0``). What a real ART
device does and the fake must do alike (docs adb-front.md section 1): ``jdwp:PID`` answers
OKAY at once; a second stream to the same pid is accepted and dropped (EOF, no handshake
echo); an unknown pid is closed before accepting (``FAIL0006closed``).

Every wait is bounded: ``CAP`` for a whole test, ``WAIT`` for one condition.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import pytest
import trio

from ddmd.sim.adbd import (
    A_CLSE,
    A_CNXN,
    A_OKAY,
    A_OPEN,
    A_VERSION,
    A_WRTE,
    HEADER_SIZE,
    MAX_PAYLOAD,
    AdbTransportError,
    FakeDevice,
    Message,
    MessageDecoder,
    checksum,
    decode_header,
    encode_message,
    shell_output,
)
from tests.actors.rawpeers import free_port_range
from tests.adb.device import AdbDevice, HotSpot, adb, hotspot_jvm, open_adb_device
from tests.e2e.conftest import jdk

__all__ = ["adb", "jdk"]  # fixtures

CAP = 60  # seconds: absolute cap on every test
WAIT = 10  # seconds: one condition
HANDSHAKE = b"JDWP-Handshake"
PID = 4242


# --------------------------------------------------------------------------------------------
# Helpers: a smart-socket client of the adb server, a raw JDWP client


class Wire:
    """A plain TCP stream with exact reads, each bounded by ``WAIT``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def exactly(self, n: int) -> bytes:
        with trio.fail_after(WAIT):
            while len(self.buffer) < n:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(f"EOF after {bytes(self.buffer)!r}, wanted {n} bytes")
                self.buffer += data
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    async def until_eof(self) -> bytes:
        """Everything up to EOF (a reset counts as EOF)."""
        with trio.fail_after(WAIT):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    out = bytes(self.buffer)
                    self.buffer.clear()
                    return out
                self.buffer += data

    async def send(self, data: bytes) -> None:
        with trio.fail_after(WAIT):
            await self.stream.send_all(data)


@asynccontextmanager
async def connect(port: int) -> AsyncIterator[Wire]:
    with trio.fail_after(WAIT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        yield Wire(stream)


async def request(wire: Wire, service: str) -> bytes:
    """Send one smart-socket request; its 4-byte status (OKAY or FAIL)."""
    await wire.send(b"%04x" % len(service) + service.encode())
    return await wire.exactly(4)


@asynccontextmanager
async def device_service(rig: AdbDevice, service: str) -> AsyncIterator[tuple[bytes, Wire]]:
    """``host:transport:SERIAL`` then ``service`` on one server connection: the service's
    status and the wire."""
    async with connect(rig.adb_port) as wire:
        assert await request(wire, f"host:transport:{rig.serial}") == b"OKAY"
        yield await request(wire, service), wire


def jdwp_version_command(packet_id: int) -> bytes:
    """VirtualMachine.Version (1, 1): header only."""
    return struct.pack(">IIBBB", 11, packet_id, 0, 1, 1)


@asynccontextmanager
async def device_with_jvm(
    adb: str, jdk, tmp_path: Path, port: int = 0
) -> AsyncIterator[tuple[AdbDevice, HotSpot]]:
    async with hotspot_jvm(jdk, tmp_path, port) as jvm:
        device = FakeDevice({PID: ("127.0.0.1", jvm.port)})
        async with open_adb_device(device, adb=adb) as rig:
            yield rig, jvm


# --------------------------------------------------------------------------------------------
# The transport codec, alone


def test_header_encoding_matches_adb_layout():
    data = b"host::features=shell_v2"
    raw = encode_message(A_CNXN, A_VERSION, MAX_PAYLOAD, data)
    assert raw[:4] == b"CNXN"
    assert len(raw) == HEADER_SIZE + len(data)
    command, arg0, arg1, length, check, magic = struct.unpack("<6I", raw[:HEADER_SIZE])
    assert (command, arg0, arg1, length) == (A_CNXN, 0x01000000, 256 * 1024, len(data))
    assert check == sum(data)  # "crc32" is really the byte sum
    assert magic == command ^ 0xFFFFFFFF
    assert raw[HEADER_SIZE:] == data
    assert decode_header(raw[:HEADER_SIZE]) == (A_CNXN, A_VERSION, MAX_PAYLOAD, len(data), check)
    for name, value in (
        (b"OPEN", A_OPEN),
        (b"OKAY", A_OKAY),
        (b"WRTE", A_WRTE),
        (b"CLSE", A_CLSE),
    ):
        assert encode_message(value, 1, 2)[:4] == name


def test_decoder_takes_messages_in_any_pieces():
    stream = (
        encode_message(A_OPEN, 7, 0, b"jdwp:4242\0")
        + encode_message(A_OKAY, 7, 1)
        + encode_message(A_WRTE, 7, 1, bytes(range(256)) * 3)
    )
    decoder = MessageDecoder()
    got = []
    for i in range(len(stream)):
        decoder.receive_data(stream[i : i + 1])
        while (message := decoder.next_message()) is not None:
            got.append(message)
    assert got == [
        Message(A_OPEN, 7, 0, b"jdwp:4242\0"),
        Message(A_OKAY, 7, 1),
        Message(A_WRTE, 7, 1, bytes(range(256)) * 3),
    ]
    assert decoder.buffered == 0
    assert checksum(bytes(range(256))) == 255 * 128


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (encode_message(A_OKAY, 1, 2)[:20] + b"\0\0\0\0", "bad magic"),
        (struct.pack("<6I", 0x41414141, 0, 0, 0, 0, 0x41414141 ^ 0xFFFFFFFF), "unknown command"),
        (struct.pack("<6I", A_WRTE, 1, 1, MAX_PAYLOAD + 1, 0, A_WRTE ^ 0xFFFFFFFF), "over"),
        (encode_message(A_WRTE, 1, 1, b"abc")[:-3] + b"abd", "not the payload's sum"),
    ],
)
def test_decoder_rejects_what_is_not_the_protocol(raw, message):
    decoder = MessageDecoder()
    decoder.receive_data(raw)
    with pytest.raises(AdbTransportError, match=message):
        decoder.next_message()


def test_a_zero_data_check_is_accepted():
    raw = bytearray(encode_message(A_WRTE, 1, 1, b"abc"))
    raw[16:20] = b"\0\0\0\0"
    decoder = MessageDecoder()
    decoder.receive_data(raw)
    assert decoder.next_message() == Message(A_WRTE, 1, 1, b"abc")


def test_shell_output():
    props = {"ro.build.version.sdk": "30", "ro.product.model": "ddmd_sim"}
    assert shell_output("echo hi  there", props) == b"hi there\n"
    assert shell_output("getprop ro.build.version.sdk", props) == b"30\n"
    assert shell_output("getprop no.such", props) == b"\n"
    assert shell_output("getprop", props) == (
        b"[ro.build.version.sdk]: [30]\n[ro.product.model]: [ddmd_sim]\n"
    )
    assert b" 4242 " in shell_output("ps", props, [4242])
    assert shell_output("frobnicate -x", props) == b"/system/bin/sh: frobnicate: not found\n"


# --------------------------------------------------------------------------------------------
# The device alone, driven by a scripted "server": flow control and untrusted input


class RawServer:
    """A scripted adb server talking to the device's port."""

    def __init__(self, wire: Wire) -> None:
        self.wire = wire

    async def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        await self.wire.send(encode_message(command, arg0, arg1, data))

    async def receive(self) -> Message:
        header = await self.wire.exactly(HEADER_SIZE)
        command, arg0, arg1, length, _check = decode_header(header)
        return Message(command, arg0, arg1, await self.wire.exactly(length) if length else b"")

    async def connected(self, maxdata: int = MAX_PAYLOAD) -> Message:
        await self.send(A_CNXN, 0x01000001, maxdata, b"host::features=shell_v2,cmd")
        return await self.receive()


@asynccontextmanager
async def serving(device: FakeDevice) -> AsyncIterator[int]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(device.serve)
        yield port
        nursery.cancel_scope.cancel()


async def test_cnxn_banner_and_flow_control():
    # 300 properties of ~40 bytes: more than one WRTE at maxdata 4096.
    props = {f"ro.test.key{i:03d}": "v" * 20 for i in range(300)}
    props.update({"ro.product.name": "ddmdsim", "ro.product.model": "m", "ro.product.device": "d"})
    device = FakeDevice(properties=props)
    expected = shell_output("getprop", props)
    with trio.fail_after(CAP):
        async with serving(device) as port, connect(port) as wire:
            server = RawServer(wire)
            cnxn = await server.connected(maxdata=4096)
            assert (cnxn.command, cnxn.arg0, cnxn.arg1) == (A_CNXN, A_VERSION, MAX_PAYLOAD)
            assert cnxn.data == (
                b"device::ro.product.name=ddmdsim;ro.product.model=m;ro.product.device=d;"
                b"features=cmd"
            )
            await server.send(A_OPEN, 77, 0, b"shell:getprop\0")
            okay = await server.receive()
            assert (okay.command, okay.arg1) == (A_OKAY, 77)
            local = okay.arg0
            out = b""
            while True:
                message = await server.receive()
                if message.command == A_CLSE:
                    assert (message.arg0, message.arg1) == (local, 77)
                    break
                assert (message.command, message.arg0, message.arg1) == (A_WRTE, local, 77)
                assert len(message.data) <= 4096
                out += message.data
                # Nothing more until we OKAY this one.
                with trio.move_on_after(0.2):
                    early = await server.receive()
                    raise AssertionError(f"{early.name} before our OKAY")
                await server.send(A_OKAY, 77, local)
            assert out == expected
            assert len(expected) > 2 * 4096


async def test_refused_services_and_unknown_pids_get_clse_0():
    device = FakeDevice({PID: ("127.0.0.1", 9)})
    with trio.fail_after(CAP):
        async with serving(device) as port, connect(port) as wire:
            server = RawServer(wire)
            await server.connected()
            for i, service in enumerate([b"sync:\0", b"jdwp:9999\0", b"jdwp:x\0", b"\xff\0"]):
                await server.send(A_OPEN, 10 + i, 0, service)
                assert await server.receive() == Message(A_CLSE, 0, 10 + i)
            assert device.statistics().refused == 4


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.0\r\n\r\n" + b"x" * 10,  # not adb at all
        encode_message(A_OPEN, 1, 0, b"shell:echo\0"),  # OPEN before CNXN
        encode_message(A_CNXN, 0x00FFFFFF, MAX_PAYLOAD, b"host::"),  # too old
        encode_message(A_CNXN, A_VERSION, 100, b"host::"),  # maxdata too small
    ],
)
async def test_bad_input_closes_the_connection_not_the_device(garbage):
    device = FakeDevice()
    with trio.fail_after(CAP):
        async with serving(device) as port:
            async with connect(port) as wire:
                await wire.send(garbage)
                assert await wire.until_eof() == b""
            stats = device.statistics()
            assert stats.bad_input == 1, stats
            # ... and the device still serves the next server.
            async with connect(port) as wire:
                cnxn = await RawServer(wire).connected()
                assert cnxn.command == A_CNXN


async def test_bad_input_after_connect_and_a_stalled_message():
    device = FakeDevice(message_timeout=0.3)
    with trio.fail_after(CAP):
        async with serving(device) as port:
            async with connect(port) as wire:
                server = RawServer(wire)
                await server.connected()
                await server.send(A_OPEN, 5, 0, b"track-jdwp\0")
                assert (await server.receive()).command == A_OKAY
                assert (await server.receive()).data == b"0000"
                await server.send(A_OPEN, 5, 0, b"track-jdwp\0")  # reuses an open id
                assert await wire.until_eof() == b""
            async with connect(port) as wire:
                server = RawServer(wire)
                await server.connected()
                await wire.send(encode_message(A_OKAY, 1, 1)[:10])  # half a header, then silence
                assert await wire.until_eof() == b""
            stats = device.statistics()
            assert (stats.bad_input, stats.stalled, stats.online) == (1, 1, 0), stats


# --------------------------------------------------------------------------------------------
# Through the real adb server and the real adb CLI


async def test_devices_and_devices_l(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(adb=adb) as rig:
            listed = await rig.run_adb("devices")
            assert listed.returncode == 0, listed.stderr
            assert f"{rig.serial}\tdevice\n".encode() in listed.stdout
            long = await rig.run_adb("devices", "-l")
            assert long.returncode == 0, long.stderr
            line = next(x for x in long.stdout.decode().splitlines() if x.startswith(rig.serial))
            assert line.split()[1:5] == [
                "device",
                "product:ddmdsim",
                "model:ddmd_sim",
                "device:ddmdsim",
            ]
            assert line.split()[-1].startswith("transport_id:")
            features = await rig.run_adb("-s", rig.serial, "features")
            assert features.stdout.split() == [b"cmd"]


async def test_jdwp_lists_the_pids_and_shell_runs(adb):
    device = FakeDevice({PID: ("127.0.0.1", 9), 5151: ("127.0.0.1", 9)})
    with trio.fail_after(CAP):
        async with open_adb_device(device, adb=adb) as rig:
            listed = await rig.run_adb("-s", rig.serial, "jdwp")
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout == b"4242\n5151\n"
            echo = await rig.run_adb("-s", rig.serial, "shell", "echo", "hi")
            assert (echo.returncode, echo.stdout) == (0, b"hi\n"), echo.stderr
            sdk = await rig.run_adb("-s", rig.serial, "shell", "getprop", "ro.build.version.sdk")
            assert sdk.stdout == b"30\n"
            props = await rig.run_adb("-s", rig.serial, "shell", "getprop")
            assert b"[ro.product.model]: [ddmd_sim]\n" in props.stdout
            missing = await rig.run_adb("-s", rig.serial, "shell", "frobnicate")
            assert missing.stdout == b"/system/bin/sh: frobnicate: not found\n"
            assert device.statistics().services["shell"] == 4


async def test_raw_jdwp_for_an_unknown_pid_is_fail_closed(adb):
    with trio.fail_after(CAP):
        async with open_adb_device(FakeDevice({PID: ("127.0.0.1", 9)}), adb=adb) as rig:
            async with device_service(rig, "jdwp:9999") as (status, wire):
                assert status + await wire.until_eof() == b"FAIL0006closed"
            # A known pid whose VM does not answer: OKAY, then EOF (as ART's refusal looks).
            async with device_service(rig, f"jdwp:{PID}") as (status, wire):
                assert status == b"OKAY"
                assert await wire.until_eof() == b""
            assert rig.device.statistics().connect_failed == 1


@pytest.mark.jvm
async def test_forward_to_hotspot_first_debugger_wins_second_gets_eof(adb, jdk, tmp_path):
    with trio.fail_after(CAP):
        # A fixed agent port: on port 0 HotSpot would listen on a new port after the first
        # session, and the last step attaches again.
        (jvm_port,) = free_port_range(1)
        async with device_with_jvm(adb, jdk, tmp_path, jvm_port) as (rig, _jvm):
            forwarded = await rig.run_adb("-s", rig.serial, "forward", "tcp:0", f"jdwp:{PID}")
            assert forwarded.returncode == 0, forwarded.stderr
            local = int(forwarded.stdout)
            async with connect(local) as first:
                await first.send(HANDSHAKE)
                assert await first.exactly(len(HANDSHAKE)) == HANDSHAKE
                # A second debugger through the same forward: accepted and dropped, as on ART.
                async with connect(local) as second:
                    # Closed before the handshake went out would be EOF all the same.
                    with contextlib.suppress(trio.BrokenResourceError):
                        await second.send(HANDSHAKE)
                    assert await second.until_eof() == b""
                # The first one still works: a real JDWP command and its reply.
                await first.send(jdwp_version_command(1))
                length, packet_id, flags, error = struct.unpack(">IIBH", await first.exactly(11))
                assert (packet_id, flags, error) == (1, 0x80, 0)
                reply = await first.exactly(length - 11)
                assert b"Java" in reply or b"HotSpot" in reply
            stats = rig.device.statistics()
            assert stats.dropped == 1
            assert stats.services["jdwp-relay"] == 1
            # The first closed: the pid is free again for the next debugger (HotSpot listens
            # again within milliseconds of a close; the relay may still be closing).
            with trio.fail_after(WAIT):
                while True:
                    async with connect(local) as again:
                        await again.send(HANDSHAKE)
                        try:
                            if await again.exactly(len(HANDSHAKE)) == HANDSHAKE:
                                break
                        except (EOFError, trio.BrokenResourceError):
                            pass
                    await trio.sleep(0.05)
            listed = await rig.run_adb("forward", "--list")
            assert f"{rig.serial} tcp:{local} jdwp:{PID}".encode() in listed.stdout


async def test_track_jdwp_follows_add_and_remove(adb):
    device = FakeDevice({PID: ("127.0.0.1", 9)})
    with trio.fail_after(CAP):
        async with (
            open_adb_device(device, adb=adb) as rig,
            device_service(rig, "track-jdwp") as (status, wire),
        ):
            assert status == b"OKAY"
            assert await wire.exactly(9) == b"00054242\n"
            device.add_pid(5151, "127.0.0.1", 9)
            assert await wire.exactly(14) == b"000a4242\n5151\n"
            device.remove_pid(PID)
            assert await wire.exactly(9) == b"00055151\n"
            device.remove_pid(5151)
            assert await wire.exactly(4) == b"0000"


async def test_track_jdwp_through_the_adb_cli(adb):
    device = FakeDevice({PID: ("127.0.0.1", 9)})
    with trio.fail_after(CAP):
        async with open_adb_device(device, adb=adb) as rig, trio.open_nursery() as nursery:
            process = await nursery.start(
                partial(
                    trio.run_process,
                    [rig.adb, "-P", str(rig.adb_port), "-s", rig.serial, "track-jdwp"],
                    stdout=subprocess.PIPE,
                    env=rig.env,
                    check=False,
                )
            )
            seen = bytearray()

            async def wait_for(text: bytes) -> None:
                with trio.fail_after(WAIT):
                    while text not in seen:
                        data = await process.stdout.receive_some(4096)
                        assert data, f"adb track-jdwp ended: {bytes(seen)!r}"
                        seen.extend(data)

            await wait_for(b"4242\n")
            device.add_pid(5151, "127.0.0.1", 9)
            await wait_for(b"4242\n5151\n")
            process.kill()
