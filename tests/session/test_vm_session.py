"""Every rule of ``VmSession`` as a few lines of Playbook: no event loop, no sockets, no clock.

``Vm`` wraps one session with a clock the script moves: ``Tick(t)`` and ``VmConnected(t)`` set
it, every other input happens at the time last set. The VM's side is built with
``ddmd.protocol`` (``answer``: a reply to ddmd's request N, ``push``: a chunk the VM sends on
its own). ddmd's requests are spelled exactly (``asks(N, chunk)``): the VM-side ids come from
the one ``IdRewriter``, so they are part of what is checked. By default a playbook leaves out
``Log``, ``Changed`` and ``WakeMeAt``; a test that is about them turns them on.
"""

from __future__ import annotations

from typing import Any

import pytest

from ddmd.protocol import ddm
from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.heap import HeapImage
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    CommandPacket,
    CommandSet,
    ReplyPacket,
    VirtualMachineCommand,
    decode_packet,
    encode,
)
from ddmd.session.commands import (
    Changed,
    CloseDebugger,
    Command,
    Log,
    Reconnect,
    Reject,
    Resolve,
    SelectMe,
    SendToDebugger,
    SendToVm,
    WakeMeAt,
)
from ddmd.session.inputs import (
    Call,
    CauseGc,
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    DumpHeap,
    GetStack,
    Input,
    RefreshThreads,
    Tick,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.model import GcOutcome, ThreadSnapshot
from ddmd.session.vm import TRANSITIONS, SessionSettings, VmSession
from tests.session.playbook import Placeholder, Playbook

# ------------------------------------------------------------------------------ the VM's side

APP = "com.example.mail"
ADDRESS = "127.0.0.1:8000"
HELO = ddm.HeloReply(
    1, 4242, "Dalvik v2.1.0", APP, 0, "64-bit (arm64)", "CheckJNI=false", False, APP
)
FEAT = ddm.FeatReply(("hprof-heap-dump", "method-trace-profiling"))
HEAP_INFO = ddm.HeapInfo((ddm.HeapInfoEntry(1, 1_700_000_000_000, 1, 256 << 20, 16 << 20, 1, 2),))
# The worked example of protocol.md 4.4 (V16): 914 units of 8 bytes at 0x12C00000.
SEGMENT = ddm.HeapSegment(
    1, 8, 0x12C00000, 0, 914, bytes.fromhex("0909010291ff91ff115780ff002b2100")
)
THREADS = ddm.ThreadStatus((ddm.ThreadInfo(1, 1, 4242, 10, 2, False),))
TRACE = ddm.StackTrace(1, (ddm.StackFrame("com.example.Main", "main", "Main.java", 12),))
GONE_THREAD = ddm.Fail(1, "Stack trace unavailable")

VM = CommandSet.VIRTUAL_MACHINE
VERSION = (VM, VirtualMachineCommand.VERSION)
DISPOSE = (VM, VirtualMachineCommand.DISPOSE)
# Event.Composite VM_START, suspend policy ALL: a suspend=y VM waits for a debugger to resume it.
VM_START = encode(
    CommandPacket(0, CommandSet.EVENT, 100, bytes.fromhex("02000000015a" + "00" * 12))
)
BREAKPOINT = encode(
    CommandPacket(7, CommandSet.EVENT, 100, bytes.fromhex("0100000001020000000b") + bytes(25))
)


def jstring(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


# VirtualMachine.Version reply of HotSpot: description, JDWP 17.0, VM version, VM name.
HOTSPOT_VERSION = (
    jstring("Java Debug Wire Protocol (Reference Implementation) version 17.0")
    + (17).to_bytes(4, "big")
    + bytes(4)
    + jstring("17.0.9")
    + jstring("OpenJDK 64-Bit Server VM")
)


def asks(vm_id: int, chunk: ddm.Chunk) -> SendToVm:
    """ddmd's DDM request with VM-side id ``vm_id``, byte for byte."""
    return SendToVm(encode(ddm.ddm_command(vm_id, chunk)))


def answer(vm_id: int, *chunks: ddm.Chunk, error: int = 0) -> VmBytes:
    """The VM's reply to request ``vm_id``: these chunks (none: an empty reply) or an error."""
    return VmBytes(encode(ReplyPacket(vm_id, error, ddm.encode_chunks(chunks))))


def push(chunk: ddm.Chunk, packet_id: int = 0x80000001) -> VmBytes:
    """A chunk the VM sends on its own (ART 9+ numbering)."""
    return VmBytes(encode(ddm.ddm_command(packet_id, chunk)))


def cmd(packet_id: int, command: tuple[int, int], data: bytes = b"") -> bytes:
    return encode(CommandPacket(packet_id, command[0], command[1], data))


def reply(packet_id: int, data: bytes = b"", error: int = 0) -> bytes:
    return encode(ReplyPacket(packet_id, error, data))


def sent_chunk(command: Any) -> ddm.Chunk:
    """The one chunk of the DDM request a ``SendToVm`` carries."""
    assert isinstance(command, SendToVm), command
    packet = decode_packet(command.data)
    assert isinstance(packet, CommandPacket), packet
    assert ddm.is_ddm(packet), packet
    (chunk,) = ddm.chunks_of(packet, ddm.Direction.TO_VM)
    return chunk


def describe(item: Any) -> str:
    """A transcript line with the packet bytes decoded (for the playbook's diff)."""
    data = getattr(item, "data", None)
    if not isinstance(item, SendToVm | VmBytes) or not isinstance(data, bytes):
        return repr(item)
    try:
        packet = decode_packet(data)
        if isinstance(packet, ReplyPacket):
            body: object = packet.error_code or ddm.decode_chunks(
                packet.data, ddm.Direction.FROM_VM
            )
            return f"{type(item).__name__}(reply #{packet.id}: {body})"
        direction = ddm.Direction.TO_VM if isinstance(item, SendToVm) else ddm.Direction.FROM_VM
        if ddm.is_ddm(packet):
            body = ddm.chunks_of(packet, direction)
        else:
            body = f"{packet.command_set}/{packet.command}"
        return f"{type(item).__name__}(#{packet.id}: {body})"
    except Exception:  # not one whole, well-formed packet: show the bytes
        return repr(item)


# ------------------------------------------------------------------------------ the harness


class Vm:
    """One ``VmSession`` and the clock of the script."""

    def __init__(self, **settings: Any) -> None:
        self.session = VmSession(
            "vm-1", source="tcp", address=ADDRESS, settings=SessionSettings(**settings)
        )
        self.now = 0.0

    def handle(self, item: Input) -> list[Command]:
        if isinstance(item, Tick | VmConnected):
            assert item.now >= self.now, f"the script's clock runs backwards: {item}"
            self.now = item.now
        return self.session.handle(item, self.now)

    def book(self, *, logs: bool = False, changes: bool = False, wakes: bool = False) -> Playbook:
        ignore = (() if changes else (Changed,)) + (() if wakes else (WakeMeAt,))
        return Playbook(self.handle, logs=logs, ignore=ignore, describe=describe)

    @property
    def unsupported(self) -> dict[str, str]:
        return dict(self.session.snapshot().unsupported_reasons)


def identifying(vm: Vm | None = None, **settings: Any) -> Vm:
    vm = vm or Vm(**settings)
    assert vm.book() >> VmConnected(0.0) << asks(1, ddm.HeloRequest(1))
    return vm


def ready(vm: Vm | None = None, helo: ddm.HeloReply = HELO, **settings: Any) -> Vm:
    """A Dalvik-style VM at t=0 that answered everything: identified, its features listed,
    heap info on. Requests 1-5 are answered, so a test's own requests start at id 6."""
    vm = identifying(vm, **settings)
    assert (
        vm.book()
        >> answer(1, helo)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> answer(2, FEAT)
        >> answer(3)
        >> answer(4)
        >> push(HEAP_INFO)
        >> answer(5)
    )
    assert vm.session.state == "ready"
    assert len(vm.session.router.ids) == 0
    return vm


def plain_jvm(**settings: Any) -> Vm:
    """HotSpot at t=0: HELO refused with error 99, its Version answered."""
    vm = identifying(**settings)
    assert (
        vm.book()
        >> answer(1, error=99)
        << SendToVm(cmd(2, VERSION))
        >> VmBytes(reply(2, HOTSPOT_VERSION))
    )
    return vm


def attach(vm: Vm, *debuggers: int) -> Vm:
    for d in debuggers:
        assert (
            vm.book()
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SendToDebugger(d, HANDSHAKE)
        )
    return vm


def no_chunk_names(message: str) -> bool:
    return not any(name in message for name in ddm.ChunkType.__members__)


# ------------------------------------------------------------------------------ lifecycle


def test_a_connection_starts_with_helo_and_a_wake_up_at_its_deadline() -> None:
    vm = Vm()
    assert (
        vm.book(changes=True, wakes=True)
        >> VmConnected(0.0)
        << asks(1, ddm.HeloRequest(1))
        << Changed()
        << WakeMeAt(5.0)
    )
    assert vm.session.state == "identifying"
    assert vm.session.selection_key() is None


def test_a_helo_reply_identifies_the_vm_and_starts_the_conversation() -> None:
    vm = identifying()
    assert (
        vm.book(changes=True)
        >> answer(1, HELO)
        << Changed(renamed=True)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))  # heap info at every GC
        << asks(5, ddm.HeapInfoRequest(1))  # and now
    )
    snapshot = vm.session.snapshot()
    assert (vm.session.state, snapshot.ddm, snapshot.pid, snapshot.abi) == (
        "ready",
        True,
        4242,
        "64-bit (arm64)",
    )
    assert vm.session.selection_key() == f"local|{APP}"


