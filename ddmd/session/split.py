"""Who receives which events of an Event.Composite, under which suspend policy (``bridge.py``).

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

- An event with requestID 0 (VM_START, VM_DEATH: automatic) goes to every attached debugger;
  an automatic VM_DEATH suspends nothing (jdwp.spec), any other under the VM's policy.
- An event of an owned request goes to its owner, under the policy the owner asked for.
- An event of a request never seen on this connection goes to a debugger that is alone (as it
  would without ddmd); with several attached, and for a request that was cleared or whose owner
  left, it is dropped.
- Each debugger's policy is the strongest among its events (OpenJDK's agent combines a
  composite's policies the same way, ``enumForCombinedSuspendPolicy``), never stronger than the
  VM applied; a thread-only policy whose events carry no thread (a class prepared by a debugger
  thread) is the VM's, as jdwp.spec says the VM itself reports it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

from ddmd.protocol.errors import ProtocolError
from ddmd.protocol.jdwp import EventKind, IdSizes, SuspendPolicy
from ddmd.protocol.jdwpevents import Composite, Event, event_thread, strongest

__all__ = ["Request", "Share", "Split", "first_thread", "split"]


@dataclass(frozen=True, slots=True)
class Request:
    """An event request and the debugger that owns it."""

    owner: int
    kind: int
    policy: int


@dataclass(frozen=True, slots=True)
class Share:
    """What one debugger receives of a composite."""

    events: tuple[Event, ...]
    policy: int
    thread: int | None  # the thread its events happened in (None: none, or unknown)


@dataclass(frozen=True, slots=True)
class Split:
    shares: dict[int, Share]
    dropped: tuple[Event, ...]
    thread: int | None  # the composite's event thread


def first_thread(events: tuple[Event, ...], sizes: IdSizes | None) -> int | None:
    """The first thread among ``events`` (None: no event carries one, or unreadable)."""
    for event in events:
        try:
            thread = event_thread(event, sizes)
        except ProtocolError:
            return None
        if thread:
            return thread
    return None


def split(
    composite: Composite,
    requests: Mapping[int, Request],
    attached: tuple[int, ...],
    retired: Container[int],
    sizes: IdSizes | None,
) -> Split:
    vm_policy = composite.suspend_policy
    events: dict[int, list[Event]] = {d: [] for d in attached}
    policies: dict[int, list[int]] = {d: [] for d in attached}
    dropped: list[Event] = []
    for event in composite.events:
        request = requests.get(event.request_id)
        if event.request_id == 0:
            targets: tuple[int, ...] = attached
            automatic = event.kind == EventKind.VM_DEATH
            policy = SuspendPolicy.NONE if automatic else vm_policy
        elif request is not None and request.owner in events:
            targets, policy = (request.owner,), request.policy
        elif request is None and len(attached) == 1 and event.request_id not in retired:
            targets, policy = attached, vm_policy
        else:
            dropped.append(event)
            continue
        for d in targets:
            events[d].append(event)
            policies[d].append(policy)
    shares: dict[int, Share] = {}
    for d, mine in events.items():
        if mine:
            policy = min(strongest(policies[d]), vm_policy)
            thread = first_thread(tuple(mine), sizes)
            if policy == SuspendPolicy.EVENT_THREAD and not thread:
                policy = vm_policy
            shares[d] = Share(tuple(mine), policy, thread)
    return Split(shares, tuple(dropped), first_thread(composite.events, sizes))
