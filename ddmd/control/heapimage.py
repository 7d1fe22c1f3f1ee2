"""Heap bitmaps: one decoded `HeapImage` drawn as a PNG with Pillow (the DDMS heap view).

Layer: imports ``protocol.heap`` and Pillow; no trio, no I/O, no logging. The control API
(`control.app`) calls :func:`render_png` in a worker thread and serves the bytes.

Layout. The heap's address span (lowest segment address to the highest segment end) is laid out
row by row, left to right, ``width`` pixels a row. Each pixel stands for ``units_per_pixel``
allocation units (``bytes_per_pixel = units_per_pixel * unit_size``), the smallest whole number
that keeps the picture within ``max_height`` rows. A small heap that fits with room to spare
is drawn with square cells of 2, 4 or 8 pixels per unit instead, so it stays visible.

Colour. A pixel shows the unit at its middle (point sampling): the kind of that unit's run,
lighter for the softer solidities, one colour for free units, a dark "gap" colour for
addresses between segments (not part of any segment) and transparency after the end of the
span (the rest of the last row). Sampling costs one lookup per pixel whatever the heap size,
and the colour areas are proportional to the bytes of each class on average; free gaps
smaller than a pixel can be missed by the picture, the summary figures beside it are exact.

Speed. A 64 MiB heap is about two million pairs (8 Mi units). Nothing here loops over pairs
or pixels in Python bytecode. When sample points are dense, each segment is expanded to one
palette byte per unit in C (``bytes.join`` of each pair's byte repeated ``n + 1`` times) and
sampled with one extended slice; when they are sparse (big heaps), each sample finds its pair
with ``bisect`` over the segment's run ends (``itertools.accumulate``). A segment with a huge
unit count for its pairs (a hostile VM) is always bisected, so memory stays bounded by the
data received. About 0.2 s for 64 MiB in two million runs, plus ~0.1 s of PNG encoding.
"""

from __future__ import annotations

import hashlib
import io
from bisect import bisect_right
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, repeat
from operator import add, mul
from typing import Any, Final

from PIL import Image

from ddmd.protocol.heap import (
    KIND_MASK,
    KIND_SHIFT,
    SOLIDITY_MASK,
    HeapImage,
    Kind,
    Segment,
    Solidity,
)

__all__ = [
    "BEYOND",
    "DEFAULT_MAX_HEIGHT",
    "DEFAULT_WIDTH",
    "EXPAND_LIMIT",
    "GAP",
    "MAX_HEIGHT",
    "MAX_WIDTH",
    "MIN_WIDTH",
    "HeapLayout",
    "RenderedHeap",
    "fingerprint",
    "layout",
    "legend",
    "palette_rgb",
    "render_pixels",
    "render_png",
    "state_colour",
]

DEFAULT_WIDTH: Final = 512
DEFAULT_MAX_HEIGHT: Final = 512
MIN_WIDTH: Final = 16
MAX_WIDTH: Final = 2048
MAX_HEIGHT: Final = 4096
#: Cell sizes (pixels per unit, square) tried for small heaps, largest first.
_CELLS: Final = (8, 4, 2)

#: Palette indices 0-63 are the state bytes without P and U (kind << 3 | solidity).
GAP: Final = 64  # an address between segments
BEYOND: Final = 65  # after the end of the span (the rest of the last row): transparent

RGB = tuple[int, int, int]

