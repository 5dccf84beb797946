"""The link as a component of the regression alarm (issue 47): a configuration's primitive, as
the pipeline's microbenchmark measured it, tested against its history and swapped into the
model's re-prediction of the baseline: a slower link is flagged and named first, an unchanged one
is not, and what it explains is the model's iteration on tonight's fit."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelling.measure.records import load_comm
from modelling.network.fit import fit_comm
from pipelines.report import attribution, regression_text
from pipelines.report import regression_comm as rcomm
from pipelines.report import regression_components as rc
from pipelines.report.regression_stats import run_level

GRID = Path(__file__).resolve().parent / "fixtures" / "grids" / "onehost"
PROFILE = json.loads((GRID / "layers.json").read_text())
MODEL = fit_comm(load_comm(GRID / "comm.json"))
SUMMARIES = {p.name: json.loads((p / "summary.json").read_text()) for p in sorted((GRID / "runs").iterdir())}
CPU_FIELDS = {"host_cpu_s", "post_s"}  # CPU time at the ends of a transfer, not the link's


def _slower(fit: dict[str, Any], factor: float) -> dict[str, Any]:
    """A primitive's fit on a link `factor` times slower: every time and cost of the transfer."""
    def scale(v: Any) -> Any:
        if isinstance(v, list):
            return [scale(x) for x in v]
        return v * factor if isinstance(v, int | float) and not isinstance(v, bool) else v

    return {k: scale(v) if k.endswith(("_s", "_s_per_byte")) and k not in CPU_FIELDS else v for k, v in fit.items()}


def _base_parts(summary: dict[str, Any]) -> dict[str, float]:
    scale = summary["batch_size"] / PROFILE["batch_size"]
    parts = {"data": PROFILE.get("data_s", 0.0) * scale, "update": 0.001}
    for r in PROFILE["layers"]:
        parts[f"forward {r['name']}"], parts[f"backward {r['name']}"] = r["fwd_s"] * scale, r["bwd_s"] * scale
    return parts


def _night(rng: random.Random, summary: dict[str, Any], link: float = 1.0, noise: float = 0.03) -> dict[str, Any]:
    """One run's figures: the parts at a host speed that moves 10% between runs, each with its own
    noise, and the microbenchmark's fit of the configuration's primitive with its own noise."""
    host = math.exp(rng.gauss(0, 0.1))
    parts = {k: v * host * math.exp(rng.gauss(0, noise)) for k, v in _base_parts(summary).items()}
    repeat = {"log_thr": -math.log(sum(parts.values())), "within_var": None, "within_df": None,
              "canary_gemm_log": math.log(100.0 / host) + rng.gauss(0, noise), "parts": {**parts, "samples": 10}}
    [(prim, fit)] = rcomm.record(MODEL, summary).items()
    return run_level([repeat]) | {"comm": {prim: _slower(fit, link * math.exp(rng.gauss(0, noise)))}}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), run=st.sampled_from(sorted(SUMMARIES)), link=st.floats(1.5, 2.5))
def test_a_slower_link_is_flagged_named_first_and_explained_by_the_model(seed: int, run: str, link: float) -> None:
    rng = random.Random(seed)
    summary = SUMMARIES[run]
    predict = attribution.model_predictor(PROFILE, MODEL, summary)
    history = [_night(rng, summary) for _ in range(10)]
    now = _night(rng, summary, link)
    check = rc.check_components(now, history, 0.01, 0.05, predict)
    [prim] = now["comm"]
    assert check["flagged"] and rcomm.primitive_of(check["flagged"][0]) == prim, check["tests"]
    assert f"{prim} per-byte" in check["flagged"]
    [row] = [r for r in check["attribution"] if r["component"] == prim]
    base_fits = rcomm.baseline([h["comm"] for h in history])
    base = attribution.baseline_parts([h["parts"] for h in history])
    assert row["explains"] == pytest.approx(predict(base, {prim: now["comm"][prim]}) / predict(base, base_fits) - 1)
    assert row["explains"] > 0.05
    assert row["change"] == pytest.approx(now["comm"][prim]["measured_s"][-1] / base_fits[prim]["measured_s"][-1] - 1)


