"""ddmd's own DDM conversation with one VM: identification (HELO, then FEAT, THEN and heap
info; a JDWP error to HELO means a plain JVM: one VirtualMachine.Version, then nothing of
ddmd's own), the replies to ddmd's requests judged by what ends them (``protocol.expect``),
the thread-state poll, and the VM's pushes applied to the model.

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession`` (its state lives there; this holds the rules).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.expect import Answer, Expect, Judgement, judge
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand
from ddmd.session.calls import SELF, Own
from ddmd.session.commands import Changed, Command, SelectMe
from ddmd.session.words import silence_reason, words

if TYPE_CHECKING:
    from ddmd.session.vm import VmSession

__all__ = ["Conversation"]


class Conversation:
    """Identification, ddmd's own replies, the thread poll and the model's pushes."""

    def __init__(self, session: VmSession) -> None:
        self._s = session

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        self._s._touched = True
        if self._s.jvm_threads.owns(pending):
            self._s.jvm_threads.reply(pending, packet)
            return []
        if self._s.handlers.owns(pending):
            self._s.handlers.reply(pending, packet)
            return []
        own = self._s._own.pop(pending.vm_id, None)
        if own is None:
            return []
        if own.purpose == "version":
            own.judgement = Judgement(Answer.DATA)
            if not packet.error_code:
                self._s.model.description = _jstring(packet.data)
                self._s._log("vm.version", description=self._s.model.description)
                self._s._out.append(Changed())
            return []
        if own.purpose == "thst" and not packet.error_code:
            rows = ddm.thread_status_rows(packet.data)
            if rows is not None:  # the usual poll answer: read quickly, entries that repeat kept
                own.judgement = Judgement(Answer.DATA)
                if self._s.model.apply_thread_rows(rows):
                    self._s._out.append(Changed())
                return []
        own.judgement = judgement = judge(packet)
        if judgement.answer is Answer.MALFORMED:
            self._s._log(
                "ddm.chunk_malformed", "warning", feature=own.feature, error=judgement.reason
            )
        if own.purpose == "helo":
            self._hello_answered(judgement)
            return []
        if own.expect is Expect.QUIET and own.refused():
            verb = "it refused" if judgement.answer is Answer.FAILED else "it answered"
            self._s._mark_unsupported(own.feature, f"{verb}: {judgement.reason}")
        elif own.expect is Expect.REPLY and judgement.answer is Answer.REFUSED:
            self._s._mark_unsupported(own.feature, f"it answered: {judgement.reason}")
        if judgement.answer is Answer.DATA:
            if own.purpose == "feat":
                for chunk in judgement.chunks:
                    if isinstance(chunk, ddm.FeatReply):
                        self._s.feat = chunk
                        self._s.model.features = chunk.features
                        self._s._out.append(Changed())
            elif own.purpose != "stkl" and not own.purpose.startswith("prof-"):
                # Thread states, and the draft's heap info carried in the reply itself.
                for chunk in judgement.chunks:
                    self._apply(chunk)
        if own.purpose == "hpif-now":
            self._check_heap_probe(own)
        if own.purpose == "dbgd":
            acknowledged = judgement.answer is Answer.DATA and any(
                isinstance(c, ddm.Dbgd) for c in judgement.chunks
            )
            self._s.attach._release_done(acknowledged)
        return []

    def _expired(self, own: Own) -> None:
        own.expired = True
        if own.expect is Expect.REPLY:
            timeout = self._s.settings.ddm_request
            self._s._log("ddm.request_timed_out", feature=own.feature, timeout=timeout)
            self._s._mark_unsupported(own.feature, silence_reason(own.feature, timeout))
            if own.purpose == "helo":
                # A DDM VM without handlers, or a silent peer: kept (still debuggable).
                self._identified()
        elif own.purpose == "dbgd":
            self._s.attach._release_done(False)

    def _identify(self, now: float) -> None:
        if self._s.model.ddm is False:
            self._identified()  # a plain JVM, known from an earlier connection
            return
        self._s.model.unsupported.pop("HELO", None)  # one more HELO per connection
        self._s._ask(ddm.HeloRequest(1), "helo", "HELO", now)

    def _hello_answered(self, judgement: Judgement) -> None:
        now = self._s._now
        if judgement.answer is Answer.REFUSED:
            # A VM without DDM (a plain JVM). Only now may ddmd send a non-DDM command, once.
            self._s.model.ddm = False
            self._s._log("vm.not_ddm")
            # The probe's refusal is how a plain JVM is told apart, not news: debug level.
            why = f"it answered: {judgement.reason}"
            if self._s.model.mark_unsupported("HELO", why):
                self._s._log(
                    "vm.feature_unsupported",
                    "debug",
                    feature="HELO",
                    what=words("HELO"),
                    reason=why,
                )
                self._s._out.append(Changed())
            vm_id, send = self._s.router.send_own(
                SELF,
                CommandSet.VIRTUAL_MACHINE,
                VirtualMachineCommand.VERSION,
                b"",
                now + self._s.settings.ddm_request,
            )
            self._s._own[vm_id] = Own("version", "VERSION", Expect.REPLY)
            self._s._out.append(send)
            self._identified()
            return
        self._s.model.ddm = True
        if judgement.answer is not Answer.DATA:
            self._s._log(
                "vm.hello_failed",
                error=f"{self._s.name} sent a malformed answer ({judgement.reason})",
            )
            self._identified()
            self._s.handlers.connected()
            return
        for chunk in judgement.chunks:
            if isinstance(chunk, ddm.HeloReply):
                self._s.hello = chunk
                applied = self._s.model.apply_hello(chunk)
                if self._s.attach.release_after is not None and not applied.renamed:
                    # The same VM again, on the connection reopened for a release: a step.
                    applied.notes = [
                        dataclasses.replace(n, level="debug") if n.event == "vm.hello" else n
                        for n in applied.notes
                    ]
                self._s._notes(applied.notes)
        self._identified()
        self._s._ask(ddm.FeatRequest(), "feat", "FEAT", now)
        # Answered by the THCR burst, then an empty reply or (ART 9+) nothing at all.
        self._s._ask(ddm.ThreadNotify(True), "then", "THEN", now)
        if self._s.settings.heap_info:
            self._s._ask(ddm.HeapInfoRequest(3), "hpif-every-gc", "HPIF", now)
            self._s._heap_info_subscribed = True
            probe = self._s._ask(ddm.HeapInfoRequest(1), "hpif-now", "HPIF", now)
            probe.seen = self._s.model.heap_info_seq
        self._s.handlers.connected()  # their set-up requests go out after ddmd's own

    def _identified(self) -> None:
        if self._s.state == "identifying":
            self._s._goto("identified")
        self._s.identified = True
        self._s.attach.released("its connection was reopened")
        self._s._out.append(Changed(renamed=True))

    def _check_heap_probe(self, own: Own) -> None:
        """HPIF now always produces heap info where the VM has the handler (pushed before the
        reply, or in the draft's reply). None at all is the evidence that it lacks heap info,
        and heap segments with it: Android 12 removed both hooks together (protocol.md 3.8)."""
        if self._s.model.heap_info_seq > own.seen or own.refused():
            return
        self._s._heap_info_subscribed = False
        self._s._mark_unsupported("HPIF", silence_reason("HPIF", self._s.settings.ddm_request))
        self._s._mark_unsupported("HPSG", "it reports no heap information; Android 12 removed both")

    def _pushed(self, chunk_type: int, data: bytes, msg_id: int) -> None:
        """One pushed chunk, for ddmd's own model (``_ModelHandler``)."""
        if self._s.profiling.capture_chunk(chunk_type, data):
            return  # a trace or heap dump a call waits for
        try:
            chunk = ddm.decode_chunk(chunk_type, data, ddm.Direction.FROM_VM)
        except ProtocolError as exc:
            self._s._log("ddm.chunk_malformed", "warning", error=str(exc), id=msg_id)
            return
        self._apply(chunk)

    def _apply(self, chunk: ddm.Chunk) -> None:
        applied = self._s.model.apply(chunk)
        self._s._notes(applied.notes)
        if (
            applied.waiting
            and self._s.settings.auto_select_waiting
            and not self._s.router.attached()
        ):
            self._s._out.append(SelectMe("waiting for a debugger"))
        if applied.changed or applied.renamed:
            self._s._out.append(Changed(renamed=applied.renamed))

    def _poll(self, now: float) -> None:
        """THST (a plain JVM: the JDWP thread list, ``jvmthreads.py``) at a fixed rate (missed
        ticks skipped) while someone watches the VM."""
        interval = self._s.settings.thread_poll_interval
        watched = self._s.settings.always_poll_threads or now < self._s._lease_until
        speaks = self._s.model.ddm
        pollable = (speaks and "THST" not in self._s.model.unsupported) or (
            speaks is False and self._s.identified
        )
        if not (watched and pollable and self._s.router.ready):
            self._s._next_poll = None
            return
        if self._s._next_poll is None:
            self._s._next_poll = now + self._s.settings.poll_phase * interval
        if now < self._s._next_poll:
            return
        if speaks is False:
            self._s.jvm_threads.poll(now)
        elif self._s._thst is None or self._s._thst.done:
            self._s._thst = self._s._ask(ddm.ThreadStatusRequest(), "thst", "THST", now)
        behind = now - self._s._next_poll
        self._s._next_poll += interval * (1 + int(behind // interval))


def _jstring(data: bytes) -> str | None:
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if 4 + n > len(data):
        return None
    return data[4 : 4 + n].decode("utf-8", errors="replace")
