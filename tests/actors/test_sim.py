"""SimVm over real loopback sockets, checked with a minimal client built from ddmd.protocol.

Every test runs under a ``trio.fail_after`` cap. No autojump clock here: real sockets. That a
request got no reply is proved by order, not by waiting: the sim answers one connection's
commands in turn, so when the reply to a HELO sent afterwards is the next reply to arrive,
none was written for the request (``Client.call_unanswered``).

The default flavour is ``art`` (ART 9+ without its debugger agent: no reply when a handler
returns nothing); tests of the other flavours say so.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
from click.testing import CliRunner

from ddmd.config import load_config
from ddmd.protocol.ddm import (
    AppName,
    Chunk,
    ChunkType,
    Dbgd,
    Direction,
    ExitRequest,
    Fail,
    FeatReply,
    FeatRequest,
    GcRequest,
    HeapEnd,
    HeapInfo,
    HeapInfoRequest,
    HeapSegment,
    HeapSegmentObjects,
    HeapSegmentRequest,
    HeapStart,
    HeloReply,
    HeloRequest,
    NativeHeapEnd,
    NativeHeapSegmentRequest,
    NativeHeapStart,
    SegmentChunk,
    StackTrace,
    StackTraceRequest,
    ThreadCreated,
    ThreadDied,
    ThreadNotify,
    ThreadRenamed,
    ThreadStatus,
    ThreadStatusDraft,
    ThreadStatusRequest,
    UnknownChunk,
    WaitForDebugger,
    chunks_of,
    ddm_command,
)
from ddmd.protocol.heap import HeapAssembler, Kind, SegmentKind, parse_segment_data
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    ConnectionClosed,
    ErrorCode,
    IdSizes,
    PacketDecoder,
    ReplyPacket,
    encode,
)
from ddmd.sim import PRE_INITIALIZED, SimConfig, SimVm, demo, serve_many, sim_command

CAP = 10  # seconds: absolute cap on every test body

QUIET = {"churn_interval": 0.0, "gc_interval": 0.0}  # nothing happens unless a test asks


def cfg(**kw) -> SimConfig:
    return SimConfig(**{**QUIET, "seed": 7, **kw})


# --------------------------------------------------------------------------------------------
# A minimal test client


class Client:
    """A debugger-side peer: handshake, send commands, read whole packets."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = PacketDecoder()
        self.next_id = 0x40000001

    @classmethod
    async def connect(cls, port: int, *, handshake: bool = True) -> Client:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        if handshake:
            await client.stream.send_all(HANDSHAKE)
            echo = b""
            while len(echo) < len(HANDSHAKE):
                data = await client.stream.receive_some(len(HANDSHAKE) - len(echo))
                assert data, "connection closed during the handshake"
                echo += data
            assert echo == HANDSHAKE
        return client

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(self, packet: CommandPacket | ReplyPacket) -> None:
        await self.stream.send_all(encode(packet))

    async def ddm(self, chunk: Chunk) -> int:
        packet_id = self.next_id
        self.next_id += 1
        await self.send(ddm_command(packet_id, chunk))
        return packet_id

    async def command(self, command_set: int, command: int, data: bytes = b"") -> int:
        packet_id = self.next_id
        self.next_id += 1
        await self.send(CommandPacket(packet_id, command_set, command, data))
        return packet_id

    async def packet(self) -> CommandPacket | ReplyPacket | None:
        """The next packet, or None at EOF (a reset counts as EOF)."""
        while True:
            event = self.decoder.next_event()
            if isinstance(event, ConnectionClosed):
                return None
            if event is not NEED_DATA:
                assert isinstance(event, CommandPacket | ReplyPacket)
                return event
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            self.decoder.receive_data(data)

    async def until_reply(self, packet_id: int) -> tuple[list[Chunk], ReplyPacket]:
        """Pushed chunks received before the reply to ``packet_id``, and that reply."""
        pushes: list[Chunk] = []
        while True:
            packet = await self.packet()
            assert packet is not None, f"EOF before the reply to 0x{packet_id:08x}"
            if isinstance(packet, ReplyPacket):
                assert packet.id == packet_id, f"reply 0x{packet.id:08x}, wanted 0x{packet_id:08x}"
                return pushes, packet
            assert packet.id & 0x80000000, f"push id 0x{packet.id:08x} lacks bit 31"
            pushes.extend(chunks_of(packet, Direction.FROM_VM))

    async def call(self, chunk: Chunk) -> tuple[list[Chunk], tuple[Chunk, ...]]:
        """Send a DDM request; return (pushes before the reply, chunks of the reply)."""
        pushes, reply = await self.until_reply(await self.ddm(chunk))
        assert reply.error_code == 0
        return pushes, chunks_of(reply, Direction.FROM_VM)

    async def call_unanswered(self, chunk: Chunk) -> list[Chunk]:
        """Send a DDM request that must get no reply at all; return the pushes it caused.

        A HELO goes right after it. The sim handles one connection's commands in order, so
        the first reply to arrive being HELO's proves none was written for ``chunk`` (no
        waiting on a clock). Pushes before it are returned (``until_reply`` fails on any
        other reply id).
        """
        await self.ddm(chunk)
        pushes, reply = await self.until_reply(await self.ddm(HeloRequest(1)))
        (helo,) = chunks_of(reply, Direction.FROM_VM)
        assert isinstance(helo, HeloReply)
        return pushes

    async def push(self) -> Chunk:
        packet = await self.packet()
        assert isinstance(packet, CommandPacket), packet
        assert packet.id & 0x80000000
        (chunk,) = chunks_of(packet, Direction.FROM_VM)
        return chunk

    async def expect_silence_then_helo(self, *ids: int) -> None:
        """Prove no reply came for ``ids``: a HELO sent after them is answered first."""
        helo = await self.ddm(HeloRequest(1))
        packet = await self.packet()
        assert isinstance(packet, ReplyPacket), packet
        assert packet.id == helo, f"got a reply to 0x{packet.id:08x} (sent {ids})"

    async def expect_silence_then_helo_eventually(self) -> None:
        """Skip whatever arrives until the reply to a fresh HELO."""
        helo = await self.ddm(HeloRequest(1))
        while True:
            packet = await self.packet()
            assert packet is not None, "EOF before the HELO reply"
            if isinstance(packet, ReplyPacket) and packet.id == helo:
                (reply,) = chunks_of(packet, Direction.FROM_VM)
                assert isinstance(reply, HeloReply)
                return


