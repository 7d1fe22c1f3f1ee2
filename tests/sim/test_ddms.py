"""The simulated VM's DDMS features over a raw JDWP socket: method tracing, heap dumps, the
allocation tracker and EXIT, per flavour (protocol.md 2.2, 3.4, 3.5, 3.8).

Every test runs under a ``trio.fail_after`` cap; real loopback sockets, no autojump clock.
That a request got no reply is proved by order, not by waiting: the sim handles one
connection's commands in turn, so when the next reply to arrive answers a HELO sent after
the request, none was written for it (``Client.unanswered``).
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import trio
from click.testing import CliRunner

from ddmd.protocol.ddm import (
    Allocations,
    AllocationsRequest,
    AllocTrackingEnable,
    AllocTrackingQuery,
    AllocTrackingStatus,
    Chunk,
    ChunkType,
    Direction,
    ExitRequest,
    Fail,
    FeatReply,
    FeatRequest,
    HeapDumpRequest,
    HeapDumpResult,
    HeapDumpStream,
    HeapDumpStreamRequest,
    HeapInfoRequest,
    HeapSegmentRequest,
    HeloReply,
    HeloRequest,
    MethodTraceData,
    MethodTraceEnd,
    MethodTraceEndResult,
    MethodTraceStart,
    MethodTraceStreamEnd,
    MethodTraceStreamStart,
    ProfilingQuery,
    ProfilingStatus,
    ResolvedAllocation,
    SamplingEnd,
    SamplingStart,
    chunks_of,
    ddm_command,
)
from ddmd.protocol.hprof import HprofReader, summarise_stream
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    ConnectionClosed,
    PacketDecoder,
    ReplyPacket,
    encode,
)
from ddmd.protocol.trace import parse_trace
from ddmd.sim import SimConfig, SimVm, demo, sim_command
from ddmd.sim.hprof import LargeDump
from ddmd.sim.trace import DEFAULT_CALL_COUNTS

_FROM_VM = Direction.FROM_VM
CAP = 20  # seconds: absolute cap on every test body

PROFILING_FEATURES = {
    "method-trace-profiling",
    "method-trace-profiling-streaming",
    "hprof-heap-dump",
    "hprof-heap-dump-streaming",
}


def cfg(**kw) -> SimConfig:
    return SimConfig(**{"churn_interval": 0.0, "gc_interval": 0.0, "seed": 7, **kw})


class Client:
    """The server side of a VM connection: handshake, DDM requests, whole packets."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = PacketDecoder(max_length=1 << 26)
        self.next_id = 0x40000001

    @classmethod
    async def connect(cls, port: int) -> Client:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await client.stream.send_all(HANDSHAKE)
        echo = b""
        while len(echo) < len(HANDSHAKE):
            data = await client.stream.receive_some(len(HANDSHAKE) - len(echo))
            assert data, "connection closed during the handshake"
            echo += data
        assert echo == HANDSHAKE
        return client

    async def ddm(self, chunk: Chunk) -> int:
        packet_id = self.next_id
        self.next_id += 1
        await self.stream.send_all(encode(ddm_command(packet_id, chunk)))
        return packet_id

    async def receive(self) -> bytes:
        try:
            return await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return b""

    async def packet(self) -> CommandPacket | ReplyPacket | None:
        """The next packet, or None at EOF."""
        while True:
            event = self.decoder.next_event()
            if isinstance(event, ConnectionClosed):
                return None
            if event is not NEED_DATA:
                assert isinstance(event, CommandPacket | ReplyPacket)
                return event
            self.decoder.receive_data(await self.receive())

    async def until_reply(self, packet_id: int) -> tuple[list[Chunk], ReplyPacket]:
        """The chunks pushed before the reply to ``packet_id``, and that reply."""
        pushes: list[Chunk] = []
        while True:
            packet = await self.packet()
            assert packet is not None, f"EOF before the reply to 0x{packet_id:08x}"
            if isinstance(packet, ReplyPacket):
                assert packet.id == packet_id, f"reply 0x{packet.id:08x}, wanted 0x{packet_id:08x}"
                return pushes, packet
            assert packet.id & 0x80000000, f"push id 0x{packet.id:08x} lacks bit 31"
            pushes.extend(chunks_of(packet, _FROM_VM))

    async def call(self, chunk: Chunk) -> tuple[list[Chunk], tuple[Chunk, ...]]:
        """A request that is answered: (pushes before the reply, the reply's chunks)."""
        pushes, reply = await self.until_reply(await self.ddm(chunk))
        assert reply.error_code == 0
        return pushes, chunks_of(reply, _FROM_VM)

    async def unanswered(self, chunk: Chunk) -> list[Chunk]:
        """Send a request that must get no reply at all; return the pushes it caused.

        A HELO follows it: the first reply to arrive being HELO's proves none was written
        for ``chunk``.
        """
        await self.ddm(chunk)
        pushes, reply = await self.until_reply(await self.ddm(HeloRequest(1)))
        (helo,) = chunks_of(reply, _FROM_VM)
        assert isinstance(helo, HeloReply)
        return pushes

    async def aclose(self) -> None:
        await self.stream.aclose()


