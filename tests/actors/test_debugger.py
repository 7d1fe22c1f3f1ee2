"""The VM driver (``ddmd.drive.vm.VmDriver``) moving bytes between a VM and debuggers, without
sockets. The routing rules themselves are Playbook tests in tests/session/; these check what
only the driver does: partial reads and writes (lockstep streams), slow consumers, large
packets in pieces, reconnects through the opener, and that no task outlives its VM.

Each test runs a real ``VmDriver`` on one end of a ``trio.testing`` stream pair with a scripted
``FakeVm`` (tests/actors/fakepeers.py) on the other, and attaches ``FakeDebugger`` clients with
``adopt_debugger``. Reconnects go through an opener that makes a fresh pair and a fresh FakeVm.
Timeout paths run under ``autojump_clock``; every test has an absolute ``fail_after`` cap and
ends by closing the VM connection and letting the harness nursery exit on its own, so a
leaked task would hang the test (and trip the cap) instead of passing.
"""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from structlog.testing import capture_logs

from ddmd.config import Config, parse_config
from ddmd.drive.debugger import DIRECT_SEND_LIMIT
from ddmd.drive.vm import VmDriver
from ddmd.errors import VmGone
from ddmd.protocol import ddm
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.protocol.jdwp import (
    CommandPacket,
    CommandSet,
    Packet,
    PacketHeader,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
    encode_header,
)
from ddmd.registry import VmRegistry
from tests.actors.fakepeers import (
    ID_SIZES_64,
    FakeDebugger,
    FakeVm,
    VmScript,
    thread_start_composite,
)

CAP = 60  # seconds (virtual ones under autojump_clock)
VM_ID = "tcp:8000"
VM = CommandSet.VIRTUAL_MACHINE
REFERENCE_TYPE = 2  # any non-special command set: the FakeVm echoes its data


