"""The relay lane in threads (``ddmd.drive.threadlane``), in the real daemon with a ``SimVm``.

While a VM has a debugger, its socket and the debugger's are read by threads that pass on the
packets no rule reads; everything else is handed to the event loop, in order. These tests run
the daemon in-process (``rawpeers.monitor``) with a scripted debugger on a real loopback socket.
Every test has an absolute ``fail_after`` cap; conditions are polled, never slept on.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import pytest
import trio

from ddmd.protocol.jdwp import CommandPacket, CommandSet, VirtualMachineCommand, encode
from ddmd.registry import VmHandle
from ddmd.sim import SimConfig, SimVm
from tests.actors.fakepeers import FakeDebugger
from tests.actors.rawpeers import QUIET_SIM, Harness, free_port_range, monitor, wait_until
from tests.actors.test_bridge_sim import (
    PID,
    attach,
    receive_replies,
    start_sim,
    vm_id,
    wait_ready,
)

CAP = 20
WAIT = 5
VM = CommandSet.VIRTUAL_MACHINE
THREAD = CommandSet.THREAD_REFERENCE
V = VirtualMachineCommand


def relay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ddmd relay"]


def counts(h: Harness, port: int) -> dict[str, int]:
    handle: VmHandle | None = h.started.registry.get(vm_id(port))
    assert handle is not None
    return handle.bridge_statistics()  # type: ignore[attr-defined,no-any-return]


async def thread_ids(debugger: Any, packet_id: int) -> list[bytes]:
    await debugger.send(CommandPacket(packet_id, VM, V.ALL_THREADS, b""))
    (reply,) = await receive_replies(debugger, 1)
    (n,) = struct.unpack_from(">i", reply.data)
    return [reply.data[4 + 8 * i : 12 + 8 * i] for i in range(n)]


async def attached_through_the_thread(h: Harness, port: int) -> Any:
    """A debugger on the current-VM port whose socket the VM's relay thread reads."""
    await wait_ready(h, port)
    debugger = await attach(h.started.current_port)
    await thread_ids(debugger, 1)
    await wait_until(lambda: len(relay_threads()) == 1, WAIT, what="the relay thread")
    return debugger


def jstring(data: bytes) -> str:
    (n,) = struct.unpack_from(">i", data)
    return data[4 : 4 + n].decode()


@pytest.mark.parametrize("threads", [True, False], ids=["relay thread", "event loop only"])
async def test_an_attached_debuggers_traffic_takes_the_relay_thread(tmp_path, threads) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        settings = {
            "debugger": {"relay_threads": threads},
            "monitor": {"always_poll_threads": True},
        }
        async with monitor([port], tmp_path, **settings) as h:
            sim = await start_sim(h, port)
            await wait_ready(h, port)
            debugger = await attach(h.started.current_port)
            await h.wait_event("debugger.attached", vm=vm_id(port), via="current")
            tids = await thread_ids(debugger, 1)
            names = set()
            for i in range(40):
                await debugger.send(CommandPacket(100 + i, THREAD, 1, tids[i % len(tids)]))
                (reply,) = await receive_replies(debugger, 1)
                assert (reply.id, reply.error_code) == (100 + i, 0)
                names.add(jstring(reply.data))
            assert "main" in names
            assert len(names) == len(tids)
            seen = counts(h, port)
            if threads:
                # Both ways: the commands (debugger's thread) and the replies (the VM's).
                assert seen["thread_relayed"] >= 2 * 40 - 4, seen
                assert relay_threads()
            else:
                assert seen["thread_relayed"] == seen["thread_handed"] == 0
                assert not relay_threads()
            # ddmd's own DDM goes on meanwhile, through the event loop.
            polled = sim.statistics().thst_requests
            await wait_until(lambda: sim.statistics().thst_requests >= polled + 2, WAIT)
            await debugger.stream.aclose()
            await h.wait_event("debugger.detached", vm=vm_id(port))
            # With no debugger left, the VM is read by the event loop again: no thread stays.
            await wait_until(lambda: not relay_threads(), WAIT, what="relay threads ended")
            await wait_ready(h, port)
            stats = sim.statistics()
            assert stats.replies_received == 0
            assert stats.duplicate_outstanding_ids == 0


async def test_a_slow_lane_command_is_done_before_a_fast_one_sent_right_after_it(tmp_path):
    """ThreadReference.Suspend goes through the suspension ledger in the event loop; Status,
    sent at once after it, takes the relay thread, and must still reach the VM after it."""
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await start_sim(h, port)
            await wait_ready(h, port)
            debugger = await attach(h.started.current_port)
            await h.wait_event("debugger.attached", vm=vm_id(port), via="current")
            tids = await thread_ids(debugger, 1)
            for round_, tid in enumerate(tids):
                base = 1000 + 10 * round_
                await debugger.send(CommandPacket(base, THREAD, 2, tid))  # Suspend
                await trio.sleep(0.002)  # most often two reads of ddmd's, not one
                await debugger.send(CommandPacket(base + 1, THREAD, 4, tid))  # Status
                replies = await receive_replies(debugger, 2)
                assert [r.id for r in replies] == [base, base + 1]
                _status, suspended = struct.unpack(">ii", replies[1].data)
                assert suspended == 1, f"Status overtook Suspend for thread {round_}"
                await debugger.send(CommandPacket(base + 2, THREAD, 3, tid))  # Resume
                (resumed,) = await receive_replies(debugger, 1)
                assert resumed.error_code == 0
            assert counts(h, port)["thread_relayed"] > 0


