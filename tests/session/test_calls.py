"""The API-call part alone (``session/calls.py``), against a fake host: what each ``Call`` asks
of the VM and when it is answered, rule by rule.

Its collaborators are stand-ins: the thread poll (``refresh`` gives the request a refresh waits
for), the conversation (whether heap info comes at every GC already), the profiling part (how a
profiling call ends) and the router (whether the connection is usable). After every input the
calls settle at the script's time, as the session settles them; ``Tick(t)`` moves the time.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.expect import Expect
from ddmd.protocol.heap import HeapImage
from ddmd.session.calls import Calls
from ddmd.session.commands import Reject, Resolve
from ddmd.session.host import Own, PendingCall
from ddmd.session.inputs import (
    Call,
    CauseGc,
    DumpHeap,
    GetStack,
    RefreshThreads,
    StartTrace,
    Tick,
    TraceState,
)
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.model import GcOutcome
from ddmd.session.settings import SessionSettings
from tests.session.parts import Answer, Applied, Ask, FakeHost, Silence, Unsupported
from tests.session.playbook import Placeholder

TRACE = ddm.StackTrace(7, (ddm.StackFrame("com.example.Main", "main", "Main.java", 12),))
HEAP_INFO = ddm.HeapInfo((ddm.HeapInfoEntry(1, 1_700_000_000_000, 1, 256 << 20, 16 << 20, 1, 2),))


class FakePoll:
    def __init__(self) -> None:
        self.own: Own | None = Own(None, "thread states", "THST", Expect.REPLY)
        self.leases: list[float] = []

    def refresh(self, now: float) -> Own | None:
        self.leases.append(now)
        return self.own


class FakeProfiling:
    """Says at once what ``begin`` returns; ``settle`` returns ``ends`` once it is set."""

    def __init__(self) -> None:
        self.begun: list[PendingCall] = []
        self.ends: Reject | Resolve | None = None

    def begin(self, pending: PendingCall, now: float) -> Reject | Resolve | None:
        self.begun.append(pending)
        return None

    def settle(self, pending: PendingCall, now: float) -> Reject | Resolve | None:
        return self.ends


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.host = FakeHost(settings=SessionSettings(**settings))
        self.host.model.ddm = True
        self.lifecycle = Lifecycle("vm-1")
        self.lifecycle.goto("connected")
        self.lifecycle.identify()
        self.router = SimpleNamespace(ready=True)
        self.conversation = SimpleNamespace(heap_info_subscribed=False)
        self.poll = FakePoll()
        self.profiling = FakeProfiling()
        self.calls = Calls(
            self.host,
            self.lifecycle,
            self.router,  # type: ignore[arg-type]
            poll=self.poll,  # type: ignore[arg-type]
            conversation=self.conversation,  # type: ignore[arg-type]
            profiling=self.profiling,  # type: ignore[arg-type]
        )
        self.now = 0.0

    def feed(self, item: Any) -> None:
        if isinstance(item, Tick):
            self.now = item.now
        elif isinstance(item, Call):
            self.calls.call(item, self.now)
        else:
            raise AssertionError(f"no such input {item!r}")

    def book(self, **kw: Any) -> Any:
        return self.host.book(self.feed, after=lambda: self.calls.settle(self.now), **kw)


def test_a_stack_trace_is_the_vms_answer() -> None:
    h = Harness()
    assert (
        h.book()
        >> Call(1, GetStack(7))
        << Ask(ddm.StackTraceRequest(7))
        >> Answer("STKL", TRACE)
        << Resolve(1, TRACE)  # the trace is the call's, not the model's: nothing applied
    )


def test_a_stack_trace_refused_by_the_vm_says_why() -> None:
    h = Harness()
    assert (
        h.book()
        >> Call(1, GetStack(7))
        << Ask(ddm.StackTraceRequest(7))
        >> Answer("STKL", ddm.Fail(1, "Stack trace unavailable"))
        << Reject(
            1,
            "failed",
            "com.example.mail could not give a stack trace: Stack trace unavailable (code 1)",
        )
    )


def test_silence_to_a_stack_trace_means_the_vm_lacks_it() -> None:
    h = Harness()
    message = Placeholder("message")
    assert (
        h.book()
        >> Call(1, GetStack(7))
        << Ask(ddm.StackTraceRequest(7))
        >> Silence("STKL")
        # STKL is always answered: silence is evidence.
        << Unsupported(
            "STKL", "no answer within 5 s; newer Android versions removed the thread handlers"
        )
        << Reject(1, "unsupported", message)
    )
    assert "com.example.mail" in message.value
    assert "STKL" in h.host.model.unsupported


def test_a_gc_is_confirmed_by_the_heap_info_it_causes() -> None:
    h = Harness()
    assert (
        h.book()
        >> Call(1, CauseGc())
        << Ask(ddm.HeapInfoRequest(2))  # heap info at the next GC: none subscribed yet
        << Ask(ddm.GcRequest())
        >> Answer("HPIF", HEAP_INFO)  # the draft carries it in the reply
        << Applied(HEAP_INFO)
        << Resolve(1, GcOutcome(True, "heap info"))
    )


def test_a_gc_with_heap_info_subscribed_asks_only_for_the_gc_and_its_reply_confirms_it() -> None:
    h = Harness()
    h.conversation.heap_info_subscribed = True
    assert (
        h.book()
        >> Call(1, CauseGc())
        << Ask(ddm.GcRequest())
        >> Answer("HPGC")
        << Resolve(1, GcOutcome(True, "reply"))
    )


def test_a_gc_nothing_confirms_is_answered_at_its_deadline_with_a_note() -> None:
    h = Harness(ddm_request=5.0)
    h.conversation.heap_info_subscribed = True
    assert (
        h.book()
        >> Call(1, CauseGc())
        << Ask(ddm.GcRequest())
        >> Tick(4.9)
        >> Tick(5.0)
        << Resolve(
            1,
            GcOutcome(
                False, None, "the VM gave no confirmation: no heap information arrived within 5 s"
            ),
        )
    )


def test_a_heap_dump_keeps_segments_on_until_it_ends() -> None:
    h = Harness()
    images = Placeholder("images")
    assert (
        h.book() >> Call(1, DumpHeap()) << Ask(ddm.HeapSegmentRequest(1, 0)) << Ask(ddm.GcRequest())
    )
    assert h.calls.segments_wanted
    h.host.model.apply(ddm.HeapStart(1))
    h.host.model.apply(ddm.HeapEnd(1))
    assert (
        h.book()
        >> Tick(0.1)
        << Ask(ddm.HeapSegmentRequest(0, 0))  # the last call that wanted them: off again
        << Resolve(1, images)
    )
    assert not h.calls.segments_wanted
    assert [type(i) for i in images.value] == [HeapImage]


def test_a_feature_the_vm_lacks_is_refused_without_asking() -> None:
    h = Harness()
    h.host.model.features = ("hprof-heap-dump",)  # a feature list that lacks nothing asked
    h.host.model.mark_unsupported("STKL", "it answered: JDWP error 99")
    message = Placeholder("message")
    assert h.book() >> Call(1, GetStack(7)) << Reject(1, "unsupported", message)


def test_a_call_while_the_vm_is_not_connected_is_gone() -> None:
    h = Harness()
    h.lifecycle.goto("closed")
    assert (
        h.book()
        >> Call(1, GetStack(7))
        << Reject(1, "gone", "com.example.mail is not connected")
        >> Call(2, StartTrace())
        << Reject(2, "gone", "com.example.mail is not connected")
    )
    assert h.profiling.begun == []


def test_a_thread_refresh_waits_for_the_polls_request() -> None:
    h = Harness(thread_lease=5.0)
    assert h.book() >> Call(1, RefreshThreads())
    assert h.poll.leases == [0.0]
    own = h.poll.own
    assert own is not None
    own.expired = True  # the poll's request ended (here: with no answer)
    assert h.book() >> Tick(0.5) << Resolve(1, None)
    h.poll.own = None  # the VM cannot be polled: nothing to wait for
    assert h.book() >> Call(2, RefreshThreads()) << Resolve(2, None)


def test_a_profiling_call_ends_as_the_profiling_part_says() -> None:
    h = Harness()
    assert h.book() >> Call(1, TraceState())
    assert [p.call for p in h.profiling.begun] == [1]
    h.profiling.ends = Resolve(1, {"trace": "off"})
    assert h.book() >> Tick(0.1) << Resolve(1, {"trace": "off"})


def test_the_connection_ending_fails_every_call() -> None:
    h = Harness()
    assert h.book() >> Call(1, GetStack(7)) << Ask(ddm.StackTraceRequest(7))
    assert h.book() >> Call(2, TraceState())
    h.calls.drop("com.example.mail went away (the VM disconnected)")
    assert h.host.take() == [
        Reject(1, "gone", "com.example.mail went away (the VM disconnected)"),
        Reject(2, "gone", "com.example.mail went away (the VM disconnected)"),
    ]
    assert h.calls.next_deadline() is None
