"""The debugger bridge multiplexing one VM connection, checked without a JDK.

The real daemon (``rawpeers.monitor``: free loopback ports, scan interval 0.2 s, structlog
events captured) scans a ``SimVm``; a scripted debugger (``fakepeers.FakeDebugger``, built
from ``ddmd.protocol``) talks to the current-VM port over a real loopback socket, while ddmd
keeps polling THST on the same VM connection. The sim counts what reaches it: every id ddmd
writes must be fresh (``duplicate_outstanding_ids``) and no reply packet may ever reach a VM
(``replies_received``). Every test has an absolute ``fail_after`` cap; conditions are polled
with ``wait_until``, never slept on.
"""

from __future__ import annotations

import struct
from typing import Any

import trio

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    CommandPacket,
    CommandSet,
    ReplyPacket,
    VirtualMachineCommand,
)
from ddmd.sim import SimConfig, SimVm
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until

CAP = 15  # seconds: absolute cap on every test
WAIT = 5

VM = CommandSet.VIRTUAL_MACHINE
V = VirtualMachineCommand
THREADS = 9
PID = 5150


def vm_id(port: int) -> str:
    return f"tcp:{port}"


async def start_sim(h: Harness, port: int, **kw: Any) -> SimVm:
    if "app_name" in kw:
        kw.setdefault("package_name", kw["app_name"])
    return await h.start_sim(port, pid=kw.pop("pid", PID), threads=THREADS, **kw)


async def wait_ready(h: Harness, port: int) -> dict[str, Any]:
    return await h.wait_vm(
        vm_id(port), lambda v: v["state"] == "ready" and v["debugger_port"] is not None
    )


async def attach(port: int) -> FakeDebugger:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    debugger = FakeDebugger(stream)
    await debugger.handshake()
    return debugger


async def receive_replies(
    debugger: FakeDebugger, count: int, pushes: list[CommandPacket] | None = None
) -> list[ReplyPacket]:
    """The next ``count`` replies; fails on any command (event, DDM push) arriving instead,
    except DDM pushes when ``pushes`` collects them."""
    replies: list[ReplyPacket] = []
    while len(replies) < count:
        packet = await debugger.receive()
        assert packet is not None, f"EOF after {len(replies)} of {count} replies"
        if pushes is not None and isinstance(packet, CommandPacket) and packet.command_set == 199:
            pushes.append(packet)
            continue
        assert isinstance(packet, ReplyPacket), f"unexpected packet for the debugger: {packet}"
        replies.append(packet)
    return replies


