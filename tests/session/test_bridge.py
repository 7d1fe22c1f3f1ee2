"""The rules for several debuggers on one VM (issue 11, items 3-6), rule by rule, as Playbooks.

``Bridged.handle`` maps session inputs onto the router (and its bridge) the way the VM session
does. Every debugger command and VM packet is spelled byte for byte; the VM-side ids come from
the router's one ``IdRewriter``, so they are part of what is checked. ``ready`` attaches the
debuggers and lets debugger 1 ask the VM's IDSizes (VM-side id 1), as JDI does first; a test's
own VM-side ids start at 2. The last tests run a whole ``VmSession`` to show what happens to the
VM connection when debuggers leave.
"""

from __future__ import annotations

from typing import Any

import pytest

from ddmd.protocol.ddm import HeloRequest, ddm_command
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    CommandPacket,
    CommandSet,
    ReplyPacket,
    encode,
)
from ddmd.session import bridge as bridge_module
from ddmd.session import holding as holding_module
from ddmd.session.commands import CloseDebugger, Command, Log, Reconnect, SendToDebugger, SendToVm
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    Input,
    VmBytes,
    VmConnected,
)
from ddmd.session.router import Router
from ddmd.session.settings import SessionSettings
from ddmd.session.vm import VmSession
from tests.session.playbook import Placeholder, Playbook

# ------------------------------------------------------------------------------ the wire

ID_SIZES = (1, 7)
ALL_CLASSES = (1, 3)
VERSION = (1, 1)
DISPOSE = (1, 6)
SUSPEND = (1, 8)
RESUME = (1, 9)
EXIT = (1, 10)
HOLD = (1, 15)
RELEASE = (1, 16)
T_SUSPEND = (11, 2)
T_RESUME = (11, 3)
T_COUNT = (11, 12)
SET = (15, 1)
CLEAR = (15, 2)
CLEAR_BREAKPOINTS = (15, 3)

NONE, THREAD, ALL = 0, 1, 2
BREAKPOINT, THREAD_START, CLASS_PREPARE, VM_DEATH, USER_DEFINED = 2, 6, 8, 99, 5
SIZES = bytes.fromhex("00000008" * 5)  # 64-bit HotSpot: every id 8 bytes
T1, T2 = 1, 2


def int4(value: int) -> bytes:
    return value.to_bytes(4, "big", signed=True)


def tid(thread: int) -> bytes:
    return thread.to_bytes(8, "big")


LOCATION = b"\x01" + (0x10).to_bytes(8, "big") + (0x20).to_bytes(8, "big") + (5).to_bytes(8, "big")


def cmd(packet_id: int, command: tuple[int, int], data: bytes = b"") -> bytes:
    return encode(CommandPacket(packet_id, command[0], command[1], data))


def reply(packet_id: int, data: bytes = b"", error: int = 0) -> bytes:
    return encode(ReplyPacket(packet_id, error, data))


def ev(kind: int, request: int, body: bytes) -> bytes:
    """One event of a composite: kind, requestID, its data."""
    return bytes([kind]) + int4(request) + body


def bp(request: int, thread: int = T1) -> bytes:
    return ev(BREAKPOINT, request, tid(thread) + LOCATION)


def composite(policy: int, *events: bytes, packet_id: int = 0x100) -> bytes:
    body = bytes([policy]) + len(events).to_bytes(4, "big") + b"".join(events)
    return encode(CommandPacket(packet_id, CommandSet.EVENT, 100, body))


def set_bp(policy: int) -> bytes:
    """EventRequest.Set of a breakpoint (its location modifier left out: ddmd never reads it)."""
    return bytes([BREAKPOINT, policy]) + int4(0)


def clear(kind: int, request: int) -> bytes:
    return bytes([kind]) + int4(request)


# ------------------------------------------------------------------------------ the harness