async def test_a_debugger_that_leaves_while_the_thread_waits_is_seen_at_once(tmp_path) -> None:
    (port,) = free_port_range(2)[:1]
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await start_sim(h, port)
            debugger = await attached_through_the_thread(h, port)
            await debugger.stream.aclose()
            left = await h.wait_event("debugger.detached", vm=vm_id(port))
            assert left["reason"] == "debugger closed the connection"
            await wait_until(lambda: not relay_threads(), WAIT, what="relay threads ended")


async def test_the_vm_going_away_ends_the_thread_and_the_debugger(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim_scope = trio.CancelScope()

            async def run_sim() -> None:
                with sim_scope:  # cancelling it ends the VM process
                    await SimVm(SimConfig(port=port, pid=PID, threads=9, **QUIET_SIM)).run()

            h.peers.start_soon(run_sim)
            debugger = await attached_through_the_thread(h, port)
            sim_scope.cancel()  # the VM process ends: its listener and connection close
            assert await debugger.receive() is None  # ddmd closes the debugger's connection
            await wait_until(lambda: h.started.registry.get(vm_id(port)) is None, WAIT)
            await wait_until(lambda: not relay_threads(), WAIT, what="relay threads ended")


async def test_stopping_the_daemon_ends_a_thread_blocked_in_its_wait(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await start_sim(h, port)
            debugger = await attached_through_the_thread(h, port)
        # monitor() stopped the daemon: its nursery could only end once the thread had.
        assert not relay_threads()
        assert await debugger.receive() is None


def kernel_buffer_limit(name: str) -> int:
    """The largest buffer the kernel lets a TCP socket grow to (``tcp_rmem``/``tcp_wmem``'s
    maximum), or a generous guess where /proc does not say."""
    try:
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 64 << 20


async def attach_reading_little(port: int) -> FakeDebugger:
    """A debugger whose receive buffer is as small as the kernel allows, set before it connects
    (the window is agreed in the handshake): what it does not read fills it at once."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 1)
    await sock.connect(("127.0.0.1", port))
    debugger = FakeDebugger(trio.SocketStream(sock))
    await debugger.handshake()
    return debugger


async def test_a_reply_the_debugger_does_not_read_is_queued_by_the_event_loop(tmp_path) -> None:
    """A debugger that stops reading: the relay thread's write is partial or refused, the
    rest goes to the event loop's queue, and the slow-consumer rule still applies. How many
    unread replies that takes depends on the kernel's buffers, which differ between machines:
    the debugger's receive buffer is made small, and the bound on commands sent is made from
    the largest send buffer the kernel allows ddmd's socket (``tcp_wmem``), not a guess."""
    (port,) = free_port_range(1)
    with trio.fail_after(CAP * 3):
        queue = {"debugger": {"queue_packets": 64}}
        async with monitor([port], tmp_path, **queue) as h:
            await start_sim(h, port)
            await wait_ready(h, port)
            debugger = await attach_reading_little(h.started.current_port)
            tids = await thread_ids(debugger, 1)
            reply = 11 + 4 + 8 * len(tids)  # an AllThreads reply: header, count, thread ids
            rcvbuf = debugger.stream.socket.getsockopt(
                trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF
            )
            most = 2 * (rcvbuf + kernel_buffer_limit("tcp_wmem")) // reply + 2 * 64 + 1000
            # Commands pipelined, replies never read: the socket buffers fill, then the queue.
            for i in range(most):
                try:
                    await debugger.send(CommandPacket(10 + i, VM, V.ALL_THREADS, b""))
                except trio.BrokenResourceError:
                    break  # ddmd dropped it already
                if i % 64 == 0 and h.events("debugger.slow_consumer"):
                    break
            await h.wait_event("debugger.slow_consumer")
            await h.wait_event("debugger.detached", vm=vm_id(port))
            assert counts(h, port)["thread_handed"] > 0
            await wait_until(lambda: not relay_threads(), WAIT, what="relay threads ended")


async def test_packets_cut_anywhere_and_packed_together_come_through_the_thread(tmp_path) -> None:
    """The thread's reads are not packets: a command a byte at a time, two in one write, and
    one cut across two writes all reach the VM whole and are answered in order."""
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await start_sim(h, port)
            debugger = await attached_through_the_thread(h, port)
            tids = await thread_ids(debugger, 1)
            name = [encode(CommandPacket(10 + i, THREAD, 1, tids[0])) for i in range(4)]
            before = counts(h, port)
            for byte in name[0]:  # a byte at a time: most of them separate reads
                await debugger.send_raw(bytes([byte]))
                await trio.sleep(0.001)
            await debugger.send_raw(name[1] + name[2][:5])  # one whole, one cut
            await trio.sleep(0.01)
            await debugger.send_raw(name[2][5:] + name[3])
            replies = await receive_replies(debugger, 4)
            assert [r.id for r in replies] == [10, 11, 12, 13]
            assert {jstring(r.data) for r in replies} == {"main"}
            # The general path took the cut reads in the thread itself: nothing was handed on.
            after = counts(h, port)
            assert after["thread_relayed"] >= before["thread_relayed"] + 5  # 5 reads at the least
            assert after["thread_handed"] == before["thread_handed"]
