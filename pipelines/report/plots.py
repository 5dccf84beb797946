"""The report's plots: throughput scaling, accuracy against time, iteration breakdown,
predicted against measured, predicted scaling."""

from __future__ import annotations

import re
import statistics
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
from matplotlib.ticker import MaxNLocator  # noqa: E402

from pipelines.report.tables import PHASES  # noqa: E402


def _by_algorithm(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Lines of the scaling plot: one per model, algorithm (variant) and batch, over workers;
    a line of one point is left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = re.sub(r"-w\d+-b\d+$", "", r["config"]) + f" b{r['batch_size']}"
        out.setdefault(label, []).append(r)
    return {k: sorted(v, key=lambda r: r["workers"]) for k, v in out.items() if len(v) > 1}


def _language_model(run: dict[str, Any]) -> bool:
    return bool(run["summary"].get("language_model"))


def _curves(runs: list[dict[str, Any]], lm: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Lines of the image models' accuracy plot (`lm`: the language models' test-loss plot): the
    repeats of each config with at least two evaluations."""
    key = "test_loss_curve" if lm else "accuracy_curve"
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if _language_model(r) == lm and len(r.get(key) or []) > 1:
            out.setdefault(r["config"], []).append(r)
    return out


def _median_curve(curves: list[list[tuple[float, float]]]) -> tuple[list[float], ...]:
    """Repeats aligned by evaluation (they evaluate at the same steps): median time, and median,
    min and max of the value at each evaluation all repeats reached."""
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    return (
        [statistics.median(t for t, _ in col) for col in cols],
        [statistics.median(v for _, v in col) for col in cols],
        [min(v for _, v in col) for col in cols],
        [max(v for _, v in col) for col in cols],
    )


def plot_names(runs: list[dict[str, Any]], table: list[dict[str, Any]], validation: dict[str, Any] | None) -> list[str]:
    """The plots `figures` draws: a plot that would show single points is not drawn."""
    names = []
    if _by_algorithm(table):
        names.append("throughput_scaling.png")
    if _curves(runs):
        names.append("accuracy_vs_time.png")
    if _curves(runs, lm=True):
        names.append("loss_vs_time.png")
    if table:
        names.append("iteration_breakdown.png")
    if validation and validation.get("runs"):
        names.append("predicted_vs_measured.png")
    return names


def figures(
    runs: list[dict[str, Any]], table: list[dict[str, Any]], validation: dict[str, Any] | None
) -> dict[str, Any]:
    """artifact file name -> matplotlib figure, for the plots of `plot_names`."""
    names = plot_names(runs, table, validation)
    figs: dict[str, Any] = {}
    if "throughput_scaling.png" in names:
        figs["throughput_scaling.png"] = _plot_scaling(table)
    if "accuracy_vs_time.png" in names:
        figs["accuracy_vs_time.png"] = _plot_curves(runs, lm=False)
    if "loss_vs_time.png" in names:
        figs["loss_vs_time.png"] = _plot_curves(runs, lm=True)
    if "iteration_breakdown.png" in names:
        figs["iteration_breakdown.png"] = _plot_breakdown(table)
    if "predicted_vs_measured.png" in names:
        figs["predicted_vs_measured.png"] = plot_predicted_vs_measured(validation["runs"])
    return figs


def _plot_scaling(table: list[dict[str, Any]]) -> Any:
    """Throughput against workers (median, min-max bars) with the ideal line N * T(1) of each
    1-worker baseline, and the scaling efficiency against it."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    top = max(r["workers"] for r in table)
    baselines = {r["scaling_baseline"] for r in table} - {None}
    for base in (r for r in table if r["config"] in baselines):
        xs = [1, top]
        ax1.plot(
            xs,
            [base["throughput_median"] * x for x in xs],
            ls="--",
            color="gray",
            lw=1,
            label=f"ideal: N x {base['config']}",
        )
    for label, rows in _by_algorithm(table).items():
        xs = [r["workers"] for r in rows]
        med = [r["throughput_median"] for r in rows]
        err = [
            [m - r["throughput_min"] for m, r in zip(med, rows, strict=True)],
            [r["throughput_max"] - m for m, r in zip(med, rows, strict=True)],
        ]
        ax1.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)
        eff = [(r["workers"], r["scaling_efficiency"]) for r in rows if r["scaling_efficiency"] is not None]
        if len(eff) > 1:
            ax2.plot(*zip(*eff, strict=True), marker="o", label=label)
    ax1.set(xlabel="workers", ylabel="throughput (samples/s)", title="Throughput (median, min-max)")
    ax2.axhline(1.0, ls="--", color="gray", lw=1)
    ax2.set(xlabel="workers", ylabel="scaling efficiency (vs 1 worker)", title="Scaling efficiency", ylim=(0, 1.2))
    if not baselines:
        ax2.text(0.5, 0.5, "no 1-worker baseline", ha="center", transform=ax2.transAxes)
    ax1.legend(fontsize=7)
    return fig