@asynccontextmanager
async def running(config: SimConfig) -> AsyncIterator[tuple[SimVm, int]]:
    vm = SimVm(config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(vm.run)
        yield vm, port
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def session(config: SimConfig) -> AsyncIterator[tuple[SimVm, Client]]:
    async with running(config) as (vm, port):
        client = await Client.connect(port)
        try:
            yield vm, client
        finally:
            await client.aclose()


async def connect_retrying(port: int) -> Client:
    """The sim listens again a moment after a connection ends: retry briefly."""
    while True:
        try:
            return await Client.connect(port)
        except OSError:
            await trio.sleep(0.01)


# --------------------------------------------------------------------------------------------
# Identity: HELO, FEAT, WAIT, APNM


async def test_helo_shipped_has_all_five_trailers():
    with trio.fail_after(CAP):
        config = cfg(pid=4321, app_name="com.example.app:remote", package_name="com.example.app")
        async with session(config) as (_, client):
            pushes, (helo,) = await client.call(HeloRequest(1))
    assert pushes == []
    assert helo == HeloReply(
        1,
        4321,
        "Dalvik v2.1.0",
        "com.example.app:remote",
        0,
        "64-bit (x86_64)",
        "CheckJNI=false",
        False,
        "com.example.app",
    )


async def test_helo_draft_has_no_trailers():
    with trio.fail_after(CAP):
        async with session(cfg(draft=True, pid=317)) as (_, client):
            _, (helo,) = await client.call(HeloRequest(1))
    assert helo == HeloReply(1, 317, "Dalvik v2.1.0", "com.example.sim")


async def test_feat_lists_features():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            _, (feat,) = await client.call(FeatRequest())
    assert isinstance(feat, FeatReply)
    assert "hprof-heap-dump" in feat.features
    assert "view-hierarchy" in feat.features


async def test_wait_is_pushed_before_the_helo_reply_until_a_debugger_attaches():
    with trio.fail_after(CAP):
        async with session(cfg(wait_for_debugger=True)) as (_, client):
            pushes, (helo,) = await client.call(HeloRequest(1))
            assert pushes == [WaitForDebugger(0)]
            assert isinstance(helo, HeloReply)
            # A non-DDM command is a debugger: the app stops waiting.
            _, reply = await client.until_reply(await client.command(1, 7))
            assert IdSizes.decode(reply.data) == IdSizes(8, 8, 8, 8, 8)
            pushes, _ = await client.call(HeloRequest(1))
            assert pushes == []


async def test_push_wait_hook():
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            await vm.push_wait()
            assert await client.push() == WaitForDebugger(0)


async def test_apnm_names_the_app_after_the_delay():
    with trio.fail_after(CAP):
        config = cfg(apnm_delay=0.2, app_name="com.example.app", package_name="com.example.app")
        async with session(config) as (vm, client):
            _, (helo,) = await client.call(HeloRequest(1))
            assert isinstance(helo, HeloReply)
            assert helo.app_name == PRE_INITIALIZED
            assert helo.package_name == PRE_INITIALIZED
            assert await client.push() == AppName("com.example.app", 0, "com.example.app")
            _, (helo,) = await client.call(HeloRequest(1))
            assert isinstance(helo, HeloReply)
            assert helo.app_name == "com.example.app"
            await vm.rename("com.example.other", "com.example.otherpkg")
            assert await client.push() == AppName("com.example.other", 0, "com.example.otherpkg")


async def test_apnm_draft_carries_the_name_only():
    with trio.fail_after(CAP):
        async with session(cfg(draft=True)) as (vm, client):
            await vm.rename("com.example.draft")
            assert await client.push() == AppName("com.example.draft")


# --------------------------------------------------------------------------------------------
# Threads


async def test_then_bursts_thcr_and_no_reply_then_pushes_churn():
    with trio.fail_after(CAP):
        async with session(cfg(threads=8, pid=500)) as (vm, client):
            pushes = await client.call_unanswered(ThreadNotify(True))
            assert all(isinstance(p, ThreadCreated) for p in pushes)
            names = {p.thread_id: p.name for p in pushes if isinstance(p, ThreadCreated)}
            assert len(names) == 8
            assert names[1] == "main"
            assert "Binder:500_1" in names.values()
            assert vm.statistics().thread_notify
            seen: set[type] = set()
            for _ in range(40):
                await vm.churn()  # every churn event is pushed while THEN is on
                chunk = await client.push()
                seen.add(type(chunk))
                if isinstance(chunk, ThreadCreated):
                    assert chunk.thread_id not in names
                    names[chunk.thread_id] = chunk.name
                elif isinstance(chunk, ThreadDied):
                    assert names.pop(chunk.thread_id)
                else:
                    assert isinstance(chunk, ThreadRenamed)
                    assert chunk.thread_id in names
                    names[chunk.thread_id] = chunk.name
            assert seen == {ThreadCreated, ThreadDied, ThreadRenamed}
            # THST agrees with the notifications
            _, (status,) = await client.call(ThreadStatusRequest())
            assert isinstance(status, ThreadStatus)
            assert {t.thread_id for t in status.threads} == set(names)
            # THEN off: churn is no longer pushed
            assert await client.call_unanswered(ThreadNotify(False)) == []
            assert not vm.statistics().thread_notify
            await vm.churn()
            await client.expect_silence_then_helo()


async def test_thst_shipped_layout_with_art_states_and_growing_cpu_times():
    with trio.fail_after(CAP):
        async with session(cfg(threads=12, pid=900)) as (_, client):
            reply_id = await client.ddm(ThreadStatusRequest())
            _, reply = await client.until_reply(reply_id)
            data = reply.data[8:]
            assert struct.unpack(">4sI", reply.data[:8]) == (b"THST", len(data))
            assert (data[0], data[1]) == (4, 18)  # header length, bytes per entry
            assert len(data) == 4 + 12 * 18
            (first,) = chunks_of(reply, Direction.FROM_VM)  # rule T
            assert isinstance(first, ThreadStatus)
            assert len(first.threads) == 12
            main = first.threads[0]
            assert (main.thread_id, main.tid, main.daemon) == (1, 900, False)
            assert all(0 <= t.status <= 4 for t in first.threads)  # ART: 0-4 only
            assert len({t.tid for t in first.threads}) == 12
            await trio.sleep(0.5)  # CPU time is a function of wall time
            _, (second,) = await client.call(ThreadStatusRequest())
            assert isinstance(second, ThreadStatus)
            total = 0
            for a, b in zip(first.threads, second.threads, strict=True):
                assert a.thread_id == b.thread_id
                assert b.utime >= a.utime
                assert b.stime >= a.stime
                total += b.utime - a.utime
            assert total > 0


async def test_thst_dalvik_states():
    with trio.fail_after(CAP):
        async with session(cfg(vm_ident="Dalvik v1.6.0")) as (_, client):
            _, (status,) = await client.call(ThreadStatusRequest())
    assert isinstance(status, ThreadStatus)
    values = {t.thread_id: t.status for t in status.threads}
    assert values[2] == 8  # Signal Catcher: vmwait, a Dalvik-only value
    assert all(0 <= v <= 9 for v in values.values())


async def test_thst_draft_layout():
    with trio.fail_after(CAP):
        async with session(cfg(draft=True, threads=5)) as (_, client):
            _, (status,) = await client.call(ThreadStatusRequest(interval=0))
    assert isinstance(status, ThreadStatusDraft)
    assert [t.thread_id for t in status.threads] == [1, 2, 3, 4, 5]
    assert all(1 <= t.state <= 8 for t in status.threads)


async def test_stkl_for_a_live_thread_and_fail_for_a_dead_one():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            _, (trace,) = await client.call(StackTraceRequest(1))
            _, (fail,) = await client.call(StackTraceRequest(999))
    assert isinstance(trace, StackTrace)
    assert trace.thread_id == 1
    assert trace.frames[0].method_name == "nativePollOnce"
    assert trace.frames[0].line == -2
    assert trace.frames[-1].class_name == "com.android.internal.os.ZygoteInit"
    assert fail == Fail(1, "Stack trace unavailable")


# --------------------------------------------------------------------------------------------
# Heap


async def nothing_to_say(client: Client, chunk: Chunk, flavor: str) -> list[Chunk]:
    """A request whose handler returns nothing: no reply (art), or an empty one (legacy).

    Returns the pushes that came first.
    """
    if flavor == "legacy":
        pushes, chunks = await client.call(chunk)
        assert chunks == ()
        return pushes
    return await client.call_unanswered(chunk)


@pytest.mark.parametrize("flavor", ["art", "legacy"])
async def test_hpif_now_is_pushed_before_the_end_of_the_request(flavor):
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=8, flavor=flavor)) as (_, client):
            pushes = await nothing_to_say(client, HeapInfoRequest(1), flavor)
    (info,) = pushes
    assert isinstance(info, HeapInfo)
    (heap,) = info.heaps
    assert (heap.heap_id, heap.reason, heap.size) == (1, 1, 8 << 20)
    assert 0 < heap.bytes_allocated <= heap.size <= heap.max_size
    assert heap.objects_allocated > 0