def test_a_plain_jvm_gets_one_version_request_and_no_ddm_after() -> None:
    vm = identifying()
    assert (
        vm.book(changes=True)
        >> answer(1, error=99)
        << Changed()  # HELO is marked unsupported
        << SendToVm(cmd(2, VERSION))  # the one command of its own ddmd sends unasked
        << Changed(renamed=True)
        >> VmBytes(reply(2, HOTSPOT_VERSION))
        << Changed()
        >> Tick(60.0)
        >> Tick(120.0)
    )
    snapshot = vm.session.snapshot()
    assert (vm.session.state, snapshot.ddm, snapshot.unsupported) == ("ready", False, ("HELO",))
    assert (
        snapshot.description == "Java Debug Wire Protocol (Reference Implementation) version 17.0"
    )
    assert vm.session.selection_key() == f"local|{ADDRESS}"


def test_silence_to_helo_until_its_deadline_marks_it_and_the_vm_is_ready() -> None:
    vm = identifying()
    assert vm.book() >> Tick(4.9)
    assert vm.session.state == "identifying"
    assert (
        vm.book(logs=True)
        >> Tick(5.0)
        << Log("ddm.request_timed_out", fields={"feature": "HELO", "timeout": 5.0})
        << Log("vm.feature_unsupported", fields=Placeholder())
    )
    assert vm.session.state == "ready"
    assert vm.unsupported == {"HELO": "no answer within 5 s"}
    assert vm.session.snapshot().ddm is None  # kept: still debuggable
    assert vm.session.selection_key() == f"local|{ADDRESS}"


