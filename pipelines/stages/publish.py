"""What a run publishes: the comparison report with its regression check, and a hardware profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra import bounds
from modelling.memory import largest_batch
from pipelines.context import RunContext
from pipelines.preflight import capacity_bytes
from pipelines.report.hardware import against
from pipelines.report.regression_text import describe
from pipelines.report.regression_text import line as rc_line
from pipelines.stages.confirm import apply_confirmations
from pipelines.stages.figures import predictors, run_figures
from pipelines.stages.grid import placements, spec_scenario
from pipelines.stages.model import trained_dirs
from pipelines.stages.runner import load_inputs, run_once, tracker, write_json
from pipelines.tracking import PARENT, Tracker


def report(ctx: RunContext, trained: list[dict], validation: dict, confirmations: list[dict] | None = None) -> dict:
    """Comparison of the algorithms, plots, regression check against the history of this spec;
    an alarm stands only if its confirmation rerun agrees (when the confirm stage ran)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        from pipelines.report import document, plots, regression, tables

        out = ctx.paths.report
        runs = tables.collect_runs(trained_dirs(trained))
        val_path = validation.get("validation") if validation else None
        val = json.loads(Path(val_path).read_text()) if val_path else None
        table = tables.comparison(runs)
        history = regression.find_history(t, ctx.as_dict(), spec.regression.history)
        check = regression.regression_check(table, val, history, spec.regression,
                                            regression.injected_delay_ms(runs), run_figures(ctx, trained),
                                            predictors(ctx, trained), tables.host_load(runs))
        check = apply_confirmations(check, confirmations)
        profile = ctx.paths.hardware_profile  # an onboarding run's, recorded before the report
        largest = json.loads(profile.read_text()).get("largest_batch") if profile.exists() else None
        md = document.write_report(out, ctx.as_dict(), spec, runs, table, val, check, largest,
                                   _reference(t, ctx, spec.regression.reference_hardware, table))
        for name, fig in plots.figures(runs, table, val).items():
            t.log_figure(node, fig, name)
        t.log_table(node, tables.columns(table), "comparison.json")
        t.log_artifact(node, md)
        t.log_artifact(node, out / "report.json")
        t.log_artifact(PARENT, md, "report")
        t.log_artifact(PARENT, out / "report.json", "report")
        status = check["status"]
        baseline_key = (check["history_run_keys"] or [None])[0]
        regression_tags = {
            "ddlbench.regression": status,
            "ddlbench.regression_detail": describe(check),
            "ddlbench.baseline_run_key": baseline_key or "",
            "ddlbench.inject_delay_ms": f"{check['inject_delay_ms']:g}",
            "ddlbench.inject_where": injected_where(runs),
        }
        t.set_tags(PARENT, regression_tags)
        t.set_tags(node, regression_tags)
        for row in table:
            t.log_metrics(PARENT, {f"{row['config']}.throughput_samples_per_s": row["throughput_median"]})
        for c in check["checks"]:
            if c["p_value"] is not None:
                figure = f"{c['config']}.{c['figure']}"
                t.log_metrics(node, {f"{figure}.regression_p_value": c["p_value"], f"{figure}.change": c["change"]})
            if c.get("attribution"):  # what each component explains of the iteration, as report.json has it
                t.log_metrics(node, {f"{c['config']}.explains.{r['component'].replace(' ', '_')}": r["explains"]
                                     for r in c["attribution"]})
                t.set_tags(node, {f"ddlbench.attribution.{c['config']}": rc_line(c)[:5000]})
        return {
            "report_md": str(md),
            "regressions": check["regressions"],
            "status": status,
            "detail": describe(check),
            "history_runs": check["history_runs"],
            "baseline_run_key": baseline_key,
            "best": tables.best_per_config(table),
        }

    return run_once(ctx, "report", body)


def _reference(t: Tracker, ctx: RunContext, label: str | None, table: list[dict]) -> dict | None:
    """This run against the spec's reference hardware (report/hardware.py), where it names one."""
    if not label:
        return None
    if not t.online:
        return {"hardware": label, "rows": [], "note": "MLflow unreachable: no reference run to compare against"}
    try:
        return against(t.client, t.experiment_id(), label, table, ctx.run_key)
    except Exception as err:  # noqa: BLE001 - a comparison that cannot be made is said, not fatal
        return {"hardware": label, "rows": [], "note": f"the reference's runs could not be read: {err}"}


def injected_where(runs: list[dict]) -> str:
    """The components the runs' injected delays slowed (their `inject_where`, comma-separated;
    empty where none injected), beside the largest delay the report records."""
    configs = [r["summary"].get("config") or {} for r in runs]
    return ",".join(sorted({c.get("inject_where", "data") for c in configs if float(c.get("inject_delay_ms") or 0)}))


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
        "largest_batch": largest_batches(ctx.spec(), layers_by or {}),
    }
    path = write_json(ctx.paths.hardware_profile, profile_doc)
    t = tracker(ctx)
    with t.batch():
        t.log_artifact(PARENT, path, "hardware_profile")
        t.set_tags(PARENT, {"ddlbench.hardware_profile": "hardware_profile/hardware_profile.json"})
    result = {"hardware_profile": str(path)}
    write_json(done, result)
    return result


def largest_batches(spec: Any, layers_by: dict[str, dict]) -> dict[str, dict[str, int | None]]:
    """Per profiled workload and algorithm of the spec, the largest per-worker batch whose ranks
    fit the memory of this hardware's devices (modelling/memory.py) at the spec's largest world;
    none where the memory is unknown (a remote cluster's, unstated)."""
    workers = max(spec.workers)
    placed = placements(spec, [workers])
    out: dict[str, dict[str, int | None]] = {}
    for workload, layers in layers_by.items():
        device = layers.get("device", "cpu")
        capacity = capacity_bytes(spec, device)
        row = out.setdefault(workload, {})
        for algo in spec.algorithms:
            s = spec_scenario(spec, algo, workers, placed)
            row[algo.label] = (None if capacity is None else
                               largest_batch(layers, s, device, capacity, bounds.BATCH_SIZE.limit))
    return out
