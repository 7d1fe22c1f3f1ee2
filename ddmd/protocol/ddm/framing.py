"""Framing of DDM chunks: FAIL and ZLIB (inflating needs the decoder, so they live here), the
fallback for unknown types, the (direction, type) dispatch tables, chunk decode/encode/split,
and the helpers that put chunks in and out of DDM packets."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Final, Self

from ddmd.protocol.ddm.allocs import (
    Allocations,
    AllocationsRequest,
    AllocTrackingEnable,
    AllocTrackingQuery,
    AllocTrackingStatus,
)
from ddmd.protocol.ddm.base import (
    _CHUNK_HEADER,
    _S4,
    _U4,
    CHUNK_HEADER_SIZE,
    Chunk,
    ChunkType,
    Direction,
    _check_bytes,
    _check_signed,
    _check_str,
    _check_unsigned,
    _Reader,
    _str16,
    type_name,
)
from ddmd.protocol.ddm.heap import (
    GcRequest,
    HeapDumpRequest,
    HeapDumpResult,
    HeapDumpStream,
    HeapDumpStreamRequest,
    HeapEnd,
    HeapInfo,
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
    StackTrace,
    StackTraceRequest,
    ThreadCreated,
    ThreadDied,
    ThreadNotify,
    ThreadRenamed,
    ThreadStatusRequest,
    _decode_thst_from_vm,
)
from ddmd.protocol.ddm.views import ViewDebug
from ddmd.protocol.errors import LocalProtocolError, RemoteProtocolError
from ddmd.protocol.jdwp import DDM_COMMAND, CommandPacket, CommandSet, ReplyPacket

# --------------------------------------------------------------------------------------------
# FAIL and ZLIB (protocol.md 2.5, 2.6)


@dataclass(frozen=True, slots=True)
class Fail(Chunk):
    """FAIL in a reply: s4 error code, str16 message (may be empty)."""

    TYPE: ClassVar[ChunkType] = ChunkType.FAIL
    code: int
    message: str

    def __post_init__(self) -> None:
        _check_signed(self, "code", self.code, 4)
        _check_str(self, "message", self.message)

    def encode_data(self) -> bytes:
        return _S4.pack(self.code) + _str16(self.message)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.s4("error code"), r.str16("message"))


@dataclass(frozen=True, slots=True)
class Zlib(Chunk):
    """ZLIB (ddmd's reading of the draft): u4 original type, u4 original length, zlib stream.

    The wrapped type must not itself be ZLIB. Use ``inflate_chunk`` to get the inner chunk.
    """

    TYPE: ClassVar[ChunkType] = ChunkType.ZLIB
    original_type: int
    original_length: int
    stream: bytes

    def __post_init__(self) -> None:
        _check_unsigned(self, "original_type", self.original_type, 4)
        _check_unsigned(self, "original_length", self.original_length, 4)
        _check_bytes(self, "stream", self.stream)
        if self.original_type == ChunkType.ZLIB:
            raise LocalProtocolError("Zlib.original_type is ZLIB: nested ZLIB is not allowed")

    def encode_data(self) -> bytes:
        return _U4.pack(self.original_type) + _U4.pack(self.original_length) + self.stream

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        original_type = r.u4("original type")
        if original_type == ChunkType.ZLIB:
            raise r.error("original type is ZLIB: nested ZLIB is not allowed")
        original_length = r.u4("original length")
        return cls(original_type, original_length, r.rest())


def inflate_chunk(z: Zlib, direction: Direction, *, max_length: int) -> Chunk:
    """Inflate a ZLIB chunk and decode the chunk it wraps.

    The declared original length is checked against ``max_length`` before any inflating, and
    the inflater never produces more than original length + 1 bytes, so a small stream that
    inflates to gigabytes costs nothing. Wrong size, a corrupt or truncated stream, or bytes
    after the end of the stream raise RemoteProtocolError.
    """
    if max_length < 0:
        raise LocalProtocolError(f"inflate_chunk max_length {max_length} is negative")
    inner = type_name(z.original_type)
    if z.original_length > max_length:
        raise RemoteProtocolError(
            f"ZLIB: original length {z.original_length} of {inner} exceeds the limit {max_length}"
        )
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(z.stream, z.original_length + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(f"ZLIB: bad zlib stream for {inner}: {exc}") from exc
    if len(out) > z.original_length:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} inflates to more than the declared {z.original_length} bytes"
        )
    if not inflater.eof:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} is truncated ({len(z.stream)} bytes, no end of stream)"
        )
    if inflater.unused_data:
        raise RemoteProtocolError(
            f"ZLIB: {len(inflater.unused_data)} bytes follow the end of the stream for {inner}"
        )
    if len(out) != z.original_length:
        raise RemoteProtocolError(
            f"ZLIB: stream for {inner} inflates to {len(out)} bytes, declared {z.original_length}"
        )
    return decode_chunk(z.original_type, out, direction)


def compress_chunk(chunk: Chunk, *, level: int = 6) -> Zlib:
    """Wrap ``chunk`` in a ZLIB chunk. Compressed bytes depend on the zlib build."""
    if isinstance(chunk, Zlib):
        raise LocalProtocolError("compress_chunk: a ZLIB chunk cannot wrap another ZLIB chunk")
    if not -1 <= level <= 9:
        raise LocalProtocolError(f"compress_chunk: zlib level {level} is outside -1..9")
    data = chunk.encode_data()
    return Zlib(chunk.chunk_type, len(data), zlib.compress(data, level))


# --------------------------------------------------------------------------------------------
# Unknown types: raw data, byte-exact


@dataclass(frozen=True, slots=True)
class UnknownChunk(Chunk):
    """Any type without a class of its own (TEST, DTRC, types we have never heard of).

    Never an error on decode, and re-encodes byte-exact. Building one for a type that has a
    class of its own is a LocalProtocolError: decoding its bytes would give that class.
    """

    chunk_type: int = field()
    data: bytes

    def __post_init__(self) -> None:
        _check_unsigned(self, "chunk_type", self.chunk_type, 4)
        if self.chunk_type in _DECODERS[Direction.TO_VM]:
            raise LocalProtocolError(
                f"UnknownChunk.chunk_type {type_name(self.chunk_type)} has a class of its own"
            )
        _check_bytes(self, "data", self.data)

    def encode_data(self) -> bytes:
        return self.data

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.chunk_type, r.rest())


# --------------------------------------------------------------------------------------------
# Dispatch tables: (direction, type) -> decoder. Read-only after import.

_Decoder = Callable[[_Reader], Chunk]

_BOTH: Final[dict[int, _Decoder]] = {
    ChunkType.WAIT: WaitForDebugger.from_reader,
    ChunkType.APNM: AppName.from_reader,
    ChunkType.EXIT: ExitRequest.from_reader,
    ChunkType.DBGD: Dbgd.from_reader,
    ChunkType.ZLIB: Zlib.from_reader,
    ChunkType.FAIL: Fail.from_reader,
    ChunkType.THEN: ThreadNotify.from_reader,
    ChunkType.THCR: ThreadCreated.from_reader,
    ChunkType.THDE: ThreadDied.from_reader,
    ChunkType.THNM: ThreadRenamed.from_reader,
    ChunkType.HPSO: HeapSegmentObjects.from_reader,
    ChunkType.HPST: HeapStart.from_reader,
    ChunkType.HPEN: HeapEnd.from_reader,
    ChunkType.NHST: NativeHeapStart.from_reader,
    ChunkType.NHEN: NativeHeapEnd.from_reader,
    ChunkType.HPGC: GcRequest.from_reader,
    ChunkType.REAE: AllocTrackingEnable.from_reader,
    ChunkType.MPRS: MethodTraceStart.from_reader,
    ChunkType.MPSS: MethodTraceStreamStart.from_reader,
    ChunkType.SPSS: SamplingStart.from_reader,
    ChunkType.SPSE: SamplingEnd.from_reader,
    ChunkType.VULW: ViewDebug.from_reader,
    ChunkType.VURT: ViewDebug.from_reader,
    ChunkType.VUOP: ViewDebug.from_reader,
    ChunkType.VUGL: ViewDebug.from_reader,
}

_DECODERS: Final[Mapping[Direction, Mapping[int, _Decoder]]] = MappingProxyType(
    {
        Direction.TO_VM: MappingProxyType(
            {
                **_BOTH,
                ChunkType.HELO: HeloRequest.from_reader,
                ChunkType.FEAT: FeatRequest.from_reader,
                ChunkType.THST: ThreadStatusRequest.from_reader,
                ChunkType.STKL: StackTraceRequest.from_reader,
                ChunkType.HPIF: HeapInfoRequest.from_reader,
                ChunkType.HPSG: HeapSegmentRequest.from_reader,
                ChunkType.NHSG: NativeHeapSegmentRequest.from_reader,
                ChunkType.HPDU: HeapDumpRequest.from_reader,
                ChunkType.HPDS: HeapDumpStreamRequest.from_reader,
                ChunkType.REAQ: AllocTrackingQuery.from_reader,
                ChunkType.REAL: AllocationsRequest.from_reader,
                ChunkType.NHGT: NativeHeapRequest.from_reader,
                ChunkType.MPRE: MethodTraceEnd.from_reader,
                ChunkType.MPSE: MethodTraceStreamEnd.from_reader,
                ChunkType.MPRQ: ProfilingQuery.from_reader,
            }
        ),
        Direction.FROM_VM: MappingProxyType(
            {
                **_BOTH,
                ChunkType.HELO: HeloReply.from_reader,
                ChunkType.FEAT: FeatReply.from_reader,
                ChunkType.THST: _decode_thst_from_vm,
                ChunkType.STKL: StackTrace.from_reader,
                ChunkType.HPIF: HeapInfo.from_reader,
                ChunkType.HPSG: HeapSegment.from_reader,
                ChunkType.NHSG: NativeHeapSegment.from_reader,
                ChunkType.HPDU: HeapDumpResult.from_reader,
                ChunkType.HPDS: HeapDumpStream.from_reader,
                ChunkType.REAQ: AllocTrackingStatus.from_reader,
                ChunkType.REAL: Allocations.from_reader,
                ChunkType.NHGT: NativeHeapSnapshot.from_reader,
                ChunkType.MPRE: MethodTraceEndResult.from_reader,
                ChunkType.MPSE: MethodTraceData.from_reader,
                ChunkType.MPRQ: ProfilingStatus.from_reader,
            }
        ),
    }
)


# --------------------------------------------------------------------------------------------
# Framing


def _as_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _decode_view(chunk_type: int, data: memoryview, direction: Direction) -> Chunk:
    decoder = _DECODERS[direction].get(chunk_type)
    if decoder is None:
        return UnknownChunk(chunk_type, bytes(data))
    r = _Reader(chunk_type, data)
    try:
        chunk = decoder(r)
    except LocalProtocolError as exc:  # a value the wire can carry but a message cannot
        raise r.error(str(exc)) from exc
    r.finish()
    return chunk


def decode_chunk(
    chunk_type: int, data: bytes | bytearray | memoryview, direction: Direction
) -> Chunk:
    """Decode the data of one chunk whose type is ``chunk_type`` travelling ``direction``."""
    if not isinstance(direction, Direction):
        raise LocalProtocolError(f"decode_chunk: direction must be a Direction, not {direction!r}")
    if not isinstance(chunk_type, int) or not 0 <= chunk_type <= 0xFFFFFFFF:
        raise LocalProtocolError(f"decode_chunk: chunk type {chunk_type!r} is not a u4")
    return _decode_view(chunk_type, _as_view(data), direction)


def decode_chunks(data: bytes | bytearray | memoryview, direction: Direction) -> tuple[Chunk, ...]:
    """Decode every chunk of a DDM packet's data, in order (empty data gives no chunks).

    Rejects a chunk header or chunk data running past the end, and 1-7 bytes left over.
    """
    if not isinstance(direction, Direction):
        raise LocalProtocolError(f"decode_chunks: direction must be a Direction, not {direction!r}")
    view = _as_view(data)
    end = len(view)
    pos = 0
    chunks: list[Chunk] = []
    while pos < end:
        if end - pos < CHUNK_HEADER_SIZE:
            raise RemoteProtocolError(
                f"DDM: {end - pos} bytes left over at offset {pos} after {len(chunks)} chunks; "
                f"a chunk header needs {CHUNK_HEADER_SIZE}"
            )
        chunk_type, length = _CHUNK_HEADER.unpack_from(view, pos)
        start = pos + CHUNK_HEADER_SIZE
        if length > end - start:
            raise RemoteProtocolError(
                f"DDM: {type_name(chunk_type)} chunk at offset {pos} declares {length} bytes of "
                f"data, only {end - start} remain"
            )
        chunks.append(_decode_view(chunk_type, view[start : start + length], direction))
        pos = start + length
    return tuple(chunks)


def split_chunks(data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
    """The chunks of a DDM packet's data as (type, data) pairs, not decoded (what chunk
    handlers get); the same framing checks as ``decode_chunks``."""
    view = _as_view(data)
    end = len(view)
    pos = 0
    out: list[tuple[int, bytes]] = []
    while pos < end:
        if end - pos < CHUNK_HEADER_SIZE:
            raise RemoteProtocolError(
                f"DDM: {end - pos} bytes left over at offset {pos} after {len(out)} chunks; "
                f"a chunk header needs {CHUNK_HEADER_SIZE}"
            )
        chunk_type, length = _CHUNK_HEADER.unpack_from(view, pos)
        start = pos + CHUNK_HEADER_SIZE
        if length > end - start:
            raise RemoteProtocolError(
                f"DDM: {type_name(chunk_type)} chunk at offset {pos} declares {length} bytes of "
                f"data, only {end - start} remain"
            )
        out.append((chunk_type, bytes(view[start : start + length])))
        pos = start + length
    return out


def chunk_type_code(name: str) -> int:
    """The u4 of a four-character chunk type name ("THST" -> 0x54485354)."""
    raw = name.encode("ascii", "strict") if name.isascii() else b""
    if len(raw) != 4:
        raise LocalProtocolError(f"a chunk type is four ASCII characters, not {name!r}")
    return int.from_bytes(raw, "big")


def raw_chunk(chunk_type: int, data: bytes) -> bytes:
    """One chunk from its type and data, as they are (no class, no checks of the data)."""
    if len(data) > 0xFFFFFFFF:
        raise LocalProtocolError(f"chunk data of {len(data)} bytes does not fit a u4")
    return _CHUNK_HEADER.pack(chunk_type, len(data)) + data


def encode_chunk(chunk: Chunk) -> bytes:
    """One chunk: 8-byte header (type, data length) + data."""
    data = chunk.encode_data()
    if len(data) > 0xFFFFFFFF:
        raise LocalProtocolError(
            f"{type_name(chunk.chunk_type)} chunk data of {len(data)} bytes does not fit a u4"
        )
    return _CHUNK_HEADER.pack(chunk.chunk_type, len(data)) + data


def encode_chunks(chunks: Iterable[Chunk]) -> bytes:
    """Several chunks back to back (only ddmd's own tests use more than one per packet)."""
    return b"".join(encode_chunk(c) for c in chunks)


# --------------------------------------------------------------------------------------------
# Packet helpers


def ddm_command(packet_id: int, chunk: Chunk) -> CommandPacket:
    """A DDM command packet (set 199, command 1) carrying exactly one chunk."""
    return CommandPacket(packet_id, CommandSet.DDM, DDM_COMMAND, encode_chunk(chunk))


def is_ddm(packet: object) -> bool:
    """True for a command packet of command set 199, command 1."""
    return (
        isinstance(packet, CommandPacket)
        and packet.command_set == CommandSet.DDM
        and packet.command == DDM_COMMAND
    )


def chunks_of(packet: CommandPacket | ReplyPacket, direction: Direction) -> tuple[Chunk, ...]:
    """The chunks in a DDM command, or in the reply to one (an empty reply has none).

    A command packet that is not DDM is a LocalProtocolError; a reply carries no command
    set, so the caller vouches that it answers a DDM command.
    """
    if isinstance(packet, CommandPacket) and not is_ddm(packet):
        raise LocalProtocolError(
            f"chunks_of: command packet {packet.command_set}/{packet.command} is not DDM (199/1)"
        )
    return decode_chunks(packet.data, direction)