@pytest.mark.parametrize(
    ("make", "item", "message"),
    [
        (ready, VmConnected(1.0), "'connected' cannot happen in 'ready'"),
        (identifying, VmConnected(1.0), "'connected' cannot happen in 'identifying'"),
    ],
    ids=["ready", "identifying"],
)
def test_an_input_the_table_does_not_allow_raises(make: Any, item: Input, message: str) -> None:
    vm = make()
    with pytest.raises(LocalProtocolError, match=message):
        vm.handle(item)


def test_closed_is_the_end() -> None:
    vm = ready()
    assert (
        vm.book(changes=True)
        >> VmClosed("eof")
        << Changed()
        >> VmClosed("eof again")
        >> ConsumerJoined(1, "current", "127.0.0.1:40001")
        << CloseDebugger(1, "rejected")
    )
    assert vm.session.state == "closed"
    assert vm.session.snapshot().state == "disconnected"
    with pytest.raises(LocalProtocolError, match="'connected' cannot happen in 'closed'"):
        vm.handle(VmConnected(1.0))
    assert not [state for state, _ in TRANSITIONS if state == "closed"]


# ------------------------------------------------------------------------------ reply expectations


def test_silence_to_then_heap_info_and_gc_marks_nothing() -> None:
    # ART 9+ without its agent: requests whose handler returns nothing get no reply at all.
    vm = identifying()
    assert (
        vm.book()
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> push(ddm.ThreadCreated(1, "main"))
        >> push(HEAP_INFO)  # heap info now: pushed, then silence
        >> answer(2, FEAT)
        >> Call(1, CauseGc())
        << asks(6, ddm.GcRequest())
        >> push(HEAP_INFO)  # the GC's heap info
        << Resolve(1, GcOutcome(True, "heap info"))
        >> Tick(60.0)
    )
    assert vm.unsupported == {}
    assert len(vm.session.router.ids) == 0


def test_silence_to_a_thread_status_request_marks_thread_states_missing() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, RefreshThreads())
        << asks(6, ddm.ThreadStatusRequest())
        >> Tick(5.0)
        << Resolve(1, None)
        >> Call(2, RefreshThreads())  # no more thread-state requests to this VM
        << Resolve(2, None)
        >> Tick(6.0)
    )
    assert vm.unsupported == {
        "THST": "no answer within 5 s; newer Android versions removed the thread handlers"
    }


def test_a_fail_to_a_gc_marks_it_and_the_call_is_refused_in_words() -> None:
    message = Placeholder("message")
    vm = ready()
    assert (
        vm.book()
        >> Call(1, CauseGc())
        << asks(6, ddm.GcRequest())
        >> answer(6, ddm.Fail(1, "not on this VM"))
        << Reject(1, "unsupported", message)
        >> Call(2, CauseGc())  # known now: refused at once
        << Reject(2, "unsupported", message)
    )
    assert message.value == (
        f"{APP} does not run garbage collections on request (it refused: not on this VM (code 1))"
    )
    assert no_chunk_names(message.value)
    assert "HPGC" in vm.unsupported


def test_a_jdwp_error_to_a_quiet_request_marks_it() -> None:
    vm = identifying()
    assert (
        vm.book()
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> answer(3, error=99)
    )
    assert vm.unsupported == {"THEN": "it answered: JDWP error 99 (NOT_IMPLEMENTED)"}


@pytest.mark.parametrize("ending", [answer(5), Tick(5.0)], ids=["empty reply", "silence"])
def test_heap_info_now_without_a_push_marks_heap_info_and_segments(ending: Input) -> None:
    # Android 12+: the heap handlers are gone, so "heap info now" produces nothing.
    vm = identifying()
    assert (
        vm.book()
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> answer(2, FEAT)
        >> ending
        >> Call(1, DumpHeap())
        << Reject(1, "unsupported", message := Placeholder("message"))
    )
    assert set(vm.unsupported) == {"HPIF", "HPSG"}
    assert message.value == (
        f"{APP} does not report heap segments (it reports no heap information; "
        "Android 12 removed both)"
    )
    assert no_chunk_names(message.value)


def test_draft_heap_info_inside_the_reply_counts_as_heap_info() -> None:
    vm = identifying()
    assert (
        vm.book()
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> answer(2, FEAT)
        >> answer(5, HEAP_INFO)  # the 2007 draft: the heap info is the reply
        >> Tick(60.0)
    )
    assert vm.unsupported == {}
    assert vm.session.snapshot().heaps[0].max_size == 256 << 20


# ------------------------------------------------------------------------------ calls: gc


def test_a_gc_is_confirmed_by_its_heap_info_push() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, CauseGc())
        << asks(6, ddm.GcRequest())
        >> push(HEAP_INFO)
        << Resolve(1, GcOutcome(True, "heap info"))
        >> answer(6)  # the reply after it changes nothing
    )


def test_a_gc_is_confirmed_by_an_empty_reply() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, CauseGc())
        << asks(6, ddm.GcRequest())
        >> answer(6)
        << Resolve(1, GcOutcome(True, "reply"))
    )


