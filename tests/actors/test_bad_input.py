"""Misbehaving peers next to a healthy VM: each problem stays with its VM, and is logged.

Every test runs the real daemon over loopback with two ports in its scan range: a healthy
``SimVm`` and a scripted peer from ``rawpeers``. After the peer misbehaves, the healthy VM
must still answer (threads and heap), and a log event must name the bad VM and the problem.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
import trio

from ddmd.protocol.ddm import (
    ChunkType,
    FeatReply,
    HeapEnd,
    HeapInfo,
    HeapInfoEntry,
    HeapSegment,
    HeapStart,
    encode_chunk,
)
from ddmd.protocol.jdwp import CommandPacket
from tests.actors.rawpeers import (
    HELO,
    Harness,
    NotJdwpServer,
    PeerConnection,
    RawPeer,
    ddm_script,
    free_port_range,
    helo_chunk,
    monitor,
    raw_chunk,
    reply_with,
    wait_until,
)

CAP = 15  # seconds: absolute cap on every test


def vm_id(port: int) -> str:
    return f"tcp:{port}"


async def start_pair(h: Harness, sim_port: int) -> None:
    """The healthy VM; ready (identified, heap info in) before the bad peer starts."""
    await h.start_sim(sim_port, pid=4000, app_name="com.example.healthy")
    await h.wait_vm(vm_id(sim_port), lambda v: v["state"] == "ready" and bool(v["heaps"]))


async def assert_healthy(h: Harness, sim_port: int) -> None:
    """The healthy VM still answers: live thread states and heap info."""
    base = f"/api/v1/vms/{vm_id(sim_port)}"
    response = await h.client.get(f"{base}/threads")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["supported"] is True
    assert body["threads"]
    assert all(t["state"] is not None for t in body["threads"])
    response = await h.client.get(f"{base}/heap")
    assert response.status_code == 200, response.text
    assert response.json()["heaps"]
    vm = await h.vm(vm_id(sim_port))
    assert vm is not None
    assert vm["unsupported"] == []
    assert not h.events("vm.crashed")


async def test_non_jdwp_server_logged_once_and_backed_off(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor(
            [sim_port, bad_port], tmp_path, scan={"interval": 0.1, "backoff_max": 5.0}
        ) as h:
            await start_pair(h, sim_port)
            server = await h.start(NotJdwpServer(bad_port))
            await wait_until(lambda: len(server.accepted_at) >= 4, 8, what="four probes")
            await assert_healthy(h, sim_port)

        (logged,) = h.events("scan.port_not_jdwp")  # once, not at every probe
        assert logged["port"] == bad_port
        assert "HTTP/1.1 400" in logged["reason"]
        assert not h.events("vm.connected", vm=vm_id(bad_port))
        # Backed off: the delay between probes doubles (0.1, 0.2, 0.4 s at least). These are
        # lower bounds set by the scanner, so a slow machine only makes the gaps longer.
        times = server.accepted_at
        gaps = [b - a for a, b in itertools.pairwise(times)]
        for n, gap in enumerate(gaps[:3]):
            assert gap >= 0.1 * 2**n * 0.9, gaps


async def test_garbage_after_handshake_drops_that_vm(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)

    async def garbage(conn: PeerConnection) -> None:
        # A 19-byte "packet" whose flags byte is 'A' (0x41): neither command nor reply.
        await conn.send_raw(b"\x00\x00\x00\x13GARBAGE!\x00\x00\x00\x00\x00\x00\x00")
        await conn.wait_closed()

    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            peer = await h.start(RawPeer(bad_port, garbage))
            error = await h.wait_event("vm.protocol_error", vm=vm_id(bad_port))
            assert "flags" in error["error"]
            gone = await h.wait_event("vm.disconnected", vm=vm_id(bad_port))
            assert "protocol error" in gone["reason"]
            await wait_until(lambda: peer.closed >= 1, 5, what="ddmd closed the connection")
            await assert_healthy(h, sim_port)
            # The port keeps answering the handshake, but it is backed off (logged once), not
            # reconnected at every 0.2 s scan. The back-off before the third connection is at
            # least 2 x interval (a lower bound set by the logic: a slow machine only adds).
            await wait_until(lambda: peer.connections >= 3, 10, what="third reconnection")
            assert len(h.events("scan.backoff", port=bad_port)) == 1
            times = peer.accept_times
            assert times[2] - times[1] >= 2 * 0.2 - 0.01


async def test_packet_length_above_cap_drops_that_vm(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)

    async def huge(conn: PeerConnection) -> None:
        # An event (Event.Composite) of length 2**31: above the default 1 GiB [limits]
        # max_packet_bytes, and ddmd reads events whole. Nothing follows.
        await conn.send_raw(struct.pack(">IIBBB", 1 << 31, 0x80000001, 0, 64, 100))
        await conn.wait_closed()

    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            peer = await h.start(RawPeer(bad_port, huge))
            error = await h.wait_event("vm.protocol_error", vm=vm_id(bad_port))
            assert str(1 << 31) in error["error"]
            assert str(1 << 30) in error["error"]  # the cap it exceeds
            await h.wait_event("vm.disconnected", vm=vm_id(bad_port))
            await wait_until(lambda: peer.closed >= 1, 5, what="ddmd closed the connection")
            await assert_healthy(h, sim_port)


async def test_the_packet_cap_guards_what_ddmd_holds_not_what_it_streams(tmp_path) -> None:
    # Issue 21 item 4: with a 1 MiB cap, a 5 MiB heap dump streams to disk all the same, while
    # a 5 MiB reply that ddmd must read whole (to HELO) is refused in the decoder's words.
    sim_port, bad_port = free_port_range(2)
    size = 5 << 20
    big_helo = raw_chunk(HELO, bytes(size))

    with trio.fail_after(30):
        async with monitor(
            [sim_port, bad_port], tmp_path, limits={"max_packet_bytes": 1 << 20}
        ) as h:
            await h.start_sim(sim_port, hprof_bytes=size)
            await h.wait_vm(vm_id(sim_port), lambda v: v["state"] == "ready")
            response = await h.client.post(f"/api/v1/vms/{vm_id(sim_port)}/hprof")
            assert response.status_code == 200, response.text
            path = tmp_path / "captures" / response.json()["file"]
            assert path.stat().st_size == size
            assert not h.events("vm.protocol_error", vm=vm_id(sim_port))

            await h.start(RawPeer(bad_port, ddm_script({HELO: reply_with(big_helo)})))
            error = await h.wait_event("vm.protocol_error", vm=vm_id(bad_port))
            assert f"exceeds the configured cap {1 << 20}" in error["error"]
            assert str(11 + 8 + size) in error["error"]
            gone = await h.wait_event("vm.disconnected", vm=vm_id(bad_port))
            assert "protocol error" in gone["reason"]


async def test_vm_that_never_answers_helo_is_kept(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            peer = await h.start(RawPeer(bad_port, ddm_script({}, silent_default=True)))
            vm = await h.wait_vm(vm_id(bad_port), lambda v: v["unsupported"] == ["HELO"])
            assert vm["state"] == "ready"
            assert vm["ddm"] is None  # unknown: neither refused nor answered
            unsupported = await h.wait_event("vm.feature_unsupported", vm=vm_id(bad_port))
            assert unsupported["feature"] == "HELO"
            assert h.events("ddm.request_timed_out", vm=vm_id(bad_port), feature="HELO")
            await assert_healthy(h, sim_port)
            # Kept: still listed, same connection, and nothing beyond HELO was sent to it.
            assert await h.vm(vm_id(bad_port)) is not None
            assert peer.connections == 1
            assert peer.closed == 0
            assert peer.ddm_types() == ["HELO"]
            assert not h.events("vm.disconnected", vm=vm_id(bad_port))


async def test_vm_closing_in_the_middle_of_a_packet(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)
    reply = helo_chunk()

    async def half_then_close(conn: PeerConnection, packet: CommandPacket, data: bytes) -> None:
        whole = struct.pack(">IIBH", 11 + len(reply), packet.id, 0x80, 0) + reply
        await conn.send_raw(whole[: len(whole) // 2])
        await conn.stream.aclose()

    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            await h.start(RawPeer(bad_port, ddm_script({HELO: half_then_close})))
            error = await h.wait_event("vm.protocol_error", vm=vm_id(bad_port))
            assert "middle of a packet" in error["error"]
            gone = await h.wait_event("vm.disconnected", vm=vm_id(bad_port))
            assert "middle of a packet" in gone["reason"]
            await assert_healthy(h, sim_port)


async def test_chunk_overrunning_its_packet_is_ignored(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)

    async def helo(conn: PeerConnection, packet: CommandPacket, data: bytes) -> None:
        # Before the HELO reply: an APNM push that declares 100 bytes but carries 6.
        await conn.push(raw_chunk(ChunkType.APNM, b"\x00\x00\x00\x01\x00A", declared=100))
        await conn.reply(packet.id, helo_chunk(pid=6161, app="com.example.kept"))

    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            peer = await h.start(RawPeer(bad_port, ddm_script({HELO: helo})))
            malformed = await h.wait_event("ddm.chunk_malformed", vm=vm_id(bad_port))
            assert "APNM" in malformed["error"]
            assert "100" in malformed["error"]
            # The connection was kept: the HELO reply behind the bad chunk was read.
            vm = await h.wait_vm(vm_id(bad_port), lambda v: v["pid"] == 6161)
            assert vm["app"] == "com.example.kept"
            assert vm["ddm"] is True
            assert peer.connections == 1
            assert peer.closed == 0
            await assert_healthy(h, sim_port)


def helo_string_past_data() -> bytes:
    # vm ident declared as 1000 UTF-16 units, 4 bytes present.
    data = struct.pack(">IIII", 1, 7171, 1000, 3) + "Da".encode("utf-16-be")
    return raw_chunk(ChunkType.HELO, data)


def helo_odd_utf16() -> bytes:
    # app name: 3 units declared, 5 bytes present (an odd UTF-16 byte count), nothing after.
    vm_ident = "Dalvik v2.1.0".encode("utf-16-be")
    data = struct.pack(">IIII", 1, 7171, 13, 3) + vm_ident + "app".encode("utf-16-be")[:5]
    return raw_chunk(ChunkType.HELO, data)


@pytest.mark.parametrize(
    "reply", [helo_string_past_data(), helo_odd_utf16()], ids=["count_past_data", "odd_utf16"]
)
async def test_malformed_helo_reply(reply: bytes, tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            peer = await h.start(RawPeer(bad_port, ddm_script({HELO: reply_with(reply)})))
            malformed = await h.wait_event("ddm.chunk_malformed", vm=vm_id(bad_port))
            assert malformed["feature"] == "HELO"
            assert "HELO" in malformed["error"]
            assert "past the end" in malformed["error"]
            failed = await h.wait_event("vm.hello_failed", vm=vm_id(bad_port))
            assert "malformed answer" in failed["error"]
            assert "HELO" in failed["error"]  # the parser's detail, for the log
            # The VM is kept (still debuggable) and nothing crashed.
            vm = await h.wait_vm(vm_id(bad_port), lambda v: v["state"] == "ready")
            assert vm["pid"] is None
            assert peer.closed == 0
            await assert_healthy(h, sim_port)


async def test_heap_segments_that_do_not_add_up(tmp_path) -> None:
    sim_port, bad_port = free_port_range(2)
    start = 0x12C00000
    good = HeapSegment(1, 8, start, 0, 4, bytes([0x01, 1, 0x00, 1]))  # 2 used + 2 free units
    # Declares 100 units, the pairs describe 2 + 3 = 5.
    bad = HeapSegment(1, 8, start + 32, 0, 100, bytes([0x09, 1, 0x00, 2]))
    after = HeapSegment(1, 8, start + 2000, 0, 3, bytes([0x11, 2]))  # 3 units of class object

    async def gc(conn: PeerConnection, packet: CommandPacket, data: bytes) -> None:
        # A dump cut short (HPST, one segment, no HPEN), then a whole one with a bad segment.
        for chunk in (HeapStart(1), after, HeapStart(1), good, bad, after, HeapEnd(1)):
            await conn.push(encode_chunk(chunk))
        await conn.reply(packet.id)

    async def heap_info(conn: PeerConnection, packet: CommandPacket, data: bytes) -> None:
        if data[:1] == b"\x01":  # "now": pushed, then (ART 9+) no reply
            entry = HeapInfoEntry(1, 1_700_000_000_000, 1, 1 << 20, 1 << 20, 40, 2)
            await conn.push(encode_chunk(HeapInfo((entry,))))

    handlers: dict[int, Any] = {
        HELO: reply_with(helo_chunk(pid=8181, app="com.example.heap")),
        ChunkType.FEAT: reply_with(encode_chunk(FeatReply(()))),
        ChunkType.HPIF: heap_info,
        ChunkType.HPGC: gc,
    }
    with trio.fail_after(CAP):
        async with monitor([sim_port, bad_port], tmp_path) as h:
            await start_pair(h, sim_port)
            await h.start(RawPeer(bad_port, ddm_script(handlers, silent_default=True)))
            await h.wait_vm(vm_id(bad_port), lambda v: v["pid"] == 8181 and bool(v["heaps"]))
            url = f"/api/v1/vms/{vm_id(bad_port)}/heap"
            response = await h.client.get(url, params={"segments": "1"})
            assert response.status_code == 200, response.text
            (image,) = response.json()["images"]
            # The rest of the dump is used: two good segments, the bad one dropped.
            assert [s["address"] for s in image["segments"]] == [start, start + 2000]
            assert image["summary"]["bytes_used"] == (2 + 3) * 8
            assert image["summary"]["bytes_free"] == 2 * 8
            (problem,) = image["problems"]
            assert problem["code"] == "segment_rejected"
            assert "fewer than the declared 100" in problem["message"]
            await wait_until(lambda: len(h.events("heap.dump_problem", vm=vm_id(bad_port))) >= 2, 5)
            # Each problem is logged once, when it is found, with its code and message.
            logged = h.events("heap.dump_problem", vm=vm_id(bad_port))
            assert [e["code"] for e in logged] == ["restarted", "segment_rejected"]
            assert logged[1]["problem"] == problem["message"]
            assert not h.events("vm.crashed")
            await assert_healthy(h, sim_port)
