"""What ddmd asks the VM on its own at a stop, and how the commands' bytes are made: the plan of
speculation (``foresight.py``), as one table, and the readers of the replies it follows.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

A speculative command is worth sending only when a debugger will send the very same bytes: the
store is keyed by the command's bytes. Each entry of ``PLAN`` says what is asked, from which
reply, and why a real client asks exactly that (recorded through ddmd, HotSpot 17: jdb and a
JDI client of an IDE's shape). The arguments that vary between clients (the range of
ThreadReference.Frames) are learned from what debuggers asked at earlier stops
(``Foresight.shapes``); the slot list of StackFrame.GetValues is computed as JDI computes it
(``jdi_visible_slots``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import IdSizes

__all__ = [
    "CLASS_DATA",
    "METHOD_DATA",
    "PLAN",
    "Frame",
    "jdi_visible_slots",
    "read_frames",
    "read_threads",
]


class Step(NamedTuple):
    after: str  # what it follows: a suspending event, or the reply of an earlier step
    why: str


#: The plan: (command set, command) -> when it is asked and why. The only list of what ddmd asks
#: on its own at a stop.
PLAN: Final[Mapping[tuple[int, int], Step]] = MappingProxyType(
    {
        (1, 4): Step("a composite suspending ALL", "AllThreads: JDI's allThreads() at every stop"),
        (11, 4): Step("the AllThreads reply (ALL)", "Status of every thread: a thread view"),
        (11, 1): Step("the AllThreads reply (ALL)", "Name of every thread: a thread view"),
        (11, 7): Step("a suspending composite", "FrameCount of the event thread (jdb, IDEs)"),
        (11, 6): Step(
            "a suspending composite",
            "Frames of the event thread, in each (start, length) debuggers asked before "
            "((0, -1) first: JDI's frames())",
        ),
        (16, 3): Step("the Frames reply", "ThisObject of frame 0: an IDE's variables view"),
        (16, 1): Step(
            "the Frames reply, with frame 0's VariableTableWithGeneric",
            "GetValues of frame 0's visible variables, in JDI's visibleVariables() order",
        ),
        (9, 1): Step("the ThisObject reply", "ReferenceType of `this`: JDI mirrors it"),
        (2, 7): Step("the Frames reply (new class)", "SourceFile: every frame's location"),
        (2, 12): Step("the Frames reply (new class)", "SourceDebugExtension: JDI's strata"),
        (2, 15): Step("the Frames reply (new class)", "MethodsWithGeneric: JDI's method mirrors"),
        (2, 13): Step("the Frames reply (new class)", "SignatureWithGeneric: the class's name"),
        (2, 14): Step("the Frames reply (new class)", "FieldsWithGeneric: `this`'s fields"),
        (2, 10): Step("the Frames reply (new class)", "Interfaces: JDI's type mirrors"),
        (3, 1): Step("the Frames reply (new class)", "Superclass: JDI's type mirrors"),
        (6, 1): Step("the Frames reply (new method)", "LineTable: a frame's line number"),
        (6, 5): Step("the Frames reply (new method)", "VariableTableWithGeneric: locals"),
    }
)

#: Class data asked once per class met in a Frames reply, and method data once per method.
CLASS_DATA: Final = ((2, 7), (2, 12), (2, 15), (2, 13), (2, 14), (2, 10))
METHOD_DATA: Final = ((6, 1), (6, 5))

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")


class Frame(NamedTuple):
    frame_id: bytes  # as the VM wrote it
    type_tag: int
    class_id: bytes
    method_id: bytes
    code_index: int


def _int(data: bytes, offset: int) -> int:
    if offset + 4 > len(data):
        raise ProtocolError("reply cut short")
    return int(_INT.unpack_from(data, offset)[0])


def read_threads(data: bytes, sizes: IdSizes) -> list[bytes]:
    """The thread ids of an AllThreads reply, as bytes."""
    n, size = _int(data, 0), sizes.object_id
    if n < 0 or 4 + n * size > len(data):
        raise ProtocolError("AllThreads reply cut short")
    return [data[4 + i * size : 4 + (i + 1) * size] for i in range(n)]


def read_frames(data: bytes, sizes: IdSizes) -> list[Frame]:
    """The frames of a ThreadReference.Frames reply."""
    n = _int(data, 0)
    f, r, m = sizes.frame_id, sizes.reference_type_id, sizes.method_id
    step = f + 1 + r + m + 8
    if n < 0 or 4 + n * step > len(data):
        raise ProtocolError("Frames reply cut short")
    frames = []
    for i in range(n):
        at = 4 + i * step
        tag = data[at + f]
        cls = data[at + f + 1 : at + f + 1 + r]
        method = data[at + f + 1 + r : at + f + 1 + r + m]
        index = int(_LONG.unpack_from(data, at + f + 1 + r + m)[0])
        frames.append(Frame(data[at : at + f], tag, cls, method, index))
    return frames


def _string(data: bytes, offset: int) -> tuple[str, int]:
    n = _int(data, offset)
    end = offset + 4 + n
    if n < 0 or end > len(data):
        raise ProtocolError("string cut short")
    return data[offset + 4 : end].decode("utf-8", "replace"), end


def _java_hash(name: str) -> int:
    h = 0
    for unit in name.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h ^ (h >> 16)


def jdi_visible_slots(data: bytes, index: int, *, generic: bool = True) -> bytes:
    """The slot list (count, then slot and signature tag each) JDI's
    ``frame.getValues(frame.visibleVariables())`` sends for a frame at code ``index``, from the
    method's VariableTable(WithGeneric) reply: ``this`` and ``this$*`` left out, the variables
    whose scope covers ``index``, an inner one hiding an outer one of the same name, in the
    order of the ``java.util.HashMap`` JDI collects them in (bucket, then first insertion)."""
    count = _int(data, 4)
    at = 8
    seen: dict[str, tuple[int, int, int, int]] = {}  # name -> (order, start, slot, tag)
    total = 0
    for _ in range(count):
        if at + 8 > len(data):
            raise ProtocolError("VariableTable reply cut short")
        start = int(_LONG.unpack_from(data, at)[0])
        name, at = _string(data, at + 8)
        signature, at = _string(data, at)
        if generic:
            _, at = _string(data, at)
        length, slot = _int(data, at), _int(data, at + 4)
        at += 8
        if name == "this" or name.startswith("this$"):
            continue
        total += 1
        if not start <= index <= start + length - 1:
            continue
        old = seen.get(name)
        tag = ord(signature[0]) if signature else ord("V")
        if old is None:
            seen[name] = (len(seen), start, slot, tag)
        elif start > old[1]:
            seen[name] = (old[0], start, slot, tag)
    capacity = 1
    while capacity < total:
        capacity <<= 1
    for size in range(1, len(seen) + 1):
        if size > int(capacity * 0.75):
            capacity <<= 1
    order = sorted(seen, key=lambda n: (_java_hash(n) & (capacity - 1), seen[n][0]))
    return _INT.pack(len(order)) + b"".join(
        _INT.pack(seen[n][2]) + bytes((seen[n][3],)) for n in order
    )
