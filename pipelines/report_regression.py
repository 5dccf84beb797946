"""The regression check of a report, against the previous FINISHED parent run with the same spec
hash and hardware label (found with MLflow search, its report.json artifact):

- throughput: the median over repeats dropped by more than
  `regression.throughput_drop` (a fraction) AND every repeat of this run lies
  below the baseline's median, so one noisy repeat neither raises nor hides it;
- prediction error: the median absolute prediction error rose by more than
  `regression.prediction_error_rise` (absolute).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STATISTIC = (
    "median over repeats; a throughput regression needs the median drop above the threshold "
    "and every repeat below the baseline median"
)


def find_baseline(tracker: Any, ctx: dict[str, Any]) -> dict[str, Any] | None:
    """The previous FINISHED run of the same spec hash and hardware, with its report; None if none
    (or MLflow is unreachable: then the check says so instead of guessing)."""
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
            max_results=20,
        )
        for run in runs:
            if run.data.tags.get("ddlbench.run_key") == ctx["run_key"]:
                continue
            try:
                path = mlflow.artifacts.download_artifacts(
                    run_id=run.info.run_id, artifact_path="report/report.json", tracking_uri=tracker.tracking_uri
                )
            except Exception:  # noqa: BLE001 - a finished run without a report is no baseline
                continue
            return {
                "run_key": run.data.tags.get("ddlbench.run_key"),
                "run_id": run.info.run_id,
                "report": json.loads(Path(path).read_text()),
            }
    except Exception:  # noqa: BLE001 - MLflow down: no baseline, said in the report
        return None
    return None


def regressions(
    table: list[dict[str, Any]], validation: dict[str, Any] | None, baseline: dict[str, Any] | None, thresholds: Any
) -> list[dict[str, Any]]:
    if baseline is None:
        return []
    base_rows = {r["config"]: r for r in baseline["report"].get("comparison", [])}
    found = []
    for row in table:
        base = base_rows.get(row["config"])
        if not base or not base.get("throughput_median") or row["throughput_median"] is None:
            continue
        drop = 1.0 - row["throughput_median"] / base["throughput_median"]
        all_below = all(x < base["throughput_median"] for x in row["throughput_repeats"] if x is not None)
        if drop > thresholds.throughput_drop and all_below:
            found.append(
                {
                    "config": row["config"],
                    "figure": "throughput_samples_per_s",
                    "baseline": base["throughput_median"],
                    "now": row["throughput_median"],
                    "change": -drop,
                    "threshold": thresholds.throughput_drop,
                }
            )
    base_err = (baseline["report"].get("validation") or {}).get("median_abs_error")
    now_err = (validation or {}).get("median_abs_error")
    if base_err is not None and now_err is not None and now_err - base_err > thresholds.prediction_error_rise:
        found.append(
            {
                "config": "all",
                "figure": "prediction_median_abs_error",
                "baseline": base_err,
                "now": now_err,
                "change": now_err - base_err,
                "threshold": thresholds.prediction_error_rise,
            }
        )
    return found