def test_a_gc_on_a_vm_without_heap_info_is_unconfirmed_after_a_short_wait() -> None:
    vm = identifying()
    assert (
        vm.book()
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> answer(2, FEAT)
        >> Tick(5.0)  # no heap info ever: HPIF is marked
        >> Call(1, CauseGc())
        << asks(6, ddm.GcRequest())  # and no "heap info at the next GC" first
        >> Tick(5.9)
        >> Tick(6.0)  # quiet_confirm (1 s), not the whole request deadline
        << Resolve(
            1,
            GcOutcome(
                False, None, "the VM gave no confirmation: it does not report heap information"
            ),
        )
    )


def test_a_gc_before_heap_info_is_on_asks_for_it_at_the_next_gc() -> None:
    vm = identifying()
    assert (
        vm.book()
        >> Call(1, CauseGc())
        << asks(2, ddm.HeapInfoRequest(2))
        << asks(3, ddm.GcRequest())
        >> push(HEAP_INFO)
        << Resolve(1, GcOutcome(True, "heap info"))
    )


# ------------------------------------------------------------------------------ calls: heap dumps


def test_a_heap_dump_resolves_on_the_heap_end_with_the_images() -> None:
    images = Placeholder("images")
    vm = ready()
    assert (
        vm.book()
        >> Call(1, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))  # segments on
        << asks(7, ddm.GcRequest())
        >> answer(6)
        >> answer(7)
        >> push(ddm.HeapStart(1))
        >> push(SEGMENT)
        >> push(ddm.HeapEnd(1))
        << asks(8, ddm.HeapSegmentRequest(0, 0))  # segments off
        << Resolve(1, images)
    )
    (image,) = images.value
    assert isinstance(image, HeapImage)
    assert (image.heap_id, image.native, image.complete, image.unit_size) == (1, False, True, 8)
    assert image.spans() == ((0x12C00000, 0x12C00000 + 914 * 8),)


def test_a_heap_dump_without_segments_times_out() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))
        << asks(7, ddm.GcRequest())
        >> Tick(4.9)
        >> Tick(5.0)
        << asks(8, ddm.HeapSegmentRequest(0, 0))
        << Reject(1, "timed_out", f"{APP} sent no heap segments within 5 s of the GC")
    )


def test_overlapping_heap_dumps_both_end_and_segments_go_off_once_after_the_last() -> None:
    # Issue 10's first race: a second dump overwrote the first one's "done" signal.
    vm = ready()
    images = Placeholder("images")
    assert (
        vm.book()
        >> Call(1, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))
        << asks(7, ddm.GcRequest())
        >> Call(2, DumpHeap())
        << asks(8, ddm.HeapSegmentRequest(1, 0))
        << asks(9, ddm.GcRequest())
        >> push(ddm.HeapStart(1))
        >> push(SEGMENT)
        >> push(ddm.HeapEnd(1))
        << Resolve(1, images)
        << asks(10, ddm.HeapSegmentRequest(0, 0))
        << Resolve(2, images)
    )


def test_segments_stay_on_while_a_later_dump_still_waits() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))
        << asks(7, ddm.GcRequest())
        >> Tick(3.0)
        >> Call(2, DumpHeap())
        << asks(8, ddm.HeapSegmentRequest(1, 0))
        << asks(9, ddm.GcRequest())
        >> Tick(5.0)
        << Reject(1, "timed_out", Placeholder())  # segments stay on: call 2 still waits
        >> Tick(6.0)
        >> push(ddm.HeapStart(1))
        >> push(ddm.HeapEnd(1))
        << asks(10, ddm.HeapSegmentRequest(0, 0))
        << Resolve(2, Placeholder())
        >> Tick(60.0)
    )


def test_a_heap_dump_refused_before_the_vm_connects_leaves_the_count_alone() -> None:
    vm = Vm()
    assert vm.book() >> Call(1, DumpHeap()) << Reject(1, "gone", "vm-1 is not connected")
    ready(vm)
    assert (
        vm.book()
        >> Call(2, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))
        << asks(7, ddm.GcRequest())
        >> push(ddm.HeapStart(1))
        >> push(ddm.HeapEnd(1))
        << asks(8, ddm.HeapSegmentRequest(0, 0))  # segments go off after the only real dump
        << Resolve(2, Placeholder())
    )


# ------------------------------------------------------------------------ calls: stacks, threads


def test_a_stack_trace_is_resolved_with_the_trace() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, GetStack(1))
        << asks(6, ddm.StackTraceRequest(1))
        >> answer(6, TRACE)
        << Resolve(1, TRACE)
    )


def test_a_stack_trace_of_a_thread_that_ended_fails() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, GetStack(9))
        << asks(6, ddm.StackTraceRequest(9))
        >> answer(6, GONE_THREAD)
        << Reject(
            1, "failed", f"{APP} could not give a stack trace: Stack trace unavailable (code 1)"
        )
    )
    assert vm.unsupported == {}  # one thread's trace, not the feature


def test_refresh_threads_resolves_after_the_thread_status_reply() -> None:
    vm = ready()
    assert (
        vm.book()
        >> push(ddm.ThreadCreated(1, "main"))
        >> Call(1, RefreshThreads())
        << asks(6, ddm.ThreadStatusRequest())
        >> answer(6, THREADS)
        << Resolve(1, None)
    )
    assert vm.session.snapshot().threads == (
        ThreadSnapshot(1, "main", 1, "running", 4242, 10, 2, False),
    )


def test_refresh_threads_asks_again_after_an_answered_poll() -> None:
    vm = ready()
    assert (
        vm.book()
        >> Call(1, RefreshThreads())
        << asks(6, ddm.ThreadStatusRequest())
        >> answer(6, THREADS)
        << Resolve(1, None)
        >> Tick(30.0)  # the lease is long over
        >> Call(2, RefreshThreads())
        << asks(7, ddm.ThreadStatusRequest())  # fresh states, not the ones from t=0
        >> answer(7, THREADS)
        << Resolve(2, None)
    )


