"""DDM chunks inside JDWP command set 0xC7 (199), command 1: one frozen dataclass per chunk.

Layer rule: protocol/ is SANS-IO. stdlib only; mypy --strict. No trio, no structlog, no
sockets, no time, no threads. Unknown chunk types decode to an opaque chunk, never a crash.

Wire facts are in ../shared/docs/protocol.md, sections 2 (framing, FAIL, ZLIB, strings) and 3
(the chunk catalogue). A chunk is ``u4 type, u4 length, data``; the layout of *data* depends on
the type **and** on the direction, so every decoder takes a ``Direction``:

- ``Direction.TO_VM``: chunks in a command ddmd (or a debugger) sends to the VM: requests.
- ``Direction.FROM_VM``: chunks in a reply from the VM, or pushed by it in a command.

Classes by chunk type (TO_VM / FROM_VM; one name = the same class both ways):

    HELO  HeloRequest / HeloReply            FEAT  FeatRequest / FeatReply
    WAIT  WaitForDebugger                    APNM  AppName
    EXIT  ExitRequest                        DBGD  Dbgd
    ZLIB  Zlib (see inflate_chunk)           FAIL  Fail
    THEN  ThreadNotify                       THCR  ThreadCreated
    THDE  ThreadDied                         THNM  ThreadRenamed
    THST  ThreadStatusRequest / ThreadStatus or ThreadStatusDraft (rule T, protocol.md 3.9)
    STKL  StackTraceRequest / StackTrace     HPIF  HeapInfoRequest / HeapInfo
    HPSG  HeapSegmentRequest / HeapSegment   HPSO  HeapSegmentObjects
    NHSG  NativeHeapSegmentRequest / NativeHeapSegment
    HPST  HeapStart     HPEN  HeapEnd        NHST  NativeHeapStart    NHEN  NativeHeapEnd
    HPGC  GcRequest                          HPDU  HeapDumpRequest / HeapDumpResult
    HPDS  HeapDumpStreamRequest / HeapDumpStream
    REAE  AllocTrackingEnable                REAQ  AllocTrackingQuery / AllocTrackingStatus
    REAL  AllocationsRequest / Allocations   NHGT  NativeHeapRequest / NativeHeapSnapshot
    MPRS  MethodTraceStart                   MPRE  MethodTraceEnd / MethodTraceEndResult
    MPSS  MethodTraceStreamStart             MPSE  MethodTraceStreamEnd / MethodTraceData
    SPSS  SamplingStart                      SPSE  SamplingEnd
    MPRQ  ProfilingQuery / ProfilingStatus
    VULW VURT VUOP VUGL  ViewDebug (raw data, both directions)
    TEST DTRC and every type not listed      UnknownChunk (raw data, byte-exact)

A type that only has one layout (WAIT, APNM, THCR, HPSO, HPGC, SPSE, ...) is decoded with that
layout in both directions: the direction only picks between two layouts where two exist.

Decoding rules:

- Malformed data raises ``RemoteProtocolError`` naming the chunk type, the field and the offset.
- Fixed layouts reject trailing bytes. Extensible layouts do not: HELO and APNM parse each
  trailer only while bytes remain and keep whatever follows the last known trailer in
  ``extra``; a trailer cut short (two bytes where the s4 user id would be) is rejected. THST
  and REAL honour their length bytes and skip unknown extra bytes (re-encoded as zeros, or
  canonically for REAL).
- ``str16`` strings decode with ``surrogatepass``, so unpaired surrogates round-trip
  byte-exact. A Python string holding a surrogate *pair* as two separate code points
  encodes fine but decodes back as one code point: build strings from real characters.
- Booleans: ``HeloReply.native_debuggable`` is ``byte == 1`` (protocol.md: 1 = true, anything
  else false); every other flag is ``byte != 0``, as the VMs and ddmlib read them. Flag bytes
  other than 0 and 1 therefore do not re-encode byte-exact; apart from these and the skipped
  THST/REAL bytes, encode(decode(data)) == data for every chunk.
- ZLIB chunks decode to ``Zlib``; nothing is inflated until ``inflate_chunk`` is called with
  a size limit.

The code is split by what it holds; everything above is importable from ``ddmd.protocol.ddm``:

- ``base``: the enums (``ChunkType``, ``Direction``, ``ThreadState``), the checks of locally
  built messages, string encoding, the ``_Reader`` cursor and the ``Chunk`` base classes.
- ``identity``: HELO, FEAT, WAIT, APNM, EXIT, DBGD.
- ``threads``: THEN, THCR, THDE, THNM, THST, STKL and the quick read of a thread-state poll.
- ``heap``: HPIF, HPSG/HPSO/NHSG, HPST/HPEN/NHST/NHEN, HPGC, HPDU, HPDS, NHGT.
- ``allocs``: REAE, REAQ, REAL.
- ``profiling``: MPRS, MPRE, MPSS, MPSE, SPSS, SPSE, MPRQ.
- ``views``: VULW, VURT, VUOP, VUGL.
- ``framing``: FAIL, ZLIB, unknown types, the dispatch tables, chunk decode/encode/split and
  the DDM packet helpers.
"""

