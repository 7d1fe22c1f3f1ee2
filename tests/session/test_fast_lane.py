"""The fast lane (issue 21, item 1): which debugger commands a rule must see, rule by rule.

``lanes.SLOW_LANE`` is the one table of commands that stay off the fast lane. Each entry has a
Playbook here (``PLAYBOOKS`` maps every entry to its test, and a test checks the two agree):
the command is not taken by ``Router.relay_from_debugger`` (the lane's decision), and
``debugger_data`` applies its rule. Every other command, AllThreads first, takes the fast lane
both ways.

``Laned.handle`` feeds the router the way the driver does: the fast lane first
(``relay_from_debugger``/``relay_from_vm``, committed at once: ``tests/session/relaying.py``),
the general path when it says None; each input of
bytes is followed in the transcript by ``FAST`` or ``SLOW``, the lane that took it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from ddmd.protocol.ddm import HeloRequest, ddm_command
from ddmd.protocol.jdwp import (
    HANDSHAKE,
    CommandSet,
    VirtualMachineCommand,
    encode,
)
from ddmd.session import lanes
from ddmd.session.bridge import BRIDGED, SHARED_VIEW
from ddmd.session.commands import CloseDebugger, Command, Log, SendToDebugger, SendToVm
from ddmd.session.inputs import (
    ConsumerBytes,
    ConsumerJoined,
    ConsumerLeft,
    VmBytes,
    VmConnected,
)
from ddmd.session.lanes import (
    OFF_LANE,
    READ_REPLIES,
    RECORDED_KEYS,
    SHARED_KEYS,
    SLOW_KEYS,
    SLOW_LANE,
    SLOW_SETS,
    keys_of,
)
from tests.session.playbook import Playbook
from tests.session.relaying import lane_from_debugger, lane_from_vm
from tests.session.test_bridge import (
    ALL,
    NONE,
    SIZES,
    T1,
    Bridged,
    bp,
    clear,
    cmd,
    composite,
    int4,
    reply,
    set_bp,
    tid,
)

V = VirtualMachineCommand
VM = CommandSet.VIRTUAL_MACHINE
VERSION = (VM, V.VERSION)
DISPOSE = (VM, V.DISPOSE)
ID_SIZES = (VM, V.ID_SIZES)
SUSPEND = (VM, V.SUSPEND)
RESUME = (VM, V.RESUME)
EXIT = (VM, V.EXIT)
HOLD = (VM, V.HOLD_EVENTS)
RELEASE = (VM, V.RELEASE_EVENTS)
ALL_THREADS = (VM, V.ALL_THREADS)
CLASSES_BY_SIGNATURE = (VM, V.CLASSES_BY_SIGNATURE)
TOP_LEVEL_THREAD_GROUPS = (VM, V.TOP_LEVEL_THREAD_GROUPS)
CAPABILITIES_NEW = (VM, V.CAPABILITIES_NEW)
THREAD = CommandSet.THREAD_REFERENCE
T_SUSPEND, T_RESUME, T_COUNT = (THREAD, 2), (THREAD, 3), (THREAD, 12)
REQUEST = CommandSet.EVENT_REQUEST
SET, CLEAR, CLEAR_BREAKPOINTS = (REQUEST, 1), (REQUEST, 2), (REQUEST, 3)
BREAKPOINT = 2
OBJECT = CommandSet.OBJECT_REFERENCE
DISABLE_COLLECTION, ENABLE_COLLECTION = (OBJECT, 7), (OBJECT, 8)
O1 = 0x77


@dataclass(frozen=True)
class Lane:
    """Which lane took an input of bytes (a marker in the transcript, not a command)."""

    name: str


FAST, SLOW = Lane("fast"), Lane("slow")


class Laned(Bridged):
    """A router fed the way the driver feeds it: the fast lane first."""

    def handle(self, item: Any) -> list[Any]:
        r = self.router
        if isinstance(item, ConsumerBytes):
            sent: Command | None = lane_from_debugger(r, item.consumer, item.data)
        elif isinstance(item, VmBytes):
            sent = lane_from_vm(r, item.data)
        else:
            return super().handle(item)
        if sent is not None:
            return [FAST, sent]
        return [SLOW, *super().handle(item)]


def attached(*debuggers: int) -> Laned:
    """The VM connected and ``debuggers`` attached; nothing asked yet."""
    h = Laned()
    playbook = h.book() >> VmConnected(0.0)
    for d in debuggers:
        playbook = (
            playbook
            >> ConsumerJoined(d, "vm-port", f"127.0.0.1:{40000 + d}")
            >> ConsumerBytes(d, HANDSHAKE)
            << SLOW
            << SendToDebugger(d, HANDSHAKE)
        )
    assert playbook
    return h


def ready(*debuggers: int) -> Laned:
    """As ``attached``, and debugger 1 has asked the VM's IDSizes (VM-side id 1)."""
    h = attached(*debuggers)
    assert (
        h.book()
        >> ConsumerBytes(debuggers[0], cmd(1, ID_SIZES))
        << SLOW
        << SendToVm(cmd(1, ID_SIZES))
        >> VmBytes(reply(1, SIZES))
        << SLOW
        << SendToDebugger(debuggers[0], reply(1, SIZES))
    )
    return h


