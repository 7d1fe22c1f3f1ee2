"""ddmd's own DDM conversation with one VM: identification (HELO, then FEAT, THEN and heap
info; a JDWP error to HELO means a plain JVM: one VirtualMachine.Version, then nothing of
ddmd's own), and the heap-info probe that tells a VM without heap info (Android 12+).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` (sans-IO). A part of
``VmSession`` that sees it through ``SessionHost``; it owns the requests it sends (their
answers come back to ``answered``/``expired``), the VM's HELO and FEAT answers (``ddmshare``
answers consumers from them) and the heap-info subscription. When the VM is identified it moves
the lifecycle, ends a release under way (``Release.released``) and connects the plugins.
"""

from __future__ import annotations

import dataclasses

from ddmd.protocol import ddm
from ddmd.protocol.expect import Answer, Expect, Judgement
from ddmd.protocol.jdwp import CommandSet, ReplyPacket, VirtualMachineCommand
from ddmd.session.commands import Changed
from ddmd.session.feed import log_notes
from ddmd.session.handlers import HandlerHost
from ddmd.session.host import Own, SessionHost, judge_reply, silence
from ddmd.session.lifecycle import Lifecycle
from ddmd.session.release import Release
from ddmd.session.words import silence_reason, words

__all__ = ["Conversation"]


class Conversation:
    """Identification and the heap-info subscription of one VM."""

    def __init__(
        self, host: SessionHost, lifecycle: Lifecycle, release: Release, handlers: HandlerHost
    ) -> None:
        self._host = host
        self._lifecycle = lifecycle
        self._release = release
        self._handlers = handlers
        # The VM's own HELO and FEAT answers, for consumers that ask again (ddmshare.py).
        self.hello: ddm.HeloReply | None = None
        self.feat: ddm.FeatReply | None = None
        self._heap_info_subscribed = False  # HPIF at every GC asked on this connection
        # The requests whose answers mean more than their chunks (by object, not by name).
        self._helo: Own | None = None
        self._version: Own | None = None
        self._features: Own | None = None
        self._probe: Own | None = None  # HPIF now: no heap info at all means none ever

    @property
    def heap_info_subscribed(self) -> bool:
        return self._heap_info_subscribed

    def identify(self) -> None:
        """A new connection: HELO (a VM known not to speak DDM is identified at once)."""
        self._heap_info_subscribed = False
        model = self._host.model
        if model.ddm is False:
            self._identified()  # a plain JVM, known from an earlier connection
            return
        model.unsupported.pop("HELO", None)  # one more HELO per connection
        self._helo = self._host.ask(ddm.HeloRequest(1), self, "hello")

    # ------------------------------------------------------------------ the owner of its requests

    def answered(self, own: Own, packet: ReplyPacket) -> None:
        host = self._host
        if own is self._version:
            own.judgement = Judgement(Answer.DATA)
            if not packet.error_code:
                host.model.description = _jstring(packet.data)
                host.log("vm.version", description=host.model.description)
                host.emit(Changed())
            return
        if own is self._helo:
            self._hello_answered(judge_reply(host, own, packet, marks=False))
            return
        judgement = judge_reply(host, own, packet)
        if judgement.answer is Answer.DATA:
            if own is self._features:
                for chunk in judgement.chunks:
                    if isinstance(chunk, ddm.FeatReply):
                        self.feat = chunk
                        host.model.features = chunk.features
                        host.emit(Changed())
            else:
                # Thread notices, and the draft's heap info carried in the reply itself.
                for chunk in judgement.chunks:
                    host.apply(chunk)
        if own is self._probe:
            self._check_heap_probe(own)

    def expired(self, own: Own) -> None:
        silence(self._host, own)
        if own is self._helo:
            # A DDM VM without handlers, or a silent peer: kept (still debuggable).
            self._identified()
        if own is self._probe:
            self._check_heap_probe(own)

    # ------------------------------------------------------------------ identification

    def _hello_answered(self, judgement: Judgement) -> None:
        host = self._host
        model = host.model
        if judgement.answer is Answer.REFUSED:
            # A VM without DDM (a plain JVM). Only now may ddmd send a non-DDM command, once.
            model.ddm = False
            host.log("vm.not_ddm")
            # The probe's refusal is how a plain JVM is told apart, not news: debug level.
            why = f"it answered: {judgement.reason}"
            if model.mark_unsupported("HELO", why):
                host.log(
                    "vm.feature_unsupported",
                    "debug",
                    feature="HELO",
                    what=words("HELO"),
                    reason=why,
                )
                host.emit(Changed())
            self._version = Own(self, "version", "VERSION", Expect.REPLY)
            host.send_jdwp(
                self._version, CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.VERSION, b""
            )
            self._identified()
            return
        model.ddm = True
        if judgement.answer is not Answer.DATA:
            host.log(
                "vm.hello_failed", error=f"{host.name} sent a malformed answer ({judgement.reason})"
            )
            self._identified()
            self._handlers.connected()
            return
        for chunk in judgement.chunks:
            if isinstance(chunk, ddm.HeloReply):
                self.hello = chunk
                applied = model.apply_hello(chunk)
                if self._release.under_way and not applied.renamed:
                    # The same VM again, on the connection reopened for a release: a step.
                    applied.notes = [
                        dataclasses.replace(n, level="debug") if n.event == "vm.hello" else n
                        for n in applied.notes
                    ]
                log_notes(host, applied.notes)
        self._identified()
        self._features = host.ask(ddm.FeatRequest(), self, "features")
        # Answered by the THCR burst, then an empty reply or (ART 9+) nothing at all.
        host.ask(ddm.ThreadNotify(True), self, "thread notices")
        if host.settings.heap_info:
            host.ask(ddm.HeapInfoRequest(3), self, "heap info at every GC")
            self._heap_info_subscribed = True
            self._probe = probe = host.ask(ddm.HeapInfoRequest(1), self, "heap info now")
            probe.seen = model.heap_info_seq
        self._handlers.connected()  # their set-up requests go out after ddmd's own

    def _identified(self) -> None:
        self._lifecycle.identify()
        self._release.released("its connection was reopened")
        self._host.emit(Changed(renamed=True))

    def _check_heap_probe(self, own: Own) -> None:
        """HPIF now always produces heap info where the VM has the handler (pushed before the
        reply, or in the draft's reply). None at all is the evidence that it lacks heap info,
        and heap segments with it: Android 12 removed both hooks together (protocol.md 3.8)."""
        host = self._host
        if host.model.heap_info_seq > own.seen or own.refused():
            return
        self._heap_info_subscribed = False
        host.mark_unsupported("HPIF", silence_reason("HPIF", host.settings.ddm_request))
        host.mark_unsupported("HPSG", "it reports no heap information; Android 12 removed both")


def _jstring(data: bytes) -> str | None:
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if 4 + n > len(data):
        return None
    return data[4 : 4 + n].decode("utf-8", errors="replace")