class Bridged:
    """A router (and its bridge) fed like the VM session feeds it."""

    def __init__(self, **kw: Any) -> None:
        self.replies: list[tuple[Pending, ReplyPacket]] = []
        self.router = Router(on_reply=self._on_reply, on_push=lambda _: [], **kw)

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        self.replies.append((pending, packet))
        return []

    def handle(self, item: Any) -> list[Command]:
        r = self.router
        if isinstance(item, VmConnected):
            return r.connected(item.leftover)
        if isinstance(item, VmBytes):
            return r.vm_data(item.data)
        if isinstance(item, ConsumerJoined):
            return r.debugger_joined(item.consumer, item.via, item.peer)
        if isinstance(item, ConsumerBytes):
            out, leaving = r.debugger_data(item.consumer, item.data)
            if leaving is not None:
                out += r.debugger_left(item.consumer)[2]
            return out
        if isinstance(item, ConsumerLeft):
            return r.debugger_left(item.consumer)[2]
        raise AssertionError(f"no such input {item!r}")

    def book(self, *, logs: bool = False) -> Playbook:
        return Playbook(self.handle, logs=logs)

    @property
    def bridge(self) -> bridge_module.Bridge:
        return self.router.bridge


def ready(*debuggers: int, **kw: Any) -> Bridged:
    """The VM connected, ``debuggers`` attached, and the VM's id sizes known (VM-side id 1)."""
    h = Bridged(**kw)
    playbook = h.book() >> VmConnected(0.0)
    for d in debuggers:
        playbook = (
            playbook
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SendToDebugger(d, HANDSHAKE)
        )
    first = debuggers[0]
    assert (
        playbook
        >> ConsumerBytes(first, cmd(1, ID_SIZES))
        << SendToVm(cmd(1, ID_SIZES))
        >> VmBytes(reply(1, SIZES))
        << SendToDebugger(first, reply(1, SIZES))
    )
    return h


def owns(
    h: Bridged, debugger: int, their_id: int, vm_id: int, request: int, policy: int = ALL
) -> None:
    """``debugger`` sets a breakpoint; the VM answers with ``request``."""
    assert (
        h.book()
        >> ConsumerBytes(debugger, cmd(their_id, SET, set_bp(policy)))
        << SendToVm(cmd(vm_id, SET, set_bp(policy)))
        >> VmBytes(reply(vm_id, int4(request)))
        << SendToDebugger(debugger, reply(their_id, int4(request)))
    )


# ------------------------------------------------------------------------------ event ownership


def test_each_debugger_receives_only_the_events_of_its_own_requests() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5)
    owns(h, 2, 1, 3, request=7)
    assert (
        h.book()
        >> VmBytes(composite(NONE, bp(7)))
        << SendToDebugger(2, composite(NONE, bp(7)))  # the VM's bytes, unchanged
        >> VmBytes(composite(NONE, bp(5)))
        << SendToDebugger(1, composite(NONE, bp(5)))
    )
    assert (h.bridge.requests.owned_by(1), h.bridge.requests.owned_by(2)) == (1, 1)


def test_a_composite_is_split_each_part_under_the_policy_its_debugger_asked_for() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=THREAD)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5), bp(7)))  # the VM applied the stronger: all threads
        << SendToDebugger(1, composite(ALL, bp(5)))
        << SendToDebugger(2, composite(THREAD, bp(7)))
    )


def test_a_debugger_is_told_its_own_policy_and_the_rest_is_released_at_once() -> None:
    # A VM that suspended every thread for a request that asked for its thread only: the
    # debugger hears what it asked for, and ddmd lets the other threads go at once.
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=THREAD)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5, T1)))
        << SendToDebugger(1, composite(THREAD, bp(5, T1)))
        << SendToVm(cmd(3, T_SUSPEND, tid(T1)))
        << SendToVm(cmd(4, RESUME))
    )
    assert h.bridge.ledger.count(1, T1) == 1


def test_a_class_prepared_by_a_debugger_thread_suspends_all_as_the_vm_says() -> None:
    # jdwp.spec: a thread-only request whose event has no thread (thread id 0) suspends all
    # threads, and the composite says so: that is what its debugger is told, and holds.
    h = ready(1, 2)
    prepare = bytes([CLASS_PREPARE, THREAD]) + int4(0)
    event = ev(CLASS_PREPARE, 6, tid(0) + b"\x01" + tid(0x33) + int4(5) + b"LFoo;" + int4(7))
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, SET, prepare))
        << SendToVm(cmd(2, SET, prepare))
        >> VmBytes(reply(2, int4(6)))
        << SendToDebugger(1, reply(3, int4(6)))
        >> VmBytes(composite(ALL, event))
        << SendToDebugger(1, composite(ALL, event))
        >> ConsumerBytes(1, cmd(5, RESUME))
        << SendToVm(cmd(3, RESUME))
    )


