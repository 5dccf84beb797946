"""The report's plots: throughput scaling, accuracy against time, iteration breakdown,
predicted against measured, predicted scaling."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from pipelines.report_tables import PHASES  # noqa: E402


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
