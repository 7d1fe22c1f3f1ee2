"""snapshots and lookups: one reading of /proc serves many of the scan's questions.

A whole reading of `SocketTable` must answer exactly as `localproc`'s one-question functions,
which read only the rows of the port asked about (the golden rows of test_localproc and
test_peer_owner); `FdIndex` must not believe a stale
walk; `Fresh` must share readings without ever handing out one that began before the caller's
connection existed. The last test scans many real listeners at once and counts the readings.
"""

from __future__ import annotations

import os
import threading
from itertools import product
from pathlib import Path

import pytest
import trio
import trio.testing

from ddmd.discovery import VmFound
from ddmd.discovery.lookups import Fresh
from ddmd.discovery.scan import PortScanner
from ddmd.host import localproc
from ddmd.host.fdindex import FdIndex
from ddmd.host.localproc import PeerOwner, SocketOwner, SocketTable
from ddmd.peers import PeerPolicy
from tests.actors.needs import IN_CI
from tests.actors.rawpeers import PeerConnection, RawPeer, free_port_range, make_config
from tests.host.test_localproc import FakeProc, make_proc
from tests.host.test_peer_owner import LITTLE, tables

CAP = 20

ADDRESSES = [
    ("127.0.0.1", 44734),
    ("127.0.0.1", 18123),
    ("127.0.0.1", 44736),
    ("127.0.0.1", 44738),
    ("127.0.0.1", 44726),
    ("127.0.0.1", 44735),
    ("127.0.0.1", 18125),
    ("127.0.0.1", 18126),
    ("127.0.0.1", 44888),
    ("::ffff:127.0.0.1", 18125),
    ("::ffff:127.0.0.1", 44888),
    ("::1", 18124),
    ("::1", 18125),
    ("::1", 45056),
    ("127.0.0.2", 44734),
    ("0.0.0.0", 0),
    ("localhost", 44734),
]


def test_socket_table_answers_as_the_one_question_functions(tmp_path: Path) -> None:
    root = tables(tmp_path)
    table = SocketTable.read(root, LITTLE)
    assert table.readable
    for ours, peer in product(ADDRESSES, repeat=2):
        assert table.peer_owner(ours, peer) == localproc.peer_owner(
            ours, peer, proc_root=root, byteorder=LITTLE
        ), (ours, peer)
        assert table.connected(ours, peer) == localproc.connected_socket(
            ours, peer, proc_root=root, byteorder=LITTLE
        ), (ours, peer)
    for host, port in product(
        ["127.0.0.1", "::1", "[::1]", "10.0.0.1", "localhost"], range(18120, 18130)
    ):
        assert table.listening(host, port) == localproc.listening_socket(
            host, port, proc_root=root, byteorder=LITTLE
        ), (host, port)


def test_socket_table_golden_answers(tmp_path: Path) -> None:
    table = SocketTable.read(tables(tmp_path), LITTLE)
    # The JVM's accepted end of ddmd's probe, seen from the probe; the probe's own end.
    assert table.peer_owner(("127.0.0.1", 44734), ("127.0.0.1", 18123)) == PeerOwner(1000, "found")
    assert table.connected(("127.0.0.1", 18123), ("127.0.0.1", 44734)) == SocketOwner(14295, 1000)
    # TIME_WAIT and a socket its process closed: "closed", never root's.
    assert table.peer_owner(("127.0.0.1", 18123), ("127.0.0.1", 44726)) == PeerOwner(None, "closed")
    assert table.peer_owner(("127.0.0.1", 18123), ("127.0.0.1", 44738)) == PeerOwner(None, "closed")
    # An exact listener, and "::" serving IPv4.
    assert table.listening("127.0.0.1", 18123) == SocketOwner(14910, 1000)
    assert table.listening("127.0.0.1", 18125) == SocketOwner(18242, 0)


