"""Foresight (issue 30): the store, its invalidation rules, twins in flight and speculation, rule by
rule, as Playbooks through the router (``Bridged`` feeds it as the VM session does).

Every VM-side id comes from the router's one ``IdRewriter``: IDSizes is 1, ddmd's own
EventRequest.Set of CLASS_UNLOAD is 2 (its reply, request 99, hides that request's events), so a
test's own VM-side ids start at 3. ``quiet`` harnesses speculate nothing (``max_inflight`` 0): the
store and its rules alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from ddmd.protocol.jdwp import HANDSHAKE
from ddmd.session.commands import CloseDebugger, Command, SendToDebugger, SendToVm
from ddmd.session.inputs import ConsumerBytes, ConsumerJoined, ConsumerLeft, VmBytes, VmConnected
from ddmd.session.lanes import OFF_LANE, READ_REPLIES
from ddmd.session.stability import ENDS
from tests.session.playbook import Playbook
from tests.session.test_bridge import (
    ALL,
    ID_SIZES,
    SIZES,
    T1,
    T2,
    THREAD,
    Bridged,
    bp,
    cmd,
    composite,
    ev,
    int4,
    reply,
    tid,
)

ALL_THREADS = (1, 4)
NAME = (11, 1)
STATUS = (11, 4)
FRAMES = (11, 6)
FRAME_COUNT = (11, 7)
THIS = (16, 3)
GET_VALUES = (16, 1)
LINE_TABLE = (6, 1)
VARIABLES = (6, 5)
SOURCE_FILE = (2, 7)
SET = (15, 1)
RESUME = (1, 9)
REDEFINE = (1, 18)
UNLOAD_SET = bytes([9, 0]) + int4(0)  # CLASS_UNLOAD, suspend policy NONE, no modifiers
OWN_REQUEST = 99
CLASS, METHOD = (0x10).to_bytes(8, "big"), (0x20).to_bytes(8, "big")
FRAME0 = (0x30).to_bytes(8, "big")
ALL_FRAMES = int4(0) + int4(-1)
THREADS = int4(2) + tid(T1) + tid(T2)
# One frame: frameID, location (class tag, class, method, index 5).
FRAMES_REPLY = int4(1) + FRAME0 + b"\x01" + CLASS + METHOD + (5).to_bytes(8, "big")


def on(*debuggers: int, inflight: int = 0, **kw: Any) -> Bridged:
    """The VM connected, ``debuggers`` attached, foresight on, the id sizes known (VM-side id 1)
    and ddmd's CLASS_UNLOAD request answered (id 2)."""
    h = Bridged(speculate=("on", 0.002, inflight, kw.pop("held", 1 << 20)), **kw)
    playbook = h.book() >> VmConnected(0.0)
    for d in debuggers:
        playbook = (
            playbook
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SendToDebugger(d, HANDSHAKE)
        )
    assert (
        playbook
        >> ConsumerBytes(debuggers[0], cmd(1, ID_SIZES))
        << SendToVm(cmd(1, ID_SIZES))
        >> VmBytes(reply(1, SIZES))
        << SendToVm(cmd(2, SET, UNLOAD_SET))
        << SendToDebugger(debuggers[0], reply(1, SIZES))
        >> VmBytes(reply(2, int4(OWN_REQUEST)))
    )
    return h


def stop(h: Bridged, debugger: int = 1, policy: int = ALL, thread: int = T1) -> None:
    """A breakpoint (of a request ddmd never saw: a lone debugger gets it) suspends."""
    event = composite(policy, bp(5, thread))
    assert h.book() >> VmBytes(event) << SendToDebugger(debugger, event)


def asked(
    h: Bridged,
    debugger: int,
    their: int,
    vm: int,
    command: tuple[int, int],
    data: bytes,
    answer: bytes,
    error: int = 0,
) -> None:
    """``debugger`` asks; it goes to the VM under ``vm``; the VM's answer comes back."""
    assert (
        h.book()
        >> ConsumerBytes(debugger, cmd(their, command, data))
        << SendToVm(cmd(vm, command, data))
        >> VmBytes(reply(vm, answer, error))
        << SendToDebugger(debugger, reply(their, answer, error))
    )


def served(
    h: Bridged,
    debugger: int,
    their: int,
    command: tuple[int, int],
    data: bytes,
    answer: bytes,
    error: int = 0,
) -> None:
    """``debugger`` asks; it is answered here, nothing goes to the VM."""
    assert (
        h.book()
        >> ConsumerBytes(debugger, cmd(their, command, data))
        << SendToDebugger(debugger, reply(their, answer, error))
    )


