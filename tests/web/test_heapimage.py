"""ddmd.control.heapimage: the heap bitmap PNG (layout, colours, legend, big heaps, odd images)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from PIL import Image

from ddmd.control.heapimage import (
    BEYOND,
    FREE_RGB,
    GAP,
    GAP_RGB,
    layout,
    legend,
    palette_rgb,
    render_pixels,
    render_png,
    state_colour,
)
from ddmd.protocol.heap import HeapAssembler, HeapImage, Kind, SegmentKind, parse_segment_data

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

# protocol.md 4.4 (V16): heap 1, 8-byte units at 0x12C00000, 914 units.
V16 = struct.pack(">IBIII", 1, 8, 0x12C0_0000, 0, 914) + bytes.fromhex(
    "0909 0102 91FF 91FF 1157 80FF 002B 2100"
)

CLASS_HARD = state_colour((Kind.CLASS_OBJECT << 3) | 1)
OBJECT_HARD = state_colour((Kind.OBJECT << 3) | 1)
BYTES_HARD = state_colour((Kind.ARRAY_1 << 3) | 1)
INTS_HARD = state_colour((Kind.ARRAY_4 << 3) | 1)


def assemble(*segments: tuple[int, int, int, int, int, bytes], ended: bool = True) -> HeapImage:
    """An image of HPSG segments given as (heap, unit, start, offset, units, usage)."""
    assembler = HeapAssembler()
    assembler.start(1)
    for heap_id, unit, start, offset, units, usage in segments:
        problems = assembler.segment(SegmentKind.HPSG, heap_id, unit, start, offset, units, usage)
        assert not problems, problems
    if ended:
        return assembler.end(1)
    (image,) = assembler.abandon()
    return image


def v16_image() -> HeapImage:
    seg = parse_segment_data(V16)
    return assemble((seg.heap_id, seg.unit_size, seg.start, seg.offset, seg.units, seg.usage))


def rgba(png: bytes) -> Image.Image:
    picture = Image.open(io.BytesIO(png))
    assert picture.format == "PNG"
    return picture.convert("RGBA")


def unit_pixel(picture: Image.Image, unit: int, cell: int, columns: int) -> tuple[int, ...]:
    """The colour of the cell of `unit` (sampled at its centre)."""
    row, col = divmod(unit, columns)
    return picture.getpixel((col * cell + cell // 2, row * cell + cell // 2))


# ------------------------------------------------------------------------------------ V16


def test_v16_layout_uses_cells():
    where = layout(v16_image())
    assert where is not None
    # 914 units fit easily: 8x8 cells, 64 units a row, 15 rows.
    assert (where.width, where.height, where.cell) == (512, 120, 8)
    assert (where.columns, where.rows, where.units_per_pixel) == (64, 15, 1)
    assert where.bytes_per_pixel == 8
    assert (where.low, where.high) == (0x12C0_0000, 0x12C0_1C90)
    assert where.to_json()["bytes_per_row"] == 512


def test_v16_png_size_and_colours():
    rendered = render_png(v16_image())
    assert rendered is not None
    assert rendered.png is not None
    picture = rgba(rendered.png)
    assert picture.size == (512, 120)

    def at(unit: int) -> tuple[int, ...]:
        return unit_pixel(picture, unit, 8, 64)

    for unit in (0, 9):  # 10 units of class object
        assert at(unit) == (*CLASS_HARD, 255)
    for unit in (10, 12):  # 3 units of object
        assert at(unit) == (*OBJECT_HARD, 255)
    for unit in (13, 300, 612):  # 600 units of byte[] (three pairs, P joined)
        assert at(unit) == (*BYTES_HARD, 255)
    for unit in (613, 800, 912):  # 300 units free
        assert at(unit) == (*FREE_RGB, 255)
    assert at(913) == (*INTS_HARD, 255)  # the last unit: int[]
    for unit in (914, 959):  # the rest of the last row is transparent
        assert at(unit)[3] == 0
    # Cells are whole: every pixel of the first cell has the class colour.
    assert {picture.getpixel((x, y)) for x in range(8) for y in range(8)} == {(*CLASS_HARD, 255)}


def test_free_and_gap_colours_are_distinct_from_every_kind():
    kinds = {state_colour((k << 3) | s) for k in range(8) for s in range(1, 8)}
    assert FREE_RGB not in kinds
    assert GAP_RGB not in kinds
    assert FREE_RGB != GAP_RGB
    # Free is free whatever kind bits it carries.
    assert {state_colour(k << 3) for k in range(8)} == {FREE_RGB}
    # P and U bits do not change the colour.
    assert state_colour(0x91) == state_colour(0x11) == BYTES_HARD


def test_softer_solidities_are_distinct_shades():
    shades = {state_colour((Kind.OBJECT << 3) | s) for s in range(1, 7)}
    assert len(shades) == 6


# ------------------------------------------------------------------------------------ layout


def test_gap_between_segments_is_drawn():
    # 4 units at 0x1000, then 2 units at 0x1050 (10 units on): units 4..9 are a gap.
    image = assemble(
        (1, 8, 0x1000, 0, 4, bytes([0x01, 3])),
        (1, 8, 0x1050, 0, 2, bytes([0x00, 1])),
    )
    where = layout(image, width=16, max_height=1)
    assert where is not None
    assert where.cell == 1
    assert where.units_per_pixel == 1
    pixels = render_pixels(image, where)
    assert pixels[:12] == bytes([0x01] * 4 + [GAP] * 6 + [0x00] * 2)
    assert set(pixels[12:]) == {BEYOND}
    rendered = render_png(image, width=16, max_height=1)
    assert rendered is not None
    assert rendered.png is not None
    picture = rgba(rendered.png)
    assert picture.size == (16, 1)
    assert picture.getpixel((5, 0)) == (*GAP_RGB, 255)
    assert picture.getpixel((10, 0)) == (*FREE_RGB, 255)


def test_downsampled_pixels_show_the_unit_at_their_middle():
    # 64 units into 16 pixels: 4 units a pixel; runs of 4 alternate object / free, then the
    # second half is one byte[] run.
    usage = bytes([0x01, 3, 0x00, 3] * 4) + bytes([0x11, 31])
    image = assemble((1, 8, 0x2000, 0, 64, usage))
    where = layout(image, width=16, max_height=1)
    assert where is not None
    assert (where.units_per_pixel, where.bytes_per_pixel, where.rows) == (4, 32, 1)
    assert render_pixels(image, where) == bytes([0x01, 0x00] * 4 + [0x11] * 8)


def test_large_span_keeps_the_height_limit():
    image = assemble((1, 8, 0, 0, 100_000, bytes([0x01, 255]) * 390 + bytes([0x01, 159])))
    for width, height in ((512, 512), (100, 7), (2048, 4096), (16, 1)):
        where = layout(image, width=width, max_height=height)
        assert where is not None
        assert where.width == width
        assert where.height <= height
        assert where.columns * where.rows * where.units_per_pixel >= where.span_units


def test_size_limits():
    image = v16_image()
    with pytest.raises(ValueError, match="width"):
        layout(image, width=8)
    with pytest.raises(ValueError, match="height"):
        layout(image, max_height=0)


@pytest.mark.parametrize(("width", "height"), [(512, 512), (64, 64), (16, 16), (100, 3)])
def test_expanding_and_bisecting_agree(width, height):
    images = [v16_image(), big_heap(1)]
    images.append(
        assemble(
            (1, 8, 0x1000, 0, 300, bytes([0x01, 99, 0x00, 99, 0x19, 99])),
            (1, 8, 0x1000 + 8 * 1000, 0, 3, bytes([0x21, 2])),
            (1, 8, 0x1000 + 8 * 500, 0, 10, bytes([0x29, 9])),
        )
    )
    for image in images:
        where = layout(image, width=width, max_height=height)
        assert where is not None
        assert render_pixels(image, where) == render_pixels(image, where, expand_limit=0)


def test_overlapping_segments_do_not_break_the_order():
    image = assemble(
        (1, 8, 0x1000, 0, 8, bytes([0x01, 7])),
        (1, 8, 0x1020, 0, 8, bytes([0x00, 7])),  # starts at unit 4, inside the first
    )
    where = layout(image, width=16, max_height=1)
    assert where is not None
    assert render_pixels(image, where)[:12] == bytes([0x01] * 8 + [0x00] * 4)


# ------------------------------------------------------------------------------------ odd images


def test_empty_image_draws_nothing():
    assembler = HeapAssembler()
    assembler.start(1)
    empty = assembler.end(1)
    assert layout(empty) is None
    assert render_png(empty) is None
    zero = assemble((1, 8, 0x1000, 0, 0, b""))
    assert render_png(zero) is None


def test_incomplete_image_still_draws():
    image = assemble((1, 8, 0x1000, 0, 4, bytes([0x21, 3])), ended=False)
    assert not image.complete
    rendered = render_png(image)
    assert rendered is not None
    assert rendered.png is not None
    assert rgba(rendered.png).getpixel((4, 4)) == (*INTS_HARD, 255)


def test_etag_changes_with_the_data_and_short_circuits():
    first = render_png(v16_image())
    assert first is not None
    again = render_png(v16_image(), unless_etag=first.etag)
    assert again is not None
    assert again.png is None
    assert again.etag == first.etag
    assert render_png(v16_image(), unless_etag=f'W/{first.etag}, "x"').png is None
    other = V16[:-2] + bytes([0x01, 0x00])  # the last unit becomes a plain object
    seg = parse_segment_data(other)
    changed = render_png(
        assemble((seg.heap_id, seg.unit_size, seg.start, seg.offset, seg.units, seg.usage)),
        unless_etag=first.etag,
    )
    assert changed is not None
    assert changed.png is not None
    assert changed.etag != first.etag
    assert changed.png != first.png


# ------------------------------------------------------------------------------------ legend


def test_legend_json():
    data = legend()
    keys = [e["key"] for e in data["entries"]]
    assert keys[:2] == ["free", "gap"]
    assert [k.name.lower() for k in Kind] == [
        e["key"] for e in data["entries"] if e["group"] == "kind"
    ]
    by_key = {e["key"]: e for e in data["entries"]}
    assert by_key["free"]["colour"] == "#{:02x}{:02x}{:02x}".format(*FREE_RGB)
    assert by_key["gap"]["colour"] == "#{:02x}{:02x}{:02x}".format(*GAP_RGB)
    assert by_key["array_1"]["colour"] == "#{:02x}{:02x}{:02x}".format(*BYTES_HARD)
    assert len(data["states"]) == 64
    assert data["states"]["9"] == "#{:02x}{:02x}{:02x}".format(*CLASS_HARD)
    assert all(len(e["label"]) > 2 for e in data["entries"])
    assert len(palette_rgb()) == 66


# ------------------------------------------------------------------------------------ big heaps


def big_heap(mib: int = 64) -> HeapImage:
    """``mib`` MiB of 8-byte units in ~4-unit runs (about two million pairs for 64 MiB),
    in 512 KiB segments with a 64 KiB gap after every eighth one."""
    pattern = bytes([0x01, 2, 0x00, 0, 0x11, 6, 0x09, 3, 0x21, 1, 0x00, 4, 0x29, 0, 0x19, 2])
    pattern_units = sum(pattern[1::2]) + len(pattern) // 2  # 30
    repeats = (512 * 1024 // 8) // pattern_units
    units = repeats * pattern_units
    usage = pattern * repeats
    segments = []
    address = 0x1300_0000
    for index in range(mib * 2):
        segments.append((1, 8, address, 0, units, usage))
        address += units * 8 + (64 * 1024 if index % 8 == 7 else 0)
    return assemble(*segments)


def test_large_heap_renders():
    """A 64 MiB heap draws into at most 512 x 512 pixels (how long it takes is measured by
    bench/heapimage_render.py, not here: tests stay quiet and make no timing claims)."""
    image = big_heap()
    pairs = sum(s.pair_count for s in image.segments)
    assert pairs > 1_900_000
    rendered = render_png(image)
    assert rendered is not None
    assert rendered.png is not None
    picture = rgba(rendered.png)
    where = rendered.layout
    assert picture.size == (512, where.height)
    assert 480 < where.height <= 512
    # 8 Mi units plus the gaps into at most 512 x 512 pixels: 33 units (264 B) a pixel.
    assert where.units_per_pixel == -(-where.span_units // (512 * 512)) == 33
    colours = {c for _, c in picture.getcolors(maxcolors=1 << 16)}
    assert (*GAP_RGB, 255) in colours  # the 64 KiB gaps show
    assert (*FREE_RGB, 255) in colours
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "heapimage-64mib.png").write_bytes(rendered.png)
