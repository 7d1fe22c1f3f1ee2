"""Hypothesis strategies for every DDM chunk class of ddmd.protocol.ddm.

``CHUNKS`` maps each concrete chunk class to (strategy, directions it round-trips in). The
directions are written out here from protocol.md 3.1 rather than read from the codec's own
dispatch table, so a wrong table entry shows up as a failing round trip.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ddmd.protocol import ddm
from ddmd.protocol.ddm import ChunkType, Direction

TO_VM = (Direction.TO_VM,)
FROM_VM = (Direction.FROM_VM,)
BOTH = (Direction.TO_VM, Direction.FROM_VM)

u1 = st.integers(0, 0xFF)
u2 = st.integers(0, 0xFFFF)
u4 = st.integers(0, 0xFFFFFFFF)
u8 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
s2 = st.integers(-(1 << 15), (1 << 15) - 1)
s4 = st.integers(-(1 << 31), (1 << 31) - 1)
# st.text() leaves out surrogate code points, so every string round-trips; unpaired
# surrogates are covered byte-wise in the golden tests and by the mutation property.
text = st.text(max_size=12)
blob = st.binary(max_size=48)
small = 2  # list sizes: 0, 1, 2 items exercise every loop and stay cheap at 2,000 examples


def _tuples(elements: st.SearchStrategy, max_size: int = small) -> st.SearchStrategy:
    return st.lists(elements, max_size=max_size).map(tuple)


@st.composite
def helo_replies(draw: st.DrawFn) -> ddm.HeloReply:
    present = draw(st.integers(0, 5))
    trailers = [s4, text, text, st.booleans(), text]
    values = [draw(s) if i < present else None for i, s in enumerate(trailers)]
    extra = draw(blob) if present == 5 else b""
    return ddm.HeloReply(draw(u4), draw(u4), draw(text), draw(text), *values, extra=extra)


@st.composite
def app_names(draw: st.DrawFn) -> ddm.AppName:
    present = draw(st.integers(0, 2))
    user_id = draw(s4) if present >= 1 else None
    package = draw(text) if present >= 2 else None
    extra = draw(blob) if present == 2 else b""
    return ddm.AppName(draw(text), user_id, package, extra)


thread_infos = st.builds(ddm.ThreadInfo, u4, u1, u4, u4, u4, st.booleans())
draft_thread_infos = st.builds(ddm.DraftThreadInfo, u4, u1, st.booleans())
stack_frames = st.builds(ddm.StackFrame, text, text, text, s4)
heap_info_entries = st.builds(ddm.HeapInfoEntry, u4, u8, u1, u4, u4, u4, u4)


def segments(cls: type[ddm.SegmentChunk]) -> st.SearchStrategy:
    return st.builds(cls, u4, u1, u4, u4, u4, blob)


# str16 itself is exercised by every other class; a fixed pool keeps REAL generation cheap.
_names = st.sampled_from(["", "I", "java.lang.String", "Main.java", "\u00e9t\u00e9", "\U0001f600"])
_class_tables = st.lists(_names, min_size=1, max_size=3).map(tuple)
_name_tables = _tuples(_names, max_size=3)
_raw_frames = _tuples(st.tuples(u2, u2, u2, s2))
_raw_entries = _tuples(st.tuples(u4, u2, u2, _raw_frames))


@st.composite
def allocations(draw: st.DrawFn) -> ddm.Allocations:
    # Indices are drawn as any u2 and reduced into their table, so every strategy used here
    # is built once at import (building strategies inside a draw is slow).
    classes = draw(_class_tables)
    methods = draw(_name_tables)
    files = draw(_name_tables)
    entries = []
    for size, thread_id, class_index, raw_frames in draw(_raw_entries):
        frames = ()
        if methods and files:
            frames = tuple(
                ddm.AllocationFrame(c % len(classes), m % len(methods), f % len(files), line)
                for c, m, f, line in raw_frames
            )
        entries.append(ddm.AllocationEntry(size, thread_id, class_index % len(classes), frames))
    return ddm.Allocations(tuple(entries), classes, methods, files)


_KNOWN = frozenset(ChunkType) - {ChunkType.TEST, ChunkType.DTRC}
unknown_types = st.one_of(
    st.sampled_from([ChunkType.TEST, ChunkType.DTRC]),
    u4.filter(lambda t: t not in _KNOWN),
)

CHUNKS: dict[type[ddm.Chunk], tuple[st.SearchStrategy, tuple[Direction, ...]]] = {
    ddm.HeloRequest: (st.builds(ddm.HeloRequest, u4), TO_VM),
    ddm.HeloReply: (helo_replies(), FROM_VM),
    ddm.FeatRequest: (st.just(ddm.FeatRequest()), TO_VM),
    ddm.FeatReply: (st.builds(ddm.FeatReply, _tuples(text)), FROM_VM),
    ddm.WaitForDebugger: (st.builds(ddm.WaitForDebugger, u1), BOTH),
    ddm.AppName: (app_names(), BOTH),
    ddm.ExitRequest: (st.builds(ddm.ExitRequest, u4), BOTH),
    ddm.Dbgd: (st.just(ddm.Dbgd()), BOTH),
    ddm.Fail: (st.builds(ddm.Fail, s4, text), BOTH),
    ddm.Zlib: (
        st.builds(ddm.Zlib, u4.filter(lambda t: t != ChunkType.ZLIB), u4, blob),
        BOTH,
    ),
    ddm.ThreadNotify: (st.builds(ddm.ThreadNotify, st.booleans()), BOTH),
    ddm.ThreadCreated: (st.builds(ddm.ThreadCreated, u4, text), BOTH),
    ddm.ThreadRenamed: (st.builds(ddm.ThreadRenamed, u4, text), BOTH),
    ddm.ThreadDied: (st.builds(ddm.ThreadDied, u4), BOTH),
    ddm.ThreadStatusRequest: (st.builds(ddm.ThreadStatusRequest, st.none() | u4), TO_VM),
    ddm.ThreadStatus: (
        st.builds(
            ddm.ThreadStatus, _tuples(thread_infos), st.integers(4, 255), st.integers(18, 255)
        ),
        FROM_VM,
    ),
    ddm.ThreadStatusDraft: (
        st.builds(ddm.ThreadStatusDraft, _tuples(draft_thread_infos)),
        FROM_VM,
    ),
    ddm.StackTraceRequest: (st.builds(ddm.StackTraceRequest, u4), TO_VM),
    ddm.StackTrace: (st.builds(ddm.StackTrace, u4, _tuples(stack_frames), u4), FROM_VM),
    ddm.HeapInfoRequest: (st.builds(ddm.HeapInfoRequest, u1), TO_VM),
    ddm.HeapInfo: (st.builds(ddm.HeapInfo, _tuples(heap_info_entries)), FROM_VM),
    ddm.HeapSegmentRequest: (st.builds(ddm.HeapSegmentRequest, u1, u1), TO_VM),
    ddm.NativeHeapSegmentRequest: (st.builds(ddm.NativeHeapSegmentRequest, u1, u1), TO_VM),
    ddm.HeapSegment: (segments(ddm.HeapSegment), FROM_VM),
    ddm.HeapSegmentObjects: (segments(ddm.HeapSegmentObjects), BOTH),
    ddm.NativeHeapSegment: (segments(ddm.NativeHeapSegment), FROM_VM),
    ddm.HeapStart: (st.builds(ddm.HeapStart, u4), BOTH),
    ddm.HeapEnd: (st.builds(ddm.HeapEnd, u4), BOTH),
    ddm.NativeHeapStart: (st.builds(ddm.NativeHeapStart, u4), BOTH),
    ddm.NativeHeapEnd: (st.builds(ddm.NativeHeapEnd, u4), BOTH),
    ddm.GcRequest: (st.just(ddm.GcRequest()), BOTH),
    ddm.HeapDumpRequest: (st.builds(ddm.HeapDumpRequest, text), TO_VM),
    ddm.HeapDumpResult: (st.builds(ddm.HeapDumpResult, u1), FROM_VM),
    ddm.HeapDumpStreamRequest: (st.just(ddm.HeapDumpStreamRequest()), TO_VM),
    ddm.HeapDumpStream: (st.builds(ddm.HeapDumpStream, blob), FROM_VM),
    ddm.AllocTrackingEnable: (st.builds(ddm.AllocTrackingEnable, st.booleans()), BOTH),
    ddm.AllocTrackingQuery: (st.just(ddm.AllocTrackingQuery()), TO_VM),
    ddm.AllocTrackingStatus: (st.builds(ddm.AllocTrackingStatus, st.booleans()), FROM_VM),
    ddm.AllocationsRequest: (st.just(ddm.AllocationsRequest()), TO_VM),
    ddm.Allocations: (allocations(), FROM_VM),
    ddm.NativeHeapRequest: (st.just(ddm.NativeHeapRequest()), TO_VM),
    ddm.NativeHeapSnapshot: (st.builds(ddm.NativeHeapSnapshot, blob), FROM_VM),
    ddm.MethodTraceStart: (st.builds(ddm.MethodTraceStart, u4, u4, text), BOTH),
    ddm.MethodTraceEnd: (st.just(ddm.MethodTraceEnd()), TO_VM),
    ddm.MethodTraceEndResult: (st.builds(ddm.MethodTraceEndResult, u1), FROM_VM),
    ddm.MethodTraceStreamStart: (st.builds(ddm.MethodTraceStreamStart, u4, u4), BOTH),
    ddm.MethodTraceStreamEnd: (st.just(ddm.MethodTraceStreamEnd()), TO_VM),
    ddm.MethodTraceData: (st.builds(ddm.MethodTraceData, blob), FROM_VM),
    ddm.SamplingStart: (st.builds(ddm.SamplingStart, u4, u4, u4), BOTH),
    ddm.SamplingEnd: (st.just(ddm.SamplingEnd()), BOTH),
    ddm.ProfilingQuery: (st.just(ddm.ProfilingQuery()), TO_VM),
    ddm.ProfilingStatus: (st.builds(ddm.ProfilingStatus, u1), FROM_VM),
    ddm.ViewDebug: (
        st.builds(ddm.ViewDebug, st.sampled_from(sorted(ddm.VIEW_DEBUG_TYPES)), blob),
        BOTH,
    ),
    ddm.UnknownChunk: (st.builds(ddm.UnknownChunk, unknown_types, blob), BOTH),
}

# Classes whose encoding is not byte-exact for every decodable input: flag bytes other than
# 0/1 re-encode as 0/1, THST and REAL re-encode skipped bytes as zeros or canonically.
LOSSY = frozenset(
    {
        ddm.HeloReply,
        ddm.ThreadNotify,
        ddm.ThreadStatus,
        ddm.ThreadStatusDraft,
        ddm.AllocTrackingEnable,
        ddm.AllocTrackingStatus,
        ddm.Allocations,
    }
)


# Layouts with nested lists or optional trailers: slow to generate, so the framing
# properties (which do not care about field layouts) leave them out.
STRUCTURED = (
    ddm.HeloReply,
    ddm.AppName,
    ddm.FeatReply,
    ddm.ThreadStatus,
    ddm.ThreadStatusDraft,
    ddm.StackTrace,
    ddm.HeapInfo,
    ddm.Allocations,
)


def chunks_for(direction: Direction, *, light: bool = False) -> st.SearchStrategy:
    """Any chunk that round-trips in ``direction`` (``light``: leave out STRUCTURED)."""
    return st.one_of(
        [
            strategy
            for cls, (strategy, dirs) in CHUNKS.items()
            if direction in dirs and not (light and cls in STRUCTURED)
        ]
    )


light_chunks = {d: chunks_for(d, light=True) for d in Direction}

round_trip_cases = st.one_of(
    [strategy.map(lambda chunk, dirs=dirs: (chunk, dirs)) for strategy, dirs in CHUNKS.values()]
)


directions = st.sampled_from(list(Direction))