def owns(
    h: Laned, debugger: int, their_id: int, vm_id: int, request: int, policy: int = ALL
) -> None:
    """``debugger`` sets a breakpoint; the VM answers with ``request``."""
    assert (
        h.book()
        >> ConsumerBytes(debugger, cmd(their_id, SET, set_bp(policy)))
        << SLOW
        << SendToVm(cmd(vm_id, SET, set_bp(policy)))
        >> VmBytes(reply(vm_id, int4(request)))
        << SLOW
        << SendToDebugger(debugger, reply(their_id, int4(request)))
    )


# ------------------------------------------------------------------------------ the table


#: Every entry of ``SLOW_LANE`` and the Playbook of its rule.
PLAYBOOKS: dict[tuple[int, int | None], str] = {
    VERSION: "test_version_is_asked_once_and_then_answered_from_the_cache",
    DISPOSE: "test_dispose_is_answered_here_and_never_reaches_the_vm",
    ID_SIZES: "test_id_sizes_is_asked_once_and_then_answered_from_the_cache",
    SUSPEND: "test_vm_suspend_is_recorded_in_the_ledger",
    RESUME: "test_vm_resume_of_nothing_held_by_the_sender_is_answered_here",
    # and, for both, with one debugger:
    # test_a_lone_debugger_s_vm_suspend_and_resume_take_the_fast_lane_and_the_ledger_sees_them
    EXIT: "test_exit_is_logged_with_the_debuggers_it_ends",
    HOLD: "test_hold_and_release_events_are_answered_here_per_debugger",
    RELEASE: "test_hold_and_release_events_are_answered_here_per_debugger",
    T_SUSPEND: "test_thread_suspend_and_resume_are_recorded_in_the_ledger",
    T_RESUME: "test_thread_suspend_and_resume_are_recorded_in_the_ledger",
    T_COUNT: "test_suspend_count_is_the_sender_s_own",
    **{
        (cs, c): "test_a_shared_view_command_is_slow_only_with_several_debuggers"
        for cs, c in ((THREAD, 4), (THREAD, 6), (THREAD, 7), (THREAD, 8), (THREAD, 9))
    },
    (THREAD, 13): "test_a_shared_view_command_is_slow_only_with_several_debuggers",
    **{
        (
            CommandSet.STACK_FRAME,
            c,
        ): "test_a_shared_view_command_is_slow_only_with_several_debuggers"
        for c in (1, 2, 3, 4)
    },
    SET: "test_event_request_set_gives_the_sender_its_request",
    CLEAR: "test_event_request_clear_of_another_s_request_is_answered_here",
    CLEAR_BREAKPOINTS: "test_clear_all_breakpoints_clears_only_the_sender_s",
    DISABLE_COLLECTION: "test_pins_are_counted_per_debugger_and_re_enabled_when_it_leaves",
    ENABLE_COLLECTION: "test_pins_are_counted_per_debugger_and_re_enabled_when_it_leaves",
    (CommandSet.DDM, None): "test_ddm_requests_go_through_the_sharing_rules",
}


