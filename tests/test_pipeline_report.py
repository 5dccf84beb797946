"""The comparison: medians over repeats, scaling efficiency, the best algorithm per config (the
regression check is in test_pipeline_regression.py)."""

from __future__ import annotations

from typing import Any

from pipelines.report import best_per_config, comparison

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
