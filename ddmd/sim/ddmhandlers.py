"""`DdmHandlers`: how a simulated VM answers DDM requests (199/1): which handlers its flavour
has, the built-in ones (HELO FEAT EXIT THEN DBGD THST STKL HPIF HPSG NHSG HPGC; the profiling
ones come from `sim.ddms`), and what goes back when nothing answers (protocol.md 2.2). It also
keeps what the VM says about itself in HELO and APNM (the names, Debug.waitForDebugger()).

Layer: imports ``ddmd.protocol.ddm`` and ``ddmd.sim`` (`config`, `connection`, `link`, `gc`,
`threads`, `ddms`, `jdwp`) and trio (the clock); used by `sim.vm`.
"""

from __future__ import annotations

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
    StackTraceRequest,
    ThreadNotify,
    ThreadStatusRequest,
    WaitForDebugger,
    decode_chunk,
    encode_chunk,
    type_name,
)
from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import CommandPacket, ErrorCode
from ddmd.sim.config import PRE_INITIALIZED, SimConfig, refusal
from ddmd.sim.connection import Connection
from ddmd.sim.ddms import DdmResult, DdmsFeatures, Handler
from ddmd.sim.gc import SimHeap
from ddmd.sim.jdwp import Halt
from ddmd.sim.link import CHUNK_HEADER, SimLink
from ddmd.sim.threads import ThreadTable

__all__ = ["DdmHandlers"]


