"""ddmd.peers (the peer-uid rule), the control server's listeners and the scan's uid rule,
without switching users: the socket tables are faked (a row for the real connection's far end
with another uid), or the rule is given a policy that does not include this user, so the real
kernel answers "not allowed". tests/security/test_other_user.py runs real clients as another
user (root only).
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from structlog.testing import capture_logs

from ddmd.config import SecurityConfig
from ddmd.discovery import VmFound
from ddmd.discovery import scan as scan_module
from ddmd.discovery.scan import PortScanner
from ddmd.host.localproc import PeerOwner, socket_tables_readable
from ddmd.peers import GuardedListener, PeerGuard, PeerPolicy, Verdict, warn_if_unchecked
from tests.actors.needs import IN_CI
from tests.actors.rawpeers import PeerConnection, RawPeer, free_port_range, make_config
from tests.host.test_localproc import HEADER

CAP = 20  # seconds for each test
FOREIGN = 4242  # a uid that is neither this user nor root
ME = os.geteuid()

needs_proc = pytest.mark.skipif(
    not socket_tables_readable() and not IN_CI,
    reason="needs Linux /proc/net/tcp (the real socket tables)",
)


# --------------------------------------------------------------------------------------------
# The policy


def test_policy_from_config_allows_me_root_and_the_list() -> None:
    policy = PeerPolicy.from_config(SecurityConfig(False, (1001, 1002), "refuse"))
    assert policy.allowed == {os.getuid(), os.geteuid(), 0, 1001, 1002}
    assert policy.unknown == "refuse"


@pytest.mark.parametrize(
    ("owner", "local", "unknown", "allowed", "uid"),
    [
        (PeerOwner(ME, "found"), True, "refuse", True, ME),
        (PeerOwner(0, "found"), True, "refuse", True, 0),
        (PeerOwner(FOREIGN, "found"), True, "allow", False, FOREIGN),
        # No tables at all (not Linux): unknown_peer decides.
        (PeerOwner(None, "unreadable"), True, "allow", True, None),
        (PeerOwner(None, "unreadable"), True, "refuse", False, None),
        # A local peer without a row, or one that closed its end: refused whatever the mode.
        (PeerOwner(None, "closed"), True, "allow", False, None),
        (PeerOwner(None, "absent"), True, "allow", False, None),
        # A peer on another machine (allow_non_loopback): unknown_peer decides.
        (PeerOwner(None, "absent"), False, "allow", True, None),
        (PeerOwner(None, "absent"), False, "refuse", False, None),
    ],
)
def test_judge_owner(owner, local, unknown, allowed, uid) -> None:
    policy = PeerPolicy(frozenset({ME, 0}), unknown)
    verdict = policy.judge_owner(owner, local_peer=local)
    assert (verdict.allowed, verdict.uid) == (allowed, uid)
    assert verdict.reason


# --------------------------------------------------------------------------------------------
# Fake socket tables for real connections


def _hex4(ip: str) -> str:
    return f"{int.from_bytes(socket.inet_aton(ip), sys.byteorder):08X}"


def row(local: tuple[str, int], remote: tuple[str, int], uid: int, inode: int = 777) -> str:
    """A /proc/net/tcp ESTABLISHED row for an IPv4 socket, in this machine's byte order."""
    return (
        f"   0: {_hex4(local[0])}:{local[1]:04X} {_hex4(remote[0])}:{remote[1]:04X} 01 "
        f"00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} 1 "
        "0000000000000000 20 4 30 10 -1"
    )


