"""API calls on a VM session: what each ``Call`` asks of the VM and when it is answered.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). ``Calls`` is the
part of ``VmSession`` that turns a ``Call`` into requests and, after every input, answers the
calls whose outcome is known (``settle``): a reply, the pushes a request causes (heap info
after a GC, the end of a heap dump), a refusal, or the call's deadline. It sees the session
through ``SessionHost``; the profiling requests it hands to ``Profiling``, which says how each
ends; a thread refresh to ``ThreadPoll``. It owns the table of calls under way, and the count
of calls that keep heap segments on.
"""

from __future__ import annotations

from ddmd.protocol import ddm
from ddmd.protocol.expect import FEATURE_NAMES, Answer
from ddmd.protocol.jdwp import ReplyPacket
from ddmd.session.commands import Reject, Resolve
from ddmd.session.conversation import Conversation
from ddmd.session.host import Own, PendingCall, SessionHost, judge_reply, missing, silence
from ddmd.session.inputs import Call, CauseGc, DumpHeap, GetStack, RefreshThreads
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.model import GcOutcome
from ddmd.session.poll import ThreadPoll
from ddmd.session.profiling import PROFILING_REQUESTS, Profiling
from ddmd.session.router import Router

__all__ = ["Calls"]


class _StackTraces:
    """The owner of STKL requests: judged only (the trace stays in the judgement for the call;
    it is nothing for the model)."""

    def __init__(self, host: SessionHost) -> None:
        self._host = host

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        judge_reply(self._host, own, packet)

    def expired(self, own: Own) -> None:
        silence(self._host, own)


