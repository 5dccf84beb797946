"""The validation history a calibrated interval rests on (modelling/calibration.py): the
configuration rows of earlier FINISHED `validate` runs on the same hardware, from their
validation.json artifacts in MLflow."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from modelling.calibration import grouped

# The latest validations read: enough for a quantile that is not simply the worst score, few
# enough that the hardware's history is this season's (a host changes over months).
HISTORY_RUNS = 20


def validation_history(tracker: Any, hardware: str, runs: int = HISTORY_RUNS) -> list[dict[str, Any]]:
    """Configuration rows of the latest `runs` FINISHED validations on `hardware`, newest first;
    [] where MLflow is unreachable (the interval then says it rests on no history). A run whose
    pipeline injected a slowdown is no measurement of the hardware and is left out."""
    if not tracker.online:
        return []
    try:
        client = tracker.client
        found = client.search_runs(
            [tracker.experiment_id()],
            filter_string=(f"tags.`ddlbench.hardware` = '{hardware}' AND tags.`ddlbench.node` = 'validate' "
                           "AND attributes.status = 'FINISHED'"),
            order_by=["attributes.start_time DESC"],
            max_results=runs,
        )
        rows: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory() as tmp:
            for run in found:
                parent = run.data.tags.get("mlflow.parentRunId")
                if parent and float(client.get_run(parent).data.tags.get("ddlbench.inject_delay_ms") or 0):
                    continue
                try:
                    path = client.download_artifacts(run.info.run_id, "validation.json", tmp)
                except Exception:  # noqa: BLE001 - a validation without its artifact is no history
                    continue
                rows += json.loads(Path(path).read_text()).get("configs") or []
        return rows
    except Exception:  # noqa: BLE001 - MLflow down: no history, and the interval says so
        return []


def history_scores(tracker: Any, hardware: str) -> dict[str, list[float]]:
    """The end-to-end scores |log(measured / predicted)| of the hardware's earlier configurations,
    by calibration group (inside the domain, outside it)."""
    return grouped(validation_history(tracker, hardware))