@pytest.mark.parametrize(
    ("request_", "what"),
    [
        (GetStack(1), "has no stack traces"),
        (DumpHeap(), "has no heap segments"),
        (CauseGc(), "does not run garbage collections on request"),
    ],
)
def test_calls_on_a_plain_jvm_are_refused_at_once(request_: Any, what: str) -> None:
    vm = plain_jvm()
    assert (
        vm.book()
        >> Call(1, request_)
        << Reject(
            1,
            "unsupported",
            f"JVM at {ADDRESS} does not speak DDM (a plain JVM has none), so it {what}",
        )
    )


def test_the_end_of_the_connection_rejects_every_pending_call_at_once() -> None:
    gone = f"{APP} went away (the VM disconnected)"
    vm = ready()
    assert (
        vm.book()
        >> Call(1, GetStack(1))
        << asks(6, ddm.StackTraceRequest(1))
        >> Call(2, DumpHeap())
        << asks(7, ddm.HeapSegmentRequest(1, 0))
        << asks(8, ddm.GcRequest())
        >> Call(3, RefreshThreads())
        << asks(9, ddm.ThreadStatusRequest())
        >> VmClosed("eof")
        << Reject(1, "gone", gone)
        << Reject(2, "gone", gone)  # and no "segments off" to a closed connection
        << Reject(3, "gone", gone)
        >> Call(4, GetStack(1))
        << Reject(4, "gone", "com.example.mail is not connected")
        >> Tick(60.0)
    )
    assert len(vm.session.router.ids) == 0


def test_a_caller_that_went_away_leaves_the_session_usable() -> None:
    # Issue 10's second race: a caller cancelled before its request was written could mark the
    # VM connection broken. Here a call is only data: the session never learns that its caller
    # left, answers into the void at the deadline, and its ids expire.
    vm = ready()
    assert (
        vm.book()
        >> Call(1, DumpHeap())
        << asks(6, ddm.HeapSegmentRequest(1, 0))
        << asks(7, ddm.GcRequest())
        >> Tick(5.0)
        << asks(8, ddm.HeapSegmentRequest(0, 0))
        << Reject(1, "timed_out", Placeholder())
        >> Tick(10.0)
    )
    assert len(vm.session.router.ids) == 0
    assert vm.session.state == "ready"
    assert (
        vm.book()
        >> Call(2, GetStack(1))
        << asks(9, ddm.StackTraceRequest(1))
        >> answer(9, TRACE)
        << Resolve(2, TRACE)
    )


# ------------------------------------------------------------------------------ polling


def test_thread_states_are_polled_at_a_fixed_rate_while_a_lease_lasts() -> None:
    vm = ready()
    assert (
        vm.book(wakes=True)
        >> Tick(10.0)
        >> Call(1, RefreshThreads())  # a lease of 5 s: polls every 0.5 s until t=15
        << asks(6, ddm.ThreadStatusRequest())
        << WakeMeAt(10.5)
        >> answer(6, THREADS)
        << Resolve(1, None)
        >> Tick(10.5)
        << asks(7, ddm.ThreadStatusRequest())
        << WakeMeAt(11.0)
        >> Tick(11.0)  # 7 is still out: no second request
        << WakeMeAt(11.5)
        >> answer(7, THREADS)
        >> Tick(12.3)  # 11.5 and 12.0 were missed: one request, then back on the grid
        << asks(8, ddm.ThreadStatusRequest())
        << WakeMeAt(12.5)
        >> answer(8, THREADS)
        >> Tick(15.0)  # the lease is over: no poll and nothing to wake up for
        >> Tick(20.0)
    )


def test_the_poll_phase_places_the_polls_in_the_interval() -> None:
    vm = ready(poll_phase=0.5)
    assert (
        vm.book(wakes=True)
        >> Tick(10.0)
        >> Call(1, RefreshThreads())
        << asks(6, ddm.ThreadStatusRequest())
        << WakeMeAt(10.25)
        >> answer(6, THREADS)
        << Resolve(1, None)
        >> Tick(10.25)
        << asks(7, ddm.ThreadStatusRequest())
        << WakeMeAt(10.75)
    )


def test_always_polled_threads_start_with_the_identification() -> None:
    vm = identifying(always_poll_threads=True)
    assert (
        vm.book(wakes=True)
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        << asks(6, ddm.ThreadStatusRequest())
        << WakeMeAt(0.5)
    )


def test_the_wake_up_follows_the_earliest_deadline() -> None:
    vm = ready()
    assert (
        vm.book(wakes=True)
        >> Tick(1.0)
        >> Call(1, GetStack(1))
        << asks(6, ddm.StackTraceRequest(1))
        << WakeMeAt(6.0)
        >> Tick(2.0)
        << WakeMeAt(6.0)  # asked again after every Tick (a fired wake-up is forgotten)
        >> Call(2, CauseGc())
        << asks(7, ddm.GcRequest())
        >> answer(6, TRACE)
        << Resolve(1, TRACE)
        << WakeMeAt(7.0)
        >> answer(7)
        << Resolve(2, GcOutcome(True, "reply"))
    )


# ------------------------------------------------------------------------------ debuggers


