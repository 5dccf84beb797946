"""Each prediction with an interval: p10-p90 of the predictions re-made from every pooled round's
inputs (each round's layer profile with each round's microbenchmark, fitted on its own).

The pooled inputs the point prediction uses are medians over the rounds; how far the rounds'
own predictions lie apart is how much the same measurements, taken at another moment of the
host, would move the prediction. A single round of each gives a point: no interval. The
interval is widened to hold the pooled prediction itself: that need not lie between the rounds'
own (the straggler term and the fit are not linear in their inputs), and an interval that leaves
out the figure it brackets would mislead.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from modelling.calibration import interval
from modelling.measure.records import CommModelError
from modelling.network.fit import fit_comm
from modelling.predict import predict
from modelling.scenario import Scenario
from pipelines.context import RunContext
from pipelines.stages.grid import predictions
from pipelines.stages.runner import workload_dir

ROUND_GLOB = "r*"


def round_tables(ctx: RunContext) -> dict[str, list[dict[str, Any]]]:
    """Workload dir -> the layer table of each profile round (profile/NAME/rI/layers.json),
    or the pooled one alone where no rounds were kept."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pooled in ctx.paths.layer_files():
        rounds = sorted(pooled.parent.glob(f"{ROUND_GLOB}/layers.json"))
        out[pooled.parent.name] = [json.loads(p.read_text()) for p in (rounds or [pooled])]
    return out


def round_models(ctx: RunContext) -> list[dict[str, Any]]:
    """One comm model per microbenchmark round, fitted on that round's measurements at every
    world size (microbench/wN/rI/comm.json); the run's fitted model alone where no rounds were kept."""
    link = ctx.spec().network.bytes_per_s
    by_round: dict[str, list[dict[str, Any]]] = {}
    for p in sorted((ctx.paths.root / "microbench").glob(f"w*/{ROUND_GLOB}/comm.json")):
        by_round.setdefault(p.parent.name, []).append(json.loads(p.read_text()))
    models = []
    for comms in by_round.values():
        try:
            models.append(fit_comm({**comms[0], "measurements": [m for c in comms for m in c["measurements"]]},
                                   link_bytes_per_s=link))
        except CommModelError:
            continue  # a round the fit flags adds no interval; the pooled fit decides the point
    if not models and ctx.paths.fit_model.exists():
        models = [json.loads(ctx.paths.fit_model.read_text())]
    return models


def p10_p90(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    lo, hi = np.percentile(values, [10, 90])
    return float(lo), float(hi)


def around(values: list[float], point: float) -> tuple[float | None, float | None]:
    """p10-p90 of the rounds' predictions, widened to hold the pooled one."""
    lo, hi = p10_p90(values)
    return (None, None) if lo is None or hi is None else (min(lo, point), max(hi, point))


def _pairs(tables: list[dict[str, Any]], models: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    return list(itertools.product(tables, models))


def validation_intervals(ctx: RunContext, result: dict[str, Any],
                         history: dict[str, list[float]] | None = None) -> None:
    """predicted_p10_s / predicted_p90_s on every run and configuration row of a validation, and
    beside them the calibrated interval (modelling/calibration.py) on the history's scores."""
    spec = ctx.spec()
    tables, models = round_tables(ctx), round_models(ctx)
    by_run: dict[str, tuple[float | None, float | None]] = {}
    for r in result["runs"]:
        if r["predicted_iter_s"] is None:  # a no-prediction row: no interval around nothing
            by_run[r["run"]] = (None, None)
            r["predicted_p10_s"] = r["predicted_p90_s"] = None
            continue
        summary = json.loads(Path(ctx.paths.train(r["run"]), "summary.json").read_text())
        wl = next((w for w in spec.workloads if (w.model, w.dataset) == (summary["model"], summary["dataset"])), None)
        rounds = tables.get(workload_dir(wl, summary["batch_size"])) if wl else None
        scenario = Scenario.from_summary(summary)
        values = []
        for table, model in _pairs(rounds or [], models):
            try:
                values.append(predict(table, model, scenario)[0]["iter_time_s"])
            except CommModelError:
                continue
        by_run[r["run"]] = around(values, r["predicted_iter_s"])
        r["predicted_p10_s"], r["predicted_p90_s"] = by_run[r["run"]]
    for c in result["configs"]:
        lows = [by_run[r][0] for r in c["runs"] if by_run.get(r, (None,))[0] is not None]
        highs = [by_run[r][1] for r in c["runs"] if by_run.get(r, (None, None))[1] is not None]
        c["predicted_p10_s"] = float(np.median(lows)) if lows else None
        c["predicted_p90_s"] = float(np.median(highs)) if highs else None
    for row in (*result["runs"], *result["configs"]):
        row |= interval(row["predicted_iter_s"], row["predicted_p10_s"], row["predicted_p90_s"], history,
                        row.get("domain", "validated"))
    result["interval_inputs"] = {"profile_rounds": max((len(v) for v in tables.values()), default=0),
                                 "microbench_rounds": len(models)}


def prediction_intervals(ctx: RunContext, history: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """Every prediction of the predict stage (the grid's and the what-if world sizes and rates)
    with its p10-p90 over the rounds' inputs, in predictions.json's order, and the calibrated
    interval on the history's scores widened to hold it."""
    path = ctx.paths.predictions
    if not path.exists():
        return []
    rows = json.loads(path.read_text())
    spec, tables, models = ctx.spec(), round_tables(ctx), round_models(ctx)
    rounds = max((len(v) for v in tables.values()), default=0)
    redone: list[list[dict[str, Any]]] = []
    for i, model in itertools.product(range(rounds), models):
        try:
            redone.append(predictions(spec, {k: v[min(i, len(v) - 1)] for k, v in tables.items()}, model))
        except CommModelError:
            continue
    out = []
    for n, row in enumerate(rows):
        if row.get("iter_time_s") is None:  # a no-prediction row (its reason says why): no interval
            out.append({**row, "iter_time_p10_s": None, "iter_time_p90_s": None,
                        **interval(None, None, None, history, row.get("domain", "validated"))})
            continue
        values = [r[n]["iter_time_s"] for r in redone if len(r) == len(rows) and r[n].get("iter_time_s") is not None]
        lo, hi = around(values, row["iter_time_s"])
        out.append({**row, "iter_time_p10_s": lo, "iter_time_p90_s": hi,
                    **interval(row["iter_time_s"], lo, hi, history, row.get("domain", "validated"))})
    return out
