"""The comparison tables: training runs collected, medians and spread over repeats per config.

Figures per config are medians over repeats, with min and max as the spread.
Time to accuracy counts a repeat that never reached the target as infinitely late, so
the median is "not reached" when most repeats did not reach it.

Scaling efficiency at N workers is T(N) / (N * T(1)), with T(1) the measured
throughput of a 1-worker run of the same model and batch size (the grid adds one
when a spec asks for scaling): the same algorithm at 1 worker when measured, else
SSGD over allreduce, else any 1-worker run. Without one it is None, never a config
measured against itself.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from infra.hostload import QUIET
from pipelines.spec import config_of
from training.measure.timeline import read_jsonl

PHASES = ("data", "forward", "backward", "comm_exposed", "update")
BASELINE_ALGORITHM = "ssgd-allreduce"
NO_BASELINE = "no 1-worker baseline"


def config_label(model: str, algorithm: str, workers: int, batch_size: int) -> str:
    """A config across its repeats, as reports compare it: `lenet5-odsgd-ps-w2-b32`."""
    return f"{model}-{algorithm}-w{workers}-b{batch_size}"


def collect_runs(trained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished training runs with their summary and curves."""
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
                "config": config_of(e["key"]),
                "summary": s,
                "loss_curve": [(r["time_s"], r["loss"]) for r in metrics if r.get("loss") is not None],
                "accuracy_curve": [(r["time_s"], r["accuracy"]) for r in metrics if r.get("accuracy") is not None],
                "test_loss_curve": [(r["time_s"], r["test_loss"]) for r in metrics if r.get("test_loss") is not None],
            }
        )
    return runs


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _spread(xs: list[float | None]) -> tuple[float | None, float | None, float | None]:
    """Median, min and max of the known values."""
    vals = [x for x in xs if x is not None]
    return (statistics.median(vals), min(vals), max(vals)) if vals else (None, None, None)


def _reached(summary: dict[str, Any]) -> bool:
    if summary.get("target_reached") is not None:
        return bool(summary["target_reached"])
    return summary.get("time_to_accuracy_s") is not None


def _to_target(rs: list[dict[str, Any]], key: str) -> tuple[float | None, float | None, float | None]:
    """Median, min and max over repeats of a figure to the target. A repeat that did not reach
    it counts as infinitely late: the median or max it decides is None ("not reached")."""
    late = [
        math.inf if not _reached(r["summary"]) else float(r["summary"][key])
        for r in rs
        if not _reached(r["summary"]) or r["summary"].get(key) is not None
    ]
    known = [v for v in late if v != math.inf]
    if not known:
        return None, None, None
    med, top = statistics.median(late), max(late)
    return (None if med == math.inf else med), min(known), (None if top == math.inf else top)


def _baseline(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured 1-worker row of the same model and batch that `row` scales against."""
    ones = [
        o
        for o in rows
        if o["workers"] == 1
        and (o["model"], o["batch_size"]) == (row["model"], row["batch_size"])
        and o["throughput_median"]
    ]
    for pick in (row["algorithm"], BASELINE_ALGORITHM):
        same = [o for o in ones if o["algorithm"] == pick]
        if same:
            return same[0]
    return ones[0] if ones else None


def comparison(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per config (model, algorithm, workers, batch): medians and spread over repeats."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["config"], []).append(r)
    rows = []
    for config, rs in sorted(by.items()):
        s0 = rs[0]
        thr = [r["summary"]["throughput_samples_per_s"] for r in rs]
        acc, acc_min, acc_max = _spread([r["summary"].get("final_accuracy") for r in rs])
        tta, tta_min, tta_max = _to_target(rs, "time_to_accuracy_s")
        sta, sta_min, sta_max = _to_target(rs, "steps_to_accuracy")
        targets = {r["summary"].get("target_accuracy") for r in rs} - {None}
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
                "final_accuracy_median": acc,
                "final_accuracy_min": acc_min,
                "final_accuracy_max": acc_max,
                "target_accuracy": max(targets) if targets else None,
                "target_reached_repeats": sum(_reached(r["summary"]) for r in rs),
                "time_to_accuracy_median_s": tta,
                "time_to_accuracy_min_s": tta_min,
                "time_to_accuracy_max_s": tta_max,
                "steps_to_accuracy_median": sta,
                "steps_to_accuracy_min": sta_min,
                "steps_to_accuracy_max": sta_max,
                "steps_median": _median([r["summary"].get("steps") for r in rs]),
                "train_time_median_s": _median([r["summary"].get("train_time_s") for r in rs]),
                "breakdown_s": {p: _median([r["summary"]["breakdown_s"].get(p) for r in rs]) for p in PHASES},
                **_language_model(rs),
            }
        )
    for row in rows:
        base = _baseline(row, rows)
        row["scaling_baseline"] = base["config"] if base else None
        row["scaling_efficiency"] = (
            row["throughput_median"] / (base["throughput_median"] * row["workers"])
            if base and row["throughput_median"] is not None
            else None
        )
    return rows


def _language_model(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """tokens/s, MFU, loss and time to the target loss of a language model's config (None otherwise)."""
    fig = {k: [r["summary"].get(k) for r in rs] for k in ("throughput_tokens_per_s", "mfu", "final_test_loss")}
    if not any(v is not None for v in fig["throughput_tokens_per_s"]):
        return {"tokens_per_s_median": None}
    tok, mfu = _spread(fig["throughput_tokens_per_s"]), _spread(fig["mfu"])
    ttl = _to_target(rs, "time_to_loss_s")
    targets = {r["summary"].get("target_loss") for r in rs} - {None}
    return {"tokens_per_s_median": tok[0], "tokens_per_s_min": tok[1], "tokens_per_s_max": tok[2],
            "mfu_median": mfu[0], "mfu_min": mfu[1], "mfu_max": mfu[2],
            "final_test_loss_median": _median(fig["final_test_loss"]), "target_loss": min(targets, default=None),
            "time_to_loss_median_s": ttl[0], "time_to_loss_min_s": ttl[1], "time_to_loss_max_s": ttl[2]}


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
            "fastest_config": fastest["config"],
            "first_to_target_config": first["config"] if first else None,
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
        "final_accuracy_min",
        "final_accuracy_max",
        "time_to_accuracy_min_s",
        "time_to_accuracy_max_s",
        "steps_to_accuracy_median",
        "target_reached_repeats",
        "scaling_baseline",
        "tokens_per_s_median",
        "mfu_median",
    )
    return {k: [row.get(k) for row in table] for k in keys}


def host_load(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The share of the host's CPU that other work used during the training runs (median, min,
    max over the runs that measured it; infra/hostload.py), or None where none could."""
    shares = [s for r in runs if (s := (r["summary"].get("environment") or {}).get("host_other_cpu_share")) is not None]
    if not shares:
        return None
    return {"median": statistics.median(shares), "min": min(shares), "max": max(shares), "runs": len(shares),
            "loaded": max(shares) >= QUIET}


def describe_load(load: dict[str, Any] | None) -> str:
    """The report's line on the conditions: a figure from a loaded host says so."""
    if load is None:
        return "Host load: not measured (the provider's ranks are not this launcher's processes)."
    text = (f"Host load: other work used {load['median']:.0%} [{load['min']:.0%}, {load['max']:.0%}] of the "
            f"host's CPU during the {load['runs']} training runs")
    if load["loaded"]:
        return text + (f": **a loaded host** (quiet is below {QUIET:.0%}); its figures scatter more than a "
                       "quiet host's, and the regression alarm's rates were measured on a quiet one.")
    return text + f": a quiet host (below {QUIET:.0%})."