class FakeTables:
    """A /proc with only net/tcp, listing the rows added so far."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "net").mkdir(parents=True)
        self.rows: list[str] = []
        self._write()

    def add(self, line: str) -> None:
        self.rows.append(line)
        self._write()

    def _write(self) -> None:
        (self.root / "net" / "tcp").write_text("\n".join([HEADER, *self.rows]) + "\n")

    def client(self, server_port: int, uid: int) -> socket.socket:
        """A client socket bound to a free port, whose row says `uid` owns it; not connected."""
        client = socket.socket()
        client.bind(("127.0.0.1", 0))
        port = client.getsockname()[1]
        self.add(row(("127.0.0.1", port), ("127.0.0.1", server_port), uid))
        return client


@pytest.fixture
def tables(tmp_path) -> FakeTables:
    return FakeTables(tmp_path / "proc")


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


async def connect(client: socket.socket, port: int, payload: bytes) -> None:
    client.setblocking(False)
    sock = trio.socket.from_stdlib_socket(client)
    await sock.connect(("127.0.0.1", port))
    await sock.send(payload)


async def read_all(client: socket.socket) -> bytes:
    """Everything the server sends until it closes (a reset counts as the end)."""
    sock = trio.socket.from_stdlib_socket(client)
    data = b""
    while True:
        try:
            chunk = await sock.recv(4096)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


async def accept_into(listener: GuardedListener, accepted: list[trio.SocketStream]) -> None:
    accepted.append(await listener.accept())


async def open_guarded(guard: PeerGuard, kind: Any = "vm_port") -> tuple[GuardedListener, int]:
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    return GuardedListener(inner, guard, kind), inner.socket.getsockname()[1]


# --------------------------------------------------------------------------------------------
# The guarded listener


async def test_refused_before_a_byte_is_read_and_logged_once(tables, clients) -> None:
    guard = PeerGuard(PeerPolicy(frozenset({ME, 0})), proc_root=str(tables.root))
    listener, port = await open_guarded(guard, "vm_port")
    with capture_logs() as logs, trio.fail_after(CAP):
        async with listener, trio.open_nursery() as nursery:
            accepted: list[trio.SocketStream] = []

            async def accept() -> None:
                accepted.append(await listener.accept())

            nursery.start_soon(accept)
            foreign = [tables.client(port, FOREIGN) for _ in range(2)]
            clients.extend(foreign)
            for client in foreign:
                await connect(client, port, b"JDWP-Handshake")
                assert await read_all(client) == b""  # closed, nothing answered
            assert not accepted, "a refused connection must never be handed on"
            mine = tables.client(port, ME)
            clients.append(mine)
            await connect(mine, port, b"JDWP-Handshake")
        (stream,) = accepted
        assert await stream.receive_some(14) == b"JDWP-Handshake"
        await stream.aclose()
    assert guard.refused_counts() == {
        "vm_port": 2,
        "current_port": 0,
        "control": 0,
        "front": 0,
        "front_forward": 0,
    }
    refused = [e for e in logs if e["event"] == "security.peer_refused"]
    assert len(refused) == 1  # once per (uid, port)
    assert refused[0]["uid"] == FOREIGN
    assert refused[0]["port"] == port
    assert refused[0]["port_kind"] == "vm_port"
    assert "allowed_uids" in refused[0]["reason"]


async def test_allowed_uids_admit_the_other_user(tables, clients) -> None:
    guard = PeerGuard(PeerPolicy(frozenset({ME, 0, FOREIGN})), proc_root=str(tables.root))
    listener, port = await open_guarded(guard)
    with trio.fail_after(CAP):
        async with listener:
            client = tables.client(port, FOREIGN)
            clients.append(client)
            await connect(client, port, b"JDWP-Handshake")
            stream = await listener.accept()
            assert await stream.receive_some(14) == b"JDWP-Handshake"
            await stream.aclose()
    assert guard.refused_counts()["vm_port"] == 0


async def test_a_slow_lookup_refuses(tmp_path, clients) -> None:
    # net/tcp is a FIFO nobody writes to: reading it blocks, as a stuck /proc would.
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    fifo = root / "net" / "tcp"
    os.mkfifo(fifo)
    guard = PeerGuard(PeerPolicy(frozenset({ME, 0})), proc_root=str(root), lookup_timeout=0.3)
    accepted: list[trio.SocketStream] = []
    listener, port = await open_guarded(guard, "current_port")
    try:
        with capture_logs() as logs, trio.fail_after(CAP):
            async with listener, trio.open_nursery() as nursery:
                nursery.start_soon(accept_into, listener, accepted)
                client = socket.socket()
                clients.append(client)
                await connect(client, port, b"JDWP-Handshake")
                assert await read_all(client) == b""
                assert accepted == []
                nursery.cancel_scope.cancel()
    finally:
        # Let the abandoned worker threads go: open the FIFO's other end and close it.
        for _ in range(4):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break
    assert guard.refused_counts()["current_port"] == 1
    (line,) = [e for e in logs if e["event"] == "security.peer_refused"]
    assert "could not be found within" in line["reason"]


class BrokenPolicy(PeerPolicy):
    def judge_now(self, facts: Any, ask: Any = None) -> Verdict | None:
        raise RuntimeError("boom")

    def judge(self, facts: Any, proc_root: str, tables: Any = None) -> Verdict:
        raise RuntimeError("boom")


class SlowBrokenPolicy(BrokenPolicy):
    def judge_now(self, facts: Any, ask: Any = None) -> Verdict | None:
        return None  # no quick answer: the lookup in the thread fails


@pytest.mark.parametrize(
    "policy",
    [BrokenPolicy, SlowBrokenPolicy],
    ids=["the quick check fails", "the lookup in the thread fails"],
)
async def test_a_failing_check_refuses(clients, policy) -> None:
    guard = PeerGuard(policy(frozenset({ME, 0})))
    accepted: list[trio.SocketStream] = []
    listener, port = await open_guarded(guard, "control")
    with trio.fail_after(CAP):
        async with listener, trio.open_nursery() as nursery:
            nursery.start_soon(accept_into, listener, accepted)
            client = socket.socket()
            clients.append(client)
            await connect(client, port, b"GET / HTTP/1.1\r\n\r\n")
            assert await read_all(client) == b""
            assert accepted == []
            nursery.cancel_scope.cancel()
    assert guard.refused_counts()["control"] == 1


@needs_proc
async def test_real_tables_refuse_a_user_not_in_the_policy(clients) -> None:
    # The kernel says this user owns the client; a policy without this user refuses it.
    guard = PeerGuard(PeerPolicy(frozenset({FOREIGN})))
    listener, port = await open_guarded(guard)
    accepted: list[trio.SocketStream] = []
    with capture_logs() as logs, trio.fail_after(CAP):
        async with listener, trio.open_nursery() as nursery:
            nursery.start_soon(accept_into, listener, accepted)
            client = socket.socket()
            clients.append(client)
            await connect(client, port, b"JDWP-Handshake")
            assert await read_all(client) == b""
            assert accepted == []
            nursery.cancel_scope.cancel()
    (line,) = [e for e in logs if e["event"] == "security.peer_refused"]
    assert line["uid"] == ME


def test_warning_only_without_tables(tmp_path) -> None:
    policy = PeerPolicy(frozenset({ME, 0}))
    empty = tmp_path / "proc"
    empty.mkdir()
    with capture_logs() as logs:
        assert warn_if_unchecked(policy, proc_root=str(empty)) is False
    (line,) = logs
    assert line["event"] == "security.uids_unchecked"
    assert line["key"] == "[security] unknown_peer"
    tables = FakeTables(tmp_path / "ok")
    with capture_logs() as logs:
        assert warn_if_unchecked(policy, proc_root=str(tables.root)) is True
    assert logs == []


# --------------------------------------------------------------------------------------------
# The control API's listeners


async def _health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


APP = Starlette(routes=[Route("/health", _health)])
REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


async def test_control_api_refuses_before_any_http_byte(tables, clients) -> None:
    from ddmd.control.server import serve_control

    guard = PeerGuard(PeerPolicy(frozenset({ME, 0})), proc_root=str(tables.root))
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                partial(serve_control, APP, tcp=("127.0.0.1", 0), guard=guard)
            )
            port = bound.tcp[1]
            foreign = tables.client(port, FOREIGN)
            clients.append(foreign)
            await connect(foreign, port, REQUEST)
            assert await read_all(foreign) == b""  # not even a 500
            mine = tables.client(port, ME)
            clients.append(mine)
            await connect(mine, port, REQUEST)
            answer = await read_all(mine)
            assert answer.startswith(b"HTTP/1.1 200")
            nursery.cancel_scope.cancel()
    assert guard.refused_counts()["control"] == 1


# --------------------------------------------------------------------------------------------
# The unix socket


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # A short directory: sun_path holds 107 bytes, and pytest's tmp_path can be long.
    base = Path(tempfile.mkdtemp(prefix="ddmd-t"))
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


async def test_unix_socket_is_private_and_serves(sock_dir) -> None:
    from ddmd.control.server import serve_control

    path = sock_dir / "control.sock"
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                partial(
                    serve_control,
                    APP,
                    tcp=None,
                    unix=path,
                    guard=PeerGuard(PeerPolicy(frozenset({ME, 0}))),
                )
            )
            assert bound.tcp is None
            assert bound.unix == path
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(sock_dir).st_mode) == 0o700
            transport = httpx.AsyncHTTPTransport(uds=str(path))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1"
            ) as client:
                response = await client.get("/health")
                assert response.json() == {"status": "ok"}
            nursery.cancel_scope.cancel()
    assert not path.exists(), "the socket file goes when the server stops"


async def test_unix_socket_peer_cred_refuses_a_user_not_in_the_policy(sock_dir) -> None:
    from ddmd.control.server import serve_control

    path = sock_dir / "control.sock"
    guard = PeerGuard(PeerPolicy(frozenset({FOREIGN})))  # SO_PEERCRED says: this user
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_control, APP, tcp=None, unix=path, guard=guard))
            client = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await client.connect(str(path))
            data = b""
            try:
                # The refusal is settled as the connection is accepted: it may be closed before
                # the request is even sent (a broken pipe), or before it is read (a reset).
                await client.send(REQUEST)
                while chunk := await client.recv(4096):
                    data += chunk
            except (BrokenPipeError, ConnectionResetError):
                pass
            client.close()
            assert data == b""
            nursery.cancel_scope.cancel()
    (line,) = [e for e in logs if e["event"] == "security.peer_refused"]
    assert line["uid"] == ME
    assert str(line["port"]).startswith("unix:")


async def test_stale_socket_is_replaced_and_a_live_one_refused(sock_dir) -> None:
    from ddmd.control.server import ControlSocketError, serve_control

    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "control.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nothing listens: a daemon that died
    assert path.exists()
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(serve_control, APP, tcp=None, unix=path))
            with pytest.raises(ControlSocketError, match="in use"):
                await serve_control(APP, tcp=None, unix=path)
            assert path.exists(), "the live server's socket must stay"
            nursery.cancel_scope.cancel()
    assert any(e["event"] == "control.socket_stale_removed" for e in logs)


async def test_a_file_that_is_not_a_socket_is_left_alone(sock_dir) -> None:
    from ddmd.control.server import ControlSocketError, serve_control

    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "control.sock"
    path.write_text("precious")
    with trio.fail_after(CAP), pytest.raises(ControlSocketError, match="not a socket"):
        await serve_control(APP, tcp=None, unix=path)
    assert path.read_text() == "precious"


async def test_a_directory_others_can_write_is_refused(sock_dir) -> None:
    from ddmd.control.server import ControlSocketError, serve_control

    sock_dir.mkdir(mode=0o700)
    os.chmod(sock_dir, 0o777)
    with trio.fail_after(CAP), pytest.raises(ControlSocketError, match="writable by others"):
        await serve_control(APP, tcp=None, unix=sock_dir / "control.sock")


# --------------------------------------------------------------------------------------------
# The scan: own VMs only


async def hold(conn: PeerConnection) -> None:
    await conn.wait_closed()


class CountingListener:
    """A TCP listener that counts the connections it gets (and closes them)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connections = 0

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        (listener,) = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        task_status.started()
        async with listener:
            while True:
                stream = await listener.accept()
                self.connections += 1
                await stream.aclose()


