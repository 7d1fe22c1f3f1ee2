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
    "MAX_SUPERS",
    "MAX_VALUES",
    "METHOD_DATA",
    "PLAN",
    "SUPER_DATA",
    "Frame",
    "jdi_visible_slots",
    "read_frames",
    "read_threads",
    "read_values",
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
        (9, 1): Step(
            "the ThisObject reply; objects in a GetValues reply",
            "ReferenceType of `this` and of each object shown: JDI mirrors its type",
        ),
        (9, 2): Step(
            "the ReferenceType reply of `this`, with the fields a debugger read of an object of "
            "that class at an earlier stop",
            "GetValues of `this`: an IDE's variables view shows its fields",
        ),
        (10, 1): Step("a string in a GetValues reply", "StringReference.Value: the string shown"),
        (13, 1): Step("an array in a GetValues reply", "ArrayReference.Length: the array shown"),
        (2, 7): Step("the Frames reply (new class)", "SourceFile: every frame's location"),
        (2, 12): Step("the Frames reply (new class)", "SourceDebugExtension: JDI's strata"),
        (2, 15): Step("the Frames reply (new class)", "MethodsWithGeneric: JDI's method mirrors"),
        (2, 13): Step(
            "the Frames reply (new class); the ReferenceType reply of an object shown",
            "SignatureWithGeneric: the class's name (a value's type name)",
        ),
        (2, 14): Step("the Frames reply (new class)", "FieldsWithGeneric: `this`'s fields"),
        (2, 10): Step("the Frames reply (new class)", "Interfaces: JDI's type mirrors"),
        (3, 1): Step(
            "the Frames reply (new class); the class of `this`; a Superclass reply",
            "Superclass: JDI's type mirrors, and allFields() walks up the superclasses",
        ),
        (6, 1): Step("the Frames reply (new method)", "LineTable: a frame's line number"),
        (6, 5): Step("the Frames reply (new method)", "VariableTableWithGeneric: locals"),
    }
)

#: Class data asked once per class met in a Frames reply, and method data once per method.
CLASS_DATA: Final = ((2, 7), (2, 12), (2, 15), (2, 13), (2, 14), (2, 10))
METHOD_DATA: Final = ((6, 1), (6, 5))
#: What JDI's allFields() and a type's name need of each superclass.
SUPER_DATA: Final = ((2, 13), (2, 14), (2, 10))
MAX_SUPERS: Final = 8  # superclasses followed up from a class
MAX_VALUES: Final = 32  # objects of one GetValues reply whose type (and text) are asked

#: The size of a tagged value's data after its tag, by tag (JDWP's tag bytes); object tags: None
#: (an object id).
_SIZES: Final = {
    ord("B"): 1, ord("Z"): 1, ord("C"): 2, ord("S"): 2, ord("I"): 4, ord("F"): 4,
    ord("J"): 8, ord("D"): 8, ord("V"): 0,
}  # fmt: skip
_OBJECT_TAGS: Final = frozenset(map(ord, "L[stglc"))

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


def read_values(data: bytes, sizes: IdSizes) -> list[tuple[int, bytes]]:
    """The objects (tag, id) of a StackFrame.GetValues or ObjectReference.GetValues reply (a
    count, then tagged values), null ones left out."""
    n, at, size = _int(data, 0), 4, sizes.object_id
    objects = []
    for _ in range(max(n, 0)):
        if at >= len(data):
            raise ProtocolError("values cut short")
        tag = data[at]
        if tag in _OBJECT_TAGS:
            obj = data[at + 1 : at + 1 + size]
            if len(obj) < size:
                raise ProtocolError("values cut short")
            if any(obj):
                objects.append((tag, obj))
            at += 1 + size
        elif tag in _SIZES:
            at += 1 + _SIZES[tag]
        else:
            raise ProtocolError(f"unknown value tag {tag}")
    return objects


def _string(data: bytes, offset: int) -> tuple[str, int]:
    n = _int(data, offset)
    end = offset + 4 + n
    if n < 0 or end > len(data):
        raise ProtocolError("string cut short")
    return data[offset + 4 : end].decode("utf-8", "replace"), end


def jdi_visible_slots(data: bytes, index: int, *, generic: bool = True) -> bytes:
    """The slot list (count, then slot and signature tag each) JDI's
    ``frame.getValues(frame.visibleVariables())`` sends for a frame at code ``index``, from the
    method's VariableTable(WithGeneric) reply: ``this`` and ``this$*`` left out, the variables
    whose scope covers ``index``, an inner one hiding an outer one of the same name, sorted by
    slot (``visibleVariables()`` sorts them: a LocalVariable compares by method, then slot)."""
    count = _int(data, 4)
    at = 8
    seen: dict[str, tuple[int, int, int]] = {}  # name -> (start, slot, tag)
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
        if not start <= index <= start + length - 1:
            continue
        old = seen.get(name)
        tag = ord(signature[0]) if signature else ord("V")
        if old is None or start > old[0]:
            seen[name] = (start, slot, tag)
    chosen = sorted(seen.values(), key=lambda v: v[1])
    return _INT.pack(len(chosen)) + b"".join(
        _INT.pack(slot) + bytes((tag,)) for _, slot, tag in chosen
    )
