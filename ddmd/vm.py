"""VmActor: owns one VM's JDWP connection and everything ddmd learns over it.

Layer: imports protocol/, registry, errors, logs. It must not scan, read config files, or know
about other VMs. One reader task per connection, one send lock, waiters per request id (the
jeepney ReplyMatcher shape); every id written to the VM comes from this actor's IdRewriter.

Lifecycle of one actor (``run``):

    connection ─▶ HELO ──error reply──▶ not DDM: VirtualMachine.Version once, then only bridging
                   │ reply / empty reply / timeout
                   ▼
                 FEAT, THEN 1, HPIF 3 (+ HPIF 1)   pushes handled in any order (APNM, WAIT, ...)
                   ▼
                 poll THST while observed, HPSG/HPGC/STKL on request

A request that times out or gets a JDWP error marks its feature unsupported for this VM (logged
once) and is not sent again; the rest keeps working. When the connection ends the actor ends and
the supervisor drops the VM.
"""

from __future__ import annotations

import contextlib
import math
import random
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import structlog
import trio

from ddmd.config import Config
from ddmd.debugger import SLOW_CONSUMER, DebuggerSession
from ddmd.discovery import Opener
from ddmd.discovery.localproc import LocalProcess
from ddmd.errors import DdmFailed, FeatureUnsupported, RequestTimedOut, VmGone
from ddmd.session.words import missing_sentence, silence_reason, words
from ddmd.listeners import VmPorts, accept_loop, close_with_reason
from ddmd.logs import Event
from ddmd.ports import vm_key
from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError, RemoteProtocolError
from ddmd.protocol.expect import FEATURE_NAMES, Answer, Judgement, judge
from ddmd.protocol.heap import HeapAssembler, HeapImage, HeapProblem, ProblemCode, SegmentKind
from ddmd.protocol.idmap import IdRewriter
from ddmd.protocol.jdwp import (
    EOF,
    HEADER_SIZE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    EventKind,
    Packet,
    PacketDecoder,
    PacketHeader,
    PacketPiece,
    PacketStart,
    ReplyPacket,
    VirtualMachineCommand,
    encode,
    encode_header,
)
from ddmd.registry import GcOutcome, HeapInfoSnapshot, ThreadSnapshot, VmRegistry, VmSnapshot

log = structlog.get_logger("ddmd.vm")

RECEIVE_SIZE = 65536
THREAD_LEASE_SECONDS = 5.0
# A GC on a VM that reports no heap info can be confirmed only by an (empty) reply, which
# Dalvik and ART 5-8 write at once and ART 9+ never writes: wait this long for one.
QUIET_CONFIRM_SECONDS = 1.0

# DDMS labels for THST status values (protocol.md 3.3).
_STATE_LABELS = {
    0: "zombie",
    1: "running",
    2: "timed-wait",
    3: "monitor",
    4: "wait",
    5: "init",
    6: "start",
    7: "native",
    8: "vmwait",
    9: "suspended",
}
_DRAFT_LABELS = {
    1: "running",
    2: "sleeping",
    3: "monitor",
    4: "waiting",
    5: "init",
    6: "start",
    7: "native",
    8: "vmwait",
}


