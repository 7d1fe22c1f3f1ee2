"""A flood of connections to a guarded listener (issue 31, item 9): idle or refused, they never
hold up the next client nor crowd it out, no check reads the kernel's socket tables or takes a
worker thread where sock_diag answers, and a refused burst costs one log line with a count (and
one user-name lookup per line), not one per connection."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from ddmd import peers
from ddmd.host import sockdiag
from ddmd.host.localproc import PeerOwner
from ddmd.peers import GuardedListener, PeerGuard, PeerPolicy, Verdict
from tests.actors.needs import IN_CI
from tests.front.fakes import FakeHub, ForwardingFakeAdb, ask, running_front, wire

CAP = 30  # seconds: generous, no latency is asserted
FLOOD = 1000
ME = os.getuid()
FOREIGN = 4242  # a uid that is neither this user nor root


def _netlink_works() -> bool:
    return sockdiag.listeners("127.0.0.1", [1]) is not None


class CountingTables:
    """A socket-table reader that counts its calls (and answers as the real one)."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, ours: tuple[str, int], peer: tuple[str, int], proc_root: str) -> PeerOwner:
        from ddmd.host import localproc

        self.reads += 1
        return localproc.peer_owner(ours, peer, proc_root=proc_root)


async def _open_idle(port: int, count: int) -> list[trio.socket.SocketType]:
    opened = []
    for _ in range(count):
        sock = trio.socket.socket()
        await sock.connect(("127.0.0.1", port))
        opened.append(sock)
    return opened


async def test_the_front_answers_while_a_thousand_idle_connections_stay_open() -> None:
    tables = CountingTables()
    guard = PeerGuard(PeerPolicy(frozenset({ME, 0})), tables=tables)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            adb = ForwardingFakeAdb()
            await nursery.start(adb.run)
            async with running_front(adb.port, FakeHub(nursery), guard=guard) as front:
                idle = await _open_idle(front.port, FLOOD)
                try:
                    answer = await ask(front.port, wire("host:version"), patience=CAP)
                    assert answer.startswith(b"OKAY")
                finally:
                    for sock in idle:
                        sock.close()
            nursery.cancel_scope.cancel()
    if _netlink_works():
        assert tables.reads == 0, "sock_diag answers: no check may read /proc/net/tcp"


def slow_first_policy() -> tuple[PeerPolicy, threading.Event, threading.Event]:
    """Admits everyone; the first check hangs until ``gate`` is set (a slow lookup), and sets
    ``started`` when it begins."""
    gate, started = threading.Event(), threading.Event()

    class SlowFirst(PeerPolicy):
        def judge_now(self, facts: Any, ask: Any = None) -> Verdict | None:
            return None  # no quick answer: every check takes the (slow) lookup below

        def judge(self, facts: Any, proc_root: str, tables: Any = None) -> Verdict:
            if not started.is_set():
                started.set()
                gate.wait(CAP)
            return Verdict(True, ME, "allowed uid")

    return SlowFirst(frozenset({ME})), gate, started


async def _serve(listener: GuardedListener, delivered: trio.MemorySendChannel[Any]) -> None:
    await listener.serve(delivered.send_nowait)


async def test_a_slow_check_never_delays_the_next_connection() -> None:
    policy, gate, started = slow_first_policy()
    guard = PeerGuard(policy, lookup_timeout=CAP)
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    send, receive = trio.open_memory_channel[Any](10)
    try:
        with trio.fail_after(CAP):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_serve, GuardedListener(inner, guard, "vm_port"), send)
                first = await _open_idle(port, 1)
                await trio.to_thread.run_sync(started.wait, CAP)
                second = await _open_idle(port, 1)
                admitted = await receive.receive()  # the second, while the first hangs
                assert admitted.socket.getpeername() == second[0].getsockname()
                gate.set()
                late = await receive.receive()
                assert late.socket.getpeername() == first[0].getsockname()
                nursery.cancel_scope.cancel()
    finally:
        gate.set()


class GatedTables:
    """Fake socket tables (the path taken where netlink cannot answer): the peers whose port is
    in ``mine`` are this user's, answered at once; every other peer is another user's, and its
    row is read only when ``gate`` opens (a slow /proc), so its check stays pending. ``full``
    is set once ``waiting`` such checks wait."""

    def __init__(self, waiting: int) -> None:
        self.gate, self.full = threading.Event(), threading.Event()
        self.mine: set[int] = set()
        self._waiting = waiting
        self._lock = threading.Lock()

    def __call__(self, ours: tuple[str, int], peer: tuple[str, int], proc_root: str) -> PeerOwner:
        if peer[1] in self.mine:
            return PeerOwner(ME, "found")
        with self._lock:
            self._waiting -= 1
            if self._waiting == 0:
                self.full.set()
        self.gate.wait(CAP)
        return PeerOwner(FOREIGN, "found")


async def _welcome(receive: trio.MemoryReceiveChannel[Any]) -> None:
    async for stream in receive:
        await stream.send_all(b"welcome")


