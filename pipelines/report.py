"""The comparison report: algorithms side by side, plots, and the regression check.

Figures per config are medians over repeats, with min and max as the spread.
Scaling efficiency at N workers is T(N) / (N/N0 * T(N0)) with N0 the smallest
world size measured for the same model, algorithm and batch size.

Regression check, against the previous FINISHED parent run with the same spec
hash and hardware label (found with MLflow search, its report.json artifact):
- throughput: the median over repeats dropped by more than
  `regression.throughput_drop` (a fraction) AND every repeat of this run lies
  below the baseline's median, so one noisy repeat neither raises nor hides it;
- prediction error: the median absolute prediction error rose by more than
  `regression.prediction_error_rise` (absolute).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

PHASES = ("data", "forward", "backward", "comm_exposed", "update")
STATISTIC = (
    "median over repeats; a throughput regression needs the median drop above the threshold "
    "and every repeat below the baseline median"
)


# -- collecting ------------------------------------------------------------------------------
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
                "config": f"{s['model']}-{algo}-w{s['workers']}-b{s['batch_size']}",
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


# -- regression ------------------------------------------------------------------------------
def find_baseline(tracker: Any, ctx: dict[str, Any]) -> dict[str, Any] | None:
    """The previous FINISHED run of the same spec hash and hardware, with its report; None if none
    (or MLflow is unreachable: then the check says so instead of guessing)."""
    if not tracker.online:
        return None
    try:
        import mlflow

        runs = tracker.client.search_runs(
            [tracker.experiment_id()],
            filter_string=(
                f"tags.`ddlbench.spec_hash` = '{ctx['spec_hash']}' AND "
                f"tags.`ddlbench.hardware` = '{ctx['hardware']}' AND "
                "tags.`ddlbench.node` = 'pipeline' AND attributes.status = 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=20,
        )
        for run in runs:
            if run.data.tags.get("ddlbench.run_key") == ctx["run_key"]:
                continue
            try:
                path = mlflow.artifacts.download_artifacts(
                    run_id=run.info.run_id, artifact_path="report/report.json", tracking_uri=tracker.tracking_uri
                )
            except Exception:  # noqa: BLE001 - a finished run without a report is no baseline
                continue
            return {
                "run_key": run.data.tags.get("ddlbench.run_key"),
                "run_id": run.info.run_id,
                "report": json.loads(Path(path).read_text()),
            }
    except Exception:  # noqa: BLE001 - MLflow down: no baseline, said in the report
        return None
    return None


def regressions(
    table: list[dict[str, Any]], validation: dict[str, Any] | None, baseline: dict[str, Any] | None, thresholds: Any
) -> list[dict[str, Any]]:
    if baseline is None:
        return []
    base_rows = {r["config"]: r for r in baseline["report"].get("comparison", [])}
    found = []
    for row in table:
        base = base_rows.get(row["config"])
        if not base or not base.get("throughput_median") or row["throughput_median"] is None:
            continue
        drop = 1.0 - row["throughput_median"] / base["throughput_median"]
        all_below = all(x < base["throughput_median"] for x in row["throughput_repeats"] if x is not None)
        if drop > thresholds.throughput_drop and all_below:
            found.append(
                {
                    "config": row["config"],
                    "figure": "throughput_samples_per_s",
                    "baseline": base["throughput_median"],
                    "now": row["throughput_median"],
                    "change": -drop,
                    "threshold": thresholds.throughput_drop,
                }
            )
    base_err = (baseline["report"].get("validation") or {}).get("median_abs_error")
    now_err = (validation or {}).get("median_abs_error")
    if base_err is not None and now_err is not None and now_err - base_err > thresholds.prediction_error_rise:
        found.append(
            {
                "config": "all",
                "figure": "prediction_median_abs_error",
                "baseline": base_err,
                "now": now_err,
                "change": now_err - base_err,
                "threshold": thresholds.prediction_error_rise,
            }
        )
    return found


# -- plots -----------------------------------------------------------------------------------
def _by_algorithm(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(f"{r['model']} {r['algorithm']} b{r['batch_size']}", []).append(r)
    return out


def figures(
    runs: list[dict[str, Any]], table: list[dict[str, Any]], validation: dict[str, Any] | None
) -> dict[str, Any]:
    """artifact file name -> matplotlib figure."""
    figs: dict[str, Any] = {}

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in _by_algorithm(table).items():
        rows = sorted(rows, key=lambda r: r["workers"])
        xs = [r["workers"] for r in rows]
        med = [r["throughput_median"] for r in rows]
        err = [
            [m - r["throughput_min"] for m, r in zip(med, rows, strict=True)],
            [r["throughput_max"] - m for m, r in zip(med, rows, strict=True)],
        ]
        ax1.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
        ax2.plot(xs, [r["scaling_efficiency"] for r in rows], marker="o", label=label)
    ax1.set(xlabel="workers", ylabel="throughput (samples/s)", title="Throughput (median, min-max)")
    ax2.set(xlabel="workers", ylabel="scaling efficiency", title="Scaling efficiency", ylim=(0, 1.2))
    ax1.legend(fontsize=7)
    figs["throughput_scaling.png"] = fig

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        if r["loss_curve"]:
            ax1.plot(*zip(*r["loss_curve"], strict=True), label=r["key"], lw=1)
        if r["accuracy_curve"]:
            ax2.plot(*zip(*r["accuracy_curve"], strict=True), marker="o", label=r["key"])
    targets = {r["summary"].get("target_accuracy") for r in runs} - {None}
    for target in targets:
        ax2.axhline(target, ls="--", color="gray")
    ax1.set(xlabel="wall-clock (s)", ylabel="training loss", title="Loss against wall-clock time")
    ax2.set(xlabel="wall-clock (s)", ylabel="test accuracy", title="Accuracy against wall-clock time")
    if any(r["loss_curve"] for r in runs):
        ax1.legend(fontsize=6)
    figs["accuracy_vs_time.png"] = fig

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(table) + 2), 4))
    bottom = [0.0] * len(table)
    for phase in PHASES:
        vals = [(r["breakdown_s"].get(phase) or 0.0) * 1e3 for r in table]
        ax.bar(range(len(table)), vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(table)), [r["config"] for r in table], rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="ms per iteration (median)", title="Iteration breakdown")
    ax.legend(fontsize=7)
    figs["iteration_breakdown.png"] = fig

    if validation and validation.get("runs"):
        figs["predicted_vs_measured.png"] = plot_predicted_vs_measured(validation["runs"])
    return figs


def plot_predicted_vs_measured(runs: list[dict[str, Any]]) -> Any:
    """Scatter of predicted against measured iteration time, each point labelled with its error."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    pts = [r for r in runs if r.get("predicted_iter_s") is not None and r.get("measured_iter_s") is not None]
    xs = [r["measured_iter_s"] * 1e3 for r in pts]
    ys = [r["predicted_iter_s"] * 1e3 for r in pts]
    ax.scatter(xs, ys)
    for r, x, y in zip(pts, xs, ys, strict=True):
        ax.annotate(f"{r['run']} ({r['error']:+.0%})", (x, y), fontsize=6)
    top = max(xs + ys + [1e-3]) * 1.1
    ax.plot([0, top], [0, top], ls="--", color="gray", label="predicted = measured")
    ax.set(
        xlabel="measured iteration (ms)",
        ylabel="predicted iteration (ms)",
        title="Predicted vs measured",
        xlim=(0, top),
        ylim=(0, top),
    )
    ax.legend(fontsize=7)
    return fig


