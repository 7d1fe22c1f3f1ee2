"""Who a `DdmClient` says it is (the HELO reply and the FEAT list), and the chunk-type names it
accepts.

Layer: standard library and ``ddmd.protocol`` only (no trio, no structlog), so these helpers can
be used and tested without an event loop.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from typing import Final

from ddmd import __version__
from ddmd.protocol import ddm
from ddmd.protocol.errors import ProtocolError

__all__ = [
    "BUILT_IN_TYPES",
    "VM_IDENT",
    "Identity",
    "chunk_type_code",
    "local_abi",
    "outgoing_chunk",
]

#: The VM identity string a DdmClient reports in HELO, where a VM reports
#: ``java.vm.name + " v" + java.vm.version`` ("Dalvik v2.1.0"). It tells a DDM server that the
#: peer is a program built on this library, not a Java VM.
VM_IDENT: Final = f"ddmd.client {__version__}"

#: Chunk types the client answers itself; ``on_chunk`` refuses them.
#: HELO and FEAT say who the client is and what it serves; DBGD (the draft's "a debugger left,
#: release its state") is acknowledged with a DBGD chunk, because a client has no debugger state
#: to release (the server then keeps the connection instead of closing and reopening it); FAIL
#: is a reply-only chunk.
BUILT_IN_TYPES: Final = frozenset({"HELO", "FEAT", "DBGD", "FAIL"})

# Android derives its user id from the uid the same way (UserHandle.PER_USER_RANGE).
_PER_USER_RANGE: Final = 100_000


def chunk_type_code(name: str) -> int:
    """The u4 value of a chunk type name: four printable ASCII characters, e.g. ``"SMON"``.

    Raises ValueError (naming the value) for anything else.
    """
    if not isinstance(name, str):
        raise ValueError(f"a chunk type is a 4-character string, not {type(name).__name__}")
    if len(name) != 4 or not all(0x20 < ord(c) < 0x7F for c in name):
        raise ValueError(f"chunk type {name!r} is not 4 printable ASCII characters (e.g. 'SMON')")
    return int.from_bytes(name.encode("ascii"), "big")


def outgoing_chunk(code: int, data: bytes) -> ddm.Chunk:
    """One chunk travelling from the client to the server (a reply or a push).

    A type Android defines (``THST``, ``HPIF``, ...) must carry that type's layout, because the
    server decodes it as such; the check raises ValueError saying what is wrong. Any other type
    carries ``data`` as it is.
    """
    try:
        return ddm.decode_chunk(code, data, ddm.Direction.FROM_VM)
    except ProtocolError as exc:
        name = ddm.type_name(code)
        raise ValueError(f"the {name} data does not have {name}'s DDM layout: {exc}") from None


def local_abi() -> str:
    """The ABI string of this process the way ART writes it: ``"64-bit (x86_64)"``."""
    bits = struct.calcsize("P") * 8
    machine = platform.machine().lower()
    return f"{bits}-bit ({machine})" if machine else f"{bits}-bit"


@dataclass(frozen=True, slots=True)
class Identity:
    """What the HELO reply says about the client (protocol.md 3.2).

    All five trailers a current ART VM sends are present: ``user_id`` (Android's user number;
    for a workstation process ``uid // 100000``, so 0 for ordinary users), ``abi`` (the
    process's word size and machine), ``jvm_flags`` (empty: there is no JVM), native
    debuggable (false) and ``package_name``.
    """

    app_name: str
    pid: int
    package_name: str
    vm_ident: str = VM_IDENT
    user_id: int = 0
    abi: str = ""
    jvm_flags: str = ""

    @classmethod
    def local(
        cls, app_name: str, *, pid: int | None, package_name: str | None, vm_ident: str
    ) -> Identity:
        """This process's identity: its pid (unless given), user id and ABI."""
        getuid = getattr(os, "getuid", None)
        return cls(
            app_name=app_name,
            pid=os.getpid() if pid is None else pid,
            package_name=app_name if package_name is None else package_name,
            vm_ident=vm_ident,
            user_id=getuid() // _PER_USER_RANGE if getuid is not None else 0,
            abi=local_abi(),
        )

    def hello(self) -> ddm.HeloReply:
        """The HELO reply chunk."""
        return ddm.HeloReply(
            client_version=1,
            pid=self.pid,
            vm_ident=self.vm_ident,
            app_name=self.app_name,
            user_id=self.user_id,
            abi=self.abi,
            jvm_flags=self.jvm_flags,
            native_debuggable=False,
            package_name=self.package_name,
        )
