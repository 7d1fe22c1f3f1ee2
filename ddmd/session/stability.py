"""How long a JDWP reply stays true, and which commands end that: the two tables foresight uses.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

``STABILITY`` gives every read-only command ddmd may answer from its store (``foresight.py``) or
ask on its own, with its validity class and the reason (docs: jdwp-stability); a command not in
it is never stored, never answered locally and never speculated. ``ENDS`` lists the commands that
end the validity of everything suspension-scoped (and object-immutable) for every debugger of
the VM, with the reason; ``REDEFINES`` those that also end method data. No command is in both:
only read-only commands are ever stored.

Validity classes, and what ends each (``foresight.Foresight`` applies them):

- ``VM_CONSTANT``: the connection ends (a new one starts from nothing).
- ``CLASS_STRUCTURE``: a ClassUnload event (ddmd holds its own CLASS_UNLOAD request), a
  RedefineClasses (conservatively: ``canUnrestrictedlyRedefineClasses`` may change structure),
  the last debugger leaving (an agent may redefine structurally with nobody attached: ART's
  structural redefinition), a new connection.
- ``METHOD_DATA``: the same (RedefineClasses changes it; an agent's redefinition while no
  debugger is attached never shows on JDWP).
- ``OBJECT_IMMUTABLE``: conservatively, as suspension-scoped under suspend policy ALL only (the
  object may be collected between stops, and the VM would then answer INVALID_OBJECT).
- ``SUSPENSION``: within one suspension: any event ends it, and any command of ``ENDS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import Final, NamedTuple

from ddmd.protocol.jdwp import CommandSet, VirtualMachineCommand

__all__ = [
    "CACHEABLE_KEYS",
    "ENDING_KEYS",
    "ENDS",
    "FRAME_KEYS",
    "REDEFINES",
    "STABILITY",
    "Stable",
    "Validity",
]


class Validity(IntEnum):
    VM_CONSTANT = 1
    CLASS_STRUCTURE = 2
    METHOD_DATA = 3
    OBJECT_IMMUTABLE = 4
    SUSPENSION = 5


class Stable(NamedTuple):
    validity: Validity
    why: str


_VM = CommandSet.VIRTUAL_MACHINE
_RT = CommandSet.REFERENCE_TYPE
_CT = CommandSet.CLASS_TYPE
_M = CommandSet.METHOD
_OR = CommandSet.OBJECT_REFERENCE
_SR = CommandSet.STRING_REFERENCE
_TR = CommandSet.THREAD_REFERENCE
_TGR = CommandSet.THREAD_GROUP_REFERENCE
_AR = CommandSet.ARRAY_REFERENCE
_SF = CommandSet.STACK_FRAME
_COR = CommandSet.CLASS_OBJECT_REFERENCE
_MOD = CommandSet.MODULE_REFERENCE
_V = VirtualMachineCommand

_CONST = Validity.VM_CONSTANT
_CLASS = Validity.CLASS_STRUCTURE
_METHOD = Validity.METHOD_DATA
_OBJECT = Validity.OBJECT_IMMUTABLE
_SUSP = Validity.SUSPENSION

_UNLOAD = "fixed for a class until it unloads (ids are never reused on one connection)"
_REDEF = "fixed for a class until it is redefined or unloads"
_STOPPED = "no Java code runs while the VM is suspended by the debugger"
_FRAMES = "the thread's stack cannot change while it is suspended (its frame ids end with it)"

#: (command set, command) -> validity class and reason. The only list of storable commands.
STABILITY: Final[Mapping[tuple[int, int], Stable]] = MappingProxyType(
    {
        # VM constants (VM.Version and IDSizes are cached by the router already)
        (_VM, _V.CAPABILITIES): Stable(_CONST, "what the VM can do is fixed at its start"),
        (_VM, _V.CAPABILITIES_NEW): Stable(_CONST, "what the VM can do is fixed at its start"),
        (_VM, _V.CLASS_PATHS): Stable(_CONST, "the class paths are fixed at the VM's start"),
        (_MOD, 1): Stable(_CONST, "Module.Name: a module's name never changes"),
        (_MOD, 2): Stable(_CONST, "Module.ClassLoader: a module's loader never changes"),
        # class structure
        (_RT, 1): Stable(_CLASS, f"Signature: {_UNLOAD}"),
        (_RT, 13): Stable(_CLASS, f"SignatureWithGeneric: {_UNLOAD}"),
        (_RT, 2): Stable(_CLASS, f"ClassLoader: {_UNLOAD}"),
        (_RT, 3): Stable(_CLASS, f"Modifiers: {_UNLOAD}"),
        (_RT, 4): Stable(_CLASS, f"Fields: {_UNLOAD}"),
        (_RT, 14): Stable(_CLASS, f"FieldsWithGeneric: {_UNLOAD}"),
        (_RT, 10): Stable(_CLASS, f"Interfaces: {_UNLOAD}"),
        (_RT, 11): Stable(_CLASS, f"ClassObject: {_UNLOAD}"),
        (_RT, 19): Stable(_CLASS, f"Module: {_UNLOAD}"),
        (_CT, 1): Stable(_CLASS, f"Superclass: {_UNLOAD}"),
        (_COR, 1): Stable(_CLASS, f"ReflectedType: {_UNLOAD}"),
        # method data
        (_RT, 5): Stable(_METHOD, f"Methods: {_REDEF}"),
        (_RT, 15): Stable(_METHOD, f"MethodsWithGeneric: {_REDEF}"),
        (_RT, 7): Stable(_METHOD, f"SourceFile: {_REDEF}"),
        (_RT, 12): Stable(_METHOD, f"SourceDebugExtension: {_REDEF}"),
        (_RT, 17): Stable(_METHOD, f"ClassFileVersion: {_REDEF}"),
        (_RT, 18): Stable(_METHOD, f"ConstantPool: {_REDEF}"),
        (_M, 1): Stable(_METHOD, f"LineTable: {_REDEF}"),
        (_M, 2): Stable(_METHOD, f"VariableTable: {_REDEF}"),
        (_M, 5): Stable(_METHOD, f"VariableTableWithGeneric: {_REDEF}"),
        (_M, 3): Stable(_METHOD, f"Bytecodes: {_REDEF}"),
        # object-immutable
        (_SR, 1): Stable(
            _OBJECT,
            "StringReference.Value: a string never changes; it may be collected between stops",
        ),
        (_AR, 1): Stable(_OBJECT, "ArrayReference.Length: fixed; the array may be collected"),
        (_OR, 1): Stable(
            _OBJECT, "ObjectReference.ReferenceType: fixed; the object may be collected"
        ),
        # suspension-scoped
        (_VM, _V.ALL_THREADS): Stable(_SUSP, f"AllThreads: {_STOPPED} (none starts or ends)"),
        (_TR, 1): Stable(_SUSP, f"Name: {_STOPPED} (setName is Java code)"),
        (_TR, 4): Stable(_SUSP, f"Status: {_STOPPED}"),
        (_TR, 5): Stable(_SUSP, f"ThreadGroup: {_STOPPED}"),
        (_TR, 6): Stable(_SUSP, f"Frames: {_FRAMES}"),
        (_TR, 7): Stable(_SUSP, f"FrameCount: {_FRAMES}"),
        (_TR, 8): Stable(_SUSP, f"OwnedMonitors: {_STOPPED}"),
        (_TR, 9): Stable(_SUSP, f"CurrentContendedMonitor: {_STOPPED}"),
        (_TR, 13): Stable(_SUSP, f"OwnedMonitorsStackDepthInfo: {_STOPPED}"),
        (_SF, 1): Stable(_SUSP, f"StackFrame.GetValues: {_FRAMES}"),
        (_SF, 3): Stable(_SUSP, f"StackFrame.ThisObject: {_FRAMES}"),
        (_OR, 2): Stable(_SUSP, f"ObjectReference.GetValues: {_STOPPED}"),
        (_OR, 5): Stable(_SUSP, f"MonitorInfo: {_STOPPED}"),
        (_OR, 9): Stable(_SUSP, f"IsCollected: {_STOPPED}"),
        (_AR, 2): Stable(_SUSP, f"ArrayReference.GetValues: {_STOPPED}"),
        (_RT, 6): Stable(_SUSP, f"ReferenceType.GetValues (statics): {_STOPPED}"),
        (_RT, 9): Stable(_SUSP, f"ReferenceType.Status: {_STOPPED} (nothing initializes)"),
        (_TGR, 1): Stable(_SUSP, f"ThreadGroup.Name: {_STOPPED}"),
        (_TGR, 2): Stable(_SUSP, f"ThreadGroup.Parent: {_STOPPED}"),
        (_TGR, 3): Stable(_SUSP, f"ThreadGroup.Children: {_STOPPED}"),
    }
)

_RUNS = "lets Java code run"

#: (command set, command) -> why it ends the validity of every suspension-scoped reply, for every
#: debugger, before it reaches the VM.
ENDS: Final[Mapping[tuple[int, int], str]] = MappingProxyType(
    {
        (_VM, _V.SUSPEND): "suspend counts and thread statuses change",
        (_VM, _V.RESUME): f"{_RUNS}; every frame id ends",
        (_VM, _V.EXIT): "the VM ends",
        (_VM, _V.DISPOSE_OBJECTS): "object ids may be freed and reused",
        (_VM, _V.REDEFINE_CLASSES): "methods, frames' code and values change",
        (_VM, _V.CREATE_STRING): "allocates (a collection may run)",
        (_TR, 2): "ThreadReference.Suspend: a suspend count and status change",
        (_TR, 3): f"ThreadReference.Resume: {_RUNS}; the thread's frame ids end",
        (_TR, 10): "ThreadReference.Stop: throws into the thread, its stack changes",
        (_TR, 11): "ThreadReference.Interrupt: the thread's state changes",
        (_TR, 14): "ThreadReference.ForceEarlyReturn: the thread's stack changes",
        (_CT, 2): "ClassType.SetValues: static values change",
        (_CT, 3): f"ClassType.InvokeMethod: {_RUNS}",
        (_CT, 4): f"ClassType.NewInstance: {_RUNS}",
        (CommandSet.INTERFACE_TYPE, 1): f"InterfaceType.InvokeMethod: {_RUNS}",
        (CommandSet.ARRAY_TYPE, 1): "ArrayType.NewInstance: allocates (a collection may run)",
        (_OR, 3): "ObjectReference.SetValues: field values change",
        (_OR, 6): f"ObjectReference.InvokeMethod: {_RUNS}",
        (_OR, 8): "ObjectReference.EnableCollection: the object may be collected",
        (_AR, 3): "ArrayReference.SetValues: array values change",
        (_SF, 2): "StackFrame.SetValues: local values change",
        (_SF, 4): "StackFrame.PopFrames: the thread's stack changes",
    }
)

#: Of ``ENDS``, the commands that also end method data and class structure.
REDEFINES: Final = frozenset({(_VM << 8) | _V.REDEFINE_CLASSES})

#: ``(set << 8) | command`` keys of the two tables, for the router's off-lane set.
CACHEABLE_KEYS: Final = frozenset((cs << 8) | c for cs, c in STABILITY)
ENDING_KEYS: Final = frozenset((cs << 8) | c for cs, c in ENDS)

#: Suspension-scoped commands about one thread's stack (thread id first): under suspend policy
#: EVENT_THREAD, the only suspension-scoped ones that may be served, and only for that thread.
FRAME_KEYS: Final = frozenset({(_TR << 8) | 6, (_TR << 8) | 7, (_SF << 8) | 1, (_SF << 8) | 3})