def test_a_debugger_over_the_limit_is_turned_away_naming_the_holder() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book(logs=True)
        >> ConsumerJoined(2, "current", "127.0.0.1:40002")
        << Log(
            "debugger.rejected",
            "warning",
            {
                "peer": "127.0.0.1:40002",
                "via": "current",
                "reason": "vm-1 already has a debugger",
                "holder": "127.0.0.1:40001",
                "holder_via": "vm-port",
            },
        )
        << CloseDebugger(2, "rejected")
    )


def test_with_two_allowed_the_third_is_turned_away_and_the_last_to_leave_releases() -> None:
    vm = attach(ready(max_debuggers=2), 1, 2)
    assert (
        vm.book()
        >> ConsumerJoined(3, "current", "127.0.0.1:40003")
        << CloseDebugger(3, "rejected")
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")  # debugger 2 still works with the VM: no release
        >> ConsumerLeft(2, "debugger closed the connection")
        << CloseDebugger(2, "left")
        << asks(6, ddm.Dbgd())
    )
    assert vm.session.state == "releasing"


def test_dispose_is_answered_here_and_starts_the_release() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, cmd(9, DISPOSE))
        << SendToDebugger(1, reply(9))  # never forwarded to the VM
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
    )
    assert vm.session.state == "releasing"


def test_an_acknowledged_release_keeps_the_connection_and_lets_the_held_debugger_in() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book(changes=True)
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << Changed()
        << asks(6, ddm.Dbgd())
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> ConsumerBytes(2, HANDSHAKE)  # held while the VM lets go of debugger 1
    )
    assert vm.session.state == "releasing"
    assert (
        vm.book(changes=True)
        >> answer(6, ddm.Dbgd())
        << SendToDebugger(2, HANDSHAKE)
        << Changed()
        << Changed()
        >> Tick(60.0)  # longer than [timeouts] reconnect: debugger 2 is attached, not waiting
        >> VmBytes(BREAKPOINT)
        << SendToDebugger(2, BREAKPOINT)
    )
    assert vm.session.state == "ready"
    assert vm.session.snapshot().state == "ready"


@pytest.mark.parametrize(
    "ending",
    [Tick(1.0), answer(6), answer(6, ddm.Fail(1, "no")), answer(6, error=99)],
    ids=["silence", "empty reply", "FAIL", "JDWP error"],
)
def test_a_release_without_acknowledgement_reconnects(ending: Input) -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> ConsumerBytes(2, HANDSHAKE)
        >> ending
        << Reconnect("recycled after the debugger left")
    )
    assert vm.session.state == "reconnecting"
    assert (
        vm.book()
        >> VmConnected(2.0)
        << SendToDebugger(2, HANDSHAKE)  # the held handshake completes on the new connection
        << asks(7, ddm.HeloRequest(1))  # and the VM is identified again
    )
    assert vm.session.state == "identifying"
    assert vm.session.reconnects == 1


def test_a_call_while_the_connection_is_reopened_is_refused_and_marks_nothing() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> Tick(1.0)
        << Reconnect("recycled after the debugger left")
        >> Call(1, GetStack(1))  # nothing may be written to the connection being closed
        << Reject(1, "gone", f"{APP} is not connected")
        >> Call(2, DumpHeap())
        << Reject(2, "gone", f"{APP} is not connected")
        >> VmConnected(2.0)
        << asks(7, ddm.HeloRequest(1))
        >> answer(7, HELO)
        << asks(8, ddm.FeatRequest())
        << asks(9, ddm.ThreadNotify(True))
        << asks(10, ddm.HeapInfoRequest(3))
        << asks(11, ddm.HeapInfoRequest(1))
        >> answer(8, FEAT)
        >> answer(9)
        >> answer(10)
        >> push(HEAP_INFO)
        >> answer(11)
        >> Tick(60.0)
        >> Call(3, DumpHeap())
        << asks(12, ddm.HeapSegmentRequest(1, 0))  # segments: only this dump counts
        << asks(13, ddm.GcRequest())
        >> push(ddm.HeapStart(1))
        >> push(ddm.HeapEnd(1))
        << asks(14, ddm.HeapSegmentRequest(0, 0))
        << Resolve(3, Placeholder())
    )
    assert vm.unsupported == {}


def test_a_plain_jvm_keeps_its_connection_and_is_not_asked_for_ddm_again() -> None:
    vm = attach(plain_jvm(), 1)
    assert (
        vm.book()
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")  # it held nothing: ready at once, no reconnect
    )
    assert vm.session.state == "ready"
    attach(vm, 2)  # no HELO again, and the handshake is answered at once


def test_a_plain_jvm_s_release_waits_dbgd_ack_from_when_the_debugger_left() -> None:
    vm = attach(plain_jvm(), 1)
    set_bp = bytes([2, 2]) + (0).to_bytes(4, "big")  # a breakpoint, suspend all
    assert (
        vm.book()
        >> ConsumerBytes(1, cmd(1, (15, 1), set_bp))
        << SendToVm(cmd(3, (15, 1), set_bp))
        >> VmBytes(reply(3, (5).to_bytes(4, "big")))
        << SendToDebugger(1, reply(1, (5).to_bytes(4, "big")))
        >> Tick(5.0)
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(4, (15, 2), bytes([2]) + (5).to_bytes(4, "big")))
        >> Tick(5.9)  # [timeouts] dbgd_ack (1 s) after the debugger left: not yet
        >> Tick(6.0)
        << Reconnect("recycled after the debugger left")
    )
    assert vm.session.state == "reconnecting"