class Calls:
    """The API-call part of a ``VmSession``: turns each ``Call`` into requests, settles it."""

    def __init__(
        self,
        host: SessionHost,
        lifecycle: Lifecycle,
        router: Router,
        *,
        poll: ThreadPoll,
        conversation: Conversation,
        profiling: Profiling,
    ) -> None:
        self._host = host
        self._lifecycle = lifecycle
        self._router = router
        self._poll = poll
        self._conversation = conversation
        self._profiling = profiling
        self._stacks = _StackTraces(host)
        self._calls: dict[int, PendingCall] = {}
        self._segment_users = 0  # calls under way that turned heap segments on

    @property
    def segments_wanted(self) -> bool:
        """ddmd itself keeps heap segments on (a heap dump is under way)."""
        return self._segment_users > 0

    def next_deadline(self) -> float | None:
        calls = self._calls
        return min([p.deadline for p in calls.values()]) if calls else None

    # ------------------------------------------------------------------ a call

    def _gate(self, feature: str) -> str | None:
        """Why ``feature`` cannot be asked for now (a sentence), or None."""
        model = self._host.model
        if model.ddm is False or feature in model.unsupported:
            return "unsupported"
        kind = ddm.ChunkType.__members__.get(feature)
        needs = FEATURE_NAMES.get(kind) if kind is not None else None
        if needs is not None and model.features and needs not in model.features:
            self._host.mark_unsupported(feature, f"its feature list lacks {needs!r}")
            return "unsupported"
        if self._lifecycle.offline:
            return "gone"
        return None

    def call(self, item: Call, now: float) -> None:
        host = self._host
        request = item.request
        pending = PendingCall(item.call, request, now + host.settings.ddm_request)
        self._calls[item.call] = pending
        if isinstance(request, PROFILING_REQUESTS):
            if self._lifecycle.offline:
                self._reject(pending, "gone", f"{host.name} is not connected", now)
                return
            outcome = self._profiling.begin(pending, now)
            if outcome is not None:
                self._finish(pending, outcome, now)
            return
        if isinstance(request, RefreshThreads):
            own = self._poll.refresh(now)
            if own is not None:
                pending.owns.append(own)
            return
        feature = {CauseGc: "HPGC", GetStack: "STKL", DumpHeap: "HPSG"}[type(request)]
        refusal = self._gate(feature)
        if refusal is not None:
            message = (
                missing(host, feature)
                if refusal == "unsupported"
                else f"{host.name} is not connected"
            )
            self._reject(pending, refusal, message)
            return
        model, settings = host.model, host.settings
        if isinstance(request, GetStack):
            pending.owns.append(
                host.ask(ddm.StackTraceRequest(request.thread_id), self._stacks, "stack trace")
            )
        elif isinstance(request, CauseGc):
            pending.seen = model.heap_info_seq
            heap_info = settings.heap_info and "HPIF" not in model.unsupported
            if heap_info and not self._conversation.heap_info_subscribed:
                host.ask(ddm.HeapInfoRequest(2), self, "heap info at the next GC")
            if not heap_info:
                pending.deadline = now + min(settings.ddm_request, settings.quiet_confirm)
            pending.owns.append(host.ask(ddm.GcRequest(), self, "gc"))
        elif isinstance(request, DumpHeap):
            pending.seen = model.heap_end_seq
            self._segment_users += 1
            pending.owns.append(host.ask(ddm.HeapSegmentRequest(1, 0), self, "segments on"))
            pending.owns.append(host.ask(ddm.GcRequest(), self, "gc"))

    # ------------------------------------------------------------------ the owner of its requests

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        judgement = judge_reply(self._host, own, packet)
        if judgement.answer is Answer.DATA:
            # The draft's heap info carried in the reply itself.
            for chunk in judgement.chunks:
                self._host.apply(chunk)

    def expired(self, own: Own) -> None:
        silence(self._host, own)

    # ------------------------------------------------------------------ settling

    def settle(self, now: float) -> None:
        """Answer every call whose outcome is known."""
        host = self._host
        for pending in list(self._calls.values()):
            request = pending.request
            if isinstance(request, PROFILING_REQUESTS):
                outcome = self._profiling.settle(pending, now)
                if outcome is not None:
                    self._finish(pending, outcome, now)
                continue
            refused = next((o for o in pending.owns if o.refused()), None)
            if isinstance(request, RefreshThreads):
                if all(o.done for o in pending.owns):
                    self._resolve(pending, None, now)
            elif isinstance(request, GetStack):
                self._settle_stack(pending, now)
            elif refused is not None:
                self._reject(pending, "unsupported", missing(host, refused.feature), now)
            elif isinstance(request, CauseGc):
                self._settle_gc(pending, now)
            elif isinstance(request, DumpHeap):
                if host.model.heap_end_seq > pending.seen:
                    self._resolve(pending, host.model.heap_images, now)
                elif now >= pending.deadline:
                    message = (
                        f"{host.name} sent no heap segments within "
                        f"{host.settings.ddm_request:g} s of the GC"
                    )
                    self._reject(pending, "timed_out", message, now)

    def _settle_gc(self, pending: PendingCall, now: float) -> None:
        host = self._host
        gc = pending.owns[-1]
        if host.model.heap_info_seq > pending.seen:
            self._resolve(pending, GcOutcome(True, "heap info"), now)
        elif gc.succeeded():
            self._resolve(pending, GcOutcome(True, "reply"), now)
        elif now >= pending.deadline:
            settings = host.settings
            why = (
                "it does not report heap information"
                if "HPIF" in host.model.unsupported or not settings.heap_info
                else f"no heap information arrived within {settings.ddm_request:g} s"
            )
            note = f"the VM gave no confirmation: {why}"
            self._resolve(pending, GcOutcome(False, None, note), now)

    def _settle_stack(self, pending: PendingCall, now: float) -> None:
        host = self._host
        (own,) = pending.owns
        if own.expired:
            self._reject(pending, "unsupported", missing(host, "STKL"), now)
            return
        judgement = own.judgement
        if judgement is None:
            return
        if judgement.answer is Answer.REFUSED:
            self._reject(pending, "unsupported", missing(host, "STKL"), now)
        elif judgement.answer is Answer.FAILED:
            message = f"{host.name} could not give a stack trace: {judgement.reason}"
            self._reject(pending, "failed", message, now)
        elif judgement.answer is Answer.MALFORMED:
            self._reject(
                pending, "failed", f"{host.name} sent a malformed answer ({judgement.reason})", now
            )
        else:
            trace = next((c for c in judgement.chunks if isinstance(c, ddm.StackTrace)), None)
            if trace is None:
                self._reject(pending, "failed", f"{host.name} sent no stack trace", now)
            else:
                self._resolve(pending, trace, now)

    def drop(self, message: str) -> None:
        """The connection ended: every call under way fails (``gone``)."""
        for pending in list(self._calls.values()):
            self._reject(pending, "gone", message)

    def _resolve(self, pending: PendingCall, value: object, now: float) -> None:
        self._finish(pending, Resolve(pending.call, value), now)

    def _reject(
        self, pending: PendingCall, kind: str, message: str, now: float | None = None
    ) -> None:
        self._finish(pending, Reject(pending.call, kind, message), now)

    def _finish(self, pending: PendingCall, outcome: Resolve | Reject, now: float | None) -> None:
        self._calls.pop(pending.call, None)
        if isinstance(pending.request, DumpHeap) and pending.owns:  # owns: it turned them on
            self._segment_users -= 1
            if self._segment_users == 0 and self._router.ready and now is not None:
                self._host.ask(ddm.HeapSegmentRequest(0, 0), self, "segments off")
        self._host.emit(outcome)
