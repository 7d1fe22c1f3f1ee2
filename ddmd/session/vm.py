"""VmSession: everything ddmd decides about one VM, as a sans-IO object (h11's ``Connection``).

Layer: standard library, ``ddmd.protocol`` and ``ddmd.session`` only. No sockets, no clock, no
logging: ``handle(input, now)`` returns the commands to carry out (``commands.py``), and time
arrives as a value.

Lifecycle (the one table, ``lifecycle.TRANSITIONS``):

    connecting ─VmConnected─▶ identifying ─identified─▶ ready ─last debugger left─▶ releasing
                                   ▲                      ▲                            │
                                   │                      └─DBGD acknowledged/released─┤
                                   └──────VmConnected────── reconnecting ◀─no ack──────┘
    any state ─VmClosed─▶ closed

The session composes parts; each owns its state and sees the session only as a
``SessionHost`` (``host.py``: nine members, which the session implements); no part imports
this module. A part is also handed, by name, what else it works with: the ``Lifecycle``, the
router's public API, a sibling's public methods (the release to the conversation; the poll,
the conversation and profiling to the calls):

    calls.py         Calls         API calls under way; heap segments kept on for a heap dump
    profiling.py     Profiling     tracing, allocations, HPROF, kill
    capture.py       Captures      the files profiling calls wait for, passed on as they come
    conversation.py  Conversation  HELO, FEAT, THEN, heap info; the VM's HELO/FEAT answers
    poll.py          ThreadPoll    THST (or the JDWP thread list) while someone watches
    jvmthreads.py    JvmThreads    a plain JVM's thread list over JDWP
    release.py       Release       consumers joining, waiting and leaving; the release (DBGD, ddmd's
                                   own commands on the kept connection, or a reconnect)
    feed.py          ModelFeed     the VM's chunks applied to the model (``model.py``)

``handle`` dispatches each input on its class to the part it concerns, then lets the calls
settle and the poll run, and asks for a ``Tick`` at the earliest of the parts' deadlines
(``next_deadline``). A request ddmd sends on its own is an ``Own`` carrying its owner (the
part that asked); it is also the request's id-map origin, so the router's ``on_reply`` (and an
expiry) goes straight to ``own.owner``.

A DDM push, hop by hop:

    router.vm_command ─on_push─▶ VmSession (``_on_push``: split into chunks)
        ─▶ HandlerHost.dispatch (handlers.py): the built-in handlers in order, then the plugins
            ─▶ Captures.handle_raw (capture.py): a file a profiling call waits for (a trace, a
               heap dump)? Passed on, and taken.
            ─▶ ModelFeed.handle_raw (feed.py): decoded, applied to ``VmModel``
    a push too large to hold ─on_push_piece─▶ VmSession ─▶ Captures.push_piece

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
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ddmd.protocol import ddm
from ddmd.protocol.errors import LocalProtocolError, ProtocolError
from ddmd.protocol.expect import expectation
from ddmd.protocol.idmap import Pending
from ddmd.protocol.jdwp import DDM_COMMAND, CommandPacket, CommandSet, ReplyPacket
from ddmd.session.calls import Calls
from ddmd.session.capture import Captures
from ddmd.session.commands import Changed, Command, Log, Publish, WakeMeAt
from ddmd.session.conversation import Conversation
from ddmd.session.ddmshare import DdmShare, Switch
from ddmd.session.feed import ModelFeed
from ddmd.session.handlers import HandlerHost, HandlerLike, HandlerOrigin
from ddmd.session.host import Own, Owner
from ddmd.session.host import missing as missing_of
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
from ddmd.session.lifecycle import TRANSITIONS, Lifecycle
from ddmd.session.model import (
    UNNAMED,
    DebuggerSnapshot,
    ForesightSnapshot,
    VmModel,
    VmSnapshot,
)
from ddmd.session.poll import ThreadPoll
from ddmd.session.profiling import Profiling
from ddmd.session.release import Release
from ddmd.session.router import Router, RouterStatistics
from ddmd.session.settings import SessionSettings
from ddmd.session.words import words

__all__ = ["TRANSITIONS", "SessionSettings", "VmSession"]


class VmSession:
    """One VM's lifecycle, parts, model and routing table (``SessionHost`` of its parts)."""

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
        self.lifecycle = Lifecycle(vm_id)
        self.model = VmModel(expected_pid=expected_pid, max_inflated=s.max_inflated)
        self.router = Router(
            on_reply=self._on_reply,
            on_push=self._on_push,
            on_push_piece=self._on_push_piece,
            max_packet=s.max_packet,
            stream_threshold=s.stream_threshold,
            share=DdmShare(self._own_wants, self._known_hello, self._known_features),
            max_debuggers=s.max_debuggers,
            ddm_timeout=s.ddm_request,
            speculate=(
                s.speculate,
                s.speculate_rtt,
                s.speculate_max_inflight,
                s.speculate_max_bytes,
            ),
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
        self.connected_at: float | None = None  # wall clock, from VmConnected
        self.reconnects = 0
        self._handler_view = handler_view or dataclasses.asdict
        self._out: list[Command] = []  # the commands of the input being handled
        self._now = 0.0
        self._wake: float | None = None
        self._touched = False  # something of ddmd's own happened (not only the relay)
        # The parts (vm.py's docstring). ddmd's model takes the VM's pushes through the same
        # dispatch as the plugins, first: a capture a call waits for, then the model.
        self.captures = Captures(self)
        self.feed = ModelFeed(self, self.router.attached)
        self.profiling = Profiling(self, self.captures)
        self.handlers = HandlerHost(vm_id, handlers, self, builtin=(self.captures, self.feed))
        self.jvm_threads = JvmThreads(self)
        self.release = Release(self, self.lifecycle, self.router, self._recycle)
        self.conversation = Conversation(self, self.lifecycle, self.release, self.handlers)
        self.poll = ThreadPoll(self, self.lifecycle, self.router, self.jvm_threads)
        self.calls = Calls(
            self,
            self.lifecycle,
            self.router,
            poll=self.poll,
            conversation=self.conversation,
            profiling=self.profiling,
        )

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
                self.release.leave(item.consumer, leaving)
            elif self.router.attached_count > attached_before:
                self.release.attached(item.consumer)
            elif self.router.handshakes > handshakes_before:
                out.append(Changed())  # a consumer that speaks DDM only, listed now
            elif not self._touched:
                self._out = []  # the relay's fast lane, as for VmBytes
                return out
        elif isinstance(item, Tick):
            self._tick(now)
        elif isinstance(item, Call):
            self.calls.call(item, now)
        elif isinstance(item, VmConnected):
            self._connected(item, now)
        elif isinstance(item, ConsumerJoined):
            self.release.join(item, now)
        elif isinstance(item, ConsumerNamed):
            self.release.named(item.consumer, item.tool)
        elif isinstance(item, ConsumerLeft):
            self.release.leave(item.consumer, item.reason)
        elif isinstance(item, VmClosed):
            self._closed(item.reason)
        else:
            raise LocalProtocolError(f"VmSession cannot handle {item!r}")
        self.calls.settle(now)
        self.poll.poll(now)
        self._schedule(again=isinstance(item, Tick))
        self._out = []
        return out

    # ------------------------------------------------------------------ read by the driver

    @property
    def state(self) -> str:
        """Where the session is in ``TRANSITIONS``."""
        return self.lifecycle.state

    @property
    def identified(self) -> bool:
        return self.lifecycle.identified

    @property
    def trace_state(self) -> str:
        """The trace's state: unknown, off, method or sampling (``Profiling``)."""
        return self.profiling.trace_state

    def profiling_offer(self) -> dict[str, dict[str, object]]:
        """Which profiling features this VM offers, and why not (``Profiling``)."""
        return self.profiling.profiling_offer()

    # ------------------------------------------------------------------ what ddmshare asks

    def _own_wants(self, switch: Switch) -> bool:
        """Whether ddmd itself keeps a VM-wide DDM switch on (ddmshare.py)."""
        if switch is Switch.THREADS:
            return self.model.ddm is True and "THEN" not in self.model.unsupported
        if switch is Switch.HEAP_INFO:
            return self.conversation.heap_info_subscribed
        if switch is Switch.HEAP_SEGMENTS:
            return self.calls.segments_wanted
        if switch is Switch.ALLOCATIONS:
            return self.profiling.allocs_on
        if switch is Switch.TRACING:
            return self.profiling.tracing
        return False

    def _known_hello(self) -> bytes | None:
        """The VM's HELO answer, with the names it reported since (APNM)."""
        hello = self.conversation.hello
        if hello is None:
            return None
        m = self.model
        changes: dict[str, Any] = {"app_name": m.app or hello.app_name}
        if hello.package_name is not None and m.package:
            changes["package_name"] = m.package
        return ddm.encode_chunk(dataclasses.replace(hello, **changes))

    def _known_features(self) -> bytes | None:
        feat = self.conversation.feat
        return None if feat is None else ddm.encode_chunk(feat)

    # ------------------------------------------------------------------ SessionHost

    def emit(self, command: Command) -> None:
        self._out.append(command)

    def log(self, event: str, level: str = "info", **fields: object) -> None:
        self._out.append(Log(event, level, dict(fields)))

    def ask(self, chunk: ddm.Chunk, owner: Owner, what: str, *, timeout: float = 0.0) -> Own:
        chunk_type = int(chunk.chunk_type)
        own = Own(owner, what, ddm.type_name(chunk_type), expectation(chunk_type))
        packet = ddm.ddm_command(0, chunk)
        deadline = self._now + (timeout or self.settings.ddm_request)
        _, send = self.router.send_own(
            own, packet.command_set, packet.command, packet.data, deadline
        )
        self._out.append(send)
        return own

    def send_jdwp(self, origin: Hashable, command_set: int, command: int, data: bytes) -> int:
        deadline = self._now + self.settings.ddm_request
        vm_id, send = self.router.send_own(origin, command_set, command, data, deadline)
        self._out.append(send)
        return vm_id

    def mark_unsupported(self, feature: str, why: str) -> None:
        if self.model.mark_unsupported(feature, why):
            self.log("vm.feature_unsupported", feature=feature, what=words(feature), reason=why)
            self._out.append(Changed())

    def apply(self, chunk: ddm.Chunk) -> None:
        self.feed.apply(chunk)

    # ------------------------------------------------------------------ the VM connection

    def _connected(self, item: VmConnected, now: float) -> None:
        reopened = self.state == "reconnecting"
        self.lifecycle.goto("connected")
        self.connected_at = now if item.wall is None else item.wall
        self.model.forget_threads()
        self.jvm_threads.reset()
        if reopened:
            self.reconnects += 1
            self.log("vm.reconnected", "debug")  # a step of a release (release.py)
        self._out += self.router.connected()
        self.release.connection_usable()
        self.conversation.identify()
        if item.leftover:
            self._out += self.router.vm_data(item.leftover)
        self._out.append(Changed())

    def _closed(self, reason: str) -> None:
        if self.state == "closed":
            return
        self.lifecycle.goto("closed")
        self._recycle("the VM disconnected")
        self.release.vm_gone()
        self.log("vm.disconnected", reason=reason)
        self._out.append(Changed())

    def _recycle(self, why: str) -> None:
        """The connection ends (closed or reopened): every pending request fails at once."""
        self.handlers.disconnected()
        self.router.disconnected()
        self.captures.drop()
        self.profiling.drop()
        self.poll.drop()
        self.calls.drop(f"{self.name} went away ({why})")

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
        if self.lifecycle.identified and self.model.ddm is not True:
            return f"{self.device or 'local'}|{self.address}"
        return None

    def missing(self, feature: str) -> str:
        """The sentence for a user: what the VM lacks and why."""
        return missing_of(self, feature)

    # ------------------------------------------------------------------ chunk handlers' side

    def handler_send(self, origin: HandlerOrigin, data: bytes) -> int:
        self._touched = True
        vm_id, send = self.router.send_own(
            origin, CommandSet.DDM, DDM_COMMAND, data, self._now + self.settings.ddm_request
        )
        self._out.append(send)
        return vm_id

    def handler_log(self, event: str, level: str, **fields: object) -> None:
        self.log(event, level, **fields)

    def handler_publish(self, name: str, value: Any) -> None:
        self._out.append(Publish(name, value))

    def handler_snapshot(self) -> dict[str, Any]:
        return self._handler_view(self.snapshot())

    # ------------------------------------------------------------------ from the router

    def _on_reply(self, pending: Pending, packet: ReplyPacket) -> list[Command]:
        """A reply to a command of ddmd's own: to whoever asked."""
        self._touched = True
        origin = pending.origin
        if type(origin) is Own:
            if origin.owner is not None:
                origin.owner.answered(origin, packet)
        elif self.jvm_threads.owns(pending):
            self.jvm_threads.reply(pending, packet)
        elif self.handlers.owns(pending):
            self.handlers.reply(pending, packet)
        return []

    def _on_push(self, packet: CommandPacket) -> list[Command]:
        self._touched = True
        try:
            chunks = ddm.split_chunks(packet.data)
        except ProtocolError as exc:
            self.log("ddm.chunk_malformed", "warning", error=str(exc), id=packet.id)
            return []
        self.handlers.dispatch(chunks, packet.id)  # a capture, ddmd's model, then the plugins
        return []

    def _on_push_piece(self, data: bytes, first: bool, last: bool) -> list[Command]:
        self._touched = True
        return self.captures.push_piece(data, first, last, self._now)

    # ------------------------------------------------------------------ time

    def _tick(self, now: float) -> None:
        for entry in self.router.ids.expire(now):
            origin = entry.origin
            if type(origin) is Own:
                if origin.owner is not None:
                    origin.owner.expired(origin)
            elif self.handlers.owns(entry):
                self.handlers.expired(entry)
            elif self.jvm_threads.owns(entry):
                self.jvm_threads.expired(entry)
        self.release.expire(now)

    def _schedule(self, *, again: bool = False) -> None:
        """Ask for a Tick at the earliest deadline of the parts and the id map: when it
        changed, and after every Tick (the driver forgets a wake-up once it has fired)."""
        wake = self.router.ids.next_deadline()
        for t in (
            self.calls.next_deadline(),
            self.release.next_deadline(),
            self.poll.next_deadline(),
        ):
            if t is not None and (wake is None or t < wake):
                wake = t
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
        return number in self.router.consumers.waiting

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
        peers = self.router.consumers.peers()
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
            foresight=self._foresight(),
        )

    def _foresight(self) -> ForesightSnapshot:
        f = self.router.foresight.statistics()
        return ForesightSnapshot(
            f.on, f.rtt, f.answered_cache, f.answered_speculation, f.speculated, f.wasted
        )