def test_request_id_0_events_go_to_every_debugger() -> None:
    h = ready(1, 2, 3)
    death = ev(VM_DEATH, 0, b"")
    assert (
        h.book()
        >> VmBytes(composite(NONE, death))
        << SendToDebugger(1, composite(NONE, death))
        << SendToDebugger(2, composite(NONE, death))
        << SendToDebugger(3, composite(NONE, death))
    )


def test_an_automatic_vm_death_goes_to_all_and_a_requested_one_only_to_its_owner() -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, SET, bytes([VM_DEATH, ALL]) + int4(0)))
        << SendToVm(cmd(2, SET, bytes([VM_DEATH, ALL]) + int4(0)))
        >> VmBytes(reply(2, int4(9)))
        << SendToDebugger(1, reply(3, int4(9)))
        >> VmBytes(composite(ALL, ev(VM_DEATH, 0, b""), ev(VM_DEATH, 9, b"")))
        << SendToDebugger(1, composite(ALL, ev(VM_DEATH, 0, b""), ev(VM_DEATH, 9, b"")))
        # The automatic one suspends nothing (jdwp.spec): debugger 2 is told so.
        << SendToDebugger(2, composite(NONE, ev(VM_DEATH, 0, b"")))
    )
    assert (h.bridge.held_by(1), h.bridge.held_by(2)) == (1, 0)


def test_with_one_debugger_an_event_of_a_request_never_seen_still_reaches_it() -> None:
    h = ready(1)
    assert (
        h.book() >> VmBytes(composite(NONE, bp(11))) << SendToDebugger(1, composite(NONE, bp(11)))
    )


def test_with_several_an_event_of_a_request_nobody_owns_is_dropped_and_logged() -> None:
    h = ready(1, 2)
    assert (
        h.book(logs=True)
        >> VmBytes(composite(NONE, bp(11)))
        << Log("vm.event_dropped", "debug", {"kind": BREAKPOINT, "request": 11})
    )


def test_clear_of_an_own_request_goes_to_the_vm_and_its_late_events_are_dropped() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(5, CLEAR, clear(BREAKPOINT, 5)))
        << SendToVm(cmd(3, CLEAR, clear(BREAKPOINT, 5)))
        # A hit of the breakpoint was already on its way: nobody gets it, and the suspension
        # it caused is released by ddmd (nobody else would).
        >> VmBytes(composite(ALL, bp(5)))
        << SendToVm(cmd(4, RESUME))
        >> VmBytes(reply(3))
        << SendToDebugger(1, reply(5))
        >> VmBytes(reply(4))  # ddmd's own: consumed
    )
    assert h.bridge.requests.owned_by(1) == 0


def test_clear_of_a_request_the_sender_does_not_own_is_answered_here() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5)
    assert (
        h.book()
        # OpenJDK answers a Clear of an id it does not know with an empty success reply.
        >> ConsumerBytes(2, cmd(8, CLEAR, clear(BREAKPOINT, 5)))
        << SendToDebugger(2, reply(8))
        >> ConsumerBytes(2, cmd(9, CLEAR, clear(BREAKPOINT, 4242)))
        << SendToDebugger(2, reply(9))
        # ... and an event kind it does not know with INVALID_EVENT_TYPE.
        >> ConsumerBytes(2, cmd(10, CLEAR, clear(USER_DEFINED, 5)))
        << SendToDebugger(2, reply(10, error=102))
        # Nothing reached the VM: debugger 1's breakpoint still fires, for it alone.
        >> VmBytes(composite(NONE, bp(5)))
        << SendToDebugger(1, composite(NONE, bp(5)))
    )
    assert h.bridge.requests.owned_by(1) == 1