def listen_row(port: int, uid: int) -> str:
    return (
        f"   0: {_hex4('127.0.0.1')}:{port:04X} 00000000:0000 0A 00000000:00000000 "
        f"00:00000000 00000000 {uid:5d}        0 5151 1 0000000000000000 100 0 0 10 0"
    )


async def test_scan_does_not_touch_another_users_listener(tmp_path, tables) -> None:
    (port,) = free_port_range(1)
    tables.add(listen_row(port, FOREIGN))
    config = make_config([port], tmp_path)
    policy = PeerPolicy(frozenset({ME, 0}))
    scanner = PortScanner(config, set, policy=policy, proc_root=str(tables.root))
    peer = CountingListener(port)
    send, receive = trio.open_memory_channel[VmFound](1)
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            async with send, receive:
                for _ in range(3):
                    await scanner.scan_once(send)
            nursery.cancel_scope.cancel()
    assert peer.connections == 0, "another user's JVM must not even be connected to"
    assert scanner.probes == 0
    skipped = [e for e in logs if e["event"] == "scan.foreign_vm_skipped"]
    assert len(skipped) == 1  # once per port and uid, not once per round
    assert (skipped[0]["port"], skipped[0]["uid"]) == (port, FOREIGN)


async def test_scan_probes_a_listener_of_an_allowed_uid(tmp_path, tables) -> None:
    (port,) = free_port_range(1)
    tables.add(listen_row(port, FOREIGN))
    config = make_config([port], tmp_path)
    policy = PeerPolicy(frozenset({ME, 0, FOREIGN}))
    scanner = PortScanner(config, set, policy=policy, proc_root=str(tables.root))
    peer = CountingListener(port)
    send, receive = trio.open_memory_channel[VmFound](1)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            async with send, receive:
                await scanner.scan_once(send)
            nursery.cancel_scope.cancel()
    assert peer.connections == 1