async def expect_refused(port: int) -> None:
    """ddmd accepts and closes at once: no handshake echo, just EOF (or a reset)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    try:
        await stream.send_all(HANDSHAKE)
        while data := await stream.receive_some(4096):
            received += data
    except trio.BrokenResourceError:
        pass
    finally:
        await stream.aclose()
    assert received == b"", received


def read_jstring(data: bytes, offset: int = 0) -> str:
    (size,) = struct.unpack_from(">I", data, offset)
    return data[offset + 4 : offset + 4 + size].decode()


async def test_debugger_ids_and_ddm_are_multiplexed_with_ddmds_own(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, monitor={"always_poll_threads": True}) as h:
            sim = await start_sim(h, port)
            await wait_ready(h, port)
            debugger = await attach(h.started.current_port)
            await h.wait_event("debugger.attached", vm=vm_id(port), via="current")

            # Pipelined commands whose ids collide with ddmd's own (its counter also starts
            # at 1) and with Google's tools (0x40000000 up), one id reused by the debugger
            # itself, and a DDM request of the debugger's own.
            helo = ddm.ddm_command(3, ddm.HeloRequest(1))
            sent = [
                CommandPacket(1, VM, V.ID_SIZES, b""),
                CommandPacket(2, VM, V.VERSION, b""),
                CommandPacket(0x40000001, VM, V.ALL_THREADS, b""),
                helo,
                CommandPacket(7, VM, V.VERSION, b""),
                CommandPacket(7, VM, V.TOP_LEVEL_THREAD_GROUPS, b""),
            ]
            for packet in sent:
                await debugger.send(packet)
            pushes: list[CommandPacket] = []
            replies = await receive_replies(debugger, len(sent), pushes)
            assert sorted(r.id for r in replies) == sorted(p.id for p in sent)
            assert all(r.error_code == 0 for r in replies), replies
            by_id: dict[int, list[ReplyPacket]] = {}
            for reply in replies:
                by_id.setdefault(reply.id, []).append(reply)
            (sizes,) = by_id[1]
            assert struct.unpack(">5i", sizes.data) == (8, 8, 8, 8, 8)
            (version,) = by_id[2]
            assert "ddmd sim" in read_jstring(version.data)
            (threads,) = by_id[0x40000001]
            assert struct.unpack_from(">i", threads.data)[0] == THREADS
            # The debugger's HELO got the VM's HELO reply, under the debugger's id.
            (hello,) = by_id[3]
            (chunk,) = ddm.chunks_of(hello, ddm.Direction.FROM_VM)
            assert isinstance(chunk, ddm.HeloReply)
            assert chunk.pid == PID
            # Both commands with id 7 got their own reply (the VM saw two distinct ids).
            assert sorted(len(r.data) for r in by_id[7]) == sorted([len(by_id[2][0].data), 4 + 8])

            # ddmd's own DDM keeps working alongside: THST polls go on while attached...
            polled = sim.statistics().thst_requests
            await wait_until(
                lambda: sim.statistics().thst_requests >= polled + 3, WAIT, what="THST polls"
            )
            # ... and the VM's DDM pushes reach ddmd's model and, since this debugger speaks
            # DDM (its HELO), the debugger too: the thread notices of a churn, never an event.
            # The VM's socket and the debugger's are read apart (relay threads): the notices
            # may come after the reply to a command sent later, so replies are asked for until
            # they have come.
            await sim.churn()
            kinds: set[str] = set()
            for packet_id in range(9, 9 + 50):
                await debugger.send(CommandPacket(packet_id, VM, V.VERSION, b""))
                (reply,) = await receive_replies(debugger, 1, pushes)
                assert reply.id == packet_id
                kinds = {
                    ddm.type_name(c.chunk_type)
                    for p in pushes
                    for c in ddm.chunks_of(p, ddm.Direction.FROM_VM)
                }
                if {"THCR", "THDE"} & kinds:
                    break
                await trio.sleep(0.05)
            assert {"THCR", "THDE"} & kinds, kinds
            vm = await h.vm(vm_id(port))
            assert vm is not None
            assert vm["threads"] is not None
            assert vm["debugger"] is not None

            # A reply packet from the debugger is dropped and logged; the VM never sees it.
            await debugger.send(ReplyPacket(0x80000005, 0, b""))
            await debugger.send(CommandPacket(11, VM, V.VERSION, b""))
            (reply,) = await receive_replies(debugger, 1)
            assert reply.id == 11
            dropped = await h.wait_event("debugger.reply_dropped", vm=vm_id(port))
            assert dropped["id"] == 0x80000005

            stats = sim.statistics()
            assert stats.replies_received == 0
            assert stats.duplicate_outstanding_ids == 0
            assert stats.connections_accepted == 1
            assert not h.events("ddm.reply_unknown")

            # Dispose: ddmd answers it itself, ends the session and releases the VM.
            await debugger.send(CommandPacket(13, VM, V.DISPOSE, b""))
            (reply,) = await receive_replies(debugger, 1)
            assert (reply.id, reply.error_code, reply.data) == (13, 0, b"")
            assert await debugger.receive() is None
            await debugger.stream.aclose()
            await h.wait_event("ddm.dbgd_sent", vm=vm_id(port))
            await h.wait_event("vm.reconnected", vm=vm_id(port))
            await wait_until(
                lambda: sim.statistics().connections_accepted == 2, WAIT, what="reconnect"
            )
            stats = sim.statistics()
            assert stats.replies_received == 0
            assert stats.duplicate_outstanding_ids == 0


async def test_dbgd_acknowledged_keeps_the_connection(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim = await start_sim(h, port, ack_dbgd=True)
            await wait_ready(h, port)
            for round_ in range(2):
                debugger = await attach(h.started.current_port)
                await debugger.send(CommandPacket(1, VM, V.ID_SIZES, b""))
                await receive_replies(debugger, 1)
                await debugger.stream.aclose()  # gone without Dispose
                await wait_until(
                    lambda n=round_ + 1: len(h.events("ddm.dbgd_acknowledged")) == n,
                    WAIT,
                    what="DBGD acknowledged",
                )
            assert not h.events("vm.reconnecting")
            stats = sim.statistics()
            assert stats.connections_accepted == 1
            assert stats.replies_received == 0
            assert stats.duplicate_outstanding_ids == 0


async def test_current_port_refuses_with_a_reason(tmp_path) -> None:
    first, second = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor([first, second], tmp_path, debugger={"max_per_vm": 1}) as h:
            current_port = h.started.current_port
            # No VM at all.
            await expect_refused(current_port)
            (rejected,) = await wait_until(
                lambda: h.events("debugger.rejected"), WAIT, what="rejected"
            )
            assert rejected["vms"] == 0
            assert "no current VM" in rejected["reason"]
            assert "ddmd select" in rejected["reason"]

            # Two VMs, none selected.
            await start_sim(h, first, pid=11, app_name="com.example.one")
            await start_sim(h, second, pid=22, app_name="com.example.two")
            await wait_ready(h, first)
            await wait_ready(h, second)
            await expect_refused(current_port)
            rejected = (
                await wait_until(
                    lambda: h.events("debugger.rejected")[1:], WAIT, what="second rejection"
                )
            )[0]
            assert rejected["vms"] == 2
            assert "no current VM" in rejected["reason"]

            # Selected: the same port now reaches that VM.
            h.started.registry.select(vm_id(second))
            debugger = await attach(current_port)
            await debugger.send(ddm.ddm_command(1, ddm.HeloRequest(1)))
            (reply,) = await receive_replies(debugger, 1)
            (chunk,) = ddm.chunks_of(reply, ddm.Direction.FROM_VM)
            assert isinstance(chunk, ddm.HeloReply)
            assert chunk.pid == 22

            # A second debugger for the same VM is refused, naming the holder.
            await expect_refused(current_port)
            rejected = (
                await wait_until(
                    lambda: h.events("debugger.rejected")[2:], WAIT, what="third rejection"
                )
            )[0]
            attached = h.events("debugger.attached", vm=vm_id(second))[0]
            assert rejected["holder"] == attached["peer"]
            assert rejected["vm"] == vm_id(second)
            await debugger.send(CommandPacket(2, VM, V.VERSION, b""))
            await receive_replies(debugger, 1)  # the holder keeps working
            await debugger.stream.aclose()


async def test_sim_counts_reused_ids_and_replies_sent_to_it() -> None:
    """The counters the tests above rely on do see the faults they guard against."""
    sim = SimVm(SimConfig(churn_interval=0.0, gc_interval=0.0, heap_mb=1, threads=THREADS))
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(sim.run)
            client = await attach(port)
            await client.send(ddm.ddm_command(5, ddm.ThreadStatusRequest()))
            await client.send(CommandPacket(5, VM, V.VERSION, b""))  # id 5 again, at once
            await client.send(ReplyPacket(0x80000001, 0, b""))  # never valid towards a VM
            await client.send(CommandPacket(6, VM, V.ID_SIZES, b""))
            replies = await receive_replies(client, 3)
            assert [r.id for r in replies] == [5, 5, 6]
            stats = sim.statistics()
            assert stats.duplicate_outstanding_ids == 1
            assert stats.replies_received == 1
            assert stats.thst_requests == 1
            assert (stats.ddm_requests, stats.jdwp_requests) == (1, 2)
            await client.stream.aclose()
            nursery.cancel_scope.cancel()