def test_clear_all_breakpoints_clears_only_the_sender_s_breakpoints() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5)
    owns(h, 2, 1, 3, request=7)
    owns(h, 1, 5, 4, request=9)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(11, SET, bytes([CLASS_PREPARE, NONE]) + int4(0)))
        << SendToVm(cmd(5, SET, bytes([CLASS_PREPARE, NONE]) + int4(0)))
        >> VmBytes(reply(5, int4(10)))
        << SendToDebugger(1, reply(11, int4(10)))
        >> ConsumerBytes(1, cmd(13, CLEAR_BREAKPOINTS))
        << SendToVm(cmd(6, CLEAR, clear(BREAKPOINT, 5)))
        << SendToVm(cmd(7, CLEAR, clear(BREAKPOINT, 9)))
        >> VmBytes(reply(6))
        >> VmBytes(reply(7))
        << SendToDebugger(1, reply(13))  # answered once the VM answered both
        # Debugger 2's breakpoint and debugger 1's class-prepare request are still there.
        >> VmBytes(composite(NONE, bp(7)))
        << SendToDebugger(2, composite(NONE, bp(7)))
    )
    assert (h.bridge.requests.owned_by(1), h.bridge.requests.owned_by(2)) == (1, 1)


def test_clear_all_breakpoints_without_any_is_answered_at_once() -> None:
    h = ready(1, 2)
    owns(h, 2, 1, 2, request=7)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, CLEAR_BREAKPOINTS))
        << SendToDebugger(1, reply(3))
        >> VmBytes(composite(NONE, bp(7)))
        << SendToDebugger(2, composite(NONE, bp(7)))
    )


def test_a_composite_that_cannot_be_split_goes_whole_to_everyone_and_is_logged() -> None:
    h = ready(1, 2)
    odd = composite(NONE, ev(USER_DEFINED, 3, tid(T1)), ev(USER_DEFINED, 4, tid(T1)))
    assert (
        h.book(logs=True)
        >> VmBytes(odd)
        << Log("vm.event_unsplit", "warning", {"error": "event kind 5 has no known length"})
        << SendToDebugger(1, odd)
        << SendToDebugger(2, odd)
    )


# ------------------------------------------------------------------------------ suspensions


def test_two_suspend_all_requests_firing_in_one_composite_are_released_once_by_the_last() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=ALL)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5), bp(7)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        << SendToDebugger(2, composite(ALL, bp(7)))
        >> ConsumerBytes(1, cmd(9, RESUME))
        << SendToDebugger(1, reply(9))  # debugger 2 still holds the VM: nothing to the VM
        >> ConsumerBytes(2, cmd(4, RESUME))
        << SendToVm(cmd(4, RESUME))  # the last holder: the one suspension is released once
        >> VmBytes(reply(4))
        << SendToDebugger(2, reply(4))
        >> ConsumerBytes(1, cmd(11, RESUME))
        << SendToDebugger(1, reply(11))  # it balances nothing any more
    )
    assert h.bridge.ledger.suspensions == []


def test_a_resume_that_balances_none_of_the_sender_s_suspensions_is_answered_here() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        >> ConsumerBytes(2, cmd(2, RESUME))
        << SendToDebugger(2, reply(2))
        >> ConsumerBytes(2, cmd(4, T_RESUME, tid(T1)))
        << SendToDebugger(2, reply(4))
    )
    assert h.bridge.held_by(1) == 1


def test_one_debugger_alone_sends_its_resumes_to_the_vm_as_today() -> None:
    h = ready(1)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, RESUME))  # nothing held: still the VM's to answer
        << SendToVm(cmd(2, RESUME))
        >> ConsumerBytes(1, cmd(5, T_RESUME, tid(T1)))
        << SendToVm(cmd(3, T_RESUME, tid(T1)))
    )


def test_a_thread_held_by_one_debugger_survives_another_debugger_s_resume() -> None:
    # The JDI program's case: debugger 1 holds one thread (a thread-only breakpoint); debugger
    # 2 (jdb) stops everything at its own breakpoint and resumes. The VM counted the thread
    # twice, so the VM.Resume leaves it suspended.
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=THREAD)
    owns(h, 2, 1, 3, request=7, policy=ALL)
    assert (
        h.book()
        >> VmBytes(composite(THREAD, bp(5, T1)))
        << SendToDebugger(1, composite(THREAD, bp(5, T1)))
        >> VmBytes(composite(ALL, bp(7, T2)))
        << SendToDebugger(2, composite(ALL, bp(7, T2)))
        >> ConsumerBytes(2, cmd(3, RESUME))
        << SendToVm(cmd(4, RESUME))
        >> ConsumerBytes(2, cmd(5, RESUME))  # again: jdb's "resume" with nothing of its own
        << SendToDebugger(2, reply(5))
        >> ConsumerBytes(1, cmd(7, T_RESUME, tid(T1)))
        << SendToVm(cmd(5, T_RESUME, tid(T1)))  # its own hold ends: the thread runs
    )
    assert h.bridge.ledger.suspensions == []