async def test_scan_checks_the_vm_end_after_the_handshake(tmp_path, monkeypatch) -> None:
    (port,) = free_port_range(1)
    config = make_config([port], tmp_path)
    asked: list[int] = []

    async def foreign(self: Any, probed: Any, policy: Any) -> Verdict:
        asked.append(probed.peer[1])
        return Verdict(False, FOREIGN, "not allowed", "mallory")

    monkeypatch.setattr(scan_module.ScanLookups, "verdict", foreign)
    empty = tmp_path / "noproc"
    empty.mkdir()  # no tables for the look before connecting: the check after decides
    scanner = PortScanner(config, set, policy=PeerPolicy(frozenset({ME, 0})), proc_root=str(empty))
    send, receive = trio.open_memory_channel[VmFound](1)
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(RawPeer(port, hold).run)
            async with send, receive:
                await scanner.scan_once(send)
                await scanner.scan_once(send)
                with pytest.raises(trio.WouldBlock):
                    receive.receive_nowait()
            nursery.cancel_scope.cancel()
    assert asked == [port, port]
    skipped = [e for e in logs if e["event"] == "scan.foreign_vm_skipped"]
    assert len(skipped) == 1
    assert skipped[0]["user"] == "mallory"


@needs_proc
async def test_scan_with_real_tables_adopts_this_users_vm(tmp_path) -> None:
    (port,) = free_port_range(1)
    config = make_config([port], tmp_path)
    scanner = PortScanner(config, set, policy=PeerPolicy.from_config(config.security))
    send, receive = trio.open_memory_channel[VmFound](1)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(RawPeer(port, hold).run)
            async with send, receive:
                await scanner.scan_once(send)
                found = receive.receive_nowait()
            await found.stream.aclose()
            nursery.cancel_scope.cancel()
    assert found.vm_id == f"tcp:{port}"