def sent(out: list[Command]) -> list[bytes]:
    return [c.data for c in out if isinstance(c, SendToVm)]


# ------------------------------------------------------------------------------ serving


def test_a_stored_reply_is_served_with_the_vm_s_bytes_under_the_debugger_s_own_id() -> None:
    h = on(1)
    stop(h)
    asked(h, 1, 10, 3, FRAMES, tid(T1) + ALL_FRAMES, FRAMES_REPLY)
    served(h, 1, 11, FRAMES, tid(T1) + ALL_FRAMES, FRAMES_REPLY)
    # Other bytes are another key: to the VM.
    asked(h, 1, 12, 4, FRAMES, tid(T1) + int4(0) + int4(1), FRAMES_REPLY)
    assert h.router.foresight.answered_cache == 1


def test_nothing_suspension_scoped_is_stored_while_the_vm_runs() -> None:
    h = on(1)
    asked(h, 1, 10, 3, ALL_THREADS, b"", THREADS)
    asked(h, 1, 11, 4, ALL_THREADS, b"", THREADS)


def test_class_data_outlives_a_resume_and_serves_the_next_stop() -> None:
    h = on(1)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    asked(h, 1, 11, 4, RESUME, b"", b"")
    stop(h)
    served(h, 1, 12, LINE_TABLE, CLASS + METHOD, b"lines")


def test_an_event_ends_the_suspension() -> None:
    h = on(1)
    stop(h)
    asked(h, 1, 10, 3, ALL_THREADS, b"", THREADS)
    stop(h)  # something ran
    asked(h, 1, 11, 4, ALL_THREADS, b"", THREADS)


def _ending_data(key: tuple[int, int]) -> bytes:
    if key == (15, 2):
        return b""
    return tid(T1) + bytes(24)