async def test_a_flood_holding_every_pending_check_never_crowds_out_the_next_client(
    tmp_path,
) -> None:
    # Issue 31, item 9: another user's connections fill every pending check; the next client,
    # this user's, must be checked and admitted once there is room, never closed unchecked.
    pending = peers.LOOKUP_THREADS  # every lookup thread busy, every pending check taken
    tables = GatedTables(pending)
    guard = PeerGuard(
        PeerPolicy(frozenset({ME})),
        proc_root=str(tmp_path),  # not /proc: the (gated) tables answer, not sock_diag
        tables=tables,
        lookup_timeout=CAP,
        max_pending=pending,
    )
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    listener = GuardedListener(inner, guard, "front")
    send, receive = trio.open_memory_channel[Any](10)
    mine = trio.socket.socket()
    await mine.bind(("127.0.0.1", 0))
    tables.mine.add(mine.getsockname()[1])
    flood: list[trio.socket.SocketType] = []
    try:
        with trio.fail_after(CAP):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_serve, listener, send)
                nursery.start_soon(_welcome, receive)
                flood = await _open_idle(port, pending)
                await trio.to_thread.run_sync(tables.full.wait, CAP)
                assert listener.pending == pending
                await mine.connect(("127.0.0.1", port))
                tables.gate.set()
                assert await mine.recv(7) == b"welcome", "the client was closed unchecked"
                for sock in flood:
                    assert await sock.recv(7) == b""  # refused: closed, nothing sent
                nursery.cancel_scope.cancel()
    finally:
        tables.gate.set()
        mine.close()
        for sock in flood:
            sock.close()
    assert guard.refused_counts()["front"] == pending


class CountingPolicy(PeerPolicy):
    """The rule as built, counting the checks that went to a worker thread."""

    threads = 0

    def judge(self, facts: Any, proc_root: str, tables: Any = None) -> Verdict:
        CountingPolicy.threads += 1
        return super().judge(facts, proc_root, tables)


@pytest.mark.skipif(not _netlink_works() and not IN_CI, reason="needs Linux netlink sock_diag")
async def test_a_refused_flood_is_judged_in_line_without_a_thread(monkeypatch) -> None:
    # Where sock_diag answers, a refused peer is settled as it is accepted: no worker thread,
    # nothing pending, so no flood can fill the pending checks; the one line's user name is
    # the only lookup.
    monkeypatch.setattr(CountingPolicy, "threads", 0)
    names: list[int] = []

    def counting_name(uid: int | None) -> str | None:
        names.append(uid or 0)
        return "someone"

    monkeypatch.setattr(peers, "user_name", counting_name)
    guard = PeerGuard(CountingPolicy(frozenset({FOREIGN})), max_pending=1)  # not this user
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    listener = GuardedListener(inner, guard, "front")
    send, _receive = trio.open_memory_channel[Any](FLOOD)
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, listener, send)
            flood = await _open_idle(port, FLOOD // 4)
            try:
                for sock in flood:
                    assert await sock.recv(7) == b""
                    assert listener.pending == 0
            finally:
                for sock in flood:
                    sock.close()
            nursery.cancel_scope.cancel()
    assert CountingPolicy.threads == 0
    assert guard.refused_counts()["front"] == FLOOD // 4
    (line,) = [e for e in logs if e["event"] == "security.peer_refused"]
    assert (line["uid"], line["user"]) == (ME, "someone")
    assert names == [ME]


def test_a_refused_burst_is_one_line_with_its_count(monkeypatch) -> None:
    names: list[int | None] = []

    def counting_name(uid: int | None) -> str | None:
        names.append(uid)
        return "stranger"

    monkeypatch.setattr(peers, "user_name", counting_name)
    guard = PeerGuard(PeerPolicy(frozenset({ME})))
    refused = Verdict(False, 4242, "its user is not allowed")

    async def refuse() -> None:
        line = guard.refuse(refused, 8700, "current_port")
        if line is not None:
            await guard.report(line)

    clock = trio.testing.MockClock()

    async def burst() -> None:
        for _ in range(FLOOD):
            await refuse()
        clock.jump(11)
        await refuse()

    with capture_logs() as logs:
        trio.run(burst, clock=clock)
    lines = [e for e in logs if e["event"] == "security.peer_refused"]
    assert [(line["count"], line["user"]) for line in lines] == [
        (1, "stranger"),
        (FLOOD, "stranger"),
    ]
    assert guard.refused_counts()["current_port"] == FLOOD + 1
    assert names == [4242, 4242], "the user's name is looked up for the lines written only"


def test_a_peer_that_closed_before_its_check_is_refused_but_not_a_warning() -> None:
    # A browser opens spare connections to the web page and closes them unused: such a peer is
    # gone before ddmd can find its owner. It is refused (counted), but it is not news.
    guard = PeerGuard(PeerPolicy(frozenset({ME})))
    gone = Verdict(False, None, "it closed its end before its owner could be checked", gone=True)
    stranger = Verdict(False, 4242, "its user is not allowed")

    async def both() -> None:
        assert guard.refuse(gone, 8710, "control") is None
        line = guard.refuse(stranger, 8710, "control")
        assert line is not None
        await guard.report(line)

    with capture_logs() as logs:
        trio.run(both, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("security.peer_gone", "debug"),
        ("security.peer_refused", "warning"),
    ]
    assert guard.refused_counts()["control"] == 2


async def test_a_connection_closed_at_once_logs_no_refusal(nursery) -> None:
    # The real path: a client (another uid, so it would be refused) that connects and closes
    # at once reads as gone when the check comes; a peer of an allowed uid that closes is too.
    guard = PeerGuard(PeerPolicy(frozenset({ME + 1})))
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    with capture_logs() as logs, trio.fail_after(CAP):
        client = await trio.open_tcp_stream("127.0.0.1", port)
        stream = await listener.accept()
        await client.aclose()
        await trio.sleep(0.05)
        assert not await guard.admit(stream, "control")
        await stream.aclose()
    await listener.aclose()
    events = [e["event"] for e in logs]
    assert "security.peer_refused" not in events
    assert "security.peer_gone" in events
