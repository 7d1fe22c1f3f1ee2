"""Method tracing, the allocation tracker, HPROF dumps and kill as conversations of one VM
session (``session/profiling.py``), as Playbooks: ART 9+ answers most of these requests with
silence, so each ends on evidence that always comes (MPRQ, REAQ, the pushed file)."""

from __future__ import annotations

from typing import Any

import pytest

from ddmd.protocol import ddm
from ddmd.protocol.errors import RemoteProtocolError
from ddmd.protocol.jdwp import CommandPacket, CommandSet, encode
from ddmd.session.commands import Capture, Log, Reject, Resolve, SendToVm
from ddmd.session.inputs import (
    AllocTracker,
    Call,
    DumpHprof,
    Kill,
    StartTrace,
    StopTrace,
    Tick,
    VmBytes,
)
from tests.session.playbook import Placeholder
from tests.session.test_vm_session import (
    HEAP_INFO,
    HELO,
    Vm,
    answer,
    asks,
    plain_jvm,
    push,
)

#: What a current ART VM lists in FEAT (the sim's art flavour lists the same).
FEAT_ART = ddm.FeatReply(
    (
        "hprof-heap-dump-streaming",
        "hprof-heap-dump",
        "method-sample-profiling",
        "method-trace-profiling-streaming",
        "method-trace-profiling",
    )
)


def ready(feat: ddm.FeatReply = FEAT_ART, **settings: Any) -> Vm:
    """A VM at t=0 that answered ddmd's five set-up requests (ids 1-5) with ``feat``."""
    from ddmd.session.inputs import VmConnected

    vm = Vm(**settings)
    for item in (
        VmConnected(0.0),
        answer(1, HELO),
        answer(2, feat),
        answer(3),
        answer(4),
        push(HEAP_INFO),
        answer(5),
    ):
        vm.session.handle(item, 0.0)
    assert vm.session.state == "ready"
    return vm


TRACE = b"*version\n3\n*end\nSLOW" + bytes(28)  # what the VM sends is passed on as it is
DUMP = b"JAVA PROFILE 1.0.3\x00" + bytes(100)
ALLOCS = ddm.Allocations(
    (
        ddm.AllocationEntry(
            48, 7, 0, (ddm.AllocationFrame(1, 0, 0, 12), ddm.AllocationFrame(1, 1, 0, -2))
        ),
    ),
    ("Ljava/lang/String;", "Lcom/example/Main;"),
    ("make", "run"),
    ("Main.java",),
)


def tracing(vm: Vm, call: int = 1) -> Vm:
    """``vm`` with a streaming method trace started (ART 9+: silence to MPSS)."""
    assert (
        vm.book()
        >> Call(call, StartTrace())
        << asks(6, ddm.MethodTraceStreamStart(8 << 20, 0))
        << asks(7, ddm.ProfilingQuery())
        >> answer(7, ddm.ProfilingStatus(1))
        << Resolve(call, {"trace": "method", "mode": "streaming"})
    )
    return vm


def test_a_trace_starts_on_silence_and_the_state_query_confirms_it() -> None:
    tracing(ready())


def test_a_refused_start_is_a_failure_in_the_vm_s_words() -> None:
    vm = ready()
    message = Placeholder("message")
    assert (
        vm.book()
        >> Call(1, StartTrace(sampling_us=1000))
        << asks(6, ddm.SamplingStart(8 << 20, 0, 1000))
        << asks(7, ddm.ProfilingQuery())
        >> answer(6, ddm.Fail(1, "sampling is not available"))
        << Reject(1, "failed", message)
        >> answer(7, ddm.ProfilingStatus(0))
    )
    assert "sampling is not available" in message.value


def test_the_trace_is_passed_on_as_the_vm_pushed_it() -> None:
    vm = tracing(ready())
    assert (
        vm.book()
        >> Call(2, StopTrace())
        << asks(8, ddm.MethodTraceStreamEnd())
        >> push(ddm.MethodTraceData(TRACE))  # ART 9+: the push, then no reply at all
        << Capture(2, TRACE, last=True)
        << Resolve(2, {"bytes": len(TRACE)})
    )
    assert vm.session.trace_state == "off"