# Colour-blind friendly hues (Okabe-Ito, plus two from Paul Tol's set) for the kinds.
_KIND_RGB: Final[dict[Kind, RGB]] = {
    Kind.OBJECT: (0x00, 0x72, 0xB2),  # blue
    Kind.CLASS_OBJECT: (0xE6, 0x9F, 0x00),  # orange
    Kind.ARRAY_1: (0x00, 0x9E, 0x73),  # green
    Kind.ARRAY_2: (0xCC, 0x79, 0xA7),  # pink
    Kind.ARRAY_4: (0x56, 0xB4, 0xE9),  # sky blue
    Kind.ARRAY_8: (0xD5, 0x5E, 0x00),  # vermilion
    Kind.UNKNOWN: (0x99, 0x99, 0x33),  # olive
    Kind.NON_OBJECT: (0x88, 0x22, 0x55),  # wine
}
_KIND_LABEL: Final[dict[Kind, str]] = {
    Kind.OBJECT: "object",
    Kind.CLASS_OBJECT: "class object",
    Kind.ARRAY_1: "byte[] / boolean[]",
    Kind.ARRAY_2: "char[] / short[]",
    Kind.ARRAY_4: "int[] / float[] / Object[]",
    Kind.ARRAY_8: "long[] / double[]",
    Kind.UNKNOWN: "unknown",
    Kind.NON_OBJECT: "not a Java object",
}
FREE_RGB: Final[RGB] = (0xE4, 0xE4, 0xE4)
GAP_RGB: Final[RGB] = (0x33, 0x33, 0x33)
BEYOND_RGB: Final[RGB] = (0xFF, 0xFF, 0xFF)  # never seen: transparent in the PNG

# Solidity -> (mix colour, fraction): softer reachability is paler, finalizable/sweep darker.
_SOLIDITY_MIX: Final[dict[int, tuple[RGB, float]]] = {
    Solidity.HARD: ((255, 255, 255), 0.0),
    Solidity.SOFT: ((255, 255, 255), 0.30),
    Solidity.WEAK: ((255, 255, 255), 0.45),
    Solidity.PHANTOM: ((255, 255, 255), 0.60),
    Solidity.FINALIZABLE: ((0, 0, 0), 0.35),
    Solidity.SWEEP: ((0, 0, 0), 0.60),
    7: ((0, 0, 0), 0.0),  # undefined value: the plain kind colour
}
_SOLIDITY_LABEL: Final[dict[int, str]] = {
    Solidity.HARD: "hard (reachable)",
    Solidity.SOFT: "soft",
    Solidity.WEAK: "weak",
    Solidity.PHANTOM: "phantom",
    Solidity.FINALIZABLE: "pending finalization",
    Solidity.SWEEP: "marked, about to be swept",
}


def _mix(base: RGB, other: RGB, amount: float) -> RGB:
    r, g, b = (round(x + (y - x) * amount) for x, y in zip(base, other, strict=True))
    return (r, g, b)


def state_colour(state: int) -> RGB:
    """The colour of a state byte (P and U bits ignored)."""
    solidity = state & SOLIDITY_MASK
    if solidity == Solidity.FREE:
        return FREE_RGB
    mix, amount = _SOLIDITY_MIX[solidity]
    return _mix(_KIND_RGB[Kind((state & KIND_MASK) >> KIND_SHIFT)], mix, amount)


def palette_rgb() -> tuple[RGB, ...]:
    """RGB of every palette index: 0-63 the states, then GAP and BEYOND."""
    return (*(state_colour(s) for s in range(64)), GAP_RGB, BEYOND_RGB)


_PALETTE_BYTES: Final = bytes(c for rgb in palette_rgb() for c in rgb)
#: State byte -> palette index (drops P 0x80 and U 0x40), as a table and as 1-byte strings.
_STATE_INDEX: Final = bytes(s & 0x3F for s in range(256))
_INDEX_BYTE: Final = tuple(bytes((s & 0x3F,)) for s in range(256))
_GAP_BYTE: Final = bytes((GAP,))
_BEYOND_BYTE: Final = bytes((BEYOND,))
#: Segments of at most this many units are expanded to one byte per unit before sampling
#: when samples are dense (at most _EXPAND_MAX_STEP units apart); otherwise, and for bigger
#: segments (only a hostile VM sends 256 units in every pair), samples find their pair by
#: bisection. Both give the same pixels; the choice is only about speed and memory.
EXPAND_LIMIT: Final = 1 << 24
_EXPAND_MAX_STEP: Final = 16