async def test_hpif_draft_answers_in_the_reply():
    with trio.fail_after(CAP):
        async with session(cfg(draft=True)) as (_, client):
            pushes, (info,) = await client.call(HeapInfoRequest(1))
    assert pushes == []
    assert isinstance(info, HeapInfo)


async def test_hpif_next_gc_is_one_shot():
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            assert await client.call_unanswered(HeapInfoRequest(2)) == []
            await vm.force_gc()
            info = await client.push()
            assert isinstance(info, HeapInfo)
            assert info.heaps[0].reason == 2
            await vm.force_gc()
            await client.expect_silence_then_helo()


@pytest.mark.parametrize("flavor", ["art", "legacy"])
async def test_hpif_every_gc_and_hpgc(flavor):
    with trio.fail_after(CAP):
        async with session(cfg(flavor=flavor)) as (vm, client):
            assert await nothing_to_say(client, HeapInfoRequest(3), flavor) == []
            for _ in range(2):
                await vm.force_gc()
                info = await client.push()
                assert isinstance(info, HeapInfo)
                assert info.heaps[0].reason == 3
            # HPGC: the GC and its pushes first, then the end of the request
            pushes = await nothing_to_say(client, GcRequest(), flavor)
            assert [type(p) for p in pushes] == [HeapInfo]
            assert await nothing_to_say(client, HeapInfoRequest(0), flavor) == []
            await vm.force_gc()
            await client.expect_silence_then_helo()
            assert vm.statistics().gcs == 4