def _plot_curves(runs: list[dict[str, Any]], lm: bool) -> Any:
    """An image model's test accuracy (a language model's test loss) against wall-clock, one
    panel per world size and one line per algorithm (model, batch): the median over repeats,
    the band their min-max, the target as a dashed line."""
    curves = _curves(runs, lm)
    what, key, target_key = (("test loss", "test_loss_curve", "target_loss") if lm
                             else ("test accuracy", "accuracy_curve", "target_accuracy"))
    sizes = sorted({rs[0]["workers"] for rs in curves.values()})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes) + 1, 4.5), squeeze=False, sharey=True)
    algos = sorted({re.sub(r"-w\d+-", "-", c) for c in curves})
    colors = {a: f"C{i % 10}" for i, a in enumerate(algos)}  # an algorithm keeps its colour across panels
    targets = {r["summary"].get(target_key) for rs in curves.values() for r in rs} - {None}
    for ax, n in zip(axes[0], sizes, strict=True):
        for config, rs in curves.items():
            if rs[0]["workers"] != n:
                continue
            label = re.sub(r"-w\d+-b\d+$", "", config) + f" b{rs[0]['batch_size']} (n={len(rs)})"
            t, med, lo, hi = _median_curve([r[key] for r in rs])
            color = colors[re.sub(r"-w\d+-", "-", config)]
            ax.plot(t, med, marker="o", ms=3, label=label, color=color)
            if len(rs) > 1:
                ax.fill_between(t, lo, hi, color=color, alpha=0.2)
        for target in targets:
            ax.axhline(target, ls="--", color="gray", label=f"target {target:g}")
        ax.set(xlabel="wall-clock (s)", title=f"{n} worker{'s' if n > 1 else ''}")
        ax.legend(fontsize=6)
    axes[0][0].set(ylabel=f"{what} (median, min-max band)")
    fig.suptitle(f"{what.capitalize()} against wall-clock")
    return fig


def _plot_breakdown(table: list[dict[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(table) + 2), 4))
    bottom = [0.0] * len(table)
    for phase in PHASES:
        vals = [(r["breakdown_s"].get(phase) or 0.0) * 1e3 for r in table]
        ax.bar(range(len(table)), vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(table)), [r["config"] for r in table], rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="ms per iteration (median)", title="Iteration breakdown")
    ax.legend(fontsize=7)
    return fig


