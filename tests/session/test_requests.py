"""The bridge's two parts alone: who owns each event request (``requests.py``) and the events a
debugger holds (``holding.py``). Neither sees a host: each answers what the bridge asks it.
The composition is tested through the router's Playbooks (``test_bridge.py``)."""

from __future__ import annotations

import pytest

from ddmd.protocol.jdwp import EventKind, SuspendPolicy
from ddmd.session import holding as holding_module
from ddmd.session import requests as requests_module
from ddmd.session.holding import Holding
from ddmd.session.requests import Requests
from ddmd.session.split import Request

BP, STEP = EventKind.BREAKPOINT, EventKind.SINGLE_STEP
ALL = SuspendPolicy.ALL


def two_debuggers() -> Requests:
    r = Requests()
    r.add(10, Request(1, BP, ALL))
    r.add(11, Request(2, BP, ALL))
    r.add(12, Request(1, STEP, ALL))
    r.add(13, Request(1, BP, ALL))
    return r


# ------------------------------------------------------------------------------ ownership


def test_a_set_the_vm_answered_is_owned_by_its_sender() -> None:
    r = two_debuggers()
    assert (r.owned_by(1), r.owned_by(2), r.owned_by(3)) == (3, 1, 0)
    assert r.by_id()[11] == Request(2, BP, ALL)
    assert 10 not in r.dropped()


def test_a_debugger_clears_only_its_own_requests() -> None:
    r = two_debuggers()
    assert not r.clearing(2, 10, BP)  # debugger 1's: not debugger 2's to clear
    assert not r.clearing(1, 99, BP)  # unknown
    assert r.owned_by(1) == 3
    assert 10 not in r.dropped()
    assert r.clearing(1, 10, BP)
    assert r.owned_by(1) == 2
    assert 10 in r.dropped()  # its events still on their way go to nobody


def test_a_clear_of_another_kind_goes_to_the_vm_but_retires_nothing() -> None:
    r = two_debuggers()
    assert r.clearing(1, 12, BP)  # the VM answers it (it clears nothing: the kind differs)
    assert r.by_id()[12] == Request(1, STEP, ALL)
    assert 12 not in r.dropped()


def test_retire_all_takes_a_debuggers_requests_oldest_first() -> None:
    r = two_debuggers()
    assert r.retire_all(1, BP) == [(10, BP), (13, BP)]
    assert r.owned_by(1) == 1
    assert r.retire_all(1) == [(12, STEP)]
    assert r.retire_all(1) == []
    assert r.owned_by(2) == 1
    assert all(rid in r.dropped() for rid in (10, 12, 13))


def test_a_request_never_owned_is_retired_all_the_same() -> None:
    r = Requests()
    assert r.retire(7) is None  # a Set whose sender left before the VM answered it
    assert 7 in r.dropped()


def test_the_retired_ids_are_bounded_oldest_forgotten_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(requests_module, "MAX_RETIRED", 2)
    r = Requests()
    for rid in (1, 2, 3):
        r.retire(rid)
    assert [rid in r.dropped() for rid in (1, 2, 3)] == [False, True, True]


def test_ddmds_own_requests_are_hidden_until_a_new_connection() -> None:
    r = two_debuggers()
    r.retire(10)
    r.hide(50)
    assert 50 in r.dropped()
    assert 10 in r.dropped()
    r.reset()  # a release: the VM dropped the debuggers' requests, not ddmd's
    assert r.by_id() == {}
    assert 50 in r.dropped()
    assert 10 not in r.dropped()
    r.unhide()  # a new connection: request ids restart
    assert 50 not in r.dropped()


# ------------------------------------------------------------------------------ holding


def test_events_pass_until_held_and_come_in_order_when_released() -> None:
    h = Holding()
    h.joined(1)
    assert h.deliver(1, b"a") == ([b"a"], False)
    h.hold(1)
    assert h.deliver(1, b"b") == ([], False)
    assert h.deliver(1, b"c") == ([], False)
    assert h.deliver(2, b"x") == ([b"x"], False)  # another debugger holds nothing
    assert h.release(1) == [b"b", b"c"]
    assert h.deliver(1, b"d") == ([b"d"], False)
    assert h.release(1) == []


def test_a_queue_past_the_bound_is_given_at_once_and_holds_no_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(holding_module, "MAX_HELD_EVENTS", 2)
    h = Holding()
    h.hold(1)
    assert h.deliver(1, b"a") == ([], False)
    assert h.deliver(1, b"b") == ([], False)
    assert h.deliver(1, b"c") == ([b"a", b"b", b"c"], True)
    assert h.deliver(1, b"d") == ([b"d"], False)


def test_a_debugger_that_joins_or_leaves_holds_nothing() -> None:
    h = Holding()
    h.hold(1)
    h.deliver(1, b"a")
    h.joined(1)
    assert h.deliver(1, b"b") == ([b"b"], False)
    h.hold(2)
    h.left(2)
    assert h.deliver(2, b"c") == ([b"c"], False)
    h.hold(3)
    h.clear()
    assert h.deliver(3, b"d") == ([b"d"], False)