def test_a_debugger_that_waits_longer_than_the_reconnect_timeout_is_closed() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << asks(6, ddm.Dbgd())
        >> Tick(1.0)
        << Reconnect("recycled after the debugger left")
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> ConsumerBytes(2, HANDSHAKE)
        >> Tick(10.9)
    )
    assert (
        vm.book(logs=True)
        >> Tick(11.0)
        << Log(
            "debugger.rejected",
            "warning",
            {"debugger": 2, "reason": "vm-1 did not come back within [timeouts] reconnect"},
        )
        << CloseDebugger(2, "the VM did not come back")
    )
    # The session forgot debugger 2 (the driver reports nothing more about a closed debugger):
    # it neither gets a handshake later nor holds the only debugger place.
    assert (
        vm.book()
        >> VmConnected(12.0)
        << asks(7, ddm.HeloRequest(1))
        >> ConsumerJoined(3, "vm-port", "127.0.0.1:40003")
        >> ConsumerBytes(3, HANDSHAKE)
        << SendToDebugger(3, HANDSHAKE)
    )


def test_a_vm_waiting_for_a_debugger_asks_to_be_selected() -> None:
    vm = ready()
    assert (
        vm.book()
        >> push(ddm.WaitForDebugger(0))
        << SelectMe("waiting for a debugger")
        >> push(ddm.WaitForDebugger(0))  # said again: no second request
    )
    assert vm.session.snapshot().waiting_for_debugger is True
    attach(vm, 1)
    assert vm.session.snapshot().waiting_for_debugger is False


def test_a_vm_waiting_while_a_debugger_is_attached_is_not_selected() -> None:
    vm = attach(ready(), 1)
    assert vm.book() >> push(ddm.WaitForDebugger(0))


def test_vm_events_go_to_the_debugger_and_ddm_pushes_do_not() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> VmBytes(BREAKPOINT)
        << SendToDebugger(1, BREAKPOINT)
        >> push(ddm.ThreadCreated(5, "worker"))
    )


def test_a_suspending_vm_start_is_held_for_the_first_debugger() -> None:
    vm = Vm()
    assert (
        vm.book()
        >> VmConnected(0.0, leftover=VM_START)
        << asks(1, ddm.HeloRequest(1))
        >> answer(1, HELO)
        << asks(2, ddm.FeatRequest())
        << asks(3, ddm.ThreadNotify(True))
        << asks(4, ddm.HeapInfoRequest(3))
        << asks(5, ddm.HeapInfoRequest(1))
        >> ConsumerJoined(1, "current", "127.0.0.1:40001")
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
        << SendToDebugger(1, VM_START)
    )


def test_a_debugger_command_gets_a_fresh_vm_id_and_its_own_back() -> None:
    vm = attach(ready(), 1)
    assert (
        vm.book()
        >> ConsumerBytes(1, cmd(1, VERSION))  # JDI's ids collide with ddmd's: rewritten
        << SendToVm(cmd(6, VERSION))
        >> Call(1, GetStack(1))
        << asks(7, ddm.StackTraceRequest(1))
        >> VmBytes(reply(6, HOTSPOT_VERSION))
        << SendToDebugger(1, reply(1, HOTSPOT_VERSION))
        >> answer(7, TRACE)
        << Resolve(1, TRACE)
    )


# ------------------------------------------------------------------------------ pushes


def test_a_new_app_name_renames_the_vm() -> None:
    unbound = ddm.HeloReply(
        1, 4242, "Dalvik v2.1.0", "<pre-initialized>", 0, "64-bit", "", False, "<pre-initialized>"
    )
    vm = ready(helo=unbound)
    assert vm.session.selection_key() is None
    assert (
        vm.book(changes=True)
        >> push(ddm.AppName(APP, 0, APP))
        << Changed(renamed=True)
        >> push(ddm.AppName(APP, 0, APP))  # the same name again changes nothing
    )
    assert vm.session.selection_key() == f"local|{APP}"
    assert vm.session.name == APP


def test_thread_pushes_update_the_thread_list() -> None:
    vm = ready()
    assert (
        vm.book(changes=True)
        >> push(ddm.ThreadCreated(1, "main"))
        << Changed()
        >> push(ddm.ThreadCreated(2, "worker"))
        << Changed()
        >> push(ddm.ThreadRenamed(2, "pool-1"))
        << Changed()
        >> push(ddm.ThreadDied(1))
        << Changed()
        >> push(ddm.ThreadDied(7))  # never known: nothing changes
    )
    assert vm.session.snapshot().threads == (ThreadSnapshot(2, "pool-1"),)


def test_a_malformed_push_is_logged_and_nothing_else_breaks() -> None:
    truncated_thcr = b"THCR" + (2).to_bytes(4, "big") + b"\x00\x01"  # 2 of a u4 thread id
    vm = ready()
    assert (
        vm.book(logs=True)
        >> VmBytes(encode(CommandPacket(0x80000001, CommandSet.DDM, 1, truncated_thcr)))
        << Log("ddm.chunk_malformed", "warning", {"error": Placeholder(), "id": 0x80000001})
        >> push(ddm.ThreadCreated(1, "main"), packet_id=0x80000002)
    )
    assert vm.session.snapshot().threads == (ThreadSnapshot(1, "main"),)
    assert vm.session.state == "ready"


def test_a_zlib_wrapped_push_is_unwrapped() -> None:
    vm = ready()
    assert vm.book() >> push(ddm.compress_chunk(ddm.ThreadCreated(1, "main")))
    assert vm.session.snapshot().threads == (ThreadSnapshot(1, "main"),)


