"""The routing rules of one VM connection, rule by rule, as Playbooks: no event loop, no sockets.

``RouterHarness.handle`` maps session inputs onto the router the way the VM session does, and
records what reached ddmd's own side (``on_reply``, ``on_push``) so a test can check that too.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from ddmd.protocol.ddm import ChunkType, ThreadCreated, ddm_command
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    CommandPacket,
    CommandSet,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
)
from ddmd.session.commands import CloseDebugger, Command, Log, SendToDebugger, SendToVm
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.router import Router
from tests.session.playbook import Placeholder, Playbook
from tests.session.relaying import lane_from_debugger, lane_from_vm

VM = CommandSet.VIRTUAL_MACHINE
VERSION = (VM, VirtualMachineCommand.VERSION)
ID_SIZES = (VM, VirtualMachineCommand.ID_SIZES)
DISPOSE = (VM, VirtualMachineCommand.DISPOSE)
SIZES = bytes.fromhex("00000008" * 5)


def cmd(packet_id: int, command: tuple[int, int], data: bytes = b"") -> bytes:
    return encode(CommandPacket(packet_id, command[0], command[1], data))


def reply(packet_id: int, data: bytes = b"", error: int = 0) -> bytes:
    return encode(ReplyPacket(packet_id, error, data))


def event(packet_id: int, data: bytes) -> bytes:
    return encode(CommandPacket(packet_id, CommandSet.EVENT, 100, data))


# Event.Composite VM_START: suspend policy ALL (2) or NONE (0), one event, requestID 0, thread 1.
VM_START_SUSPENDED = event(0, bytes.fromhex("02000000015a000000000000000000000001"))
VM_START_RUNNING = event(0, bytes.fromhex("00000000015a000000000000000000000001"))
BREAKPOINT = event(7, bytes.fromhex("0100000001020000000b") + bytes(8 + 17))


class RouterHarness:
    def __init__(self, **kw: Any) -> None:
        self.replies: list[tuple[Pending, ReplyPacket]] = []
        self.pushes: list[CommandPacket] = []
        self.left: list[tuple[int, bool, str]] = []
        self.router = Router(on_reply=self._on_reply, on_push=self._on_push, **kw)

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        self.replies.append((pending, packet))
        return []

    def _on_push(self, packet: CommandPacket) -> list[Command]:
        self.pushes.append(packet)
        return []

    def handle(self, item: Any) -> list[Command]:
        r = self.router
        if isinstance(item, VmConnected):
            return r.connected(item.leftover)
        if isinstance(item, VmBytes):
            return r.vm_data(item.data)
        if isinstance(item, VmClosed):
            r.disconnected()
            return []
        if isinstance(item, ConsumerJoined):
            return r.debugger_joined(item.consumer, item.via, item.peer)
        if isinstance(item, ConsumerBytes):
            out, leaving = r.debugger_data(item.consumer, item.data)
            if leaving is not None:
                out += self._leave(item.consumer, leaving)
            return out
        if isinstance(item, ConsumerLeft):
            return self._leave(item.consumer, item.reason)
        raise AssertionError(f"no such input {item!r}")

    def _leave(self, debugger: int, reason: str) -> list[Command]:
        attached, _, out = self.router.debugger_left(debugger)
        self.left.append((debugger, attached, reason))
        return out


def attached(harness: RouterHarness, *debuggers: int) -> Playbook:
    """A playbook with the VM connected and ``debuggers`` attached (handshakes done)."""
    playbook = Playbook(harness.handle) >> VmConnected(0.0)
    for d in debuggers:
        playbook = (
            playbook
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SendToDebugger(d, HANDSHAKE)
        )
    return playbook


# ------------------------------------------------------------------------------ handshakes


def test_handshake_is_answered_here_once_the_vm_is_ready() -> None:
    h = RouterHarness()
    assert attached(h, 1)
    assert h.router.attached() == (1,)


def test_handshake_waits_while_the_vm_is_not_connected() -> None:
    h = RouterHarness()
    assert (
        Playbook(h.handle)
        >> ConsumerJoined(1, "current", "127.0.0.1:40001")
        >> ConsumerBytes(1, HANDSHAKE)
        >> VmConnected(1.0)
        << SendToDebugger(1, HANDSHAKE)
    )


def test_a_handshake_split_anywhere_is_still_one_handshake() -> None:
    h = RouterHarness()
    playbook = Playbook(h.handle) >> VmConnected(0.0) >> ConsumerJoined(1, "vm-port", "p")
    for i in range(len(HANDSHAKE) - 1):
        playbook = playbook >> ConsumerBytes(1, HANDSHAKE[i : i + 1])
    assert playbook >> ConsumerBytes(1, HANDSHAKE[-1:]) << SendToDebugger(1, HANDSHAKE)


# ------------------------------------------------------------------------------ ids


def test_commands_get_fresh_vm_ids_and_replies_get_their_own_back() -> None:
    h = RouterHarness()
    assert (
        attached(h, 1, 2)
        # Both debuggers count from 1 (JDI does); the VM sees 1 and 2.
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(1, VERSION))
        >> ConsumerBytes(2, cmd(1, VERSION))
        << SendToVm(cmd(2, VERSION))
        # Replies in the other order, each to its sender with the sender's id.
        >> VmBytes(reply(2, b"two"))
        << SendToDebugger(2, reply(1, b"two"))
        >> VmBytes(reply(1, b"one"))
        << SendToDebugger(1, reply(1, b"one"))
    )
    assert len(h.router.ids) == 0


CLASS_BY_SIGNATURE = (CommandSet.REFERENCE_TYPE, 1)


def test_the_relay_lane_takes_only_packets_nothing_here_reads() -> None:
    """``relay_from_debugger``/``relay_from_vm`` (the driver calls them first, per packet)
    return the one command the general path would, or None with nothing changed."""
    h = RouterHarness()
    assert attached(h, 1)
    r = h.router
    # A debugger's plain command and its reply take the lane, ids rewritten both ways.
    assert lane_from_debugger(r, 1, cmd(7, CLASS_BY_SIGNATURE, b"x")) == SendToVm(
        cmd(1, CLASS_BY_SIGNATURE, b"x")
    )
    assert lane_from_vm(r, reply(1, b"answer")) == SendToDebugger(1, reply(7, b"answer"))
    assert len(r.ids) == 0
    # Not taken, and nothing changed: a VirtualMachine command (answered or cached here), a
    # piece of a packet, a reply to ddmd's own request, a debugger still in its handshake.
    assert lane_from_debugger(r, 1, cmd(8, VERSION)) is None
    assert lane_from_debugger(r, 1, cmd(8, CLASS_BY_SIGNATURE, b"xy")[:-1]) is None
    own = r.ids.allocate("ddmd", 5, CommandSet.DDM, 1, None)
    assert lane_from_vm(r, reply(own, b"chunk")) is None
    assert r.ids.get(own) is not None  # still pending: the general path resolves it
    assert r.vm_data(reply(own, b"chunk")) == []
    assert [p.id for _, p in h.replies] == [own]
    r.debugger_joined(2, "current", "p")
    assert lane_from_debugger(r, 2, cmd(1, CLASS_BY_SIGNATURE)) is None
    # A command split over two reads is not the lane's; the general path still relays it.
    whole = cmd(9, CLASS_BY_SIGNATURE, b"abc")
    assert r.debugger_data(1, whole[:5]) == ([], None)
    assert lane_from_debugger(r, 1, whole[5:]) is None
    out, leaving = r.debugger_data(1, whole[5:])
    assert leaving is None
    assert len(out) == 1
    assert isinstance(out[0], SendToVm)


def test_the_relay_lane_decides_without_changing_anything_until_the_commit() -> None:
    """The lane's decision (``relay_from_debugger``/``relay_from_vm``) is pure: it says what to
    write and changes nothing, so the driver writes the packet first; then one call
    (``relayed_from_debugger``/``relayed_from_vm``) does the bookkeeping: the id map and the
    counters change then, and only then."""
    h = RouterHarness()
    assert attached(h, 1)
    r = h.router

    def state() -> tuple[int, int, int, int, int, tuple[int, int, int, int] | None]:
        return (
            len(r.ids),
            r.packets_to_vm,
            r.bytes_to_vm,
            r.packets_to_debuggers,
            r.bytes_to_debuggers,
            r.debugger_statistics(1),
        )

    before = state()
    command = r.relay_from_debugger(1, cmd(7, CLASS_BY_SIGNATURE, b"x"))
    assert command is not None
    assert command[0] == cmd(1, CLASS_BY_SIGNATURE, b"x")  # what to write, under a fresh id
    assert state() == before  # nothing recorded, nothing counted
    assert r.ids.get(1) is None
    # Asked again, it decides the same: nothing moved.
    again = r.relay_from_debugger(1, cmd(7, CLASS_BY_SIGNATURE, b"x"))
    assert again is not None
    assert again[0] == command[0]
    r.relayed_from_debugger(command)  # written: now it is recorded
    assert state() == (1, 1, 12, 0, 0, (1, 0, 12, 0))
    pending = r.ids.get(1)
    assert pending is not None
    assert pending.original_id == 7

    before = state()
    answer = r.relay_from_vm(reply(1, b"answer"))
    assert answer is not None
    assert (answer[0], answer[1]) == (1, reply(7, b"answer"))  # to debugger 1, its own id
    assert state() == before  # the reply's entry is still pending, nothing counted
    assert r.ids.get(1) is pending
    r.relayed_from_vm(answer)
    assert state() == (0, 1, 12, 1, 17, (1, 1, 12, 17))
    # Not the lane's: None, and nothing to commit.
    assert r.relay_from_debugger(1, cmd(8, VERSION)) is None
    assert state() == (0, 1, 12, 1, 17, (1, 1, 12, 17))


def test_ddmd_s_own_ids_never_collide_with_a_debugger_s() -> None:
    h = RouterHarness()
    playbook = attached(h, 1)
    vm_id, _ = h.router.send_own("ddmd", CommandSet.DDM, 1, b"", deadline=5.0)
    assert vm_id == 1
    assert (
        playbook
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(2, VERSION))  # 1 is still ddmd's
        >> VmBytes(reply(1, b"ddm"))
        >> VmBytes(reply(2, b"jdwp"))
        << SendToDebugger(1, reply(1, b"jdwp"))
    )
    ((pending, packet),) = h.replies
    assert (pending.origin, packet.data) == ("ddmd", b"ddm")


def test_a_reply_to_an_unknown_id_is_logged_and_dropped() -> None:
    h = RouterHarness()
    assert (
        Playbook(h.handle, logs=True)
        >> VmConnected(0.0)
        >> VmBytes(reply(99))
        << Log("ddm.reply_unknown", fields={"id": 99, "error": 0})
    )


def test_reply_packets_from_a_debugger_never_reach_the_vm() -> None:
    h = RouterHarness()
    assert (
        Playbook(h.handle, logs=True)
        >> VmConnected(0.0)
        >> ConsumerJoined(1, "vm-port", "p")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
        << Log("debugger.attached", fields=Placeholder())
        >> ConsumerBytes(1, reply(5))
        << Log("debugger.reply_dropped", fields={"debugger": 1, "id": 5, "error": 0})
    )


# ------------------------------------------------------------------------------ events


def test_events_go_to_the_attached_debugger_unchanged() -> None:
    h = RouterHarness()
    assert attached(h, 1) >> VmBytes(BREAKPOINT) << SendToDebugger(1, BREAKPOINT)


def test_a_suspending_vm_start_is_kept_for_the_first_debugger() -> None:
    h = RouterHarness()
    assert (
        Playbook(h.handle)
        >> VmConnected(0.0, leftover=VM_START_SUSPENDED)
        >> ConsumerJoined(1, "current", "p")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
        << SendToDebugger(1, VM_START_SUSPENDED)
    )


def test_a_vm_start_of_a_running_vm_is_not_kept() -> None:
    h = RouterHarness()
    assert (
        Playbook(h.handle)
        >> VmConnected(0.0, leftover=VM_START_RUNNING)
        >> ConsumerJoined(1, "current", "p")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
    )


def test_ddm_pushes_stay_with_ddmd() -> None:
    h = RouterHarness()
    push = encode(ddm_command(0x80000001, ThreadCreated(1, "main")))
    assert attached(h, 1) >> VmBytes(push)
    (packet,) = h.pushes
    assert packet.data[:4] == ChunkType.THCR.to_bytes(4, "big")


# ------------------------------------------------------------------------------ local answers


def test_dispose_is_answered_here_and_the_debugger_leaves() -> None:
    h = RouterHarness()
    assert (
        attached(h, 1)
        >> ConsumerBytes(1, cmd(9, DISPOSE))
        << SendToDebugger(1, reply(9))
        << CloseDebugger(1, "left")
    )
    assert h.left == [(1, True, "VirtualMachine.Dispose")]


def test_id_sizes_are_asked_once_then_answered_from_the_cache() -> None:
    h = RouterHarness()
    assert (
        attached(h, 1)
        >> ConsumerBytes(1, cmd(1, ID_SIZES))
        << SendToVm(cmd(1, ID_SIZES))
        >> VmBytes(reply(1, SIZES))
        << SendToDebugger(1, reply(1, SIZES))
        >> ConsumerBytes(1, cmd(3, ID_SIZES))
        << SendToDebugger(1, reply(3, SIZES))
    )


def test_version_is_asked_once_then_answered_from_the_cache() -> None:
    h = RouterHarness()
    version = b"\x00\x00\x00\x03abc" + bytes(8) + b"\x00\x00\x00\x00" * 2
    assert (
        attached(h, 1, 2)
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(1, VERSION))
        >> VmBytes(reply(1, version))
        << SendToDebugger(1, reply(1, version))
        >> ConsumerBytes(2, cmd(9, VERSION))
        << SendToDebugger(2, reply(9, version))
    )


# ------------------------------------------------------------------------------ leaving


def test_a_departed_debugger_s_replies_go_nowhere() -> None:
    h = RouterHarness()
    assert (
        attached(h, 1, 2)
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(1, VERSION))
        >> ConsumerLeft(1, "killed")
        << CloseDebugger(1, "left")
        >> VmBytes(reply(1, b"late"))  # nothing for debugger 2, nothing for ddmd
    )
    assert h.replies == []
    assert len(h.router.ids) == 0


def test_late_replies_of_a_departed_debugger_are_dropped_without_a_line_each() -> None:
    """A slow reader dropped with thousands of commands outstanding must not log thousands of
    lines: one line when it leaves, none per late reply; a truly unknown id is still logged."""
    h = RouterHarness()
    r = h.router
    assert attached(h, 1, 2)
    for n in range(1, 51):
        r.debugger_data(1, cmd(n, CLASS_BY_SIGNATURE, b"x"))
    _, _, left = r.debugger_left(1)
    (abandoned,) = [
        c for c in left if isinstance(c, Log) and c.event == "debugger.replies_abandoned"
    ]
    assert abandoned.event == "debugger.replies_abandoned"
    assert abandoned.fields == {"debugger": 1, "outstanding": 50}
    late = [c for n in range(1, 51) for c in r.vm_data(reply(n, b"late"))]
    assert late == []
    (unknown,) = r.vm_data(reply(4242, b"?"))
    assert isinstance(unknown, Log)
    assert unknown.event == "ddm.reply_unknown"


def test_a_departure_in_the_middle_of_a_streamed_reply_drops_the_rest() -> None:
    h = RouterHarness(stream_threshold=64)
    big = b"x" * 1000
    header = Placeholder("header")
    playbook = (
        attached(h, 1)
        >> ConsumerBytes(1, cmd(1, VERSION))
        << SendToVm(cmd(1, VERSION))
        >> VmBytes(reply(1, big)[:100])
        << SendToDebugger(1, header, more=True)
        << SendToDebugger(1, Placeholder("piece"), more=True)
    )
    assert playbook
    assert header.value[:4] == (11 + 1000).to_bytes(4, "big")
    assert (
        playbook
        >> ConsumerLeft(1, "slow consumer")
        << CloseDebugger(1, "left")
        >> VmBytes(reply(1, big)[100:])
        # The next packet is routed normally again: the relay ended with the big one.
        >> VmBytes(reply(77))
    )


def test_a_streamed_reply_reaches_its_debugger_whole() -> None:
    h = RouterHarness(stream_threshold=64)
    big = bytes(range(256)) * 4
    sent: list[bytes] = []
    out = attached(h, 1)
    assert out >> ConsumerBytes(1, cmd(5, VERSION)) << SendToVm(cmd(1, VERSION))
    data = reply(1, big)
    for i in range(0, len(data), 37):
        for command in h.router.vm_data(data[i : i + 37]):
            assert isinstance(command, SendToDebugger)
            sent.append(command.data)
    assert b"".join(sent) == reply(5, big)


def test_the_end_of_the_vm_connection_fails_every_pending_command() -> None:
    h = RouterHarness()
    assert attached(h, 1) >> ConsumerBytes(1, cmd(1, VERSION)) << SendToVm(cmd(1, VERSION))
    h.router.send_own("ddmd", CommandSet.DDM, 1, b"", deadline=5.0)
    dropped = h.router.disconnected()
    assert [p.vm_id for p in dropped] == [1, 2]
    assert len(h.router.ids) == 0
    assert h.router.ready is False


# ------------------------------------------------------------------------------ boundary


def test_importing_the_session_loads_no_io_library() -> None:
    code = (
        "import sys, ddmd.session.router, ddmd.session.inputs, ddmd.session.commands;"
        "bad = {'trio', 'structlog', 'adbutils', 'httpx', 'starlette'} & set(sys.modules);"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_boundary_check_does_see_trio_when_it_is_loaded() -> None:
    code = "import sys, trio, ddmd.session.router; assert 'trio' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
