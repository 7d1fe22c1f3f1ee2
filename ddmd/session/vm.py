"""VmSession: everything ddmd decides about one VM, as a sans-IO object (h11's ``Connection``).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` only. No sockets, no clock, no
logging: ``handle(input, now)`` returns the commands to carry out (``commands.py``), and time
arrives as a value.

Lifecycle (the one table, ``TRANSITIONS``):

    connecting ─VmConnected─▶ identifying ─identified─▶ ready ─last debugger left─▶ releasing
                                   ▲                      ▲                            │
                                   │                      └──────DBGD acknowledged─────┤
                                   └──────VmConnected────── reconnecting ◀─no ack──────┘
    any state ─VmClosed─▶ closed

The DDM conversation: HELO (a JDWP error means a plain JVM: one VirtualMachine.Version, then
nothing of ddmd's own), FEAT, THEN, heap info at every GC and now, THST polled at a fixed rate
while someone watches. Each request states what ends it (``protocol.expect``): a reply chunk,
or pushes and silence. Silence to a request that every VM answers is evidence that the VM lacks
the handler; silence to the others is success (protocol.md 2.2).

API calls (``Call``) are answered with ``Resolve``/``Reject``:
``RefreshThreads`` -> None; ``CauseGc`` -> ``GcOutcome``; ``GetStack`` -> ``ddm.StackTrace``;
``DumpHeap`` -> ``tuple[HeapImage, ...]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.errors import LocalProtocolError, ProtocolError
from ddmd.protocol.expect import Answer, Expect, Judgement, expectation, judge
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import (
    DDM_COMMAND,
    CommandPacket,
    CommandSet,
    ReplyPacket,
    VirtualMachineCommand,
)
from ddmd.session.attach import AttachMixin
from ddmd.session.calls import CallsMixin, Own, PendingCall
from ddmd.session.commands import (
    Changed,
    CloseDebugger,
    Command,
    Log,
    Publish,
    SelectMe,
    SendToDebugger,
    SendToVm,
    WakeMeAt,
)
from ddmd.session.handlers import HandlerHost, HandlerLike, HandlerOrigin
from ddmd.session.inputs import (
    Call,
    DebuggerBytes,
    DebuggerJoined,
    DebuggerLeft,
    Input,
    Tick,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.model import UNNAMED, DebuggerSnapshot, Note, VmModel, VmSnapshot
from ddmd.session.profiling import ProfilingMixin, _Capture, _LargePush
from ddmd.session.router import Router
from ddmd.session.settings import SessionSettings
from ddmd.session.words import missing_sentence, silence_reason, words

__all__ = ["TRANSITIONS", "SessionSettings", "VmSession"]

#: (state, what happened) -> next state. Anything else is a bug (LocalProtocolError).
TRANSITIONS: dict[tuple[str, str], str] = {
    ("connecting", "connected"): "identifying",
    ("identifying", "identified"): "ready",
    ("ready", "last debugger left"): "releasing",
    ("releasing", "acknowledged"): "ready",
    ("releasing", "no acknowledgement"): "reconnecting",
    ("reconnecting", "connected"): "identifying",
    ("identifying", "closed"): "closed",
    ("ready", "closed"): "closed",
    ("releasing", "closed"): "closed",
    ("reconnecting", "closed"): "closed",
    ("connecting", "closed"): "closed",
}


class _Self:
    """The id-map origin of ddmd's own requests."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd"


SELF = _Self()


