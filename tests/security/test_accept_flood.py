"""A flood of connections to a guarded listener (issue 31, item 9.1): idle or refused, they never
hold up the next client, no check reads the kernel's socket tables where sock_diag answers, and
a refused burst costs one log line with a count, not one per connection."""

from __future__ import annotations

import os
import threading
from typing import Any

import trio
import trio.testing
from structlog.testing import capture_logs

from ddmd.host import sockdiag
from ddmd.host.localproc import PeerOwner
from ddmd.peers import GuardedListener, PeerGuard, PeerPolicy, Verdict
from tests.front.fakes import FakeHub, ForwardingFakeAdb, ask, running_front, wire

CAP = 30  # seconds: generous, no latency is asserted
FLOOD = 1000
ME = os.getuid()


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
        def judge_now(self, facts: Any) -> Verdict | None:
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


async def test_past_the_bound_the_newest_connections_are_closed_unchecked() -> None:
    policy, gate, started = slow_first_policy()
    guard = PeerGuard(policy, lookup_timeout=CAP, max_pending=1)
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    send, receive = trio.open_memory_channel[Any](10)
    try:
        with capture_logs() as logs, trio.fail_after(CAP):
            async with trio.open_nursery() as nursery:
                listener = GuardedListener(inner, guard, "vm_port")
                nursery.start_soon(_serve, listener, send)
                await _open_idle(port, 1)
                await trio.to_thread.run_sync(started.wait, CAP)
                (extra,) = await _open_idle(port, 1)
                assert await extra.recv(10) == b""  # closed before a byte was read
                assert guard.refused_counts()["vm_port"] == 1
                gate.set()
                await receive.receive()
                nursery.cancel_scope.cancel()
    finally:
        gate.set()
    (line,) = [e for e in logs if e["event"] == "security.peer_refused"]
    assert "waiting for their check" in line["reason"]


def test_a_refused_burst_is_one_line_with_its_count() -> None:
    guard = PeerGuard(PeerPolicy(frozenset({ME})))
    refused = Verdict(False, 4242, "its user is not allowed")

    async def burst() -> None:
        for _ in range(FLOOD):
            guard.refuse(refused, 8700, "current_port")
        await trio.sleep(11)
        guard.refuse(refused, 8700, "current_port")

    with capture_logs() as logs:
        trio.run(burst, clock=trio.testing.MockClock(autojump_threshold=0))
    lines = [e for e in logs if e["event"] == "security.peer_refused"]
    assert [line["count"] for line in lines] == [1, FLOOD]
    assert guard.refused_counts()["current_port"] == FLOOD + 1


def test_a_peer_that_closed_before_its_check_is_refused_but_not_a_warning() -> None:
    # A browser opens spare connections to the web page and closes them unused: such a peer is
    # gone before ddmd can find its owner. It is refused (counted), but it is not news.
    guard = PeerGuard(PeerPolicy(frozenset({ME})))
    gone = Verdict(False, None, "it closed its end before its owner could be checked", gone=True)
    stranger = Verdict(False, 4242, "its user is not allowed")

    async def both() -> None:
        guard.refuse(gone, 8710, "control")
        guard.refuse(stranger, 8710, "control")

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
