"""Suspension accounting for several debuggers on one VM: who holds which suspension, and what
the VM must be told when one of them lets go.

Layer: standard library only (sans-IO; used by ``bridge.py``).

Every suspension the VM applies (an event's suspend policy, a debugger's VM.Suspend or
ThreadReference.Suspend) is one ``Suspension``: the threads it holds in the VM (``covered``: all
threads, all but some, or a few) and, for each debugger that holds it, the threads that debugger
counts it for (its claim). A debugger's suspend count of a thread is the number of its claims
that cover the thread: what the VM would count with that debugger alone. The VM's own count of a
thread is the number of suspensions covering it.

A resume takes threads out of the sender's own claims only:

- VM.Resume: one count off every thread the sender holds (OpenJDK's ``threadControl_resumeAll``
  lowers every suspended thread's count by one): its newest all-thread claim goes, and each
  thread that claim left out loses one count from another claim of the sender; without an
  all-thread claim, every thread it holds loses one count.
- ThreadReference.Resume: one count off that thread, from the sender's newest claim covering it
  (one for a few threads before one for all).

``settle`` then says what the VM must be told so that a suspension holds exactly the union of
its claims: ThreadReference.Resume of each thread it no longer needs; from all (or all but some)
threads to a few: ThreadReference.Suspend of the few it still needs and of the threads it had
already let go that another suspension still holds, then one VM.Resume (the VM runs commands in
order, so those threads never move). No resume of one debugger lowers a count another holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["ALL_THREADS", "NO_THREADS", "RESUME_ALL", "Ledger", "Op", "Suspension", "ThreadSet"]


@dataclass(frozen=True, slots=True)
class ThreadSet:
    """Either exactly ``threads``, or (``everything``) every thread but ``threads``."""

    everything: bool
    threads: frozenset[int] = frozenset()

    @classmethod
    def one(cls, thread: int) -> ThreadSet:
        return cls(False, frozenset((thread,)))

    def covers(self, thread: int) -> bool:
        return (thread not in self.threads) if self.everything else thread in self.threads

    def __or__(self, other: ThreadSet) -> ThreadSet:
        if self.everything and other.everything:
            return ThreadSet(True, self.threads & other.threads)
        if self.everything:
            return ThreadSet(True, self.threads - other.threads)
        if other.everything:
            return ThreadSet(True, other.threads - self.threads)
        return ThreadSet(False, self.threads | other.threads)

    def without(self, thread: int) -> ThreadSet:
        if self.everything:
            return ThreadSet(True, self.threads | {thread})
        return ThreadSet(False, self.threads - {thread})

    def __bool__(self) -> bool:
        return self.everything or bool(self.threads)


ALL_THREADS: Final = ThreadSet(True)
NO_THREADS: Final = ThreadSet(False)

Op = tuple[str, int]
"""What to tell the VM: ("suspend", thread), ("resume", thread) or ``RESUME_ALL``."""
RESUME_ALL: Final[Op] = ("resume all", 0)


@dataclass(eq=False, slots=True)
class Suspension:
    """One suspension the VM applied: what it holds there now, and who holds it for what."""

    covered: ThreadSet
    holders: dict[int, ThreadSet]
    cause: str  # "event", "VM.Suspend", "ThreadReference.Suspend"


class Ledger:
    """Every suspension of one VM connection, oldest first."""

    def __init__(self) -> None:
        self.suspensions: list[Suspension] = []

    def clear(self) -> None:
        self.suspensions.clear()

    # ------------------------------------------------------------------ queries

    def held_by(self, debugger: int) -> int:
        return sum(1 for s in self.suspensions if debugger in s.holders)

    def count(self, debugger: int, thread: int) -> int:
        """The suspend count of ``thread`` as ``debugger`` alone would see it."""
        return sum(1 for s in self.suspensions if _claims(s, debugger, thread))

    def others(self, debugger: int, thread: int) -> int:
        """Suspensions that hold ``thread`` in the VM for other debuggers only."""
        return sum(
            1
            for s in self.suspensions
            if s.covered.covers(thread) and not _claims(s, debugger, thread)
        )

    def vm_count(self, thread: int) -> int:
        """The VM's suspend count of ``thread``, as far as these suspensions go."""
        return sum(1 for s in self.suspensions if s.covered.covers(thread))

    # ------------------------------------------------------------------ changes

    def add(self, scope: ThreadSet, holders: dict[int, ThreadSet], cause: str) -> list[Op]:
        """The VM applied a suspension of ``scope``; ``holders``' claims lie within it. Returns
        what to release at once (what no holder claims)."""
        suspension = Suspension(scope, dict(holders), cause)
        self.suspensions.append(suspension)
        return self.settle(suspension)

    def add_own(self, debugger: int, scope: ThreadSet, cause: str) -> Suspension:
        """A debugger's own Suspend, sent on to the VM."""
        suspension = Suspension(scope, {debugger: scope}, cause)
        self.suspensions.append(suspension)
        return suspension

    def forget(self, suspension: Suspension) -> None:
        """A suspension that never happened (the VM refused the Suspend)."""
        if suspension in self.suspensions:
            self.suspensions.remove(suspension)

    def resume_all(self, debugger: int) -> list[Op] | None:
        """``debugger``'s VM.Resume; None when it holds nothing."""
        mine = [s for s in self.suspensions if debugger in s.holders]
        if not mine:
            return None
        changed: list[Suspension] = []
        whole = [s for s in mine if s.holders[debugger].everything]
        if whole:
            newest = whole[-1]
            threads = sorted(newest.holders.pop(debugger).threads)
            changed.append(newest)
        else:
            held: set[int] = set()
            for s in mine:
                held |= s.holders[debugger].threads
            threads = sorted(held)
        for thread in threads:
            found = self._covering(debugger, thread)
            if found is not None:
                _take(found, debugger, thread)
                changed.append(found)
        return self.settle_all(changed)

    def resume_thread(self, debugger: int, thread: int) -> list[Op] | None:
        """``debugger``'s ThreadReference.Resume; None when it holds nothing of ``thread``."""
        found = self._covering(debugger, thread)
        if found is None:
            return None
        _take(found, debugger, thread)
        return self.settle(found)

    def release(self, debugger: int) -> tuple[int, list[Op]]:
        """``debugger`` is gone: every claim of it goes. (How many it held, what to send.)"""
        held = [s for s in self.suspensions if debugger in s.holders]
        for s in held:
            del s.holders[debugger]
        return len(held), self.settle_all(held)

    def settle_all(self, changed: list[Suspension]) -> list[Op]:
        ops: list[Op] = []
        seen: set[int] = set()
        for s in changed:
            if id(s) not in seen:
                seen.add(id(s))
                ops += self.settle(s)
        return ops

    def settle(self, s: Suspension) -> list[Op]:
        """What the VM must be told so that ``s`` holds exactly the union of its claims."""
        new = NO_THREADS
        for claim in s.holders.values():
            new = new | claim
        old = s.covered
        ops: list[Op]
        if not old.everything:
            ops = [("resume", t) for t in sorted(old.threads - new.threads)]
        elif new.everything:
            ops = [("resume", t) for t in sorted(new.threads - old.threads)]
        else:
            again = {t for t in old.threads if self._others_cover(s, t)}
            ops = [("suspend", t) for t in sorted(new.threads | again)]
            ops.append(RESUME_ALL)
        s.covered = new
        if not new and s in self.suspensions:
            self.suspensions.remove(s)
        return ops

    def _others_cover(self, s: Suspension, thread: int) -> bool:
        return any(v is not s and v.covered.covers(thread) for v in self.suspensions)

    def _covering(self, debugger: int, thread: int) -> Suspension | None:
        """The newest suspension ``debugger`` holds for ``thread``: one held for a few threads
        before one held for all."""
        fallback: Suspension | None = None
        for s in reversed(self.suspensions):
            claim = s.holders.get(debugger)
            if claim is not None and claim.covers(thread):
                if not claim.everything:
                    return s
                if fallback is None:
                    fallback = s
        return fallback


def _claims(s: Suspension, debugger: int, thread: int) -> bool:
    claim = s.holders.get(debugger)
    return claim is not None and claim.covers(thread)


def _take(suspension: Suspension, debugger: int, thread: int) -> None:
    claim = suspension.holders[debugger].without(thread)
    if claim:
        suspension.holders[debugger] = claim
    else:
        del suspension.holders[debugger]