def test_every_slow_lane_entry_has_a_reason_and_a_playbook() -> None:
    assert set(PLAYBOOKS) == set(SLOW_LANE)
    for key, rule in SLOW_LANE.items():
        assert rule.why.strip(), key
        assert callable(globals()[PLAYBOOKS[key]]), key


def test_the_bridge_s_commands_and_the_router_s_keys_come_from_the_one_table() -> None:
    assert keys_of("bridge") == BRIDGED
    assert keys_of("bridge", several=True) == SHARED_VIEW == SHARED_KEYS
    assert keys_of() == SLOW_KEYS | SHARED_KEYS
    assert {CommandSet.DDM} == SLOW_SETS
    # The router's one lookup says the same, key by key: every command of a slow set and every
    # slow key always off the lane, the shared view only with several debuggers.
    whole_sets = {(cs << 8) | c for cs in SLOW_SETS for c in range(256)}
    assert {k for k, off in OFF_LANE.items() if off == lanes.SLOW} == whole_sets | SLOW_KEYS
    assert {k for k, off in OFF_LANE.items() if off != lanes.SLOW} == SHARED_KEYS
    # Recorded by the bridge on the lane: VM.Suspend and VM.Resume, and nothing else.
    assert {k for k, off in OFF_LANE.items() if off == lanes.RECORDED} == RECORDED_KEYS
    assert {(k >> 8, k & 0xFF) for k in RECORDED_KEYS} == {SUSPEND, RESUME}
    assert RECORDED_KEYS <= SHARED_KEYS
    # The caches' replies are read, so their commands are on the slow lane too.
    assert READ_REPLIES <= SLOW_KEYS
    # What the issue names stays off the table.
    for command in (
        V.ALL_THREADS,
        V.ALL_CLASSES,
        V.ALL_CLASSES_WITH_GENERIC,
        V.CLASSES_BY_SIGNATURE,
        V.TOP_LEVEL_THREAD_GROUPS,
        V.CLASS_PATHS,
        V.CAPABILITIES,
        V.CAPABILITIES_NEW,
        V.CREATE_STRING,
        V.INSTANCE_COUNTS,
    ):
        assert (VM, command) not in SLOW_LANE


# ------------------------------------------------------------------------------ the fast lane


def test_all_threads_takes_the_fast_lane_both_ways() -> None:
    h = ready(1)
    r = h.router
    threads = int4(2) + tid(1) + tid(2)
    # The two lanes called directly: a SendToVm under a fresh id, a SendToDebugger with the
    # debugger's own id restored, and nothing left pending.
    assert lane_from_debugger(r, 1, cmd(9, ALL_THREADS)) == SendToVm(cmd(2, ALL_THREADS))
    assert lane_from_vm(r, reply(2, threads)) == SendToDebugger(1, reply(9, threads))
    assert len(r.ids) == 0
    # As the driver feeds it, with two debuggers asking at once.
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(9, ALL_THREADS))
        << FAST
        << SendToVm(cmd(2, ALL_THREADS))
        >> ConsumerBytes(2, cmd(4, ALL_THREADS))
        << FAST
        << SendToVm(cmd(3, ALL_THREADS))
        >> VmBytes(reply(3, threads))
        << FAST
        << SendToDebugger(2, reply(4, threads))
        >> VmBytes(reply(2, threads))
        << FAST
        << SendToDebugger(1, reply(9, threads))
    )


@pytest.mark.parametrize(
    ("command", "body", "answer"),
    [
        (CLASSES_BY_SIGNATURE, b"\x00\x00\x00\x12Ljava/lang/String;", int4(0)),
        (TOP_LEVEL_THREAD_GROUPS, b"", int4(1) + tid(7)),
        (CAPABILITIES_NEW, b"", bytes(32)),
    ],
    ids=["ClassesBySignature", "TopLevelThreadGroups", "CapabilitiesNew"],
)
def test_a_vm_command_no_rule_reads_takes_the_fast_lane(
    command: tuple[int, int], body: bytes, answer: bytes
) -> None:
    h = ready(1, 2)
    assert (
        h.book()
        >> ConsumerBytes(2, cmd(5, command, body))
        << FAST
        << SendToVm(cmd(2, command, body))
        >> VmBytes(reply(2, answer))
        << FAST
        << SendToDebugger(2, reply(5, answer))
    )