def test_a_shared_all_thread_suspension_kept_by_a_thread_only_holder() -> None:
    # One composite, two policies: the VM suspended everything. Debugger 1 lets go; debugger 2
    # still holds the event thread, which must not move while the rest runs again.
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=THREAD)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5, T1), bp(7, T1)))
        << SendToDebugger(1, composite(ALL, bp(5, T1)))
        << SendToDebugger(2, composite(THREAD, bp(7, T1)))
        >> ConsumerBytes(1, cmd(9, RESUME))
        << SendToVm(cmd(4, T_SUSPEND, tid(T1)))  # held once more first ...
        << SendToVm(cmd(5, RESUME))  # ... so this VM.Resume releases everything else
        << SendToDebugger(1, reply(9))
        >> VmBytes(reply(4))
        >> VmBytes(reply(5))
        >> ConsumerBytes(2, cmd(3, T_RESUME, tid(T1)))
        << SendToVm(cmd(6, T_RESUME, tid(T1)))
    )
    assert h.bridge.ledger.suspensions == []


def test_one_thread_resumed_out_of_a_shared_suspend_all() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=ALL)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5), bp(7)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        << SendToDebugger(2, composite(ALL, bp(7)))
        >> ConsumerBytes(1, cmd(9, T_RESUME, tid(T1)))
        << SendToDebugger(1, reply(9))  # debugger 2 still holds T1
        >> ConsumerBytes(2, cmd(3, RESUME))
        << SendToVm(cmd(4, T_RESUME, tid(T1)))  # now nobody holds T1; the rest stays
        << SendToDebugger(2, reply(3))
        >> ConsumerBytes(1, cmd(11, RESUME))
        << SendToVm(cmd(5, RESUME))
    )
    assert h.bridge.ledger.suspensions == []


def test_own_suspends_are_counted_and_a_refused_one_is_forgotten() -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2, error=10))  # INVALID_THREAD: it never happened
        << SendToDebugger(1, reply(3, error=10))
        >> ConsumerBytes(1, cmd(5, T_RESUME, tid(T1)))
        << SendToDebugger(1, reply(5))
        >> ConsumerBytes(1, cmd(7, SUSPEND))
        << SendToVm(cmd(3, SUSPEND))
        >> VmBytes(reply(3))
        << SendToDebugger(1, reply(7))
        >> ConsumerBytes(2, cmd(2, SUSPEND))
        << SendToVm(cmd(4, SUSPEND))
        >> ConsumerBytes(1, cmd(9, RESUME))
        << SendToVm(cmd(5, RESUME))  # its own VM.Suspend: exactly this resume releases it
        >> ConsumerBytes(1, cmd(11, RESUME))
        << SendToDebugger(1, reply(11))
    )
    assert (h.bridge.held_by(1), h.bridge.held_by(2)) == (0, 1)


def test_suspend_count_leaves_out_what_other_debuggers_hold() -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2))
        << SendToDebugger(1, reply(3))
        >> ConsumerBytes(2, cmd(1, T_COUNT, tid(T1)))
        << SendToVm(cmd(3, T_COUNT, tid(T1)))
        >> VmBytes(reply(3, int4(1)))
        << SendToDebugger(2, reply(1, int4(0)))  # debugger 1's suspension is not its own
        >> ConsumerBytes(1, cmd(5, T_COUNT, tid(T1)))
        << SendToVm(cmd(4, T_COUNT, tid(T1)))
        >> VmBytes(reply(4, int4(1)))
        << SendToDebugger(1, reply(5, int4(1)))
        >> ConsumerBytes(1, cmd(7, T_COUNT, tid(T2)))
        << SendToVm(cmd(5, T_COUNT, tid(T2)))
        >> VmBytes(reply(5, int4(3)))  # suspensions ddmd never saw are not hidden
        << SendToDebugger(1, reply(7, int4(3)))
    )


T_STATUS, T_FRAMES = (11, 4), (11, 6)


