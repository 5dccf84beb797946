"""The regression check of a report: this run's repeats against the history of the same spec on the
same hardware (DESIGN §4), never one median against one threshold.

History: up to `regression.history` earlier FINISHED parent runs with the same spec hash and hardware
label (MLflow search on the parent's tags, newest first, this run key and runs with an injected delay
excluded), each with its report.json artifact. Fewer than `regression.min_history` runs: no
statement, the report and the tag say "history too short (k of m runs)".

Test, per config, on log throughput: every run (a history run or this one) is one value, the mean of
its repeats' logs, so it works with one repeat per run and the spread between runs (the machine's
load, which repeats of one run share) is what the test sees. Under no change this run's value is one
more draw from the history's run-level distribution, so
    t = (x_now - mean(x_hist)) / (s_hist * sqrt(1 + 1/k)),  k history runs,
follows Student's t with k-1 degrees of freedom (a prediction-interval test, exact for normal
run-level values); the one-sided p-value is P(T <= t). The effect is the relative change of the
run-level geometric mean, exp(x_now - mean(x_hist)) - 1, with its 95% interval from the same t
distribution. A regression needs p < `regression.alpha` AND a slowdown larger than
`regression.min_effect`: a significant 1% change is no alarm. The false-alarm and detection rates of
the defaults are measured on A/A replays of this machine's recorded runs by
benchmarks/bench_regression.py.

The prediction error (median absolute error of the validation) is tested the same way on its
absolute value: a rise above the history with p < alpha and by more than
`regression.prediction_error_rise`.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

STATISTIC = (
    "one-sided t prediction test of this run's mean log throughput over repeats against the run-level "
    "distribution of the history (same spec hash and hardware); a regression needs p < alpha and a "
    "slowdown above min_effect"
)
CI_LEVEL = 0.95
INJECTED = "inject_delay_ms"


def injected_delay_ms(runs: list[dict[str, Any]]) -> float:
    """The largest delay injected into any training run of this report (0: a real measurement)."""
    return max((float((r["summary"].get("config") or {}).get(INJECTED) or 0.0) for r in runs), default=0.0)


def find_history(tracker: Any, ctx: dict[str, Any], size: int) -> list[dict[str, Any]] | None:
    """Up to `size` earlier FINISHED runs of the same spec hash and hardware with their reports,
    newest first; None if MLflow is unreachable (the check then says so instead of guessing)."""
    if not tracker.online:
        return None
    try:
        import mlflow

        runs = tracker.client.search_runs(
            [tracker.experiment_id()],
            filter_string=(
                f"tags.`ddlbench.spec_hash` = '{ctx['spec_hash']}' AND "
                f"tags.`ddlbench.hardware` = '{ctx['hardware']}' AND "
                "tags.`ddlbench.node` = 'pipeline' AND attributes.status = 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=2 * size + 10,
        )
        history = []
        for run in runs:
            if run.data.tags.get("ddlbench.run_key") == ctx["run_key"]:
                continue
            try:
                path = mlflow.artifacts.download_artifacts(
                    run_id=run.info.run_id, artifact_path="report/report.json", tracking_uri=tracker.tracking_uri
                )
            except Exception:  # noqa: BLE001 - a finished run without a report is no history
                continue
            report = json.loads(Path(path).read_text())
            if report.get(INJECTED):  # an injected slowdown is no measurement of this hardware
                continue
            history.append(
                {"run_key": run.data.tags.get("ddlbench.run_key"), "run_id": run.info.run_id, "report": report}
            )
            if len(history) == size:
                break
        return history
    except Exception:  # noqa: BLE001 - MLflow down: no history, said in the report
        return None


def prediction_test(now: list[float], history: list[float], log: bool, below: bool = True) -> dict[str, Any]:
    """One-sided test that `now` (one run's repeats) lies below (or above) the history's run-level
    values (one per run): p-value, and the change of now against the history with its 95% interval
    (relative on log scale, absolute otherwise). Needs at least two history values."""
    f = math.log if log else float
    x = statistics.fmean(f(v) for v in now)
    ys = [f(v) for v in history]
    k = len(ys)
    d = x - statistics.fmean(ys)
    se = statistics.stdev(ys) * math.sqrt(1 + 1 / k)
    if se > 0:
        p = float(stats.t.cdf(d / se, k - 1) if below else stats.t.sf(d / se, k - 1))
        half = float(stats.t.ppf(0.5 + CI_LEVEL / 2, k - 1)) * se
    else:  # a history without spread: any change is certain
        p, half = (0.0 if (d < 0 if below else d > 0) else 1.0), 0.0
    back = (lambda v: math.exp(v) - 1) if log else (lambda v: v)
    return {"p_value": p, "effect": back(d), "effect_ci": [back(d - half), back(d + half)]}


def check_throughput(now: list[float], history: list[list[float]], spec: Any) -> dict[str, Any]:
    """This run's throughput repeats against the history runs' repeats (lists, one per run)."""
    run_level = [math.exp(statistics.fmean(math.log(v) for v in run)) for run in history]
    test = prediction_test(now, run_level, log=True)
    regressed = test["p_value"] < spec.alpha and test["effect"] < -spec.min_effect
    return {**test, "regressed": regressed, "history_runs": len(history)}


def _repeats(row: dict[str, Any]) -> list[float]:
    return [x for x in row.get("throughput_repeats") or [] if x]


def regression_check(
    table: list[dict[str, Any]],
    validation: dict[str, Any] | None,
    history: list[dict[str, Any]] | None,
    spec: Any,
    injected_ms: float = 0.0,
) -> dict[str, Any]:
    """The check of this run against its history: status (the `ddlbench.regression` tag:
    regressed, passed, short-history or no-baseline), the findings and every test made."""
    history = history or []
    out: dict[str, Any] = {
        "history_run_keys": [h["run_key"] for h in history],
        "history_runs": len(history),
        "min_history": spec.min_history,
        "checks": [],
        "regressions": [],
        INJECTED: injected_ms,
    }
    if not history:
        return {**out, "status": "no-baseline"}
    if len(history) < spec.min_history:
        return {**out, "status": "short-history"}
    for row in table:
        now = _repeats(row)
        past = [r for h in history for r in h["report"].get("comparison", []) if r["config"] == row["config"]]
        runs = [_repeats(r) for r in past if _repeats(r)]
        if not now or len(runs) < spec.min_history:
            out["checks"].append(
                {
                    "config": row["config"],
                    "figure": "throughput_samples_per_s",
                    "history_runs": len(runs),
                    "regressed": False,
                    "p_value": None,
                }
            )
            continue
        res = check_throughput(now, runs, spec)
        out["checks"].append(
            {
                "config": row["config"],
                "figure": "throughput_samples_per_s",
                "baseline": statistics.median(statistics.median(r) for r in runs),
                "now": row["throughput_median"],
                "change": res["effect"],
                "threshold": spec.min_effect,
                "alpha": spec.alpha,
                **res,
            }
        )
    errors = [(h["report"].get("validation") or {}).get("median_abs_error") for h in history]
    errors = [e for e in errors if e is not None]
    now_err = (validation or {}).get("median_abs_error")
    if now_err is not None and len(errors) >= spec.min_history:
        test = prediction_test([now_err], errors, log=False, below=False)  # a rise is the alarm
        rise = test["effect"]
        out["checks"].append(
            {
                "config": "all",
                "figure": "prediction_median_abs_error",
                "baseline": statistics.median(errors),
                "now": now_err,
                "change": rise,
                "threshold": spec.prediction_error_rise,
                "alpha": spec.alpha,
                "history_runs": len(errors),
                **test,
                "regressed": test["p_value"] < spec.alpha and rise > spec.prediction_error_rise,
            }
        )
    out["regressions"] = [c for c in out["checks"] if c["regressed"]]
    return {**out, "status": "regressed" if out["regressions"] else "passed"}


def describe(check: dict[str, Any]) -> str:
    """One line: what the check concluded, for the report, the CLI and the logs."""
    k, m = check["history_runs"], check["min_history"]
    if check["status"] == "no-baseline":
        return "no history: no earlier FINISHED run of this spec hash on this hardware (or MLflow unreachable)"
    if check["status"] == "short-history":
        return f"history too short ({k} of {m} runs)"
    found = len(check["regressions"])
    return f"{found} regression(s) against {k} history runs" if found else f"no regression against {k} history runs"


def markdown(check: dict[str, Any], spec: Any) -> list[str]:
    """The report's regression section."""
    md = [
        "## Regression check",
        "",
        f"Statistic: {STATISTIC}. alpha {spec.alpha:.3g}, min_effect {spec.min_effect:.0%} slowdown, "
        f"prediction error rise > {spec.prediction_error_rise:.3g}; history up to {spec.history} runs, "
        f"at least {spec.min_history}.",
        "",
    ]
    if check[INJECTED]:
        md += [
            f"**Injected slowdown: {check[INJECTED]:g} ms per iteration** (a test of this alarm, not a "
            "measurement; later runs leave it out of their history).",
            "",
        ]
    md.append(f"Result: **{check['status']}**, {describe(check)}.")
    if check["checks"]:
        md += [
            "",
            "| config | figure | history median | now | change [95% CI] | p-value | regressed |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in check["checks"]:
            if c["p_value"] is None:
                md.append(
                    f"| {c['config']} | {c['figure']} | - | - | history too short ({c['history_runs']} runs) | - | no |"
                )
                continue
            lo, hi = c["effect_ci"]
            pct = c["figure"] == "throughput_samples_per_s"
            change = (
                f"{c['change']:+.1%} [{lo:+.1%}, {hi:+.1%}]" if pct else f"{c['change']:+.3g} [{lo:+.3g}, {hi:+.3g}]"
            )
            md.append(
                f"| {c['config']} | {c['figure']} | {c['baseline']:.4g} | {c['now']:.4g} | {change} "
                f"| {c['p_value']:.2g} | {'**yes**' if c['regressed'] else 'no'} |"
            )
    return md
