"""IdRewriter: (debugger, their_id) <-> vm_id, reply routing, drop(debugger). Pure dict logic.

JDWP request-id rewriting for one VM connection (protocol.md 1.3).

Layer: ``protocol`` (sans-IO, standard library only; no sockets, clock or logging).

ddmd owns the id space of every command it writes to a VM. Each command, its own or one
forwarded from a debugger, gets a fresh VM-side id from :meth:`IdRewriter.allocate`; the
entry remembers who asked (the *origin*: ddmd itself or a debugger connection, any hashable
value), the id that origin used, the command and a deadline. A reply from the VM is routed
with :meth:`IdRewriter.resolve`. This is the shape of jeepney's ``ReplyMatcher``: a
serial-to-waiter map, :meth:`IdRewriter.catch` to guarantee the entry goes away even when
the waiter is cancelled, and :meth:`IdRewriter.drop_all` / :meth:`IdRewriter.drop_origin`
when the reader stops or a debugger leaves.

Decisions:

* Ids are u4 but **0 is never handed out**: OpenJDK sends VM_START with id 0, logs and fake
  peers read 0 as "no id", and keeping it out costs nothing. Allocation runs ``first_id``,
  ``first_id + 1``, ... up to ``id_space - 1`` and then wraps to 1, skipping every id that
  is still outstanding. When all ``id_space - 1`` ids are outstanding, :meth:`allocate`
  raises :class:`LocalProtocolError`.
* A deadline is a float on the caller's clock (this module never reads a clock).
  ``None`` or ``math.inf`` mean "never expires": such entries are not in the deadline heap
  and leave only by :meth:`resolve`, :meth:`drop_origin`, :meth:`drop_all` or
  :meth:`discard`.
* Origins' own ids are not checked for uniqueness: a debugger that reuses an id of its own
  still gets each reply, because routing uses the fresh VM-side id.

Costs: allocate/resolve are O(log n) amortised (heap push; stale heap entries are deleted
lazily and the heap is rebuilt when they outnumber the live ones); expire is
O(k log n) for k expired entries; drop_origin and outstanding are O(n), a look at every
outstanding entry (a debugger leaves; few commands are outstanding at a time), so that a
command relayed and its reply touch one dict, not a second index by origin.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ddmd.protocol.errors import LocalProtocolError

__all__ = ["IdRewriter", "Pending"]

_U4_SPACE = 1 << 32


@dataclass(slots=True)
class Pending:
    """One command written to the VM and not yet answered (one is made per relayed command:
    not frozen, which would cost 3x to make; nothing changes it once made)."""

    origin: Hashable
    original_id: int
    command_set: int
    command: int
    deadline: float  # math.inf: never expires
    vm_id: int


class IdRewriter:
    """Allocates VM-side command ids and maps replies back to their origin."""

    def __init__(self, *, first_id: int = 1, id_space: int = _U4_SPACE) -> None:
        if not 2 <= id_space <= _U4_SPACE:
            raise LocalProtocolError(f"id space {id_space} is not in 2..{_U4_SPACE}")
        if not 1 <= first_id < id_space:
            raise LocalProtocolError(f"first id {first_id} is not in 1..{id_space - 1}")
        self._space = id_space
        self._next = first_id
        self._by_id: dict[int, Pending] = {}
        #: The entry for a VM-side id, without removing it (the dict's own ``get``: the relay
        #: lane asks once per reply).
        self.get: Callable[[int], Pending | None] = self._by_id.get
        # (deadline, sequence, entry); an entry is stale once _by_id no longer holds it.
        self._heap: list[tuple[float, int, Pending]] = []
        self._sequence = 0
        self._timed = 0  # live entries with a finite deadline

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, vm_id: object) -> bool:
        return vm_id in self._by_id

    def outstanding(self, origin: Hashable) -> int:
        """How many commands of ``origin`` await a reply."""
        return sum(1 for entry in self._by_id.values() if entry.origin == origin)

    def next_deadline(self) -> float | None:
        """The earliest finite deadline of an outstanding entry, or None."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    # ------------------------------------------------------------------ changes

    def allocate(
        self,
        origin: Hashable,
        original_id: int,
        command_set: int,
        command: int,
        deadline: float | None,
    ) -> int:
        """Record a command about to be written to the VM; return its fresh VM-side id."""
        if not 0 <= original_id < _U4_SPACE:
            raise LocalProtocolError(f"original id {original_id} is not a u4")
        if not 0 <= command_set <= 0xFF or not 0 <= command <= 0xFF:
            raise LocalProtocolError(f"command {command_set}/{command} is not a pair of u1")
        if deadline is None:
            deadline = math.inf
        elif math.isnan(deadline):
            raise LocalProtocolError("deadline is NaN")
        if len(self._by_id) >= self._space - 1:
            raise LocalProtocolError(
                f"all {self._space - 1} VM command ids are outstanding: id space exhausted"
            )
        vm_id = self._next
        while vm_id in self._by_id:  # terminates: at least one id is free
            vm_id = vm_id + 1 if vm_id + 1 < self._space else 1
        self._next = vm_id + 1 if vm_id + 1 < self._space else 1

        entry = Pending(origin, original_id, command_set, command, deadline, vm_id)
        self._by_id[vm_id] = entry
        if deadline != math.inf:
            self._sequence += 1
            heapq.heappush(self._heap, (deadline, self._sequence, entry))
            self._timed += 1
        return vm_id

    def next_free(self) -> int:
        """The id the next relayed command gets (nothing is recorded): the relay lane writes the
        packet under it, then records it with ``record_relayed``."""
        by_id = self._by_id
        if len(by_id) >= self._space - 1:
            raise LocalProtocolError(
                f"all {self._space - 1} VM command ids are outstanding: id space exhausted"
            )
        vm_id = self._next
        while vm_id in by_id:  # terminates: at least one id is free
            vm_id = vm_id + 1 if vm_id + 1 < self._space else 1
        self._next = vm_id  # the search is not done again
        return vm_id

    def record_relayed(
        self, vm_id: int, origin: Hashable, original_id: int, command_set: int, command: int
    ) -> None:
        """Record a relayed command written under ``vm_id``, the id ``next_free`` just gave
        (the relay lane calls the two once per packet, with the write in between)."""
        by_id = self._by_id
        if vm_id in by_id or not 0 < vm_id < self._space:
            raise LocalProtocolError(f"VM command id {vm_id} is not free")
        self._next = vm_id + 1 if vm_id + 1 < self._space else 1
        by_id[vm_id] = Pending(origin, original_id, command_set, command, math.inf, vm_id)

    def resolve(self, vm_id: int) -> Pending | None:
        """A reply with ``vm_id`` arrived: pop and return its entry (None if unknown: the
        caller logs and drops the reply)."""
        entry = self._by_id.get(vm_id)
        if entry is None:
            return None
        self._forget(entry)
        return entry

    def discard(self, entry: Pending) -> bool:
        """Remove exactly ``entry`` if it is still outstanding (a waiter gave up). Safe even
        when its id was resolved and handed out again: the newer entry stays."""
        if self._by_id.get(entry.vm_id) is not entry:
            return False
        self._forget(entry)
        return True

    @contextmanager
    def catch(
        self,
        origin: Hashable,
        original_id: int,
        command_set: int,
        command: int,
        deadline: float | None,
    ) -> Iterator[Pending]:
        """:meth:`allocate` for the duration of a ``with`` block (jeepney ``catch``): the
        entry is discarded on exit, whether the reply came, the waiter was cancelled or
        an error escaped."""
        vm_id = self.allocate(origin, original_id, command_set, command, deadline)
        entry = self._by_id[vm_id]
        try:
            yield entry
        finally:
            self.discard(entry)

    def expire(self, now: float) -> tuple[Pending, ...]:
        """Pop every entry whose deadline is <= ``now``, earliest first (ties: allocation
        order)."""
        out: list[Pending] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if self._by_id.get(entry.vm_id) is entry:
                self._forget(entry, in_heap=False)
                out.append(entry)
        return tuple(out)

    def drop_origin(self, origin: Hashable) -> tuple[Pending, ...]:
        """Forget every entry of ``origin`` (a debugger left), in allocation order. Replies
        that still arrive for them resolve to None and are dropped."""
        by_id = self._by_id
        out = tuple(entry for entry in by_id.values() if entry.origin == origin)
        if not out:
            return ()
        for entry in out:
            del by_id[entry.vm_id]
        self._timed -= sum(1 for entry in out if entry.deadline != math.inf)
        self._maybe_compact()
        return out

    def drop_all(self) -> tuple[Pending, ...]:
        """Forget everything (the VM connection is gone), in allocation order."""
        out = tuple(self._by_id.values())
        self._by_id.clear()
        self._heap.clear()
        self._timed = 0
        return out

    # ------------------------------------------------------------------ internals

    def _forget(self, entry: Pending, *, in_heap: bool = True) -> None:
        del self._by_id[entry.vm_id]
        if entry.deadline != math.inf:
            self._timed -= 1
            if in_heap:
                self._maybe_compact()

    #: Remove an entry just looked up with ``get`` (its reply is being passed on).
    forget = _forget

    def _prune(self) -> None:
        heap = self._heap
        while heap and self._by_id.get(heap[0][2].vm_id) is not heap[0][2]:
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        # Stale entries stay in the heap until they surface; rebuild when they dominate,
        # so memory stays O(live) and each removal costs O(1) amortised.
        if len(self._heap) > 2 * self._timed + 32:
            live = self._by_id
            self._heap = [item for item in self._heap if live.get(item[2].vm_id) is item[2]]
            heapq.heapify(self._heap)