async def test_bad_hpif_and_hpsg_values_fail():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            _, (a,) = await client.call(HeapInfoRequest(7))
            _, (b,) = await client.call(HeapSegmentRequest(1, 5))
    assert isinstance(a, Fail)
    assert a.code == 1
    assert isinstance(b, Fail)
    assert b.code == 1


async def collect_dump(client: Client) -> list[Chunk]:
    chunks = [await client.push()]
    assert chunks[0] == HeapStart(1)
    while not isinstance(chunks[-1], HeapEnd):
        chunks.append(await client.push())
    assert chunks[-1] == HeapEnd(1)
    return chunks


def check_dump(chunks: list[Chunk], kind: SegmentKind, heap_mb: int, *, draft: bool = False):
    segments = [c for c in chunks[1:-1] if isinstance(c, SegmentChunk)]
    assert len(segments) == len(chunks) - 2
    assert segments
    assembler = HeapAssembler()
    assembler.start(1)
    expected_address = 0x12C00000
    for seg in segments:
        assert seg.chunk_type == kind
        data = seg.encode_data()
        assert 8 + len(data) <= 16368  # shipped chunk cap
        parsed = parse_segment_data(data)  # protocol.md 4.3, exactly
        assert parsed.unit_size == 8
        if draft:
            assert parsed.start == 0x12C00000
        else:
            assert parsed.offset == 0  # each piece has its own start address
        assert parsed.address == expected_address
        expected_address = parsed.end
        assert parsed.usage[-2] & 0x07 != 0  # no free space at the end of a piece
        problems = assembler.segment(
            kind, seg.heap_id, seg.unit_size, seg.start, seg.offset, seg.units, seg.usage
        )
        assert problems == ()
    image = assembler.end(1)
    assert image.complete
    assert image.problems == ()
    summary = image.summary()
    assert summary.bytes_used + summary.bytes_free == heap_mb << 20
    assert 0 < summary.bytes_free < summary.bytes_used
    assert summary.free_run_count > 1
    assert {k for k, _ in summary.bytes_by_kind} == {
        Kind.OBJECT,
        Kind.CLASS_OBJECT,
        Kind.ARRAY_1,
        Kind.ARRAY_2,
        Kind.ARRAY_4,
        Kind.ARRAY_8,
    }
    usage = b"".join(s.usage for s in segments)
    assert any(state & 0x80 for state in usage[0::2])  # runs > 256 units are split with P
    assert image.spans() == ((0x12C00000, 0x12C00000 + (heap_mb << 20)),)
    return summary, usage


async def test_hpsg_dump_sequence_is_valid_and_varies_lightly_between_gcs():
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=4)) as (vm, client):
            assert await client.call_unanswered(HeapSegmentRequest(1, 0)) == []
            await vm.force_gc()
            first, usage1 = check_dump(await collect_dump(client), SegmentKind.HPSG, 4)
            await vm.force_gc()
            second, usage2 = check_dump(await collect_dump(client), SegmentKind.HPSG, 4)
            assert usage1 != usage2
            assert len(usage1) == len(usage2)
            assert abs(first.bytes_used - second.bytes_used) < (4 << 20) // 20
            assert await client.call_unanswered(HeapSegmentRequest(0, 0)) == []
            await vm.force_gc()
            await client.expect_silence_then_helo()


async def test_hpso_and_native_dumps():
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=2)) as (_, client):
            assert await client.call_unanswered(HeapSegmentRequest(1, 1)) == []
            assert await client.call_unanswered(NativeHeapSegmentRequest(1, 0)) == []
            pushes = await client.call_unanswered(GcRequest())
            assert pushes[-2:] == [NativeHeapStart(1), NativeHeapEnd(1)]  # ART: nothing between
            summary, _ = check_dump(pushes[:-2], SegmentKind.HPSO, 2)
            assert all(isinstance(p, HeapSegmentObjects) for p in pushes[1:-3])
            assert summary.object_count
            assert summary.object_count > 1000
            assert await client.call_unanswered(NativeHeapSegmentRequest(0, 1)) == []


async def test_draft_heap_pieces_share_the_start_address():
    with trio.fail_after(CAP):
        async with session(cfg(draft=True, heap_mb=2)) as (vm, client):
            assert await client.call_unanswered(HeapSegmentRequest(1, 0)) == []
            await vm.force_gc()
            chunks = await collect_dump(client)
    assert all(isinstance(c, HeapSegment) for c in chunks[1:-1])
    check_dump(chunks, SegmentKind.HPSG, 2, draft=True)


