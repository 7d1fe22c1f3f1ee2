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
from ddmd.protocol.expect import expectation
from ddmd.protocol.jdwp import (
    DDM_COMMAND,
    CommandPacket,
    CommandSet,
)
from ddmd.session.attach import Attachments
from ddmd.session.calls import SELF, Calls, Own, PendingCall
from ddmd.session.commands import (
    Changed,
    CloseDebugger,
    Command,
    Log,
    Publish,
    WakeMeAt,
)
from ddmd.session.conversation import Conversation
from ddmd.session.ddmshare import DdmShare, Switch
from ddmd.session.handlers import HandlerHost, HandlerLike, HandlerOrigin
from ddmd.session.inputs import (
    Call,
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    ConsumerNamed,
    Input,
    Tick,
    VmBytes,
    VmClosed,
    VmConnected,
)
from ddmd.session.jvmthreads import JvmThreads
from ddmd.session.model import UNNAMED, DebuggerSnapshot, Note, VmModel, VmSnapshot
from ddmd.session.profiling import Profiling, _Capture, _LargePush
from ddmd.session.router import Router, RouterStatistics
from ddmd.session.settings import SessionSettings
from ddmd.session.words import missing_sentence, words

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


class VmSession:
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
        self.conversation = Conversation(self)
        self.router = Router(
            on_reply=self.conversation._on_reply,
            on_push=self._on_push,
            on_push_piece=self._on_push_piece,
            max_packet=s.max_packet,
            stream_threshold=s.stream_threshold,
            share=DdmShare(self._own_wants, self._known_hello, self._known_features),
            max_debuggers=s.max_debuggers,
            ddm_timeout=s.ddm_request,
        )
        # The relay lane (the driver tries it per packet before ``handle``; the router's
        # functions themselves, bound once, as the lane pays for every call). Each decision
        # changes nothing; the driver writes the packet, then commits the tuple (one call):
        # - relay_vm(data) -> VmLane | None, then relayed_vm(lane): bytes from the VM that are
        #   one whole reply to a debugger that nothing here reads.
        # - relay_debugger(number, data) -> DebuggerLane | None, then relayed_debugger(lane):
        #   bytes from a debugger that are one whole command no rule answers or reads.
        # On None the driver feeds the bytes to ``handle``, whose general path does not try the
        # lane again; it takes a packet exactly as the lane would have.
        self.relay_vm = self.router.relay_from_vm
        self.relayed_vm = self.router.relayed_from_vm
        self.relay_debugger = self.router.relay_from_debugger
        self.relayed_debugger = self.router.relayed_from_debugger
        # The VM's own HELO and FEAT answers, for consumers that ask again (ddmshare.py).
        self.hello: ddm.HeloReply | None = None
        self.feat: ddm.FeatReply | None = None
        self.allocs_on = False  # ddmd itself turned the allocation tracker on
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
        self.calls = Calls(self)
        self.profiling = Profiling(self)
        self.attach = Attachments(self)
        self.jvm_threads = JvmThreads(self)

    # ------------------------------------------------------------------ the one entry point

    def handle(self, item: Input, now: float) -> list[Command]:
        """Feed one input; returns the commands to carry out, in order."""
        out = self._out = []
        self._now = now
        self.router.now = now
        self._touched = False
        attached_before = self.router.attached_count
        handshakes_before = self.router.handshakes
        if isinstance(item, VmBytes):
            out += self.router.vm_data(item.data)
            if not self._touched:
                # The relay's fast lane: only debuggers' packets went by; nothing of ddmd's own
                # (no reply, push or deadline) changed, so calls, polls and timers stand.
                self._out = []
                return out
        elif isinstance(item, ConsumerBytes):
            commands, leaving = self.router.debugger_data(item.consumer, item.data)
            out += commands
            if leaving is not None:
                self.attach._debugger_leaves(item.consumer, leaving, now)
            elif self.router.attached_count > attached_before:
                self.attach._attached(item.consumer)
            elif self.router.handshakes > handshakes_before:
                self._out.append(Changed())  # a consumer that speaks DDM only, listed now
            elif not self._touched:
                self._out = []  # the relay's fast lane, as for VmBytes
                return out
        elif isinstance(item, Tick):
            self._tick(now)
        elif isinstance(item, Call):
            self.calls._call(item, now)
        elif isinstance(item, VmConnected):
            self._connected(item, now)
        elif isinstance(item, ConsumerJoined):
            self.attach._debugger_joins(item, now)
        elif isinstance(item, ConsumerNamed):
            consumer = self.router.consumers.by_id.get(item.consumer)
            if consumer is not None:
                consumer.tool = item.tool
                self._out.append(Changed())
        elif isinstance(item, ConsumerLeft):
            self.attach._debugger_leaves(item.consumer, item.reason, now)
        elif isinstance(item, VmClosed):
            self._closed(item.reason)
        else:
            raise LocalProtocolError(f"VmSession cannot handle {item!r}")
        self.calls._settle(now)
        self.conversation._poll(now)
        self._schedule(again=isinstance(item, Tick))
        self._out = []
        return out

    def _own_wants(self, switch: Switch) -> bool:
        """Whether ddmd itself keeps a VM-wide DDM switch on (ddmshare.py)."""
        if switch is Switch.THREADS:
            return self.model.ddm is True and "THEN" not in self.model.unsupported
        if switch is Switch.HEAP_INFO:
            return self._heap_info_subscribed
        if switch is Switch.HEAP_SEGMENTS:
            return self._segment_users > 0
        if switch is Switch.ALLOCATIONS:
            return self.allocs_on
        if switch is Switch.TRACING:
            return self.trace_state in ("method", "sampling")
        return False

    def _known_hello(self) -> bytes | None:
        """The VM's HELO answer, with the names it reported since (APNM)."""
        hello = self.hello
        if hello is None:
            return None
        m = self.model
        changes: dict[str, Any] = {"app_name": m.app or hello.app_name}
        if hello.package_name is not None and m.package:
            changes["package_name"] = m.package
        return ddm.encode_chunk(dataclasses.replace(hello, **changes))

    def _known_features(self) -> bytes | None:
        return None if self.feat is None else ddm.encode_chunk(self.feat)

    def profiling_offer(self) -> dict[str, dict[str, object]]:
        """Which profiling features this VM offers, and why not (``Profiling``)."""
        return self.profiling.profiling_offer()

    # ------------------------------------------------------------------ the relay lane

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
        self.connected_at = now if item.wall is None else item.wall
        self.model.forget_threads()
        self.jvm_threads.reset()
        self._heap_info_subscribed = False
        if reopened:
            self.reconnects += 1
            self._log("vm.reconnected", "debug")  # a step of a release (attach.py)
        self._out += self.router.connected()
        for debugger in list(self._waits):
            if debugger in self.router.connected_consumers():
                self.attach._attached(debugger)
        self.conversation._identify(now)
        if item.leftover:
            self._out += self.router.vm_data(item.leftover)
        self._out.append(Changed())

    def _closed(self, reason: str) -> None:
        if self.state == "closed":
            return
        self._goto("closed")
        self._drop_own("the VM disconnected")
        consumers = self.router.connected_consumers()
        for debugger in consumers:
            self._log("debugger.detached", debugger=debugger, reason="the VM disconnected")
        for debugger in dict.fromkeys((*consumers, *self._waits)):
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
            self.calls._reject(pending, "gone", f"{self.name} went away ({why})")

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

    # ------------------------------------------------------------------ identification

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
        return self.profiling.push_piece(data, first, last)

    # ------------------------------------------------------------------ time

    def _tick(self, now: float) -> None:
        for entry in self.router.ids.expire(now):
            if self.handlers.owns(entry):
                self.handlers.expired(entry)
                continue
            if self.jvm_threads.owns(entry):
                self.jvm_threads.expired(entry)
                continue
            own = self._own.pop(entry.vm_id, None)
            if own is not None:
                self.conversation._expired(own)
                if own.purpose == "hpif-now":
                    self.conversation._check_heap_probe(own)
                if own is self._thst:
                    self._thst = None
        for debugger, deadline in list(self._waits.items()):
            if now >= deadline:
                del self._waits[debugger]
                self.router.debugger_left(debugger)  # closed here: no ConsumerLeft will follow
                self._log(
                    "debugger.rejected",
                    "warning",
                    debugger=debugger,
                    reason=f"{self.vm_id} did not come back within [timeouts] reconnect",
                )
                self._out.append(CloseDebugger(debugger, "the VM did not come back"))

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

    # ------------------------------------------------------------------ for the driver

    def relay_statistics(self) -> RouterStatistics:
        """Packets and bytes relayed both ways, commands outstanding, consumers."""
        return self.router.statistics()

    def consumer_attached(self, number: int) -> bool:
        """The consumer's handshake is done."""
        return self.router.is_attached(number)

    def consumer_waiting(self, number: int) -> bool:
        """The consumer's handshake is held until the VM connection is ready."""
        return self.router.is_waiting(number)

    def consumer_state(self, number: int) -> tuple[int, int, int, bool] | None:
        """(packets in, packets out, threads it holds suspended, debugging) of an attached
        consumer; None for one still in its handshake, or gone."""
        router = self.router
        counts = router.debugger_statistics(number)
        if counts is None or not router.is_attached(number):
            return None
        return counts[0], counts[1], router.bridge.held_by(number), number in router.attached()

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


class _ModelHandler:
    """ddmd's own chunk handler: every chunk the VM pushes (thread notices, heap info, heap
    segments, names, WAIT) reaches the session's model through the handler host, the same
    dispatch the plugins of ``ddmd.ext`` get, ahead of them and from the first byte."""

    name = "ddmd"

    def __init__(self, session: VmSession) -> None:
        self._session = session

    def handle_raw(self, chunk_type: int, data: bytes, msg_id: int) -> None:
        self._session.conversation._pushed(chunk_type, data, msg_id)
