"""The segments of one heap dump (HPST ... HPEN, or NHST ... NHEN) assembled into a
:class:`HeapImage`; problems in the sequence are reported, never raised.

Layer: ``protocol`` (sans-IO, standard library only).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.protocol.heap.segments import (
    HeapSummary,
    Segment,
    SegmentKind,
    _summarise,
    decode_runs,
)

__all__ = ["HeapAssembler", "HeapImage", "HeapProblem", "ProblemCode"]


class ProblemCode(Enum):
    """What went wrong in a dump sequence. Reported, never raised."""

    RESTARTED = "restarted"  # a second HPST/NHST before the HPEN/NHEN of the first
    MISSING_START = "missing_start"  # a segment with no HPST: image started implicitly
    END_WITHOUT_START = "end_without_start"  # HPEN/NHEN with no open image
    SEGMENT_REJECTED = "segment_rejected"  # rule 4.3 violation; the segment was dropped
    UNIT_SIZE_CHANGED = "unit_size_changed"  # differs from the image's; dropped
    DATA_KIND_CHANGED = "data_kind_changed"  # HPSG and HPSO mixed in one image; dropped
    NOT_ENDED = "not_ended"  # abandon(): the HPEN/NHEN never came


@dataclass(frozen=True, slots=True)
class HeapProblem:
    code: ProblemCode
    heap_id: int
    native: bool
    message: str


@dataclass(frozen=True, slots=True)
class HeapImage:
    """One heap dump: the segments between HPST and HPEN (or NHST and NHEN).

    ``complete`` is True only when both the start and the end chunk were seen; problems
    that did not cut the series short (a rejected segment) leave it True but are listed in
    ``problems``. ``data_kind`` is the chunk type of the segments (None without any).
    """

    heap_id: int
    native: bool
    unit_size: int | None
    data_kind: SegmentKind | None
    segments: tuple[Segment, ...]
    complete: bool
    problems: tuple[HeapProblem, ...]

    def summary(self) -> HeapSummary:
        return _summarise(
            self.heap_id,
            self.unit_size,
            self.segments,
            objects=self.data_kind is SegmentKind.HPSO,
        )

    def spans(self) -> tuple[tuple[int, int], ...]:
        """``(start, end)`` address ranges after joining consecutive contiguous segments."""
        out: list[tuple[int, int]] = []
        for seg in self.segments:
            if seg.units == 0:
                continue
            if out and out[-1][1] == seg.address:
                out[-1] = (out[-1][0], seg.end)
            else:
                out.append((seg.address, seg.end))
        return tuple(out)


class _Builder:
    """Mutable state of one image being assembled."""

    __slots__ = ("data_kind", "heap_id", "native", "problems", "segments", "started", "unit_size")

    def __init__(self, heap_id: int, native: bool, *, started: bool) -> None:
        self.heap_id = heap_id
        self.native = native
        self.started = started
        self.unit_size: int | None = None
        self.data_kind: SegmentKind | None = None
        self.segments: list[Segment] = []
        self.problems: list[HeapProblem] = []

    def problem(self, code: ProblemCode, message: str) -> HeapProblem:
        item = HeapProblem(code, self.heap_id, self.native, message)
        self.problems.append(item)
        return item

    def finish(self, *, ended: bool) -> HeapImage:
        return HeapImage(
            heap_id=self.heap_id,
            native=self.native,
            unit_size=self.unit_size,
            data_kind=self.data_kind,
            segments=tuple(self.segments),
            complete=ended and self.started,
            problems=tuple(self.problems),
        )


def _names(native: bool) -> tuple[str, str]:
    return ("NHST", "NHEN") if native else ("HPST", "HPEN")


class HeapAssembler:
    """Sans-IO assembly of heap images from the dump sequence, one per (heap id, native).

    Feed it the chunks in arrival order: :meth:`start` for HPST/NHST, :meth:`segment` for
    HPSG/HPSO/NHSG, :meth:`end` for HPEN/NHEN. Nothing raises for a broken sequence: each
    problem is recorded on the image it concerns and also returned by the call that found
    it, so the caller can log it at once.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[int, bool], _Builder] = {}

    @property
    def open_heaps(self) -> tuple[tuple[int, bool], ...]:
        """``(heap id, native)`` of every image started and not yet ended."""
        return tuple(self._open)

    def start(self, heap_id: int, *, native: bool = False) -> HeapImage | None:
        """HPST / NHST. Returns the previous image of that heap if it was never ended
        (finished as incomplete, with a RESTARTED problem), else None."""
        key = (heap_id, native)
        previous = self._open.pop(key, None)
        self._open[key] = _Builder(heap_id, native, started=True)
        if previous is None:
            return None
        first, last = _names(native)
        previous.problem(
            ProblemCode.RESTARTED,
            f"{first} for heap {heap_id} before {last}: previous dump cut short after "
            f"{len(previous.segments)} segment(s)",
        )
        return previous.finish(ended=False)

    def segment(
        self,
        kind: SegmentKind,
        heap_id: int,
        unit_size: int,
        start: int,
        offset: int,
        units: int,
        usage: bytes,
    ) -> tuple[HeapProblem, ...]:
        """HPSG / HPSO / NHSG. Returns the problems this segment caused (usually none)."""
        try:
            kind = SegmentKind(kind)
        except ValueError:
            raise LocalProtocolError(f"0x{kind:08x} is not a heap segment chunk type") from None
        native = kind is SegmentKind.NHSG
        key = (heap_id, native)
        found: list[HeapProblem] = []
        builder = self._open.get(key)
        if builder is None:
            builder = self._open[key] = _Builder(heap_id, native, started=False)
            found.append(
                builder.problem(
                    ProblemCode.MISSING_START,
                    f"{kind.name} for heap {heap_id} without {_names(native)[0]}: "
                    "image started implicitly",
                )
            )
        try:
            seg = decode_runs(heap_id, unit_size, start, offset, units, usage)
        except RemoteProtocolError as exc:
            found.append(
                builder.problem(
                    ProblemCode.SEGMENT_REJECTED,
                    f"{kind.name} at 0x{start:08x} dropped: {exc}",
                )
            )
            return tuple(found)
        if builder.unit_size is not None and unit_size != builder.unit_size:
            found.append(
                builder.problem(
                    ProblemCode.UNIT_SIZE_CHANGED,
                    f"{kind.name} at 0x{start:08x} dropped: unit size {unit_size} "
                    f"!= {builder.unit_size} of the earlier segments",
                )
            )
            return tuple(found)
        if builder.data_kind is not None and kind is not builder.data_kind:
            found.append(
                builder.problem(
                    ProblemCode.DATA_KIND_CHANGED,
                    f"{kind.name} at 0x{start:08x} dropped: this dump carries "
                    f"{builder.data_kind.name} data",
                )
            )
            return tuple(found)
        builder.unit_size = unit_size
        builder.data_kind = kind
        builder.segments.append(seg)
        return tuple(found)

    def end(self, heap_id: int, *, native: bool = False) -> HeapImage:
        """HPEN / NHEN: the finished image (an empty, incomplete one without a start)."""
        builder = self._open.pop((heap_id, native), None)
        if builder is None:
            builder = _Builder(heap_id, native, started=False)
            first, last = _names(native)
            builder.problem(
                ProblemCode.END_WITHOUT_START, f"{last} for heap {heap_id} without {first}"
            )
        return builder.finish(ended=True)

    def abandon(self) -> tuple[HeapImage, ...]:
        """Finish every open image as incomplete (the end chunk never came), in start
        order, and forget them. Call it when the VM goes away or a dump times out."""
        builders, self._open = self._open, {}
        out: list[HeapImage] = []
        for builder in builders.values():
            builder.problem(
                ProblemCode.NOT_ENDED,
                f"{_names(builder.native)[1]} for heap {builder.heap_id} never came "
                f"({len(builder.segments)} segment(s) kept)",
            )
            out.append(builder.finish(ended=False))
        return tuple(out)