def used_bytes_and_objects(chunks: list[Chunk]) -> tuple[int, int]:
    """Used bytes and used logical runs of a HPST..HPEN dump, decoded by ddmd.protocol.heap."""
    used = objects = 0
    for chunk in chunks[1:-1]:
        assert isinstance(chunk, SegmentChunk)
        segment = parse_segment_data(chunk.encode_data())
        for run in segment.runs():
            if not run.free:
                used += run.units * segment.unit_size
                objects += 1
    return used, objects


def heap_figures(chunk: Chunk) -> tuple[int, int, int]:
    assert isinstance(chunk, HeapInfo)
    (heap,) = chunk.heaps
    assert heap.size <= heap.max_size
    return heap.size, heap.bytes_allocated, heap.objects_allocated


async def test_heap_info_agrees_with_the_segment_dump_after_every_gc():
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=2, seed=11)) as (vm, client):
            assert await client.call_unanswered(HeapInfoRequest(3)) == []
            assert await client.call_unanswered(HeapSegmentRequest(1, 0)) == []
            seen = set()
            for i in range(6):
                if i % 2:  # a GC of the VM's own, or one that ddmd asked for
                    await vm.force_gc()
                    info = await client.push()
                    dump = await collect_dump(client)
                else:
                    info, *dump = await client.call_unanswered(GcRequest())
                size, allocated, objects = heap_figures(info)
                assert info.heaps[0].reason == 3
                assert (allocated, objects) == used_bytes_and_objects(dump)
                assert 0 < allocated <= size == 2 << 20
                seen.add(allocated)
                # HPIF now: the same current figures, until the next GC
                (now,) = await client.call_unanswered(HeapInfoRequest(1))
                assert heap_figures(now) == (size, allocated, objects)
                assert now.heaps[0].reason == 1
            assert len(seen) > 1  # the GCs did change the heap


async def test_heap_info_object_count_is_what_a_hpso_dump_counts():
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=2)) as (_, client):
            (before,) = await client.call_unanswered(HeapInfoRequest(1))  # builds the heap
            (again,) = await client.call_unanswered(HeapInfoRequest(1))
            assert heap_figures(before) == heap_figures(again)  # no GC: nothing changed
            assert await client.call_unanswered(HeapSegmentRequest(1, 1)) == []
            dump = await client.call_unanswered(GcRequest())
            summary, _ = check_dump(dump, SegmentKind.HPSO, 2)
            (now,) = await client.call_unanswered(HeapInfoRequest(1))
            _, allocated, objects = heap_figures(now)
    assert allocated == summary.bytes_used
    assert objects == summary.object_count


# --------------------------------------------------------------------------------------------
# Flavors and odd requests


MALFORMED = {
    "chunk-past-the-end": struct.pack(">4sI", b"HELO", 99) + b"\0\0\0\1",
    "short-header": b"HEL",
    "bad-data": struct.pack(">4sI", b"HPIF", 0),  # a HPIF request needs its u1
}


def art_quiet_requests() -> list[Chunk]:
    """Requests an ART 9+ VM handles without anything to say, or does not know."""
    return [
        HeapInfoRequest(3),
        HeapSegmentRequest(1, 0),
        NativeHeapSegmentRequest(1, 0),
        GcRequest(),
        ThreadNotify(False),
        Dbgd(),
        UnknownChunk(0x51525354, b"xyz"),
    ]


def test_default_flavour_is_art():
    assert SimConfig().flavor == "art"


async def test_art_then_gets_no_reply_only_its_thcr_burst():
    with trio.fail_after(CAP):
        async with session(cfg(threads=6)) as (vm, client):
            then = await client.ddm(ThreadNotify(True))
            helo = await client.ddm(HeloRequest(1))
            pushes, reply = await client.until_reply(helo)  # fails on a reply to THEN
            assert reply.id != then
            assert [type(p) for p in pushes] == [ThreadCreated] * 6
            assert vm.statistics().thread_notify


async def test_art_handlers_returning_nothing_and_unknown_types_get_no_reply():
    with trio.fail_after(CAP):
        async with session(cfg(heap_mb=1)) as (vm, client):
            pushes = {type(c): await client.call_unanswered(c) for c in art_quiet_requests()}
            # HPGC did run: the heap info and the dumps enabled before it came out
            gc = pushes.pop(GcRequest)
            assert isinstance(gc[0], HeapInfo)
            assert gc[1] == HeapStart(1)
            assert gc[-3:] == [HeapEnd(1), NativeHeapStart(1), NativeHeapEnd(1)]
            assert all(p == [] for p in pushes.values())
            assert vm.statistics().gcs == 1


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
async def test_art_malformed_ddm_gets_no_reply(data):
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            bad = await client.command(199, 1, data)
            await client.expect_silence_then_helo(bad)


async def test_art_a_debugger_loads_the_agent_for_the_life_of_the_vm():
    with trio.fail_after(CAP):
        async with running(cfg(heap_mb=1)) as (vm, port):
            client = await Client.connect(port)
            assert await client.call_unanswered(ThreadNotify(False)) == []
            _, reply = await client.until_reply(await client.command(1, 1))  # a debugger: Version
            assert reply.error_code == 0
            for chunk in art_quiet_requests():
                _, chunks = await client.call(chunk)
                assert chunks == ()
            await client.aclose()
            # The agent stays loaded on the next connection too (ART keeps it).
            again = await connect_retrying(port)
            for chunk in art_quiet_requests():
                _, chunks = await again.call(chunk)
                assert chunks == ()
            # With the agent, a chunk that runs past the packet is a JDWP error...
            bad = await again.command(199, 1, MALFORMED["chunk-past-the-end"])
            _, reply = await again.until_reply(bad)
            assert (reply.error_code, reply.data) == (ErrorCode.INTERNAL, b"")
            # ... and data a handler cannot take is "returned nothing": an empty reply.
            bad = await again.command(199, 1, MALFORMED["bad-data"])
            _, reply = await again.until_reply(bad)
            assert (reply.error_code, reply.data) == (0, b"")
            await again.aclose()
            assert vm.connections_accepted == 2