def test_a_large_trace_streams_through_in_pieces_and_other_large_pushes_are_dropped() -> None:
    vm = tracing(ready(stream_threshold=64))
    body = bytes(range(256)) * 4  # 1 KiB of trace, well over the 64-byte threshold
    pushed = encode(ddm.ddm_command(0x80000010, ddm.MethodTraceData(body)))
    unasked = encode(ddm.ddm_command(0x80000011, ddm.HeapDumpStream(bytes(500))))
    out: list[Any] = vm.session.handle(Call(2, StopTrace()), 0.0)
    for piece in (unasked[:30], unasked[30:], pushed[:7], pushed[7:100], pushed[100:]):
        out += vm.session.handle(VmBytes(piece), 0.0)
    captured = [c for c in out if isinstance(c, Capture)]
    assert b"".join(c.data for c in captured) == body
    assert [c.last for c in captured][-1] is True
    assert not any(c.last for c in captured[:-1])
    assert Resolve(2, {"bytes": len(body)}) in out
    (dropped,) = [c for c in out if isinstance(c, Log) and c.event == "ddm.push_discarded"]
    assert dropped.fields == {"type": "HPDS", "length": 500}


def test_no_trace_within_the_capture_time_is_a_timeout() -> None:
    vm = tracing(ready(capture=10.0))
    message = Placeholder("message")
    assert (
        vm.book()
        >> Call(2, StopTrace())
        << asks(8, ddm.MethodTraceStreamEnd())
        >> Tick(11.0)
        << Reject(2, "timed_out", message)
    )
    assert "sent no trace within 10 s" in message.value


def test_a_dump_that_stops_flowing_times_out_but_a_slow_one_does_not() -> None:
    vm = ready(stream_threshold=64, capture=10.0)
    body = bytes(1000)
    pushed = encode(ddm.ddm_command(0x80000010, ddm.HeapDumpStream(body)))
    session = vm.session
    out: list[Any] = session.handle(Call(1, DumpHprof()), 0.0)
    # Pieces 8 s apart: each one moves the deadline, so the dump may take as long as it needs.
    for n, at in enumerate(range(0, 500, 100)):
        out += session.handle(VmBytes(pushed[at : at + 100]), 8.0 * (n + 1))
        out += session.handle(Tick(8.0 * (n + 1)), 8.0 * (n + 1))
    assert not [c for c in out if isinstance(c, Reject)]
    # Then nothing for longer than [timeouts] capture: a timeout, in words.
    out = session.handle(Tick(40.0 + 10.5), 50.5)
    (rejected,) = [c for c in out if isinstance(c, Reject)]
    assert rejected.kind == "timed_out"
    assert "stopped sending its heap dump for 10 s" in rejected.message


def test_the_packet_cap_guards_what_ddmd_holds_not_what_it_streams() -> None:
    # A 1 KiB cap: a 5 KiB heap dump streams to its capture all the same (issue 21 item 4) ...
    vm = ready(stream_threshold=64, max_packet=1024)
    body = bytes(range(256)) * 20
    pushed = encode(ddm.ddm_command(0x80000010, ddm.HeapDumpStream(body)))
    out: list[Any] = vm.session.handle(Call(1, DumpHprof()), 0.0)
    for at in range(0, len(pushed), 700):
        out += vm.session.handle(VmBytes(pushed[at : at + 700]), 0.0)
    assert b"".join(c.data for c in out if isinstance(c, Capture)) == body
    assert Resolve(1, {"bytes": len(body)}) in out
    # ... and so does one nobody asked for (dropped as it comes, never held) ...
    unasked = encode(ddm.ddm_command(0x80000011, ddm.HeapDumpStream(body)))
    out = vm.session.handle(VmBytes(unasked), 0.0)
    assert [c.event for c in out if isinstance(c, Log)] == ["ddm.push_discarded"]
    # ... but a 5 KiB reply ddmd must read whole is refused, as soon as its header is in.
    vm.session.handle(Call(2, DumpHprof()), 0.0)
    reply = answer(7, ddm.Fail(1, "x" * 2500))  # a DDM reply ddmd reads: 5 KiB + headers
    length = int.from_bytes(reply.data[:4], "big")
    assert length > 5000
    with pytest.raises(
        RemoteProtocolError, match=f"JDWP length {length} exceeds the configured cap 1024"
    ):
        vm.session.handle(VmBytes(reply.data[:11]), 0.0)


def test_a_heap_dump_streams_and_silence_marks_heap_dumps_missing() -> None:
    vm = ready(capture=10.0)
    assert (
        vm.book()
        >> Call(1, DumpHprof())
        << asks(6, ddm.HeapDumpStreamRequest())
        >> push(ddm.HeapDumpStream(DUMP))
        << Capture(1, DUMP, last=True)
        << Resolve(1, {"bytes": len(DUMP)})
    )
    message = Placeholder("message")
    assert (
        vm.book()
        >> Call(2, DumpHprof())
        << asks(7, ddm.HeapDumpStreamRequest())
        >> Tick(11.0)
        << Reject(2, "timed_out", message)
    )
    assert "heap dumps" in message.value
    assert "HPDS" not in message.value
    offer = vm.session.profiling_offer()["hprof"]
    assert offer["available"] is False