def plot_predicted_vs_measured(runs: list[dict[str, Any]]) -> Any:
    """Predicted against measured iteration time, each run numbered at its point with its
    prediction's 80% interval as an error bar (p10-p90 where a row has none) and the in-situ
    (model) prediction beside it as a hollow marker; the numbers' key, with each run's
    end-to-end and model errors, is a table beside the axes, so no label lies on another. The
    axes span the points, not 0."""
    fig, (ax, key) = plt.subplots(1, 2, figsize=(9.5, 5), gridspec_kw={"width_ratios": [5, 4]})
    pts = [r for r in runs if r.get("predicted_iter_s") is not None and r.get("measured_iter_s") is not None]
    xs = [r["measured_iter_s"] * 1e3 for r in pts]
    ys = [r["predicted_iter_s"] * 1e3 for r in pts]

    def bound(r: dict[str, Any], side: str) -> float:
        v = r.get(f"interval_{side}_s") or r.get("predicted_p10_s" if side == "low" else "predicted_p90_s")
        return (v or r["predicted_iter_s"]) * 1e3

    lo = [max(y - bound(r, "low"), 0.0) for r, y in zip(pts, ys, strict=True)]
    hi = [max(bound(r, "high") - y, 0.0) for r, y in zip(pts, ys, strict=True)]
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label="end to end (profile), 80% interval")
    own = [(x, r["model_predicted_iter_s"] * 1e3)
           for r, x in zip(pts, xs, strict=True) if r.get("model_predicted_iter_s")]
    if own:
        ax.scatter(*zip(*own, strict=True), facecolors="none", edgecolors="C1", label="model (in-situ compute)")
    lines, numbers = [], []
    for i, (r, x, y) in enumerate(zip(pts, xs, ys, strict=True), start=1):
        numbers.append(ax.annotate(str(i), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7))
        model = f", model {r['model_error']:+.0%}" if r.get("model_error") is not None else ""
        lines.append(f"{i}  {r['run']}\n    {r['error']:+.1%} end to end{model}")
    values = xs + [y - d for y, d in zip(ys, lo, strict=True)] + [y + d for y, d in zip(ys, hi, strict=True)]
    values += [y for _, y in own]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad = max(high - low, high * 0.05, 1e-6) * 0.08
    low, high = max(low - pad, 0.0), high + pad
    ax.plot([low, high], [low, high], ls="--", color="gray", label="predicted = measured")
    ax.set(xlabel="measured iteration (ms)", ylabel="predicted iteration (ms)", title="Predicted vs measured",
           xlim=(low, high), ylim=(low, high))
    ax.legend(fontsize=7, loc="upper left")
    ax.xaxis.set_major_locator(MaxNLocator(6, prune="lower"))  # its first label would meet the y axis's
    key.axis("off")
    key.text(0.0, 1.0, "\n".join(lines) or "no predicted run", va="top", ha="left", fontsize=7,
             family="monospace", transform=key.transAxes)
    fig.tight_layout()
    _apart(fig, numbers)
    return fig


def _apart(fig: Any, labels: list[Any]) -> None:
    """Moves each point's number up, in steps of its height, until it meets no number placed
    before it: points that (nearly) coincide get their numbers stacked beside them."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    for label in labels:
        box = label.get_window_extent(renderer)
        while any(box.overlaps(b) for b in placed):
            dx, dy = label.get_position()
            label.set_position((dx, dy + box.height * 72 / fig.dpi + 1))
            box = label.get_window_extent(renderer)
        placed.append(box)


def plot_predicted_scaling(rows: list[dict[str, Any]], assumes: str | None = None) -> Any:
    """Predicted throughput against workers, per workload and algorithm, at the measured link;
    `assumes` (the link rate, the nodes, the ranks per node and the placement) under the title."""
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["link_bandwidth"] in ("measured",) or not any(o["link_bandwidth"] == "measured" for o in rows):
            lines.setdefault(f"{r['workload']} {r['algorithm']} b{r['batch_size']}", []).append(
                (r["workers"], r["throughput_samples_per_s"])
            )
    for label, pts in lines.items():
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=label)
    ax.set(xlabel="workers", ylabel="predicted throughput (samples/s)")
    ax.set_title("Predicted scaling" + (f"\n{assumes}" if assumes else ""), fontsize=9)
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
