"""`SimVm`: a simulated DDM-speaking VM reached over TCP (run by ``ddmd sim``, ``ddmd demo`` and
tests): the listening socket, one connection at a time, the DDM handlers, pushes and the GC.
How it behaves (flavours, replies, pushes) is described in the package docstring (`ddmd.sim`).

Layer: a tool beside the daemon. It imports ``ddmd.protocol`` (JDWP framing, DDM chunks), the
other ``ddmd.sim`` modules (`config`, `connection`, `threads`, `heap`, `jdwp`, `ddms`), trio
and structlog, and nothing else from ddmd; nothing in the daemon imports it.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

import structlog
import trio

from ddmd.protocol.ddm import (
    AppName,
    Chunk,
    Dbgd,
    Direction,
    ExitRequest,
    Fail,
    FeatReply,
    FeatRequest,
    GcRequest,
    HeapInfoRequest,
    HeapSegmentRequest,
    HeloReply,
    HeloRequest,
    NativeHeapSegmentRequest,
    ResolvedAllocation,
    StackTraceRequest,
    ThreadNotify,
    ThreadStatusRequest,
    WaitForDebugger,
    decode_chunk,
    encode_chunk,
    type_name,
)
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    NEED_DATA,
    CommandPacket,
    CommandSet,
    ConnectionClosed,
    ErrorCode,
    PacketDecoder,
    ReplyPacket,
    encode,
)
from ddmd.sim.config import PRE_INITIALIZED, SimConfig, SimStatistics, refusal
from ddmd.sim.connection import Connection, ConnectionBrokenError, read_handshake, receive
from ddmd.sim.ddms import DdmsFeatures
from ddmd.sim.heap import (
    HeapPiece,
    build_heap,
    dump_chunks,
    heap_info_chunk,
    mutate_piece,
    native_dump_chunks,
)
from ddmd.sim.hprof import HeapContent
from ddmd.sim.jdwp import Halt, PlainJdwp
from ddmd.sim.threads import ThreadTable
from ddmd.sim.trace import TraceRecording

__all__ = ["SimVm"]

logger = structlog.get_logger()

_PUSH_HEADER = struct.Struct(">IIBBB")
_CHUNK_HEADER = struct.Struct(">II")

_DDM_SET: Final = int(CommandSet.DDM)
_VM_ID_BIT: Final = 0x80000000
_MAX_PACKET: Final = 1 << 20  # commands a debugger sends are small; reject absurd lengths


# --------------------------------------------------------------------------------------------
# The VM


# A DDM handler's outcome: the reply's chunk bytes, or None for "returned nothing".
_DdmResult = bytes | None


class SimVm:
    """One simulated VM. ``await vm.run()`` serves until EXIT or cancellation."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        seed = config.seed if config.seed is not None else config.pid
        self._rng = random.Random(seed)
        self._port: int | None = None
        self._listening = False
        self._conn: Connection | None = None
        self._exited = False
        self._exit_status: int | None = None
        self._waiting = config.wait_for_debugger
        # ART 9+ loads its debugger agent at the first non-DDM command and keeps it until the
        # process dies: per VM, not per connection (flavours art and modern).
        self._agent_loaded = False
        # ART 5-8 handles a DDM packet only if its one chunk fills it exactly (2.4).
        self._strict_framing = config.flavor == "legacy" and not config.is_dalvik
        self._fail_types = frozenset(
            int.from_bytes(name.encode("ascii"), "big") for name in config.fail_types
        )
        named = config.apnm_delay <= 0
        self._app_name = config.app_name if named else PRE_INITIALIZED
        self._package_name = config.package_name if named else PRE_INITIALIZED
        self._helo_cache: bytes | None = None
        self._feat_chunk = encode_chunk(FeatReply(tuple(config.features)))
        self._push_serial = 0
        self._gc_lock = trio.Lock()
        self._heap: list[HeapPiece] | None = None
        self._log = logger.bind(sim_pid=config.pid)
        # counters
        self._connections_accepted = 0
        self._packets_received = 0
        self._ddm_requests = 0
        self._jdwp_requests = 0
        self._thst_requests = 0
        self._replies_sent = 0
        self._replies_received = 0
        self._duplicate_ids = 0
        self._pushes_sent = 0
        self._gcs = 0
        self._threads = ThreadTable(config, self._rng)
        #: Method tracing, heap dumps, the allocation tracker (`sim.ddms`).
        self.ddms = DdmsFeatures(
            config, self._threads, self._push, self._push_stream, self._log_info
        )
        self._ddm_handlers = self._make_ddm_handlers()
        self._jdwp = PlainJdwp(config, self._threads, trio.current_time)

    # ----------------------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """The listening port once known (after ``run`` reported it)."""
        return self._port

    @property
    def connections_accepted(self) -> int:
        return self._connections_accepted

    @property
    def app_name(self) -> str:
        return self._app_name

    @property
    def exit_status(self) -> int | None:
        """The status EXIT (or VirtualMachine.Exit) halted the VM with; None while it runs."""
        return self._exit_status

    @property
    def device_files(self) -> dict[str, bytes]:
        """Files the VM wrote on its "device" (MPRS/MPRE traces, HPDU dumps): path -> bytes."""
        return self.ddms.device_files

    def recorded_allocations(self) -> tuple[ResolvedAllocation, ...]:
        """What the allocation tracker recorded, newest first, as REAL reports it now."""
        return self.ddms.recorded_allocations()

    def trace_recording(self) -> TraceRecording:
        """What every method trace of this VM holds (calls per method: ``call_counts()``)."""
        return self.ddms.trace_recording()

    def heap_content(self) -> HeapContent:
        """What the heap dump holds (``expected_instances()``: the instances per class)."""
        return self.ddms.heap_content()

    def statistics(self) -> SimStatistics:
        conn = self._conn
        return SimStatistics(
            port=self._port,
            pid=self.config.pid,
            app_name=self._app_name,
            listening=self._listening,
            connected=conn is not None,
            exited=self._exited,
            connections_accepted=self._connections_accepted,
            packets_received=self._packets_received,
            ddm_requests=self._ddm_requests,
            jdwp_requests=self._jdwp_requests,
            thst_requests=self._thst_requests,
            replies_sent=self._replies_sent,
            replies_received=self._replies_received,
            duplicate_outstanding_ids=self._duplicate_ids,
            pushes_sent=self._pushes_sent,
            gcs=self._gcs,
            live_threads=len(self._threads),
            thread_notify=conn is not None and conn.thread_notify,
            exit_status=self._exit_status,
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, serve one connection at a time, until EXIT (or cancellation).

        Reports the real port with ``task_status.started(port)`` once listening.
        """
        self._threads.last_evolve = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                if self.config.apnm_delay > 0:
                    nursery.start_soon(self._apnm_timer)
                if self.config.gc_interval > 0:
                    nursery.start_soon(self._gc_loop)
                if self.config.churn_interval > 0:
                    nursery.start_soon(self._churn_loop)
                try:
                    await self._serve(task_status)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._listening = False
            self._log.info("sim.stopped", exited=self._exited)

    async def force_gc(self) -> None:
        """Run a GC now (pushes HPIF/HPSG/NHSG data as the connection enabled them)."""
        await self._gc()

    async def push_wait(self) -> None:
        """Push WAIT now (the app just called ``Debug.waitForDebugger()``)."""
        self._waiting = True
        await self._push(encode_chunk(WaitForDebugger(0)))

    async def rename(self, app_name: str, package_name: str | None = None) -> None:
        """The process is (re)named: later HELO replies use it, and APNM is pushed now."""
        self._app_name = app_name
        self._package_name = package_name if package_name is not None else app_name
        self._helo_cache = None
        await self._push(self._apnm_chunk())

    async def churn(self) -> None:
        """One thread event now: a thread starts, dies or is renamed (pushed if THEN is on)."""
        await self._churn_once()

    # ----------------------------------------------------------------------------- listening

    async def _open_listener(self) -> trio.SocketListener:
        port = self._port if self._port is not None else self.config.port
        delay = 0.01
        for attempt in range(60):
            try:
                listeners = await trio.open_tcp_listeners(port, host=self.config.host, backlog=4)
            except OSError:
                if self._port is None or attempt == 59:  # first bind: report at once
                    raise
                # our own port, briefly taken (e.g. by an outgoing connection): retry
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            listener = listeners[0]
            for extra in listeners[1:]:
                await extra.aclose()
            return listener
        raise AssertionError("unreachable")  # pragma: no cover

    async def _serve(self, task_status: trio.TaskStatus[int]) -> None:
        reported = False
        while not self._exited:
            listener = await self._open_listener()
            self._listening = True
            if self._port is None:
                self._port = listener.socket.getsockname()[1]
                self._log = self._log.bind(port=self._port)
            if not reported:
                self._log.info("sim.listening", host=self.config.host, app=self._app_name)
                task_status.started(self._port)
                reported = True
            try:
                stream = await listener.accept()
            finally:
                # A VM admits one JDWP connection at a time: stop listening while it is open,
                # so a second connect is refused (what HotSpot does).
                self._listening = False
                await listener.aclose()
            self._connections_accepted += 1
            self._log.info("sim.connection_accepted", n=self._connections_accepted)
            try:
                await self._handle(stream)
            finally:
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
            self._log.info("sim.connection_closed")

    # ----------------------------------------------------------------------------- connection

    async def _handle(self, stream: trio.SocketStream) -> None:
        decoder = PacketDecoder(expect_handshake=True, max_length=_MAX_PACKET)
        conn = Connection(stream, self.config.send_timeout)
        with trio.move_on_after(self.config.handshake_timeout) as scope:
            error = await read_handshake(stream, decoder)
            if error is not None:
                self._log.info("sim.handshake_failed", error=error)
                return
        if scope.cancelled_caught:
            self._log.info("sim.handshake_timed_out")
            return
        try:
            async with conn.lock:
                # Publish the connection while holding its send lock: a push from another
                # task (GC, churn, APNM, a test hook) queues up behind the echo.
                self._conn = conn
                await conn.send_locked(HANDSHAKE)
            with conn.cancel_scope:
                await self._read_loop(conn, decoder)
        except ConnectionBrokenError:
            self._log.info("sim.send_failed")
        finally:
            # Thread notification and heap pushes end with the connection, and (as on every
            # real VM) a debugger's suspensions are released when its connection closes.
            self._conn = None
            self._threads.release_suspensions()

    async def _read_loop(self, conn: Connection, decoder: PacketDecoder) -> None:
        # No read deadline here on purpose: a VM waits for its debugger's next command for
        # as long as the connection stays open. Sends are bounded by ``send_timeout``.
        while True:
            try:
                event = decoder.next_event()
            except ProtocolError as exc:
                self._log.info("sim.protocol_error", error=str(exc))
                return
            if event is NEED_DATA:
                decoder.receive_data(await receive(conn.stream))
                continue
            if isinstance(event, ConnectionClosed):
                return
            if isinstance(event, ReplyPacket):
                # The VM never expects replies (protocol.md 1.6): count it, then drop it.
                self._replies_received += 1
                self._log.info("sim.reply_received", id=event.id)
                continue
            if not isinstance(event, CommandPacket):  # pragma: no cover - no streaming here
                continue
            self._packets_received += 1
            if conn.note_id(event.id):
                self._duplicate_ids += 1
                self._log.info("sim.duplicate_id", id=event.id)
            try:
                if event.command_set == _DDM_SET and event.command == 1:
                    await self._on_ddm(conn, event)
                else:
                    await self._on_jdwp(conn, event)
            except Halt as halt:
                self._halt(halt.status)
                return
            if conn.close_after_reply:
                return

    async def _reply(self, conn: Connection, packet_id: int, data: bytes, error: int = 0) -> None:
        await conn.send(encode(ReplyPacket(packet_id, error, data)))
        self._replies_sent += 1

    def _halt(self, status: int) -> None:
        self._exited = True
        self._exit_status = status
        self._log.info("sim.exited", status=status)

    def _log_info(self, event: str, **kw: object) -> None:
        self._log.info(event, **kw)

    # ----------------------------------------------------------------------------- pushes

    def _next_push_id(self) -> int:
        self._push_serial = (self._push_serial % 0x7FFFFFFF) + 1
        return _VM_ID_BIT | self._push_serial

    def _push_packet(self, chunk: bytes) -> bytes:
        return _PUSH_HEADER.pack(11 + len(chunk), self._next_push_id(), 0, _DDM_SET, 1) + chunk

    async def _push(self, chunk: bytes, conn: Connection | None = None) -> bool:
        """Push one chunk on ``conn`` (default: the current connection). False if none."""
        conn = conn or self._conn
        if conn is None or conn.broken:
            return False
        try:
            await conn.send(self._push_packet(chunk))
        except ConnectionBrokenError:
            return False
        self._pushes_sent += 1
        return True

    async def _push_stream(
        self, chunk_type: int, length: int, pieces: Iterable[bytes], conn: Connection
    ) -> bool:
        """Push one chunk whose ``length`` data bytes come as ``pieces``, never joined: the
        packet and chunk headers first, then each piece, all under the send lock. False if
        it could not be sent; a wrong total (a sim bug) breaks the connection."""
        if conn.broken:
            return False
        head = _PUSH_HEADER.pack(
            11 + _CHUNK_HEADER.size + length, self._next_push_id(), 0, _DDM_SET, 1
        ) + _CHUNK_HEADER.pack(chunk_type, length)
        sent = 0

        def counted() -> Iterable[bytes]:
            nonlocal sent
            for piece in pieces:
                sent += len(piece)
                if sent > length:
                    break
                yield piece

        try:
            await conn.send_pieces(itertools.chain((head,), counted()))
        except ConnectionBrokenError:
            return False
        if sent != length:
            self._log.error("sim.stream_length_mismatch", declared=length, sent=sent)
            conn.broken = True
            conn.cancel_scope.cancel()
            return False
        self._pushes_sent += 1
        return True

    def _apnm_chunk(self) -> bytes:
        if self.config.draft:
            return encode_chunk(AppName(self._app_name))
        return encode_chunk(AppName(self._app_name, self.config.user_id, self._package_name))

    async def _apnm_timer(self) -> None:
        await trio.sleep(self.config.apnm_delay)
        if self._app_name == PRE_INITIALIZED:
            await self.rename(self.config.app_name, self.config.package_name)

    # ----------------------------------------------------------------------------- DDM

    def _make_ddm_handlers(
        self,
    ) -> dict[type[Chunk], Callable[[Connection, Chunk], Awaitable[_DdmResult]]]:
        handlers: dict[type[Chunk], Callable[[Connection, Chunk], Awaitable[_DdmResult]]] = {
            HeloRequest: self._ddm_helo,
            FeatRequest: self._ddm_feat,
            ExitRequest: self._ddm_exit,
        }
        if self.config.flavor != "modern":  # Android 12+ lost the thread and heap handlers
            handlers |= {
                ThreadNotify: self._ddm_then,
                ThreadStatusRequest: self._ddm_thst,
                StackTraceRequest: self._ddm_stkl,
                HeapInfoRequest: self._ddm_hpif,
                HeapSegmentRequest: self._ddm_hpsg,
                NativeHeapSegmentRequest: self._ddm_nhsg,
                GcRequest: self._ddm_hpgc,
            }
        handlers |= self.ddms.handlers()
        if self.config.ack_dbgd:
            handlers[Dbgd] = self._ddm_dbgd
        return handlers

    async def _on_ddm(self, conn: Connection, packet: CommandPacket) -> None:
        self._ddm_requests += 1
        data = packet.data
        result: _DdmResult = None
        chunk_type = -1
        framed = False  # the first chunk's header and data lie within the packet
        if len(data) >= 8:
            chunk_type, length = _CHUNK_HEADER.unpack_from(data)
            framed = 8 + length <= len(data)
            if framed and self._strict_framing and 8 + length != len(data):
                framed = False  # ART 5-8: the chunk must be exactly the rest of the packet
                self._log.debug("sim.ddm_trailing_bytes", extra=len(data) - 8 - length)
            elif framed and chunk_type in self._fail_types:
                # A VM that refuses this feature (``fail_types``).
                result = encode_chunk(Fail(1, refusal(type_name(chunk_type))))
            elif framed:  # only the first chunk counts; trailing bytes are ignored
                try:
                    chunk = decode_chunk(chunk_type, data[8 : 8 + length], Direction.TO_VM)
                except ProtocolError as exc:  # as if the handler threw
                    self._log.debug("sim.ddm_malformed", error=str(exc))
                else:
                    handler = self._ddm_handlers.get(type(chunk))
                    if handler is not None:
                        result = await handler(conn, chunk)
        self._log.debug(
            "sim.ddm_received",
            id=packet.id,
            chunk_type=type_name(chunk_type) if chunk_type >= 0 else "-",
            len=len(data),
            answered=result is not None,
        )
        if result is not None:
            await self._reply(conn, packet.id, result)
            return
        # The handler returned nothing, or there is none, or it threw, or the packet is
        # malformed: protocol.md 2.2 says what each VM writes back then.
        if self.config.flavor == "legacy":
            await self._reply(conn, packet.id, b"")
        elif not self._agent_loaded:
            self._log.debug("sim.ddm_unanswered", id=packet.id)  # ART 9+: nothing at all
        elif not framed:
            # ART 9+ with its agent: a chunk running past the packet is a JDWP error.
            await self._reply(conn, packet.id, b"", ErrorCode.INTERNAL)
        else:
            await self._reply(conn, packet.id, b"")

    async def _ddm_helo(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        if self._waiting:  # Debug.waitingForDebugger(): WAIT goes out while building HELO
            await self._push(encode_chunk(WaitForDebugger(0)), conn)
        if self._helo_cache is None:
            c = self.config
            if c.draft:
                reply = HeloReply(1, c.pid, c.vm_ident, self._app_name)
            else:
                reply = HeloReply(
                    1,
                    c.pid,
                    c.vm_ident,
                    self._app_name,
                    c.user_id,
                    c.abi,
                    c.jvm_flags,
                    c.native_debuggable,
                    self._package_name,
                )
            self._helo_cache = encode_chunk(reply)
        return self._helo_cache

    async def _ddm_feat(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        return self._feat_chunk

    async def _ddm_exit(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, ExitRequest)
        self._log.info("sim.exit_requested", status=chunk.status)
        raise Halt(chunk.status)  # Runtime.halt: no reply, the connection just ends

    async def _ddm_then(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, ThreadNotify)
        if chunk.enable:
            conn.thread_notify = True
            for thread in list(self._threads.by_id.values()):  # the burst comes before the reply
                await self._push(thread.thcr_chunk(), conn)
        else:
            conn.thread_notify = False
        return None

    async def _ddm_dbgd(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        # The draft's DBGD: drop the debugger's state, then acknowledge with a DBGD chunk.
        conn.suspend_count = 0
        self._threads.release_suspensions()
        return encode_chunk(Dbgd())

    async def _ddm_thst(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        self._thst_requests += 1
        self._threads.evolve(trio.current_time())
        return self._threads.status_chunk(
            draft=self.config.draft, vm_suspended=bool(conn.suspend_count)
        )

    async def _ddm_stkl(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, StackTraceRequest)
        trace = self._threads.stack_trace(chunk.thread_id)
        if trace is None:
            return encode_chunk(Fail(1, "Stack trace unavailable"))
        return encode_chunk(trace)

    async def _ddm_hpif(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, HeapInfoRequest)
        when = chunk.when
        if when > 3:
            return encode_chunk(Fail(1, f"Unknown HPIF WHEN value {when}"))
        if when == 1:
            info = self._heap_info(1)
            if self.config.draft:  # the draft put the data in the reply
                return info
            await self._push(info, conn)  # shipped: pushed before the (empty) reply
            return None
        conn.hpif_when = when
        return None

    async def _ddm_hpsg(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, HeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown HPSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.hpsg_when, conn.hpsg_what = chunk.when, chunk.what
        return None

    async def _ddm_nhsg(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        assert isinstance(chunk, NativeHeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown NHSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.nhsg_when = chunk.when
        return None

    async def _ddm_hpgc(self, conn: Connection, chunk: Chunk) -> _DdmResult:
        await self._gc()
        return None

    # ----------------------------------------------------------------------------- heap

    def _heap_info(self, reason: int) -> bytes:
        """HPIF data for the heap as it is now: the very layout a segment dump would send."""
        return heap_info_chunk(self._heap_pieces(), reason)

    def build_heap(self) -> None:
        """Build the heap layout now rather than at the first heap-info request (hosts running
        hundreds of sims in one thread use it so no VM answers late)."""
        self._heap_pieces()

    def _heap_pieces(self) -> list[HeapPiece]:
        if self._heap is None:
            self._heap = build_heap(self._rng, self.config.heap_mb << 20, draft=self.config.draft)
        return self._heap

    async def _gc(self) -> None:
        async with self._gc_lock:  # one dump sequence at a time: HPST ... HPEN never interleave
            self._gcs += 1
            if self._heap is not None:  # built once someone asks for heap info or a dump
                index = self._rng.randrange(len(self._heap))
                mutate_piece(self._rng, self._heap[index])
            self.ddms.after_gc()  # what the app allocated since the last GC
            conn = self._conn
            if conn is None:
                return
            if conn.hpif_when in (2, 3):
                reason = conn.hpif_when
                if reason == 2:
                    conn.hpif_when = 0  # one shot
                await self._push(self._heap_info(reason), conn)
            if conn.hpsg_when:
                for chunk in dump_chunks(self._heap_pieces(), objects=bool(conn.hpsg_what)):
                    await self._push(chunk, conn)
            if conn.nhsg_when:  # ART never walks the native heap: start and end only
                for chunk in native_dump_chunks():
                    await self._push(chunk, conn)

    async def _gc_loop(self) -> None:
        interval = self.config.gc_interval
        await trio.sleep(interval * self._rng.uniform(0.5, 1.0))  # spread many VMs out
        while True:
            await self._gc()
            await trio.sleep(interval * self._rng.uniform(0.8, 1.2))

    # ----------------------------------------------------------------------------- threads

    async def _churn_once(self) -> None:
        await self._push_thread_event(self._threads.churn())

    async def _push_thread_event(self, chunk: bytes) -> None:
        conn = self._conn
        if conn is not None and conn.thread_notify:
            await self._push(chunk, conn)

    async def _churn_loop(self) -> None:
        interval = self.config.churn_interval
        while True:
            await trio.sleep(self._rng.expovariate(1.0 / interval))
            await self._churn_once()

    # ----------------------------------------------------------------------------- plain JDWP

    async def _on_jdwp(self, conn: Connection, packet: CommandPacket) -> None:
        self._jdwp_requests += 1
        if not self._agent_loaded:
            # ART 9+ loads its debugger agent at the first non-DDM packet, and
            # Debug.waitForDebugger() counts a debugger as present from then on.
            self._agent_loaded = True
            self._waiting = False
        self._log.debug(
            "sim.jdwp_received",
            id=packet.id,
            command_set=packet.command_set,
            command=packet.command,
            len=len(packet.data),
        )
        try:
            answer = self._jdwp.respond(conn, packet.command_set, packet.command, packet.data)
        except Halt as halt:
            self._log.info("sim.exit_requested", status=halt.status)
            await self._reply(conn, packet.id, b"")  # VirtualMachine.Exit replies first
            raise
        if answer is None:
            self._log.debug(
                "sim.jdwp_not_implemented", command_set=packet.command_set, command=packet.command
            )
            await self._reply(conn, packet.id, b"", ErrorCode.NOT_IMPLEMENTED)
            return
        error, data = answer
        await self._reply(conn, packet.id, data, error)