# --------------------------------------------------------------------------------------------
# /metrics


def _families(collector: Any) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in collector.collect():
        for s in family.samples:
            found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return found


async def test_metrics_show_refusals_and_the_task_count(clients) -> None:
    from ddmd.control.metrics import DaemonCollector, RelayTotals
    from ddmd.registry import VmRegistry

    guard = PeerGuard(BrokenPolicy(frozenset({ME, 0})))
    collector = DaemonCollector(
        VmRegistry(), vms=list, retired=RelayTotals(), peers=guard, host="h"
    )
    listener, port = await open_guarded(guard, "current_port")
    with trio.fail_after(CAP):
        async with listener, trio.open_nursery() as nursery:
            nursery.start_soon(listener.accept)
            client = socket.socket()
            clients.append(client)
            await connect(client, port, b"JDWP-Handshake")
            assert await read_all(client) == b""
            before = _families(collector)["ddmd_trio_tasks"][(("host", "h"),)]
            for _ in range(10):
                nursery.start_soon(trio.sleep_forever)
            await trio.testing.wait_all_tasks_blocked()
            after = _families(collector)
            assert after["ddmd_trio_tasks"][(("host", "h"),)] == before + 10
            nursery.cancel_scope.cancel()
    refused = after["ddmd_peers_refused_total"]
    assert refused[(("host", "h"), ("port_kind", "current_port"))] == 1
    assert refused[(("host", "h"), ("port_kind", "vm_port"))] == 0
    assert refused[(("host", "h"), ("port_kind", "control"))] == 0