async def test_legacy_answers_everything_with_at_least_an_empty_reply():
    with trio.fail_after(CAP):
        async with session(cfg(flavor="legacy", threads=5, heap_mb=1)) as (vm, client):
            pushes, chunks = await client.call(ThreadNotify(True))
            assert chunks == ()
            assert [type(p) for p in pushes] == [ThreadCreated] * 5  # the burst comes first
            for chunk in art_quiet_requests():
                _, chunks = await client.call(chunk)
                assert chunks == ()
            for data in MALFORMED.values():
                _, reply = await client.until_reply(await client.command(199, 1, data))
                assert (reply.error_code, reply.data) == (0, b"")
            assert vm.statistics().gcs == 1


@pytest.mark.parametrize(
    ("vm_ident", "handled"),
    [
        pytest.param("Dalvik v2.1.0", False, id="art-5-8"),
        pytest.param("Dalvik v1.6.0", True, id="dalvik"),
    ],
)
async def test_legacy_trailing_bytes_after_the_chunk(vm_ident, handled):
    with trio.fail_after(CAP):
        async with session(cfg(flavor="legacy", vm_ident=vm_ident)) as (_, client):
            helo = ddm_command(1, HeloRequest(1))
            packet = CommandPacket(7, 199, 1, helo.data + b"\0\0")
            await client.send(packet)
            _, reply = await client.until_reply(7)
    assert reply.error_code == 0
    if handled:  # Dalvik handles the first chunk and ignores the rest
        (chunk,) = chunks_of(reply, Direction.FROM_VM)
        assert isinstance(chunk, HeloReply)
    else:  # ART 5-8 wants the chunk to fill the packet exactly
        assert reply.data == b""


@pytest.mark.parametrize("flavor", ["art", "legacy", "modern"])
async def test_fail_types_are_refused_with_a_fail_chunk(flavor):
    with trio.fail_after(CAP):
        refused = ("HPGC", "HPSG", "HPIF", "THEN", "THST")
        async with session(cfg(flavor=flavor, fail_types=refused)) as (vm, client):
            for chunk in (
                GcRequest(),
                HeapSegmentRequest(1, 0),
                HeapInfoRequest(1),
                ThreadNotify(True),
                ThreadStatusRequest(),
            ):
                pushes, (fail,) = await client.call(chunk)
                assert pushes == []  # refused, not handled: no THCR burst, no HPIF data
                assert isinstance(fail, Fail)
                assert fail.code == 1
                assert fail.message
            _, (helo,) = await client.call(HeloRequest(1))  # the others still work
            assert isinstance(helo, HeloReply)
            stats = vm.statistics()
            assert (stats.gcs, stats.thst_requests, stats.thread_notify) == (0, 0, False)


@pytest.mark.parametrize("bad", ["HPG", "HPGCX", "", "HP C", "HPG\u00e9", 42, "HPGC"])
def test_fail_types_must_be_four_ascii_characters(bad):
    fail_types = bad if bad == "HPGC" else (bad,)  # a bare string is not a tuple of names
    with pytest.raises(ValueError, match="request type"):
        SimConfig(fail_types=fail_types)


def test_fail_types_accept_a_list_and_keep_a_tuple():
    assert SimConfig(fail_types=["HPGC", "THST"]).fail_types == ("HPGC", "THST")


def test_cli_fail_option_checks_the_names():
    runner = CliRunner()
    result = runner.invoke(sim_command, ["--fail", "HPGC,HPX"])
    assert result.exit_code == 2
    assert "'HPX' is not a request type" in result.output
    result = runner.invoke(sim_command, ["--flavor", "dalvik"])
    assert result.exit_code == 2
    assert "legacy" in result.output


async def test_modern_flavor_is_silent_except_for_identity():
    with trio.fail_after(CAP):
        async with session(cfg(flavor="modern")) as (vm, client):
            _, (helo,) = await client.call(HeloRequest(1))
            assert isinstance(helo, HeloReply)
            _, (feat,) = await client.call(FeatRequest())
            assert isinstance(feat, FeatReply)
            ids = [
                await client.ddm(chunk)
                for chunk in (
                    ThreadNotify(True),
                    ThreadStatusRequest(),
                    StackTraceRequest(1),
                    HeapInfoRequest(1),
                    HeapSegmentRequest(1, 0),
                    NativeHeapSegmentRequest(0, 1),
                    GcRequest(),
                    Dbgd(),
                    UnknownChunk(0x51525354, b""),
                )
            ]
            await client.expect_silence_then_helo(*ids)  # not even the HPIF push came
            stats = vm.statistics()  # no handler ran: no GC, no thread status, no THEN
            assert (stats.gcs, stats.thst_requests, stats.thread_notify) == (0, 0, False)
            await vm.rename("com.example.renamed")  # APNM pushes still work
            assert isinstance(await client.push(), AppName)
            # A non-DDM command loads the agent: unhandled DDM now gets empty replies.
            _, reply = await client.until_reply(await client.command(1, 7))
            assert reply.error_code == 0
            assert await client.call(ThreadStatusRequest()) == ([], ())