@pytest.mark.parametrize(
    "command", [c for c in V if (VM, c) not in SLOW_LANE], ids=lambda c: str(c.name)
)
def test_every_vm_command_off_the_table_takes_the_fast_lane(command: V) -> None:
    h = attached(1)  # even before IDSizes: nothing here needs the sizes for them
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, (VM, command), b"x"))
        << FAST
        << SendToVm(cmd(1, (VM, command), b"x"))
        >> VmBytes(reply(1, b"y"))
        << FAST
        << SendToDebugger(1, reply(3, b"y"))
    )


# ------------------------------------------------------------------------------ the caches


def test_version_is_asked_once_and_then_answered_from_the_cache() -> None:
    h = ready(1, 2)
    version = b"\x00\x00\x00\x03JVM" + int4(17) + int4(0)
    assert lane_from_debugger(h.router, 1, cmd(3, VERSION)) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, VERSION))
        << SLOW
        << SendToVm(cmd(2, VERSION))
        >> VmBytes(reply(2, version))  # read: it fills the cache
        << SLOW
        << SendToDebugger(1, reply(3, version))
        >> ConsumerBytes(2, cmd(8, VERSION))
        << SLOW
        << SendToDebugger(2, reply(8, version))  # never reaches the VM again
    )
    assert h.router.version_reply == version


def test_id_sizes_is_asked_once_and_then_answered_from_the_cache() -> None:
    h = attached(1, 2)
    assert lane_from_debugger(h.router, 1, cmd(1, ID_SIZES)) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(1, ID_SIZES))
        << SLOW
        << SendToVm(cmd(1, ID_SIZES))
        >> VmBytes(reply(1, SIZES))  # read: it fills the cache and gives the bridge the sizes
        << SLOW
        << SendToDebugger(1, reply(1, SIZES))
        >> ConsumerBytes(2, cmd(1, ID_SIZES))
        << SLOW
        << SendToDebugger(2, reply(1, SIZES))
    )
    assert h.router.id_sizes == SIZES
    assert h.bridge.sizes is not None


def test_dispose_is_answered_here_and_never_reaches_the_vm() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 2, cmd(4, DISPOSE)) is None
    assert (
        h.book(logs=True)
        >> ConsumerBytes(2, cmd(4, DISPOSE))
        << SLOW
        << Log("debugger.dispose", fields={"debugger": 2})
        << SendToDebugger(2, reply(4))
        << CloseDebugger(2, "left")
        << Log("debugger.released", "debug", {"debugger": 2, "requests": 0, "suspensions": 0})
    )
    assert h.router.attached() == (1,)


# ------------------------------------------------------------------------------ the ledger


def test_vm_suspend_is_recorded_in_the_ledger() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 1, cmd(3, SUSPEND)) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, SUSPEND))
        << SLOW
        << SendToVm(cmd(2, SUSPEND))
        >> VmBytes(reply(2))
        << FAST  # the VM carried it out: nothing in the reply is for the bridge
        << SendToDebugger(1, reply(3))
    )
    assert (h.bridge.held_by(1), h.bridge.held_by(2)) == (1, 0)
    assert h.bridge.watch == {}


def test_a_vm_suspend_the_vm_refused_leaves_the_ledger_as_it_was() -> None:
    for debuggers in ((1, 2), (1,)):
        h = ready(*debuggers)
        lane = SLOW if len(debuggers) > 1 else FAST
        assert (
            h.book()
            >> ConsumerBytes(1, cmd(3, SUSPEND))
            << lane
            << SendToVm(cmd(2, SUSPEND))
            >> VmBytes(reply(2, error=112))  # VM_DEAD
            << SLOW  # the bridge reads a refusal
            << SendToDebugger(1, reply(3, error=112))
        )
        assert h.bridge.held_by(1) == 0, debuggers
        assert h.bridge.watch == {}


