"""The profiling part alone (``session/profiling.py``), against a fake host: tracing, the
allocation tracker, HPROF dumps and kill, rule by rule. (``test_profiling.py`` plays the same
conversations through a whole session.)

``Begin(call, request)`` starts a profiling call as ``Calls`` hands it over; after every input
each call under way is settled at the script's time, and how it ends (``Resolve``/``Reject``)
is in the transcript. The files these calls wait for are caught by the real ``Captures``
(``capture.py``, tested alone in ``test_capture.py``): ``Pushed(type, data)`` is a whole chunk
the VM pushed (the first built-in handler's turn); ``Piece(data, first, last)`` a piece of a
push too large to hold.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import CommandSet, VirtualMachineCommand
from ddmd.session.capture import Captures
from ddmd.session.commands import Capture, Reject, Resolve
from ddmd.session.host import PendingCall
from ddmd.session.inputs import (
    AllocTracker,
    DumpHprof,
    Kill,
    StartTrace,
    StopTrace,
    Tick,
)
from ddmd.session.profiling import Profiling
from ddmd.session.settings import SessionSettings
from tests.session.parts import Answer, Ask, FakeHost, Jdwp, Piece, Pushed, Silence, Unsupported

APP = "com.example.mail"
MPSE = int(ddm.ChunkType.MPSE)
HPDS = int(ddm.ChunkType.HPDS)
TRACE = b"*version\n3\n*end\nSLOW" + bytes(28)
DUMP = b"JAVA PROFILE 1.0.3\x00" + bytes(100)


@dataclass(frozen=True)
class Begin:
    call: int
    request: object


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.host = FakeHost(settings=SessionSettings(**settings), name=APP)
        self.host.model.ddm = True
        self.captures = Captures(self.host)
        self.profiling = Profiling(self.host, self.captures)
        self.calls: dict[int, PendingCall] = {}
        self.now = 0.0
        self.taken: list[bool] = []  # what handle_raw said of each whole push

    def feed(self, item: Any) -> None:
        if isinstance(item, Begin):
            pending = PendingCall(item.call, item.request, self.now + 5.0)
            self.calls[item.call] = pending
            self.end(pending, self.profiling.begin(pending, self.now))
        elif isinstance(item, Pushed):
            self.taken.append(self.captures.handle_raw(item.chunk_type, item.data, 1))
        elif isinstance(item, Piece):
            for command in self.captures.push_piece(item.data, item.first, item.last, self.now):
                self.host.emit(command)
        elif isinstance(item, Tick):
            self.now = item.now
        else:
            raise AssertionError(f"no such input {item!r}")

    def end(self, pending: PendingCall, outcome: Resolve | Reject | None) -> None:
        if outcome is not None:
            del self.calls[pending.call]
            self.host.emit(outcome)

    def settle(self) -> None:
        for pending in list(self.calls.values()):
            self.end(pending, self.profiling.settle(pending, self.now))

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, after=self.settle, **kw)


def tracing(h: Harness) -> None:
    assert (
        h.book()
        >> Begin(1, StartTrace())
        << Ask(ddm.MethodTraceStreamStart(8 << 20, 0))
        << Ask(ddm.ProfilingQuery())
        >> Silence("MPSS")  # ART 9+: the start request is answered by silence
        >> Answer("MPRQ", ddm.ProfilingStatus(1))
        << Resolve(1, {"trace": "method", "mode": "streaming"})
    )


def test_a_trace_starts_when_the_state_query_after_it_says_so() -> None:
    h = Harness()
    tracing(h)
    assert h.profiling.tracing
    assert h.profiling.trace_state == "method"


def test_a_trace_the_vm_did_not_start_fails() -> None:
    h = Harness()
    assert (
        h.book()
        >> Begin(1, StartTrace())
        << Ask(ddm.MethodTraceStreamStart(8 << 20, 0))
        << Ask(ddm.ProfilingQuery())
        >> Answer("MPRQ", ddm.ProfilingStatus(0))
        << Reject(1, "failed", f"{APP} did not start tracing")
    )
    assert not h.profiling.tracing


def test_a_second_trace_is_a_conflict() -> None:
    h = Harness()
    tracing(h)
    assert h.book() >> Begin(2, StartTrace()) << Reject(2, "conflict", f"{APP} is already tracing")


def test_a_refused_start_says_why() -> None:
    h = Harness()
    assert (
        h.book()
        >> Begin(1, StartTrace())
        << Ask(ddm.MethodTraceStreamStart(8 << 20, 0))
        << Ask(ddm.ProfilingQuery())
        >> Answer("MPSS", ddm.Fail(1, "no room"))
        << Unsupported("MPSS", "it refused: no room (code 1)")
        << Reject(1, "failed", f"{APP} refused: no room (code 1)")
    )


def test_stopping_a_trace_passes_the_pushed_file_on() -> None:
    h = Harness()
    tracing(h)
    assert (
        h.book()
        >> Begin(2, StopTrace())
        << Ask(ddm.MethodTraceStreamEnd())
        >> Pushed(MPSE, TRACE)
        << Capture(2, TRACE, last=True)
        << Resolve(2, {"bytes": len(TRACE)})
    )
    assert h.taken == [True]  # taken from the model
    assert h.profiling.trace_state == "off"


def test_a_trace_that_never_comes_times_out_at_the_capture_deadline() -> None:
    h = Harness(capture=60.0)
    tracing(h)
    assert (
        h.book()
        >> Begin(2, StopTrace())
        << Ask(ddm.MethodTraceStreamEnd())
        >> Tick(59.9)
        >> Tick(60.0)
        << Reject(2, "timed_out", f"{APP} sent no trace within 60 s")
    )


def test_a_push_no_call_waits_for_goes_on_to_the_model() -> None:
    h = Harness()
    assert h.book() >> Pushed(MPSE, TRACE)
    assert h.taken == [False]


def test_a_large_heap_dump_is_passed_on_piece_by_piece_and_its_deadline_moves() -> None:
    h = Harness(capture=60.0)
    head = struct.pack(">II", HPDS, len(DUMP))
    assert (
        h.book()
        >> Begin(1, DumpHprof())
        << Ask(ddm.HeapDumpStreamRequest())
        >> Tick(50.0)
        >> Piece(head + DUMP[:40], first=True)
        << Capture(1, DUMP[:40])
        >> Tick(100.0)  # later than the first deadline: the data flowing moved it
        >> Piece(DUMP[40:], last=True)
        << Capture(1, DUMP[40:], last=True)
        << Resolve(1, {"bytes": len(DUMP)})
    )


def test_the_allocation_tracker_is_switched_and_its_state_read_back() -> None:
    h = Harness()
    assert (
        h.book()
        >> Begin(1, AllocTracker("start"))
        << Ask(ddm.AllocTrackingEnable(True))
        << Ask(ddm.AllocTrackingQuery())
        >> Answer("REAQ", ddm.AllocTrackingStatus(True))  # REAE: silence, never waited for
        << Resolve(1, {"enabled": True})
    )
    assert h.profiling.allocs_on


def test_no_answer_to_the_allocation_query_means_android_12() -> None:
    h = Harness()
    assert (
        h.book()
        >> Begin(1, AllocTracker("status"))
        << Ask(ddm.AllocTrackingQuery())
        >> Silence("REAQ")  # always answered: silence is evidence
        << Unsupported("REAQ", "no answer within 5 s; Android 12 removed the allocation tracker")
        << Reject(
            1,
            "unsupported",
            f"{APP} does not offer the allocation tracker (no answer within 5 s; Android 12 "
            "removed the allocation tracker)",
        )
    )


def test_kill_asks_exit_and_is_done() -> None:
    h = Harness()
    assert h.book() >> Begin(1, Kill(3)) << Ask(ddm.ExitRequest(3)) << Resolve(1, {"status": 3})


def test_kill_of_a_plain_jvm_is_jdwp_exit() -> None:
    h = Harness()
    h.host.model.ddm = False
    exit_code = (3).to_bytes(4, "big")
    assert (
        h.book()
        >> Begin(1, Kill(3))
        << Jdwp(CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.EXIT, exit_code, 1)
        << Resolve(1, {"status": 3})
    )


def test_a_plain_jvm_offers_no_tracing_and_says_why() -> None:
    h = Harness()
    h.host.model.ddm = False
    offer = h.profiling.profiling_offer()
    assert offer["trace"]["available"] is False
    assert "does not speak DDM" in str(offer["trace"]["reason"])
    assert offer["kill"] == {"available": True, "reason": None}


def test_the_connection_ending_forgets_the_trace_and_the_files_awaited() -> None:
    h = Harness()
    tracing(h)
    assert h.book() >> Begin(2, StopTrace()) << Ask(ddm.MethodTraceStreamEnd())
    h.captures.drop()
    h.profiling.drop()
    assert h.profiling.trace_state == "unknown"
    assert not h.profiling.tracing
    assert h.book() >> Pushed(MPSE, TRACE)
    assert h.taken == [False]
