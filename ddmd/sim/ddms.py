"""What DDMS's profiling buttons ask a simulated VM for: method tracing (MPSS/MPSE,
SPSS/SPSE, MPRS/MPRE, MPRQ), heap dumps (HPDS, HPDU) and the allocation tracker
(REAE/REAQ/REAL), with the data they answer with (protocol.md 3.4, 3.5).

Layer: imports `ddmd.protocol.ddm` and the sim's data modules (`trace`, `hprof`, `allocs`,
`threads`, `config`, `connection`); no socket of its own: pushes go through the two
callables the VM passes in (one for a whole chunk, one for a chunk streamed in pieces).

Each handler follows the Android framework's handler for its type (``DdmHandleProfiling``,
``DdmHandleHeap``) and returns what that handler returns: a chunk to reply with, or None
for "returned nothing", which the VM turns into no reply at all (ART 9+ without its agent),
or an empty reply (Dalvik, ART 5-8, ART with its agent), as protocol.md 2.2 says:

- **MPSS** / **SPSS** (streaming method tracing, sampling): start; returns nothing (no reply
  on ART 9+). A start while a trace runs is ignored, as ART ignores it. SPSS with a sampling
  interval of 0 is refused with FAIL code 1.
- **MPSE** / **SPSE**: stop; the whole trace goes out first as one pushed ``MPSE`` chunk
  (for SPSE too), then the handler returns nothing. With no trace running nothing is pushed
  (ART just logs it). A trace started with MPRS is written to its file instead.
- **MPRS** (u4 buffer, u4 flags, str16 path): start tracing into a file on the device;
  returns nothing, or FAIL code 1 when the path cannot be a file (not absolute, or ending in
  ``/``). **MPRE**: stop; the VM "writes" the trace to ``device_files[path]`` and replies
  ``MPRE`` 0; 1 when no trace was running (a real VM would say 0 and write nothing).
- **MPRQ**: replies ``MPRQ`` u1: 0 off, 1 method tracing, 2 sampling.
- **HPDS**: the whole heap dump goes out as one pushed ``HPDS`` chunk, then the handler
  returns nothing. The dump is :func:`ddmd.sim.hprof.dump_bytes` of
  :meth:`DdmsFeatures.heap_content`, or with ``hprof_bytes`` set a
  :class:`ddmd.sim.hprof.LargeDump` of exactly that size, streamed in pieces (packet and
  chunk headers first, then about 1 MiB at a time) and never held whole.
- **HPDU** (str16 path): writes the (small) dump to ``device_files[path]``; replies ``HPDU``
  0, or 0xFF for a path that cannot be a file.
- **REAE** (u1): allocation tracking on or off (`ddmd.sim.allocs`); returns nothing.
  **REAQ**: replies ``REAQ`` u1, 1 while on. **REAL**: replies ``REAL`` with the recorded
  allocations, newest first (none while off).

The trace is :func:`ddmd.sim.trace.default_recording` for the VM's pid (its call counts are
``DEFAULT_CALL_COUNTS``), the same for method tracing and sampling. Method tracing exists in
every flavour (Android 12+ kept it); the heap dump and allocation handlers do not exist on
``modern`` (Android 12+: protocol.md 3.1 and 3.8), so those requests go unanswered there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from ddmd.protocol.ddm import (
    AllocationsRequest,
    AllocTrackingEnable,
    AllocTrackingQuery,
    AllocTrackingStatus,
    Chunk,
    ChunkType,
    Fail,
    HeapDumpRequest,
    HeapDumpResult,
    HeapDumpStream,
    HeapDumpStreamRequest,
    MethodTraceData,
    MethodTraceEnd,
    MethodTraceEndResult,
    MethodTraceStart,
    MethodTraceStreamEnd,
    MethodTraceStreamStart,
    ProfilingQuery,
    ProfilingStatus,
    ResolvedAllocation,
    SamplingEnd,
    SamplingStart,
    encode_chunk,
)
from ddmd.sim.allocs import AllocationTracker
from ddmd.sim.config import SimConfig
from ddmd.sim.connection import Connection
from ddmd.sim.hprof import HeapContent, LargeDump, dump_bytes, sim_heap_content
from ddmd.sim.threads import ThreadTable
from ddmd.sim.trace import TraceRecording, build_trace, default_recording

__all__ = ["PROFILING_METHOD", "PROFILING_OFF", "PROFILING_SAMPLING", "DdmsFeatures"]

#: MPRQ states.
PROFILING_OFF: Final = 0
PROFILING_METHOD: Final = 1
PROFILING_SAMPLING: Final = 2

#: A handler's outcome: the reply's chunk bytes, or None for "returned nothing".
DdmResult = bytes | None
Handler = Callable[[Connection, Chunk], Awaitable[DdmResult]]
#: Push one whole chunk on a connection; False when it could not be sent.
Push = Callable[[bytes, Connection], Awaitable[bool]]
#: Push one chunk of (type, data length) whose data comes in pieces; False when not sent.
PushStream = Callable[[int, int, Iterable[bytes], Connection], Awaitable[bool]]
Log = Callable[..., None]

_HPDU_FAILED: Final = 0xFF


def _device_path_ok(path: str) -> bool:
    """Whether ``path`` can name a file on the device (absolute, not a directory)."""
    return path.startswith("/") and not path.endswith("/") and "\0" not in path


class DdmsFeatures:
    """Method tracing, heap dumps and allocation tracking of one simulated VM.

    ``device_files`` is the device's file system as far as the VM writes to it (MPRS/MPRE
    traces, HPDU dumps): path -> bytes. A fake adb server can serve (and delete) them.
    """

    def __init__(
        self, config: SimConfig, threads: ThreadTable, push: Push, push_stream: PushStream, log: Log
    ) -> None:
        self.config = config
        self._threads = threads
        self._push = push
        self._push_stream = push_stream
        self._log = log
        self.device_files: dict[str, bytes] = {}
        self._profiling = PROFILING_OFF
        self._trace_path: str | None = None  # MPRS: the file the running trace goes to
        self._recording: TraceRecording | None = None
        self._trace: bytes | None = None
        self._heap_content: HeapContent | None = None
        self._dump: bytes | None = None
        # ``SimConfig`` keeps the size within what a LargeDump can be and a packet can carry.
        self._large = LargeDump(config.hprof_bytes) if config.hprof_bytes else None
        self.allocations = AllocationTracker(config.package_name, dalvik=config.is_dalvik)

    # ----------------------------------------------------------------------------- data

    @property
    def profiling(self) -> int:
        """What MPRQ answers: 0 off, 1 method tracing, 2 sampling."""
        return self._profiling

    def trace_recording(self) -> TraceRecording:
        """What the VM "ran" while tracing: every trace it sends is this recording."""
        if self._recording is None:
            self._recording = default_recording(self.config.pid)
        return self._recording

    def trace_bytes(self) -> bytes:
        """The .trace file the VM sends (MPSE) or writes (MPRE)."""
        if self._trace is None:
            self._trace = build_trace(self.trace_recording())
        return self._trace

    def heap_content(self) -> HeapContent:
        """What the heap dump holds (its ``expected_instances()`` are the class counts)."""
        if self._heap_content is None:
            self._heap_content = sim_heap_content(self.config.package_name)
        return self._heap_content

    def dump_bytes(self) -> bytes:
        """The (small) heap dump: HPDU always, HPDS unless ``hprof_bytes`` is set."""
        if self._dump is None:
            self._dump = dump_bytes(self.heap_content())
        return self._dump

    @property
    def large_dump(self) -> LargeDump | None:
        """The generated dump HPDS streams when ``hprof_bytes`` is set."""
        return self._large

    def recorded_allocations(self) -> tuple[ResolvedAllocation, ...]:
        return self.allocations.recorded()

    def after_gc(self) -> None:
        """The app ran between two GCs: it allocated (recorded while tracking is on)."""
        self.allocations.record_pass(self._threads.by_id.values())

    # ----------------------------------------------------------------------------- handlers

    def handlers(self) -> dict[type[Chunk], Handler]:
        """The handlers of this VM's flavour (protocol.md 3.8)."""
        handlers: dict[type[Chunk], Handler] = {
            MethodTraceStart: self._mprs,
            MethodTraceEnd: self._mpre,
            MethodTraceStreamStart: self._mpss,
            MethodTraceStreamEnd: self._stop_streaming,
            SamplingStart: self._spss,
            SamplingEnd: self._stop_streaming,
            ProfilingQuery: self._mprq,
        }
        if self.config.flavor != "modern":  # Android 12 removed these with the heap handler
            handlers |= {
                HeapDumpStreamRequest: self._hpds,
                HeapDumpRequest: self._hpdu,
                AllocTrackingEnable: self._reae,
                AllocTrackingQuery: self._reaq,
                AllocationsRequest: self._real,
            }
        return handlers

    def _start(self, state: int, path: str | None) -> None:
        if self._profiling != PROFILING_OFF:
            self._log("sim.trace_already_running", state=self._profiling)
            return
        self._profiling = state
        self._trace_path = path
        self._log("sim.trace_started", state=state, path=path)

    async def _stop(self, conn: Connection) -> bool:
        """Stop the running trace and deliver it (push or file); False if none ran."""
        if self._profiling == PROFILING_OFF:
            self._log("sim.trace_not_running")
            return False
        path = self._trace_path
        self._profiling = PROFILING_OFF
        self._trace_path = None
        trace = self.trace_bytes()
        if path is not None:
            self.device_files[path] = trace
        else:
            await self._push(encode_chunk(MethodTraceData(trace)), conn)
        self._log("sim.trace_stopped", path=path, bytes=len(trace))
        return True

    async def _mpss(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, MethodTraceStreamStart)
        self._start(PROFILING_METHOD, None)
        return None

    async def _spss(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, SamplingStart)
        if chunk.interval_us == 0:
            return encode_chunk(Fail(1, "Sampling interval must be at least 1 microsecond"))
        self._start(PROFILING_SAMPLING, None)
        return None

    async def _stop_streaming(self, conn: Connection, chunk: Chunk) -> DdmResult:
        await self._stop(conn)
        return None

    async def _mprs(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, MethodTraceStart)
        if not _device_path_ok(chunk.path):
            return encode_chunk(Fail(1, f"Unable to open trace file '{chunk.path}'"))
        self._start(PROFILING_METHOD, chunk.path)
        return None

    async def _mpre(self, conn: Connection, chunk: Chunk) -> DdmResult:
        stopped = await self._stop(conn)
        return encode_chunk(MethodTraceEndResult(0 if stopped else 1))

    async def _mprq(self, conn: Connection, chunk: Chunk) -> DdmResult:
        return encode_chunk(ProfilingStatus(self._profiling))

    async def _hpds(self, conn: Connection, chunk: Chunk) -> DdmResult:
        large = self._large
        if large is None:
            await self._push(encode_chunk(HeapDumpStream(self.dump_bytes())), conn)
        else:
            await self._push_stream(ChunkType.HPDS, large.size_bytes, large.chunks(), conn)
        self._log("sim.heap_dumped", bytes=large.size_bytes if large else len(self.dump_bytes()))
        return None

    async def _hpdu(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, HeapDumpRequest)
        if not _device_path_ok(chunk.filename):
            return encode_chunk(HeapDumpResult(_HPDU_FAILED))
        self.device_files[chunk.filename] = self.dump_bytes()
        self._log("sim.heap_dumped", path=chunk.filename, bytes=len(self.dump_bytes()))
        return encode_chunk(HeapDumpResult(0))

    async def _reae(self, conn: Connection, chunk: Chunk) -> DdmResult:
        assert isinstance(chunk, AllocTrackingEnable)
        self.allocations.enable(chunk.enable, self._threads.by_id.values())
        return None

    async def _reaq(self, conn: Connection, chunk: Chunk) -> DdmResult:
        return encode_chunk(AllocTrackingStatus(self.allocations.enabled))

    async def _real(self, conn: Connection, chunk: Chunk) -> DdmResult:
        return self.allocations.chunk()
