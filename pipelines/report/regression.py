"""The regression check of a report: this run's repeats against the history of the same spec on the
same hardware (DESIGN §4), never one median against one threshold.

History: up to `regression.history` earlier FINISHED parent runs with the same spec hash and hardware
label (MLflow search on the parent's tags, newest first, this run key and runs with an injected delay
excluded), each with its report.json artifact. Fewer than `regression.min_history` runs: no
statement, the report and the tag say "history too short (k of m runs)".

Test, per config, on log throughput (pipelines/report/regression_stats.py, docs/regression.md): every run
(a history run or this one) is one value, the mean of its repeats' logs, with a within-run variance
from its own steps (batch means); the test's variance combines the history's between-run spread with
the runs' within-run noise. It is made twice: on the raw throughput, and relative to the host-speed
canary each run timed (training/measure/canary.py). The relative test decides where tonight's canary moved
beyond the history's spread of it (a host slower tonight for every workload is no regression of
one), the raw test elsewhere (the canary's own noise would blunt it). A regression needs p < `regression.alpha`
AND a slowdown larger than `regression.min_effect`: a significant 1% change is no alarm. Each check
states its power, `detectable_slowdown` (the smallest slowdown caught with 95% probability), and the
change points of the configuration's history. A confirmation rerun (pipelines/stages/confirm.py)
decides whether an alarm stands.

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

from pipelines.report import regression_components as rc
from pipelines.report import regression_stats as rs
from pipelines.report.regression_stats import prediction_test

STATISTIC = (
    "one-sided t tests of this run's mean log throughput over repeats, and of its fastest repeat, each at "
    "alpha/2, against the run-level distribution of the history (same spec hash and hardware), the "
    "variance the history's between-run spread plus each run's within-run noise (batch means of its "
    "steps); made raw and relative to the host-speed canary, which decides where the canary moved "
    "beyond its spread in the history (two-sided, p < host_alpha), the raw one elsewhere; a "
    "regression needs p < alpha and a slowdown above min_effect, and stands only if a rerun agrees"
)
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


def check_runs(now: dict[str, Any], history: list[dict[str, Any]], spec: Any, power: bool = True) -> dict[str, Any]:
    """This run's run-level figures (regression_stats.run_level) against the history runs', by the
    mean of its repeats and by its fastest repeat, each at alpha / 2 (Bonferroni): the alarm where
    either fires, the one that fires (else the mean's) at the top level with `statistic` naming
    it, both as `mean_of_repeats` and `best_of_repeats`, and the smaller detectable slowdown (the
    pair detects at least what either does). Interference on a shared host only slows a repeat;
    a slower workload slows every one. Where a run has one repeat, or a history run was saved
    before the fastest repeat was kept, the mean alone is tested at alpha."""
    if now.get("best") is None or any(h.get("best") is None for h in history):
        return {**_check(now, history, spec, power), "statistic": "mean"}
    half = spec.model_copy(update={"alpha": spec.alpha / 2})
    mean = _check(now, history, half, power)
    best = _check(now["best"], [h["best"] for h in history], half, power)
    top = best if best["regressed"] and not mean["regressed"] else mean
    out = {**top, "statistic": "best" if top is best else "mean", "regressed": mean["regressed"] or best["regressed"],
           "mean_of_repeats": _brief(mean), "best_of_repeats": _brief(best)}
    out["raw"] = {**top["raw"], "regressed": mean["raw"]["regressed"] or best["raw"]["regressed"]}
    if power:
        out["detectable_slowdown"] = min(mean["detectable_slowdown"], best["detectable_slowdown"])
    return out


def _brief(check: dict[str, Any]) -> dict[str, Any]:
    return {k: check[k] for k in ("basis", "p_value", "effect", "effect_ci", "regressed", "detectable_slowdown")}


def _check(now: dict[str, Any], history: list[dict[str, Any]], spec: Any, power: bool = True) -> dict[str, Any]:
    """One figure of this run against the history runs': the raw test, the test relative to the
    canary (when every run has one), the deciding one's figures at the top level, and the change
    of the host's canary speed with its test.

    The canary-relative test decides only where the host moved: tonight's canary outside the
    history's spread of it (two-sided, p < host_alpha). Dividing by the canary also adds the
    canary's own run-to-run noise to the throughput's, which costs the alarm its power on a host
    that did not move; where the host did, the raw throughput carries the host's change and only
    the relative test can tell a slower workload from it."""
    raw = rs.run_test(now, history, False, spec.alpha, spec.min_effect, power)
    # A run saved before the GEMM-only canary has no canary_gemm_log: the raw test decides.
    canaried = now.get("canary_gemm_log") is not None and all(h.get("canary_gemm_log") is not None for h in history)
    norm = rs.run_test(now, history, True, spec.alpha, spec.min_effect, power) if canaried else None
    host = rs.host_moved(now, history) if canaried else None
    moved = host is not None and host["p_value"] < spec.host_alpha
    return {
        **(norm if moved else raw),
        "raw": raw,
        "normalised": norm,
        "host_change": host["change"] if host else None,
        "host_p_value": host["p_value"] if host else None,
        "history_runs": len(history),
    }


def check_rerun(now: dict[str, Any], history: list[dict[str, Any]], spec: Any, power: bool = True) -> dict[str, Any]:
    """A suspect's rerun against the same history: the check at `confirm_alpha` (never stricter
    than alpha), the second stage of a screen. The rerun is a new run, so under no change the two
    stages alarm together with probability about alpha x confirm_alpha; a real slowdown passes
    the looser second stage nearly as often as the first."""
    return check_runs(now, history, spec.model_copy(update={"alpha": max(spec.alpha, spec.confirm_alpha)}), power)


def check_throughput(now: list[float], history: list[list[float]], spec: Any) -> dict[str, Any]:
    """This run's throughput repeats against the history runs' repeats (lists, one per run), runs
    known by their throughputs alone (no within-run figures, no canary)."""
    return check_runs(rs.from_throughputs(now), [rs.from_throughputs(r) for r in history], spec)


def _repeats(row: dict[str, Any]) -> list[float]:
    return [x for x in row.get("throughput_repeats") or [] if x]


def history_runs(history: list[dict[str, Any]], config: str) -> list[tuple[str, dict[str, Any]]]:
    """(run key, run-level figures) of the history runs that measured `config`, newest first: the
    figures a report saved (regression.runs), else its throughput repeats."""
    out = []
    for h in history:
        saved = ((h["report"].get("regression") or {}).get("runs") or {}).get(config)
        rows = [r for r in h["report"].get("comparison", []) if r["config"] == config and _repeats(r)]
        if saved:
            out.append((h["run_key"], saved))
        elif rows:
            out.append((h["run_key"], rs.from_throughputs(_repeats(rows[0]))))
    return out


def regression_check(
    table: list[dict[str, Any]],
    validation: dict[str, Any] | None,
    history: list[dict[str, Any]] | None,
    spec: Any,
    injected_ms: float = 0.0,
    figures: dict[str, dict[str, Any]] | None = None,
    predictors: dict[str, rc.Predictor] | None = None,
    host_load: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The check of this run against its history: status (the `ddlbench.regression` tag:
    regressed, passed, short-history or no-baseline), the findings and every test made.
    `figures`: this run's run-level figures per config (regression_stats.config_figures), kept in
    the check as `runs` for the runs after it; without them a config is known by its repeats.
    Each config's components are tested too (regression_components.py), and where the model can
    re-predict a config's iteration (`predictors`) it attributes the change to them. Where other
    work held a crowded host during the runs (`host_load`, tables.host_load) an alarm abstains:
    the status is `inconclusive` and no check regressed (see `abstain_on_load`)."""
    predictors = predictors or {}
    history = history or []
    figures = figures or {}
    out: dict[str, Any] = {
        "runs": figures,
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
        now = figures.get(row["config"]) or (rs.from_throughputs(_repeats(row)) if _repeats(row) else None)
        past = history_runs(history, row["config"])
        if now is None or len(past) < spec.min_history:
            out["checks"].append(
                {
                    "config": row["config"],
                    "figure": "throughput_samples_per_s",
                    "history_runs": len(past),
                    "regressed": False,
                    "p_value": None,
                }
            )
            continue
        res = check_runs(now, [r for _, r in past], spec)
        parts = rc.check_components(now, [r for _, r in past], spec.alpha, spec.min_effect,
                                    predictors.get(row["config"]), spec.host_alpha)
        flagged = bool(parts and parts["flagged"])
        out["checks"].append(
            {
                "config": row["config"],
                "figure": "throughput_samples_per_s",
                "baseline": statistics.median(math.exp(r["log_thr"]) for _, r in past),
                "now": row["throughput_median"],
                "change": res["effect"],
                "threshold": spec.min_effect,
                "alpha": spec.alpha,
                **res,
                "regressed": res["regressed"] or flagged,
                "flagged_by": [*(["iteration"] if res["regressed"] else []), *(parts["flagged"] if flagged else [])],
                "components": parts,
                "attribution": [{k: r[k] for k in ("component", "change", "explains")}
                                for r in (parts or {}).get("attribution", [])],
                "change_points": rs.history_change_points(now, past, res["basis"]),
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
    return abstain_on_load({**out, "status": "regressed" if out["regressions"] else "passed"}, host_load)


# Other work's share of the host's CPU from which the alarm abstains (docs/regression.md, "A
# crowded host"): most of the CPU taken, every wake-up of a rank waits for a core.
CROWDED = 0.5


def abstain_on_load(check: dict[str, Any], load: dict[str, Any] | None) -> dict[str, Any]:
    """The check with its alarms withdrawn where other work used at least CROWDED of the host's
    CPU during the runs: each rank then waits for a core at every wake-up (from a blocking
    receive, a loader, a sleep), a cost that grows with how often the workload blocks and that a
    compute canary, which never blocks, does not pay; the canary-relative test's premise (the
    canary slows as the workload does) fails and the alarm cannot decide. A check that cannot
    decide does not alarm: the status says so, with the load."""
    if not load or load["max"] < CROWDED or not check["regressions"]:
        return check
    reason = (f"a crowded host: other work used up to {load['max']:.0%} of its CPU during the runs (the alarm "
              f"decides below {CROWDED:.0%})")
    for c in check["regressions"]:
        c["regressed"], c["abstained"] = False, reason
    return {**check, "regressions": [], "status": "inconclusive", "abstained": reason}