def test_socket_table_without_tables(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    table = SocketTable.read(str(empty))
    assert not table.readable
    assert table.peer_owner(("127.0.0.1", 1), ("127.0.0.1", 2)) == PeerOwner(None, "unreadable")
    assert table.connected(("127.0.0.1", 1), ("127.0.0.1", 2)) is None
    assert table.listening("127.0.0.1", 1) is None


def test_a_live_socket_wins_over_a_time_wait_row_with_the_same_ends(tmp_path: Path) -> None:
    live = (
        "  50: 0100007F:AEB6 0100007F:46CB 01 00000000:00000000 00:00000000 00000000  1000"
        "        0 777 1 0000000000000000 20 4 30 10 -1"
    )
    dead = (
        "  33: 0100007F:AEB6 0100007F:46CB 06 00000000:00000000 03:0000156D 00000000     0"
        "        0 0 3 000000005fd7c462"
    )
    for rows in ([live, dead], [dead, live]):
        root = make_proc(tmp_path / str(len(list(tmp_path.iterdir()))), tcp=rows)
        table = SocketTable.read(root, LITTLE)
        ours, peer = ("127.0.0.1", 18123), ("127.0.0.1", 44726)
        assert table.peer_owner(ours, peer) == PeerOwner(1000, "found")


def test_fd_index_finds_and_rechecks(tmp_path: Path) -> None:
    root = make_proc(
        tmp_path / "proc",
        procs={
            1: FakeProc(fds={"0": "/dev/null", "3": "socket:[777]"}),
            42: FakeProc(fds={"1": "pipe:[14295]", "7": "socket:[14295]", "8": "socket:[x]"}),
            43: FakeProc(has_fd_dir=False),  # exited while walked
        },
    )
    index = FdIndex.read(root)
    assert len(index) == 2
    assert index.holder(14295) == 42
    assert index.holder(777) == 1
    assert index.holder(1429) is None
    # The fd was closed and reused for another socket since the walk: not believed.
    link = Path(root) / "42" / "fd" / "7"
    link.unlink()
    link.symlink_to("socket:[999]")
    assert index.holder(14295) is None
    link.unlink()
    assert index.holder(14295) is None


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd") and not IN_CI, reason="needs Linux /proc")
def test_fd_index_of_the_real_proc() -> None:
    import socket

    with socket.socket() as sock:
        inode = os.fstat(sock.fileno()).st_ino
        assert FdIndex.read().holder(inode) == os.getpid()


# --------------------------------------------------------------------------------------------
# Fresh: shared readings


class Reader:
    """A reading that blocks until released, counting how many began."""

    def __init__(self) -> None:
        self.began = 0
        self.gates: list[threading.Event] = []
        self.lock = threading.Lock()
        self.began_nth = [threading.Event() for _ in range(8)]  # [n-1]: the n-th one began

    def __call__(self) -> int:
        gate = threading.Event()
        with self.lock:
            self.began += 1
            number = self.began
            self.gates.append(gate)
            self.began_nth[number - 1].set()
        gate.wait(CAP)
        return number

    def release_all(self) -> None:
        with self.lock:
            for gate in self.gates:
                gate.set()


async def test_waiting_callers_share_one_reading() -> None:
    reader = Reader()
    fresh = Fresh(reader, trio.CapacityLimiter(2), timeout=CAP)
    got: list[int | None] = []

    mark = fresh.mark()  # the callers' connections all exist from here on

    async def ask() -> None:
        got.append(await fresh.get(after=mark))

    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(ask)
            # The 50 ran to their first wait before the thread could start the reading.
            await trio.to_thread.run_sync(reader.began_nth[0].wait, CAP)
            reader.release_all()
    assert got == [1] * 50
    assert (reader.began, fresh.readings) == (1, 1)


async def test_a_reading_begun_before_the_mark_is_not_used() -> None:
    reader = Reader()
    fresh = Fresh(reader, trio.CapacityLimiter(2), timeout=CAP)
    results: dict[str, int | None] = {}

    async def ask(name: str, after: int | None) -> None:
        results[name] = await fresh.get(after=after)

    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "early", None)
            await trio.to_thread.run_sync(reader.began_nth[0].wait, CAP)
            await trio.testing.wait_all_tasks_blocked()
            assert reader.began == 1
            # A connection made now is not in reading 1, which began before it.
            mark = fresh.mark()
            nursery.start_soon(ask, "late", mark)
            await trio.testing.wait_all_tasks_blocked()
            reader.release_all()  # reading 1 ends; "late" must start reading 2
            await trio.to_thread.run_sync(reader.began_nth[1].wait, CAP)
            reader.release_all()
    assert results == {"early": 1, "late": 2}
    # Marked at 2 readings begun: the next call with that mark reads again.
    assert fresh.mark() == 2
    assert fresh.latest() == 2


async def test_a_stuck_reading_times_out_and_the_next_caller_reads_again() -> None:
    reader = Reader()
    fresh = Fresh(reader, trio.CapacityLimiter(2), timeout=0.2)
    with trio.fail_after(CAP):
        assert await fresh.get() is None  # the reading hangs past the timeout
        assert reader.began == 1
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                assert await fresh.get() == 2

            nursery.start_soon(ask)
            await trio.to_thread.run_sync(reader.began_nth[1].wait, CAP)
            reader.release_all()
    reader.release_all()


async def test_a_failed_reading_lets_the_waiters_read_again() -> None:
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("proc went away")
        return calls

    fresh = Fresh(flaky, trio.CapacityLimiter(2), timeout=CAP)
    with trio.fail_after(CAP):
        assert await fresh.get() is None  # a bug in a reading costs its answer, nothing more
        assert (fresh.failures, fresh.latest()) == (1, None)
        assert await fresh.get() == 2
        assert fresh.latest() == 2


# --------------------------------------------------------------------------------------------
# The scan: many VMs, few readings


async def hold(conn: PeerConnection) -> None:
    await conn.wait_closed()


@pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp") and not IN_CI, reason="needs Linux /proc/net/tcp"
)
async def test_a_scan_of_many_vms_shares_its_readings(tmp_path: Path) -> None:
    count = 40
    ports = free_port_range(count)
    config = make_config(ports, tmp_path)
    scanner = PortScanner(config, set, policy=PeerPolicy.from_config(config.security))
    send, receive = trio.open_memory_channel[VmFound](count)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            for port in ports:
                await nursery.start(RawPeer(port, hold).run)
            async with send, receive:
                await scanner.scan_once(send)
                found = [receive.receive_nowait() for _ in range(count)]
            for vm in found:
                await vm.stream.aclose()
            nursery.cancel_scope.cancel()
    assert sorted(vm.key for vm in found) == sorted(ports)
    # Every VM was checked and named (the peers run in this very process)...
    assert all(vm.process is not None and vm.process.pid == os.getpid() for vm in found)
    # ... by a few shared readings, not two table readings and a walk per VM.
    lookups = scanner.lookups
    assert lookups.tables.readings < count / 2
    assert lookups.fds.readings < count / 2
