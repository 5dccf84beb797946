"""Confirmation of a regression alarm by a rerun in the same pipeline run (docs/regression.md).

`suspects` makes the regression check of the training just done and returns the configurations
whose throughput alarms; `confirm` (one task per suspect, mapped) reruns that configuration's
repeats on the same cluster and tests the rerun against the same history; the report then lets an
alarm stand only if its rerun agrees (`apply_confirmations`) and shows both. One slow run is often
the host's bad minute, not the code: a slowdown that is real slows the rerun too.
"""

from __future__ import annotations

import math
from typing import Any

from pipelines.context import RunContext
from pipelines.report.tables import collect_runs, comparison, host_load
from pipelines.spec import config_of
from pipelines.stages.model import trained_dirs
from pipelines.stages.runner import run_once
from pipelines.stages.train import train, train_configs
from pipelines.tracking import Tracker

PREFIX = "rerun-"  # a rerun's grid key is PREFIX + the original key: its own run dir and MLflow run
THROUGHPUT = "throughput_samples_per_s"


def _check(ctx: RunContext, t: Tracker, trained: list[dict]) -> dict[str, Any]:
    from pipelines.report.regression import find_history, injected_delay_ms, regression_check
    from pipelines.stages.figures import predictors, run_figures
    spec = ctx.spec()
    done = trained_dirs(trained)
    runs = collect_runs(done)
    history = find_history(t, ctx.as_dict(), spec.regression.history)
    return regression_check(comparison(runs), None, history, spec.regression,
                            injected_delay_ms(runs), run_figures(ctx, trained), predictors(ctx, trained),
                            host_load(runs))


def suspects(ctx: RunContext, trained: list[dict]) -> list[dict]:
    """The configurations whose throughput alarms against the history, one entry each:
    {"key": "rerun-<config>", "config", "entries": the grid entries of its repeats}."""
    def body(t: Tracker, node: str) -> list[dict]:
        check = _check(ctx, t, trained)
        alarmed = sorted({c["config"] for c in check["regressions"] if c["figure"] == THROUGHPUT})
        grid = train_configs(ctx)
        t.log_metrics(node, {"suspects": len(alarmed)})
        return [
            {"key": PREFIX + config, "config": config, "entries": [e for e in grid if config_of(e["key"]) == config]}
            for config in alarmed
        ]

    return run_once(ctx, "suspects", body)


def confirm(ctx: RunContext, suspect: dict) -> dict:
    """Rerun one suspect configuration's repeats and test the rerun against the same history:
    `confirmed` if it alarms too (p < confirm_alpha and a slowdown above min_effect)."""
    from pipelines.report.regression import check_rerun, find_history, history_runs
    from pipelines.report.regression_components import check_components
    from pipelines.stages.figures import predictors, run_figures
    config = suspect["config"]
    reruns = [train(ctx, {**e, "key": PREFIX + e["key"]}) for e in suspect["entries"]]

    def body(t: Tracker, node: str) -> dict:
        spec = ctx.spec()
        figures = run_figures(ctx, reruns)
        now = figures.get(PREFIX + config)
        history = find_history(t, ctx.as_dict(), spec.regression.history) or []
        past = [r for _, r in history_runs(history, config)]
        out = {"key": suspect["key"], "config": config, "rerun_keys": [r["key"] for r in reruns]}
        if now is None or len(past) < spec.regression.min_history:
            return {**out, "status": "FAILED", "confirmed": None}
        res = check_rerun(now, past, spec.regression)
        # A component's alarm is confirmed by the rerun's components at the rerun's looser alpha.
        r = spec.regression
        parts = check_components(now, past, max(r.alpha, r.confirm_alpha), r.min_effect,
                                 predictors(ctx, reruns).get(PREFIX + config), r.host_alpha)
        confirmed = res["regressed"] or bool(parts and parts["flagged"])
        t.log_metrics(node, {"p_value": res["p_value"], "change": res["effect"]})
        t.set_tags(node, {"ddlbench.confirmed": str(confirmed).lower()})
        keep = ("basis", "p_value", "effect", "effect_ci", "detectable_slowdown", "history_runs")
        return {**out, "status": "FINISHED", "confirmed": confirmed, **{k: res[k] for k in keep},
                "flagged_components": parts["flagged"] if parts else [], "throughput": math.exp(now["log_thr"])}

    return run_once(ctx, f"confirm/{config}", body, node=f"confirm/{config}", tags={"ddlbench.config": config})


def apply_confirmations(check: dict[str, Any], confirmations: list[dict] | None) -> dict[str, Any]:
    """The check with each throughput alarm's rerun (`confirmation`): an alarm whose rerun finished
    and disagrees no longer stands (`unconfirmed`); one whose rerun failed stands, said so."""
    if confirmations is None:  # no confirmation stage ran (an older DAG): the alarms stand as found
        return check
    by = {c.get("config") or c["key"].removeprefix(PREFIX): c for c in confirmations}
    for c in check["checks"]:
        if c["regressed"] and c["figure"] == THROUGHPUT:
            conf = c["confirmation"] = by.get(c["config"])
            if conf and conf.get("status") == "FINISHED" and not conf["confirmed"]:
                c["regressed"], c["unconfirmed"] = False, True
    check["regressions"] = [c for c in check["checks"] if c["regressed"]]
    check["unconfirmed"] = [c["config"] for c in check["checks"] if c.get("unconfirmed")]
    if check["status"] == "regressed" and not check["regressions"]:
        check["status"] = "passed"
    return check