class DdmHandlers:
    """The DDM side of one `SimVm`. Replies and pushes go out through ``link``."""

    def __init__(
        self,
        config: SimConfig,
        link: SimLink,
        threads: ThreadTable,
        heap: SimHeap,
        ddms: DdmsFeatures,
    ) -> None:
        self._config = config
        self._link = link
        self._threads = threads
        self._heap = heap
        named = config.apnm_delay <= 0
        self.app_name = config.app_name if named else PRE_INITIALIZED
        self._package_name = config.package_name if named else PRE_INITIALIZED
        self._waiting = config.wait_for_debugger
        # ART 9+ loads its debugger agent at the first non-DDM command and keeps it until the
        # process dies: per VM, not per connection (flavours art and modern).
        self._agent_loaded = False
        # ART 5-8 handles a DDM packet only if its one chunk fills it exactly (2.4).
        self._strict_framing = config.flavor == "legacy" and not config.is_dalvik
        self._fail_types = frozenset(
            int.from_bytes(name.encode("ascii"), "big") for name in config.fail_types
        )
        self._helo_cache: bytes | None = None
        self._feat_chunk = encode_chunk(FeatReply(tuple(config.features)))
        self._handlers = self._make_handlers(ddms)
        # counters
        self.ddm_requests = 0
        self.thst_requests = 0

    # ----------------------------------------------------------------------------- the VM

    def note_jdwp_command(self) -> None:
        """A non-DDM command came in. ART 9+ loads its debugger agent at the first one, and
        Debug.waitForDebugger() counts a debugger as present from then on."""
        if not self._agent_loaded:
            self._agent_loaded = True
            self._waiting = False

    async def push_wait(self) -> None:
        """The app called ``Debug.waitForDebugger()``: push WAIT now (and in HELO replies)."""
        self._waiting = True
        await self._link.push(encode_chunk(WaitForDebugger(0)))

    async def rename(self, app_name: str, package_name: str | None) -> None:
        """The process is (re)named: later HELO replies use it, and APNM is pushed now."""
        self.app_name = app_name
        self._package_name = package_name if package_name is not None else app_name
        self._helo_cache = None
        await self._link.push(self._apnm_chunk())

    def _apnm_chunk(self) -> bytes:
        if self._config.draft:
            return encode_chunk(AppName(self.app_name))
        return encode_chunk(AppName(self.app_name, self._config.user_id, self._package_name))

    # ----------------------------------------------------------------------------- dispatch

    def _make_handlers(self, ddms: DdmsFeatures) -> dict[type[Chunk], Handler]:
        handlers: dict[type[Chunk], Handler] = {
            HeloRequest: self._helo,
            FeatRequest: self._feat,
            ExitRequest: self._exit,
        }
        if self._config.flavor != "modern":  # Android 12+ lost the thread and heap handlers
            handlers |= {
                ThreadNotify: self._then,
                ThreadStatusRequest: self._thst,
                StackTraceRequest: self._stkl,
                HeapInfoRequest: self._hpif,
                HeapSegmentRequest: self._hpsg,
                NativeHeapSegmentRequest: self._nhsg,
                GcRequest: self._hpgc,
            }
        handlers |= ddms.handlers()
        if self._config.ack_dbgd:
            handlers[Dbgd] = self._dbgd
        return handlers

    async def on_ddm(self, conn: Connection, packet: CommandPacket) -> None:
        """Answer one DDM packet (or not: see protocol.md 2.2)."""
        self.ddm_requests += 1
        log = self._link.log
        data = packet.data
        result: DdmResult = None
        chunk_type = -1
        framed = False  # the first chunk's header and data lie within the packet
        if len(data) >= 8:
            chunk_type, length = CHUNK_HEADER.unpack_from(data)
            framed = 8 + length <= len(data)
            if framed and self._strict_framing and 8 + length != len(data):
                framed = False  # ART 5-8: the chunk must be exactly the rest of the packet
                log.debug("sim.ddm_trailing_bytes", extra=len(data) - 8 - length)
            elif framed and chunk_type in self._fail_types:
                # A VM that refuses this feature (``fail_types``).
                result = encode_chunk(Fail(1, refusal(type_name(chunk_type))))
            elif framed:  # only the first chunk counts; trailing bytes are ignored
                try:
                    chunk = decode_chunk(chunk_type, data[8 : 8 + length], Direction.TO_VM)
                except ProtocolError as exc:  # as if the handler threw
                    log.debug("sim.ddm_malformed", error=str(exc))
                else:
                    handler = self._handlers.get(type(chunk))
                    if handler is not None:
                        result = await handler(conn, chunk)
        log.debug(
            "sim.ddm_received",
            id=packet.id,
            chunk_type=type_name(chunk_type) if chunk_type >= 0 else "-",
            len=len(data),
            answered=result is not None,
        )
        reply = self._link.reply
        if result is not None:
            await reply(conn, packet.id, result)
            return
        # The handler returned nothing, or there is none, or it threw, or the packet is
        # malformed: protocol.md 2.2 says what each VM writes back then.
        if self._config.flavor == "legacy":
            await reply(conn, packet.id, b"")
        elif not self._agent_loaded:
            log.debug("sim.ddm_unanswered", id=packet.id)  # ART 9+: nothing at all
        elif not framed:
            # ART 9+ with its agent: a chunk running past the packet is a JDWP error.
            await reply(conn, packet.id, b"", ErrorCode.INTERNAL)
        else:
            await reply(conn, packet.id, b"")

    # ----------------------------------------------------------------------------- handlers

    async def _helo(self, conn: Connection, chunk: Chunk) -> DdmResult:
        if self._waiting:  # Debug.waitingForDebugger(): WAIT goes out while building HELO
            await self._link.push(encode_chunk(WaitForDebugger(0)), conn)
        if self._helo_cache is None:
            c = self._config
            if c.draft:
                reply = HeloReply(1, c.pid, c.vm_ident, self.app_name)
            else:
                reply = HeloReply(
                    1,
                    c.pid,
                    c.vm_ident,
                    self.app_name,
                    c.user_id,
                    c.abi,
                    c.jvm_flags,
                    c.native_debuggable,
                    self._package_name,
                )
            self._helo_cache = encode_chunk(reply)
        return self._helo_cache

    async def _feat(self, conn: Connection, chunk: Chunk) -> DdmResult:
        return self._feat_chunk

    async def _exit(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, ExitRequest)
        self._link.log.info("sim.exit_requested", status=chunk.status)
        raise Halt(chunk.status)  # Runtime.halt: no reply, the connection just ends

    async def _then(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, ThreadNotify)
        if chunk.enable:
            conn.thread_notify = True
            for thread in list(self._threads.by_id.values()):  # the burst comes before the reply
                await self._link.push(thread.thcr_chunk(), conn)
        else:
            conn.thread_notify = False
        return None

    async def _dbgd(self, conn: Connection, chunk: Chunk) -> DdmResult:
        # The draft's DBGD: drop the debugger's state, then acknowledge with a DBGD chunk.
        conn.suspend_count = 0
        self._threads.release_suspensions()
        return encode_chunk(Dbgd())

    async def _thst(self, conn: Connection, chunk: Chunk) -> DdmResult:
        self.thst_requests += 1
        self._threads.evolve(trio.current_time())
        return self._threads.status_chunk(
            draft=self._config.draft, vm_suspended=bool(conn.suspend_count)
        )

    async def _stkl(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, StackTraceRequest)
        trace = self._threads.stack_trace(chunk.thread_id)
        if trace is None:
            return encode_chunk(Fail(1, "Stack trace unavailable"))
        return encode_chunk(trace)

    async def _hpif(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, HeapInfoRequest)
        when = chunk.when
        if when > 3:
            return encode_chunk(Fail(1, f"Unknown HPIF WHEN value {when}"))
        if when == 1:
            info = self._heap.info(1)
            if self._config.draft:  # the draft put the data in the reply
                return info
            await self._link.push(info, conn)  # shipped: pushed before the (empty) reply
            return None
        conn.hpif_when = when
        return None

    async def _hpsg(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, HeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown HPSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.hpsg_when, conn.hpsg_what = chunk.when, chunk.what
        return None

    async def _nhsg(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, NativeHeapSegmentRequest)
        if chunk.when > 1 or chunk.what > 1:
            return encode_chunk(Fail(1, f"Unknown NHSG WHEN {chunk.when} WHAT {chunk.what}"))
        conn.nhsg_when = chunk.when
        return None

    async def _hpgc(self, conn: Connection, chunk: Chunk) -> DdmResult:
        await self._heap.gc()
        return None
