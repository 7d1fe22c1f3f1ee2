"""The relay threads' parts (``ddmd.drive.relaythreads``): the step lock shared with trio, the
reader a thread blocks in, and how a thread's host task ends it."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from ddmd.drive.debugger import DebuggerConnection, Outbox
from ddmd.drive.relay import Relay
from ddmd.drive.relaythreads import (
    Looking,
    Poller,
    plain_socket,
    read_socket,
    run_in_thread,
    step_lock,
)
from ddmd.drive.threadlane import ThreadLane
from ddmd.drive.writes import PendingWrites
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.session.commands import Changed, Command, Log, SendToDebugger
from ddmd.session.inputs import ConsumerBytes

CAP = 10


async def test_the_step_lock_is_held_for_every_task_step_and_free_while_trio_waits() -> None:
    with trio.fail_after(CAP):
        lock = step_lock()  # installed in the middle of this step: held at once
        assert lock.locked()
        assert step_lock() is lock  # one per run
        await trio.lowlevel.checkpoint()
        assert lock.locked()  # the next step took it again: the instrument is still there
        seen: list[bool] = []

        def take() -> None:  # a thread gets it while trio waits for the thread
            with lock:
                seen.append(True)

        await trio.to_thread.run_sync(take)
        assert seen == [True]
        assert lock.locked()


async def test_a_thread_holding_the_lock_holds_trio_off_until_it_lets_go() -> None:
    with trio.fail_after(CAP):
        lock = step_lock()
        order: list[str] = []
        inside = threading.Event()

        def hold() -> None:
            with lock:
                inside.set()
                time.sleep(0.1)  # trio has every chance to run a step now, and must not
                order.append("thread done")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, hold)
            await trio.to_thread.run_sync(inside.wait, CAP)
            order.append("trio step")  # this step began after the thread let go
        assert order == ["thread done", "trio step"]


def socket_pair() -> tuple[trio.socket.SocketType, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    return trio.socket.from_stdlib_socket(ours), theirs


async def test_the_poller_says_which_sockets_are_readable_and_read_socket_reads_them() -> None:
    with trio.fail_after(CAP):
        (one, peer_one), (two, peer_two) = socket_pair(), socket_pair()
        poller = Poller()
        try:
            poller.add(one.fileno())
            poller.add(two.fileno())
            assert read_socket(one, 100) is None  # nothing yet
            peer_two.sendall(b"hello")
            assert await trio.to_thread.run_sync(poller.wait) == [two.fileno()]
            assert read_socket(two, 100) == b"hello"
            peer_one.close()  # the end of a stream is "readable" too
            assert await trio.to_thread.run_sync(poller.wait) == [one.fileno()]
            assert read_socket(one, 100) == b""
            poller.discard(one.fileno())
            poller.discard(one.fileno())  # twice: no error
        finally:
            poller.close()
            for sock in (one, two):
                sock.close()
            peer_two.close()


async def test_a_poller_blocked_in_the_kernel_is_woken_at_once_and_for_good() -> None:
    with trio.fail_after(CAP):
        sock, peer = socket_pair()
        poller = Poller()
        poller.add(sock.fileno())
        got: list[list[int] | None] = []
        try:
            async with trio.open_nursery() as nursery:

                async def wait() -> None:
                    got.append(await trio.to_thread.run_sync(poller.wait))

                nursery.start_soon(wait)
                await trio.sleep(0.05)  # let it block
                poller.wake()
            assert got == [None]
            assert poller.woken
            peer.sendall(b"later")
            assert poller.wait() is None  # woken for good
        finally:
            poller.close()
            sock.close()
            peer.close()


def test_looking_for_replies_goes_by_how_soon_they_came() -> None:
    us = 1000
    looking = Looking(60 * us)
    assert looking.on
    assert looking.budget == 60 * us  # a thread starts out looking
    # A local VM: most replies come while the thread looks; an odd late one does not stop it.
    for waited in (20, 15, 90, 18, 25, 70, 22, 20):
        looking.took(waited * us, (waited + 20) * us)
        assert looking.budget == 60 * us, waited
    # Two late ones in a row (the VM got slow): the thread sleeps.
    looking.took(80 * us, 100 * us)
    assert looking.budget == 60 * us
    looking.took(95 * us, 115 * us)
    assert looking.budget == 0
    # Replies that take 90-150 us from the command's read. Some find the thread late, there at
    # once when it waits: those say nothing, the time since the read counts.
    for waited, since_read in ((70, 90), (3, 120), (90, 110), (2, 95), (30, 130), (1, 140)):
        looking.took(waited * us, since_read * us)
        assert looking.budget == 0, (waited, since_read)
    # Replies within 75 us of the read (five quarters of the budget) while it slept: it looks
    # again after two.
    looking.took(30 * us, 50 * us)
    assert looking.budget == 0
    looking.took(40 * us, 75 * us)
    assert looking.budget == 60 * us
    # Configured off: never.
    off = Looking(0)
    assert not off.on
    for ns in (0, 1, 0, 0):
        off.took(ns, ns)
        assert off.budget == 0


async def test_a_wait_that_looks_returns_what_comes_meanwhile_and_then_sleeps() -> None:
    with trio.fail_after(CAP):
        sock, peer = socket_pair()
        poller = Poller()
        poller.add(sock.fileno())
        try:
            peer.send(b"x")
            looked = await trio.to_thread.run_sync(poller.wait, 50_000_000)
            assert looked == [sock.fileno()]  # there while it looked
            assert read_socket(sock, 10) == b"x"

            def later() -> None:
                time.sleep(0.05)  # well after a 1 ms look: found by the sleeping wait
                peer.send(b"y")

            helper = threading.Thread(target=later)
            helper.start()
            assert await trio.to_thread.run_sync(poller.wait, 1_000_000) == [sock.fileno()]
            helper.join()
            assert read_socket(sock, 10) == b"y"
            poller.wake()
            woken = await trio.to_thread.run_sync(poller.wait, 1_000_000)
            assert woken is None  # woken: no looking, no waiting
        finally:
            poller.close()
            sock.close()
            peer.close()


async def test_plain_socket_is_the_standard_library_socket_under_trio_s() -> None:
    sock, peer = socket_pair()
    plain = plain_socket(sock)
    try:
        assert type(plain) is socket.socket  # its fileno is a C call: no trio frame
        assert plain.fileno() == sock.fileno() >= 0
        peer.sendall(b"hi")
        assert read_socket(plain, 10) == b"hi"
        sock.close()  # trio closes it: the thread sees a closed socket, never a stale number
        assert plain.fileno() == -1
        with pytest.raises(OSError):
            read_socket(plain, 10)
    finally:
        peer.close()
    # Anything else (a trio that no longer keeps ``_sock``) is used as it is.
    other = SimpleNamespace(fileno=lambda: 5)
    assert plain_socket(other) is other  # type: ignore[arg-type]


async def test_a_closed_socket_is_an_error_not_another_sockets_bytes() -> None:
    sock, peer = socket_pair()
    number = sock.fileno()
    sock.close()
    peer.close()
    # A new socket now likely has the closed one's number, with bytes waiting.
    other, other_peer = socket.socketpair()
    try:
        other_peer.sendall(b"not yours")
        with pytest.raises(OSError):
            read_socket(sock, 100)
        assert other.fileno() != number or other.recv(100) == b"not yours"
    finally:
        other.close()
        other_peer.close()


async def test_cancelling_the_host_task_wakes_the_thread_and_ends_it() -> None:
    with trio.fail_after(CAP):
        sock, peer = socket_pair()
        poller = Poller()
        poller.add(sock.fileno())
        ended = threading.Event()

        def body() -> str:
            try:
                while poller.wait() is not None:
                    pass
                return "woken"
            finally:
                ended.set()

        try:
            with trio.move_on_after(0.1) as scope:
                await run_in_thread(poller, body)
            assert scope.cancelled_caught
            assert ended.is_set()  # the thread was done before the call gave up
        finally:
            sock.close()
            peer.close()


async def test_the_thread_runs_trio_code_in_its_host_task() -> None:
    with trio.fail_after(CAP):
        sock, peer = socket_pair()
        poller = Poller()
        poller.add(sock.fileno())
        host = trio.lowlevel.current_task()
        ran_in: list[object] = []

        async def in_trio(data: bytes) -> bytes:
            ran_in.append(trio.lowlevel.current_task())
            return data.upper()

        def body() -> bytes:
            assert poller.wait() == [sock.fileno()]
            data = read_socket(sock, 100)
            assert data is not None
            return trio.from_thread.run(in_trio, data)

        try:
            peer.sendall(b"abc")
            assert await run_in_thread(poller, body) == b"ABC"
            assert ran_in == [host]
        finally:
            sock.close()
            peer.close()


class _Logged:
    """A logger that keeps what ``Relay.log`` writes: (event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def log(self, level: int, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def relay_of(session: Any, writes: PendingWrites, logger: _Logged | None = None) -> Relay:
    """The driver's ``Relay`` around a stand-in session; the event loop's part fails."""

    def in_loop(command: Command) -> None:
        raise AssertionError(f"only the event loop carries out {command!r}")

    return Relay(
        session,
        writes,
        logger=logger or _Logged(),  # type: ignore[arg-type]
        in_loop=in_loop,
        on_full=in_loop,
    )


class _StandIn:
    """A session's relay lane that takes nothing (its decisions and commits)."""

    def relay_vm(self, data: bytes) -> Any:
        return None

    def relayed_vm(self, lane: Any) -> None:
        raise AssertionError("nothing to commit")

    def relay_debugger(self, number: int, data: bytes) -> Any:
        return None

    def relayed_debugger(self, lane: Any) -> None:
        raise AssertionError("nothing to commit")

    def handle(self, item: object, now: float) -> list[Command]:
        return []


class _Session(_StandIn):
    """A session whose relay lane takes the commands that start with b"F" (fast), as the
    router decides them (the packet to write, then what the commit needs); the others make it
    ask for something only the event loop does (``Changed``)."""

    def __init__(self) -> None:
        self.committed: list[bytes] = []

    def relay_debugger(self, number: int, data: bytes) -> Any:
        return (data, number) if data.startswith(b"F") else None

    def relayed_debugger(self, lane: Any) -> None:
        self.committed.append(lane[0])

    def handle(self, item: ConsumerBytes, now: float) -> list[Command]:
        return [Changed(renamed=item.data == b"S1")]


class _VmOutbox:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send_now(self, data: bytes) -> bool:
        self.log.append(f"wrote {data.decode()}")
        return True


async def test_a_read_handed_to_trio_is_done_before_the_thread_reads_on() -> None:
    """The order of a debugger's packets: a read whose commands need the event loop is done
    there (however long that takes) before a fast one read after it is written."""
    with trio.fail_after(CAP):
        vm_sock, vm_peer = socket_pair()
        sock, peer = socket_pair()
        log: list[str] = []
        vm = _VmOutbox(log)
        stream = trio.SocketStream(sock)
        debugger = DebuggerConnection(1, stream, "peer", "current", None, Outbox(stream, 1, 1))
        writes = PendingWrites({1: debugger}, lambda: vm)  # type: ignore[arg-type,return-value]
        session = _Session()
        relay = relay_of(session, writes)
        lane = ThreadLane(relay, writes.debuggers)

        async def vm_rest(data: bytes | None, later: list[Command]) -> str | None:
            return "the VM left" if data == b"" else None

        async def rest(d: DebuggerConnection, data: bytes | None, later: list[Command]) -> bool:
            if data == b"":
                return True
            await trio.sleep(0.05)  # the event loop's part takes its time
            log.append(f"handled {later}")
            return False

        async def debugger_side() -> None:
            await wait_running(lane)
            assert await lane.serve_debugger(debugger, sock) is True
            vm_peer.close()  # then the VM leaves too: the thread ends

        async def feed() -> None:
            await wait_running(lane)
            await trio.sleep(0.01)
            peer.sendall(b"S1")
            await trio.sleep(0.01)  # the thread has read S1 by now: F2 is another read
            peer.sendall(b"F2")
            await trio.sleep(0.01)
            peer.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(debugger_side)
            nursery.start_soon(feed)
            assert await lane.read_vm(vm_sock, vm_rest, rest) == "the VM left"
        assert log == ["handled [Changed(renamed=True)]", "wrote F2"]
        assert session.committed == [b"F2"]  # committed after its write
        assert (relay.counts.relayed, relay.counts.handed) == (1, 1)  # F2; S1
        assert not lane.running
        sock.close()
        vm_sock.close()


async def wait_running(lane: ThreadLane) -> None:
    while not lane.running:  # noqa: ASYNC110 - the lane has no event to wait on
        await trio.sleep(0.001)


class _Outbox:
    """An outbox that takes ``room`` packets, then refuses (its queue is full)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.queue: list[bytes] = []

    def put(self, data: bytes) -> bool:
        if len(self.queue) >= self.room:
            return False
        self.queue.append(data)
        return True

    def write_now(self) -> bool:
        return True


def test_the_thread_does_what_needs_no_event_loop_and_hands_on_the_rest_in_order() -> None:
    outbox = _Outbox(room=2)
    debugger = SimpleNamespace(gone=False, outbox=outbox)
    writes = PendingWrites({7: debugger}, lambda: None)  # type: ignore[dict-item]
    logged = _Logged()
    relay = relay_of(_StandIn(), writes, logged)
    line = Log("debugger.event_dropped", "debug")
    commands: list[Command] = [
        SendToDebugger(7, b"one"),
        line,
        SendToDebugger(99, b"to a debugger that is gone: dropped"),
        Changed(),
        SendToDebugger(7, b"two"),
    ]
    # The one executor, in the relay thread (``loop=False``).
    assert relay.carry_out(commands, loop=False) == commands[3:]  # Changed needs the loop
    assert outbox.queue == [b"one"]
    assert logged.lines == [(line.event, line.fields)]
    assert writes.dirty == [outbox]
    # A full queue is the event loop's rule (the slow consumer): handed on from there.
    outbox.room = 1
    full: list[Command] = [SendToDebugger(7, b"three"), line]
    assert relay.carry_out(full, loop=False) == full
    assert outbox.queue == [b"one"]


class _BrokenVmSession(_StandIn):
    def handle(self, item: object, now: float) -> list[Command]:
        raise RemoteProtocolError("a packet of 3 bytes")


async def test_a_vm_that_breaks_the_protocol_ends_the_thread_with_the_reason_logged() -> None:
    with trio.fail_after(CAP):
        vm_sock, vm_peer = socket_pair()
        stream = trio.SocketStream(socket_pair()[0])
        debugger = DebuggerConnection(1, stream, "peer", "current", None, Outbox(stream, 1, 1))
        logged = _Logged()
        writes = PendingWrites({1: debugger}, lambda: None)
        lane = ThreadLane(relay_of(_BrokenVmSession(), writes, logged), writes.debuggers)

        async def never(*_: object) -> None:
            raise AssertionError("nothing is handed to the event loop")

        vm_peer.sendall(b"\x00\x00\x00\x03xxxxxxx")
        reason = await lane.read_vm(vm_sock, never, never)  # type: ignore[arg-type]
        assert reason == "protocol error: a packet of 3 bytes"
        assert logged.lines == [("vm.protocol_error", {"error": "a packet of 3 bytes"})]
        assert not lane.running
        vm_sock.close()
        vm_peer.close()


class _LaneSession(_StandIn):
    """A session whose relay lane takes every packet, as the router decides it: replies to
    debugger 7, commands to the VM. Every decision is committed, written or dropped."""

    def __init__(self) -> None:
        self.committed = 0

    def relay_vm(self, data: bytes) -> Any:
        return (7, data)

    def relayed_vm(self, lane: Any) -> None:
        self.committed += 1

    def relay_debugger(self, number: int, data: bytes) -> Any:
        return (data,)

    def relayed_debugger(self, lane: Any) -> None:
        self.committed += 1


async def test_a_relayed_packet_whose_receiver_is_gone_is_dropped_in_the_thread() -> None:
    """The relay lane writes before it records: a reply for a debugger that left meanwhile, or
    a command while the VM's connection is gone, is dropped there and then (as the event loop
    drops it), nothing is handed to trio, and the next packet goes on."""
    vm_sock, vm_peer = socket_pair()
    dbg_sock, dbg_peer = socket_pair()
    written: list[bytes] = []
    outbox = SimpleNamespace(send_now=lambda data: written.append(data) or True)
    stream = trio.SocketStream(dbg_sock)
    debugger = DebuggerConnection(7, stream, "peer", "current", None, Outbox(stream, 1, 1))
    debuggers: dict[int, DebuggerConnection] = {}
    vm_outbox: list[object] = [None]
    writes = PendingWrites(debuggers, lambda: vm_outbox[0])  # type: ignore[arg-type,return-value]
    session = _LaneSession()
    relay = relay_of(session, writes)
    lane = ThreadLane(relay, debuggers)
    now = trio.lowlevel.current_clock().current_time
    vm_peer.sendall(b"reply for a debugger that left")
    assert lane._vm_read(vm_sock, now) is None  # dropped: nothing for the event loop
    member = SimpleNamespace(debugger=debugger, sock=dbg_sock, stop=False, error=None)
    dbg_peer.sendall(b"command while the VM is gone")
    assert lane._debugger_read(member, now) is None  # type: ignore[arg-type]
    assert written == []
    vm_outbox[0] = outbox  # the VM is back: the next command is written at once
    dbg_peer.sendall(b"next command")
    assert lane._debugger_read(member, now) is None  # type: ignore[arg-type]
    assert written == [b"next command"]
    assert (relay.counts.relayed, relay.counts.handed) == (3, 0)
    assert session.committed == 3
    for each in (vm_sock, vm_peer, dbg_sock, dbg_peer):
        each.close()