async def test_reply_packets_from_the_client_are_dropped():
    with trio.fail_after(CAP):
        async with session(cfg()) as (_, client):
            await client.send(ReplyPacket(0x80000001, 0, b""))
            await client.send(ReplyPacket(5, 99, b""))
            await client.expect_silence_then_helo()


async def test_push_ids_have_bit_31_and_increase():
    with trio.fail_after(CAP):
        async with session(cfg()) as (vm, client):
            ids = []
            for _ in range(3):
                await vm.push_wait()
                packet = await client.packet()
                assert isinstance(packet, CommandPacket)
                ids.append(packet.id)
    assert all(i & 0x80000000 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == 3


# --------------------------------------------------------------------------------------------
# Plain JDWP


async def test_jdwp_basics_unknown_commands_and_dispose():
    with trio.fail_after(CAP):
        async with running(cfg(threads=3)) as (vm, port):
            client = await Client.connect(port)
            _, reply = await client.until_reply(await client.command(1, 1))  # Version
            (size,) = struct.unpack_from(">I", reply.data)
            assert reply.data[4 : 4 + size].startswith(b"Android DalvikVM")
            _, reply = await client.until_reply(await client.command(1, 4))  # AllThreads
            count, *objects = struct.unpack(">i3Q", reply.data)
            assert count == 3
            _, reply = await client.until_reply(
                await client.command(11, 1, struct.pack(">Q", objects[0]))
            )
            assert reply.data == struct.pack(">I", 4) + b"main"
            _, reply = await client.until_reply(await client.command(11, 1, struct.pack(">Q", 999)))
            assert reply.error_code == ErrorCode.INVALID_THREAD
            assert reply.data == b""
            _, reply = await client.until_reply(await client.command(1, 99))
            assert (reply.error_code, reply.data) == (ErrorCode.NOT_IMPLEMENTED, b"")
            _, reply = await client.until_reply(await client.command(15, 1, b"\x08\x00" + bytes(4)))
            assert reply.error_code == 0
            assert len(reply.data) == 4
            _, reply = await client.until_reply(await client.command(1, 6))  # Dispose
            assert (reply.error_code, reply.data) == (0, b"")
            assert await client.packet() is None  # then the VM closes the connection
            await client.aclose()
            again = await connect_retrying(port)
            await again.expect_silence_then_helo()
            await again.aclose()
            assert vm.connections_accepted == 2


# --------------------------------------------------------------------------------------------
# Connections


async def test_second_connection_is_refused_while_one_is_open():
    with trio.fail_after(CAP):
        async with running(cfg()) as (vm, port):
            first = await Client.connect(port)
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", port)
            await first.expect_silence_then_helo()
            await first.aclose()
            second = await connect_retrying(port)
            await second.expect_silence_then_helo()
            await second.aclose()
            assert vm.connections_accepted == 2
            assert vm.port == port


async def test_exit_stops_the_vm():
    with trio.fail_after(CAP):
        vm = SimVm(cfg())
        stopped = trio.Event()

        async def run_vm(task_status=trio.TASK_STATUS_IGNORED):
            await vm.run(task_status=task_status)
            stopped.set()

        async with trio.open_nursery() as nursery:
            port = await nursery.start(run_vm)
            client = await Client.connect(port)
            await client.ddm(ExitRequest(3))
            assert await client.packet() is None  # no reply: the VM halts
            await stopped.wait()
            await client.aclose()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", port)
        stats = vm.statistics()
        assert stats.exited
        assert not stats.listening


async def test_jdwp_exit_replies_then_stops():
    with trio.fail_after(CAP):
        vm = SimVm(cfg())
        async with trio.open_nursery() as nursery:
            port = await nursery.start(vm.run)
            client = await Client.connect(port)
            _, reply = await client.until_reply(await client.command(1, 10, struct.pack(">i", 0)))
            assert reply.error_code == 0
            assert await client.packet() is None
            await client.aclose()
        assert vm.statistics().exited


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"JDWP-Handshakx", id="bad-handshake"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http"),
    ],
)
async def test_bad_handshake_closes_and_the_sim_keeps_serving(garbage):
    with trio.fail_after(CAP):
        async with running(cfg()) as (vm, port):
            bad = await Client.connect(port, handshake=False)
            await bad.stream.send_all(garbage)
            assert await bad.packet() is None
            await bad.aclose()
            good = await connect_retrying(port)
            await good.expect_silence_then_helo()
            await good.aclose()
            assert vm.connections_accepted == 2


async def test_bad_packet_length_closes_and_the_sim_keeps_serving():
    with trio.fail_after(CAP):
        async with running(cfg()) as (_vm, port):
            bad = await Client.connect(port)
            await bad.stream.send_all(struct.pack(">IIBBB", 7, 1, 0, 1, 1))  # length < 11
            assert await bad.packet() is None
            await bad.aclose()
            flags = await connect_retrying(port)
            await flags.stream.send_all(struct.pack(">IIBBB", 11, 1, 0x42, 1, 1))  # bad flags
            assert await flags.packet() is None
            await flags.aclose()
            good = await connect_retrying(port)
            await good.expect_silence_then_helo()
            await good.aclose()