def _hex(rgb: RGB) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def legend() -> dict[str, Any]:
    """The colours as JSON for a page's legend (served at ``/api/v1/heap/legend``)."""
    entries: list[dict[str, Any]] = [
        {
            "key": "free",
            "group": "space",
            "label": "free",
            "colour": _hex(FREE_RGB),
        },
        {
            "key": "gap",
            "group": "space",
            "label": "gap between segments",
            "colour": _hex(GAP_RGB),
        },
    ]
    entries.extend(
        {
            "key": kind.name.lower(),
            "group": "kind",
            "label": _KIND_LABEL[kind],
            "colour": _hex(state_colour((kind << KIND_SHIFT) | Solidity.HARD)),
        }
        for kind in Kind
    )
    entries.extend(
        {
            "key": solidity.name.lower(),
            "group": "solidity",
            "label": _SOLIDITY_LABEL[solidity],
            "colour": _hex(state_colour((Kind.OBJECT << KIND_SHIFT) | solidity)),
        }
        for solidity in Solidity
        if solidity != Solidity.FREE
    )
    return {
        "entries": entries,
        "states": {str(s): _hex(state_colour(s)) for s in range(64)},
        "gap": _hex(GAP_RGB),
        "beyond": None,  # transparent
        "sampling": "each pixel shows the allocation unit at its middle",
        "solidity_note": (
            "kind colours are for hard (reachable) runs; softer reachability is paler, pending "
            "finalization and sweep darker (shown here for plain objects)"
        ),
    }


# --------------------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class HeapLayout:
    """Where each unit of one heap image goes. Sizes are in pixels, spans in bytes."""

    width: int  # of the picture, pixels
    height: int
    cell: int  # pixels per unit side (>1 only with units_per_pixel == 1)
    columns: int  # sample points a row: width // cell
    rows: int  # rows of sample points: height // cell
    units_per_pixel: int  # units one sample point stands for
    unit_size: int  # bytes
    low: int  # first address
    high: int  # address past the last unit
    span_units: int

    @property
    def bytes_per_pixel(self) -> int:
        """Bytes one sample point (one pixel, or one cell) stands for."""
        return self.units_per_pixel * self.unit_size

    @property
    def bytes_per_row(self) -> int:
        return self.columns * self.bytes_per_pixel

    def to_json(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "height": self.height,
            "cell": self.cell,
            "columns": self.columns,
            "rows": self.rows,
            "units_per_pixel": self.units_per_pixel,
            "unit_size": self.unit_size,
            "bytes_per_pixel": self.bytes_per_pixel,
            "bytes_per_row": self.bytes_per_row,
            "low": self.low,
            "high": self.high,
        }


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_size(width: int, max_height: int) -> None:
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ValueError(f"heap picture width {width} is not in {MIN_WIDTH}..{MAX_WIDTH}")
    if not 1 <= max_height <= MAX_HEIGHT:
        raise ValueError(f"heap picture height {max_height} is not in 1..{MAX_HEIGHT}")


