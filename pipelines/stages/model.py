"""The DAG performance model: fit the comm model, predict every config, validate against training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelling.calibration import interval
from modelling.measure.records import CommModelError
from modelling.network.fit import fit_comm
from modelling.validate import summarise, validate_runs
from pipelines.context import RunContext
from pipelines.stages.calibration import history_scores
from pipelines.stages.grid import predictions
from pipelines.stages.interval import prediction_intervals, validation_intervals
from pipelines.stages.runner import columns, load_inputs, run_once, workload_dir, write_json
from pipelines.tracking import PARENT, Tracker

_FIT_COLUMNS = ("primitive", "workers", "servers", "alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "r2", "usable")
_FIT_METRICS = ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "r2")


def fit(ctx: RunContext) -> dict:
    """Fit alpha/beta/gamma per primitive and world size from the microbenchmarks (model.json)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        paths = ctx.paths.comm_files()
        if not paths:
            return {"model": None, "skipped": True}
        comms = [json.loads(p.read_text()) for p in paths]
        comm = {**comms[0], "measurements": [m for c in comms for m in c["measurements"]]}
        model = fit_comm(comm, link_bytes_per_s=spec.network.bytes_per_s)
        path = write_json(ctx.paths.fit_model, model)
        t.log_artifact(node, path)
        rows = [{k: f.get(k) for k in _FIT_COLUMNS} | {"flags": "; ".join(f["flags"])} for f in model["fits"]]
        t.log_table(node, columns(rows), "comm_fits.json")
        t.log_metrics(
            node, {f"{f['primitive']}.w{f['workers']}.{k}": f.get(k) for f in model["fits"] for k in _FIT_METRICS}
        )
        flagged = [f"{f['primitive']} w{f['workers']}: {'; '.join(f['flags'])}" for f in model["fits"] if f["flags"]]
        if flagged:
            t.set_tags(node, {"ddlbench.fit_flags": " | ".join(flagged)[:5000]})
        return {"model": str(path), "skipped": False, "flagged": flagged}

    return run_once(ctx, "fit", body)