def test_a_thread_only_others_hold_looks_running_to_a_debugger() -> None:
    """JDI caches what it reads of a suspended thread until it resumes it itself; a thread held
    only by other debuggers is therefore shown running: status without the suspended bit, and
    frames refused as the VM refuses them for a running thread (THREAD_NOT_SUSPENDED, 13)."""
    h = ready(1, 2)
    running_suspended = int4(1) + int4(1)  # threadStatus RUNNING, suspendStatus SUSPENDED
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2))
        << SendToDebugger(1, reply(3))
        >> ConsumerBytes(2, cmd(4, T_STATUS, tid(T1)))
        << SendToVm(cmd(3, T_STATUS, tid(T1)))
        >> VmBytes(reply(3, running_suspended))
        << SendToDebugger(2, reply(4, int4(1) + int4(0)))
        >> ConsumerBytes(2, cmd(6, T_FRAMES, tid(T1) + int4(0) + int4(-1)))
        << SendToDebugger(2, reply(6, error=13))
        # The holder itself sees it suspended and reads its frames from the VM.
        >> ConsumerBytes(1, cmd(5, T_STATUS, tid(T1)))
        << SendToVm(cmd(4, T_STATUS, tid(T1)))
        >> VmBytes(reply(4, running_suspended))
        << SendToDebugger(1, reply(5, running_suspended))
        >> ConsumerBytes(1, cmd(7, T_FRAMES, tid(T1) + int4(0) + int4(-1)))
        << SendToVm(cmd(5, T_FRAMES, tid(T1) + int4(0) + int4(-1)))
    )


def test_a_suspending_vm_start_is_the_first_debugger_s_to_release() -> None:
    h = Bridged()
    start = composite(ALL, ev(90, 0, tid(T1)), packet_id=0)
    assert (
        h.book()
        >> VmConnected(0.0, leftover=start)
        >> ConsumerJoined(1, "current", "127.0.0.1:40001")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
        << SendToDebugger(1, start)
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> ConsumerBytes(2, HANDSHAKE)
        << SendToDebugger(2, HANDSHAKE)
        >> ConsumerBytes(2, cmd(1, RESUME))
        << SendToDebugger(2, reply(1))  # not its VM_START to resume
        >> ConsumerBytes(1, cmd(1, RESUME))
        << SendToVm(cmd(1, RESUME))
    )


# ------------------------------------------------------------------------------ held events


def test_hold_events_keeps_that_debugger_s_events_until_it_releases_them() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=NONE)
    owns(h, 2, 1, 3, request=7, policy=NONE)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(5, HOLD))
        << SendToDebugger(1, reply(5))  # answered here, never sent to the VM
        >> VmBytes(composite(NONE, bp(5)))
        >> VmBytes(composite(NONE, bp(7)))
        << SendToDebugger(2, composite(NONE, bp(7)))  # the other debugger's flow goes on
        >> VmBytes(composite(NONE, bp(5), packet_id=0x101))
        >> ConsumerBytes(1, cmd(7, RELEASE))
        << SendToDebugger(1, reply(7))
        << SendToDebugger(1, composite(NONE, bp(5)))
        << SendToDebugger(1, composite(NONE, bp(5), packet_id=0x101))
        >> VmBytes(composite(NONE, bp(5), packet_id=0x102))
        << SendToDebugger(1, composite(NONE, bp(5), packet_id=0x102))
    )


def test_held_events_past_the_bound_are_given_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holding_module, "MAX_HELD_EVENTS", 2)
    h = ready(1)
    owns(h, 1, 3, 2, request=5, policy=NONE)
    events = [composite(NONE, bp(5), packet_id=0x100 + i) for i in range(3)]
    assert (
        h.book(logs=True)
        >> ConsumerBytes(1, cmd(5, HOLD))
        << SendToDebugger(1, reply(5))
        >> VmBytes(events[0])
        >> VmBytes(events[1])
        >> VmBytes(events[2])
        << Log("debugger.hold_overflowed", "warning", {"debugger": 1, "events": 3})
        << SendToDebugger(1, events[0])
        << SendToDebugger(1, events[1])
        << SendToDebugger(1, events[2])
    )


# ------------------------------------------------------------------------------ leaving


