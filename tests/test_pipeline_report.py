"""The comparison and the regression check: medians over repeats, scaling efficiency, and a
drop flagged only when the repeats agree."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.report import best_per_config, comparison, regressions
from pipelines.spec import RegressionSpec

PHASES = {"data": 0.001, "forward": 0.002, "backward": 0.004, "comm_exposed": 0.003, "update": 0.001}


def _run(algo: str, workers: int, thr: float, repeat: int, tta: float | None = None) -> dict[str, Any]:
    summary = {
        "throughput_samples_per_s": thr,
        "iter_time_s": {"p50": 64 / thr},
        "final_accuracy": 0.9,
        "time_to_accuracy_s": tta,
        "train_time_s": 10.0,
        "breakdown_s": PHASES,
    }
    return {
        "key": f"m-{algo}-w{workers}-b32-r{repeat}",
        "algorithm": algo,
        "model": "m",
        "dataset": "digits",
        "workers": workers,
        "batch_size": 32,
        "config": f"m-{algo}-w{workers}-b32",
        "summary": summary,
        "loss_curve": [],
        "accuracy_curve": [],
    }


def _table(values: dict[tuple[str, int], list[float]]) -> list[dict[str, Any]]:
    return comparison([_run(a, w, t, i) for (a, w), ts in values.items() for i, t in enumerate(ts)])


def test_comparison_takes_medians_and_scaling_efficiency() -> None:
    table = {
        r["config"]: r for r in _table({("ssgd-allreduce", 2): [100, 90, 300], ("ssgd-allreduce", 4): [150, 160, 140]})
    }
    two, four = table["m-ssgd-allreduce-w2-b32"], table["m-ssgd-allreduce-w4-b32"]
    assert (two["throughput_median"], two["throughput_min"], two["throughput_max"]) == (100, 90, 300)
    assert two["scaling_efficiency"] == 1.0
    assert four["scaling_efficiency"] == 150 / 200


def test_best_algorithm_per_config_and_first_to_target() -> None:
    runs = [
        _run("ssgd-allreduce", 2, 100, 0, tta=5.0),
        _run("odsgd-ps", 2, 120, 0, tta=6.0),
        _run("asgd-ps", 2, 130, 0, tta=None),
    ]
    best = best_per_config(comparison(runs))
    assert best == {
        "m-w2-b32": {"fastest": "asgd-ps", "throughput_samples_per_s": 130, "first_to_target": "ssgd-allreduce"}
    }


def _baseline(values: dict[tuple[str, int], list[float]], error: float = 0.05) -> dict[str, Any]:
    return {"run_key": "before", "report": {"comparison": _table(values), "validation": {"median_abs_error": error}}}


def test_a_drop_of_the_median_with_every_repeat_below_is_a_regression() -> None:
    base = _baseline({("odsgd-ps", 2): [100, 102, 98]})
    now = _table({("odsgd-ps", 2): [80, 85, 82]})
    found = regressions(now, {"median_abs_error": 0.05}, base, RegressionSpec(throughput_drop=0.1))
    assert [(f["config"], f["figure"]) for f in found] == [("m-odsgd-ps-w2-b32", "throughput_samples_per_s")]
    assert found[0]["change"] == pytest.approx(-0.18) and found[0]["baseline"] == 100


def test_one_noisy_repeat_is_not_a_regression_and_within_threshold_neither() -> None:
    base = _baseline({("odsgd-ps", 2): [100, 102, 98]})
    thresholds = RegressionSpec(throughput_drop=0.1)
    # median down 20%, but one repeat is as fast as the baseline: the repeats disagree
    assert regressions(_table({("odsgd-ps", 2): [80, 101, 70]}), None, base, thresholds) == []
    # every repeat below, but the median drop (5%) is within the threshold
    assert regressions(_table({("odsgd-ps", 2): [95, 96, 94]}), None, base, thresholds) == []
    # no baseline: nothing to compare
    assert regressions(_table({("odsgd-ps", 2): [10]}), None, None, thresholds) == []


def test_a_rise_of_the_prediction_error_is_a_regression() -> None:
    base = _baseline({("ssgd-allreduce", 2): [100]}, error=0.05)
    now = _table({("ssgd-allreduce", 2): [100]})
    thresholds = RegressionSpec(prediction_error_rise=0.1)
    assert regressions(now, {"median_abs_error": 0.12}, base, thresholds) == []
    found = regressions(now, {"median_abs_error": 0.2}, base, thresholds)
    assert [f["figure"] for f in found] == ["prediction_median_abs_error"]