@asynccontextmanager
async def session(config: SimConfig) -> AsyncIterator[tuple[SimVm, Client]]:
    vm = SimVm(config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(vm.run)
        client = await Client.connect(port)
        try:
            yield vm, client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


def call_counts(trace: bytes) -> dict[str, int]:
    return {s.method.full_name: s.calls for s in parse_trace(trace).methods}


# --------------------------------------------------------------------------------------------
# Method tracing


async def test_feat_advertises_tracing_and_heap_dumps():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            _, (feat,) = await client.call(FeatRequest())
    assert isinstance(feat, FeatReply)
    assert set(feat.features) >= PROFILING_FEATURES


async def test_streaming_trace_on_art_pushes_the_trace_and_never_replies():
    with trio.fail_after(CAP):
        async with session(cfg(pid=4242)) as (vm, client):
            _, (state,) = await client.call(ProfilingQuery())
            assert state == ProfilingStatus(0)
            assert await client.unanswered(MethodTraceStreamStart(8 << 20, 0)) == []
            _, (state,) = await client.call(ProfilingQuery())
            assert state == ProfilingStatus(1)
            (push,) = await client.unanswered(MethodTraceStreamEnd())
            _, (state,) = await client.call(ProfilingQuery())
            assert state == ProfilingStatus(0)
    assert isinstance(push, MethodTraceData)
    counts = call_counts(push.data)
    assert counts == dict(DEFAULT_CALL_COUNTS)
    assert counts == vm.trace_recording().call_counts()
    assert {t.name for t in parse_trace(push.data).known_threads} == {"main", "SyncWorker"}


async def test_sampling_reports_state_2_and_pushes_an_mpse_chunk():
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            assert await client.unanswered(SamplingStart(8 << 20, 0, 1000)) == []
            _, (state,) = await client.call(ProfilingQuery())
            assert state == ProfilingStatus(2)
            (push,) = await client.unanswered(SamplingEnd())
    assert isinstance(push, MethodTraceData)
    assert call_counts(push.data) == vm.trace_recording().call_counts()


async def test_sampling_interval_zero_is_refused():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            _, (fail,) = await client.call(SamplingStart(8 << 20, 0, 0))
            assert isinstance(fail, Fail)
            assert fail.code == 1
            _, (state,) = await client.call(ProfilingQuery())
    assert state == ProfilingStatus(0)


async def test_stopping_with_no_trace_running_pushes_nothing():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            assert await client.unanswered(MethodTraceStreamEnd()) == []
            assert await client.unanswered(SamplingEnd()) == []


async def test_a_second_start_is_ignored_and_the_first_mode_stays():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            assert await client.unanswered(MethodTraceStreamStart(8 << 20, 0)) == []
            assert await client.unanswered(SamplingStart(8 << 20, 0, 500)) == []
            _, (state,) = await client.call(ProfilingQuery())
    assert state == ProfilingStatus(1)


async def test_legacy_answers_empty_after_the_push():
    with trio.fail_after(CAP):
        async with session(cfg(flavor="legacy")) as (_, client):
            pushes, reply = await client.call(MethodTraceStreamStart(8 << 20, 0))
            assert (pushes, reply) == ([], ())
            pushes, reply = await client.call(MethodTraceStreamEnd())
    assert reply == ()  # the empty reply comes after the trace (protocol.md 2.2)
    (push,) = pushes
    assert isinstance(push, MethodTraceData)
    assert call_counts(push.data) == dict(DEFAULT_CALL_COUNTS)


async def test_file_trace_is_written_on_the_device():
    path = "/sdcard/Android/data/com.example.sim/files/sim.trace"
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            assert await client.unanswered(MethodTraceStart(8 << 20, 0, path)) == []
            _, (state,) = await client.call(ProfilingQuery())
            assert state == ProfilingStatus(1)
            assert path not in vm.device_files
            pushes, (result,) = await client.call(MethodTraceEnd())
            assert pushes == []  # the file is on the device, not pushed
            assert result == MethodTraceEndResult(0)
            # Nothing running any more: the end fails.
            _, (again,) = await client.call(MethodTraceEnd())
            assert again == MethodTraceEndResult(1)
    assert set(vm.device_files) == {path}
    assert call_counts(vm.device_files[path]) == vm.trace_recording().call_counts()


@pytest.mark.parametrize("path", ["sim.trace", "/sdcard/", ""])
async def test_file_trace_to_a_path_that_cannot_be_a_file_fails(path):
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            _, (fail,) = await client.call(MethodTraceStart(8 << 20, 0, path))
            _, (state,) = await client.call(ProfilingQuery())
    assert isinstance(fail, Fail)
    assert fail.code == 1
    assert repr(path) in fail.message
    assert state == ProfilingStatus(0)
    assert vm.device_files == {}


async def test_streaming_stop_ends_a_file_trace_into_its_file():
    # ART stops whatever trace runs; where it goes was decided at the start.
    path = "/data/local/tmp/t.trace"
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            await client.unanswered(MethodTraceStart(8 << 20, 0, path))
            assert await client.unanswered(MethodTraceStreamEnd()) == []
    assert call_counts(vm.device_files[path]) == dict(DEFAULT_CALL_COUNTS)


# --------------------------------------------------------------------------------------------
# Heap dumps


async def test_streamed_heap_dump_is_pushed_and_never_answered_on_art():
    with trio.fail_after(CAP):
        async with session(cfg(package_name="com.example.mail")) as (vm, client):
            (push,) = await client.unanswered(HeapDumpStreamRequest())
    assert isinstance(push, HeapDumpStream)
    summary = summarise_stream([push.data])
    expected = vm.heap_content().expected_instances()
    assert summary.instance_counts() == expected
    assert expected["com.example.mail.Message"] == 250
    assert summary.version == "JAVA PROFILE 1.0.3"


async def test_streamed_heap_dump_on_legacy_is_followed_by_an_empty_reply():
    with trio.fail_after(CAP):
        async with session(cfg(flavor="legacy")) as (vm, client):
            pushes, reply = await client.call(HeapDumpStreamRequest())
    assert reply == ()
    (push,) = pushes
    assert isinstance(push, HeapDumpStream)
    assert summarise_stream([push.data]).instance_counts() == (
        vm.heap_content().expected_instances()
    )


async def test_heap_dump_to_a_file_on_the_device():
    path = "/data/local/tmp/com.example.sim.hprof"
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            pushes, (result,) = await client.call(HeapDumpRequest(path))
            _, (bad,) = await client.call(HeapDumpRequest("relative.hprof"))
    assert pushes == []
    assert result == HeapDumpResult(0)
    assert bad == HeapDumpResult(0xFF)
    assert set(vm.device_files) == {path}
    summary = summarise_stream([vm.device_files[path]])
    assert summary.instance_counts() == vm.heap_content().expected_instances()


async def test_large_streamed_dump_arrives_whole_and_is_never_held_in_memory():
    size = 20 << 20
    with trio.fail_after(60):
        async with session(cfg(hprof_bytes=size)) as (vm, client):
            tracemalloc.start()
            try:
                await client.ddm(HeapDumpStreamRequest())
                helo = await client.ddm(HeloRequest(1))
                # Read the push by hand: its headers, then the dump in pieces, straight into
                # the streaming reader (the test's PacketDecoder would hold it whole).
                head = b""
                while len(head) < 19:
                    data = await client.receive()
                    assert data, "EOF inside the push header"
                    head += data
                length, packet_id, flags, command_set, command = struct.unpack_from(">IIBBB", head)
                chunk_type, chunk_length = struct.unpack_from(">II", head, 11)
                reader = HprofReader()
                reader.feed(head[19:])
                got = len(head) - 19
                rest = b""
                while got < chunk_length:
                    data = await client.receive()
                    assert data, f"EOF after {got} of {chunk_length} dump bytes"
                    take = min(len(data), chunk_length - got)
                    reader.feed(data[:take])
                    rest = data[take:]
                    got += take
                summary = reader.finish()
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            if rest:  # bytes after the dump (b"" would tell the decoder the stream ended)
                client.decoder.receive_data(rest)
            _, reply = await client.until_reply(helo)  # and no reply to HPDS came before it
    assert (length, flags, command_set, command) == (11 + 8 + size, 0, 199, 1)
    assert packet_id & 0x80000000
    assert (chunk_type, chunk_length) == (ChunkType.HPDS, size)
    assert reply.error_code == 0
    assert vm.ddms.large_dump is not None
    assert summary.instance_counts() == vm.ddms.large_dump.expected_instances()
    assert summary.instance_counts()["byte[]"] == LargeDump(size).arrays
    # Sim and client share this process: neither held the dump.
    assert peak < size // 4, f"peak {peak} bytes traced while streaming {size}"


async def test_hprof_bytes_out_of_range_is_refused():
    with pytest.raises(ValueError, match="hprof_bytes"):
        cfg(hprof_bytes=100)
    with pytest.raises(ValueError, match="hprof_bytes"):
        cfg(hprof_bytes=1 << 32)


@pytest.mark.parametrize(
    ("value", "message"),
    [("12X", "is not a size"), ("1K", "is 1024 bytes"), ("5G", "is 5368709120 bytes")],
)
def test_cli_rejects_bad_hprof_sizes(value, message):
    result = CliRunner().invoke(sim_command, ["--hprof-bytes", value])
    assert result.exit_code == 2
    assert message in result.output


# --------------------------------------------------------------------------------------------
# Allocation tracker


async def test_allocation_tracker_lists_exactly_what_the_sim_recorded():
    with trio.fail_after(CAP):
        config = cfg(pid=5000, package_name="com.example.mail")
        async with session(config) as (vm, client):
            _, (state,) = await client.call(AllocTrackingQuery())
            assert state == AllocTrackingStatus(False)
            _, (empty,) = await client.call(AllocationsRequest())
            assert isinstance(empty, Allocations)
            assert empty.entries == ()
            assert await client.unanswered(AllocTrackingEnable(True)) == []
            _, (state,) = await client.call(AllocTrackingQuery())
            assert state == AllocTrackingStatus(True)
            _, (first,) = await client.call(AllocationsRequest())
            assert isinstance(first, Allocations)
            recorded = vm.recorded_allocations()
            assert first.resolved() == recorded
            await vm.force_gc()  # the app allocated more since
            _, (second,) = await client.call(AllocationsRequest())
            assert isinstance(second, Allocations)
            assert second.resolved() == vm.recorded_allocations()
            assert second.resolved()[len(recorded) :] == recorded  # newest first
            assert await client.unanswered(AllocTrackingEnable(False)) == []
            _, (state,) = await client.call(AllocTrackingQuery())
            assert state == AllocTrackingStatus(False)
            _, (after,) = await client.call(AllocationsRequest())
    assert isinstance(after, Allocations)
    assert after.entries == ()
    assert vm.recorded_allocations() == ()
    assert len(recorded) >= 8
    message = next(a for a in recorded if a.class_name == "Lcom/example/mail/Message;")
    assert message.thread_id == 5000  # ART: the low 16 bits of main's tid (= the pid)
    assert message.frames[0].class_name == "Lcom/example/mail/Message;"
    assert message.frames[0].method_name == "<init>"
    assert any(f.line == -2 for a in recorded for f in a.frames)  # a native frame
    assert any(a.frames == () for a in recorded)


async def test_dalvik_reports_vm_thread_ids_and_empty_replies():
    with trio.fail_after(CAP):
        config = cfg(flavor="legacy", vm_ident="Dalvik v1.6.0", pid=600)
        async with session(config) as (vm, client):
            assert await client.call(AllocTrackingEnable(True)) == ([], ())
            _, (allocs,) = await client.call(AllocationsRequest())
    assert isinstance(allocs, Allocations)
    resolved = allocs.resolved()
    assert resolved == vm.recorded_allocations()
    assert {a.thread_id for a in resolved} <= set(range(1, config.threads + 1))
    assert resolved[-1].thread_id == 1  # the oldest entry: a main-thread allocation


def _same_record(a: ResolvedAllocation, b: ResolvedAllocation) -> bool:
    return (a.class_name, a.frames) == (b.class_name, b.frames)


async def test_two_vms_with_one_config_record_the_same_allocations():
    lists = []
    for _ in range(2):
        with trio.fail_after(CAP):
            async with session(cfg()) as (vm, client):
                await client.unanswered(AllocTrackingEnable(True))
                await vm.force_gc()
                _, (allocs,) = await client.call(AllocationsRequest())
        assert isinstance(allocs, Allocations)
        lists.append(allocs.resolved())
    assert lists[0] == lists[1]
    assert len(lists[0]) >= 16


# --------------------------------------------------------------------------------------------
# Android 12+: the heap dump and allocation handlers are gone


@pytest.mark.parametrize(
    "request_chunk",
    [
        AllocTrackingEnable(True),
        AllocTrackingQuery(),
        AllocationsRequest(),
        HeapInfoRequest(1),
        HeapSegmentRequest(1, 0),
        HeapDumpStreamRequest(),
        HeapDumpRequest("/data/local/tmp/x.hprof"),
    ],
    ids=lambda c: type(c).__name__,
)
async def test_modern_gives_no_reply_to_removed_handlers(request_chunk):
    with trio.fail_after(CAP):
        async with session(cfg(flavor="modern")) as (vm, client):
            assert await client.unanswered(request_chunk) == []
    assert vm.device_files == {}
    assert vm.recorded_allocations() == ()


async def test_modern_still_traces_methods():
    with trio.fail_after(CAP):
        async with session(cfg(flavor="modern")) as (_, client):
            assert await client.unanswered(MethodTraceStreamStart(8 << 20, 0)) == []
            (push,) = await client.unanswered(MethodTraceStreamEnd())
    assert isinstance(push, MethodTraceData)
    assert call_counts(push.data) == dict(DEFAULT_CALL_COUNTS)


# --------------------------------------------------------------------------------------------
# EXIT


async def test_exit_ends_the_connection_and_the_vm_with_its_status():
    with trio.fail_after(CAP):
        vm = SimVm(cfg())
        async with trio.open_nursery() as nursery:
            port = await nursery.start(vm.run)
            client = await Client.connect(port)
            await client.unanswered(MethodTraceStreamStart(8 << 20, 0))
            await client.ddm(ExitRequest(7))
            assert await client.packet() is None  # no reply: the connection just ends
            await client.aclose()
        # run() returned by itself: the nursery closed without a cancel.
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)
    stats = vm.statistics()
    assert stats.exited
    assert not stats.listening
    assert (vm.exit_status, stats.exit_status) == (7, 7)


