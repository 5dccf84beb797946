"""The suite's tiers: which `-m` selections scripts/test.sh spreads over the CPUs (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.conftest import may_select_slow


@pytest.mark.parametrize(("markexpr", "slow"), [
    ("", True), ("slow", True), ("netns", True), ("faults or not slow", True), ("not (faults and slow)", True),
    ("slow and not netns", True), ("(", True),
    ("not slow", False), ("faults and not slow", False), ("not (slow or netns)", False),
    ("not slow and not faults", False), ("netns and not slow", False),
])
def test_only_a_selection_that_leaves_out_every_slow_test_runs_on_several_workers(markexpr: str, slow: bool) -> None:
    assert may_select_slow(markexpr) is slow
