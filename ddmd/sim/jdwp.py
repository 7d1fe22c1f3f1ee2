"""Plain JDWP in the simulated VM: just deep enough for ``jdb -attach`` (Version, IDSizes,
the classes JDI needs, threads and their one group, event requests, Suspend/Resume, Dispose,
Exit). Everything else is answered NOT_IMPLEMENTED by the caller.

Layer: imports `ddmd.protocol.jdwp` and `sim.config`/`sim.threads`; synchronous and without
I/O: `PlainJdwp.respond` turns one command into its reply (error code, data), and the VM
writes it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, Protocol

from ddmd.protocol.jdwp import CommandSet, ErrorCode, IdSizes, VirtualMachineCommand
from ddmd.sim.config import SimConfig
from ddmd.sim.threads import FIRST_THREAD_OBJECT, SimThread, ThreadTable

__all__ = ["Halt", "JdwpConnection", "PlainJdwp"]

_U4 = struct.Struct(">I")
_S4 = struct.Struct(">i")
_U8 = struct.Struct(">Q")

# JDWP ids: the one thread group, then the classes the sim admits to. JDI cannot live with
# an empty class list (VirtualMachineImpl.allClasses() hits a null map, jdb dies on
# attach), so the sim reports the few classes its own objects need.
_GROUP_ID: Final = 1
_OBJECT_CLASS_ID: Final = 2
_STRING_CLASS_ID: Final = 3
_THREAD_CLASS_ID: Final = 4
_GROUP_CLASS_ID: Final = 5
_CLASS_SIGNATURES: Final = {
    _OBJECT_CLASS_ID: "Ljava/lang/Object;",
    _STRING_CLASS_ID: "Ljava/lang/String;",
    _THREAD_CLASS_ID: "Ljava/lang/Thread;",
    _GROUP_CLASS_ID: "Ljava/lang/ThreadGroup;",
}
_CLASS_STATUS: Final = 7  # VERIFIED | PREPARED | INITIALIZED
_TYPE_TAG_CLASS: Final = 1
assert max(_CLASS_SIGNATURES) < FIRST_THREAD_OBJECT  # thread object ids come after these

# DDM status value -> JDWP ThreadStatus (0 zombie, 1 running, 2 sleeping, 3 monitor, 4 wait).
_JDWP_THREAD_STATUS: Final = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 1, 6: 1, 7: 1, 8: 4, 9: 1}


class Halt(Exception):
    """Raised by a handler: the VM halts (DDM EXIT, VirtualMachine.Exit) with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class JdwpConnection(Protocol):
    """What a debugger's connection holds for the plain JDWP handlers."""

    suspend_count: int  # VirtualMachine.Suspend minus Resume
    close_after_reply: bool  # Dispose: reply, then close
    next_request_id: int  # EventRequest.Set ids


_Handler = Callable[[JdwpConnection, bytes], tuple[int, bytes]]


