"""The suspension ledger against a simulated VM: random suspensions and resumes of several
debuggers, checked after every step.

The simulated VM counts suspensions per thread the way OpenJDK's agent does (VM.Resume lowers
every suspended thread by one, ThreadReference.Resume one thread, never below zero). Each
debugger also has an "alone" model: the counts it would see with the VM to itself. After every
step: each debugger's ledger count is its alone count; the VM holds a thread exactly when some
debugger counts it; the VM's count is the ledger's; the VM count less the other debuggers'
suspensions is the sender's own count (what ThreadReference.SuspendCount answers).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ddmd.session.suspensions import ALL_THREADS, RESUME_ALL, Ledger, Op, ThreadSet

THREADS = (1, 2, 3)
DEBUGGERS = (1, 2, 3)


class World:
    def __init__(self) -> None:
        self.ledger = Ledger()
        self.vm = dict.fromkeys(THREADS, 0)
        self.alone = {d: dict.fromkeys(THREADS, 0) for d in DEBUGGERS}

    def apply(self, ops: list[Op]) -> None:
        for what, thread in ops:
            if what == "suspend":
                self.vm[thread] += 1
            elif what == "resume":
                self.vm[thread] = max(0, self.vm[thread] - 1)
            else:
                assert (what, thread) == RESUME_ALL
                for t in THREADS:
                    self.vm[t] = max(0, self.vm[t] - 1)

    def event(self, scope_thread: int | None, grants: dict[int, str]) -> None:
        """A composite that suspended all threads (scope_thread None) or one; ``grants``: the
        policy each debugger received ("all", "thread", "none")."""
        scope = ALL_THREADS if scope_thread is None else ThreadSet.one(scope_thread)
        event_thread = scope_thread or 1
        for t in THREADS:
            self.vm[t] += scope.covers(t)
        holders: dict[int, ThreadSet] = {}
        for d, policy in grants.items():
            if policy == "all" and scope_thread is None:
                holders[d] = ALL_THREADS
                for t in THREADS:
                    self.alone[d][t] += 1
            elif policy != "none":
                holders[d] = ThreadSet.one(event_thread)
                self.alone[d][event_thread] += 1
        self.apply(self.ledger.add(scope, holders, "event"))

    def own_suspend(self, d: int, thread: int | None) -> None:
        scope = ALL_THREADS if thread is None else ThreadSet.one(thread)
        self.ledger.add_own(d, scope, "own")
        for t in THREADS:
            if scope.covers(t):
                self.vm[t] += 1
                self.alone[d][t] += 1

    def resume(self, d: int, thread: int | None) -> None:
        alone_before = dict(self.alone[d])
        sole = all(set(s.holders) <= {d} for s in self.ledger.suspensions)
        vm_before = dict(self.vm)
        if thread is None:
            ops = self.ledger.resume_all(d)
            for t in THREADS:
                self.alone[d][t] = max(0, self.alone[d][t] - 1)
        else:
            ops = self.ledger.resume_thread(d, thread)
            self.alone[d][thread] = max(0, self.alone[d][thread] - 1)
        if ops is None:  # it held nothing: answered without the VM
            assert all(alone_before[t] == 0 for t in ((thread,) if thread else THREADS))
            return
        self.apply(ops)
        if sole:
            # Alone, the debugger's own command does exactly what the ledger asked for.
            own = dict(vm_before)
            for t in (thread,) if thread else THREADS:
                own[t] = max(0, own[t] - 1)
            assert own == self.vm, (own, self.vm)

    def leave(self, d: int) -> None:
        _, ops = self.ledger.release(d)
        self.apply(ops)
        self.alone[d] = dict.fromkeys(THREADS, 0)

    def check(self) -> None:
        for t in THREADS:
            assert self.vm[t] == self.ledger.vm_count(t), (t, self.vm, self.ledger.suspensions)
            counted = [d for d in DEBUGGERS if self.alone[d][t] > 0]
            assert (self.vm[t] > 0) == bool(counted), (t, self.vm, self.alone)
            for d in DEBUGGERS:
                assert self.ledger.count(d, t) == self.alone[d][t], (d, t, self.alone)
                assert self.vm[t] - self.ledger.others(d, t) == self.alone[d][t]
        for s in self.ledger.suspensions:
            assert s.holders, "a suspension nobody holds was kept"


thread_or_all = st.one_of(st.none(), st.sampled_from(THREADS))
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("event"),
            thread_or_all,
            st.dictionaries(st.sampled_from(DEBUGGERS), st.sampled_from(("all", "thread", "none"))),
        ),
        st.tuples(st.just("suspend"), st.sampled_from(DEBUGGERS), thread_or_all),
        st.tuples(st.just("resume"), st.sampled_from(DEBUGGERS), thread_or_all),
        st.tuples(st.just("leave"), st.sampled_from(DEBUGGERS), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=300)
@given(steps)
def test_no_debugger_ever_releases_what_another_holds(script):
    world = World()
    for step in script:
        if step[0] == "event":
            world.event(step[1], step[2])
        elif step[0] == "suspend":
            world.own_suspend(step[1], step[2])
        elif step[0] == "resume":
            world.resume(step[1], step[2])
        else:
            world.leave(step[1])
        world.check()


def test_two_holders_of_one_suspension_release_it_once_when_the_last_resumes():
    ledger = Ledger()
    assert ledger.add(ALL_THREADS, {1: ALL_THREADS, 2: ALL_THREADS}, "event") == []
    assert ledger.resume_all(1) == []
    assert ledger.resume_all(2) == [RESUME_ALL]
    assert ledger.resume_all(1) is None
    assert ledger.suspensions == []


def test_an_all_thread_suspension_kept_for_one_thread_holds_it_before_resuming_the_rest():
    ledger = Ledger()
    ledger.add(ALL_THREADS, {1: ALL_THREADS, 2: ThreadSet.one(7)}, "event")
    assert ledger.resume_all(1) == [("suspend", 7), RESUME_ALL]
    assert ledger.resume_thread(2, 7) == [("resume", 7)]


def test_one_thread_let_go_of_an_all_thread_suspension():
    ledger = Ledger()
    ledger.add(ALL_THREADS, {1: ALL_THREADS}, "event")
    assert ledger.resume_thread(1, 7) == [("resume", 7)]
    assert ledger.count(1, 7) == 0
    assert ledger.count(1, 8) == 1
    assert ledger.resume_all(1) == [RESUME_ALL]


def test_a_suspension_nobody_claims_is_released_at_once():
    ledger = Ledger()
    assert ledger.add(ALL_THREADS, {}, "event") == [RESUME_ALL]
    assert ledger.add(ThreadSet.one(3), {}, "event") == [("resume", 3)]
    assert ledger.suspensions == []
