"""What a run publishes: the comparison report with its regression check, and a hardware profile."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.context import RunContext
from pipelines.regression_stats import config_figures
from pipelines.stages.confirm import apply_confirmations
from pipelines.stages.model import trained_dirs
from pipelines.stages.runner import load_inputs, run_once, tracker, write_json
from pipelines.tracking import PARENT, Tracker


def report(ctx: RunContext, trained: list[dict], validation: dict, confirmations: list[dict] | None = None) -> dict:
    """Comparison of the algorithms, plots, regression check against the history of this spec;
    an alarm stands only if its confirmation rerun agrees (when the confirm stage ran)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        from pipelines import report as rep

        out = ctx.paths.report
        runs = rep.collect_runs(trained_dirs(trained))
        val_path = validation.get("validation") if validation else None
        val = json.loads(Path(val_path).read_text()) if val_path else None
        table = rep.comparison(runs)
        history = rep.find_history(t, ctx.as_dict(), spec.regression.history)
        figures = config_figures(trained_dirs(trained))
        check = rep.regression_check(table, val, history, spec.regression, rep.injected_delay_ms(runs), figures)
        check = apply_confirmations(check, confirmations)
        md = rep.write_report(out, ctx.as_dict(), spec, runs, table, val, check)
        for name, fig in rep.figures(runs, table, val).items():
            t.log_figure(node, fig, name)
        t.log_table(node, rep.columns(table), "comparison.json")
        t.log_artifact(node, md)
        t.log_artifact(node, out / "report.json")
        t.log_artifact(PARENT, md, "report")
        t.log_artifact(PARENT, out / "report.json", "report")
        status = check["status"]
        baseline_key = (check["history_run_keys"] or [None])[0]
        regression_tags = {
            "ddlbench.regression": status,
            "ddlbench.regression_detail": rep.describe(check),
            "ddlbench.baseline_run_key": baseline_key or "",
            "ddlbench.inject_delay_ms": f"{check['inject_delay_ms']:g}",
        }
        t.set_tags(PARENT, regression_tags)
        t.set_tags(node, regression_tags)
        for row in table:
            t.log_metrics(PARENT, {f"{row['config']}.throughput_samples_per_s": row["throughput_median"]})
        for c in check["checks"]:
            if c["p_value"] is not None:
                figure = f"{c['config']}.{c['figure']}"
                t.log_metrics(node, {f"{figure}.regression_p_value": c["p_value"], f"{figure}.change": c["change"]})
        return {
            "report_md": str(md),
            "regressions": check["regressions"],
            "status": status,
            "detail": rep.describe(check),
            "history_runs": check["history_runs"],
            "baseline_run_key": baseline_key,
            "best": rep.best_per_config(table),
        }

    return run_once(ctx, "report", body)


def record_hardware_profile(ctx: RunContext) -> dict:
    """One artifact of the parent run with the comm fits and layer tables other runs predict from."""
    done = ctx.paths.recorded("hardware_profile")
    if done.exists():
        return json.loads(done.read_text())
    layers_by, model = load_inputs(ctx)
    profile_doc = {
        "hardware": ctx.spec().hardware,
        "spec_hash": ctx.spec_hash,
        "comm_model": model,
        "layers": layers_by or {},
    }
    path = write_json(ctx.paths.hardware_profile, profile_doc)
    t = tracker(ctx)
    with t.batch():
        t.log_artifact(PARENT, path, "hardware_profile")
        t.set_tags(PARENT, {"ddlbench.hardware_profile": "hardware_profile/hardware_profile.json"})
    result = {"hardware_profile": str(path)}
    write_json(done, result)
    return result