from ddmd.protocol.ddm.allocs import (
    AllocationEntry,
    AllocationFrame,
    Allocations,
    AllocationsRequest,
    AllocTrackingEnable,
    AllocTrackingQuery,
    AllocTrackingStatus,
    ResolvedAllocation,
    ResolvedFrame,
)
from ddmd.protocol.ddm.base import (
    CHUNK_HEADER_SIZE,
    VIEW_DEBUG_TYPES,
    Chunk,
    ChunkType,
    Direction,
    ThreadState,
    thread_state,
    thread_state_label,
    type_name,
)
from ddmd.protocol.ddm.framing import (
    Fail,
    UnknownChunk,
    Zlib,
    chunk_type_code,
    chunks_of,
    compress_chunk,
    ddm_command,
    decode_chunk,
    decode_chunks,
    encode_chunk,
    encode_chunks,
    inflate_chunk,
    is_ddm,
    raw_chunk,
    split_chunks,
)
from ddmd.protocol.ddm.heap import (
    GcRequest,
    HeapDumpRequest,
    HeapDumpResult,
    HeapDumpStream,
    HeapDumpStreamRequest,
    HeapEnd,
    HeapInfo,
    HeapInfoEntry,
    HeapInfoRequest,
    HeapSegment,
    HeapSegmentObjects,
    HeapSegmentRequest,
    HeapStart,
    NativeHeapEnd,
    NativeHeapRequest,
    NativeHeapSegment,
    NativeHeapSegmentRequest,
    NativeHeapSnapshot,
    NativeHeapStart,
    SegmentChunk,
)
from ddmd.protocol.ddm.identity import (
    AppName,
    Dbgd,
    ExitRequest,
    FeatReply,
    FeatRequest,
    HeloReply,
    HeloRequest,
    WaitForDebugger,
)
from ddmd.protocol.ddm.profiling import (
    MethodTraceData,
    MethodTraceEnd,
    MethodTraceEndResult,
    MethodTraceStart,
    MethodTraceStreamEnd,
    MethodTraceStreamStart,
    ProfilingQuery,
    ProfilingStatus,
    SamplingEnd,
    SamplingStart,
)
from ddmd.protocol.ddm.threads import (
    DraftThreadInfo,
    StackFrame,
    StackTrace,
    StackTraceRequest,
    ThreadCreated,
    ThreadDied,
    ThreadInfo,
    ThreadNotify,
    ThreadRenamed,
    ThreadStatus,
    ThreadStatusDraft,
    ThreadStatusRequest,
    thread_info,
    thread_status_rows,
)
from ddmd.protocol.ddm.views import (
    ViewDebug,
)

__all__ = [
    "CHUNK_HEADER_SIZE",
    "VIEW_DEBUG_TYPES",
    "AllocTrackingEnable",
    "AllocTrackingQuery",
    "AllocTrackingStatus",
    "AllocationEntry",
    "AllocationFrame",
    "Allocations",
    "AllocationsRequest",
    "AppName",
    "Chunk",
    "ChunkType",
    "Dbgd",
    "Direction",
    "DraftThreadInfo",
    "ExitRequest",
    "Fail",
    "FeatReply",
    "FeatRequest",
    "GcRequest",
    "HeapDumpRequest",
    "HeapDumpResult",
    "HeapDumpStream",
    "HeapDumpStreamRequest",
    "HeapEnd",
    "HeapInfo",
    "HeapInfoEntry",
    "HeapInfoRequest",
    "HeapSegment",
    "HeapSegmentObjects",
    "HeapSegmentRequest",
    "HeapStart",
    "HeloReply",
    "HeloRequest",
    "MethodTraceData",
    "MethodTraceEnd",
    "MethodTraceEndResult",
    "MethodTraceStart",
    "MethodTraceStreamEnd",
    "MethodTraceStreamStart",
    "NativeHeapEnd",
    "NativeHeapRequest",
    "NativeHeapSegment",
    "NativeHeapSegmentRequest",
    "NativeHeapSnapshot",
    "NativeHeapStart",
    "ProfilingQuery",
    "ProfilingStatus",
    "ResolvedAllocation",
    "ResolvedFrame",
    "SamplingEnd",
    "SamplingStart",
    "SegmentChunk",
    "StackFrame",
    "StackTrace",
    "StackTraceRequest",
    "ThreadCreated",
    "ThreadDied",
    "ThreadInfo",
    "ThreadNotify",
    "ThreadRenamed",
    "ThreadState",
    "ThreadStatus",
    "ThreadStatusDraft",
    "ThreadStatusRequest",
    "UnknownChunk",
    "ViewDebug",
    "WaitForDebugger",
    "Zlib",
    "chunk_type_code",
    "chunks_of",
    "compress_chunk",
    "ddm_command",
    "decode_chunk",
    "decode_chunks",
    "encode_chunk",
    "encode_chunks",
    "inflate_chunk",
    "is_ddm",
    "raw_chunk",
    "split_chunks",
    "thread_info",
    "thread_state",
    "thread_state_label",
    "thread_status_rows",
    "type_name",
]
