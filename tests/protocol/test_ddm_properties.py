"""Hypothesis properties of the DDM chunk codec: round trip, concatenation, split anywhere,
fuzzing. Example counts come from the active profile (tests/conftest.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.protocol import ddm
from ddmd.protocol.ddm import ChunkType, Direction
from ddmd.protocol.errors import ProtocolError, RemoteProtocolError
from ddmd.protocol.jdwp import NEED_DATA, CommandPacket, PacketDecoder, ReplyPacket, encode

from .ddm_strategies import (
    CHUNKS,
    LOSSY,
    STRUCTURED,
    chunks_for,
    directions,
    light_chunks,
    round_trip_cases,
    u1,
    u2,
    u4,
)


def _concrete_chunk_classes() -> set[type[ddm.Chunk]]:
    found: set[type[ddm.Chunk]] = set()
    todo = [ddm.Chunk]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            # @dataclass(slots=True) replaces each class; keep the ones the module exports
            public = not sub.__name__.startswith("_") and sub is not ddm.SegmentChunk
            if public and getattr(ddm, sub.__name__, None) is sub:
                found.add(sub)
    return found


def test_every_chunk_class_has_a_strategy():
    assert set(CHUNKS) == _concrete_chunk_classes()


def test_every_chunk_type_has_a_class_in_each_direction():
    for direction in Direction:
        covered = {
            ct
            for cls, (_, dirs) in CHUNKS.items()
            if direction in dirs and hasattr(cls, "TYPE")
            for ct in [cls.TYPE]
        }
        covered |= ddm.VIEW_DEBUG_TYPES
        assert covered == set(ChunkType) - {ChunkType.TEST, ChunkType.DTRC}, direction


def _check_round_trip(chunk: ddm.Chunk, dirs: tuple[Direction, ...]) -> None:
    raw = ddm.encode_chunk(chunk)
    assert int.from_bytes(raw[:4], "big") == chunk.chunk_type
    assert int.from_bytes(raw[4:8], "big") == len(raw) - 8
    for direction in dirs:
        decoded = ddm.decode_chunks(raw, direction)
        assert decoded == (chunk,)
        assert type(decoded[0]) is type(chunk)
        assert ddm.encode_chunk(decoded[0]) == raw


@given(case=round_trip_cases)
def test_round_trip_every_class(case):
    _check_round_trip(*case)


@pytest.mark.parametrize("cls", STRUCTURED, ids=[c.__name__ for c in STRUCTURED])
def test_round_trip_structured(cls):
    """The layouts with lists and trailers get a full run each, not a share of the one above."""
    strategy, dirs = CHUNKS[cls]

    @given(chunk=strategy)
    def check(chunk):
        assert type(chunk) is cls
        _check_round_trip(chunk, dirs)

    check()


@pytest.mark.parametrize("direction", list(Direction))
def test_concatenated_chunks_decode_in_order(direction):
    @given(chunks=st.lists(light_chunks[direction], max_size=4))
    def check(chunks):
        assert ddm.decode_chunks(ddm.encode_chunks(chunks), direction) == tuple(chunks)

    check()


_reply_chunk_lists = {d: st.lists(light_chunks[d], max_size=2) for d in Direction}
_packet_kinds = st.sampled_from(["request", "push", "reply"])


@st.composite
def ddm_packets(draw: st.DrawFn) -> tuple[CommandPacket | ReplyPacket, Direction, tuple]:
    kind = draw(_packet_kinds)
    direction = Direction.TO_VM if kind == "request" else Direction.FROM_VM
    if kind == "reply":
        chunks = tuple(draw(_reply_chunk_lists[direction]))
        return ReplyPacket(draw(u4), 0, ddm.encode_chunks(chunks)), direction, chunks
    chunk = draw(light_chunks[direction])
    return ddm.ddm_command(draw(u4), chunk), direction, (chunk,)


@given(
    items=st.lists(ddm_packets(), min_size=1, max_size=3),
    cut_points=st.lists(st.floats(0, 1), max_size=6),
)
def test_split_anywhere(items, cut_points):
    stream = b"".join(encode(packet) for packet, _, _ in items)
    cuts = sorted(int(p * len(stream)) for p in cut_points)
    decoder = PacketDecoder()
    got: list[CommandPacket | ReplyPacket] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        if start == end:
            continue  # receive_data(b"") means EOF
        decoder.receive_data(stream[start:end])
        while (event := decoder.next_packet()) is not NEED_DATA:
            assert isinstance(event, CommandPacket | ReplyPacket)
            got.append(event)
    assert got == [packet for packet, _, _ in items]
    for packet, (_, direction, chunks) in zip(got, items, strict=True):
        if isinstance(packet, CommandPacket):
            assert ddm.is_ddm(packet)
        assert ddm.chunks_of(packet, direction) == chunks


@given(data=st.binary(max_size=200), direction=directions)
def test_fuzz_decode_chunks(data, direction):
    try:
        chunks = ddm.decode_chunks(data, direction)
    except RemoteProtocolError:
        return
    assert all(isinstance(c, ddm.Chunk) for c in chunks)
    assert ddm.decode_chunks(ddm.encode_chunks(chunks), direction) == chunks


def _decode_checked(chunk_type: int, data: bytes, direction: Direction) -> None:
    """Decoding may only give a chunk or a ProtocolError; a chunk must re-decode to itself
    and, for layouts without lossy fields, re-encode to the same bytes."""
    try:
        chunk = ddm.decode_chunk(chunk_type, data, direction)
    except ProtocolError:
        return
    assert chunk.chunk_type == chunk_type
    again = chunk.encode_data()
    assert ddm.decode_chunk(chunk_type, again, direction) == chunk
    if type(chunk) not in LOSSY:
        assert again == data


@given(chunk_type=st.sampled_from(list(ChunkType)), direction=directions, data=st.binary())
def test_fuzz_decode_chunk_known_types(chunk_type, direction, data):
    _decode_checked(chunk_type, data, direction)


_classes = st.sampled_from(list(CHUNKS))
_ops = st.lists(st.tuples(st.sampled_from(["flip", "cut", "add"]), u2, u1), max_size=3)
_additions = st.binary(min_size=1, max_size=8)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, bytes, Direction]:
    """A valid chunk's data with a few bytes changed, cut off or added: reaches deep paths.
    Positions are drawn as any u2 and reduced, so no strategy is built inside the draw."""
    strategy, dirs = CHUNKS[draw(_classes)]
    chunk = draw(strategy)
    data = bytearray(chunk.encode_data())
    for op, where, value in draw(_ops):
        if op == "flip" and data:
            data[where % len(data)] = value
        elif op == "cut" and data:
            del data[where % len(data) :]
        else:
            data += draw(_additions)
    return chunk.chunk_type, bytes(data), dirs[draw(u1) % len(dirs)]


@given(case=mutated())
def test_fuzz_mutated_valid_chunks(case):
    chunk_type, data, direction = case
    _decode_checked(chunk_type, data, direction)


@given(chunk=chunks_for(Direction.FROM_VM), level=st.integers(-1, 9))
def test_compress_inflate_round_trip(chunk, level):
    if isinstance(chunk, ddm.Zlib):
        return
    z = ddm.compress_chunk(chunk, level=level)
    raw = ddm.encode_chunk(z)
    (decoded,) = ddm.decode_chunks(raw, Direction.FROM_VM)
    assert decoded == z
    assert ddm.inflate_chunk(decoded, Direction.FROM_VM, max_length=z.original_length) == chunk


@given(z=CHUNKS[ddm.Zlib][0], direction=directions, limit=st.integers(0, 1 << 16))
def test_fuzz_inflate(z, direction, limit):
    try:
        chunk = ddm.inflate_chunk(z, direction, max_length=limit)
    except RemoteProtocolError:
        return
    assert isinstance(chunk, ddm.Chunk)
    assert len(chunk.encode_data()) <= limit
