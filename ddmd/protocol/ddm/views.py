"""View-debugging chunks (VULW, VURT, VUOP, VUGL): one class for all four, data kept raw and
byte-exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from ddmd.protocol.ddm.base import (
    VIEW_DEBUG_TYPES,
    Chunk,
    ChunkType,
    _check_bytes,
    _Reader,
)
from ddmd.protocol.errors import LocalProtocolError


@dataclass(frozen=True, slots=True)
class ViewDebug(Chunk):
    """VULW, VURT, VUOP or VUGL, either direction; the data is kept raw."""

    chunk_type: int = field()
    data: bytes

    def __post_init__(self) -> None:
        if self.chunk_type not in VIEW_DEBUG_TYPES:
            raise LocalProtocolError(
                f"ViewDebug.chunk_type {self.chunk_type!r} is not VULW, VURT, VUOP or VUGL"
            )
        object.__setattr__(self, "chunk_type", ChunkType(self.chunk_type))
        _check_bytes(self, "data", self.data)

    def encode_data(self) -> bytes:
        return self.data

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.chunk_type, r.rest())
