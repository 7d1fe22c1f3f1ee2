"""Foresight's chains beyond the stop's first questions (``follow.py``, ``learned.py``): the
objects a stop shows, `this` and the fields debuggers read of it, the order of JDI's locals, and
the class data the next debugger session starts with. Playbooks through the router, as in
``test_foresight.py``.
"""

from __future__ import annotations

from ddmd.protocol.jdwp import HANDSHAKE
from ddmd.session.commands import CloseDebugger, Command, SendToDebugger
from ddmd.session.inputs import ConsumerBytes, ConsumerJoined, ConsumerLeft, VmBytes
from tests.session.test_bridge import ALL, T1, THREAD, Bridged, bp, cmd, composite, int4, reply, tid
from tests.session.test_foresight import (
    CLASS,
    FRAME0,
    FRAMES_REPLY,
    GET_VALUES,
    LINE_TABLE,
    METHOD,
    THIS,
    VARIABLES,
    asked,
    on,
    sent,
    served,
)

REFERENCE_TYPE = (9, 1)
OBJECT_VALUES = (9, 2)
STRING_VALUE = (10, 1)
ARRAY_LENGTH = (13, 1)
SIGNATURE = (2, 13)
FIELDS = (2, 14)
INTERFACES = (2, 10)
SUPERCLASS = (3, 1)
SELF = (0x40).to_bytes(8, "big")  # `this`
TEXT, ARRAY, OTHER = (0x41).to_bytes(8, "big"), (0x42).to_bytes(8, "big"), (0x43).to_bytes(8, "big")
OBJECT_CLASS = (0x50).to_bytes(8, "big")
STRING_CLASS = (0x51).to_bytes(8, "big")
FIELD_LIST = int4(2) + (0x60).to_bytes(8, "big") + (0x61).to_bytes(8, "big")
# Tagged values: a string, an int, an array, an object, a null object.
VALUES = int4(5) + b"s" + TEXT + b"I" + int4(7) + b"[" + ARRAY + b"L" + OTHER + b"L" + bytes(8)


def commands(out: list[Command]) -> list[tuple[tuple[int, int], bytes]]:
    """What went to the VM: (set, command) and data of each command."""
    return [((d[9], d[10]), d[11:]) for d in sent(out)]


def vm_id(out: list[Command], command: tuple[int, int], data: bytes) -> int:
    """The VM-side id ``command`` with ``data`` went out under."""
    for d in sent(out):
        if (d[9], d[10]) == command and d[11:] == data:
            return int.from_bytes(d[4:8], "big")
    raise AssertionError(f"{command} {data.hex()} was not sent: {commands(out)}")


def stopped_at_frame_zero(h: Bridged, policy: int = ALL) -> list[Command]:
    """A breakpoint, and the VM's answer to the speculative Frames: what ddmd asks next. The
    debugger asks the frames too (served), as an IDE does at every stop."""
    out = h.handle(VmBytes(composite(policy, bp(5))))
    frames = vm_id(out, (11, 6), tid(T1) + int4(0) + int4(-1))
    out = h.handle(VmBytes(reply(frames, FRAMES_REPLY)))
    served(h, 1, 90, (11, 6), tid(T1) + int4(0) + int4(-1), FRAMES_REPLY)
    return out


def test_the_objects_a_getvalues_reply_shows_are_typed_and_read_ahead() -> None:
    h = on(1, inflight=64)
    stopped_at_frame_zero(h)
    out = h.handle(ConsumerBytes(1, cmd(10, GET_VALUES, tid(T1) + FRAME0 + int4(0))))
    asked_id = vm_id(out, GET_VALUES, tid(T1) + FRAME0 + int4(0))
    out = h.handle(VmBytes(reply(asked_id, VALUES)))
    assert SendToDebugger(1, reply(10, VALUES)) in out
    got = commands(out)
    # Each object: its type; a string: its text; an array: its length; null and ints: nothing.
    assert (REFERENCE_TYPE, TEXT) in got
    assert (STRING_VALUE, TEXT) in got
    assert (REFERENCE_TYPE, ARRAY) in got
    assert (ARRAY_LENGTH, ARRAY) in got
    assert (REFERENCE_TYPE, OTHER) in got
    assert (STRING_VALUE, OTHER) not in got
    assert not any(data == bytes(8) for _, data in got)
    # The type of an object shown leads to its type's name, and that is served.
    out2 = h.handle(VmBytes(reply(vm_id(out, REFERENCE_TYPE, OTHER), b"\x01" + OBJECT_CLASS)))
    assert commands(out2) == [(SIGNATURE, OBJECT_CLASS)]
    signature = vm_id(out2, SIGNATURE, OBJECT_CLASS)
    h.handle(VmBytes(reply(signature, int4(3) + b"LX;" + int4(0))))
    served(h, 1, 11, REFERENCE_TYPE, OTHER, b"\x01" + OBJECT_CLASS)
    served(h, 1, 12, SIGNATURE, OBJECT_CLASS, int4(3) + b"LX;" + int4(0))