def alone(playbook: Playbook, their_id: int, vm_id: int, command: tuple[int, int]) -> Playbook:
    """Debugger 1 sends ``command`` (``their_id``, ``vm_id`` at the VM) and gets the VM's empty
    reply, both on the fast lane."""
    return (
        playbook
        >> ConsumerBytes(1, cmd(their_id, command))
        << FAST
        << SendToVm(cmd(vm_id, command))
        >> VmBytes(reply(vm_id))
        << FAST
        << SendToDebugger(1, reply(their_id))
    )


def second_joins(playbook: Playbook) -> Playbook:
    return (
        playbook
        >> ConsumerJoined(2, "vm-port", "127.0.0.1:40002")
        >> ConsumerBytes(2, HANDSHAKE)
        << SLOW
        << SendToDebugger(2, HANDSHAKE)
    )


def test_a_lone_debugger_s_vm_suspend_and_resume_take_the_fast_lane_and_the_ledger_sees_them() -> (
    None
):
    h = ready(1)
    assert alone(alone(h.book(), 3, 2, SUSPEND), 4, 3, SUSPEND)
    assert h.bridge.held_by(1) == 2  # as the slow lane would have recorded
    assert alone(h.book(), 5, 4, RESUME)
    assert h.bridge.held_by(1) == 1
    # A second debugger arrives: the ledger knows debugger 1 holds the VM, so the second one's
    # Resume, which balances nothing of its own, is answered here and the VM stays suspended.
    assert (
        second_joins(h.book())
        >> ConsumerBytes(2, cmd(7, RESUME))
        << SLOW
        << SendToDebugger(2, reply(7))
    )
    assert (h.bridge.held_by(1), h.bridge.held_by(2)) == (1, 0)


def test_a_lane_suspend_is_released_when_its_debugger_leaves_others_behind() -> None:
    h = ready(1)
    assert (
        second_joins(alone(h.book(), 3, 2, SUSPEND))
        >> ConsumerLeft(1, "closed")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(3, RESUME))  # what debugger 1 held is let go; debugger 2 held nothing
    )
    assert h.bridge.held_by(1) == 0


def test_vm_resume_of_nothing_held_by_the_sender_is_answered_here() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=ALL)
    assert lane_from_debugger(h.router, 2, cmd(2, RESUME)) is None
    assert (
        h.book()
        >> VmBytes(composite(ALL, bp(5)))
        << SLOW
        << SendToDebugger(1, composite(ALL, bp(5)))
        >> ConsumerBytes(2, cmd(2, RESUME))
        << SLOW
        << SendToDebugger(2, reply(2))  # debugger 1's suspension stays
    )
    assert h.bridge.held_by(1) == 1


def test_exit_is_logged_with_the_debuggers_it_ends() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 1, cmd(6, EXIT, int4(0))) is None
    assert (
        h.book(logs=True)
        >> ConsumerBytes(1, cmd(6, EXIT, int4(0)))
        << SLOW
        << Log(
            "vm.exit_requested",
            "warning",
            {"debugger": 1, "peer": "127.0.0.1:40001", "via": "vm-port", "others": 1},
        )
        << SendToVm(cmd(2, EXIT, int4(0)))
    )


def test_hold_and_release_events_are_answered_here_per_debugger() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5, policy=NONE)
    assert lane_from_debugger(h.router, 1, cmd(5, HOLD)) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(5, HOLD))
        << SLOW
        << SendToDebugger(1, reply(5))
        >> VmBytes(composite(NONE, bp(5)))
        << SLOW
        >> ConsumerBytes(1, cmd(7, RELEASE))
        << SLOW
        << SendToDebugger(1, reply(7))
        << SendToDebugger(1, composite(NONE, bp(5)))
    )
    assert lane_from_debugger(h.router, 1, cmd(9, RELEASE)) is None


