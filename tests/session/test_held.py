"""A consumer's first command during a release is not lost (issue 31, item 9b), through the
whole session: a front socket that finished its handshake but has not debugged yet, or a
DDM-only client, sends a command while the last debugger's release is under way. It is held
and taken, in order, once the VM is usable again: after DBGD is acknowledged (ART), after the
release on the kept connection (a plain JVM: ``test_keep.py``), or on the new connection when
the release falls back to a reconnect; if the VM goes away instead it is answered VM_DEAD.
"""

from __future__ import annotations

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import HANDSHAKE, encode
from ddmd.session.commands import CloseDebugger, Reconnect, SendToDebugger, SendToVm
from ddmd.session.consumers import FRONT
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    Tick,
    VmBytes,
    VmClosed,
    VmConnected,
)
from tests.session.test_vm_session import Vm, answer, asks, attach, cmd, plain_jvm, ready, reply

LEFT = "debugger closed the connection"
RECYCLED = "recycled after the debugger left"
ALL_THREADS = (1, 4)
ID_SIZES = (1, 7)
SET = (15, 1)
CLEAR = (15, 2)
SIZES = bytes.fromhex("00000008" * 5)


def front(vm: Vm, consumer: int) -> Vm:
    """A socket of the adb front, its handshake done, nothing debugged yet."""
    assert (
        vm.book()
        >> ConsumerJoined(consumer, "front", f"127.0.0.1:{41000 + consumer}", kind=FRONT)
        >> ConsumerBytes(consumer, HANDSHAKE)
        << SendToDebugger(consumer, HANDSHAKE)
    )
    return vm


def test_art_a_first_command_during_dbgd_is_held_and_sent_once_acknowledged() -> None:
    vm = front(attach(ready(), 1), 2)
    assert (
        vm.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> ConsumerBytes(2, cmd(3, ALL_THREADS))  # held: not "the VM is not connected"
        >> ConsumerBytes(2, cmd(5, ALL_THREADS))  # and the next one after it
        >> answer(6, ddm.Dbgd())
        << SendToVm(cmd(7, ALL_THREADS))
        << SendToVm(cmd(8, ALL_THREADS))
        >> VmBytes(reply(7, b"\x00\x00\x00\x00"))
        << SendToDebugger(2, reply(3, b"\x00\x00\x00\x00"))
    )


def test_art_held_commands_go_out_on_the_new_connection_when_dbgd_is_not_acknowledged() -> None:
    vm = front(attach(ready(), 1), 2)
    assert (
        vm.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> ConsumerBytes(2, cmd(3, ALL_THREADS))
        >> Tick(1.0)
        << Reconnect(RECYCLED)
        >> VmConnected(2.0)
        << SendToVm(cmd(7, ALL_THREADS))
        << asks(8, ddm.HeloRequest(1))
    )


def test_art_held_commands_are_refused_when_the_vm_never_comes_back() -> None:
    vm = front(attach(ready(), 1), 2)
    assert (
        vm.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> ConsumerBytes(2, cmd(3, ALL_THREADS))
        >> Tick(1.0)
        << Reconnect(RECYCLED)
        >> VmClosed("reconnect failed")
        << SendToDebugger(2, reply(3, error=112))  # VM_DEAD, then closed
        << CloseDebugger(2, "the VM disconnected")
    )


def test_a_ddm_only_client_s_request_during_dbgd_is_relayed_once_acknowledged() -> None:
    vm = front(attach(ready(), 1), 2)
    gc = encode(ddm.ddm_command(0x40000001, ddm.GcRequest()))
    assert (
        vm.book()
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> ConsumerBytes(2, gc)  # held: not dropped without a reply
        >> answer(6, ddm.Dbgd())
        << SendToVm(encode(ddm.ddm_command(7, ddm.GcRequest())))
        >> VmBytes(reply(7))
        << SendToDebugger(2, reply(0x40000001))
    )


def test_plain_jvm_a_first_command_during_the_release_is_held_and_sent_after_it() -> None:
    vm = front(attach(plain_jvm(), 1), 2)
    set_bp = bytes([2, 2]) + (0).to_bytes(4, "big")  # a breakpoint, suspend all
    assert (
        vm.book()
        >> ConsumerBytes(1, cmd(1, SET, set_bp))
        << SendToVm(cmd(3, SET, set_bp))
        >> VmBytes(reply(3, (5).to_bytes(4, "big")))
        << SendToDebugger(1, reply(1, (5).to_bytes(4, "big")))
        >> ConsumerLeft(1, LEFT)
        << CloseDebugger(1, "left")
        << SendToVm(cmd(4, CLEAR, bytes([2]) + (5).to_bytes(4, "big")))  # the release
        >> ConsumerBytes(2, cmd(3, ALL_THREADS))  # held: not "the VM is not connected"
        >> VmBytes(reply(4))  # the release is confirmed
        << SendToVm(cmd(5, ALL_THREADS))
        >> VmBytes(reply(5, b"\x00\x00\x00\x00"))
        << SendToDebugger(2, reply(3, b"\x00\x00\x00\x00"))
    )
    assert vm.session.state == "ready"
