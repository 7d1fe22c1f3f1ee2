"""The adb front in front of the REAL adb server (Debian ``adb`` 29.0.6) on a private port, with
the real ``adb`` CLI and adbutils pointed at the front, and a fake device
(``ddmd.sim.adbd.FakeDevice``) that the real server adopts (`tests.adb.device`).

Never port 5037; HOME is a temporary directory; every server a test starts is killed. What
the CLI prints through the front is compared with what it prints talking to the server
directly. The VMs ddmd "holds" are a `FakeHub`'s (tests/front/fakes.py): a consumer handed to
it gets the JDWP handshake echoed.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import adbutils
import pytest
import trio
from structlog.testing import capture_logs

import ddmd.front.server
from ddmd.sim.adbd import FakeDevice
from tests.actors.rawpeers import wait_until
from tests.adb.device import (
    AdbDevice,
    adb,
    adb_env,
    hotspot_jvm,
    open_adb_device,
    pick_port,
)
from tests.e2e.conftest import jdk
from tests.e2e.jdbdriver import open_jdb
from tests.front.fakes import (
    HANDSHAKE,
    FakeHub,
    Front,
    jdwp_echo_listener,
    read_exactly,
    read_to_eof,
    running_front,
    wire,
)

__all__ = ["adb", "jdk"]  # the fixtures

CAP = 60  # seconds: every test
HELD = 4242  # a pid ddmd "holds" (the FakeHub has it)
FREE = 4343  # a pid ddmd does not hold: the front relays it
MISMATCH = b"doesn't match this client"


@dataclass
class Rig:
    device: AdbDevice  # the real server, and the fake device in it
    hub: FakeHub
    front: Front
    nursery: trio.Nursery
    vm_connections: list[int]  # connections that reached the VM behind the device

    @property
    def serial(self) -> str:
        return self.device.serial

    async def via_front(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await run_adb(self.device.adb, self.front.port, self.device.home, *args)

    async def direct(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return await self.device.run_adb(*args)


async def run_adb(
    adb: str, port: int, home: Path, *args: str
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(20):
        return await trio.run_process(
            [adb, "-P", str(port), *args],
            capture_stdout=True,
            capture_stderr=True,
            stdin=subprocess.DEVNULL,
            check=False,
            env=adb_env(home),
        )


@asynccontextmanager
async def real_rig(adb: str, **front: object) -> AsyncIterator[Rig]:
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            vm_port, vm_connections = await jdwp_echo_listener(nursery, greeting=b"device-vm")
            device = FakeDevice({HELD: ("127.0.0.1", vm_port), FREE: ("127.0.0.1", vm_port)})
            async with open_adb_device(device, adb=adb) as real:
                hub = FakeHub(nursery)
                hub.hold(real.serial, HELD, greeting=b"ddmd")
                async with running_front(
                    real.adb_port,
                    hub,
                    front_port=pick_port(),
                    adb_path=adb,
                    home=real.home,
                    **front,  # type: ignore[arg-type]
                ) as running:
                    yield Rig(real, hub, running, nursery, vm_connections)
            nursery.cancel_scope.cancel()


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def raw(port: int, data: bytes, patience: float = 1.0) -> bytes:
    """Send `data`, read until EOF; b"<open>" marks a connection still open at the end."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        with trio.move_on_after(patience):
            try:
                while chunk := await stream.receive_some(65536):
                    out += chunk
            except trio.BrokenResourceError:
                pass
            return out
        return out + b"<open>"


# --- the CLI sees the same server