class VmSession(CallsMixin, ProfilingMixin, AttachMixin):
    """One VM's state machine, DDM conversation, model and routing table."""

    def __init__(
        self,
        vm_id: str,
        *,
        source: str,
        address: str,
        device: str | None = None,
        expected_pid: int | None = None,
        process_pid: int | None = None,
        process_name: str | None = None,
        settings: SessionSettings | None = None,
        handlers: Sequence[HandlerLike] = (),
        handler_view: Callable[[VmSnapshot], dict[str, Any]] | None = None,
    ) -> None:
        self.vm_id = vm_id
        self.source = source
        self.address = address
        self.device = device
        self.process_pid = process_pid
        self.process_name = process_name
        self.settings = s = settings or SessionSettings()
        self.state = "connecting"
        self.model = VmModel(expected_pid=expected_pid, max_inflated=s.max_inflated)
        self.router = Router(
            on_reply=self._on_reply,
            on_push=self._on_push,
            on_push_piece=self._on_push_piece,
            max_packet=s.max_packet,
            stream_threshold=s.stream_threshold,
        )
        self.identified = False
        self.connected_at: float | None = None
        # ddmd's own model of the VM (identity, thread table, heap info and segments) takes
        # the VM's pushes through the same dispatch as the plugins, first.
        self._captures: list[_Capture] = []
        self._large: _LargePush | None = None
        self.trace_state = "unknown"  # "off", "method", "sampling" once known
        self.trace_mode: str | None = None  # "streaming" or "file" while tracing
        self.trace_path: str | None = None
        self.handlers = HandlerHost(vm_id, handlers, self, builtin=(_ModelHandler(self),))
        self._handler_view = handler_view or dataclasses.asdict
        self._out: list[Command] = []
        self._own: dict[int, Own] = {}
        self._calls: dict[int, PendingCall] = {}
        self._heap_info_subscribed = False
        self._segment_users = 0
        self._lease_until = -math.inf
        self._next_poll: float | None = None
        self._thst: Own | None = None
        self._waits: dict[int, float] = {}  # debugger -> deadline of its wait for the VM
        self._wake: float | None = None
        self._now = 0.0
        self._touched = False
        self.reconnects = 0

    # ------------------------------------------------------------------ the one entry point

    def handle(self, item: Input, now: float) -> list[Command]:
        """Feed one input; returns the commands to carry out, in order."""
        out = self._out = []
        self._now = now
        self._touched = False
        attached_before = self.router.attached_count
        if isinstance(item, VmBytes):
            out += self.router.vm_data(item.data)
            if not self._touched:
                # The relay's fast lane: only debuggers' packets went by; nothing of ddmd's own
                # (no reply, push or deadline) changed, so calls, polls and timers stand.
                self._out = []
                return out
        elif isinstance(item, DebuggerBytes):
            commands, leaving = self.router.debugger_data(item.debugger, item.data)
            out += commands
            if leaving is not None:
                self._debugger_leaves(item.debugger, leaving, now)
            elif self.router.attached_count > attached_before:
                self._attached(item.debugger)
            elif not self._touched:
                self._out = []  # the relay's fast lane, as for VmBytes
                return out
        elif isinstance(item, Tick):
            self._tick(now)
        elif isinstance(item, Call):
            self._call(item, now)
        elif isinstance(item, VmConnected):
            self._connected(item, now)
        elif isinstance(item, DebuggerJoined):
            self._debugger_joins(item, now)
        elif isinstance(item, DebuggerLeft):
            self._debugger_leaves(item.debugger, item.reason, now)
        elif isinstance(item, VmClosed):
            self._closed(item.reason)
        else:
            raise LocalProtocolError(f"VmSession cannot handle {item!r}")
        self._settle(now)
        self._poll(now)
        self._schedule(again=isinstance(item, Tick))
        self._out = []
        return out

    # ------------------------------------------------------------------ the relay lane

    def relay_vm(self, data: bytes) -> SendToDebugger | None:
        """Bytes from the VM, when they are one whole reply to a debugger that nothing here
        reads: the one command ``handle(VmBytes(data), now)`` would return, made without the
        general path's cost (the driver calls this per packet first); otherwise None and
        nothing changed, and the driver calls ``handle``."""
        return self.router.relay_from_vm(data)

    def relay_debugger(self, debugger: int, data: bytes) -> SendToVm | None:
        """Bytes from a debugger, when they are one whole command no rule answers or reads:
        the one command ``handle(DebuggerBytes(debugger, data), now)`` would return; otherwise
        None and nothing changed."""
        return self.router.relay_from_debugger(debugger, data)

    def _goto(self, what: str) -> None:
        try:
            self.state = TRANSITIONS[(self.state, what)]
        except KeyError:
            raise LocalProtocolError(
                f"{self.vm_id}: {what!r} cannot happen in {self.state!r}"
            ) from None

    def _log(self, event: str, level: str = "info", **fields: object) -> None:
        self._out.append(Log(event, level, dict(fields)))

    def _notes(self, notes: list[Note]) -> None:
        for note in notes:
            self._out.append(Log(note.event, note.level, dict(note.fields)))

    # ------------------------------------------------------------------ the VM connection

    def _connected(self, item: VmConnected, now: float) -> None:
        reopened = self.state == "reconnecting"
        self._goto("connected")
        self.connected_at = now
        self.model.forget_threads()
        self._heap_info_subscribed = False
        if reopened:
            self.reconnects += 1
            self._log("vm.reconnected")
        self._out += self.router.connected()
        for debugger in list(self._waits):
            if debugger in self.router.attached():
                self._attached(debugger)
        self._identify(now)
        if item.leftover:
            self._out += self.router.vm_data(item.leftover)
        self._out.append(Changed())

    def _closed(self, reason: str) -> None:
        if self.state == "closed":
            return
        self._goto("closed")
        self._drop_own("the VM disconnected")
        for debugger in self.router.attached():
            self._log("debugger.detached", debugger=debugger, reason="the VM disconnected")
        for debugger in (*self.router.attached(), *self._waits):
            self._out.append(CloseDebugger(debugger, "the VM disconnected"))
        self._waits.clear()
        self._log("vm.disconnected", reason=reason)
        self._out.append(Changed())

    def _drop_own(self, why: str) -> None:
        """The connection ends (closed or reopened): every pending request fails at once."""
        self.handlers.disconnected()
        self.router.disconnected()
        self._captures.clear()
        self._large = None
        self.trace_state, self.trace_mode = "unknown", None
        self._own.clear()
        self._thst = None
        for pending in list(self._calls.values()):
            self._reject(pending, "gone", f"{self.name} went away ({why})")

    # ------------------------------------------------------------------ names

    @property
    def name(self) -> str:
        return self.snapshot().display_name

    def selection_key(self) -> str | None:
        """``DEVICE|NAME``: the package, else the app; a VM that reports no name (a plain JVM)
        is known by its address once identified; None until then."""
        for name in (self.model.package, self.model.app):
            if name and name not in UNNAMED:
                return f"{self.device or 'local'}|{name}"
        if self.identified and self.model.ddm is not True:
            return f"{self.device or 'local'}|{self.address}"
        return None

    def missing(self, feature: str) -> str:
        return missing_sentence(
            self.name, feature, self.model.unsupported.get(feature, ""), ddm=self.model.ddm
        )

    def _mark_unsupported(self, feature: str, why: str) -> None:
        if self.model.mark_unsupported(feature, why):
            self._log("vm.feature_unsupported", feature=feature, what=words(feature), reason=why)
            self._out.append(Changed())

    # ------------------------------------------------------------------ ddmd's own requests

    def _ask(self, chunk: ddm.Chunk, purpose: str, feature: str, now: float) -> Own:
        packet = ddm.ddm_command(0, chunk)
        deadline = now + self.settings.ddm_request
        if purpose == "dbgd":
            deadline = now + self.settings.dbgd_ack
        vm_id, send = self.router.send_own(
            SELF, packet.command_set, packet.command, packet.data, deadline
        )
        own = Own(purpose, feature, expectation(int(chunk.chunk_type)))
        self._own[vm_id] = own
        self._out.append(send)
        return own

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        self._touched = True
        if self.handlers.owns(pending):
            self.handlers.reply(pending, packet)
            return []
        own = self._own.pop(pending.vm_id, None)
        if own is None:
            return []
        if own.purpose == "version":
            own.judgement = Judgement(Answer.DATA)
            if not packet.error_code:
                self.model.description = _jstring(packet.data)
                self._log("vm.version", description=self.model.description)
                self._out.append(Changed())
            return []
        if own.purpose == "thst" and not packet.error_code:
            rows = ddm.thread_status_rows(packet.data)
            if rows is not None:  # the usual poll answer: read quickly, entries that repeat kept
                own.judgement = Judgement(Answer.DATA)
                if self.model.apply_thread_rows(rows):
                    self._out.append(Changed())
                return []
        own.judgement = judgement = judge(packet)
        if judgement.answer is Answer.MALFORMED:
            self._log("ddm.chunk_malformed", "warning", feature=own.feature, error=judgement.reason)
        if own.purpose == "helo":
            self._hello_answered(judgement)
            return []
        if own.expect is Expect.QUIET and own.refused():
            verb = "it refused" if judgement.answer is Answer.FAILED else "it answered"
            self._mark_unsupported(own.feature, f"{verb}: {judgement.reason}")
        elif own.expect is Expect.REPLY and judgement.answer is Answer.REFUSED:
            self._mark_unsupported(own.feature, f"it answered: {judgement.reason}")
        if judgement.answer is Answer.DATA:
            if own.purpose == "feat":
                for chunk in judgement.chunks:
                    if isinstance(chunk, ddm.FeatReply):
                        self.model.features = chunk.features
                        self._out.append(Changed())
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
            self._release_done(acknowledged)
        return []

    def _expired(self, own: Own) -> None:
        own.expired = True
        if own.expect is Expect.REPLY:
            timeout = self.settings.ddm_request
            self._log("ddm.request_timed_out", feature=own.feature, timeout=timeout)
            self._mark_unsupported(own.feature, silence_reason(own.feature, timeout))
            if own.purpose == "helo":
                # A DDM VM without handlers, or a silent peer: kept (still debuggable).
                self._identified()
        elif own.purpose == "dbgd":
            self._release_done(False)

    # ------------------------------------------------------------------ identification

    def _identify(self, now: float) -> None:
        if self.model.ddm is False:
            self._identified()  # a plain JVM, known from an earlier connection
            return
        self.model.unsupported.pop("HELO", None)  # one more HELO per connection
        self._ask(ddm.HeloRequest(1), "helo", "HELO", now)

    def _hello_answered(self, judgement: Judgement) -> None:
        now = self._now
        if judgement.answer is Answer.REFUSED:
            # A VM without DDM (a plain JVM). Only now may ddmd send a non-DDM command, once.
            self.model.ddm = False
            self._log("vm.not_ddm")
            self._mark_unsupported("HELO", f"it answered: {judgement.reason}")
            vm_id, send = self.router.send_own(
                SELF,
                CommandSet.VIRTUAL_MACHINE,
                VirtualMachineCommand.VERSION,
                b"",
                now + self.settings.ddm_request,
            )
            self._own[vm_id] = Own("version", "VERSION", Expect.REPLY)
            self._out.append(send)
            self._identified()
            return
        self.model.ddm = True
        if judgement.answer is not Answer.DATA:
            self._log(
                "vm.hello_failed", error=f"{self.name} sent a malformed answer ({judgement.reason})"
            )
            self._identified()
            self.handlers.connected()
            return
        for chunk in judgement.chunks:
            if isinstance(chunk, ddm.HeloReply):
                applied = self.model.apply_hello(chunk)
                self._notes(applied.notes)
        self._identified()
        self._ask(ddm.FeatRequest(), "feat", "FEAT", now)
        # Answered by the THCR burst, then an empty reply or (ART 9+) nothing at all.
        self._ask(ddm.ThreadNotify(True), "then", "THEN", now)
        if self.settings.heap_info:
            self._ask(ddm.HeapInfoRequest(3), "hpif-every-gc", "HPIF", now)
            self._heap_info_subscribed = True
            probe = self._ask(ddm.HeapInfoRequest(1), "hpif-now", "HPIF", now)
            probe.seen = self.model.heap_info_seq
        self.handlers.connected()  # their set-up requests go out after ddmd's own

    def _identified(self) -> None:
        if self.state == "identifying":
            self._goto("identified")
        self.identified = True
        self._out.append(Changed(renamed=True))

    # ------------------------------------------------------------------ chunk handlers' side

    def handler_send(self, origin: HandlerOrigin, data: bytes) -> int:
        self._touched = True
        vm_id, send = self.router.send_own(
            origin, CommandSet.DDM, DDM_COMMAND, data, self._now + self.settings.ddm_request
        )
        self._out.append(send)
        return vm_id

    def handler_log(self, event: str, level: str, **fields: object) -> None:
        self._log(event, level, **fields)

    def handler_publish(self, name: str, value: Any) -> None:
        self._out.append(Publish(name, value))

    def handler_snapshot(self) -> dict[str, Any]:
        return self._handler_view(self.snapshot())

    def _check_heap_probe(self, own: Own) -> None:
        """HPIF now always produces heap info where the VM has the handler (pushed before the
        reply, or in the draft's reply). None at all is the evidence that it lacks heap info,
        and heap segments with it: Android 12 removed both hooks together (protocol.md 3.8)."""
        if self.model.heap_info_seq > own.seen or own.refused():
            return
        self._heap_info_subscribed = False
        self._mark_unsupported("HPIF", silence_reason("HPIF", self.settings.ddm_request))
        self._mark_unsupported("HPSG", "it reports no heap information; Android 12 removed both")

    # ------------------------------------------------------------------ pushes

    def _on_push(self, packet: CommandPacket) -> list[Command]:
        self._touched = True
        try:
            chunks = ddm.split_chunks(packet.data)
        except ProtocolError as exc:
            self._log("ddm.chunk_malformed", "warning", error=str(exc), id=packet.id)
            return []
        self.handlers.dispatch(chunks, packet.id)  # ddmd's model first (_ModelHandler)
        return []

    def _on_push_piece(self, data: bytes, first: bool, last: bool) -> list[Command]:
        self._touched = True
        return self.push_piece(data, first, last)

    def _pushed(self, chunk_type: int, data: bytes, msg_id: int) -> None:
        """One pushed chunk, for ddmd's own model (``_ModelHandler``)."""
        if self.capture_chunk(chunk_type, data):
            return  # a trace or heap dump a call waits for
        try:
            chunk = ddm.decode_chunk(chunk_type, data, ddm.Direction.FROM_VM)
        except ProtocolError as exc:
            self._log("ddm.chunk_malformed", "warning", error=str(exc), id=msg_id)
            return
        self._apply(chunk)

    def _apply(self, chunk: ddm.Chunk) -> None:
        applied = self.model.apply(chunk)
        self._notes(applied.notes)
        if applied.waiting and self.settings.auto_select_waiting and not self.router.attached():
            self._out.append(SelectMe("waiting for a debugger"))
        if applied.changed or applied.renamed:
            self._out.append(Changed(renamed=applied.renamed))

    # ------------------------------------------------------------------ time

    def _tick(self, now: float) -> None:
        for entry in self.router.ids.expire(now):
            if self.handlers.owns(entry):
                self.handlers.expired(entry)
                continue
            own = self._own.pop(entry.vm_id, None)
            if own is not None:
                self._expired(own)
                if own.purpose == "hpif-now":
                    self._check_heap_probe(own)
                if own is self._thst:
                    self._thst = None
        for debugger, deadline in list(self._waits.items()):
            if now >= deadline:
                del self._waits[debugger]
                self.router.debugger_left(debugger)  # closed here: no DebuggerLeft will follow
                self._log(
                    "debugger.rejected",
                    "warning",
                    debugger=debugger,
                    reason=f"{self.vm_id} did not come back within [timeouts] reconnect",
                )
                self._out.append(CloseDebugger(debugger, "the VM did not come back"))

    def _poll(self, now: float) -> None:
        """THST at a fixed rate (missed ticks skipped) while someone watches the VM."""
        interval = self.settings.thread_poll_interval
        watched = self.settings.always_poll_threads or now < self._lease_until
        if not (
            watched
            and self.model.ddm
            and "THST" not in self.model.unsupported
            and self.router.ready
        ):
            self._next_poll = None
            return
        if self._next_poll is None:
            self._next_poll = now + self.settings.poll_phase * interval
        if now < self._next_poll:
            return
        if self._thst is None or self._thst.done:
            self._thst = self._ask(ddm.ThreadStatusRequest(), "thst", "THST", now)
        behind = now - self._next_poll
        self._next_poll += interval * (1 + int(behind // interval))

    def _schedule(self, *, again: bool = False) -> None:
        """Ask for a Tick at the earliest deadline: when it changed, and after every Tick
        (the driver forgets a wake-up once it has fired)."""
        times = [p.deadline for p in self._calls.values()]
        times += self._waits.values()
        deadline = self.router.ids.next_deadline()
        if deadline is not None:
            times.append(deadline)
        if self._next_poll is not None:
            times.append(self._next_poll)
        wake = min(times) if times else None
        if wake is not None and (wake != self._wake or again):
            self._out.append(WakeMeAt(wake))
        self._wake = wake

    # ------------------------------------------------------------------ the snapshot

    def snapshot(
        self,
        *,
        current: bool = False,
        debugger_port: int | None = None,
        debuggers: tuple[DebuggerSnapshot, ...] = (),
    ) -> VmSnapshot:
        m = self.model
        pid, app = m.pid, m.app
        if m.ddm is False:
            # A plain JVM found by the port scan: named like jps does (pid, main class or jar).
            pid = self.process_pid if pid is None else pid
            app = self.process_name if app is None else app
        peers = self.router.peers()
        return VmSnapshot(
            id=self.vm_id,
            source=self.source,
            address=self.address,
            state=self.state if self.state != "closed" else "disconnected",
            ddm=m.ddm,
            pid=pid,
            app=app,
            package=m.package,
            user_id=m.user_id,
            vm_ident=m.vm_ident,
            abi=m.abi,
            jvm_flags=m.jvm_flags,
            native_debuggable=m.native_debuggable,
            description=m.description,
            features=m.features,
            unsupported=tuple(sorted(m.unsupported)),
            waiting_for_debugger=m.waiting,
            threads=m.thread_tuple(),
            heaps=m.heaps,
            device=self.device,
            debugger_port=debugger_port,
            debugger=", ".join(peers) if peers else None,
            current=current,
            connected_at=self.connected_at,
            unsupported_reasons=tuple(sorted(m.unsupported.items())),
            debuggers=debuggers,
        )


def _jstring(data: bytes) -> str | None:
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if 4 + n > len(data):
        return None
    return data[4 : 4 + n].decode("utf-8", errors="replace")


class _ModelHandler:
    """ddmd's own chunk handler: every chunk the VM pushes (thread notices, heap info, heap
    segments, names, WAIT) reaches the session's model through the handler host, the same
    dispatch the plugins of ``ddmd.ext`` get, ahead of them and from the first byte."""

    name = "ddmd"

    def __init__(self, session: VmSession) -> None:
        self._session = session

    def handle_raw(self, chunk_type: int, data: bytes, msg_id: int) -> None:
        self._session._pushed(chunk_type, data, msg_id)