def test_the_allocation_tracker_conversation() -> None:
    vm = ready()
    listing = Placeholder("listing")
    assert (
        vm.book()
        >> Call(1, AllocTracker("start"))
        << asks(6, ddm.AllocTrackingEnable(True))
        << asks(7, ddm.AllocTrackingQuery())
        >> answer(7, ddm.AllocTrackingStatus(True))  # REAE: silence (ART 9+)
        << Resolve(1, {"enabled": True})
        >> Call(2, AllocTracker("list"))
        << asks(8, ddm.AllocTrackingQuery())
        << asks(9, ddm.AllocationsRequest())
        >> answer(8, ddm.AllocTrackingStatus(True))
        >> answer(9, ALLOCS)
        << Resolve(2, listing)
    )
    assert listing.value["enabled"] is True
    assert listing.value["allocations"] == ALLOCS.resolved()


def test_android_12_has_no_allocation_tracker_and_says_so_without_asking() -> None:
    vm = ready()
    vm.session.model.unsupported["HPIF"] = "no answer within 5 s; Android 12 removed them"
    vm.session.model.unsupported["HPSG"] = "it reports no heap information; Android 12 removed both"
    message = Placeholder("message")
    assert vm.book() >> Call(1, AllocTracker("start")) << Reject(1, "unsupported", message)
    assert "allocation tracker" in message.value
    assert "Android 12" in message.value


def test_silence_to_the_allocation_query_marks_the_tracker_missing() -> None:
    vm = ready()
    message = Placeholder("message")
    assert (
        vm.book()
        >> Call(1, AllocTracker("status"))
        << asks(6, ddm.AllocTrackingQuery())
        >> Tick(6.0)
        << Reject(1, "unsupported", message)
    )
    assert "does not offer the allocation tracker" in message.value
    assert vm.session.profiling_offer()["allocs"]["available"] is False


def test_kill_sends_exit_and_answers_at_once() -> None:
    vm = ready()
    assert vm.book() >> Call(1, Kill(3)) << asks(6, ddm.ExitRequest(3)) << Resolve(1, {"status": 3})


def test_a_plain_jvm_offers_none_of_the_ddm_features_in_words() -> None:
    # Its heap dumps come from the attach API (drive/jvmtools.py), never from the session.
    vm = plain_jvm()
    offer = vm.session.profiling_offer()
    assert {k: v["available"] for k, v in offer.items()} == {
        "trace": False,
        "allocs": False,
        "hprof": False,
        "kill": True,
    }
    assert "plain JVM" in str(offer["trace"]["reason"])
    message = Placeholder("message")
    assert vm.book() >> Call(1, DumpHprof()) << Reject(1, "unsupported", message)
    assert "does not speak DDM" in message.value


def test_a_plain_jvm_is_killed_with_jdwp_virtual_machine_exit() -> None:
    # VirtualMachine.Exit (1/10), exit code as a JDWP int; answered at once like EXIT.
    vm = plain_jvm()  # ids 1 (HELO) and 2 (Version) used
    exit_vm = CommandPacket(3, CommandSet.VIRTUAL_MACHINE, 10, (7).to_bytes(4, "big"))
    assert vm.book() >> Call(1, Kill(7)) << SendToVm(encode(exit_vm)) << Resolve(1, {"status": 7})


def test_a_vm_that_only_writes_trace_files_needs_a_device_path() -> None:
    vm = ready(ddm.FeatReply(("method-trace-profiling", "hprof-heap-dump")))
    message = Placeholder("message")
    assert vm.book() >> Call(1, StartTrace()) << Reject(1, "unsupported", message)
    assert "only to a file on the device" in message.value
    assert (
        vm.book()
        >> Call(2, StartTrace(device_path="/data/local/tmp/app.trace"))
        << asks(6, ddm.MethodTraceStart(8 << 20, 0, "/data/local/tmp/app.trace"))
        << asks(7, ddm.ProfilingQuery())
        >> answer(7, ddm.ProfilingStatus(1))
        << Resolve(2, {"trace": "method", "mode": "file"})
        >> Call(3, StopTrace())
        << asks(8, ddm.MethodTraceEnd())
        >> answer(8, ddm.MethodTraceEndResult(0))
        << Resolve(3, {"device_file": "/data/local/tmp/app.trace"})
    )


def test_a_push_of_a_file_nobody_asked_for_is_left_alone() -> None:
    vm = ready()
    raw = encode(
        CommandPacket(0x80000001, CommandSet.DDM, 1, ddm.encode_chunk(ddm.HeapDumpStream(DUMP)))
    )
    out = vm.session.handle(VmBytes(raw), 0.0)
    assert not [c for c in out if isinstance(c, Capture)]