def plot_predicted_scaling(rows: list[dict[str, Any]]) -> Any:
    """Predicted throughput against workers, per workload and algorithm, at the measured link."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["link_bandwidth"] in ("measured",) or not any(o["link_bandwidth"] == "measured" for o in rows):
            lines.setdefault(f"{r['workload']} {r['algorithm']} b{r['batch_size']}", []).append(
                (r["workers"], r["throughput_samples_per_s"])
            )
    for label, pts in lines.items():
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label)
    ax.set(xlabel="workers", ylabel="predicted throughput (samples/s)", title="Predicted scaling")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    return fig


# -- markdown --------------------------------------------------------------------------------
def _f(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def write_report(
    out: Path,
    ctx: dict[str, Any],
    spec: Any,
    runs: list[dict[str, Any]],
    table: list[dict[str, Any]],
    validation: dict[str, Any] | None,
    baseline: dict[str, Any] | None,
    found: list[dict[str, Any]],
) -> Path:
    """report.md (readable) and report.json (what the next run compares against)."""
    out.mkdir(parents=True, exist_ok=True)
    best = best_per_config(table)
    doc = {
        "run_key": ctx["run_key"],
        "spec_hash": ctx["spec_hash"],
        "hardware": ctx["hardware"],
        "comparison": table,
        "best": best,
        "validation": {k: (validation or {}).get(k) for k in ("median_abs_error", "worst_abs_error")},
        "baseline_run_key": baseline["run_key"] if baseline else None,
        "regressions": found,
        "statistic": STATISTIC,
        "thresholds": spec.regression.model_dump(),
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str))
    md = [
        f"# ddlbench report: {ctx['run_key']}",
        "",
        f"Spec `{spec.name}` (hash `{ctx['spec_hash']}`), hardware `{ctx['hardware']}`, "
        f"suite `{ctx['suite']}`, git `{ctx.get('git_commit') or 'unknown'}`, {len(runs)} training runs.",
        "",
        "## Algorithms compared",
        "",
        "| config | repeats | throughput samples/s (median [min, max]) | scaling eff. | iter p50 ms "
        "| final accuracy | time to target s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        md.append(
            f"| {r['config']} | {r['repeats']} | {_f(r['throughput_median'])} [{_f(r['throughput_min'])}, "
            f"{_f(r['throughput_max'])}] | {_f(r['scaling_efficiency'], 3)} | "
            f"{_f((r['iter_time_p50_median_s'] or 0) * 1e3)} | {_f(r['final_accuracy_median'], 3)} | "
            f"{_f(r['time_to_accuracy_median_s'])} |"
        )
    md += [
        "",
        "## Best algorithm per config",
        "",
        "| config | fastest | samples/s | first to target |",
        "|---|---|---|---|",
    ]
    md += [
        f"| {k} | {v['fastest']} | {_f(v['throughput_samples_per_s'])} | {v['first_to_target'] or '-'} |"
        for k, v in best.items()
    ]
    md += [
        "",
        "## Iteration breakdown (ms, median)",
        "",
        "| config | " + " | ".join(PHASES) + " |",
        "|---|" + "---|" * len(PHASES),
    ]
    md += [
        f"| {r['config']} | " + " | ".join(_f((r["breakdown_s"][p] or 0) * 1e3, 3) for p in PHASES) + " |"
        for r in table
    ]
    md += ["", "## Predicted vs measured", ""]
    if validation and validation.get("runs"):
        md += ["| run | predicted iter ms | measured iter ms | error |", "|---|---|---|---|"]
        md += [
            f"| {r['run']} | {_f((r.get('predicted_iter_s') or 0) * 1e3)} | "
            f"{_f((r.get('measured_iter_s') or 0) * 1e3)} | {_f(r.get('error'), 3)} |"
            for r in validation["runs"]
        ]
        md += [
            "",
            f"Median absolute error {_f(validation['median_abs_error'], 3)}, "
            f"worst {_f(validation['worst_abs_error'], 3)}.",
        ]
    else:
        md.append("No validation (profile, microbench or training skipped or failed).")
    md += [
        "",
        "## Regression check",
        "",
        f"Statistic: {STATISTIC}. Thresholds: throughput drop > {spec.regression.throughput_drop:.0%}, "
        f"prediction error rise > {spec.regression.prediction_error_rise:.3g}.",
        "",
    ]
    if baseline is None:
        md.append(
            "No baseline: no earlier FINISHED run of this spec hash on this hardware was found "
            "(or MLflow was unreachable)."
        )
    elif not found:
        md.append(f"Baseline `{baseline['run_key']}`: no regression.")
    else:
        md.append(f"Baseline `{baseline['run_key']}`: **{len(found)} regression(s)**")
        md += [
            f"- {g['config']} {g['figure']}: {_f(g['baseline'])} -> {_f(g['now'])} "
            f"(change {g['change']:+.3g}, threshold {g['threshold']:.3g})"
            for g in found
        ]
    md += [
        "",
        "Plots: throughput_scaling.png, accuracy_vs_time.png, iteration_breakdown.png, "
        "predicted_vs_measured.png (MLflow artifacts of the report run).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path