def layout(
    image: HeapImage, *, width: int = DEFAULT_WIDTH, max_height: int = DEFAULT_MAX_HEIGHT
) -> HeapLayout | None:
    """The layout of ``image`` in a picture ``width`` wide and at most ``max_height`` high;
    None when the image has no units to draw. Raises ValueError for a size out of range."""
    _check_size(width, max_height)
    segments = [s for s in image.segments if s.units]
    if not segments:
        return None
    unit = image.unit_size or segments[0].unit_size
    low = min(s.address for s in segments)
    high = max(s.end for s in segments)
    span_units = _ceil_div(high - low, unit)
    capacity = width * max_height
    cell = 1
    if span_units <= capacity:
        per = 1
        for size in _CELLS:
            if width % size == 0 and _ceil_div(span_units, width // size) * size <= max_height:
                cell = size
                break
    else:
        per = _ceil_div(span_units, capacity)
    columns = width // cell
    rows = max(1, _ceil_div(_ceil_div(span_units, per), columns))
    return HeapLayout(
        width=width,
        height=rows * cell,
        cell=cell,
        columns=columns,
        rows=rows,
        units_per_pixel=per,
        unit_size=unit,
        low=low,
        high=high,
        span_units=span_units,
    )


def render_pixels(
    image: HeapImage, where: HeapLayout, *, expand_limit: int = EXPAND_LIMIT
) -> bytes:
    """One palette index per sample point, row by row (``columns * rows`` bytes).

    Sample point ``p`` shows the unit ``p * units_per_pixel + units_per_pixel // 2`` (from
    ``low``). Segments are taken in address order; where two overlap, the earlier one wins.
    """
    per = where.units_per_pixel
    half = per // 2
    count = where.columns * where.rows

    def below(unit: int) -> int:
        """How many sample points lie before ``unit``."""
        return min(count, max(0, _ceil_div(unit - half, per)))

    out = bytearray()
    done = 0  # sample points emitted
    cursor = 0  # units (from `low`) already covered
    for seg in sorted((s for s in image.segments if s.units), key=lambda s: s.address):
        first = (seg.address - where.low) // where.unit_size
        end = first + seg.units
        if end <= cursor:
            continue  # hidden by earlier segments
        if first > cursor:
            gap = below(first) - done
            out += _GAP_BYTE * gap
            done += gap
        stop = below(end)
        if stop > done:
            offset = done * per + half - first  # of the first sample inside this segment
            expand = per <= _EXPAND_MAX_STEP and seg.units <= expand_limit
            out += _segment_samples(seg, offset, per, stop - done, expand=expand)
            done = stop
        cursor = end
    out += _BEYOND_BYTE * (count - done)
    return bytes(out)


def _segment_samples(seg: Segment, offset: int, step: int, count: int, *, expand: bool) -> bytes:
    """Palette indices of units ``offset, offset + step, ...`` (``count`` of them) of ``seg``."""
    usage = seg.usage
    if expand:
        # One byte per unit: each pair's index byte repeated n + 1 times, all in C.
        units = b"".join(
            map(mul, map(_INDEX_BYTE.__getitem__, usage[0::2]), map(add, usage[1::2], repeat(1)))
        )
        return units[offset : offset + step * count : step]
    # Sparse samples, or very many units per pair: find each sample's pair by bisection
    # (memory stays proportional to the pairs, which are already in memory).
    ends = list(map(add, accumulate(usage[1::2]), range(1, seg.pair_count + 1)))
    colours = usage[0::2].translate(_STATE_INDEX)
    points = range(offset, offset + step * count, step)
    return bytes(map(colours.__getitem__, map(partial(bisect_right, ends), points)))


@dataclass(frozen=True, slots=True)
class RenderedHeap:
    """``png`` is None when the caller's ``unless_etag`` still matched (HTTP 304)."""

    png: bytes | None
    layout: HeapLayout
    etag: str


def fingerprint(image: HeapImage, where: HeapLayout) -> str:
    """A strong HTTP validator for the picture (quoted): it changes whenever the drawn data or
    the layout does, so a new dump after a GC gets a new one."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(repr(where).encode())
    for seg in image.segments:
        digest.update(f"{seg.address}:{seg.units}:{seg.unit_size}:{len(seg.usage)}|".encode())
        digest.update(seg.usage)
    return f'"{digest.hexdigest()}"'


def _matches(etag: str, if_none_match: str | None) -> bool:
    if not if_none_match:
        return False
    wanted = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return etag in wanted or "*" in wanted


def render_png(
    image: HeapImage,
    *,
    width: int = DEFAULT_WIDTH,
    max_height: int = DEFAULT_MAX_HEIGHT,
    unless_etag: str | None = None,
    compress_level: int = 6,
) -> RenderedHeap | None:
    """The PNG of ``image`` (palette mode, BEYOND transparent); None when there is nothing
    to draw. With ``unless_etag`` (an If-None-Match value) that matches, nothing is drawn and
    ``png`` is None. Raises ValueError for a size out of range."""
    where = layout(image, width=width, max_height=max_height)
    if where is None:
        return None
    etag = fingerprint(image, where)
    if _matches(etag, unless_etag):
        return RenderedHeap(None, where, etag)
    picture = Image.frombytes("P", (where.columns, where.rows), render_pixels(image, where))
    picture.putpalette(_PALETTE_BYTES)
    if where.cell > 1:
        picture = picture.resize((where.width, where.height), Image.Resampling.NEAREST)
    out = io.BytesIO()
    picture.save(out, format="PNG", transparency=BEYOND, compress_level=compress_level)
    return RenderedHeap(out.getvalue(), where, etag)
