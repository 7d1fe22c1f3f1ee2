"""Identity chunks: HELO, FEAT, WAIT, APNM, EXIT and DBGD (who the VM is, what it supports,
whether it waits for a debugger)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Final, Self

from ddmd.protocol.ddm.base import (
    _S4,
    _U1,
    _U4,
    Chunk,
    ChunkType,
    _check_bool,
    _check_bytes,
    _check_signed,
    _check_str,
    _check_tuple,
    _check_unsigned,
    _EmptyChunk,
    _flag,
    _owner,
    _Reader,
    _str16,
    _utf16,
)
from ddmd.protocol.errors import LocalProtocolError

_HELO_HEAD = struct.Struct(">IIII")


@dataclass(frozen=True, slots=True)
class HeloRequest(Chunk):
    """HELO to the VM: u4 server protocol version (ddmd sends 1)."""

    TYPE: ClassVar[ChunkType] = ChunkType.HELO
    version: int = 1

    def __post_init__(self) -> None:
        _check_unsigned(self, "version", self.version, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.version)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("server protocol version"))


_HELO_TRAILERS: Final = ("user_id", "abi", "jvm_flags", "native_debuggable", "package_name")


@dataclass(frozen=True, slots=True)
class HeloReply(Chunk):
    """HELO from the VM. The five trailers are present only while bytes remain, in order.

    ``extra`` keeps bytes after the last known trailer (only possible when all five are
    present). ``native_debuggable`` reads ``byte == 1``; a byte other than 0 or 1 re-encodes
    as 0 (the one lossy field of this chunk).
    """

    TYPE: ClassVar[ChunkType] = ChunkType.HELO
    client_version: int
    pid: int
    vm_ident: str
    app_name: str
    user_id: int | None = None
    abi: str | None = None
    jvm_flags: str | None = None
    native_debuggable: bool | None = None
    package_name: str | None = None
    extra: bytes = b""

    def __post_init__(self) -> None:
        _check_unsigned(self, "client_version", self.client_version, 4)
        _check_unsigned(self, "pid", self.pid, 4)
        _check_str(self, "vm_ident", self.vm_ident)
        _check_str(self, "app_name", self.app_name)
        if self.user_id is not None:
            _check_signed(self, "user_id", self.user_id, 4)
        for name in ("abi", "jvm_flags", "package_name"):
            value = getattr(self, name)
            if value is not None:
                _check_str(self, name, value)
        if self.native_debuggable is not None:
            _check_bool(self, "native_debuggable", self.native_debuggable)
        _check_bytes(self, "extra", self.extra)
        _check_trailer_order(self, _HELO_TRAILERS, self.extra)

    def encode_data(self) -> bytes:
        vm = _utf16(self.vm_ident)
        app = _utf16(self.app_name)
        parts = [
            _HELO_HEAD.pack(self.client_version, self.pid, len(vm) // 2, len(app) // 2),
            vm,
            app,
        ]
        if self.user_id is not None:
            parts.append(_S4.pack(self.user_id))
        if self.abi is not None:
            parts.append(_str16(self.abi))
        if self.jvm_flags is not None:
            parts.append(_str16(self.jvm_flags))
        if self.native_debuggable is not None:
            parts.append(_flag(self.native_debuggable))
        if self.package_name is not None:
            parts.append(_str16(self.package_name))
        parts.append(self.extra)
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        client_version, pid, n_vm, n_app = r.unpack(_HELO_HEAD, "fixed header")
        vm_ident = r.utf16(n_vm, "VM ident")
        app_name = r.utf16(n_app, "app name")
        user_id = r.s4("user id (trailer 1)") if r.remaining else None
        abi = r.str16("ABI (trailer 2)") if r.remaining else None
        jvm_flags = r.str16("JVM flags (trailer 3)") if r.remaining else None
        native = r.u1("native debuggable (trailer 4)") == 1 if r.remaining else None
        package = r.str16("package name (trailer 5)") if r.remaining else None
        extra = r.rest()
        return cls(
            client_version, pid, vm_ident, app_name, user_id, abi, jvm_flags, native, package, extra
        )


def _check_trailer_order(obj: object, names: tuple[str, ...], extra: bytes) -> None:
    """A trailer may be set only if every earlier one is; ``extra`` only after the last."""
    missing: str | None = None
    for name in names:
        if getattr(obj, name) is None:
            missing = missing or name
        elif missing is not None:
            raise LocalProtocolError(
                f"{_owner(obj)}.{name} is set but the earlier trailer {missing} is not"
            )
    if missing is not None and extra:
        raise LocalProtocolError(
            f"{_owner(obj)}.extra is set but the trailer {missing} is not; "
            "unknown bytes may only follow the last known trailer"
        )


@dataclass(frozen=True, slots=True)
class FeatRequest(_EmptyChunk):
    """FEAT to the VM: no data."""

    TYPE: ClassVar[ChunkType] = ChunkType.FEAT


@dataclass(frozen=True, slots=True)
class FeatReply(Chunk):
    """FEAT from the VM: u4 count, count x str16 feature names (treat as a set)."""

    TYPE: ClassVar[ChunkType] = ChunkType.FEAT
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_tuple(self, "features", self.features, str, 0xFFFFFFFF)

    def encode_data(self) -> bytes:
        return _U4.pack(len(self.features)) + b"".join(_str16(f) for f in self.features)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        count = r.u4("feature count")
        r.require_count(count, 4, "feature count")
        return cls(tuple(r.str16(f"feature [{i}]") for i in range(count)))


@dataclass(frozen=True, slots=True)
class WaitForDebugger(Chunk):
    """WAIT pushed by the VM: u1 reason (0 = waiting for a debugger)."""

    TYPE: ClassVar[ChunkType] = ChunkType.WAIT
    reason: int = 0

    def __post_init__(self) -> None:
        _check_unsigned(self, "reason", self.reason, 1)

    def encode_data(self) -> bytes:
        return _U1.pack(self.reason)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u1("reason"))


_APNM_TRAILERS: Final = ("user_id", "package_name")


@dataclass(frozen=True, slots=True)
class AppName(Chunk):
    """APNM pushed by the VM: str16 app (process) name, then s4 user id and str16 package
    name while bytes remain. ``extra`` keeps bytes after the package name."""

    TYPE: ClassVar[ChunkType] = ChunkType.APNM
    app_name: str
    user_id: int | None = None
    package_name: str | None = None
    extra: bytes = b""

    def __post_init__(self) -> None:
        _check_str(self, "app_name", self.app_name)
        if self.user_id is not None:
            _check_signed(self, "user_id", self.user_id, 4)
        if self.package_name is not None:
            _check_str(self, "package_name", self.package_name)
        _check_bytes(self, "extra", self.extra)
        _check_trailer_order(self, _APNM_TRAILERS, self.extra)

    def encode_data(self) -> bytes:
        parts = [_str16(self.app_name)]
        if self.user_id is not None:
            parts.append(_S4.pack(self.user_id))
        if self.package_name is not None:
            parts.append(_str16(self.package_name))
        parts.append(self.extra)
        return b"".join(parts)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        app_name = r.str16("app name")
        user_id = r.s4("user id") if r.remaining else None
        package = r.str16("package name") if r.remaining else None
        return cls(app_name, user_id, package, r.rest())


@dataclass(frozen=True, slots=True)
class ExitRequest(Chunk):
    """EXIT to the VM: u4 exit status. The VM halts; expect EOF, not a reply."""

    TYPE: ClassVar[ChunkType] = ChunkType.EXIT
    status: int

    def __post_init__(self) -> None:
        _check_unsigned(self, "status", self.status, 4)

    def encode_data(self) -> bytes:
        return _U4.pack(self.status)

    @classmethod
    def from_reader(cls, r: _Reader) -> Self:
        return cls(r.u4("exit status"))


@dataclass(frozen=True, slots=True)
class Dbgd(_EmptyChunk):
    """DBGD, no data, either direction (the draft's debugger-detach request and its ack)."""

    TYPE: ClassVar[ChunkType] = ChunkType.DBGD
