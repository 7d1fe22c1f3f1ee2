"""The two tables of ``stability.py``: every entry has its reason, and no command is both
storable and one that ends validity."""

from __future__ import annotations

from ddmd.session import stability
from ddmd.session.lanes import SLOW_LANE
from ddmd.session.plan import PLAN
from ddmd.session.stability import CACHEABLE_KEYS, ENDING_KEYS, ENDS, STABILITY, Validity


def test_every_entry_has_a_reason() -> None:
    assert all(stable.why.strip() for stable in STABILITY.values())
    assert all(why.strip() for why in ENDS.values())
    assert all(step.why.strip() and step.after.strip() for step in PLAN.values())


def test_no_command_is_both_storable_and_one_that_ends_validity() -> None:
    assert not CACHEABLE_KEYS & ENDING_KEYS
    assert not set(STABILITY) & set(ENDS)


def test_only_storable_commands_are_ever_speculated() -> None:
    assert set(PLAN) <= set(STABILITY)


def test_volatile_commands_are_never_stored() -> None:
    volatile = {(1, 21), (2, 16), (9, 10), (6, 4), (1, 2), (1, 3), (1, 20), (2, 8), (14, 1)}
    assert not volatile & set(STABILITY)


def test_what_the_router_answers_itself_stays_its_own() -> None:
    """VM.Version and IDSizes are cached by the router; Dispose is answered by it."""
    assert not {(1, 1), (1, 7), (1, 6)} & set(STABILITY)
    intake = {key for key, rule in SLOW_LANE.items() if rule.by == "intake"}
    assert not intake & set(STABILITY)


def test_every_validity_class_is_used() -> None:
    assert {s.validity for s in STABILITY.values()} == set(Validity)
    assert stability.REDEFINES <= ENDING_KEYS