def test_a_departing_debugger_s_requests_are_cleared_and_its_suspensions_released() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=ALL)
    owns(h, 1, 5, 4, request=9, policy=THREAD)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5), bp(7)))  # shared with debugger 2
        << SendToDebugger(1, composite(ALL, bp(5)))
        << SendToDebugger(2, composite(ALL, bp(7)))
        >> VmBytes(composite(THREAD, bp(9, T2)))  # debugger 1's alone
        << SendToDebugger(1, composite(THREAD, bp(9, T2)))
        >> ConsumerBytes(1, cmd(7, SUSPEND))  # and one of its own
        << SendToVm(cmd(5, SUSPEND))
        >> VmBytes(reply(5))
        << SendToDebugger(1, reply(7))
        >> ConsumerLeft(1, "killed")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(6, CLEAR, clear(BREAKPOINT, 5)))
        << SendToVm(cmd(7, CLEAR, clear(BREAKPOINT, 9)))
        << SendToVm(cmd(8, T_RESUME, tid(T2)))  # its thread-only breakpoint
        << SendToVm(cmd(9, RESUME))  # its VM.Suspend; the shared one stays with debugger 2
        >> VmBytes(reply(6))
        >> VmBytes(reply(7))
        >> VmBytes(reply(8))
        >> VmBytes(reply(9))
        # Debugger 2 is undisturbed, and still the one to release its stop.
        >> ConsumerBytes(2, cmd(3, RESUME))
        << SendToVm(cmd(10, RESUME))
    )
    assert h.bridge.ledger.suspensions == []
    assert h.bridge.requests.owned_by(2) == 1
    assert len(h.router.ids) == 1  # debugger 2's resume; nothing of debugger 1's is pending


def test_a_departure_is_logged_with_what_was_released() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    assert (
        h.book(logs=True)
        >> VmBytes(composite(ALL, bp(5)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        >> ConsumerLeft(1, "killed")
        << CloseDebugger(1, "left")
        << Log("debugger.released", "debug", {"debugger": 1, "requests": 1, "suspensions": 1})
        << SendToVm(cmd(3, CLEAR, clear(BREAKPOINT, 5)))
        << SendToVm(cmd(4, RESUME))
    )


def test_events_of_a_departed_debugger_s_requests_are_dropped_and_released() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    assert (
        h.book()
        >> ConsumerLeft(1, "killed")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(3, CLEAR, clear(BREAKPOINT, 5)))
        >> VmBytes(composite(ALL, bp(5)))  # already on its way: debugger 2 never sees it
        << SendToVm(cmd(4, RESUME))
    )


def test_a_set_in_flight_when_its_debugger_leaves_is_cleared_once_answered() -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, SET, set_bp(ALL)))
        << SendToVm(cmd(2, SET, set_bp(ALL)))
        >> ConsumerLeft(1, "killed")
        << CloseDebugger(1, "left")
        >> VmBytes(reply(2, int4(5)))
        << SendToVm(cmd(3, CLEAR, clear(BREAKPOINT, 5)))
        >> VmBytes(composite(ALL, bp(5)))
        << SendToVm(cmd(4, RESUME))
    )


def test_a_departure_in_the_middle_of_a_streamed_large_reply() -> None:
    h = ready(1, 2, stream_threshold=64)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    owns(h, 2, 1, 3, request=7, policy=NONE)
    big = reply(4, bytes(range(256)) * 4)
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        >> ConsumerBytes(1, cmd(9, ALL_CLASSES))
        << SendToVm(cmd(4, ALL_CLASSES))
        >> VmBytes(big[:100])
        << SendToDebugger(1, Placeholder("header"), more=True)
        << SendToDebugger(1, Placeholder("piece"), more=True)
        # Debugger 1 is dropped half-way (a slow consumer): its state is released at once,
        # while the rest of its reply still streams in from the VM.
        >> ConsumerLeft(1, "slow consumer")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(5, CLEAR, clear(BREAKPOINT, 5)))
        << SendToVm(cmd(6, RESUME))
        >> VmBytes(big[100:])
        >> VmBytes(reply(5) + reply(6))
        >> VmBytes(composite(NONE, bp(7)))
        << SendToDebugger(2, composite(NONE, bp(7)))
        >> ConsumerBytes(2, cmd(3, VERSION))
        << SendToVm(cmd(7, VERSION))
        >> VmBytes(reply(7, b"v"))
        << SendToDebugger(2, reply(3, b"v"))
    )


