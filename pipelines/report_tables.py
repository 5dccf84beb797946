"""The comparison tables: training runs collected, medians and spread over repeats per config.

Figures per config are medians over repeats, with min and max as the spread.
Scaling efficiency at N workers is T(N) / (N/N0 * T(N0)) with N0 the smallest
world size measured for the same model, algorithm and batch size.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

PHASES = ("data", "forward", "backward", "comm_exposed", "update")


def config_label(model: str, algorithm: str, workers: int, batch_size: int) -> str:
    """A config across its repeats, as reports compare it: `lenet5-odsgd-ps-w2-b32`."""
    return f"{model}-{algorithm}-w{workers}-b{batch_size}"


def collect_runs(trained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished training runs with their summary and curves."""
    from training.timeline import read_jsonl

    runs = []
    for e in trained:
        d = Path(e["run_dir"])
        s = json.loads((d / "summary.json").read_text())
        algo = f"{s['algorithm']}-{s['comm']}"
        metrics = read_jsonl(d / "metrics.jsonl") if (d / "metrics.jsonl").exists() else []
        runs.append(
            {
                "key": e["key"],
                "algorithm": algo,
                "model": s["model"],
                "dataset": s["dataset"],
                "workers": s["workers"],
                "batch_size": s["batch_size"],
                "config": config_label(s["model"], algo, s["workers"], s["batch_size"]),
                "summary": s,
                "loss_curve": [(r["time_s"], r["loss"]) for r in metrics if r.get("loss") is not None],
                "accuracy_curve": [(r["time_s"], r["accuracy"]) for r in metrics if r.get("accuracy") is not None],
            }
        )
    return runs


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def comparison(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per config (model, algorithm, workers, batch): medians and spread over repeats."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    rows = []
    for config, rs in sorted(by.items()):
        s0 = rs[0]
        thr = [r["summary"]["throughput_samples_per_s"] for r in rs]
        rows.append(
            {
                "config": config,
                "model": s0["model"],
                "algorithm": s0["algorithm"],
                "workers": s0["workers"],
                "batch_size": s0["batch_size"],
                "repeats": len(rs),
                "throughput_repeats": thr,
                "throughput_median": _median(thr),
                "throughput_min": min(x for x in thr if x is not None),
                "throughput_max": max(x for x in thr if x is not None),
                "iter_time_p50_median_s": _median([r["summary"]["iter_time_s"]["p50"] for r in rs]),
                "final_accuracy_median": _median([r["summary"].get("final_accuracy") for r in rs]),
                "time_to_accuracy_median_s": _median([r["summary"].get("time_to_accuracy_s") for r in rs]),
                "train_time_median_s": _median([r["summary"].get("train_time_s") for r in rs]),
                "breakdown_s": {p: _median([r["summary"]["breakdown_s"].get(p) for r in rs]) for p in PHASES},
            }
        )
    for row in rows:
        same = [
            o
            for o in rows
            if (o["model"], o["algorithm"], o["batch_size"]) == (row["model"], row["algorithm"], row["batch_size"])
        ]
        base = min(same, key=lambda o: o["workers"])
        ideal = base["throughput_median"] * row["workers"] / base["workers"]
        row["scaling_efficiency"] = row["throughput_median"] / ideal if ideal else None
    return rows


def best_per_config(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, workers and batch: the fastest algorithm, and the first to the target accuracy."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        groups.setdefault(f"{row['model']}-w{row['workers']}-b{row['batch_size']}", []).append(row)
    best = {}
    for name, rows in groups.items():
        fastest = max(rows, key=lambda r: r["throughput_median"] or 0.0)
        reached = [r for r in rows if r["time_to_accuracy_median_s"] is not None]
        first = min(reached, key=lambda r: r["time_to_accuracy_median_s"]) if reached else None
        best[name] = {
            "fastest": fastest["algorithm"],
            "throughput_samples_per_s": fastest["throughput_median"],
            "first_to_target": first["algorithm"] if first else None,
        }
    return best


def columns(table: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The comparison as columns (mlflow's log_table)."""
    keys = (
        "config",
        "model",
        "algorithm",
        "workers",
        "batch_size",
        "repeats",
        "throughput_median",
        "throughput_min",
        "throughput_max",
        "scaling_efficiency",
        "iter_time_p50_median_s",
        "final_accuracy_median",
        "time_to_accuracy_median_s",
    )
    return {k: [row[k] for row in table] for k in keys}
