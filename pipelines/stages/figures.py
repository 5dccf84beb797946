"""What the regression check takes of a pipeline run's training (docs/regression.md): each
configuration's run-level figures with the link's microbenchmark of the primitive it uses, and
the model that re-predicts its iteration from its parts. The report and the confirmation reruns
judge a configuration on the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.context import RunContext
from pipelines.report import regression_comm
from pipelines.report.attribution import Predictor, model_predictor
from pipelines.report.regression_stats import config_figures
from pipelines.spec import config_of
from pipelines.stages.model import trained_dirs
from pipelines.stages.runner import load_inputs, workload_dir


def _summaries(trained: list[dict]) -> dict[str, dict[str, Any]]:
    """One finished run's summary.json per config."""
    out: dict[str, dict[str, Any]] = {}
    for e in trained_dirs(trained):
        path = Path(e["run_dir"], "summary.json")
        if config_of(e["key"]) not in out and path.exists():
            out[config_of(e["key"])] = json.loads(path.read_text())
    return out


def run_figures(ctx: RunContext, trained: list[dict]) -> dict[str, dict[str, Any]]:
    """Run-level figures per config (regression_stats.config_figures), each with `comm`: the
    pipeline's fit of the primitive it uses (regression_comm.record), where the pipeline fitted one."""
    figures = config_figures(trained_dirs(trained))
    _, model = load_inputs(ctx)
    for config, summary in _summaries(trained).items():
        comm = regression_comm.record(model, summary)
        if comm and config in figures:
            figures[config]["comm"] = comm
    return figures


def predictors(ctx: RunContext, trained: list[dict]) -> dict[str, Predictor]:
    """Per config, the model's iteration from in-situ parts (attribution.model_predictor), from
    the run's profile and comm fit; none where either was skipped."""
    layers_by, model = load_inputs(ctx)
    if not layers_by or model is None:
        return {}
    spec, out = ctx.spec(), {}
    for config, summary in _summaries(trained).items():
        trained_on = (summary.get("model"), (summary.get("config") or {}).get("dataset"))
        for wl in spec.workloads:
            layers = layers_by.get(workload_dir(wl, summary["batch_size"]))
            if layers and trained_on == (wl.model, wl.dataset):
                out[config] = model_predictor(layers, model, summary)
    return out