def test_another_debugger_s_streamed_reply_goes_on_while_one_leaves() -> None:
    h = ready(1, 2, stream_threshold=64)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    big = reply(3, bytes(range(256)) * 4)
    sent: list[bytes] = []
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5)))
        << SendToDebugger(1, composite(ALL, bp(5)))
        >> ConsumerBytes(2, cmd(1, ALL_CLASSES))
        << SendToVm(cmd(3, ALL_CLASSES))
    )
    for piece in (big[:100], big[100:500]):
        sent += [c.data for c in h.handle(VmBytes(piece)) if isinstance(c, SendToDebugger)]
    assert [c for c in h.handle(ConsumerLeft(1, "killed")) if not isinstance(c, Log)] == [
        CloseDebugger(1, "left"),
        SendToVm(cmd(4, CLEAR, clear(BREAKPOINT, 5))),
        SendToVm(cmd(5, RESUME)),
    ]
    for command in h.handle(VmBytes(big[500:])):
        assert isinstance(command, SendToDebugger)
        assert command.debugger == 2
        sent.append(command.data)
    assert b"".join(sent) == reply(1, bytes(range(256)) * 4)


# ------------------------------------------------------------------------------ global commands


def test_vm_exit_goes_to_the_vm_and_names_who_asked() -> None:
    h = ready(1, 2)
    assert (
        h.book(logs=True)
        >> ConsumerBytes(2, cmd(4, EXIT, int4(3)))
        << Log(
            "vm.exit_requested",
            "warning",
            {"debugger": 2, "peer": "127.0.0.1:40002", "via": "vm-port", "others": 1},
        )
        << SendToVm(cmd(2, EXIT, int4(3)))
    )
    alone = ready(1)
    assert (
        alone.book(logs=True)
        >> ConsumerBytes(1, cmd(4, EXIT, int4(0)))
        << Log("vm.exit_requested", "info", Placeholder("fields"))
        << SendToVm(cmd(2, EXIT, int4(0)))
    )


def test_commands_no_rule_concerns_go_straight_through() -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(2, cmd(4, (11, 1), tid(T1)))  # ThreadReference.Name
        << SendToVm(cmd(2, (11, 1), tid(T1)))
        >> VmBytes(reply(2, b"main"))
        << SendToDebugger(2, reply(4, b"main"))
    )


# ------------------------------------------------------------------------------ the VM connection

HOTSPOT_VERSION = b"\x00\x00\x00\x03JVM" + int4(17) + int4(0) + b"\x00" * 8


def hotspot(*debuggers: int) -> tuple[VmSession, Playbook]:
    """A plain JVM (HELO refused, one Version asked) with ``debuggers`` attached."""
    session = VmSession(
        "vm-1",
        source="tcp",
        address="127.0.0.1:8000",
        settings=SessionSettings(max_debuggers=4),
    )

    def handle(item: Input) -> list[Command]:
        return [
            c
            for c in session.handle(item, 0.0)
            if isinstance(c, SendToVm | SendToDebugger | CloseDebugger | Reconnect)
        ]

    playbook = (
        Playbook(handle)
        >> VmConnected(0.0)
        << SendToVm(encode(ddm_command(1, HeloRequest(1))))
        >> VmBytes(reply(1, error=99))
        << SendToVm(cmd(2, VERSION))
        >> VmBytes(reply(2, HOTSPOT_VERSION))
    )
    for d in debuggers:
        playbook = (
            playbook
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SendToDebugger(d, HANDSHAKE)
        )
    assert playbook
    return session, playbook


def test_leaving_while_others_stay_keeps_the_vm_connection_and_the_last_one_releases() -> None:
    session, playbook = hotspot(1, 2)
    assert (
        playbook
        >> ConsumerBytes(1, cmd(1, SET, set_bp(ALL)))
        << SendToVm(cmd(3, SET, set_bp(ALL)))
        >> VmBytes(reply(3, int4(5)))
        << SendToDebugger(1, reply(1, int4(5)))
        >> ConsumerBytes(1, cmd(3, DISPOSE))
        << SendToDebugger(1, reply(3))  # Dispose stays local
        << CloseDebugger(1, "left")
        << SendToVm(cmd(4, CLEAR, clear(BREAKPOINT, 5)))  # no DBGD, no reconnect
        >> VmBytes(reply(4))
    )
    assert session.state == "ready"
    assert (
        playbook
        >> ConsumerLeft(2, "debugger closed the connection")
        << CloseDebugger(2, "left")  # the last one held nothing: the connection is kept
    )
    assert session.state == "ready"
