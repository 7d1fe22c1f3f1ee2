"""API calls on a VM session: what each ``Call`` asks of the VM and when it is answered.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Calls`` is
the part of ``VmSession`` that turns a ``Call`` into requests (``_ask``) and, after every input,
answers the calls whose outcome is known (``_settle``): a reply, the pushes a request causes
(heap info after a GC, the end of a heap dump), a refusal, or the call's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ddmd.protocol import ddm
from ddmd.protocol.expect import FEATURE_NAMES, Answer, Expect, Judgement
from ddmd.session.commands import Reject, Resolve
from ddmd.session.inputs import (
    AllocTracker,
    Call,
    CauseGc,
    DumpHeap,
    DumpHprof,
    GetStack,
    Kill,
    RefreshThreads,
    StartTrace,
    StopTrace,
    TraceState,
)
from ddmd.session.model import GcOutcome

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

#: The requests ``Profiling`` (session/profiling.py) works on.
PROFILING_REQUESTS = (StartTrace, StopTrace, TraceState, AllocTracker, DumpHprof, Kill)


class _Self:
    """The id-map origin of ddmd's own requests."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd"


SELF = _Self()


@dataclass(slots=True)
class Own:
    """One request of ddmd's own on the wire."""

    purpose: str
    feature: str
    expect: Expect
    judgement: Judgement | None = None
    expired: bool = False
    seen: int = 0  # a model counter when it was sent (heap info for the probe)

    @property
    def done(self) -> bool:
        return self.judgement is not None or self.expired

    def refused(self) -> bool:
        return self.judgement is not None and self.judgement.answer in (
            Answer.FAILED,
            Answer.REFUSED,
        )

    def succeeded(self) -> bool:
        return self.judgement is not None and self.judgement.answer is Answer.DATA


@dataclass(slots=True)
class PendingCall:
    """One API call being worked on."""

    call: int
    request: object
    deadline: float
    seen: int = 0
    owns: list[Own] = field(default_factory=list)


