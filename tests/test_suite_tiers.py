"""The suite's tiers: which `-m` selections scripts/test.sh spreads over the CPUs (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.conftest import ALONE, may_select


@pytest.mark.parametrize(("markexpr", "alone"), [
    ("", True), ("slow", True), ("alone", True), ("netns", True), ("faults or not slow", True),
    ("not (faults and slow)", True), ("slow and not netns", True), ("(", True), ("slow and alone", True),
    ("not slow", False), ("faults and not slow", False), ("not (slow or netns)", False),
    ("not slow and not faults", False), ("netns and not slow", False), ("not alone", False),
    ("slow and not alone", False), ("faults and not alone", False),
])
def test_only_a_selection_that_leaves_out_every_test_marked_alone_runs_on_several_workers(
        markexpr: str, alone: bool) -> None:
    assert may_select(markexpr, ALONE) is alone


def test_a_selection_of_slow_tests_may_hold_one_and_the_tier_none() -> None:
    assert may_select("", frozenset({"slow"})) and not may_select("not slow", frozenset({"slow"}))
