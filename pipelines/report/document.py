"""report.md and report.json: the comparison, the validation, the regression check and an
onboarding run's largest batches, written for a person and for the next run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.report.console import FASTEST, FIRST, fmt, fmt_scaling, fmt_spread, fmt_time_to_target, marks
from pipelines.report.plots import plot_names
from pipelines.report.regression import STATISTIC
from pipelines.report.regression_text import markdown as regression_markdown
from pipelines.report.tables import PHASES, best_per_config, describe_load, host_load
from pipelines.report.validation import validation_markdown

VALIDATION_KEYS = (
    "median_abs_error",
    "worst_abs_error",
    "median_abs_model_error",
    "worst_abs_model_error",
    "median_abs_memory_error",
    "worst_abs_memory_error",
    "median_repeat_spread",
    "worst_repeat_spread",
)


def write_report(
    out: Path,
    ctx: dict[str, Any],
    spec: Any,
    runs: list[dict[str, Any]],
    table: list[dict[str, Any]],
    validation: dict[str, Any] | None,
    check: dict[str, Any],
    largest_batch: dict[str, dict[str, int | None]] | None = None,
    reference: dict[str, Any] | None = None,
) -> Path:
    """report.md (readable) and report.json (what the next run compares against). `largest_batch`:
    an onboarding run's largest per-worker batch that fits, per workload and algorithm;
    `reference`: this run against the reference hardware's newest run (`reference_against`)."""
    out.mkdir(parents=True, exist_ok=True)
    best = best_per_config(table)
    load = host_load(runs)
    doc = {
        "run_key": ctx["run_key"],
        "spec_hash": ctx["spec_hash"],
        "hardware": ctx["hardware"],
        "comparison": table,
        "best": best,
        "validation": {k: (validation or {}).get(k) for k in VALIDATION_KEYS},
        "baseline_run_key": (check["history_run_keys"] or [None])[0],
        "regressions": check["regressions"],
        "regression": check,
        "inject_delay_ms": check["inject_delay_ms"],
        "statistic": STATISTIC,
        "thresholds": spec.regression.model_dump(),
        "host_other_cpu_share": load,
        "reference": reference,
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str))
    md = [
        f"# ddlbench report: {ctx['run_key']}",
        "",
        f"Spec `{spec.name}` (hash `{ctx['spec_hash']}`), hardware `{ctx['hardware']}`, "
        f"suite `{ctx['suite']}`, git `{ctx.get('git_commit') or 'unknown'}`, {len(runs)} training runs.",
        "",
        describe_load(load),
        "",
        "## Algorithms compared",
        "",
        "Figures are medians [min, max] over the repeats (seeds); scaling efficiency is against a measured "
        "1-worker run of the same model and batch.",
        "",
        "| config | repeats | throughput samples/s | scaling eff. | iter p50 ms | final accuracy | time to target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        fastest, first = (m.replace("*", "\\*") for m in marks(r, best))
        md.append(
            f"| {r['config']} | {r['repeats']} | "
            f"{fmt_spread(r['throughput_median'], r['throughput_min'], r['throughput_max'], mark=fastest)} | "
            f"{fmt_scaling(r)} | {fmt((r['iter_time_p50_median_s'] or 0) * 1e3)} | "
            f"{fmt_spread(r['final_accuracy_median'], r.get('final_accuracy_min'), r.get('final_accuracy_max'), 3)} | "
            f"{fmt_time_to_target(r, mark=first)} |"
        )
    md += [
        "",
        f"`{FASTEST}` fastest, `{FIRST}` first to the target, among the algorithms of one model, workers and batch.",
    ]
    md += language_model_lines(table)
    md += [
        "",
        "## Best algorithm per config",
        "",
        "| config | fastest | samples/s | first to target |",
        "|---|---|---|---|",
    ]
    md += [
        f"| {k} | {v['fastest']} | {fmt(v['throughput_samples_per_s'])} | {v['first_to_target'] or '-'} |"
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
        f"| {r['config']} | " + " | ".join(fmt((r["breakdown_s"][p] or 0) * 1e3, 3) for p in PHASES) + " |"
        for r in table
    ]
    md += ["", "## Predicted vs measured", "", *validation_markdown(validation)]
    md += ["", *regression_markdown(check, spec.regression)]
    if load and load["loaded"] and check["checks"]:
        md += ["", f"Caution: this run was measured on a loaded host (other work used up to {load['max']:.0%} of its "
                   "CPU); a slowdown found here may be the load, not the code."]
    md += largest_batch_lines(largest_batch)
    md += reference_lines(reference, ctx["hardware"])
    md += [
        "",
        f"Plots: {', '.join(plot_names(runs, table, validation))} (MLflow artifacts of the report run).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def largest_batch_lines(largest: dict[str, dict[str, int | None]] | None) -> list[str]:
    """The onboarding report's table of the largest per-worker batch that fits this hardware's
    memory (none: no lines)."""
    if not largest:
        return []
    algorithms = list(dict.fromkeys(a for row in largest.values() for a in row))
    md = ["", "## The largest batch that fits", "",
          "Per worker, at the largest world of the form, by the model's memory prediction against the memory "
          "of one device (spec `memory.device`, else this host's); '-' where that memory is unknown.", "",
          "| workload | " + " | ".join(algorithms) + " |", "|---|" + "---|" * len(algorithms)]
    for workload, row in largest.items():
        md.append(f"| {workload} | " + " | ".join("-" if row.get(a) is None else str(row[a]) for a in algorithms)
                  + " |")
    return md


def language_model_lines(table: list[dict[str, Any]]) -> list[str]:
    """The report's section on language models: tokens/s, MFU and loss to target (none: no lines)."""
    rows = [r for r in table if r.get("tokens_per_s_median") is not None]
    if not rows:
        return []
    md = ["", "## Language models", "",
          "| config | tokens/s | MFU | final test loss | target loss | time to target loss s |",
          "|---|---|---|---|---|---|"]
    md += [f"| {r['config']} | {fmt_spread(r['tokens_per_s_median'], r['tokens_per_s_min'], r['tokens_per_s_max'])} | "
           f"{fmt_spread(r['mfu_median'], r['mfu_min'], r['mfu_max'], 3)} | {fmt(r['final_test_loss_median'])} | "
           f"{fmt(r['target_loss'])} | "
           f"{fmt_spread(r['time_to_loss_median_s'], r['time_to_loss_min_s'], r['time_to_loss_max_s'])} |"
           for r in rows]
    return md


def reference_lines(reference: dict[str, Any] | None, hardware: str) -> list[str]:
    """The report's section on this hardware against the reference label (none: no lines)."""
    if not reference:
        return []
    label = reference["hardware"]
    if not reference.get("rows"):
        return ["", f"## Against {label}", "", reference["note"]]
    md = ["", f"## Against {label}", "",
          f"Samples/s, median [min, max] over the repeats; {label}: its run `{reference['run_key']}`. The ratio's "
          "interval pairs the repeats' extremes.", "",
          f"| config | {label} | {hardware} | {hardware} / {label} |", "|---|---|---|---|"]
    for r in reference["rows"]:
        ratio = (fmt_spread(r["ratio"], r["ratio_low"], r["ratio_high"], 3) if r["ratio"] is not None
                 else f"only {label if r['only'] == 'A' else hardware} ran it")
        md.append(f"| {r['config']} | {fmt_spread(r['a_median'], r['a_min'], r['a_max'])} | "
                  f"{fmt_spread(r['b_median'], r['b_min'], r['b_max'])} | {ratio} |")
    return md