def test_thread_suspend_and_resume_are_recorded_in_the_ledger() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 1, cmd(3, T_SUSPEND, tid(T1))) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SLOW
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2))
        << FAST  # a Suspend carried out: its reply is not read
        << SendToDebugger(1, reply(3))
    )
    assert h.bridge.held_by(1) == 1
    assert lane_from_debugger(h.router, 2, cmd(4, T_RESUME, tid(T1))) is None
    assert (
        h.book()
        >> ConsumerBytes(2, cmd(4, T_RESUME, tid(T1)))
        << SLOW
        << SendToDebugger(2, reply(4))  # not its own: answered here, the thread stays held
        >> ConsumerBytes(1, cmd(5, T_RESUME, tid(T1)))
        << SLOW
        << SendToVm(cmd(3, T_RESUME, tid(T1)))
    )
    assert h.bridge.held_by(1) == 0


def test_pins_are_counted_per_debugger_and_re_enabled_when_it_leaves() -> None:
    h = ready(1, 2)
    for command in (DISABLE_COLLECTION, ENABLE_COLLECTION):
        assert lane_from_debugger(h.router, 1, cmd(3, command, tid(O1))) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, DISABLE_COLLECTION, tid(O1)))
        << SLOW
        << SendToVm(cmd(2, DISABLE_COLLECTION, tid(O1)))
        >> VmBytes(reply(2))
        << SLOW  # read: the pin counts once the VM carried it out
        << SendToDebugger(1, reply(3))
        >> ConsumerBytes(1, cmd(4, DISABLE_COLLECTION, tid(O1)))
        << SLOW
        << SendToVm(cmd(3, DISABLE_COLLECTION, tid(O1)))
        >> VmBytes(reply(3))
        << SLOW
        << SendToDebugger(1, reply(4))
        >> ConsumerBytes(1, cmd(5, DISABLE_COLLECTION, tid(0x78)))
        << SLOW
        << SendToVm(cmd(4, DISABLE_COLLECTION, tid(0x78)))
        >> VmBytes(reply(4, error=20))  # INVALID_OBJECT: no pin
        << SLOW
        << SendToDebugger(1, reply(5, error=20))
        >> ConsumerBytes(1, cmd(6, ENABLE_COLLECTION, tid(O1)))
        << SLOW
        << SendToVm(cmd(5, ENABLE_COLLECTION, tid(O1)))
        >> VmBytes(reply(5))
        << SLOW
        << SendToDebugger(1, reply(6))
        >> ConsumerBytes(1, cmd(7, DISABLE_COLLECTION, tid(O1)))
        << SLOW
        << SendToVm(cmd(6, DISABLE_COLLECTION, tid(O1)))
        >> VmBytes(reply(6))
        << SLOW
        << SendToDebugger(1, reply(7))
    )
    assert h.bridge.pins.held_by(1) == 2
    assert (
        h.book()
        >> ConsumerLeft(1, "debugger closed the connection")
        << CloseDebugger(1, "left")
        << SendToVm(cmd(7, ENABLE_COLLECTION, tid(O1)))  # as often as it pinned O1
        << SendToVm(cmd(8, ENABLE_COLLECTION, tid(O1)))
    )
    assert h.bridge.pins.held_by(1) == 0


def test_suspend_count_is_the_sender_s_own() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 2, cmd(1, T_COUNT, tid(T1))) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SLOW
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2))
        << FAST  # a Suspend carried out: its reply is not read
        << SendToDebugger(1, reply(3))
        >> ConsumerBytes(2, cmd(1, T_COUNT, tid(T1)))
        << SLOW
        << SendToVm(cmd(3, T_COUNT, tid(T1)))
        >> VmBytes(reply(3, int4(1)))  # watched: the reply is read and rewritten
        << SLOW
        << SendToDebugger(2, reply(1, int4(0)))
    )


SHARED = sorted(SHARED_KEYS - RECORDED_KEYS)  # VM.Suspend and Resume have Playbooks of their own