def test_objects_are_not_read_ahead_under_event_thread() -> None:
    # Object-immutable replies are stored under ALL only: other threads run and allocate.
    h = on(1, inflight=64)
    stopped_at_frame_zero(h, THREAD)
    out = h.handle(ConsumerBytes(1, cmd(10, GET_VALUES, tid(T1) + FRAME0 + int4(0))))
    out = h.handle(VmBytes(reply(vm_id(out, GET_VALUES, tid(T1) + FRAME0 + int4(0)), VALUES)))
    assert commands(out) == []


def _this_and_its_class(h: Bridged, out: list[Command]) -> list[Command]:
    """The VM answers ThisObject (SELF), the debugger asks it (served), then the VM answers
    its ReferenceType (a class)."""
    out = h.handle(VmBytes(reply(vm_id(out, THIS, tid(T1) + FRAME0), b"L" + SELF)))
    assert commands(out) == [(REFERENCE_TYPE, SELF)]
    served(h, 1, 91, THIS, tid(T1) + FRAME0, b"L" + SELF)
    return h.handle(VmBytes(reply(vm_id(out, REFERENCE_TYPE, SELF), b"\x01" + CLASS)))


def test_this_leads_to_its_class_and_the_fields_debuggers_read_of_such_an_object() -> None:
    h = on(1, inflight=64)
    out = _this_and_its_class(h, stopped_at_frame_zero(h))
    assert (OBJECT_VALUES, SELF + FIELD_LIST) not in commands(out)  # none read its fields yet
    # A debugger reads two fields of `this`: learned for objects of CLASS.
    out = h.handle(ConsumerBytes(1, cmd(10, OBJECT_VALUES, SELF + FIELD_LIST)))
    h.handle(VmBytes(reply(vm_id(out, OBJECT_VALUES, SELF + FIELD_LIST), int4(0))))
    resume = h.handle(ConsumerBytes(1, cmd(11, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    # At the next stop, `this` is another object of CLASS: the same fields are asked ahead.
    out = stopped_at_frame_zero(h)
    other = (0x44).to_bytes(8, "big")
    out = h.handle(VmBytes(reply(vm_id(out, THIS, tid(T1) + FRAME0), b"L" + other)))
    out = h.handle(VmBytes(reply(vm_id(out, REFERENCE_TYPE, other), b"\x01" + CLASS)))
    assert (OBJECT_VALUES, other + FIELD_LIST) in commands(out)


def test_when_this_is_an_object_typed_before_its_fields_are_asked_at_once() -> None:
    h = on(1, inflight=64)
    _this_and_its_class(h, stopped_at_frame_zero(h))
    out = h.handle(ConsumerBytes(1, cmd(10, OBJECT_VALUES, SELF + FIELD_LIST)))
    h.handle(VmBytes(reply(vm_id(out, OBJECT_VALUES, SELF + FIELD_LIST), int4(0))))
    resume = h.handle(ConsumerBytes(1, cmd(11, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    out = stopped_at_frame_zero(h)
    out = h.handle(VmBytes(reply(vm_id(out, THIS, tid(T1) + FRAME0), b"L" + SELF)))
    got = commands(out)
    assert (REFERENCE_TYPE, SELF) in got
    assert (OBJECT_VALUES, SELF + FIELD_LIST) in got


def test_superclasses_are_followed_up_to_the_top_with_what_all_fields_needs() -> None:
    h = on(1, inflight=64)
    out = stopped_at_frame_zero(h)
    out = h.handle(VmBytes(reply(vm_id(out, SUPERCLASS, CLASS), OBJECT_CLASS)))
    assert sorted(commands(out)) == sorted(
        [
            (SIGNATURE, OBJECT_CLASS),
            (FIELDS, OBJECT_CLASS),
            (INTERFACES, OBJECT_CLASS),
            (SUPERCLASS, OBJECT_CLASS),
        ]
    )
    out = h.handle(VmBytes(reply(vm_id(out, SUPERCLASS, OBJECT_CLASS), bytes(8))))  # the top
    assert commands(out) == []


def test_an_object_shown_at_an_earlier_stop_of_the_session_is_not_read_again() -> None:
    # JDI keeps an object's type, a string's text and an array's length once it has them.
    h = on(1, inflight=64)
    stopped_at_frame_zero(h)
    out = h.handle(ConsumerBytes(1, cmd(10, GET_VALUES, tid(T1) + FRAME0 + int4(0))))
    out = h.handle(VmBytes(reply(vm_id(out, GET_VALUES, tid(T1) + FRAME0 + int4(0)), VALUES)))
    h.handle(VmBytes(reply(vm_id(out, REFERENCE_TYPE, TEXT), b"\x01" + STRING_CLASS)))
    resume = h.handle(ConsumerBytes(1, cmd(11, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    stopped_at_frame_zero(h)
    out = h.handle(ConsumerBytes(1, cmd(12, GET_VALUES, tid(T1) + FRAME0 + int4(0))))
    out = h.handle(VmBytes(reply(vm_id(out, GET_VALUES, tid(T1) + FRAME0 + int4(0)), VALUES)))
    got = commands(out)
    assert (REFERENCE_TYPE, TEXT) not in got
    assert (STRING_VALUE, TEXT) not in got
    assert (REFERENCE_TYPE, ARRAY) in got  # its type never came: still asked


def test_the_next_session_asks_the_last_session_s_class_data_again() -> None:
    # Kept keys, not replies: what the next session is served was asked in that session, so an
    # agent's redefinition between sessions shows.
    h = on(1, inflight=64)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    assert h.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left")
    h.handle(ConsumerJoined(2, "vm-port", "p"))
    out = h.handle(ConsumerBytes(2, HANDSHAKE))
    assert SendToDebugger(2, HANDSHAKE) in out
    again = vm_id(out, LINE_TABLE, CLASS + METHOD)
    h.handle(VmBytes(reply(again, b"redefined by an agent meanwhile")))
    served(h, 2, 1, LINE_TABLE, CLASS + METHOD, b"redefined by an agent meanwhile")


def test_a_debugger_asking_before_the_next_session_s_class_data_arrives_waits_for_it() -> None:
    h = on(1, inflight=64)
    asked(h, 1, 10, 3, LINE_TABLE, CLASS + METHOD, b"lines")
    assert h.book() >> ConsumerLeft(1, "gone") << CloseDebugger(1, "left")
    h.handle(ConsumerJoined(2, "vm-port", "p"))
    out = h.handle(ConsumerBytes(2, HANDSHAKE))
    again = vm_id(out, LINE_TABLE, CLASS + METHOD)
    assert h.handle(ConsumerBytes(2, cmd(1, LINE_TABLE, CLASS + METHOD))) == []  # its twin
    out = h.handle(VmBytes(reply(again, b"new lines")))
    assert SendToDebugger(2, reply(1, b"new lines")) in out


def test_jdi_s_locals_are_asked_in_slot_order() -> None:
    def variable(start: int, name: str, signature: str, length: int, slot: int) -> bytes:
        def s(text: str) -> bytes:
            return int4(len(text)) + text.encode()

        return start.to_bytes(8, "big") + s(name) + s(signature) + s("") + int4(length) + int4(slot)

    # Seven variables besides `this` (a java.util.HashMap of capacity 8 would order the names
    # "a", "tag", "seed"); four are out of scope at index 5.
    table = int4(1) + int4(8)
    table += variable(0, "this", "LA;", 20, 0) + variable(4, "tag", "Ljava/lang/String;", 9, 3)
    table += variable(0, "seed", "I", 20, 1) + variable(2, "a", "I", 10, 2)
    table += b"".join(variable(9, f"late{i}", "J", 5, 4 + i) for i in range(4))
    h = on(1, inflight=64)
    out = stopped_at_frame_zero(h)
    out = h.handle(VmBytes(reply(vm_id(out, VARIABLES, CLASS + METHOD), table)))
    slots = int4(3) + int4(1) + b"I" + int4(2) + b"I" + int4(3) + b"L"
    assert (GET_VALUES, tid(T1) + FRAME0 + slots) in commands(out)


def test_at_the_next_stop_only_what_debuggers_asked_at_the_last_one_is_asked_ahead() -> None:
    # jdb at a step asks for the frames only: ddmd stops asking thread statuses and names ahead.
    h = on(1, inflight=64)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    first = {c for c, _ in commands(out)}
    assert first == {(1, 4), (11, 7), (11, 6)}  # a session's first stop: the whole plan
    frames = vm_id(out, (11, 6), tid(T1) + int4(0) + int4(-1))
    h.handle(VmBytes(reply(frames, FRAMES_REPLY)))
    served(h, 1, 10, (11, 6), tid(T1) + int4(0) + int4(-1), FRAMES_REPLY)
    resume = h.handle(ConsumerBytes(1, cmd(11, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    assert {c for c, _ in commands(out)} == {(11, 6)}  # no AllThreads, no FrameCount
    # The debugger asks AllThreads itself at this stop: the next stop asks it ahead again.
    asked(h, 1, 12, vm_id(out, (11, 6), tid(T1) + int4(0) + int4(-1)) + 1, (1, 4), b"", int4(0))
    resume = h.handle(ConsumerBytes(1, cmd(13, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    assert {c for c, _ in commands(out)} == {(1, 4)}


def _next_stop(h: Bridged, their: int) -> list[Command]:
    """The debugger resumes; the VM stops again: what ddmd asks at once."""
    resume = h.handle(ConsumerBytes(1, cmd(their, (1, 9))))
    h.handle(VmBytes(reply(vm_id(resume, (1, 9), b""))))
    return h.handle(VmBytes(composite(ALL, bp(5))))


def test_a_debugger_that_reads_the_event_thread_s_name_alone_gets_it_at_once() -> None:
    # jdb at a step: the frames and the event thread's name, no thread list.
    h = on(1, inflight=64)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    frames = vm_id(out, (11, 6), tid(T1) + int4(0) + int4(-1))
    h.handle(VmBytes(reply(frames, FRAMES_REPLY)))
    served(h, 1, 10, (11, 6), tid(T1) + int4(0) + int4(-1), FRAMES_REPLY)
    out = h.handle(ConsumerBytes(1, cmd(11, (11, 1), tid(T1))))
    h.handle(VmBytes(reply(vm_id(out, (11, 1), tid(T1)), int4(4) + b"main")))
    got = commands(_next_stop(h, 12))
    assert ((11, 1), tid(T1)) in got  # with the frames, in the first burst
    assert ((1, 4), b"") not in got
    assert ((11, 4), tid(T1)) not in got  # never asked: not asked ahead


def test_frames_up_to_the_last_frame_count_are_asked_at_once() -> None:
    # jdb asks FrameCount, then Frames (0, count): at the next stop both go out together.
    h = on(1, inflight=64)
    out = h.handle(VmBytes(composite(ALL, bp(5))))
    count = vm_id(out, (11, 7), tid(T1))
    h.handle(VmBytes(reply(count, int4(1))))
    served(h, 1, 10, (11, 7), tid(T1), int4(1))
    out = h.handle(ConsumerBytes(1, cmd(11, (11, 6), tid(T1) + int4(0) + int4(1))))
    asked_id = vm_id(out, (11, 6), tid(T1) + int4(0) + int4(1))
    h.handle(VmBytes(reply(asked_id, FRAMES_REPLY)))
    got = commands(_next_stop(h, 12))
    assert ((11, 7), tid(T1)) in got
    assert ((11, 6), tid(T1) + int4(0) + int4(1)) in got