def predict(ctx: RunContext) -> dict:
    """Predict every algorithm at the grid's and the what-if world sizes and link rates."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        layers_by, model = load_inputs(ctx)
        if not layers_by or model is None:
            return {"predictions": None, "skipped": True}
        # The model's own error on this hardware, as its earlier validations measured it; the
        # inputs' spread joins it in the validate stage (validation.json's `predictions`).
        history = history_scores(t, ctx.hardware)
        rows = [r | interval(r["iter_time_s"], None, None, history, r["domain"])
                for r in predictions(spec, layers_by, model)]
        path = write_json(ctx.paths.predictions, rows)
        t.log_artifact(node, path)
        t.log_table(node, columns(rows), "predictions_table.json")
        missing = [r for r in rows if r["no_prediction"]]
        if missing:  # a configuration the model cannot predict is a row, never a failed run
            reasons = sorted({f"{r['algorithm']} w{r['workers']}: {r['no_prediction']}" for r in missing})
            t.set_tags(node, {"ddlbench.no_prediction": " | ".join(reasons)[:5000]})
        notes = sorted({r["note"] for r in rows if r["note"]})
        if notes:
            t.set_tags(node, {"ddlbench.prediction_notes": " | ".join(notes)[:5000]})
        from pipelines.report.plots import plot_predicted_scaling

        t.log_figure(node, plot_predicted_scaling([r for r in rows if r["iter_time_s"] is not None],
                                                  assumptions(spec)), "predicted_throughput.png")
        return {"predictions": str(path), "skipped": False, "count": len(rows), "no_prediction": len(missing)}

    return run_once(ctx, "predict", body)


def trained_dirs(trained: list[dict]) -> list[dict]:
    """The training results that finished and wrote their summary."""
    return [e for e in trained if e and e.get("status") == "FINISHED" and Path(e["run_dir"], "summary.json").exists()]


_SUMMARY_KEYS = ("median_abs_error", "worst_abs_error", "median_abs_model_error", "worst_abs_model_error",
                 "median_abs_memory_error", "worst_abs_memory_error")


def _skipped(**why: Any) -> dict:
    return {"validation": None, "skipped": True, **why, **dict.fromkeys(_SUMMARY_KEYS)}


def _config_label(c: dict[str, Any]) -> str:
    where = "" if c.get("placement") in (None, "one host") else f"-{c['placement'].replace(' ', '_')}"
    return f"{c['model']}-{c['algorithm']}-{c['comm']}-w{c['workers']}-b{c['batch_size']}{where}"


def validate(ctx: RunContext, trained: list[dict]) -> dict:
    """Predicted vs measured for every trained run: per configuration the end-to-end error (the
    DAG fed with the profile), the model's error (fed with the run's in-situ layer compute) and
    the repeats' spread; their median and worst over configurations."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        layers_by, model = load_inputs(ctx)
        done = trained_dirs(trained)
        if not layers_by or model is None or not done:
            return _skipped()
        configs = {e["run_dir"]: json.loads(Path(e["run_dir"], "config.json").read_text()) for e in done}
        runs: list[dict[str, Any]] = []
        for wl in spec.workloads:
            for batch in spec.batch_sizes:
                dirs = [
                    Path(d)
                    for d, c in configs.items()
                    if (c["model"], c["dataset"], c["batch_size"]) == (wl.model, wl.dataset, batch)
                ]
                if dirs:
                    try:
                        res = validate_runs(dirs, layers=layers_by[workload_dir(wl, batch)], comm_model=model)
                    except CommModelError as err:
                        # A fit that beats the stated link is flagged, not used: say so and go on.
                        t.set_tags(node, {"validation_skipped": str(err)[:250]})
                        return _skipped(reason=str(err))
                    runs += [{**r, "run": Path(str(r["run"])).name} for r in res["runs"]]
        result = summarise(runs)  # repeats of a configuration count once, as their median (DESIGN §4)
        history = history_scores(t, ctx.hardware)  # earlier validations only: this one is not FINISHED
        validation_intervals(ctx, result, history)
        result["predictions"] = prediction_intervals(ctx, history)  # the what-if sizes too, with their p10-p90
        result["calibration_history"] = sum(map(len, history.values()))
        path = write_json(ctx.paths.validation, result)
        t.log_artifact(node, path)
        cols = ("run", "predicted_iter_s", "measured_iter_s", "error", "model_error", "repeat_spread")
        t.log_table(node, columns(result["runs"], cols), "predicted_vs_measured.json")
        from pipelines.report.plots import plot_predicted_vs_measured

        t.log_figure(node, plot_predicted_vs_measured(result["runs"]), "predicted_vs_measured.png")
        errors = {k: result[k] for k in _SUMMARY_KEYS}
        kinds = ("error", "model_error", "repeat_spread")
        # A model error on too few in-situ samples is no figure (its row's note says so).
        per_config = {f"{_config_label(c)}.{k}": c[k] for c in result["configs"] for k in kinds
                      if not (k == "model_error" and c.get("model_error_note"))}
        t.log_metrics(node, {k: v for k, v in (errors | per_config).items() if v is not None})
        t.log_metrics(PARENT, {f"prediction_{k}": v for k, v in errors.items() if v is not None})
        return {"validation": str(path), "skipped": False, **errors}

    return run_once(ctx, "validate", body)


def assumptions(spec: Any) -> str:
    """What the grid's predictions assume, in a line: the link, the nodes and ranks per node as
    the spec's provider places a job, the shards' placement; past the cluster, one like it."""
    opts = spec.provider.options or {}
    link = f"links of {spec.network.link_bandwidth}" if spec.network.link_bandwidth else "the measured network"
    if spec.provider.name == "local":
        where = "every rank on this host"
    else:
        nodes = opts.get("nodes")
        where = f"{nodes} {spec.provider.name} node{'s' if nodes != 1 else ''}" if nodes else spec.provider.name
        if per := opts.get("devices_per_node") or opts.get("gpus_per_node"):
            where += f", {per} workers a node"
        if spec.servers:
            where += f", shards {opts.get('placement', 'colocated')}"
    return f"{link}; {where} (a larger world on a cluster like it)"