@pytest.mark.parametrize("key", SHARED, ids=lambda k: f"{k >> 8}/{k & 0xFF}")
def test_a_shared_view_command_is_slow_only_with_several_debuggers(key: int) -> None:
    command = (key >> 8, key & 0xFF)
    body = tid(T1) + tid(9) + int4(0)  # a thread id first; the rest is never read here
    # One debugger alone: nothing to hide from it, so the fast lane.
    h = ready(1)
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, command, body))
        << FAST
        << SendToVm(cmd(2, command, body))
    )
    # Two: debugger 1 holds T1, which debugger 2 must see running.
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 2, cmd(4, command, body)) is None
    playbook = (
        h.book()
        >> ConsumerBytes(1, cmd(3, T_SUSPEND, tid(T1)))
        << SLOW
        << SendToVm(cmd(2, T_SUSPEND, tid(T1)))
        >> VmBytes(reply(2))
        << FAST  # a Suspend carried out: its reply is not read
        << SendToDebugger(1, reply(3))
        >> ConsumerBytes(2, cmd(4, command, body))
        << SLOW
    )
    if command == (THREAD, 4):  # Status: asked, and the suspended bit taken out
        playbook = (
            playbook
            << SendToVm(cmd(3, command, body))
            >> VmBytes(reply(3, int4(1) + int4(1)))
            << SLOW
            << SendToDebugger(2, reply(4, int4(1) + int4(0)))
        )
    else:  # refused as the VM refuses it for a running thread
        playbook = playbook << SendToDebugger(2, reply(4, error=13))
    assert playbook
    # The holder reads its own thread from the VM.
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(5, command, body))
        << SLOW
        << SendToVm(cmd(4 if command == (THREAD, 4) else 3, command, body))
    )


# ------------------------------------------------------------------------------ event requests


def test_event_request_set_gives_the_sender_its_request() -> None:
    h = ready(1, 2)
    assert lane_from_debugger(h.router, 1, cmd(3, SET, set_bp(ALL))) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, SET, set_bp(ALL)))
        << SLOW
        << SendToVm(cmd(2, SET, set_bp(ALL)))
        >> VmBytes(reply(2, int4(5)))  # watched: the requestID is read
        << SLOW
        << SendToDebugger(1, reply(3, int4(5)))
        >> VmBytes(composite(NONE, bp(5)))
        << SLOW
        << SendToDebugger(1, composite(NONE, bp(5)))  # debugger 1's alone
    )
    assert h.bridge.requests.owned_by(1) == 1


def test_event_request_clear_of_another_s_request_is_answered_here() -> None:
    h = ready(1, 2)
    owns(h, 1, 3, 2, request=5)
    assert lane_from_debugger(h.router, 2, cmd(8, CLEAR, clear(BREAKPOINT, 5))) is None
    assert (
        h.book()
        >> ConsumerBytes(2, cmd(8, CLEAR, clear(BREAKPOINT, 5)))
        << SLOW
        << SendToDebugger(2, reply(8))
        >> ConsumerBytes(1, cmd(9, CLEAR, clear(BREAKPOINT, 5)))
        << SLOW
        << SendToVm(cmd(3, CLEAR, clear(BREAKPOINT, 5)))
    )


def test_clear_all_breakpoints_clears_only_the_sender_s() -> None:
    h = ready(1, 2)
    owns(h, 2, 1, 2, request=7)
    assert lane_from_debugger(h.router, 1, cmd(3, CLEAR_BREAKPOINTS)) is None
    assert (
        h.book()
        >> ConsumerBytes(1, cmd(3, CLEAR_BREAKPOINTS))
        << SLOW
        << SendToDebugger(1, reply(3))  # it owns none: answered at once
        >> VmBytes(composite(NONE, bp(7)))
        << SLOW
        << SendToDebugger(2, composite(NONE, bp(7)))
    )


# ------------------------------------------------------------------------------ DDM


def test_ddm_requests_go_through_the_sharing_rules() -> None:
    h = ready(1)
    helo = encode(ddm_command(5, HeloRequest(1)))
    assert lane_from_debugger(h.router, 1, helo) is None
    assert (
        h.book()
        >> ConsumerBytes(1, helo)
        << SLOW
        << SendToVm(encode(ddm_command(2, HeloRequest(1))))
    )
    assert h.router.consumers.by_id[1].speaks_ddm
    (pending,) = h.router.ids.drop_origin(h.router.consumers.by_id[1].origin)
    assert pending.deadline == h.router.ddm_timeout  # relayed with a deadline: it may expire
