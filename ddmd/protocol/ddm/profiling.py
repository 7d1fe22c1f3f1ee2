"""Method-profiling chunks: MPRS, MPRE, MPSS, MPSE, SPSS, SPSE and MPRQ (method tracing to a
file or streamed back, sampling, and the profiling-state query)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Self

from ddmd.protocol.ddm.base import (
    _U1,
    _U4,
    Chunk,
    ChunkType,
    _check_str,
    _check_unsigned,
    _EmptyChunk,
    _OpaqueChunk,
    _Reader,
    _str16,
)


@dataclass(frozen=True, slots=True)
class MethodTraceStart(Chunk):
    """MPRS to the VM: u4 buffer size, u4 flags, str16 trace file path on the device."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRS
    buffer_size: int
    flags: int
    path: str

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)
        _check_str(self, "path", self.path)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags) + _str16(self.path)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"), r.str16("trace path"))


@dataclass(frozen=True, slots=True)
class MethodTraceEnd(_EmptyChunk):
    """MPRE to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRE


@dataclass(frozen=True, slots=True)
class MethodTraceEndResult(Chunk):
    """MPRE from the VM: u1 result, 0 = file written, 1 = failed."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRE
    result: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "result", self.result, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.result)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("result"))


@dataclass(frozen=True, slots=True)
class MethodTraceStreamStart(Chunk):
    """MPSS to the VM: u4 buffer size, u4 flags."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSS
    buffer_size: int
    flags: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"))


@dataclass(frozen=True, slots=True)
class MethodTraceStreamEnd(_EmptyChunk):
    """MPSE to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSE


@dataclass(frozen=True, slots=True)
class MethodTraceData(_OpaqueChunk):
    """MPSE pushed by the VM (after MPSE or SPSE): a whole trace file, opaque."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPSE


@dataclass(frozen=True, slots=True)
class SamplingStart(Chunk):
    """SPSS to the VM: u4 buffer size, u4 flags, u4 sampling interval in microseconds."""

    TYPE: ClassVar[ChunkType] = ChunkType.SPSS
    buffer_size: int
    flags: int
    interval_us: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "buffer_size", self.buffer_size, 4)
        _check_unsigned(self, "flags", self.flags, 4)
        _check_unsigned(self, "interval_us", self.interval_us, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.buffer_size) + _U4.pack(self.flags) + _U4.pack(self.interval_us)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("buffer size"), r.u4("flags"), r.u4("sampling interval"))


@dataclass(frozen=True, slots=True)
class SamplingEnd(_EmptyChunk):
    """SPSE to the VM: no data (the VM answers with an MPSE push)."""

    TYPE: ClassVar[ChunkType] = ChunkType.SPSE


@dataclass(frozen=True, slots=True)
class ProfilingQuery(_EmptyChunk):
    """MPRQ to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRQ


@dataclass(frozen=True, slots=True)
class ProfilingStatus(Chunk):
    """MPRQ from the VM: u1 state, 0 = off, 1 = method tracing, 2 = sampling."""

    TYPE: ClassVar[ChunkType] = ChunkType.MPRQ
    state: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "state", self.state, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.state)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("state"))