def make_config(**sections: dict[str, object]) -> Config:
    data: dict[str, dict[str, object]] = {
        "debugger": {"queue_packets": 256},
        "timeouts": {"handshake": 5.0, "ddm_request": 2.0, "dbgd_ack": 1.0, "reconnect": 10.0},
        "monitor": {"thread_poll_interval": 0.5},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return parse_config(data, source="test", env={"HOME": "/nonexistent"})


def chunk_name(packet: Packet) -> str | None:
    if not ddm.is_ddm(packet):
        return None
    assert isinstance(packet, CommandPacket)
    chunks = ddm.chunks_of(packet, ddm.Direction.TO_VM)
    return ddm.type_name(chunks[0].chunk_type) if chunks else None


def is_jdwp(packet: CommandPacket) -> bool:
    return not ddm.is_ddm(packet)


class Bridge:
    """One VmActor, the FakeVm of each of its connections, and the logs."""

    def __init__(
        self,
        nursery: trio.Nursery,
        logs: list[dict[str, Any]],
        config: Config,
        script: VmScript,
        *,
        hold: Callable[[CommandPacket], bool] | None,
        lockstep: bool,
    ) -> None:
        self.nursery = nursery
        self.logs = logs
        self.config = config
        self.script = script
        self.hold = hold
        self.lockstep = lockstep
        self.registry = VmRegistry()
        self.notices: list[tuple[str, str]] = []
        self.actor = VmDriver(
            vm_id=VM_ID,
            source="tcp",
            address="127.0.0.1:8000",
            config=config,
            registry=self.registry,
        )
        self.vms: list[FakeVm] = []
        self.reconnect_gate: trio.Event | None = None
        self.opener_calls = 0
        self.reason: str | None = None
        self.done = trio.Event()
        self._connected = trio.Event()

    @property
    def vm(self) -> FakeVm:
        return self.vms[-1]

    def _connect(self) -> tuple[trio.abc.Stream, bytes]:
        pair = (
            trio.testing.lockstep_stream_pair if self.lockstep else trio.testing.memory_stream_pair
        )
        vm_end, actor_end = pair()
        vm = FakeVm(vm_end, self.script, hold=self.hold)
        self.vms.append(vm)
        self.nursery.start_soon(vm.run)
        self._connected.set()
        self._connected = trio.Event()
        return actor_end, b""

    async def wait_connections(self, count: int) -> FakeVm:
        """Wait until the actor has opened ``count`` VM connections; returns the latest."""
        while len(self.vms) < count:
            await self._connected.wait()
        return self.vm

    async def opener(self) -> tuple[trio.abc.Stream, bytes]:
        self.opener_calls += 1
        if self.reconnect_gate is not None:
            await self.reconnect_gate.wait()
        return self._connect()

    async def start(self) -> None:
        stream, _ = self._connect()
        await self.nursery.start(self._run, stream)

    async def _run(self, stream: trio.abc.Stream, *, task_status: trio.TaskStatus[None]) -> None:
        try:
            self.reason = await self.actor.run(stream, b"", self.opener, task_status=task_status)
        finally:
            self.done.set()

    def attach(self, peer: str = "dbg1", *, lockstep: bool = False) -> FakeDebugger:
        pair = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
        dbg_end, actor_end = pair()
        self.actor.adopt_debugger(actor_end, peer, via="current")
        return FakeDebugger(dbg_end)

    async def identified(self, vm: FakeVm | None = None) -> None:
        """Wait until the identification sequence (HELO .. HPIF 1) has been answered."""
        vm = vm or self.vm
        if self.script.ddm:
            await vm.wait_ddm("HPIF", 2)
        else:
            await vm.wait_for(lambda v: any(is_jdwp(p) for p in v.commands()))

    async def shutdown(self) -> None:
        """The VM goes away: every actor and session task must end on its own."""
        await self.vm.stream.aclose()
        await self.done.wait()

    def events(self, name: str, **match: object) -> list[dict[str, Any]]:
        return [
            e
            for e in self.logs
            if e["event"] == name and all(e.get(k) == v for k, v in match.items())
        ]


@asynccontextmanager
async def bridge(
    config: Config | None = None,
    script: VmScript | None = None,
    *,
    hold: Callable[[CommandPacket], bool] | None = None,
    lockstep: bool = False,
    shutdown: bool = True,
) -> AsyncIterator[Bridge]:
    with (
        trio.fail_after(CAP),
        capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs,
    ):
        async with trio.open_nursery() as nursery:
            b = Bridge(
                nursery,
                logs,
                config or make_config(),
                script or VmScript(),
                hold=hold,
                lockstep=lockstep,
            )
            with b.registry.subscribe(lambda kind, vm: b.notices.append((kind, vm))):
                await b.start()
                yield b
                if shutdown:
                    await b.shutdown()
        # The nursery exited without a cancel: no task outlived the VM.
        assert b.done.is_set()
        assert VM_ID not in b.registry


async def attached(b: Bridge, peer: str = "dbg1", **kw: Any) -> FakeDebugger:
    dbg = b.attach(peer, **kw)
    await dbg.handshake()
    return dbg


async def expect_reply(dbg: FakeDebugger) -> ReplyPacket:
    packet = await dbg.receive()
    assert isinstance(packet, ReplyPacket), packet
    return packet


# --------------------------------------------------------------------------------------------
# Id rewriting


def _held_stkl_or_jdwp(p: CommandPacket) -> bool:
    return is_jdwp(p) or chunk_name(p) in ("STKL", "THST")


@pytest.mark.parametrize("lockstep", [False, True], ids=["memory", "lockstep"])
async def test_debugger_ids_equal_to_ddmds_are_rewritten(lockstep: bool) -> None:
    async with bridge(hold=_held_stkl_or_jdwp, lockstep=lockstep) as b:
        await b.identified()
        results: dict[int, ddm.StackTrace] = {}

        async def trace(thread: int) -> None:
            results[thread] = await b.actor.stack_trace(thread)

        dbg = await attached(b)
        async with trio.open_nursery() as calls:
            for thread in (101, 102, 103):
                calls.start_soon(trace, thread)
            ours = [p.id for p in await b.vm.wait_held(3)]
            # The debugger uses exactly the ids ddmd has in flight, and 1..3 besides.
            theirs = [*ours, 1, 2, 3]
            for i in theirs:
                await dbg.command(i, REFERENCE_TYPE, 1, b"d%d" % i)
            held = await b.vm.wait_held(3 + len(theirs))
            vm_ids = [p.id for p in held]
            assert len(set(vm_ids)) == len(vm_ids), vm_ids
            forwarded = [p for p in held if is_jdwp(p)]
            assert [p.data for p in forwarded] == [b"d%d" % i for i in theirs]
            assert not {p.id for p in forwarded} & set(ours)
            for p in reversed(held):
                await b.vm.answer(p)
            replies = [await expect_reply(dbg) for _ in theirs]
        assert sorted((r.id, r.data) for r in replies) == sorted(
            (i, b"echo:d%d" % i) for i in theirs
        )
        assert {t: r.thread_id for t, r in results.items()} == {101: 101, 102: 102, 103: 103}
        assert b.actor.statistics().outstanding == 0


@pytest.mark.parametrize(
    ("seed", "lockstep"),
    [(seed, False) for seed in range(20)] + [(seed, True) for seed in range(20, 25)],
)
async def test_interleaved_requests_answered_in_random_order(seed: int, lockstep: bool) -> None:
    rng = random.Random(seed)
    config = make_config(timeouts={"ddm_request": 60.0}, debugger={"queue_packets": 1024})
    async with bridge(config, hold=_held_stkl_or_jdwp, lockstep=lockstep) as b:
        await b.identified()
        dbg = await attached(b)
        vm = b.vm
        n_dbg, n_stkl, n_refresh = rng.randint(1, 12), rng.randint(1, 6), rng.randint(0, 3)
        dbg_ids = rng.sample(range(1, 24), n_dbg)  # overlaps the ids ddmd uses (1, 2, ...)
        ops = ["debugger"] * n_dbg + ["stkl"] * n_stkl + ["refresh"] * n_refresh
        rng.shuffle(ops)
        traces: dict[int, ddm.StackTrace] = {}
        refreshed: list[Any] = []
        events_sent: list[int] = []

        async def trace(thread: int) -> None:
            traces[thread] = await b.actor.stack_trace(thread)

        async def refresh() -> None:
            refreshed.append(await b.actor.refresh_threads())

        async def answer_randomly() -> None:
            while True:
                await vm.wait_for(lambda v: bool(v.held))
                with trio.CancelScope(shield=True):  # never stop half-way through a write
                    await vm.answer(vm.held.pop(rng.randrange(len(vm.held))))
                    roll = rng.random()
                    if roll < 0.2:
                        event_id = 0x20000000 + len(events_sent)
                        await vm.send(thread_start_composite(event_id, packet_id=event_id))
                        events_sent.append(event_id)
                    elif roll < 0.4:
                        await vm.push(ddm.ThreadCreated(500 + len(events_sent), "pushed"))

        def count(name: str | None) -> int:
            return sum(1 for p in vm.held if chunk_name(p) == name)

        got: list[Packet] = []
        async with trio.open_nursery() as answerers:
            async with trio.open_nursery() as calls:
                threads = iter(range(1000, 2000))
                dbg_iter = iter(dbg_ids)
                for op in ops:
                    if op == "debugger":
                        i = next(dbg_iter)
                        await dbg.command(i, REFERENCE_TYPE, 1, b"payload-%d" % i)
                    elif op == "stkl":
                        calls.start_soon(trace, next(threads))
                    else:
                        calls.start_soon(refresh)
                    if rng.random() < 0.5:
                        await trio.testing.wait_all_tasks_blocked()
                await vm.wait_for(
                    lambda v: (
                        count("STKL") == n_stkl
                        and count(None) == n_dbg
                        and count("THST") >= min(n_refresh, 1)  # concurrent refreshes share one
                    )
                )
                in_flight = [p.id for p in vm.held]
                assert len(set(in_flight)) == len(in_flight), in_flight
                answerers.start_soon(answer_randomly)
                while sum(isinstance(p, ReplyPacket) for p in got) < n_dbg:
                    packet = await dbg.receive()
                    assert packet is not None
                    got.append(packet)
            # Every call of ddmd's returned and the debugger has all its replies.
            answerers.cancel_scope.cancel()
        marker = thread_start_composite(0x7FFFFFFF, packet_id=0x7FFFFFFF)
        await vm.send(marker)
        while (packet := await dbg.receive()) != marker:
            assert packet is not None
            got.append(packet)

        replies = [p for p in got if isinstance(p, ReplyPacket)]
        assert sorted((r.id, r.error_code, r.data) for r in replies) == sorted(
            (i, 0, b"echo:payload-%d" % i) for i in dbg_ids
        )
        events = [p for p in got if isinstance(p, CommandPacket)]
        assert [e.id for e in events] == events_sent  # in order, ids untouched, no DDM
        assert all(e.command_set == CommandSet.EVENT for e in events)
        assert {t: tr.thread_id for t, tr in traces.items()} == {t: t for t in traces}
        assert len(traces) == n_stkl
        assert len(refreshed) == n_refresh
        assert all(s.threads is not None for s in refreshed)


# --------------------------------------------------------------------------------------------
# What goes where


# --------------------------------------------------------------------------------------------
# Dispose and release


@pytest.mark.parametrize("dbgd", ["ack", "fail", "empty", "error", "silence"])
async def test_dispose_then_release(dbgd: str, autojump_clock: trio.testing.MockClock) -> None:
    async with bridge(script=VmScript(answers={"DBGD": dbgd})) as b:
        await b.identified()
        first = b.vm
        dbg = await attached(b)
        await dbg.command(9, VM, VirtualMachineCommand.DISPOSE)
        assert await dbg.receive() == ReplyPacket(9, 0, b"")
        assert await dbg.receive() is None  # ddmd closes the debugger after the reply
        assert not any(
            (p.command_set, p.command) == (VM, VirtualMachineCommand.DISPOSE)
            for p in first.commands()
        )
        await first.wait_ddm("DBGD")
        assert b.events("debugger.dispose", vm=VM_ID)
        assert b.events("ddm.dbgd_sent", vm=VM_ID)
        if dbgd == "ack":
            await trio.sleep(30)  # well past dbgd_ack and reconnect
            assert b.vms == [first]
            assert not first.closed.is_set()
            assert b.events("ddm.dbgd_acknowledged", vm=VM_ID)
            assert not b.events("vm.reconnecting")
        else:
            await first.closed.wait()
            second = await b.wait_connections(2)
            await second.wait_ddm("HELO")  # identified again on the new connection
            assert b.opener_calls == 1
            assert b.events("vm.reconnecting", vm=VM_ID)
            assert b.events("vm.reconnected", vm=VM_ID)
            assert not b.events("ddm.dbgd_acknowledged")
        # The VM kept its id the whole time, and the next debugger works.
        assert b.registry.get(VM_ID) is b.actor
        assert ("removed", VM_ID) not in b.notices
        await b.identified()
        dbg2 = await attached(b, "dbg2")
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1
        assert len(b.vm.ddm_requests("HELO")) == 1


async def test_non_ddm_vm_keeps_its_connection_without_dbgd(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with bridge(script=VmScript(ddm=False)) as b:
        await b.identified()
        first = b.vm
        assert b.actor.snapshot().ddm is False
        dbg = await attached(b)
        await dbg.command(3, VM, VirtualMachineCommand.DISPOSE)
        assert await dbg.receive() == ReplyPacket(3, 0, b"")
        dbg2 = await attached(b, "dbg2")  # waits for the release, then attaches
        await dbg2.command(4, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 4
        # The same connection: released by ddmd (it held nothing), never closed.
        assert b.vm is first
        assert not first.closed.is_set()
        assert len(first.ddm_requests("DBGD")) == 0
        assert len(first.ddm_requests("HELO")) == 1  # answered with error 99
        assert not b.events("ddm.dbgd_sent")
        assert b.events("vm.released")
        assert b.registry.get(VM_ID) is b.actor


async def test_debugger_connecting_during_the_reconnect_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Under the mock clock on purpose, though no timeout is under test: on the real clock a
    # stall of the test process longer than DIRECT_SEND_LIMIT between the Dispose and its
    # reply's write ended the debugger's close before the reply went out (dbg.receive() got
    # None). The mock clock moves only when every task waits, never in the middle of a step;
    # wait_all_tasks_blocked (cushion 0) still returns before it jumps.
    async with bridge(script=VmScript(answers={"DBGD": "empty"})) as b:
        await b.identified()
        first = b.vm
        dbg = await attached(b)
        b.reconnect_gate = trio.Event()
        await dbg.command(1, VM, VirtualMachineCommand.DISPOSE)
        assert await dbg.receive() == ReplyPacket(1, 0, b"")
        await first.closed.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert b.opener_calls == 1
        assert b.actor.snapshot().state == "reconnecting"

        dbg2 = b.attach("dbg2")
        handshaken = trio.Event()

        async def handshake() -> None:
            await dbg2.handshake()
            handshaken.set()

        b.nursery.start_soon(handshake)
        await trio.testing.wait_all_tasks_blocked()
        assert not handshaken.is_set()  # held back while the VM is away
        b.reconnect_gate.set()
        await handshaken.wait()
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1
        assert len(b.vms) == 2
        version = [p for p in b.vm.commands() if is_jdwp(p)]
        assert [(p.command_set, p.command) for p in version] == [
            (VM, VirtualMachineCommand.VERSION)
        ]
        assert b.actor.snapshot().debugger == "dbg2 via current"


async def test_debugger_connecting_while_dbgd_is_pending_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with bridge(script=VmScript(answers={"DBGD": "silence"})) as b:
        await b.identified()
        first = b.vm
        dbg = await attached(b)
        await dbg.command(1, VM, VirtualMachineCommand.DISPOSE)
        await first.wait_ddm("DBGD")  # the release has begun: no answer for dbgd_ack seconds
        dbg2 = b.attach("dbg2")
        await dbg2.handshake()  # completes once the VM is back (recycled)
        assert first.closed.is_set()
        assert len(b.vms) == 2
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1
        assert b.actor.snapshot().debugger == "dbg2 via current"


async def test_reconnect_failure_ends_the_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with bridge(script=VmScript(answers={"DBGD": "fail"}), shutdown=False) as b:
        await b.identified()
        dbg = await attached(b)
        b.reconnect_gate = trio.Event()  # never set: the VM does not come back
        await dbg.command(1, VM, VirtualMachineCommand.DISPOSE)
        await b.done.wait()
        assert b.reason == "reconnect failed"
        assert b.events("vm.reconnect_failed", vm=VM_ID)


# --------------------------------------------------------------------------------------------
# Misbehaving debuggers


async def _end_by_eof(b: Bridge, dbg: FakeDebugger) -> None:
    await dbg.stream.aclose()


async def _end_by_bad_length(b: Bridge, dbg: FakeDebugger) -> None:
    await dbg.send_raw(struct.pack(">IIBBB", 5, 1, 0, 1, 1))
    assert await dbg.receive() is None


@pytest.mark.parametrize("ending", [_end_by_eof, _end_by_bad_length], ids=["eof", "bad-length"])
async def test_debugger_end_releases_the_vm(
    ending: Callable[[Bridge, FakeDebugger], Any], autojump_clock: trio.testing.MockClock
) -> None:
    async with bridge() as b:
        await b.identified()
        first = b.vm
        dbg = await attached(b)
        await ending(b, dbg)
        await first.wait_ddm("DBGD")
        await first.closed.wait()  # silence to DBGD: recycled
        await b.identified(await b.wait_connections(2))
        detached = b.events("debugger.detached", vm=VM_ID)
        assert len(detached) == 1
        if ending is _end_by_bad_length:
            assert b.events("debugger.protocol_error", vm=VM_ID)
            assert detached[0]["reason"].startswith("protocol error")
        dbg2 = await attached(b, "dbg2")  # the slot is free again
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1


async def test_handshake_timeout_ends_the_session(autojump_clock: trio.testing.MockClock) -> None:
    async with bridge() as b:
        await b.identified()
        dbg = b.attach()
        await dbg.send_raw(b"JDWP-")  # and then nothing
        assert await dbg.receive() is None
        assert b.events("debugger.handshake_timed_out", vm=VM_ID)
        assert not b.events("debugger.attached")
        # Never attached: nothing to release, the VM connection stays.
        assert b.vm.ddm_requests("DBGD") == []
        assert len(b.vms) == 1
        dbg2 = await attached(b, "dbg2")
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1


async def test_debugger_eof_before_the_handshake() -> None:
    async with bridge() as b:
        await b.identified()
        dbg = b.attach()
        await dbg.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert b.actor.snapshot().debugger is None
        assert b.vm.ddm_requests("DBGD") == []
        dbg2 = await attached(b, "dbg2")
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1


# --------------------------------------------------------------------------------------------
# Back-pressure


async def test_slow_debugger_is_disconnected_and_the_vm_reader_never_blocks() -> None:
    config = make_config(debugger={"queue_packets": 4})
    async with bridge(config, script=VmScript(answers={"DBGD": "ack"})) as b:
        await b.identified()
        dbg = await attached(b, lockstep=True)  # reads the handshake, then never again
        for i in range(40):
            await b.vm.send(thread_start_composite(i, packet_id=0x20000000 + i))
        # ddmd's own requests are still answered: the VM reader did not block.
        trace = await b.actor.stack_trace(7)
        assert trace.thread_id == 7
        await b.vm.wait_ddm("DBGD")  # the debugger was dropped and the VM released
        (slow,) = b.events("debugger.slow_consumer", vm=VM_ID)
        # Either the queue of 4 filled up, or a direct send found the debugger's buffer full
        # for longer than DIRECT_SEND_LIMIT: both drop the debugger.
        assert slow.get("queue") == 4 or slow.get("waited") == DIRECT_SEND_LIMIT
        (detached,) = b.events("debugger.detached", vm=VM_ID)
        assert detached["reason"] == "slow consumer"
        assert b.actor.snapshot().debugger is None
        got = await dbg.receive_until_eof()
        assert len(got) <= 5
        dbg2 = await attached(b, "dbg2")
        await dbg2.command(1, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(dbg2)).id == 1


async def test_a_debugger_that_pauses_for_two_seconds_keeps_its_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with bridge() as b:
        await b.identified()
        paused = await attached(b, lockstep=True)  # reads only when the test asks it to
        for i in range(40):
            await b.vm.send(thread_start_composite(i, packet_id=0x20000000 + i))
        await trio.sleep(2)  # an IDE in a GC pause, a debugger stopped with Ctrl-Z
        # Meanwhile the VM reader and another debugger carry on.
        assert (await b.actor.stack_trace(7)).thread_id == 7
        other = await attached(b, "dbg2")
        await other.command(1, VM, VirtualMachineCommand.VERSION)
        while not isinstance(reply := await other.receive(), ReplyPacket):
            assert reply is not None
        assert reply.id == 1
        assert b.events("debugger.slow_consumer", vm=VM_ID) == []
        got = [await paused.receive() for _ in range(40)]
        assert [p.id for p in got if p is not None] == [0x20000000 + i for i in range(40)]
        await paused.command(2, VM, VirtualMachineCommand.VERSION)
        assert (await expect_reply(paused)).id == 2
        assert b.events("debugger.slow_consumer", vm=VM_ID) == []


async def test_a_debugger_paused_past_the_limit_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = make_config(debugger={"pause_limit": 3.0})
    async with bridge(config, script=VmScript(answers={"DBGD": "ack"})) as b:
        await b.identified()
        paused = await attached(b, lockstep=True)
        for i in range(40):
            await b.vm.send(thread_start_composite(i, packet_id=0x20000000 + i))
        await trio.sleep(2.5)
        assert b.events("debugger.slow_consumer", vm=VM_ID) == []
        await trio.sleep(1)  # past 3 s without reading: dropped
        (slow,) = b.events("debugger.slow_consumer", vm=VM_ID)
        assert slow["waited"] == 3.0
        (detached,) = b.events("debugger.detached", vm=VM_ID)
        assert detached["reason"] == "slow consumer"
        await paused.receive_until_eof()


async def test_a_paused_debugger_past_its_bytes_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = make_config(debugger={"queue_bytes": 65536, "queue_packets": 100_000})
    async with bridge(config, script=VmScript(answers={"DBGD": "ack"})) as b:
        await b.identified()
        await attached(b, lockstep=True)
        start = trio.current_time()
        for i in range(4000):  # past 64 KiB queued
            await b.vm.send(thread_start_composite(i, packet_id=0x20000000 + i))
            if b.events("debugger.slow_consumer", vm=VM_ID):
                break
        assert trio.current_time() - start < 10  # the bytes, not the time, dropped it
        (slow,) = b.events("debugger.slow_consumer", vm=VM_ID)
        assert slow["queue_bytes"] == 65536


# --------------------------------------------------------------------------------------------
# Large packets


@pytest.mark.parametrize("lockstep", [False, True], ids=["memory", "lockstep"])
async def test_large_reply_is_relayed_in_pieces(lockstep: bool) -> None:
    config = make_config(debugger={"relay_chunk_bytes": 4096})
    body = random.Random(7).randbytes(5 * 1024 * 1024 + 3)
    hold = lambda p: is_jdwp(p) and p.command_set == REFERENCE_TYPE  # noqa: E731
    async with bridge(config, hold=hold, lockstep=lockstep) as b:
        await b.identified()
        dbg = await attached(b)
        await dbg.command(1, VM, VirtualMachineCommand.ID_SIZES)
        await expect_reply(dbg)  # cached from now on
        await dbg.command(0x42, REFERENCE_TYPE, 7)
        (request,) = await b.vm.wait_held(1)
        base = dbg.bytes_received  # the handshake and the first IDSizes reply
        b.nursery.start_soon(dbg.pump)

        header = encode_header(PacketHeader(11 + len(body), request.id, 0x80, 0, 0))
        first = 1024 * 1024
        await b.vm.send_raw(header + body[:first])
        # The first megabyte reaches the debugger while the VM has not finished the packet.
        await dbg.wait_bytes(base + 11 + first)
        # Whatever the session has to say meanwhile waits for the end of the packet.
        await dbg.command(2, VM, VirtualMachineCommand.ID_SIZES)
        await trio.testing.wait_all_tasks_blocked()
        assert dbg.bytes_received == base + 11 + first
        await b.vm.send_raw(body[first:])
        event = thread_start_composite(3, packet_id=0x20000001)
        await b.vm.send(event)
        await dbg.wait_bytes(base + 11 + len(body) + 31 + len(encode(event)))
        big, cached, after = dbg.buffered_packets()
        assert big == ReplyPacket(0x42, 0, body)
        assert cached == ReplyPacket(2, 0, ID_SIZES_64)
        assert after == event
        assert b.actor.bridge_statistics()["bytes_to_debugger"] >= len(body)


async def test_large_ddm_push_is_discarded() -> None:
    config = make_config(debugger={"relay_chunk_bytes": 4096})
    async with bridge(config) as b:
        await b.identified()
        dbg = await attached(b)
        blob = bytes(3 * 1024 * 1024)
        await b.vm.push(ddm.HeapDumpStream(blob))
        await b.vm.push(ddm.ThreadCreated(88, "after"))
        event = thread_start_composite(88, packet_id=0x20000009)
        await b.vm.send(event)
        assert await dbg.receive() == event  # the HPDS never reached the debugger
        (discarded,) = b.events("ddm.push_discarded", vm=VM_ID)
        # Nobody asked for a heap dump: dropped as it streamed by, named by its chunk header.
        assert discarded["type"] == "HPDS"
        assert discarded["length"] == len(blob)
        assert any(t.thread_id == 88 for t in b.actor.snapshot().threads or ())


async def test_large_reply_to_ddmd_itself_is_buffered() -> None:
    config = make_config(debugger={"relay_chunk_bytes": 4096})
    frames = tuple(ddm.StackFrame("C" * 500, f"m{i}", "F.java", i) for i in range(40))
    async with bridge(config, hold=lambda p: chunk_name(p) == "STKL") as b:
        await b.identified()
        result: list[ddm.StackTrace] = []

        async def trace() -> None:
            result.append(await b.actor.stack_trace(5))

        async with trio.open_nursery() as calls:
            calls.start_soon(trace)
            (request,) = await b.vm.wait_held(1)
            await b.vm.reply(request, ddm.encode_chunk(ddm.StackTrace(5, frames)))
        assert result[0].frames == frames


# --------------------------------------------------------------------------------------------
# The VM goes away


async def test_every_session_task_ends_when_the_vm_goes_away() -> None:
    hold = lambda p: is_jdwp(p) or chunk_name(p) == "STKL"  # noqa: E731
    async with bridge(hold=hold, shutdown=False) as b:
        await b.identified()
        dbg = await attached(b)
        await dbg.command(1, REFERENCE_TYPE, 1, b"never answered")
        outcome: list[BaseException] = []

        async def trace() -> None:
            try:
                await b.actor.stack_trace(1)
            except VmGone as exc:
                outcome.append(exc)

        async with trio.open_nursery() as calls:
            calls.start_soon(trace)
            await b.vm.wait_held(2)
            await b.vm.stream.aclose()
        assert len(outcome) == 1
        assert await dbg.receive_until_eof() == []
        await b.done.wait()
        assert b.reason == "eof"
        assert b.actor.statistics().outstanding == 0
        (detached,) = b.events("debugger.detached", vm=VM_ID)
        assert detached["reason"] == "the VM disconnected"
        assert b.opener_calls == 0


async def test_vm_gone_in_the_middle_of_a_relayed_packet() -> None:
    config = make_config(debugger={"relay_chunk_bytes": 4096})
    hold = lambda p: is_jdwp(p) and p.command_set == REFERENCE_TYPE  # noqa: E731
    async with bridge(config, hold=hold, shutdown=False) as b:
        await b.identified()
        dbg = await attached(b)
        await dbg.command(5, REFERENCE_TYPE, 1)
        (request,) = await b.vm.wait_held(1)
        header = encode_header(PacketHeader(11 + 100_000, request.id, 0x80, 0, 0))
        await b.vm.send_raw(header + bytes(50_000))
        await b.vm.stream.aclose()  # half a packet, then EOF
        await b.done.wait()
        assert b.reason is not None
        assert b.reason.startswith("protocol error")
        # The debugger gets the half packet and then EOF: its decoder calls that an error.
        with pytest.raises(RemoteProtocolError, match="middle of a packet"):
            await dbg.receive()
        assert dbg.eof


class _StuckVm(trio.abc.Stream):
    """A VM whose socket buffer is full: every write waits until the stream is closed."""

    def __init__(self) -> None:
        self.closed = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.closed.wait()
        raise trio.ClosedResourceError("closed while writing")

    async def wait_send_all_might_not_block(self) -> None:
        await self.closed.wait()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await self.closed.wait()
        raise trio.ClosedResourceError("closed while reading")

    async def aclose(self) -> None:
        self.closed.set()
        await trio.lowlevel.checkpoint()


async def test_a_vm_that_stops_reading_ends_its_connection_with_no_debugger_attached(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Writes to the VM are bounded even when no debugger is attached: the watchdog also runs
    while a write of ddmd's own is under way, and closes the stuck stream."""
    config = make_config(timeouts={"jdwp_request": 3.0, "ddm_request": 2.0})
    driver = VmDriver(
        vm_id=VM_ID, source="tcp", address="127.0.0.1:8000", config=config, registry=VmRegistry()
    )
    stuck = _StuckVm()
    with (
        trio.fail_after(CAP),
        capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs,
    ):
        reason = await driver.run(stuck, b"", None)  # the HELO write never completes
    assert stuck.closed.is_set()
    (failed,) = [e for e in logs if e["event"] == "vm.send_failed"]
    assert failed["waited"] == 3.0
    assert [e for e in logs if e["event"] == "vm.disconnected"], reason


def test_the_relay_thread_looks_for_replies_only_on_a_vm_ddmd_reaches_directly() -> None:
    """``[debugger] relay_spin_us`` applies to a VM found by the scan; behind adb the replies
    come through the adb server and the device, later than any look, so the thread sleeps."""
    config = make_config(debugger={"relay_spin_us": 45})
    spins = {
        source: VmDriver(
            vm_id=VM_ID,
            source=source,
            address="127.0.0.1:8000",
            config=config,
            registry=VmRegistry(),
        )._lane.spin_ns
        for source in ("tcp", "adb")
    }
    assert spins == {"tcp": 45_000, "adb": 0}
