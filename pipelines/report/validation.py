"""The report's "Predicted vs measured" section: the model's predictions beside the training
runs' measured iterations, per configuration, and every prediction with its p10-p90 interval."""

from __future__ import annotations

from typing import Any

from modelling.memory import human_bytes


# The figures' formats, shared by the report, the console tables and the commands: '-' where
# there is no figure (a no-prediction row, a run without in-situ timing).
def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def model_error_cell(row: dict[str, Any]) -> str:
    """A row's model error, or "n/a (N samples)" where it rests on too few in-situ samples
    (`model_error_note`): a figure then would look like a measurement of the model."""
    if row.get("model_error_note"):
        return f"n/a ({row.get('model_error_samples')} samples)"
    return pct(row.get("model_error"))


def calibrated_cell(row: dict[str, Any]) -> str:
    """The 80% interval with what it rests on: the hardware's earlier configurations, or the
    inputs' spread and the stated accuracy; and the domain, where the row lies outside it."""
    lo, hi = row.get("interval_low_s"), row.get("interval_high_s")
    if row.get("interval_kind") is None:
        return "-"
    how = (f"calibrated on {row.get('calibration_runs')}" if row["interval_kind"] == "calibrated"
           else "inputs")
    out = f"{ms_interval(lo, hi)} ({how})"
    return out if row.get("domain") in (None, "validated") else f"{out}, widened: {row['domain']}"


def ms_interval(lo: float | None, hi: float | None) -> str:
    return "-" if lo is None or hi is None else f"{ms(lo)}-{ms(hi)}"


def validation_markdown(validation: dict[str, Any] | None) -> list[str]:
    """Per configuration: the end-to-end error (the DAG fed with the profile), the model's error
    (fed with the run's own in-situ layer compute), the repeats' spread, and the prediction's
    p10-p90; then every prediction, the what-if sizes too, with its interval."""
    if not validation or not validation.get("configs"):
        return ["No validation (profile, microbench or training skipped or failed)."]
    md = [
        "End-to-end error: the DAG fed with the profile, as for a configuration not run. Model error: the "
        "DAG fed with the run's own per-layer compute, measured in situ; it leaves what the model itself "
        "gets wrong. Repeat spread: max/min - 1 of the repeats' measured iteration, the noise floor under "
        "which an error means nothing.",
        "",
        "80% interval: the model's own error on this hardware's earlier configurations (split "
        "conformal, inside and outside the validated domain each on its own), widened to hold p10-p90; "
        "with too short a history, p10-p90 widened by the model's stated accuracy ('inputs': +-10% "
        "inside the domain, a factor of 2 outside it).",
        "",
        "| configuration | repeats | predicted ms (p10-p90) | 80% interval ms | measured ms | end-to-end error "
        "| model error | repeat spread | memory predicted / measured (error) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in validation["configs"]:
        where = "" if c.get("placement") in (None, "one host") else f" ({c['placement']})"
        md.append(
            f"| {c['model']} {c['algorithm']}-{c['comm']} w{c['workers']} b{c['batch_size']}{where} | {c['repeats']} "
            f"| {ms(c['predicted_iter_s'])} ({ms_interval(c.get('predicted_p10_s'), c.get('predicted_p90_s'))}) "
            f"| {calibrated_cell(c)} | {ms(c['measured_iter_s'])} | {pct(c['error'])} | {model_error_cell(c)} "
            f"| {pct(c.get('repeat_spread'))} | {memory_cell(c)} |"
        )
    v = validation
    md += [
        "",
        f"Median |end-to-end error| {_abs(v.get('median_abs_error'))}, worst {_abs(v.get('worst_abs_error'))}; "
        f"median |model error| {_abs(v.get('median_abs_model_error'))}, worst {_abs(v.get('worst_abs_model_error'))}; "
        f"repeat spread median {_abs(v.get('median_repeat_spread'))}, worst {_abs(v.get('worst_repeat_spread'))}; "
        f"median |memory error| {_abs(v.get('median_abs_memory_error'))}, "
        f"worst {_abs(v.get('worst_abs_memory_error'))}.",
    ]
    if v.get("configs_model_error_too_few_samples"):
        md += ["", f"{v['configs_model_error_too_few_samples']} configuration(s) left out of the model error's "
               f"median and worst: too few in-situ samples (n/a above)."]
    inputs = v.get("interval_inputs") or {}
    preds = v.get("predictions") or []
    if preds:
        md += [
            "",
            "### Predictions with their intervals",
            "",
            f"p10-p90 of the predictions re-made from each of the {inputs.get('profile_rounds', '?')} profile "
            f"rounds with each of the {inputs.get('microbench_rounds', '?')} microbenchmark rounds.",
            "",
            "| workload | algorithm | workers | link | iter ms | p10-p90 ms | 80% interval ms | memory | what-if |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        md += [
            f"| {p['workload']} b{p['batch_size']} | {p['algorithm']} | {p['workers']} | {p['link_bandwidth']} "
            f"| {ms(p['iter_time_s'])} | {ms_interval(p.get('iter_time_p10_s'), p.get('iter_time_p90_s'))} "
            f"| {calibrated_cell(p)} | {predicted_memory_cell(p)} | {'yes' if p.get('what_if') else ''} |"
            for p in preds
        ]
    return md


def memory_cell(c: dict[str, Any]) -> str:
    """The largest rank's tensor bytes, predicted / measured (error); '-' where either lacks."""
    predicted, measured = c.get("memory_predicted_bytes"), c.get("memory_measured_bytes")
    if predicted is None or measured is None:
        return "-"
    return f"{human_bytes(predicted)} / {human_bytes(measured)} ({pct(c.get('memory_error'))})"


def predicted_memory_cell(p: dict[str, Any]) -> str:
    """The fullest rank's predicted bytes, or why the row has no time where it does not fit."""
    if (p.get("no_prediction") or "").startswith("does not fit"):
        return p["no_prediction"]
    return "-" if p.get("memory_bytes") is None else human_bytes(p["memory_bytes"])


def _abs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