class Calls:
    """The API-call part of a ``VmSession``: turns each ``Call`` into requests, settles it."""

    def __init__(self, session: VmSession) -> None:
        self._s = session

    def _gate(self, feature: str) -> str | None:
        """Why ``feature`` cannot be asked for now (a sentence), or None."""
        if self._s.model.ddm is False or feature in self._s.model.unsupported:
            return "unsupported"
        kind = ddm.ChunkType.__members__.get(feature)
        needs = FEATURE_NAMES.get(kind) if kind is not None else None
        if needs is not None and self._s.model.features and needs not in self._s.model.features:
            self._s._mark_unsupported(feature, f"its feature list lacks {needs!r}")
            return "unsupported"
        if self._s.state in ("closed", "connecting", "reconnecting"):
            return "gone"
        return None

    def _call(self, item: Call, now: float) -> None:
        request = item.request
        pending = PendingCall(item.call, request, now + self._s.settings.ddm_request)
        self._s._calls[item.call] = pending
        if isinstance(request, PROFILING_REQUESTS):
            if self._s.state in ("closed", "connecting", "reconnecting"):
                self._reject(pending, "gone", f"{self._s.name} is not connected", now)
            else:
                self._s.profiling._call_profiling(pending, now)
            return
        if isinstance(request, RefreshThreads):
            self._s._lease_until = now + self._s.settings.thread_lease
            if self._s.model.ddm is False and self._s.identified and self._s.router.ready:
                pending.owns.append(self._s.jvm_threads.poll(now))  # a plain JVM: over JDWP
            elif (
                self._s.model.ddm
                and "THST" not in self._s.model.unsupported
                and self._s.router.ready
            ):
                if self._s._thst is None or self._s._thst.done:
                    self._s._thst = self._s._ask(ddm.ThreadStatusRequest(), "thst", "THST", now)
                pending.owns.append(self._s._thst)
            return
        feature = {CauseGc: "HPGC", GetStack: "STKL", DumpHeap: "HPSG"}[type(request)]
        refusal = self._gate(feature)
        if refusal is not None:
            message = (
                self._s.missing(feature)
                if refusal == "unsupported"
                else f"{self._s.name} is not connected"
            )
            self._reject(pending, refusal, message)
            return
        if isinstance(request, GetStack):
            pending.owns.append(
                self._s._ask(ddm.StackTraceRequest(request.thread_id), "stkl", "STKL", now)
            )
        elif isinstance(request, CauseGc):
            pending.seen = self._s.model.heap_info_seq
            heap_info = self._s.settings.heap_info and "HPIF" not in self._s.model.unsupported
            if heap_info and not self._s._heap_info_subscribed:
                self._s._ask(
                    ddm.HeapInfoRequest(2), "hpif-next", "HPIF", now
                )  # info at the next GC
            if not heap_info:
                pending.deadline = now + min(
                    self._s.settings.ddm_request, self._s.settings.quiet_confirm
                )
            pending.owns.append(self._s._ask(ddm.GcRequest(), "gc", "HPGC", now))
        elif isinstance(request, DumpHeap):
            pending.seen = self._s.model.heap_end_seq
            self._s._segment_users += 1
            pending.owns.append(
                self._s._ask(ddm.HeapSegmentRequest(1, 0), "segments-on", "HPSG", now)
            )
            pending.owns.append(self._s._ask(ddm.GcRequest(), "gc", "HPGC", now))

    def _settle(self, now: float) -> None:
        """Answer every call whose outcome is known."""
        for pending in list(self._s._calls.values()):
            request = pending.request
            if isinstance(request, PROFILING_REQUESTS):
                self._s.profiling._settle_profiling(pending, now)
                continue
            refused = next((o for o in pending.owns if o.refused()), None)
            if isinstance(request, RefreshThreads):
                if all(o.done for o in pending.owns):
                    self._resolve(pending, None, now)
            elif isinstance(request, GetStack):
                self._settle_stack(pending, now)
            elif refused is not None:
                self._reject(pending, "unsupported", self._s.missing(refused.feature), now)
            elif isinstance(request, CauseGc):
                gc = pending.owns[-1]
                if self._s.model.heap_info_seq > pending.seen:
                    self._resolve(pending, GcOutcome(True, "heap info"), now)
                elif gc.succeeded():
                    self._resolve(pending, GcOutcome(True, "reply"), now)
                elif now >= pending.deadline:
                    settings = self._s.settings
                    why = (
                        "it does not report heap information"
                        if "HPIF" in self._s.model.unsupported or not settings.heap_info
                        else f"no heap information arrived within {settings.ddm_request:g} s"
                    )
                    note = f"the VM gave no confirmation: {why}"
                    self._resolve(pending, GcOutcome(False, None, note), now)
            elif isinstance(request, DumpHeap):
                if self._s.model.heap_end_seq > pending.seen:
                    self._resolve(pending, self._s.model.heap_images, now)
                elif now >= pending.deadline:
                    message = (
                        f"{self._s.name} sent no heap segments within "
                        f"{self._s.settings.ddm_request:g} s of the GC"
                    )
                    self._reject(pending, "timed_out", message, now)

    def _settle_stack(self, pending: PendingCall, now: float) -> None:
        (own,) = pending.owns
        if own.expired:
            self._reject(pending, "unsupported", self._s.missing("STKL"), now)
            return
        judgement = own.judgement
        if judgement is None:
            return
        if judgement.answer is Answer.REFUSED:
            self._reject(pending, "unsupported", self._s.missing("STKL"), now)
        elif judgement.answer is Answer.FAILED:
            self._reject(
                pending,
                "failed",
                f"{self._s.name} could not give a stack trace: {judgement.reason}",
                now,
            )
        elif judgement.answer is Answer.MALFORMED:
            self._reject(
                pending,
                "failed",
                f"{self._s.name} sent a malformed answer ({judgement.reason})",
                now,
            )
        else:
            trace = next((c for c in judgement.chunks if isinstance(c, ddm.StackTrace)), None)
            if trace is None:
                self._reject(pending, "failed", f"{self._s.name} sent no stack trace", now)
            else:
                self._resolve(pending, trace, now)

    def _finish(self, pending: PendingCall, now: float | None) -> None:
        self._s._calls.pop(pending.call, None)
        if isinstance(pending.request, DumpHeap) and pending.owns:  # owns: it turned them on
            self._s._segment_users -= 1
            if self._s._segment_users == 0 and self._s.router.ready and now is not None:
                self._s._ask(ddm.HeapSegmentRequest(0, 0), "segments-off", "HPSG", now)

    def _resolve(self, pending: PendingCall, value: object, now: float) -> None:
        self._finish(pending, now)
        self._s._out.append(Resolve(pending.call, value))

    def _reject(
        self, pending: PendingCall, kind: str, message: str, now: float | None = None
    ) -> None:
        self._finish(pending, now)
        self._s._out.append(Reject(pending.call, kind, message))