def test_an_unchanged_link_raises_few_component_alarms() -> None:
    """25 unslowed nights of each configuration, the microbenchmark 3% noisy: the family's false
    alarms stay near alpha (0.01), with the link's figures among the tested."""
    rng = random.Random(11)
    alarms = 0
    for run in SUMMARIES:
        summary = SUMMARIES[run]
        predict = attribution.model_predictor(PROFILE, MODEL, summary)
        for _ in range(25):
            history = [_night(rng, summary) for _ in range(10)]
            check = rc.check_components(_night(rng, summary), history, 0.01, 0.05, predict)
            assert any(rcomm.primitive_of(r["component"]) for r in check["tests"])
            alarms += bool(check["flagged"])
    assert alarms <= 3  # of 100 nights


def test_without_a_model_the_link_is_tested_but_explains_nothing() -> None:
    """Only the model turns a link's cost into iteration time: without it a slower link's figure
    moves (its p-value says so) and it is not flagged as explaining the iteration."""
    rng = random.Random(3)
    summary = SUMMARIES["mlp-ssgd-allreduce-w2-b32-r0"]
    history = [_night(rng, summary) for _ in range(10)]
    check = rc.check_components(_night(rng, summary, 2.0), history, 0.01, 0.05)
    row = next(r for r in check["tests"] if r["component"] == "allreduce per-byte")
    assert row["p_adjusted"] < 0.01 and row["explains"] == 0.0 and not row["flagged"]
    assert row["change"] == pytest.approx(1.0, abs=0.2)


def test_the_baseline_fit_is_the_historys_elementwise_median() -> None:
    fit = MODEL["fits"][1]
    fits = [{fit["primitive"]: _slower(fit, f)} for f in (1.0, 3.0, 2.0)]
    [(prim, base)] = rcomm.baseline(fits).items()
    assert base["measured_s"] == [2.0 * t for t in fit["measured_s"]]
    assert base["alpha_s"] == 2.0 * fit["alpha_s"] and base["sizes"] == fit["sizes"]
    assert base["primitive"] == prim and base["workers"] == fit["workers"]


@pytest.mark.parametrize(("run", "prim"), [("mlp-ssgd-allreduce-w2-b32-r0", "allreduce"),
                                           ("mlp-ssgd-ps-w2-b32-r0", "ps"), ("mlp-odsgd-ps-w2-b32-r0", "ps"),
                                           ("mlp-asgd-ps-w2-b32-r0", "asgd")])
def test_each_algorithm_records_the_primitive_it_transfers_with(run: str, prim: str) -> None:
    [(got, fit)] = rcomm.record(MODEL, SUMMARIES[run]).items()
    assert got == prim and fit["primitive"] == prim and fit["workers"] == SUMMARIES[run]["workers"]
    assert rcomm.record(None, SUMMARIES[run]) is None


def test_the_line_names_a_slower_link() -> None:
    check = {"effect": -0.12, "components": {"flagged": ["ps per-byte"], "attribution": [
        {"component": "ps", "change": 0.5, "explains": 0.131}, {"component": "data", "change": 0.0, "explains": 0.0}]}}
    assert regression_text.line(check) == "iteration +13.6%: ps +50.0% explains +13.1 points"


def test_a_links_two_figures_cost_the_family_one_test() -> None:
    """Closed testing: the link's primitive is one group at the top (its smallest p-value times
    its two figures), its figures adjusted within it and never below the group's."""
    adjusted = rc.gatekept({"compute": 0.004, "data": 0.9, "allreduce latency": 0.5, "allreduce per-byte": 0.004})
    # Holm at the top over compute (0.004), the link (0.008) and data: 0.012, 0.016, 0.9.
    assert adjusted == pytest.approx({"compute": 0.012, "data": 0.9, "allreduce per-byte": 0.016,
                                      "allreduce latency": 0.5})