async def test_the_cli_prints_the_same_through_the_front(adb):
    async with real_rig(adb) as rig:
        for args in (
            ("devices",),
            ("devices", "-l"),
            ("-s", rig.serial, "jdwp"),
            ("-s", rig.serial, "shell", "echo", "hi"),
            ("-s", rig.serial, "get-state"),
            ("-s", rig.serial, "get-serialno"),
            ("forward", "--list"),
            ("start-server",),
        ):
            direct = await rig.direct(*args)
            front = await rig.via_front(*args)
            assert (front.returncode, front.stdout, front.stderr) == (
                direct.returncode,
                direct.stdout,
                direct.stderr,
            ), args
            assert MISMATCH not in front.stderr
        assert (await rig.via_front("-s", rig.serial, "shell", "echo", "hi")).stdout == b"hi\n"
        assert rig.serial.encode() in (await rig.via_front("devices")).stdout
        assert f"{HELD}\n{FREE}\n".encode() == (await rig.via_front("jdwp")).stdout


async def test_version_is_the_real_servers(adb):
    async with real_rig(adb) as rig:
        direct = await raw(rig.device.adb_port, wire("host:version"))
        assert direct == b"OKAY00040029"
        assert await raw(rig.front.port, wire("host:version")) == direct
        assert await raw(rig.front.port, wire("host:version", upper=True)) == direct


async def test_kill_server_succeeds_and_the_server_keeps_serving(adb):
    async with real_rig(adb) as rig:
        with capture_logs() as logs:
            killed = await rig.via_front("kill-server")
        assert killed.returncode == 0, killed.stderr
        (refused,) = [e for e in logs if e["event"] == "front.kill_refused"]
        assert refused["tool"] == "adb"  # the asking process, by its socket
        assert "kill-server" in refused["cmdline"]
        assert MISMATCH not in killed.stderr
        assert listening(rig.device.adb_port)
        listed = await rig.direct("devices")
        assert f"{rig.serial}\tdevice".encode() in listed.stdout
        again = await rig.via_front("devices")
        assert again.returncode == 0
        assert f"{rig.serial}\tdevice".encode() in again.stdout


# --- jdwp:PID


async def test_jdwp_of_a_held_vm_is_ddmds_and_of_another_the_servers(adb):
    async with real_rig(adb, open_timeout=0.3) as rig:
        for switch, size in (
            (f"host:transport:{rig.serial}", 4),
            (f"host:tport:serial:{rig.serial}", 12),
            ("host:transport-any", 4),
            ("host:tport:any", 12),
        ):
            stream = await trio.open_tcp_stream("127.0.0.1", rig.front.port)
            async with stream:
                await stream.send_all(wire(switch))
                assert (await read_exactly(stream, size))[:4] == b"OKAY"
                await stream.send_all(wire(f"jdwp:{HELD}"))
                assert await read_exactly(stream, 4) == b"OKAY"
                await stream.send_all(HANDSHAKE)
                assert await read_exactly(stream, 18) == HANDSHAKE + b"ddmd"
        target = rig.hub.targets[(rig.serial, HELD)]
        assert [a.via for a in target.adopted] == ["front"] * 4
        assert rig.vm_connections == []  # the device's VM was never opened
        # a pid ddmd does not hold: the real server and the device serve it
        stream = await trio.open_tcp_stream("127.0.0.1", rig.front.port)
        async with stream:
            await stream.send_all(wire(f"host:transport:{rig.serial}"))
            await read_exactly(stream, 4)
            await stream.send_all(wire(f"jdwp:{FREE}"))
            assert await read_exactly(stream, 4) == b"OKAY"
            await stream.send_all(HANDSHAKE)
            assert await read_exactly(stream, 23) == HANDSHAKE + b"device-vm"
        assert rig.vm_connections == [1]


async def test_an_unknown_pid_gets_the_servers_answer(adb):
    async with real_rig(adb, open_timeout=0.2) as rig:
        for port in (rig.device.adb_port, rig.front.port):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(wire(f"host:transport:{rig.serial}"))
                await read_exactly(stream, 4)
                await stream.send_all(wire("jdwp:9999"))
                assert await read_to_eof(stream) == b"FAIL0006closed"


# --- forwards