async def test_a_running_vm_has_no_exit_status():
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            await client.call(HeloRequest(1))
            assert vm.exit_status is None
            assert vm.statistics().exit_status is None


# --------------------------------------------------------------------------------------------
# ddmd demo


async def test_demo_vms_offer_the_features_of_their_flavour():
    quiet = {"gc_interval": 0.0, "churn_interval": 0.0, "apnm_delay": 0.0}
    art, legacy, modern = (replace(c, **quiet) for c in demo.DEMO_VMS)
    with trio.fail_after(CAP):
        async with session(art) as (vm, client):
            (push,) = await client.unanswered(HeapDumpStreamRequest())
            assert isinstance(push, HeapDumpStream)
            assert (
                summarise_stream([push.data]).instance_counts()[f"{demo.MAIL}.Message"]
                == vm.heap_content().expected_instances()[f"{demo.MAIL}.Message"]
            )
        async with session(legacy) as (vm, client):
            assert await client.call(AllocTrackingEnable(True)) == ([], ())
            _, (allocs,) = await client.call(AllocationsRequest())
            assert isinstance(allocs, Allocations)
            assert allocs.resolved() == vm.recorded_allocations() != ()
        async with session(modern) as (_, client):
            assert await client.unanswered(AllocTrackingEnable(True)) == []
            assert await client.unanswered(MethodTraceStreamStart(8 << 20, 0)) == []
            (push,) = await client.unanswered(MethodTraceStreamEnd())
            assert isinstance(push, MethodTraceData)
