"""IdRewriter: VM-side JDWP id allocation and reply routing (protocol.md 1.3)."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ddmd.protocol.errors import LocalProtocolError
from ddmd.protocol.idmap import IdRewriter, Pending

SELF = "ddmd"
JDB = ("debugger", 1)
STUDIO = ("debugger", 2)


def test_first_ids_count_up_from_first_id():
    ids = IdRewriter(first_id=0x40000000)
    assert [ids.allocate(SELF, 0, 199, 1, 10.0) for _ in range(3)] == [
        0x40000000,
        0x40000001,
        0x40000002,
    ]
    assert len(ids) == 3


def test_default_starts_at_one_and_never_hands_out_zero():
    ids = IdRewriter(id_space=4)
    got = []
    for _ in range(9):
        vm_id = ids.allocate(SELF, 0, 199, 1, None)
        got.append(vm_id)
        ids.resolve(vm_id)
    assert got == [1, 2, 3, 1, 2, 3, 1, 2, 3]


def test_wrap_at_the_top_of_the_u4_space():
    ids = IdRewriter(first_id=0xFFFFFFFE)
    assert ids.allocate(SELF, 0, 1, 7, 1.0) == 0xFFFFFFFE
    assert ids.allocate(SELF, 0, 1, 7, 1.0) == 0xFFFFFFFF
    assert ids.allocate(SELF, 0, 1, 7, 1.0) == 1


def test_allocation_skips_outstanding_ids_after_wrap():
    ids = IdRewriter(id_space=8)
    held = [ids.allocate(JDB, n, 1, 7, None) for n in range(1, 8)]  # 1..7
    assert held == [1, 2, 3, 4, 5, 6, 7]
    ids.resolve(5)
    ids.resolve(2)
    # The counter wrapped to 1; 1 is outstanding, so 2 comes next, then 5.
    assert ids.allocate(STUDIO, 100, 1, 7, None) == 2
    assert ids.allocate(STUDIO, 101, 1, 7, None) == 5
    assert sorted(ids.get(i).vm_id for i in range(1, 8)) == list(range(1, 8))


def test_unique_ids_under_heavy_wrap():
    ids = IdRewriter(id_space=16)
    live: set[int] = set()
    for step in range(500):
        vm_id = ids.allocate(SELF, step & 0xFFFF, 199, 1, None)
        assert vm_id not in live
        assert 1 <= vm_id <= 15
        live.add(vm_id)
        if len(live) > 10:
            oldest = min(live)
            assert ids.resolve(oldest) is not None
            live.remove(oldest)


def test_exhaustion_raises_local_error():
    ids = IdRewriter(id_space=4)
    for _ in range(3):
        ids.allocate(SELF, 0, 199, 1, None)
    with pytest.raises(LocalProtocolError, match="exhausted"):
        ids.allocate(SELF, 0, 199, 1, None)
    ids.resolve(2)
    assert ids.allocate(SELF, 0, 199, 1, None) == 2


def test_next_free_is_the_id_the_next_relayed_command_gets_and_changes_nothing():
    """The relay lane asks ``next_free`` to make the packet, writes it, then records it with
    ``record_relayed``: the two agree, skipping outstanding ids and wrapping, and asking
    alone records nothing."""
    ids = IdRewriter(id_space=8)
    held = [ids.allocate(JDB, n, 1, 7, None) for n in range(1, 7)]  # 1..6
    ids.resolve(3)
    assert ids.next_free() == 7
    assert ids.next_free() == 7  # asking again: the same, nothing recorded
    assert len(ids) == 5
    ids.record_relayed(7, STUDIO, 40, 11, 1)
    assert ids.next_free() == 3  # wrapped past 1 and 2, still outstanding
    ids.record_relayed(3, STUDIO, 41, 11, 1)
    assert ids.get(3) == Pending(STUDIO, 41, 11, 1, math.inf, 3)
    with pytest.raises(LocalProtocolError, match="exhausted"):
        ids.next_free()
    assert held == [1, 2, 3, 4, 5, 6]
    ids.resolve(5)
    with pytest.raises(LocalProtocolError, match="not free"):
        ids.record_relayed(4, STUDIO, 42, 11, 1)  # outstanding: never recorded twice
    assert ids.next_free() == 5
    ids.record_relayed(5, STUDIO, 42, 11, 1)
    assert ids.get(5) == Pending(STUDIO, 42, 11, 1, math.inf, 5)


def test_resolve_restores_origin_and_original_id():
    ids = IdRewriter(first_id=0x100)
    a = ids.allocate(JDB, 1, 1, 7, 30.0)  # jdb's IDSizes with its own id 1
    b = ids.allocate(STUDIO, 1, 199, 1, 31.0)  # same original id, other debugger
    assert a != b
    assert a in ids
    assert ids.resolve(b) == Pending(STUDIO, 1, 199, 1, 31.0, b)
    assert ids.resolve(a) == Pending(JDB, 1, 1, 7, 30.0, a)
    assert len(ids) == 0
    assert a not in ids


def test_unknown_or_already_resolved_id_gives_none():
    ids = IdRewriter()
    assert ids.resolve(12345) is None
    vm_id = ids.allocate(SELF, 9, 199, 1, 5.0)
    assert ids.resolve(vm_id) is not None
    assert ids.resolve(vm_id) is None
    assert ids.expire(100.0) == ()


def test_expire_in_deadline_order():
    ids = IdRewriter()
    late = ids.allocate(JDB, 1, 1, 1, 30.0)
    early = ids.allocate(JDB, 2, 1, 1, 10.0)
    never = ids.allocate(JDB, 3, 1, 1, math.inf)
    also_never = ids.allocate(JDB, 4, 1, 1, None)
    tie = ids.allocate(STUDIO, 5, 1, 1, 10.0)
    assert ids.next_deadline() == 10.0
    assert ids.expire(9.999) == ()
    assert [p.vm_id for p in ids.expire(10.0)] == [early, tie]
    assert ids.next_deadline() == 30.0
    ids.resolve(late)  # stale heap entry now
    assert ids.next_deadline() is None
    assert ids.expire(1e18) == ()
    assert ids.get(never).deadline == math.inf
    assert ids.get(also_never).deadline == math.inf
    assert len(ids) == 2


def test_drop_origin_returns_everything_of_that_origin():
    ids = IdRewriter()
    j1 = ids.allocate(JDB, 1, 1, 1, 5.0)
    s1 = ids.allocate(STUDIO, 1, 1, 1, 5.0)
    j2 = ids.allocate(JDB, 2, 1, 1, None)
    assert ids.outstanding(JDB) == 2
    dropped = ids.drop_origin(JDB)
    assert [p.vm_id for p in dropped] == [j1, j2]
    assert ids.outstanding(JDB) == 0
    assert ids.drop_origin(JDB) == ()
    assert ids.resolve(j1) is None  # a late reply for a departed debugger
    assert [p.vm_id for p in ids.expire(5.0)] == [s1]  # the stale heap entry is skipped
    assert ids.outstanding(STUDIO) == 0


def test_drop_all():
    ids = IdRewriter()
    a = ids.allocate(JDB, 1, 1, 1, 5.0)
    b = ids.allocate(SELF, 7, 199, 1, None)
    assert [p.vm_id for p in ids.drop_all()] == [a, b]
    assert len(ids) == 0
    assert ids.next_deadline() is None


def test_catch_discards_on_exit_but_not_a_reused_id():
    ids = IdRewriter(id_space=2)  # a single usable id: 1
    seen = []

    def cancelled_waiter():
        with ids.catch(SELF, 0, 199, 1, 5.0) as entry:
            seen.append(entry.vm_id in ids)
            raise RuntimeError("waiter cancelled")

    with pytest.raises(RuntimeError, match="waiter cancelled"):
        cancelled_waiter()
    assert seen == [True]
    assert len(ids) == 0
    with ids.catch(SELF, 0, 199, 1, 5.0) as entry:
        ids.resolve(entry.vm_id)  # the reply came
        newer = ids.allocate(JDB, 3, 1, 1, None)  # id 1 handed out again
        assert newer == entry.vm_id
    assert ids.get(newer) is not None  # the newer entry survives the with-exit
    assert not ids.discard(entry)


def test_bad_arguments():
    with pytest.raises(LocalProtocolError, match="first id 0"):
        IdRewriter(first_id=0)
    with pytest.raises(LocalProtocolError, match="first id 8"):
        IdRewriter(first_id=8, id_space=8)
    with pytest.raises(LocalProtocolError, match="id space 1"):
        IdRewriter(id_space=1)
    ids = IdRewriter()
    with pytest.raises(LocalProtocolError, match="original id"):
        ids.allocate(SELF, 1 << 32, 1, 1, None)
    with pytest.raises(LocalProtocolError, match="256"):
        ids.allocate(SELF, 1, 256, 1, None)
    with pytest.raises(LocalProtocolError, match="NaN"):
        ids.allocate(SELF, 1, 1, 1, math.nan)
    assert len(ids) == 0


def test_many_stale_heap_entries_are_compacted():
    ids = IdRewriter()
    for n in range(10_000):
        ids.resolve(ids.allocate(SELF, n, 199, 1, float(n)))
    assert len(ids._heap) <= 32 + 2  # internal: memory stays O(live)
    assert ids.next_deadline() is None


# --------------------------------------------------------------------------- stateful


class IdRewriterMachine(RuleBasedStateMachine):
    """IdRewriter against a plain dict model, in a tiny id space (ids 1..4) so wrap,
    skipping and exhaustion happen within a few steps."""

    SPACE = 5

    def __init__(self) -> None:
        super().__init__()
        self.ids = IdRewriter(id_space=self.SPACE)
        self.model: dict[int, Pending] = {}

    @rule(
        origin=st.sampled_from([SELF, JDB, STUDIO]),
        original=st.integers(0, 3),
        deadline=st.sampled_from([None, 0.0, 1.0, 2.0, 3.0, 5.0, math.inf]),
    )
    def allocate(self, origin, original, deadline):
        if len(self.model) == self.SPACE - 1:
            with pytest.raises(LocalProtocolError, match="exhausted"):
                self.ids.allocate(origin, original, 1, 7, deadline)
            return
        vm_id = self.ids.allocate(origin, original, 1, 7, deadline)
        assert vm_id not in self.model
        assert 1 <= vm_id < self.SPACE
        d = math.inf if deadline is None else deadline
        self.model[vm_id] = Pending(origin, original, 1, 7, d, vm_id)

    @rule(vm_id=st.integers(0, 5))
    def resolve(self, vm_id):
        assert self.ids.resolve(vm_id) == self.model.pop(vm_id, None)

    @rule(now=st.sampled_from([0.0, 1.0, 2.5, 5.0, 9.0]))
    def expire(self, now):
        want = sorted(
            (p for p in self.model.values() if p.deadline <= now),
            key=lambda p: p.deadline,
        )
        got = self.ids.expire(now)
        assert sorted(got, key=lambda p: p.vm_id) == sorted(want, key=lambda p: p.vm_id)
        assert [p.deadline for p in got] == [p.deadline for p in want]
        for p in got:
            del self.model[p.vm_id]

    @rule(origin=st.sampled_from([SELF, JDB, STUDIO]))
    def drop_origin(self, origin):
        want = [p for p in self.model.values() if p.origin == origin]
        assert sorted(self.ids.drop_origin(origin), key=lambda p: p.vm_id) == sorted(
            want, key=lambda p: p.vm_id
        )
        for p in want:
            del self.model[p.vm_id]

    @invariant()
    def agrees_with_model(self):
        assert len(self.ids) == len(self.model)
        for vm_id in range(self.SPACE):
            assert (vm_id in self.ids) == (vm_id in self.model)
            assert self.ids.get(vm_id) == self.model.get(vm_id)
        for origin in (SELF, JDB, STUDIO):
            assert self.ids.outstanding(origin) == sum(
                p.origin == origin for p in self.model.values()
            )
        finite = [p.deadline for p in self.model.values() if p.deadline != math.inf]
        assert self.ids.next_deadline() == (min(finite) if finite else None)


TestIdRewriterMachine = IdRewriterMachine.TestCase
# Example count from the active profile; fewer steps per example keep the run short (an
# 4-id space wraps and fills within a few steps anyway).
TestIdRewriterMachine.settings = settings(stateful_step_count=12)