def test_everything_ddmd_writes_of_its_own_to_a_ddm_vm_is_one_ddm_request() -> None:
    # ART 9+ loads a debugger agent for good at the first packet that is not DDM (protocol.md
    # 1.5), so nothing else may leave the session unless a debugger sent it.
    vm = ready()
    script: list[Input] = [
        Call(1, RefreshThreads()),
        Call(2, CauseGc()),
        Call(3, DumpHeap()),
        Call(4, GetStack(1)),
        Tick(2.0),
        Tick(10.0),
        ConsumerJoined(1, "vm-port", "127.0.0.1:40001"),
        ConsumerBytes(1, HANDSHAKE),
        ConsumerLeft(1, "debugger closed the connection"),
        Tick(12.0),  # no acknowledgement of the release: reconnect
        VmConnected(13.0),
    ]
    sent = [c for item in script for c in vm.handle(item) if isinstance(c, SendToVm)]
    assert [type(sent_chunk(c)).__name__ for c in sent] == [
        "ThreadStatusRequest",
        "GcRequest",
        "HeapSegmentRequest",  # on
        "GcRequest",
        "StackTraceRequest",
        "HeapSegmentRequest",  # off, when the dump timed out
        "Dbgd",
        "HeloRequest",  # on the new connection
    ]


# ------------------------------------------------------------------------------ plain JVM threads

SIZES = bytes.fromhex("0000000800000008000000080000000800000008")
THREAD_IDS = (0x101, 0x102)
GROUP = 0x201


def jobject(value: int) -> bytes:
    return value.to_bytes(8, "big")


def all_threads(*ids: int) -> bytes:
    return len(ids).to_bytes(4, "big") + b"".join(jobject(i) for i in ids)


def status(state: int, suspended: int = 0) -> bytes:
    return state.to_bytes(4, "big") + suspended.to_bytes(4, "big")


def test_a_plain_jvm_gets_its_thread_list_over_jdwp_with_ddmds_own_ids() -> None:
    vm = plain_jvm()
    t1, t2 = THREAD_IDS
    assert (
        vm.book()
        >> Call(1, RefreshThreads())
        << SendToVm(cmd(3, (1, 7)))  # IDSizes, once per connection
        >> VmBytes(reply(3, SIZES))
        << SendToVm(cmd(4, (1, 4)))  # AllThreads
        >> VmBytes(reply(4, all_threads(t1, t2)))
        << SendToVm(cmd(5, (11, 4), jobject(t1)))  # Status
        << SendToVm(cmd(6, (11, 1), jobject(t1)))  # Name, the first time only
        << SendToVm(cmd(7, (11, 5), jobject(t1)))  # ThreadGroup, the first time only
        << SendToVm(cmd(8, (11, 4), jobject(t2)))
        << SendToVm(cmd(9, (11, 1), jobject(t2)))
        << SendToVm(cmd(10, (11, 5), jobject(t2)))
        >> VmBytes(reply(5, status(1)))
        >> VmBytes(reply(6, jstring("main")))
        >> VmBytes(reply(7, jobject(GROUP)))
        << SendToVm(cmd(11, (12, 1), jobject(GROUP)))  # the group's name, once
        >> VmBytes(reply(8, status(4, 1)))
        >> VmBytes(reply(9, jstring("Reference Handler")))
        >> VmBytes(reply(10, jobject(GROUP)))
        >> VmBytes(reply(11, jstring("system")))
        << Resolve(1, None)
    )
    threads = vm.session.snapshot().threads
    assert threads is not None
    assert [(t.thread_id, t.name, t.state, t.suspended) for t in threads] == [
        (t1, "main", "running", False),
        (t2, "Reference Handler", "wait", True),
    ]
    assert vm.session.jvm_threads.group_name(t1) == "system"
    # The next poll asks only for states; a thread that died is handed back to the agent with
    # the count of ids this connection received for it (two AllThreads replies).
    assert (
        vm.book()
        >> Call(2, RefreshThreads())
        << SendToVm(cmd(12, (1, 4)))
        >> VmBytes(reply(12, all_threads(t1)))
        << SendToVm(cmd(13, (11, 4), jobject(t1)))
        << SendToVm(cmd(14, (1, 14), (1).to_bytes(4, "big") + jobject(t2) + (1).to_bytes(4, "big")))
        >> VmBytes(reply(13, status(2)))
        >> VmBytes(reply(14))
        << Resolve(2, None)
    )
    threads = vm.session.snapshot().threads
    assert threads is not None
    assert [(t.thread_id, t.name, t.state) for t in threads] == [(t1, "main", "timed-wait")]
    assert vm.session.jvm_threads.live_ids() == 2  # main and its group: no growing table


def test_a_debugger_never_sees_the_thread_polls_replies() -> None:
    vm = attach(plain_jvm(), 7)
    assert (
        vm.book()
        >> Call(1, RefreshThreads())
        << SendToVm(cmd(3, (1, 7)))
        >> ConsumerBytes(7, cmd(3, VERSION))  # the debugger's own id 3: no clash
        << SendToVm(cmd(4, VERSION))
        >> VmBytes(reply(3, SIZES))
        << SendToVm(cmd(5, (1, 4)))
        >> VmBytes(reply(4, HOTSPOT_VERSION))
        << SendToDebugger(7, reply(3, HOTSPOT_VERSION))
        >> VmBytes(reply(5, all_threads()))
        << Resolve(1, None)
    )


def test_a_ddm_vm_never_gets_the_jdwp_thread_list() -> None:
    vm = ready()
    assert vm.book() >> Call(1, RefreshThreads()) << asks(6, ddm.ThreadStatusRequest())