async def test_forwards_through_the_front_read_like_the_servers(adb):
    async with real_rig(adb, open_timeout=0.3) as rig:
        fixed = pick_port()
        made = await rig.via_front("-s", rig.serial, "forward", f"tcp:{fixed}", f"jdwp:{HELD}")
        assert (made.returncode, made.stdout) == (0, f"{fixed}\n".encode()), made.stderr
        picked = await rig.via_front("forward", "tcp:0", f"jdwp:{HELD}")
        assert picked.returncode == 0, picked.stderr
        any_port = int(picked.stdout)
        # a forward the front does not serve (its pid is not held): the server makes it
        relayed = await rig.via_front("-s", rig.serial, "forward", "tcp:0", f"jdwp:{FREE}")
        server_port = int(relayed.stdout)
        # the same command straight to the server prints the same kind of thing
        direct = await rig.direct("-s", rig.serial, "forward", "tcp:0", f"jdwp:{FREE}")
        assert direct.returncode == 0
        assert direct.stdout.strip().isdigit()
        direct_port = int(direct.stdout)

        listed = (await rig.via_front("forward", "--list")).stdout.decode().split("\n")
        assert f"{rig.serial} tcp:{server_port} jdwp:{FREE}" in listed
        assert f"{rig.serial} tcp:{direct_port} jdwp:{FREE}" in listed
        assert f"{rig.serial} tcp:{fixed} jdwp:{HELD}" in listed
        assert f"{rig.serial} tcp:{any_port} jdwp:{HELD}" in listed
        assert listed[-2:] == ["", ""]  # the CLI prints the list, then "\n"
        server_listed = (await rig.direct("forward", "--list")).stdout.decode().split("\n")
        assert sorted(server_listed) == sorted(
            ["", "", *(f"{rig.serial} tcp:{p} jdwp:{FREE}" for p in (server_port, direct_port))]
        )

        # a debugger on the front's forward: a consumer of ddmd's VM (no OKAY first)
        for port in (fixed, any_port):
            jdb = await trio.open_tcp_stream("127.0.0.1", port)
            async with jdb:
                await jdb.send_all(HANDSHAKE)
                assert await read_exactly(jdb, 18) == HANDSHAKE + b"ddmd"
        # ... and on the server's: the device's VM
        jdb = await trio.open_tcp_stream("127.0.0.1", server_port)
        async with jdb:
            await jdb.send_all(HANDSHAKE)
            assert await read_exactly(jdb, 23) == HANDSHAKE + b"device-vm"

        norebind = await rig.via_front("forward", "--no-rebind", f"tcp:{fixed}", f"jdwp:{HELD}")
        assert norebind.returncode == 1
        assert b"cannot rebind existing socket" in norebind.stderr
        same = await rig.direct("forward", "--no-rebind", f"tcp:{direct_port}", f"jdwp:{FREE}")
        assert (same.returncode, same.stderr) == (norebind.returncode, norebind.stderr)

        removed = await rig.via_front("forward", "--remove", f"tcp:{fixed}")
        assert (removed.returncode, removed.stdout, removed.stderr) == (0, b"", b"")
        assert not listening(fixed)
        missing = await rig.via_front("forward", "--remove", f"tcp:{fixed}")
        direct_missing = await rig.direct("forward", "--remove", f"tcp:{fixed}")
        assert (missing.returncode, missing.stderr) == (
            direct_missing.returncode,
            direct_missing.stderr,
        )
        cleared = await rig.via_front("forward", "--remove-all")
        assert cleared.returncode == 0, cleared.stderr
        assert (await rig.via_front("forward", "--list")).stdout == b"\n"  # as the server's
        assert not listening(any_port)


async def test_a_taken_port_is_refused_in_the_servers_words(adb):
    async with real_rig(adb, open_timeout=0.3) as rig:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            front = await rig.via_front("forward", f"tcp:{port}", f"jdwp:{HELD}")
            direct = await rig.direct("forward", f"tcp:{port}", f"jdwp:{FREE}")
        assert front.returncode == direct.returncode == 1
        assert front.stderr == direct.stderr
        assert b"cannot bind listener: Address already in use" in front.stderr