@pytest.mark.parametrize("key", sorted(ENDS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_every_command_that_ends_validity_ends_it_before_it_reaches_the_vm(
    key: tuple[int, int],
) -> None:
    h = on(1)
    stop(h)
    asked(h, 1, 10, 3, ALL_THREADS, b"", THREADS)
    out = h.handle(ConsumerBytes(1, cmd(11, key, _ending_data(key))))
    for data in sent(out):  # the VM answers whatever went to it
        h.handle(VmBytes(reply(int.from_bytes(data[4:8], "big"))))
    again = h.handle(ConsumerBytes(1, cmd(12, ALL_THREADS)))
    assert any(data[9:11] == bytes(ALL_THREADS) for data in sent(again)), ENDS[key]


def test_a_resume_sent_by_ddmd_itself_ends_validity_too() -> None:
    h = on(1)
    stop(h)
    asked(h, 1, 10, 3, ALL_THREADS, b"", THREADS)
    h.router.send_own("ddmd", *RESUME, b"", float("inf"))
    asked(h, 1, 11, 5, ALL_THREADS, b"", THREADS)


def test_a_class_unload_drops_class_data_and_its_event_reaches_no_debugger() -> None:
    h = on(1)
    asked(h, 1, 10, 3, SOURCE_FILE, CLASS, b"\x00\x00\x00\x06A.java")
    unload = composite(0, ev(9, OWN_REQUEST, int4(3) + b"LA;"))
    assert h.book() >> VmBytes(unload)  # nothing to the debugger
    asked(h, 1, 11, 4, SOURCE_FILE, CLASS, b"\x00\x00\x00\x06A.java")


def test_a_redefinition_drops_method_data() -> None:
    h = on(1)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    asked(h, 1, 11, 4, REDEFINE, int4(0), b"")
    asked(h, 1, 12, 5, LINE_TABLE, CLASS + METHOD, b"new lines")


def test_method_data_is_never_kept_across_debugger_sessions() -> None:
    h = on(1, 2)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    assert h.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left")
    served(h, 2, 10, LINE_TABLE, CLASS + METHOD, b"lines")  # another debugger still attached
    assert h.book() >> ConsumerLeft(2, "gone") << CloseDebugger(2, "left")
    assert (
        h.book()
        >> ConsumerJoined(3, "vm-port", "p")
        >> ConsumerBytes(3, HANDSHAKE)
        << SendToDebugger(3, HANDSHAKE)
    )
    asked(h, 3, 1, 4, LINE_TABLE, CLASS + METHOD, b"redefined by an agent meanwhile")


def test_a_new_connection_drops_everything() -> None:
    h = on(1)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    h.handle(VmConnected(1.0))
    out = h.handle(ConsumerBytes(1, cmd(11, LINE_TABLE, CLASS + METHOD)))
    assert sent(out)
    assert h.router.foresight.lasting == {}


# ------------------------------------------------------------------------------ twins


def test_a_command_waits_for_its_twin_in_flight() -> None:
    h = on(1, 2)
    stop_both = composite(ALL, bp(0))  # requestID 0: to every debugger
    assert (
        h.book()
        >> VmBytes(stop_both)
        << SendToDebugger(1, stop_both)
        << SendToDebugger(2, stop_both)
        >> ConsumerBytes(1, cmd(10, ALL_THREADS))
        << SendToVm(cmd(3, ALL_THREADS))
        >> ConsumerBytes(2, cmd(40, ALL_THREADS))  # its twin is in flight: it waits
        >> VmBytes(reply(3, THREADS))
        << SendToDebugger(2, reply(40, THREADS))
        << SendToDebugger(1, reply(10, THREADS))
    )


# ------------------------------------------------------------------------------ speculation


def test_a_suspending_event_is_followed_by_what_debuggers_ask_pipelined() -> None:
    h = on(1, inflight=64)
    event = composite(ALL, bp(5))
    assert (
        h.book()
        >> VmBytes(event)
        << SendToDebugger(1, event)
        << SendToVm(cmd(3, ALL_THREADS))
        << SendToVm(cmd(4, FRAME_COUNT, tid(T1)))
        << SendToVm(cmd(5, FRAMES, tid(T1) + ALL_FRAMES))
        # The debugger asks what is in flight: it waits for the twin.
        >> ConsumerBytes(1, cmd(10, ALL_THREADS))
        >> VmBytes(reply(3, THREADS))
        << SendToDebugger(1, reply(10, THREADS))
        << SendToVm(cmd(6, STATUS, tid(T1)))
        << SendToVm(cmd(7, NAME, tid(T1)))
        << SendToVm(cmd(8, STATUS, tid(T2)))
        << SendToVm(cmd(9, NAME, tid(T2)))
        >> VmBytes(reply(5, FRAMES_REPLY))
        << SendToVm(cmd(10, THIS, tid(T1) + FRAME0))
        << SendToVm(cmd(11, VARIABLES, CLASS + METHOD))
        << SendToVm(cmd(12, SOURCE_FILE, CLASS))
        << SendToVm(cmd(13, (2, 12), CLASS))
        << SendToVm(cmd(14, (2, 15), CLASS))
        << SendToVm(cmd(15, (2, 13), CLASS))
        << SendToVm(cmd(16, (2, 14), CLASS))
        << SendToVm(cmd(17, (2, 10), CLASS))
        << SendToVm(cmd(18, (3, 1), CLASS))
        << SendToVm(cmd(19, LINE_TABLE, CLASS + METHOD))
    )
    served(h, 1, 11, FRAMES, tid(T1) + ALL_FRAMES, FRAMES_REPLY)
    f = h.router.foresight
    assert (f.answered_speculation, f.speculated) == (2, 17)


def _variable(start: int, name: str, signature: str, length: int, slot: int) -> bytes:
    def s(text: str) -> bytes:
        return int4(len(text)) + text.encode()

    return start.to_bytes(8, "big") + s(name) + s(signature) + s("") + int4(length) + int4(slot)


def test_frame_zero_s_locals_are_asked_as_jdi_asks_them() -> None:
    h = on(1, inflight=64)
    table = (
        int4(1)
        + int4(4)
        + b"".join(
            [
                _variable(0, "this", "LA;", 20, 0),
                _variable(2, "a", "I", 10, 2),
                _variable(0, "seed", "[Ljava/lang/String;", 20, 1),
                _variable(9, "late", "J", 5, 3),  # not yet in scope at index 5
            ]
        )
    )
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    frames_vm = int.from_bytes(sent(out)[-1][4:8], "big")
    out = h.handle(VmBytes(reply(frames_vm, FRAMES_REPLY)))
    variables_vm = int.from_bytes(sent(out)[1][4:8], "big")
    out = h.handle(VmBytes(reply(variables_vm, table)))
    # visibleVariables() sorts by slot: "seed" (1) before "a" (2), though the table lists "a"
    # first and a java.util.HashMap of the names would give "a" first too.
    slots = int4(2) + int4(1) + b"[" + int4(2) + b"I"
    assert sent(out)[0][9:] == bytes(GET_VALUES) + tid(T1) + FRAME0 + slots


def test_a_resume_racing_with_speculation_keeps_the_late_replies_out() -> None:
    h = on(1, 2, inflight=64)
    stop_both = composite(ALL, bp(0))
    out = h.handle(VmBytes(stop_both))
    assert len(sent(out)) == 3  # AllThreads, FrameCount, Frames
    # Debugger 2 resumes (it holds the suspension with debugger 1: ddmd sends nothing yet);
    # then debugger 1 too: the VM is told, and everything asked before is stale.
    h.handle(ConsumerBytes(2, cmd(1, RESUME)))
    out = h.handle(ConsumerBytes(1, cmd(1, RESUME)))
    assert sent(out) == [cmd(6, RESUME)]
    h.handle(VmBytes(reply(3, THREADS)))  # AllThreads, answered before the resume
    h.handle(VmBytes(reply(6)))
    asked(h, 1, 2, 7, ALL_THREADS, b"", int4(0))  # not served: the threads run now
    assert h.router.foresight.wasted == 1


def test_a_refused_speculative_command_is_stored_but_nothing_follows_it() -> None:
    h = on(1, inflight=64)
    h.handle(VmBytes(composite(ALL, bp(5))))
    assert h.handle(VmBytes(reply(5, b"", error=13))) == []  # Frames: THREAD_NOT_SUSPENDED
    served(h, 1, 10, FRAMES, tid(T1) + ALL_FRAMES, b"", error=13)


def test_under_event_thread_only_the_event_thread_s_frames_are_foreseen() -> None:
    h = on(1, inflight=64)
    event = composite(THREAD, bp(5))
    assert (
        h.book()
        >> VmBytes(event)
        << SendToDebugger(1, event)
        << SendToVm(cmd(3, FRAME_COUNT, tid(T1)))
        << SendToVm(cmd(4, FRAMES, tid(T1) + ALL_FRAMES))
        >> VmBytes(reply(3, int4(1)))
    )
    served(h, 1, 10, FRAME_COUNT, tid(T1), int4(1))
    asked(h, 1, 11, 5, ALL_THREADS, b"", THREADS)  # other threads run
    asked(h, 1, 12, 6, ALL_THREADS, b"", THREADS)  # and so nothing else is stored
    asked(h, 1, 13, 7, FRAME_COUNT, tid(T2), int4(3))


def test_speculation_is_bounded_in_flight() -> None:
    h = on(1, inflight=2)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    assert sent(out) == [cmd(3, ALL_THREADS), cmd(4, FRAME_COUNT, tid(T1))]
    out = h.handle(VmBytes(reply(4, int4(1))))
    assert sent(out) == [cmd(5, FRAMES, tid(T1) + ALL_FRAMES)]


def test_speculation_is_bounded_in_bytes_held() -> None:
    h = on(1, inflight=64, held=8)
    h.handle(VmBytes(composite(ALL, bp(5))))
    assert sent(h.handle(VmBytes(reply(3, THREADS)))) == []  # too large to hold: nothing more


def test_frames_shapes_are_learned_from_what_debuggers_asked() -> None:
    h = on(1, inflight=64)
    h.handle(VmBytes(composite(ALL, bp(5))))
    asked(h, 1, 10, 6, FRAMES, tid(T1) + int4(0) + int4(1), FRAMES_REPLY)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    assert cmd(9, FRAMES, tid(T1) + int4(0) + int4(1))[9:] in [d[9:] for d in sent(out)]


# ------------------------------------------------------------------------------ off


def test_with_foresight_off_the_lanes_are_today_s() -> None:
    h = Bridged()
    assert h.router.off_lane is OFF_LANE
    assert h.router.read_replies is READ_REPLIES
    assert not h.router.foresight.on


def test_auto_turns_foresight_on_over_the_threshold() -> None:
    h = Bridged(speculate=("auto", 0.002, 64, 1 << 20))
    r = h.router
    h.handle(VmConnected(0.0))
    r.now = 1.0
    vm_id, _ = r.send_own("ddmd", 1, 1, b"", float("inf"))
    r.now = 1.001
    h.handle(VmBytes(reply(vm_id, b"v")))
    assert not r.foresight.on
    # Slow answers: on only once each of the last four samples is over the threshold (one
    # moment of load, a slow command, a pipelined burst inflates only some).
    for k in range(4):
        assert not r.foresight.on
        r.now = 2.0 + k
        vm_id, _ = r.send_own("ddmd", 1, 1, b"", float("inf"))
        r.now = 2.2 + k
        h.handle(VmBytes(reply(vm_id, b"v")))
    assert r.foresight.on
    assert r.off_lane[(1 << 8) | 4] == 0  # AllThreads is read now
    srtt = 0.001
    for _ in range(4):
        srtt += (0.2 - srtt) / 8
    assert r.foresight.rtt == pytest.approx(srtt)  # what users see: TCP's smoothing
    assert Playbook  # (the module's style)


def test_commands_that_cost_the_vm_work_are_not_round_trip_samples() -> None:
    # Clearing a breakpoint (HotSpot deoptimizes) takes the VM milliseconds on a local link.
    h = Bridged(speculate=("auto", 0.002, 64, 1 << 20))
    r = h.router
    h.handle(VmConnected(0.0))
    for k in range(6):
        r.now = 1.0 + k
        vm_id, _ = r.send_own("ddmd", 15, 2, bytes([2]) + int4(k), float("inf"))
        r.now = 1.005 + k
        h.handle(VmBytes(reply(vm_id)))
    assert not r.foresight.on
    assert r.foresight.rtt is None


def test_one_slow_answer_among_fast_ones_leaves_auto_off() -> None:
    h = Bridged(speculate=("auto", 0.002, 64, 1 << 20))
    h.handle(VmConnected(0.0))
    for k, took in enumerate([0.0001, 0.0001, 0.5, 0.0001, 0.3, 0.0001]):
        _round_trip(h, 1.0 + k, took)
    assert not h.router.foresight.on


def _round_trip(h: Bridged, at: float, took: float) -> None:
    r = h.router
    r.now = at
    vm_id, _ = r.send_own("ddmd", 1, 1, b"", float("inf"))
    r.now = at + took
    h.handle(VmBytes(reply(vm_id, b"v")))


def test_auto_turns_foresight_off_at_the_next_session_once_the_vm_is_near_again() -> None:
    h = Bridged(speculate=("auto", 0.002, 64, 1 << 20))
    r = h.router
    h.handle(VmConnected(0.0))
    for k in range(4):  # slow: on
        _round_trip(h, 1.0 + k, 0.2)
    assert r.foresight.on
    joined = (
        h.book()
        >> ConsumerJoined(1, "vm-port", "p")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
    )
    assert joined
    for k in range(4):  # near again, while a debugger is attached: stays on
        _round_trip(h, 10.0 + k, 0.0001)
    assert r.foresight.on
    assert h.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left")
    assert r.foresight.on  # not between sessions either: only when the next one starts
    h.handle(ConsumerJoined(2, "vm-port", "p"))
    h.handle(ConsumerBytes(2, HANDSHAKE))
    assert not r.foresight.on
    assert r.off_lane is OFF_LANE
    assert r.foresight.lasting == {}
    assert r.foresight.scoped == {}


def test_frames_up_to_the_frame_count_are_learned_as_such() -> None:
    """An IDE asks frames(0, min(20, count)): at the next stop, Frames(0, count) once the
    FrameCount reply is in."""
    h = on(1, inflight=64)
    h.handle(VmBytes(composite(ALL, bp(5))))
    h.handle(VmBytes(reply(4, int4(3))))  # FrameCount: 3
    served(h, 1, 9, FRAME_COUNT, tid(T1), int4(3))
    asked(h, 1, 10, 6, FRAMES, tid(T1) + int4(0) + int4(3), FRAMES_REPLY)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    count = [d for d in sent(out) if d[9:11] == bytes(FRAME_COUNT)]
    assert count
    out = h.handle(VmBytes(reply(int.from_bytes(count[0][4:8], "big"), int4(2))))
    assert [d[11:] for d in sent(out)] == [tid(T1) + int4(0) + int4(2)]


def test_ddmd_s_class_unload_events_reach_no_later_debugger_either() -> None:
    """The last debugger leaving resets the bridge; ddmd's request stays in the VM, and hidden."""
    h = on(1)
    assert h.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left")
    assert (
        h.book()
        >> ConsumerJoined(2, "vm-port", "p")
        >> ConsumerBytes(2, HANDSHAKE)
        << SendToDebugger(2, HANDSHAKE)
        >> VmBytes(composite(0, ev(9, OWN_REQUEST, int4(3) + b"LA;")))  # nothing to debugger 2
    )


def test_a_twin_whose_asker_left_still_answers_who_waits_for_it() -> None:
    h = on(1, 2)
    stop_both = composite(ALL, bp(0))
    assert (
        h.book()
        >> VmBytes(stop_both)
        << SendToDebugger(1, stop_both)
        << SendToDebugger(2, stop_both)
        >> ConsumerBytes(1, cmd(10, ALL_THREADS))
        << SendToVm(cmd(3, ALL_THREADS))
        >> ConsumerBytes(2, cmd(40, ALL_THREADS))
        >> ConsumerLeft(1, "gone")
        << CloseDebugger(1, "left")  # debugger 2 still holds the shared suspension
        >> VmBytes(reply(3, THREADS))
        << SendToDebugger(2, reply(40, THREADS))
    )