class _Self:
    """The origin of ddmd's own requests in the id map."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ddmd"


SELF = _Self()


@dataclass(slots=True)
class _Waiter:
    event: trio.Event = field(default_factory=trio.Event)
    reply: ReplyPacket | None = None
    # Requests answered by pushes or silence (protocol.md 2.2) are judged when their reply
    # arrives: ``feature`` names what a FAIL or a JDWP error marks unsupported.
    feature: str | None = None
    judgement: Judgement | None = None

    def refused(self) -> bool:
        return self.judgement is not None and self.judgement.answer in (
            Answer.FAILED,
            Answer.REFUSED,
        )

    def succeeded(self) -> bool:
        return self.judgement is not None and self.judgement.answer is Answer.DATA


@dataclass(frozen=True, slots=True)
class VmStatistics:
    packets_in: int
    packets_out: int
    bytes_in: int
    bytes_out: int
    requests_timed_out: int
    outstanding: int


class _Connection:
    """One open JDWP stream to the VM: whole packets out under one lock; broken on failure."""

    def __init__(self, stream: trio.abc.Stream, on_broken: Callable[[], None]) -> None:
        self.stream = stream
        self.lock = trio.StrictFIFOLock()
        self.broken = False
        self._on_broken = on_broken

    def mark_broken(self) -> None:
        if not self.broken:
            self.broken = True
            self._on_broken()

    async def send(self, data: bytes) -> None:
        if self.broken:
            raise VmGone("the VM connection is closed")
        # Uncontended (the common case): take the lock without the extra scheduling round
        # trip of ``acquire()``; send_all is the checkpoint.
        try:
            self.lock.acquire_nowait()
        except trio.WouldBlock:
            await self.lock.acquire()
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.mark_broken()
            raise VmGone(f"sending to the VM failed: {exc}") from exc
        except BaseException:
            # A cancelled send wrote an unknown part: the stream is no longer usable, so the
            # session ends (the VM is dropped and found again by discovery).
            self.mark_broken()
            raise
        finally:
            self.lock.release()


_ID_SIZES = (CommandSet.VIRTUAL_MACHINE, VirtualMachineCommand.ID_SIZES)
_COMMAND_HEADER = struct.Struct(">IIBBB")
_REPLY_HEADER = struct.Struct(">IIBH")
_UNNAMED = ("", "<pre-initialized>")


@dataclass(slots=True)
class _RelayTarget:
    """Where the pieces of a large packet go: a debugger, a waiter of ours, or nowhere."""

    session: DebuggerSession | None = None
    waiter_id: int = 0
    header: PacketHeader | None = None
    buffer: bytearray | None = None


def _is_vm_start(packet: CommandPacket) -> bool:
    data = packet.data
    return (
        packet.command_set == CommandSet.EVENT
        and packet.command == 100
        and len(data) >= 6
        and data[5] == EventKind.VM_START
    )


class VmActor:
    """The one owner of a VM connection. See the module docstring for its lifecycle."""

    def __init__(
        self,
        *,
        vm_id: str,
        source: str,
        address: str,
        config: Config,
        registry: VmRegistry,
        device: str | None = None,
        expected_pid: int | None = None,
        ports: VmPorts | None = None,
        process: LocalProcess | None = None,
    ) -> None:
        self._vm_id = vm_id
        self._process = process
        self._ports = ports
        self._source = source
        self._address = address
        self._config = config
        self._registry = registry
        self._device = device
        self._expected_pid = expected_pid
        self._ids = IdRewriter()
        self._waiters: dict[int, _Waiter] = {}
        self._conn: _Connection | None = None
        self._state = "connecting"
        self._ddm: bool | None = None
        self._pid: int | None = expected_pid
        self._app: str | None = None
        self._package: str | None = None
        self._user_id: int | None = None
        self._vm_ident: str | None = None
        self._abi: str | None = None
        self._jvm_flags: str | None = None
        self._native_debuggable: bool | None = None
        self._description: str | None = None
        self._features: tuple[str, ...] = ()
        self._unsupported: dict[str, str] = {}
        self._waiting = False
        self._threads: dict[int, ThreadSnapshot] = {}
        self._threads_known = False
        self._heaps: tuple[HeapInfoSnapshot, ...] = ()
        self._assembler = HeapAssembler()
        self._heap_images: tuple[HeapImage, ...] = ()
        # Pushes that complete a user's command: counted, and ``_progress`` wakes whoever
        # waits for one (or for a reply to a request answered by pushes or silence).
        self._progress = trio.Event()
        self._heap_info_seq = 0
        self._heap_end_seq = 0
        self._heap_info_subscribed = False
        self._segment_users = 0
        self._thread_lease_until = -math.inf
        self._thread_poll_wakeup = trio.Event()
        self._connected_at: float | None = None
        self._unknown_logged: set[int] = set()
        self._packets_in = 0
        self._packets_out = 0
        self._bytes_in = 0
        self._bytes_out = 0
        self._timeouts = 0
        self._log = log.bind(vm=vm_id)
        # Debugger bridge state.
        self._nursery: trio.Nursery | None = None
        self._session_nursery: trio.Nursery | None = None
        self._debugger: DebuggerSession | None = None
        self._ready = trio.Event()  # connected and not being released
        self._recycle = False
        self._releasing = False
        self._held_vm_start: bytes | None = None
        self._id_sizes: bytes | None = None
        self._debugger_port: int | None = None
        self._port_key: str | None = None
        self._identified = False
        self._reconnects = 0
        self._slow_debuggers = 0
        self._relay_target: _RelayTarget | None = None
        self._session_ending = False
        self.relayed_to_vm = 0
        self.relayed_to_debugger = 0
        self.bytes_to_vm = 0
        self.bytes_to_debugger = 0

    # ------------------------------------------------------------------ public, sync

    @property
    def vm_id(self) -> str:
        return self._vm_id

    def snapshot(self) -> VmSnapshot:
        threads: tuple[ThreadSnapshot, ...] | None = None
        if self._threads_known:
            threads = tuple(self._threads[k] for k in sorted(self._threads))
        pid, app = self._pid, self._app
        if self._process is not None and self._ddm is False:
            # A plain JVM found by the port scan: named like jps does (pid, main class or jar).
            pid = self._process.pid if pid is None else pid
            app = self._process.name if app is None else app
        return VmSnapshot(
            id=self._vm_id,
            source=self._source,
            address=self._address,
            state=self._state,
            ddm=self._ddm,
            pid=pid,
            app=app,
            package=self._package,
            user_id=self._user_id,
            vm_ident=self._vm_ident,
            abi=self._abi,
            jvm_flags=self._jvm_flags,
            native_debuggable=self._native_debuggable,
            description=self._description,
            features=self._features,
            unsupported=tuple(sorted(self._unsupported)),
            waiting_for_debugger=self._waiting,
            threads=threads,
            heaps=self._heaps,
            device=self._device,
            debugger_port=self._debugger_port,
            debugger=(
                f"{self._debugger.peer} via {self._debugger.via}"
                if self._debugger is not None and self._debugger.attached
                else None
            ),
            current=self._registry.is_current(self._vm_id),
            connected_at=self._connected_at,
            unsupported_reasons=tuple(sorted(self._unsupported.items())),
        )

    def statistics(self) -> VmStatistics:
        return VmStatistics(
            self._packets_in,
            self._packets_out,
            self._bytes_in,
            self._bytes_out,
            self._timeouts,
            len(self._ids),
        )

    def last_heap_images(self) -> tuple[HeapImage, ...]:
        return self._heap_images

    # ------------------------------------------------------------------ public, async

    async def refresh_threads(self) -> VmSnapshot:
        self._thread_lease_until = trio.current_time() + THREAD_LEASE_SECONDS
        self._thread_poll_wakeup.set()
        if self._ddm and "THST" not in self._unsupported:
            with contextlib.suppress(FeatureUnsupported, RequestTimedOut):
                await self._poll_threads_once()
        return self.snapshot()

    async def cause_gc(self) -> GcOutcome:
        """HPGC, answered by pushes or silence: done when the GC's heap info arrives, or the
        VM's (empty) reply, which Dalvik and ART 5-8 write after the GC ran."""
        self._require_ddm("HPGC")
        seen = self._heap_info_seq
        heap_info = self._config.monitor.heap_info and "HPIF" not in self._unsupported
        if heap_info and not self._heap_info_subscribed:
            await self._send_quiet(ddm.HeapInfoRequest(2), "HPIF")  # info at the next GC
        gc = await self._send_quiet(ddm.GcRequest(), "HPGC")
        # Without heap info, only an empty reply can confirm the GC: wait briefly for it.
        patience = self._config.timeouts.ddm_request
        if not heap_info:
            patience = min(patience, QUIET_CONFIRM_SECONDS)
        await self._wait_until(
            lambda: self._heap_info_seq > seen or gc.succeeded(),
            (gc,),
            trio.current_time() + patience,
        )
        if self._heap_info_seq > seen:
            return GcOutcome(confirmed=True, by="heap info")
        if gc.succeeded():
            return GcOutcome(confirmed=True, by="reply")
        why = (
            "it does not report heap information"
            if "HPIF" in self._unsupported or not self._config.monitor.heap_info
            else f"no heap information arrived within {patience:g} s"
        )
        return GcOutcome(confirmed=False, by=None, note=f"the VM gave no confirmation: {why}")

    async def stack_trace(self, thread_id: int) -> ddm.StackTrace:
        self._require_ddm("STKL")
        chunks = await self._request(ddm.StackTraceRequest(thread_id), feature="STKL")
        for chunk in chunks:
            if isinstance(chunk, ddm.StackTrace):
                return chunk
        raise DdmFailed(f"{self._name()} sent no stack trace for thread {thread_id}")

    async def heap_segments(self) -> tuple[HeapImage, ...]:
        """HPSG on, HPGC, then the HPST..HPEN dump the GC pushes (both requests are answered
        by pushes or silence). Overlapping callers share the switch: it goes off again, in
        the background, when the last of them is done."""
        self._require_ddm("HPSG")
        seen = self._heap_end_seq
        patience = self._config.timeouts.ddm_request
        self._segment_users += 1
        try:
            waiters = (
                await self._send_quiet(ddm.HeapSegmentRequest(1, 0), "HPSG"),
                await self._send_quiet(ddm.GcRequest(), "HPGC"),
            )
            arrived = await self._wait_until(
                lambda: self._heap_end_seq > seen, waiters, trio.current_time() + patience
            )
        finally:
            self._segment_users -= 1
            if self._segment_users == 0 and self._session_nursery is not None:
                self._session_nursery.start_soon(self._segments_off)
        if not arrived:
            raise RequestTimedOut(
                f"{self._name()} sent no heap segments within {patience:g} s of the GC"
            )
        return self._heap_images

    async def _segments_off(self) -> None:
        if self._segment_users == 0 and self._conn is not None:
            # Checked with no checkpoint before the send takes its place in the FIFO send
            # lock, so a caller that switches segments on again is queued after this.
            with contextlib.suppress(VmGone):
                await self._send_quiet(ddm.HeapSegmentRequest(0, 0), "HPSG")

    # ------------------------------------------------------------------ lifecycle

    async def run(
        self,
        stream: trio.abc.Stream,
        leftover: bytes = b"",
        opener: Opener | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> str:
        """Serve the VM until its connection ends for good; returns the reason.

        After a debugger leaves, the connection may be recycled (closed and reopened with
        ``opener``) so the VM drops the debugger's state; the VM keeps its id and port.
        """
        with structlog.contextvars.bound_contextvars(vm=self._vm_id):
            self._registry.add(self)
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    task_status.started()
                    reason = await self._session(stream, leftover)
                    while self._recycle and opener is not None:
                        self._recycle = False
                        reopened = await self._reopen(opener)
                        if reopened is None:
                            reason = "reconnect failed"
                            break
                        reason = await self._session(*reopened)
                    nursery.cancel_scope.cancel()
                return reason
            finally:
                self._nursery = None
                self._registry.remove(self._vm_id)

    async def _reopen(self, opener: Opener) -> tuple[trio.abc.Stream, bytes] | None:
        self._state = "reconnecting"
        self._registry.changed(self._vm_id)
        self._log.info(Event.VM_RECONNECTING)
        delay = 0.01
        last_error = ""
        with trio.move_on_after(self._config.timeouts.reconnect):
            while True:
                try:
                    opened = await opener()
                except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                    last_error = str(exc) or type(exc).__name__
                except Exception as exc:
                    last_error = str(exc) or type(exc).__name__
                else:
                    self._reconnects += 1
                    self._log.info(Event.VM_RECONNECTED, attempts_delay=delay)
                    return opened
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)
        self._log.warning(Event.VM_RECONNECT_FAILED, error=last_error)
        return None

    async def _session(self, stream: trio.abc.Stream, leftover: bytes) -> str:
        conn = _Connection(stream, self._connection_broken)
        self._conn = conn
        self._connected_at = time.time()
        self._state = "identifying"
        self._threads = {}
        self._threads_known = False
        self._relay_target = None
        decoder = PacketDecoder(
            max_length=self._config.limits.max_packet_bytes,
            stream_threshold=self._config.debugger.relay_chunk_bytes,
        )
        if leftover:
            decoder.receive_data(leftover)
        self._log.info(Event.VM_CONNECTED, address=self._address, source=self._source)
        reason: str | None = None
        self._session_ending = False
        try:
            async with trio.open_nursery() as nursery:
                self._session_nursery = nursery
                self._releasing = False
                self._ready.set()
                nursery.start_soon(self._identify)
                nursery.start_soon(self._poll_threads_loop)
                reason = await self._read_loop(stream, decoder)
                self._session_ending = True
                nursery.cancel_scope.cancel()
            if self._recycle:
                reason = "recycled after the debugger left"
            elif reason is None:
                reason = "a send to the VM failed or was interrupted" if conn.broken else "closed"
        finally:
            # Replace the event only if it was set: while a release is under way, debuggers
            # already wait on the unset one, and the next session must wake exactly them.
            if self._ready.is_set():
                self._ready = trio.Event()
            self._session_nursery = None
            conn.broken = True
            self._conn = None
            self._fail_waiters()
            self._state = "disconnected"
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                with contextlib.suppress(Exception):
                    await stream.aclose()
            if self._debugger is not None and not self._recycle:
                self._debugger.end("the VM disconnected")
            if reason is None:
                reason = "closed"
            self._log.info(Event.VM_DISCONNECTED, reason=reason)
        return reason

    def _connection_broken(self) -> None:
        if self._session_ending or self._recycle:
            return  # the session is being torn down anyway; interrupted sends are expected
        self._log.warning(Event.VM_SEND_FAILED)
        if self._session_nursery is not None:
            self._session_nursery.cancel_scope.cancel()

    def _fail_waiters(self) -> None:
        for waiter in self._waiters.values():
            waiter.event.set()
        self._waiters.clear()
        self._ids.drop_origin(SELF)
        self._poke()

    async def _read_loop(self, stream: trio.abc.Stream, decoder: PacketDecoder) -> str:
        while True:
            try:
                while True:
                    event = decoder.next_event()
                    if event is NEED_DATA:
                        break
                    if event is EOF or isinstance(event, ConnectionClosed):
                        return "eof"
                    if isinstance(event, CommandPacket | ReplyPacket):
                        self._packets_in += 1
                        self._bytes_in += event.length
                        direct = self._dispatch(event)
                        if direct is not None:
                            await direct[0].deliver_now(direct[1])
                    elif isinstance(event, PacketStart):
                        self._packets_in += 1
                        self._bytes_in += event.header.length
                        self._relay_start(event.header)
                    elif isinstance(event, PacketPiece):
                        await self._relay_piece(event)
            except RemoteProtocolError as exc:
                self._log.warning(Event.VM_PROTOCOL_ERROR, error=str(exc))
                return f"protocol error: {exc}"
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                return f"connection error: {exc}"
            if not data:
                decoder.receive_data(b"")
            else:
                decoder.receive_data(data)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, packet: Packet) -> tuple[DebuggerSession, bytes] | None:
        """Handle one packet from the VM; returns (session, bytes) to send to a debugger."""
        if isinstance(packet, ReplyPacket):
            pending = self._ids.resolve(packet.id)
            if pending is None:
                self._log.info(Event.DDM_REPLY_UNKNOWN, id=packet.id, error=packet.error_code)
                return None
            if pending.origin is SELF:
                waiter = self._waiters.pop(packet.id, None)
                if waiter is not None:
                    self._answer(waiter, packet)
                return None
            if (pending.command_set, pending.command) == _ID_SIZES and not packet.error_code:
                self._id_sizes = packet.data
            session = self._debugger
            if session is not None and pending.origin is session:
                data = (
                    _REPLY_HEADER.pack(
                        HEADER_SIZE + len(packet.data),
                        pending.original_id,
                        0x80,
                        packet.error_code,
                    )
                    + packet.data
                )
                self.relayed_to_debugger += 1
                self.bytes_to_debugger += len(data)
                return session, data
            return None
        if ddm.is_ddm(packet):
            try:
                chunks = ddm.chunks_of(packet, ddm.Direction.FROM_VM)
            except ProtocolError as exc:
                self._log.warning(Event.DDM_CHUNK_MALFORMED, error=str(exc), id=packet.id)
                return None
            for chunk in chunks:
                self._on_push(chunk)
            return None
        # A JDWP event (or another command of the VM): it belongs to the debugger.
        session = self._debugger
        if session is not None and session.attached:
            data = encode(packet)
            self.relayed_to_debugger += 1
            self.bytes_to_debugger += len(data)
            return session, data
        if _is_vm_start(packet) and packet.data[0] != 0:
            # A suspend=y VM waits for whoever resumes it: keep this for the first debugger.
            # (A suspend=n HotSpot also sends VM_START, with suspend policy NONE, when ddmd
            # connected before its init finished; nobody waits on that one, and a debugger
            # attaching later must not see a stale "VM Started".)
            self._held_vm_start = encode(packet)
            self._log.info(Event.VM_START_HELD)
        else:
            self._log.debug(
                Event.VM_EVENT_DROPPED, command_set=packet.command_set, command=packet.command
            )
        return None

    def _relay_start(self, header: PacketHeader) -> None:
        """The header of a packet too large to buffer: decide where its pieces go."""
        target = _RelayTarget()
        if header.is_reply:
            pending = self._ids.resolve(header.id)
            if pending is None:
                self._log.info(Event.DDM_REPLY_UNKNOWN, id=header.id, length=header.length)
            elif pending.origin is SELF:
                target.waiter_id = header.id
                target.header = header
                target.buffer = bytearray()
            elif self._debugger is not None and pending.origin is self._debugger:
                target.session = self._debugger
                target.session.deliver_start(encode_header(header.with_id(pending.original_id)))
        elif header.command_set == CommandSet.DDM:
            self._log.info(Event.DDM_PUSH_DISCARDED, id=header.id, length=header.length)
        elif self._debugger is not None and self._debugger.attached:
            target.session = self._debugger
            target.session.deliver_start(encode_header(header))
        if target.session is not None:
            self.relayed_to_debugger += 1
            self.bytes_to_debugger += header.length
        self._relay_target = target

    async def _relay_piece(self, piece: PacketPiece) -> None:
        target = self._relay_target
        if target is None:
            return
        if target.session is not None:
            # Nothing else can come from the VM before this packet ends, so the reader waits
            # for the debugger here: memory stays bounded (a few relay pieces), and a debugger
            # that does not take the packet in time is dropped as a slow consumer.
            await target.session.deliver_piece_when_room(piece.data, last=piece.last)
        elif target.buffer is not None:
            target.buffer += piece.data
        if piece.last:
            self._relay_target = None
            if target.buffer is not None and target.header is not None:
                waiter = self._waiters.pop(target.waiter_id, None)
                if waiter is not None:
                    self._answer(
                        waiter,
                        ReplyPacket(
                            target.header.id, target.header.error_code, bytes(target.buffer)
                        ),
                    )

    def _on_push(self, chunk: ddm.Chunk) -> None:
        changed = True
        if isinstance(chunk, ddm.Zlib):
            try:
                inner = ddm.inflate_chunk(
                    chunk, ddm.Direction.FROM_VM, max_length=self._config.limits.max_inflated_bytes
                )
            except ProtocolError as exc:
                self._log.warning(Event.DDM_CHUNK_MALFORMED, type="ZLIB", error=str(exc))
                return
            self._on_push(inner)
            return
        if isinstance(chunk, ddm.AppName):
            self._apply_names(chunk.app_name, chunk.package_name, chunk.user_id, renamed=True)
        elif isinstance(chunk, ddm.WaitForDebugger):
            if not self._waiting:
                self._log.info(Event.VM_WAITING_FOR_DEBUGGER, reason=chunk.reason)
                if self._config.debugger.auto_select_waiting and self._debugger is None:
                    self._registry.select(self._vm_id, reason="waiting for a debugger")
            self._waiting = True
        elif isinstance(chunk, ddm.ThreadCreated | ddm.ThreadRenamed):
            old = self._threads.get(chunk.thread_id)
            if old is None:
                self._threads[chunk.thread_id] = ThreadSnapshot(chunk.thread_id, chunk.name)
            else:
                self._threads[chunk.thread_id] = replace(old, name=chunk.name)
            self._threads_known = True
        elif isinstance(chunk, ddm.ThreadDied):
            self._threads.pop(chunk.thread_id, None)
        elif isinstance(chunk, ddm.ThreadStatus | ddm.ThreadStatusDraft):
            self._apply_thread_status(chunk)
        elif isinstance(chunk, ddm.HeapInfo):
            self._heap_info_seq += 1
            self._poke()
            self._heaps = tuple(
                HeapInfoSnapshot(
                    h.heap_id,
                    h.timestamp_ms,
                    h.reason,
                    h.max_size,
                    h.size,
                    h.bytes_allocated,
                    h.objects_allocated,
                )
                for h in chunk.heaps
            )
        elif isinstance(chunk, ddm.HeapStart | ddm.NativeHeapStart):
            native = isinstance(chunk, ddm.NativeHeapStart)
            # start() returns the previous image of this heap if it was never ended: log
            # only the RESTARTED problem it adds (the others were logged when found).
            previous = self._assembler.start(chunk.heap_id, native=native)
            if previous is not None:
                self._report_heap_problems(
                    p for p in previous.problems if p.code is ProblemCode.RESTARTED
                )
            changed = False
        elif isinstance(chunk, ddm.HeapSegment | ddm.HeapSegmentObjects | ddm.NativeHeapSegment):
            kind = {
                ddm.HeapSegment: SegmentKind.HPSG,
                ddm.HeapSegmentObjects: SegmentKind.HPSO,
                ddm.NativeHeapSegment: SegmentKind.NHSG,
            }[type(chunk)]
            self._report_heap_problems(
                self._assembler.segment(
                    kind,
                    chunk.heap_id,
                    chunk.unit_size,
                    chunk.start,
                    chunk.offset,
                    chunk.units,
                    chunk.usage,
                )
            )
            changed = False
        elif isinstance(chunk, ddm.HeapEnd | ddm.NativeHeapEnd):
            native = isinstance(chunk, ddm.NativeHeapEnd)
            image = self._assembler.end(chunk.heap_id, native=native)
            # Segment problems were logged as they came; end() adds only this one.
            self._report_heap_problems(
                p for p in image.problems if p.code is ProblemCode.END_WITHOUT_START
            )
            if not native:
                others = tuple(i for i in self._heap_images if i.heap_id != image.heap_id)
                self._heap_images = (*others, image)
                self._heap_end_seq += 1
                self._poke()
        elif isinstance(chunk, ddm.UnknownChunk):
            if chunk.chunk_type not in self._unknown_logged:
                self._unknown_logged.add(chunk.chunk_type)
                self._log.info(
                    Event.DDM_CHUNK_UNKNOWN,
                    type=ddm.type_name(chunk.chunk_type),
                    length=len(chunk.data),
                )
            changed = False
        else:
            self._log.debug("ddm.push_ignored", type=type(chunk).__name__)
            changed = False
        if changed:
            self._registry.changed(self._vm_id)

    def _report_heap_problems(self, problems: Iterable[HeapProblem]) -> None:
        for problem in problems:
            self._log.warning(
                Event.HEAP_DUMP_PROBLEM,
                code=problem.code.value,
                heap=problem.heap_id,
                native=problem.native,
                problem=problem.message,
            )

    def _apply_names(
        self, app: str | None, package: str | None, user_id: int | None, *, renamed: bool
    ) -> None:
        old = (self._app, self._package)
        if app is not None and (app not in ("", "<pre-initialized>") or self._app is None):
            self._app = app
        if package is not None and (
            package not in ("", "<pre-initialized>") or self._package is None
        ):
            self._package = package
        if user_id is not None:
            self._user_id = user_id
        if renamed and (self._app, self._package) != old:
            self._log.info(Event.VM_APP_RENAMED, app=self._app, package=self._package)
        if (self._app, self._package) != old:
            self._registry.key_changed(self._vm_id)
            self._maybe_listen()

    def _apply_thread_status(self, chunk: ddm.ThreadStatus | ddm.ThreadStatusDraft) -> None:
        seen: dict[int, ThreadSnapshot] = {}
        if isinstance(chunk, ddm.ThreadStatus):
            for t in chunk.threads:
                old = self._threads.get(t.thread_id)
                seen[t.thread_id] = ThreadSnapshot(
                    t.thread_id,
                    old.name if old else "",
                    status=t.status,
                    state=_STATE_LABELS.get(t.status, str(t.status)),
                    tid=t.tid,
                    utime=t.utime,
                    stime=t.stime,
                    daemon=t.daemon,
                )
        else:
            for d in chunk.threads:
                old = self._threads.get(d.thread_id)
                seen[d.thread_id] = ThreadSnapshot(
                    d.thread_id,
                    old.name if old else "",
                    status=d.state,
                    state=_DRAFT_LABELS.get(d.state, str(d.state)),
                    suspended=d.suspended,
                )
        self._threads = seen
        self._threads_known = True

    # ------------------------------------------------------------------ requests

    def _name(self) -> str:
        return self.snapshot().display_name

    def _missing(self, feature: str) -> str:
        """The sentence a user reads when ``feature`` cannot be used on this VM."""
        return missing_sentence(
            self._name(), feature, self._unsupported.get(feature, ""), ddm=self._ddm
        )

    def _require_ddm(self, feature: str) -> None:
        if self._ddm is False:
            raise FeatureUnsupported(self._missing(feature))
        if self._conn is None:
            raise VmGone(f"{self._name()} is not connected")
        if feature in self._unsupported:
            raise FeatureUnsupported(self._missing(feature))
        kind = ddm.ChunkType.__members__.get(feature)
        needs = FEATURE_NAMES.get(kind) if kind is not None else None
        if needs is not None and self._features and needs not in self._features:
            self._mark_unsupported(feature, f"its feature list lacks {needs!r}")
            raise FeatureUnsupported(self._missing(feature))

    def _mark_unsupported(self, feature: str, why: str) -> None:
        if feature not in self._unsupported:
            self._unsupported[feature] = why
            self._log.info(
                Event.VM_FEATURE_UNSUPPORTED, feature=feature, what=words(feature), reason=why
            )
            self._registry.changed(self._vm_id)

    def _poke(self) -> None:
        """Something a waiter may be waiting for happened (a reply, a push, the end)."""
        self._progress.set()
        self._progress = trio.Event()

    def _answer(self, waiter: _Waiter, reply: ReplyPacket) -> None:
        """A reply to one of ddmd's own requests arrived (called from the reader)."""
        waiter.reply = reply
        waiter.event.set()
        if waiter.feature is not None:
            judgement = waiter.judgement = judge(reply)
            if judgement.answer is Answer.DATA:
                for chunk in judgement.chunks:  # the draft put HPIF data in the reply
                    self._on_push(chunk)
            elif judgement.answer is Answer.MALFORMED:
                self._log.warning(
                    Event.DDM_CHUNK_MALFORMED, feature=waiter.feature, error=judgement.reason
                )
            else:
                verb = "it refused" if judgement.answer is Answer.FAILED else "it answered"
                self._mark_unsupported(waiter.feature, f"{verb}: {judgement.reason}")
        self._poke()

    async def _send_quiet(self, chunk: ddm.Chunk, feature: str) -> _Waiter:
        """Send a request answered by pushes or silence (protocol.md 2.2) and return at once.

        A reply that comes before the deadline is judged when it arrives (a FAIL or a JDWP
        error marks ``feature`` unsupported); silence until the deadline is success, and the
        id is then forgotten. Callers that need the pushes wait with ``_wait_until``.
        """
        nursery = self._session_nursery
        if self._conn is None or nursery is None:
            raise VmGone(f"{self._name()} is not connected")
        deadline = trio.current_time() + self._config.timeouts.ddm_request
        packet = ddm.ddm_command(0, chunk)
        vm_id = self._ids.allocate(SELF, 0, packet.command_set, packet.command, deadline)
        waiter = _Waiter(feature=feature)
        self._waiters[vm_id] = waiter
        try:
            await self._send_command(
                CommandPacket(vm_id, packet.command_set, packet.command, packet.data)
            )
        except BaseException:
            self._waiters.pop(vm_id, None)
            self._ids.resolve(vm_id)
            raise
        nursery.start_soon(self._forget_quiet, vm_id, waiter, deadline)
        return waiter

    async def _forget_quiet(self, vm_id: int, waiter: _Waiter, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await waiter.event.wait()
        if self._waiters.get(vm_id) is waiter:  # silence: success, and the id is free again
            del self._waiters[vm_id]
            self._ids.resolve(vm_id)

    async def _wait_until(
        self, done: Callable[[], bool], waiters: Iterable[_Waiter], deadline: float
    ) -> bool:
        """Wait for ``done()``; False at the deadline. Raises FeatureUnsupported as soon as
        one of ``waiters`` is refused (FAIL or a JDWP error), VmGone when the VM goes away."""
        waiters = tuple(waiters)
        with trio.move_on_at(deadline):
            while True:
                for waiter in waiters:
                    if waiter.refused() and waiter.feature is not None:
                        raise FeatureUnsupported(self._missing(waiter.feature))
                if done():
                    return True
                if self._conn is None:
                    raise VmGone(f"{self._name()} disconnected")
                await self._progress.wait()
        return False

    async def _send_command(self, packet: CommandPacket) -> None:
        conn = self._conn
        if conn is None:
            raise VmGone(f"{self._vm_id} is not connected")
        data = encode(packet)
        await conn.send(data)
        self._packets_out += 1
        self._bytes_out += len(data)

    async def _raw_request(
        self, command_set: int, command: int, data: bytes, *, patience: float
    ) -> ReplyPacket:
        """Send one command of ddmd's own and wait for its reply (RequestTimedOut on silence)."""
        deadline = trio.current_time() + patience
        vm_id = self._ids.allocate(SELF, 0, command_set, command, deadline)
        waiter = _Waiter()
        self._waiters[vm_id] = waiter
        try:
            await self._send_command(CommandPacket(vm_id, command_set, command, data))
            with trio.move_on_at(deadline):
                await waiter.event.wait()
        finally:
            self._waiters.pop(vm_id, None)
            if waiter.reply is None:
                self._ids.resolve(vm_id)
        if waiter.reply is not None:
            return waiter.reply
        if self._conn is None:
            raise VmGone(f"{self._name()} disconnected while waiting for a reply")
        self._timeouts += 1
        raise RequestTimedOut(f"{self._name()} did not answer within {patience:g} s")

    async def _request(
        self, chunk: ddm.Chunk, *, feature: str, patience: float | None = None
    ) -> tuple[ddm.Chunk, ...]:
        """A request every DDM VM answers with a reply chunk (protocol.md 2.2); returns the
        reply's chunks. No answer in time and a JDWP error are evidence that the VM lacks the
        handler: ``feature`` is marked unsupported. A FAIL chunk refuses this one request
        (e.g. a stack trace of a thread that has ended) and raises DdmFailed."""
        if feature in self._unsupported:
            raise FeatureUnsupported(self._missing(feature))
        timeout = self._config.timeouts.ddm_request if patience is None else patience
        packet = ddm.ddm_command(0, chunk)
        try:
            reply = await self._raw_request(
                packet.command_set, packet.command, packet.data, patience=timeout
            )
        except RequestTimedOut:
            self._log.info(Event.DDM_REQUEST_TIMED_OUT, feature=feature, timeout=timeout)
            self._mark_unsupported(feature, silence_reason(feature, timeout))
            raise
        judgement = judge(reply)
        if judgement.answer is Answer.REFUSED:
            self._mark_unsupported(feature, f"it answered: {judgement.reason}")
            raise FeatureUnsupported(self._missing(feature))
        if judgement.answer is Answer.MALFORMED:
            self._log.warning(Event.DDM_CHUNK_MALFORMED, feature=feature, error=judgement.reason)
            raise DdmFailed(f"{self._name()} sent a malformed answer ({judgement.reason})")
        if judgement.answer is Answer.FAILED:
            raise DdmFailed(f"{self._name()} could not give {words(feature)}: {judgement.reason}")
        return judgement.chunks

    # ------------------------------------------------------------------ identification

    async def _identify(self) -> None:
        try:
            await self._identify_once()
        finally:
            had_key = self.selection_key() is not None
            self._identified = True
            if not had_key and self.selection_key() is not None:
                # A VM without a name (a plain JVM) gets its key, its address, only now: the
                # sticky selection may point at it again (registry re-checks the current VM).
                self._registry.key_changed(self._vm_id)
            self._maybe_listen()

    async def _identify_once(self) -> None:
        if self._ddm is False:
            # Known from an earlier connection: a plain JVM. No DDM, no second Version.
            self._state = "ready"
            self._registry.changed(self._vm_id)
            return
        if self._ddm is None:
            self._unsupported.pop("HELO", None)  # a silent VM gets one more HELO per connection
        try:
            chunks = await self._request(ddm.HeloRequest(1), feature="HELO")
        except FeatureUnsupported:
            # A JDWP error to HELO: a VM without DDM (a plain JVM). Only now may ddmd send a
            # non-DDM command, once, to learn its description.
            self._ddm = False
            self._log.info(Event.VM_NOT_DDM)
            self._state = "ready"
            self._registry.changed(self._vm_id)
            await self._ask_version()
            return
        except RequestTimedOut:
            # DDM VM without handlers, or a silent peer: keep it (still debuggable), but it
            # gets no further DDM traffic from us beyond what a user asks for.
            self._state = "ready"
            self._registry.changed(self._vm_id)
            return
        except (DdmFailed, VmGone) as exc:
            self._log.info(Event.VM_HELLO_FAILED, error=str(exc))
            self._ddm = True
            self._state = "ready"
            self._registry.changed(self._vm_id)
            return
        self._ddm = True
        for chunk in chunks:
            if isinstance(chunk, ddm.HeloReply):
                self._apply_hello(chunk)
        self._state = "ready"
        self._registry.changed(self._vm_id)
        with contextlib.suppress(FeatureUnsupported, RequestTimedOut, DdmFailed, VmGone):
            feat = await self._request(ddm.FeatRequest(), feature="FEAT")
            for chunk in feat:
                if isinstance(chunk, ddm.FeatReply):
                    self._features = chunk.features
            self._registry.changed(self._vm_id)
        with contextlib.suppress(VmGone):
            # Answered by the THCR burst, then an empty reply or (ART 9+) nothing at all.
            await self._send_quiet(ddm.ThreadNotify(True), "THEN")
        if self._config.monitor.heap_info and self._session_nursery is not None:
            self._session_nursery.start_soon(self._probe_heap_info)

    async def _probe_heap_info(self) -> None:
        """Heap info at every GC (HPIF 3), and now (HPIF 1). Both are answered by pushes or
        silence; but HPIF 1 always produces a push where the VM has the handler (the 2007 draft
        put the data in the reply: taken from either). No data at all is the evidence that the
        VM lacks heap info, and with it heap segments: Android 12 removed both hooks together
        (protocol.md 3.8)."""
        seen = self._heap_info_seq
        patience = self._config.timeouts.ddm_request
        try:
            await self._send_quiet(ddm.HeapInfoRequest(3), "HPIF")
            self._heap_info_subscribed = True
            now = await self._send_quiet(ddm.HeapInfoRequest(1), "HPIF")
            # Pushes come before the reply, so a reply without a push ends the wait too.
            await self._wait_until(
                lambda: self._heap_info_seq > seen or now.judgement is not None,
                (now,),
                trio.current_time() + patience,
            )
        except (FeatureUnsupported, VmGone):
            self._heap_info_subscribed = False
            return
        if self._heap_info_seq == seen:
            self._heap_info_subscribed = False
            self._mark_unsupported("HPIF", silence_reason("HPIF", patience))
            self._mark_unsupported(
                "HPSG", "it reports no heap information; Android 12 removed both"
            )

    def _apply_hello(self, hello: ddm.HeloReply) -> None:
        if self._expected_pid is not None and hello.pid != self._expected_pid:
            self._log.warning("vm.pid_mismatch", expected=self._expected_pid, reported=hello.pid)
        self._pid = hello.pid
        self._vm_ident = hello.vm_ident
        self._abi = hello.abi
        self._jvm_flags = hello.jvm_flags
        self._native_debuggable = hello.native_debuggable
        self._apply_names(hello.app_name, hello.package_name, hello.user_id, renamed=False)
        self._log.info(
            Event.VM_HELLO,
            pid=self._pid,
            app=self._app,
            package=self._package,
            vm_ident=self._vm_ident,
        )

    async def _ask_version(self) -> None:
        try:
            reply = await self._raw_request(
                CommandSet.VIRTUAL_MACHINE,
                VirtualMachineCommand.VERSION,
                b"",
                patience=self._config.timeouts.ddm_request,
            )
        except (RequestTimedOut, VmGone):
            return
        if reply.error_code == 0:
            self._description = _read_jstring(reply.data)
            self._log.info(Event.VM_VERSION, description=self._description)
            self._registry.changed(self._vm_id)

    # ------------------------------------------------------------------ thread polling

    async def _poll_threads_once(self) -> None:
        chunks = await self._request(ddm.ThreadStatusRequest(), feature="THST")
        for chunk in chunks:
            if isinstance(chunk, ddm.ThreadStatus | ddm.ThreadStatusDraft):
                self._apply_thread_status(chunk)
                self._registry.changed(self._vm_id)

    def _observed(self) -> bool:
        return (
            self._config.monitor.always_poll_threads
            or trio.current_time() < self._thread_lease_until
        )

    async def _poll_threads_loop(self) -> None:
        interval = self._config.monitor.thread_poll_interval
        # A fixed-rate schedule (missed ticks skipped) with a random phase per VM, so hundreds
        # of VMs do not poll in lock-step and the rate does not drift by the round-trip time.
        next_tick = trio.current_time() + random.uniform(0, interval)
        while True:
            if self._ddm and "THST" not in self._unsupported and self._observed():
                await trio.sleep_until(next_tick)
                with contextlib.suppress(RequestTimedOut, FeatureUnsupported, DdmFailed):
                    await self._poll_threads_once()
                now = trio.current_time()
                next_tick += interval
                if next_tick < now:
                    next_tick = now + interval - (now - next_tick) % interval
            else:
                self._thread_poll_wakeup = trio.Event()
                with trio.move_on_after(interval):
                    await self._thread_poll_wakeup.wait()

    # ------------------------------------------------------------------ debugger bridge

    def selection_key(self) -> str | None:
        for name in (self._package, self._app):
            if name and name not in _UNNAMED:
                return vm_key(self._device, name)
        if self._identified and self._ddm is not True:
            # A VM that reports no name (a plain JVM) is known by its address.
            return vm_key(self._device, self._address)
        return None

    def _maybe_listen(self) -> None:
        """Open the per-VM debugger port once the VM has a stable key."""
        if self._ports is None or self._port_key is not None or self._nursery is None:
            return
        key = self.selection_key()
        if key is None:
            return
        self._port_key = key
        self._nursery.start_soon(self._serve_port, key)

    async def _serve_port(self, key: str) -> None:
        assert self._ports is not None
        opened = await self._ports.open_for(key)
        if opened is None:
            return
        listener, port = opened
        self._debugger_port = port
        self._registry.changed(self._vm_id)
        self._log.info(Event.DEBUGGER_LISTENING, port=port, via="vm-port", key=key)
        try:
            await accept_loop(
                listener, lambda stream, peer: self.adopt_debugger(stream, peer, via="vm-port")
            )
        finally:
            self._ports.release(port)
            self._debugger_port = None

    def adopt_debugger(self, stream: trio.abc.Stream, peer: str, *, via: str) -> None:
        nursery = self._nursery
        if nursery is None:
            # The VM is going away: close the connection (it has nowhere to go).
            trio.lowlevel.spawn_system_task(close_with_reason, stream)
            return
        holder = self._debugger
        if holder is not None:
            self._log.warning(
                Event.DEBUGGER_REJECTED,
                peer=peer,
                via=via,
                reason=f"{self._vm_id} already has a debugger",
                holder=holder.peer,
                holder_via=holder.via,
            )
            nursery.start_soon(close_with_reason, stream)
            return
        port = self._debugger_port if via == "vm-port" else self._config.debugger.current_port
        session = DebuggerSession(
            stream,
            peer=peer,
            via=via,
            port=port,
            target=self,
            config=self._config,
            vm_id=self._vm_id,
        )
        self._debugger = session
        nursery.start_soon(session.run)

    async def wait_debugger_ready(self, session: DebuggerSession) -> None:
        """Bounded wait until the VM is connected (e.g. still reconnecting after a release)."""
        with trio.move_on_after(self._config.timeouts.reconnect):
            while not self._ready.is_set():
                await self._ready.wait()
            if session is not self._debugger:
                raise VmGone(f"{self._vm_id}: debugger slot was taken over")
            session.attached = True
            self._waiting = False
            self._registry.changed(self._vm_id)
            held, self._held_vm_start = self._held_vm_start, None
            if held is not None:
                session.deliver(held)
            return
        raise VmGone(f"{self._vm_id} did not come back within [timeouts] reconnect")

    def cached_id_sizes(self) -> bytes | None:
        return self._id_sizes

    async def forward(self, session: DebuggerSession, packet: CommandPacket) -> None:
        if session is not self._debugger:
            return
        if not self._ready.is_set():
            with trio.move_on_after(self._config.timeouts.reconnect):
                while not self._ready.is_set():
                    await self._ready.wait()
        conn = self._conn
        if conn is None or not self._ready.is_set():
            session.end("the VM is not connected")
            return
        vm_id = self._ids.allocate(session, packet.id, packet.command_set, packet.command, math.inf)
        data = (
            _COMMAND_HEADER.pack(
                HEADER_SIZE + len(packet.data), vm_id, 0, packet.command_set, packet.command
            )
            + packet.data
        )
        try:
            await conn.send(data)
        except VmGone:
            self._ids.resolve(vm_id)
            session.end("the VM connection failed")
            return
        self._packets_out += 1
        self._bytes_out += len(data)
        self.relayed_to_vm += 1
        self.bytes_to_vm += len(data)

    def detach(self, session: DebuggerSession, reason: str) -> None:
        if reason == SLOW_CONSUMER:
            self._slow_debuggers += 1
        if session is not self._debugger:
            return
        self._debugger = None
        self._ids.drop_origin(session)
        self._registry.changed(self._vm_id)
        if session.attached and self._nursery is not None and self._conn is not None:
            self._releasing = True
            self._ready = trio.Event()  # new debuggers wait until the release is over
            self._nursery.start_soon(self._release, reason)

    async def _release(self, reason: str) -> None:
        """Make the VM drop the debugger's state: DBGD if it acknowledges, else reconnect."""
        session_nursery = self._session_nursery
        if self._ddm is True and self._conn is not None:
            self._log.info(Event.DDM_DBGD_SENT, after=reason)
            acknowledged = False
            with contextlib.suppress(FeatureUnsupported, VmGone):
                dbgd = await self._send_quiet(ddm.Dbgd(), "DBGD")
                await self._wait_until(
                    lambda: dbgd.judgement is not None,
                    (dbgd,),
                    trio.current_time() + self._config.timeouts.dbgd_ack,
                )
                answer = dbgd.judgement
                acknowledged = (
                    answer is not None
                    and answer.answer is Answer.DATA
                    and any(isinstance(c, ddm.Dbgd) for c in answer.chunks)
                )
            if acknowledged and self._conn is not None:
                self._log.info(Event.DDM_DBGD_ACKNOWLEDGED)
                self._releasing = False
                self._ready.set()
                return
        # Closing the connection releases breakpoints and suspensions on every VM family.
        self._recycle = True
        if session_nursery is not None:
            session_nursery.cancel_scope.cancel()

    def bridge_statistics(self) -> dict[str, int]:
        return {
            "packets_to_vm": self.relayed_to_vm,
            "packets_to_debugger": self.relayed_to_debugger,
            "bytes_to_vm": self.bytes_to_vm,
            "bytes_to_debugger": self.bytes_to_debugger,
            "reconnects": self._reconnects,
            "slow_debuggers": self._slow_debuggers,
        }


def _read_jstring(data: bytes) -> str | None:
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if 4 + n > len(data):
        return None
    return data[4 : 4 + n].decode("utf-8", errors="replace")