async def test_a_forward_of_the_server_on_that_port_moves_to_the_front(adb):
    async with real_rig(adb) as rig:
        port = int((await rig.direct("forward", "tcp:0", f"jdwp:{FREE}")).stdout)
        moved = await rig.via_front("forward", f"tcp:{port}", f"jdwp:{HELD}")
        assert (moved.returncode, moved.stdout) == (0, f"{port}\n".encode()), moved.stderr
        assert (await rig.direct("forward", "--list")).stdout == b"\n"  # the server has none
        jdb = await trio.open_tcp_stream("127.0.0.1", port)
        async with jdb:
            await jdb.send_all(HANDSHAKE)
            assert await read_exactly(jdb, 18) == HANDSHAKE + b"ddmd"


@pytest.mark.jvm
async def test_jdb_through_a_front_forward_reaches_the_vm(adb, jdk, tmp_path):
    async with real_rig(adb) as rig, hotspot_jvm(jdk, tmp_path) as jvm:
        target = rig.hub.hold_bridge(rig.serial, 77, ("127.0.0.1", jvm.port))
        made = await rig.via_front("-s", rig.serial, "forward", "tcp:0", "jdwp:77")
        assert made.returncode == 0, made.stderr
        port = int(made.stdout)
        async with open_jdb(jdk.jdb, port, patience=20) as jdb:
            await jdb.attached()
            threads = await jdb.command("threads", r"main")
            assert "main" in threads
            await jdb.quit()
        ((adopted),) = target.adopted
        # Handed over with no lookup first; the VM's driver names it "jdb" afterwards
        # (tests/e2e/test_front_sharing.py shows that through the whole daemon).
        assert (adopted.via, adopted.tool) == ("front-forward", None)


# --- bad input: the front answers what the server answers


@pytest.mark.parametrize(
    "data",
    [
        b"0000",
        b"zzzz",
        b"+00c",
        b"000",  # half a length, then nothing: both wait
        b"000chost:vers",  # half a request: both wait
        wire("host:frobnicate"),
        wire("host:"),
        wire("HOST:version"),
        wire("host-serial:[::1]"),
        wire("host-serial:nope:features"),
        wire("host:transport-id:abc"),
        wire("host:tport:serial:"),
        wire("jdwp:4242"),  # no switch first
    ],
)
async def test_bad_input_gets_the_servers_answer(adb, data):
    async with real_rig(adb, request_timeout=5.0, open_timeout=0.3) as rig:
        direct = await raw(rig.device.adb_port, data)
        front = await raw(rig.front.port, data)
        assert front == direct, data


async def test_garbage_after_a_switch_is_judged_by_the_server(adb):
    async with real_rig(adb) as rig:
        replies = []
        for port in (rig.device.adb_port, rig.front.port):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(wire(f"host:transport:{rig.serial}"))
                assert await read_exactly(stream, 4) == b"OKAY"
                await stream.send_all(wire("\x01garbage:jdwp:1"))
                replies.append(await read_to_eof(stream))
        assert replies[0] == replies[1]
        assert replies[0] == b"FAIL0006closed"


# --- adbutils


async def test_adbutils_through_the_front(adb):
    async with real_rig(adb) as rig:

        def work() -> tuple[list[str], str, list[tuple[str, str, str]], bytes]:
            client = adbutils.AdbClient(host="127.0.0.1", port=rig.front.port, socket_timeout=10)
            serials = [d.serial for d in client.device_list()]
            device = client.device(rig.serial)
            said = device.shell("echo hi")
            # The debuggable pids: adbutils has no helper; its transport takes the service.
            transport = device.open_transport()
            transport.send_command("jdwp")
            transport.check_okay()
            pids = b""
            while chunk := transport.conn.recv(4096):
                pids += chunk
            transport.close()
            port = pick_port()
            device.forward(f"tcp:{port}", f"jdwp:{HELD}")
            forwards = [(f.serial, f.local, f.remote) for f in device.forward_list()]
            return serials, said, forwards, pids

        serials, said, forwards, pids = await trio.to_thread.run_sync(work)
        assert serials == [rig.serial]
        assert said.strip() == "hi"
        assert pids == f"{HELD}\n{FREE}\n".encode()
        ((serial, local, remote),) = forwards
        assert (serial, remote) == (rig.serial, f"jdwp:{HELD}")
        jdb = await trio.open_tcp_stream("127.0.0.1", int(local[4:]))
        async with jdb:
            await jdb.send_all(HANDSHAKE)
            assert await read_exactly(jdb, 18) == HANDSHAKE + b"ddmd"


