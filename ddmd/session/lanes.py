"""Which debugger commands stay off the fast lane, and why: the one table (issue 21).

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

A debugger's command takes the fast lane (``Router.relay_from_debugger``: its id rewritten, its
bytes written to the VM, nothing decoded) unless a rule here must answer or read it. Every
command that must be seen is one entry of ``SLOW_LANE``, with the rule's reason and who applies
it: ``intake`` (answered or cached in ``intake.py``/``router.py``), ``bridge`` (the per-debugger
rules of ``bridge.py``: ``BRIDGED`` is made from this table) or ``ddm`` (the DDM sharing rules of
``ddmshare.py``). Everything else, AllThreads, AllClasses(WithGeneric), ClassesBySignature,
TopLevelThreadGroups, ClassPaths, Capabilities(New), CreateString, InstanceCounts included,
passes through on the fast lane, and so does its reply (``Router.relay_from_vm``) unless the
router reads it (``READ_REPLIES``, or an id the bridge watches).

A command of ``None`` stands for every command of its set. An entry with ``several`` set matters
only while several debuggers are attached (what one debugger sees of threads others hold): with
one debugger it takes the fast lane too. An entry with ``recorded`` set (VM.Suspend and
VM.Resume) is seen by its rule either way: with several debuggers on the slow lane, where the
bridge decides what the VM is told; with one, whose command is exactly what the VM would have
been told without ddmd in between, on the fast lane, and the bridge records it in the ledger
right after the write (``Bridge.lane_record``), so that a second debugger, or this one leaving,
finds the ledger as the slow lane would have left it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NamedTuple

from ddmd.protocol.jdwp import CommandSet, VirtualMachineCommand

__all__ = [
    "BRIDGE",
    "DDM",
    "INTAKE",
    "OFF_LANE",
    "READ_REPLIES",
    "RECORDED",
    "SHARED",
    "SHARED_KEYS",
    "SLOW",
    "SLOW_KEYS",
    "SLOW_LANE",
    "SLOW_SETS",
    "Rule",
    "keys_of",
]

INTAKE: Final = "intake"
BRIDGE: Final = "bridge"
DDM: Final = "ddm"


class Rule(NamedTuple):
    """Why a command stays on the slow lane, and who applies the rule."""

    why: str
    by: str
    several: bool = False  # slow only while several debuggers are attached
    recorded: bool = False  # with one debugger: fast, and recorded by the bridge (``several``)


_VM = CommandSet.VIRTUAL_MACHINE
_THREAD = CommandSet.THREAD_REFERENCE
_FRAME = CommandSet.STACK_FRAME
_REQUEST = CommandSet.EVENT_REQUEST
_V = VirtualMachineCommand

_NEEDS_SUSPENDED = "answered THREAD_NOT_SUSPENDED for a thread only other debuggers hold (issue 11)"

#: (command set, command) -> the rule that must see it. The only list of slow-lane commands.
SLOW_LANE: Final[Mapping[tuple[int, int | None], Rule]] = MappingProxyType(
    {
        # VirtualMachine
        (_VM, _V.VERSION): Rule(
            "answered from the cache; the first reply is read to fill it", INTAKE
        ),
        (_VM, _V.DISPOSE): Rule(
            "answered here: the release procedure, not the VM, drops a debugger's state", INTAKE
        ),
        (_VM, _V.ID_SIZES): Rule(
            "answered from the cache; the first reply is read to fill it (the bridge decodes "
            "thread ids and events with the sizes)",
            INTAKE,
        ),
        (_VM, _V.SUSPEND): Rule(
            "the suspension ledger records who holds the VM (one debugger: recorded after the "
            "write)",
            BRIDGE,
            several=True,
            recorded=True,
        ),
        (_VM, _V.RESUME): Rule(
            "the suspension ledger: the VM resumes when no debugger holds it any more (one "
            "debugger: its Resume is the release, recorded after the write)",
            BRIDGE,
            several=True,
            recorded=True,
        ),
        (_VM, _V.EXIT): Rule("ends every debugger's session: logged, louder with others", BRIDGE),
        (_VM, _V.HOLD_EVENTS): Rule("per debugger: answered here, its events queued", BRIDGE),
        (_VM, _V.RELEASE_EVENTS): Rule(
            "per debugger: answered here, its queued events delivered", BRIDGE
        ),
        # ThreadReference
        (_THREAD, 2): Rule("Suspend: the suspension ledger records who holds the thread", BRIDGE),
        (_THREAD, 3): Rule("Resume: the ledger; the VM is told when nobody holds it", BRIDGE),
        (_THREAD, 12): Rule("SuspendCount: the sender's own count, as if it were alone", BRIDGE),
        (_THREAD, 4): Rule(
            "Status: a thread only other debuggers hold is shown running", BRIDGE, several=True
        ),
        (_THREAD, 6): Rule(f"Frames: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_THREAD, 7): Rule(f"FrameCount: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_THREAD, 8): Rule(f"OwnedMonitors: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_THREAD, 9): Rule(f"CurrentContendedMonitor: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_THREAD, 13): Rule(
            f"OwnedMonitorsStackDepthInfo: {_NEEDS_SUSPENDED}", BRIDGE, several=True
        ),
        # ObjectReference
        (CommandSet.OBJECT_REFERENCE, 7): Rule(
            "DisableCollection: the sender's pins are counted, re-enabled when it leaves", BRIDGE
        ),
        (CommandSet.OBJECT_REFERENCE, 8): Rule(
            "EnableCollection: lowers the sender's count of pins", BRIDGE
        ),
        # StackFrame
        (_FRAME, 1): Rule(f"GetValues: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_FRAME, 2): Rule(f"SetValues: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_FRAME, 3): Rule(f"ThisObject: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        (_FRAME, 4): Rule(f"PopFrames: {_NEEDS_SUSPENDED}", BRIDGE, several=True),
        # EventRequest
        (_REQUEST, 1): Rule("Set: the reply's requestID is owned by the sender", BRIDGE),
        (_REQUEST, 2): Rule("Clear: only the sender's own requests reach the VM", BRIDGE),
        (_REQUEST, 3): Rule(
            "ClearAllBreakpoints: becomes a Clear of each of the sender's breakpoints", BRIDGE
        ),
        # DDM, every command of the set
        (CommandSet.DDM, None): Rule(
            "DDM requests are shared between consumers: answered here or relayed with a "
            "deadline (ddmshare)",
            DDM,
        ),
    }
)


def keys_of(
    by: str | None = None, *, several: bool | None = None, recorded: bool | None = None
) -> frozenset[int]:
    """The ``(set << 8) | command`` keys of the table's single-command entries, of one ``by``,
    ``several`` and ``recorded`` when given."""
    return frozenset(
        (cs << 8) | c
        for (cs, c), rule in SLOW_LANE.items()
        if c is not None
        and (by is None or rule.by == by)
        and (several is None or rule.several == several)
        and (recorded is None or rule.recorded == recorded)
    )


#: Keys that always stay off the fast lane, those that do only with several debuggers, and of
#: those the ones the bridge records when they take it.
SLOW_KEYS: Final = keys_of(several=False)
SHARED_KEYS: Final = keys_of(several=True)
RECORDED_KEYS: Final = keys_of(recorded=True)
#: Command sets that stay off the fast lane whole.
SLOW_SETS: Final = frozenset(cs for (cs, c) in SLOW_LANE if c is None)

#: ``OFF_LANE``'s values: always off the fast lane; off it only while several debuggers are
#: attached; the same, and recorded by the bridge when it takes the fast lane.
SLOW: Final = 0
SHARED: Final = 1
RECORDED: Final = 2

#: The keys above as one lookup for the relay lane, per ``(set << 8) | command`` key; a key
#: that is not in it takes the fast lane.
OFF_LANE: Final[Mapping[int, int]] = MappingProxyType(
    {(cs << 8) | c: SLOW for cs in SLOW_SETS for c in range(256)}
    | dict.fromkeys(SLOW_KEYS, SLOW)
    | dict.fromkeys(SHARED_KEYS, SHARED)
    | dict.fromkeys(RECORDED_KEYS, RECORDED)
)

#: Replies to a debugger's command that the router reads (the caches), so never fast-laned.
READ_REPLIES: Final = frozenset({(_VM << 8) | _V.ID_SIZES, (_VM << 8) | _V.VERSION})
