"""summary.json <-> MLflow metrics: the one mapping between a training run's summary and the
metric names its MLflow run carries (units in the names), both ways.

    throughput_samples_per_s, train_time_s, final_loss, ...   the summary's own figures
    iter_time_<q>_s        summary["iter_time_s"][<q>]         (p50, p90, ...)
    <phase>_s              summary["breakdown_s"][<phase>]     (data, forward, backward, ...)
    staleness_mean_steps, staleness_max_steps                 summary["staleness"]
    canary_<kind>_<when>, canary_cpu_share_<when>,            summary["canary"] (training/measure/canary.py)
    canary_speed_log, canary_gemm_log
    memory.peak_bytes, memory.peak_rss_bytes,                 summary["memory"] (training/measure/memory.py):
    memory.reserved_bytes (CUDA), memory.rank<k>.peak_bytes   the largest rank's, and each rank's
"""

from __future__ import annotations

import re
from typing import Any

from pipelines.report.tables import PHASES
from training.measure.canary import metrics as canary_metrics

# Summary figures logged as MLflow metrics under the same names.
SUMMARY_METRICS = (
    "throughput_samples_per_s",
    "throughput_tokens_per_s",
    "mfu",
    "train_time_s",
    "final_loss",
    "final_test_loss",
    "final_accuracy",
    "time_to_accuracy_s",
    "steps",
    "target_accuracy",
    "target_reached",
    "steps_to_accuracy",
    "final_perplexity",
    "target_loss",
    "time_to_loss_s",
    "steps_to_loss",
    "parameters",
    "parameter_bytes",
    "bytes_sent",
    "bytes_received",
)
_ITER_TIME = re.compile(r"iter_time_(\w+)_s")


def summary_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    """The figures of summary.json as flat metric names with units."""
    out: dict[str, float | None] = {k: summary.get(k) for k in SUMMARY_METRICS}
    for q, v in (summary.get("iter_time_s") or {}).items():
        out[f"iter_time_{q}_s"] = v
    for phase, v in (summary.get("breakdown_s") or {}).items():
        out[f"{phase}_s"] = v
    if summary.get("staleness"):
        out["staleness_mean_steps"] = summary["staleness"]["mean"]
        out["staleness_max_steps"] = summary["staleness"]["max"]
    out |= canary_metrics(summary)
    out |= memory_metrics(summary)
    return {k: v for k, v in out.items() if isinstance(v, int | float)}


def memory_metrics(summary: dict[str, Any]) -> dict[str, int | None]:
    """The memory figures of the rank with the largest peak, and each rank's peak (None: none)."""
    memory = summary.get("memory") or {}
    out = {f"memory.{k}": memory.get(k) for k in ("peak_bytes", "peak_rss_bytes", "reserved_bytes")}
    return out | {f"memory.rank{r['rank']}.peak_bytes": r["peak_bytes"] for r in memory.get("ranks", [])}


def summary_from_metrics(metrics: dict[str, float]) -> dict[str, Any]:
    """A summary-like dict rebuilt from a training run's MLflow metrics (what the report's
    comparison reads); figures MLflow lacks are None."""
    summary: dict[str, Any] = {k: metrics.get(k) for k in SUMMARY_METRICS}
    iter_time = {m.group(1): v for k, v in metrics.items() if (m := _ITER_TIME.fullmatch(k))}
    summary["iter_time_s"] = {"p50": None} | iter_time
    summary["breakdown_s"] = {p: metrics.get(f"{p}_s") for p in PHASES}
    if "staleness_mean_steps" in metrics:
        summary["staleness"] = {"mean": metrics["staleness_mean_steps"], "max": metrics.get("staleness_max_steps")}
    return summary