class PlainJdwp:
    """The plain JDWP commands of one simulated VM, over its `ThreadTable`.

    ``clock`` gives the time `ThreadTable.evolve` advances to (the VM's trio clock).
    """

    def __init__(self, config: SimConfig, threads: ThreadTable, clock: Callable[[], float]) -> None:
        self.config = config
        self._threads = threads
        self._clock = clock
        self._handlers = self._make_handlers()

    def respond(
        self, conn: JdwpConnection, command_set: int, command: int, data: bytes
    ) -> tuple[int, bytes] | None:
        """The reply (error code, data; no data with an error) to one command, or None when
        the sim does not implement it. Raises `Halt` for VirtualMachine.Exit, which the VM
        answers before it halts."""
        handler = self._handlers.get((command_set, command))
        if handler is None:
            return None
        try:
            error, body = handler(conn, data)
        except (struct.error, IndexError):
            return ErrorCode.ILLEGAL_ARGUMENT, b""
        return error, body if error == 0 else b""

    def _make_handlers(self) -> dict[tuple[int, int], _Handler]:
        vm = CommandSet.VIRTUAL_MACHINE
        v = VirtualMachineCommand
        tr = CommandSet.THREAD_REFERENCE
        tg = CommandSet.THREAD_GROUP_REFERENCE
        er = CommandSet.EVENT_REQUEST
        return {
            (vm, v.VERSION): self._jdwp_version,
            (vm, v.CLASSES_BY_SIGNATURE): self._jdwp_classes_by_signature,
            (vm, v.ALL_CLASSES): self._jdwp_all_classes,
            (vm, v.ALL_CLASSES_WITH_GENERIC): self._jdwp_all_classes_with_generic,
            (vm, v.ALL_THREADS): self._jdwp_all_threads,
            (vm, v.TOP_LEVEL_THREAD_GROUPS): self._jdwp_top_groups,
            (vm, v.DISPOSE): self._jdwp_dispose,
            (vm, v.ID_SIZES): self._jdwp_id_sizes,
            (vm, v.SUSPEND): self._jdwp_vm_suspend,
            (vm, v.RESUME): self._jdwp_vm_resume,
            (vm, v.EXIT): self._jdwp_exit,
            (vm, v.CAPABILITIES): self._jdwp_capabilities,
            (vm, v.CAPABILITIES_NEW): self._jdwp_capabilities_new,
            (vm, v.CLASS_PATHS): self._jdwp_class_paths,
            (vm, v.DISPOSE_OBJECTS): self._jdwp_empty,
            (vm, v.HOLD_EVENTS): self._jdwp_empty,
            (vm, v.RELEASE_EVENTS): self._jdwp_empty,
            (CommandSet.REFERENCE_TYPE, 1): self._jdwp_signature,
            (CommandSet.REFERENCE_TYPE, 13): self._jdwp_signature_with_generic,
            (CommandSet.OBJECT_REFERENCE, 1): self._jdwp_object_reference_type,
            (tr, 1): self._jdwp_thread_name,
            (tr, 2): self._jdwp_thread_suspend,
            (tr, 3): self._jdwp_thread_resume,
            (tr, 4): self._jdwp_thread_status,
            (tr, 5): self._jdwp_thread_group,
            (tr, 6): self._jdwp_thread_frames,
            (tr, 7): self._jdwp_thread_frame_count,
            (tr, 12): self._jdwp_thread_suspend_count,
            (tg, 1): self._jdwp_group_name,
            (tg, 2): self._jdwp_group_parent,
            (tg, 3): self._jdwp_group_children,
            (er, 1): self._jdwp_event_set,
            (er, 2): self._jdwp_empty,
            (er, 3): self._jdwp_empty,
        }

    def _thread_of(self, data: bytes) -> SimThread | None:
        (object_id,) = _U8.unpack_from(data)
        return self._threads.by_object.get(object_id)

    def _jdwp_empty(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, b""

    def _jdwp_version(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        version = self.config.vm_ident.rpartition(" v")[2] or "2.1.0"
        return 0, (
            _jstr(f"Android DalvikVM {version} (ddmd sim)")
            + _S4.pack(1)
            + _S4.pack(8)
            + _jstr("1.8.0")
            + _jstr("Dalvik")
        )

    def _jdwp_id_sizes(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, IdSizes(8, 8, 8, 8, 8).encode()

    def _jdwp_capabilities(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, bytes(7)

    def _jdwp_capabilities_new(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, bytes(32)

    def _jdwp_class_paths(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, _jstr("/") + _S4.pack(0) + _S4.pack(0)

    def _jdwp_all_classes(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, _class_list(generic=False)

    def _jdwp_all_classes_with_generic(
        self, conn: JdwpConnection, data: bytes
    ) -> tuple[int, bytes]:
        return 0, _class_list(generic=True)

    def _jdwp_classes_by_signature(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        (size,) = _U4.unpack_from(data)
        wanted = data[4 : 4 + size].decode("utf-8", "replace")
        found = [
            bytes((_TYPE_TAG_CLASS,)) + _U8.pack(type_id) + _S4.pack(_CLASS_STATUS)
            for type_id, signature in _CLASS_SIGNATURES.items()
            if signature == wanted
        ]
        return 0, _S4.pack(len(found)) + b"".join(found)

    def _jdwp_all_threads(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        ids = [_U8.pack(t.object_id) for t in self._threads.by_id.values()]
        return 0, _S4.pack(len(ids)) + b"".join(ids)

    def _jdwp_top_groups(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        return 0, _S4.pack(1) + _U8.pack(_GROUP_ID)

    def _jdwp_dispose(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        conn.close_after_reply = True  # OpenJDK's agent replies, then closes the connection
        return 0, b""

    def _jdwp_exit(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        raise Halt(_S4.unpack_from(data)[0])

    def _jdwp_vm_suspend(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        conn.suspend_count += 1
        return 0, b""

    def _jdwp_vm_resume(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        conn.suspend_count = max(0, conn.suspend_count - 1)
        return 0, b""

    def _jdwp_signature(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        signature = _CLASS_SIGNATURES.get(_U8.unpack_from(data)[0])
        if signature is None:
            return ErrorCode.INVALID_CLASS, b""
        return 0, _jstr(signature)

    def _jdwp_signature_with_generic(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        error, body = self._jdwp_signature(conn, data)
        if error:
            return error, b""
        return 0, body + _jstr("")  # signature, then an empty generic signature

    def _jdwp_object_reference_type(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        (object_id,) = _U8.unpack_from(data)
        if object_id == _GROUP_ID:
            return 0, bytes((_TYPE_TAG_CLASS,)) + _U8.pack(_GROUP_CLASS_ID)
        if object_id in self._threads.by_object:
            return 0, bytes((_TYPE_TAG_CLASS,)) + _U8.pack(_THREAD_CLASS_ID)
        return ErrorCode.INVALID_OBJECT, b""

    def _jdwp_thread_name(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _jstr(thread.name)

    def _jdwp_thread_suspend(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        thread.suspend_count += 1
        return 0, b""

    def _jdwp_thread_resume(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        thread.suspend_count = max(0, thread.suspend_count - 1)
        return 0, b""

    def _jdwp_thread_status(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        self._threads.evolve(self._clock())
        status = _JDWP_THREAD_STATUS.get(thread.status, 1)
        suspended = 1 if thread.suspend_count or conn.suspend_count or thread.status == 9 else 0
        return 0, _S4.pack(status) + _S4.pack(suspended)

    def _jdwp_thread_group(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _U8.pack(_GROUP_ID)

    def _jdwp_thread_frames(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(0)

    def _jdwp_thread_frame_count(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if self._thread_of(data) is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(0)

    def _jdwp_thread_suspend_count(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        thread = self._thread_of(data)
        if thread is None:
            return ErrorCode.INVALID_THREAD, b""
        return 0, _S4.pack(thread.suspend_count + conn.suspend_count)

    def _check_group(self, data: bytes) -> bool:
        return bool(_U8.unpack_from(data)[0] == _GROUP_ID)

    def _jdwp_group_name(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        return 0, _jstr("main")

    def _jdwp_group_parent(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        return 0, _U8.pack(0)

    def _jdwp_group_children(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        if not self._check_group(data):
            return ErrorCode.INVALID_THREAD_GROUP, b""
        ids = [_U8.pack(t.object_id) for t in self._threads.by_id.values()]
        return 0, _S4.pack(len(ids)) + b"".join(ids) + _S4.pack(0)

    def _jdwp_event_set(self, conn: JdwpConnection, data: bytes) -> tuple[int, bytes]:
        request_id = conn.next_request_id
        conn.next_request_id += 1
        return 0, _S4.pack(request_id)


def _class_list(*, generic: bool) -> bytes:
    parts = [_S4.pack(len(_CLASS_SIGNATURES))]
    for type_id, signature in _CLASS_SIGNATURES.items():
        parts.append(bytes((_TYPE_TAG_CLASS,)) + _U8.pack(type_id) + _jstr(signature))
        if generic:
            parts.append(_jstr(""))
        parts.append(_S4.pack(_CLASS_STATUS))
    return b"".join(parts)


def _jstr(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return _U4.pack(len(raw)) + raw