# --- the real server down; transparent mode


@asynccontextmanager
async def private_server_port(adb: str, home: Path) -> AsyncIterator[int]:
    """A free port for a server the test (or the front) starts; killed at the end."""
    port = pick_port()
    default_was_listening = listening(5037)
    try:
        yield port
    finally:
        with trio.CancelScope(shield=True):
            if listening(port):
                await run_adb(adb, port, home, "kill-server")
    if not default_was_listening:
        assert not listening(5037), "something started an adb server on 5037"


async def test_the_front_starts_a_server_that_is_down(adb, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the server's keys: not the user's
    for name in ("ANDROID_ADB_SERVER_PORT", "ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    with trio.fail_after(CAP):
        async with private_server_port(adb, tmp_path) as server_port, trio.open_nursery() as n:
            hub = FakeHub(n)
            async with running_front(
                server_port, hub, adb_path=adb, home=tmp_path, front_port=pick_port()
            ) as front:
                assert not listening(server_port)
                listed = await run_adb(adb, front.port, tmp_path, "devices")
                assert listed.returncode == 0, listed.stderr
                assert listed.stdout.startswith(b"List of devices attached")
                assert b"daemon not running" not in listed.stderr  # the CLI started nothing
                assert listening(server_port)
            # not transparent mode: the server stays, as adb's own servers do
            assert listening(server_port)
            n.cancel_scope.cancel()


async def test_transparent_mode_runs_and_stops_its_server(adb, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("ANDROID_ADB_SERVER_PORT", "ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    front_port = pick_port()
    # Transparent mode is "the front on adb's default port"; the test never touches 5037,
    # so the front's notion of that port is moved to a private one.
    monkeypatch.setattr(ddmd.front.server, "DEFAULT_ADB_PORT", front_port)
    with trio.fail_after(CAP):
        async with private_server_port(adb, tmp_path) as server_port, trio.open_nursery() as n:
            hub = FakeHub(n)
            async with running_front(
                server_port, hub, adb_path=adb, home=tmp_path, front_port=front_port
            ) as front:
                await wait_until(lambda: listening(server_port), 20, what="the real server up")
                version = await raw(front.port, wire("host:version"))
                assert version == b"OKAY00040029"
                killed = await run_adb(adb, front.port, tmp_path, "kill-server")
                assert killed.returncode == 0
                assert listening(server_port)  # refused: still up
            await wait_until(
                lambda: not listening(server_port), 10, what="the server stopped with the front"
            )
            n.cancel_scope.cancel()


async def test_transparent_mode_leaves_a_server_it_did_not_start(adb, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("ANDROID_ADB_SERVER_PORT", "ADB_SERVER_SOCKET", "ANDROID_ADB_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    front_port = pick_port()
    monkeypatch.setattr(ddmd.front.server, "DEFAULT_ADB_PORT", front_port)
    with trio.fail_after(CAP):
        async with private_server_port(adb, tmp_path) as server_port, trio.open_nursery() as n:
            started = await run_adb(adb, server_port, tmp_path, "start-server")
            assert started.returncode == 0, started.stderr
            async with running_front(
                server_port, FakeHub(n), adb_path=adb, home=tmp_path, front_port=front_port
            ) as front:
                assert await raw(front.port, wire("host:version")) == b"OKAY00040029"
            await trio.sleep(0.5)
            assert listening(server_port)  # not the front's to stop
            n.cancel_scope.cancel()
