"""The measurement protocol's choices (pipelines/stages/measure.py)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from infra.bounds import BUDGET_S
from pipelines.spec import load_spec
from pipelines.stages.measure import SMALLEST, plan_sizes

SMOKE = Path(__file__).resolve().parent.parent / "specs" / "smoke.yaml"


@settings(max_examples=30, deadline=None)
@given(
    params=st.integers(1_000, 200_000_000),
    factor=st.sampled_from([1.0, 2.0, 4.0, 16.0]),
    budget=st.floats(0.5, 600),
    rate=st.sampled_from([None, "75mbit", "1gbit"]),
    workers=st.sampled_from([[2], [2, 4]]),
)
def test_sizes_follow_the_models_within_the_budget(params, factor, budget, rate, workers) -> None:
    """Every factor of 4 from 4 KiB; up to factor x the model's bytes unless the budget cuts the
    largest; never fewer than 3 sizes; within the budget unless only 3 are left."""
    spec = load_spec(SMOKE, {"microbench.max_size_factor": factor, "microbench.budget_s": budget,
                             "network.link_bandwidth": rate, "workers": workers})
    plan = plan_sizes(params, spec)
    sizes = plan["sizes"]
    assert sizes == [SMALLEST * 4**i for i in range(len(sizes))] and len(sizes) >= 3
    assert plan["estimated_s"] <= budget or len(sizes) == 3
    top = max(params * factor, 16 * SMALLEST)
    if plan["estimated_s"] <= budget and sizes[-1] < top:
        # cut by the budget: one more size would not fit
        bigger = load_spec(SMOKE, {"microbench.max_size_factor": factor, "microbench.budget_s": BUDGET_S.limit,
                                   "network.link_bandwidth": rate, "workers": workers})
        assert len(plan_sizes(params, bigger)["sizes"]) > len(sizes)
    else:
        assert sizes[-1] >= top or len(sizes) == 3
    assert plan["covers_model"] == (sizes[-1] >= params)