async def test_random_commands_never_crash_the_sim():
    rng = random.Random(1234)
    ddm_types = [int(t) for t in ChunkType if t != ChunkType.EXIT] + [0x51525354]
    with trio.fail_after(CAP):
        async with running(cfg(heap_mb=1)) as (vm, port):
            client = await Client.connect(port)
            for i in range(400):
                body = rng.randbytes(rng.choice((0, 1, 2, 4, 8, 13)))
                if rng.random() < 0.6:
                    chunk_type = rng.choice(ddm_types)
                    length = len(body) if rng.random() < 0.8 else rng.randrange(64)
                    data = struct.pack(">II", chunk_type, length) + body
                    packet = CommandPacket(i + 1, 199, 1, data)
                else:
                    command_set, command = rng.randrange(1, 20), rng.randrange(1, 25)
                    if (command_set, command) in ((1, 6), (1, 10)):  # Dispose, Exit
                        continue
                    packet = CommandPacket(i + 1, command_set, command, body)
                await client.send(packet)
            await client.expect_silence_then_helo_eventually()
            await client.aclose()
            assert not vm.statistics().exited


async def test_handshake_deadline():
    with trio.fail_after(CAP):
        async with running(cfg(handshake_timeout=0.2)) as (_, port):
            silent = await Client.connect(port, handshake=False)
            assert await silent.packet() is None  # closed after the deadline
            await silent.aclose()
            good = await connect_retrying(port)
            await good.aclose()


async def test_client_vanishing_mid_dump_does_not_hurt_the_sim():
    with trio.fail_after(CAP):
        async with running(cfg(heap_mb=16)) as (vm, port):
            client = await Client.connect(port)
            assert await client.call_unanswered(HeapSegmentRequest(1, 0)) == []
            await client.aclose()
            await vm.force_gc()  # pushes into a closed connection: dropped quietly
            good = await connect_retrying(port)
            await good.expect_silence_then_helo()
            await good.aclose()


async def test_serve_many_runs_every_vm():
    with trio.fail_after(CAP):
        configs = [cfg(pid=1000 + i, app_name=f"com.example.app{i}") for i in range(5)]
        async with trio.open_nursery() as nursery:
            vms = await nursery.start(serve_many, configs)
            assert len({vm.port for vm in vms}) == 5
            for i, vm in enumerate(vms):
                client = await Client.connect(vm.port)
                _, (helo,) = await client.call(HeloRequest(1))
                assert isinstance(helo, HeloReply)
                assert (helo.pid, helo.app_name) == (1000 + i, f"com.example.app{i}")
                await client.aclose()
            nursery.cancel_scope.cancel()


async def test_periodic_gc_and_churn_run_by_themselves():
    with trio.fail_after(CAP):
        config = cfg(gc_interval=0.05, churn_interval=0.05)
        async with session(config) as (vm, client):
            await client.call_unanswered(ThreadNotify(True))
            await client.call_unanswered(HeapInfoRequest(3))
            seen: set[int] = set()
            while not {ChunkType.HPIF, ChunkType.THCR} <= seen:
                seen.add((await client.push()).chunk_type)
            assert vm.statistics().gcs >= 1


# --------------------------------------------------------------------------------------------
# The CLI command, as a real process


async def test_cli_prints_one_line_per_vm_and_exits_0_on_sigterm():
    with trio.fail_after(CAP):
        code = "from ddmd.sim import sim_command; sim_command()"
        args = [sys.executable, "-c", code, "--port", "0", "--count", "2", "--app", "com.ex.cli"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        run = partial(
            trio.run_process,
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            check=False,
        )
        async with trio.open_nursery() as nursery:
            proc = await nursery.start(run)
            assert proc.stdout is not None
            text = b""
            while text.count(b"listening on") < 2 or not text.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, text
                text += chunk
            lines = [ln for ln in text.decode().splitlines() if ln.startswith("sim VM")]
            assert lines[0].startswith("sim VM pid=4242 app=com.ex.cli1 listening on 127.0.0.1:")
            assert lines[1].startswith("sim VM pid=4249 app=com.ex.cli2 listening on 127.0.0.1:")
            port = int(lines[0].rsplit(":", 1)[1])
            client = await Client.connect(port)
            await client.expect_silence_then_helo()
            await client.aclose()
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


# --------------------------------------------------------------------------------------------
# ``ddmd demo``: which VMs it runs, and the commands it suggests


def test_demo_runs_art_dalvik_draft_and_android_12_vms():
    assert [(c.flavor, c.draft, c.is_dalvik) for c in demo.DEMO_VMS] == [
        ("art", False, False),
        ("legacy", True, True),
        ("modern", False, False),
    ]


def test_demo_hints_are_one_pasteable_command_per_line(tmp_path, monkeypatch):
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no user config file
    plain = demo.hint_lines(load_config(None, env=os.environ), 8700)
    config_file = tmp_path / "demo config.toml"
    config_file.write_text("")
    named = demo.hint_lines(load_config(config_file, env=os.environ), 8700)
    for lines in (plain, named):
        commands = [line for line in lines if not line.startswith("#")]
        assert commands[-1] == "jdb -attach localhost:8700"
        for line in commands:
            # nothing a shell would take as a comment, a pipe or a second command
            assert not any(mark in line for mark in ("#", "|", "&", ";")), line
            assert shlex.split(line)[0] in ("ddmd", "jdb")
    assert "ddmd clients" in plain
    assert not any("--config" in line for line in plain)
    # A config file the client commands would not find by themselves is named, quoted.
    for line in named:
        if line.startswith("ddmd "):
            words = shlex.split(line)
            assert words[words.index("--config") + 1] == str(config_file.resolve())
