"""Journal entries applied to MLflow (pipelines/tracking/journal.py lists the ops).

Consecutive params, metrics and tags of one node travel in as few `log_batch` calls as
MLflow's limits allow, so a stage's journal reaches MLflow in a handful of round trips.
Runs are found again by tags (`ddlbench.run_key` + `ddlbench.node`), so a retried step, in
any process, reopens its own run instead of making another.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipelines.tracking import store

TAG_RUN_KEY = "ddlbench.run_key"
TAG_NODE = "ddlbench.node"
# Whose a run is and where its journal lives, so that a run whose run directory vanished can
# still be judged from MLflow alone (pipelines/tracking/stranded.py): owner.host/pid/started for a process,
# owner.pipeline for a pipeline run's own (journal.owner and Tracker.start_run).
TAG_OWNER = "ddlbench.owner."
TAG_RUN_DIR = "ddlbench.run_dir"
TAG_FAILURE = "ddlbench.failure"  # why a run ended FAILED, when that is known
# MLflow's record of what an experiment is: ddlbench's are model training (runs, params,
# metrics), not GenAI (traces). MLflow 3.17's UI still lands on the mode the browser last chose,
# so scripts/main.sh prints the runs table's URL.
EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_TAGS = {EXPERIMENT_KIND: "custom_model_development"}
_BATCHED = ("params", "metrics", "tags")
# MLflow's log_batch limits: entities per call, and params and tags among them.
_BATCH_MAX, _PARAMS_MAX, _TAGS_MAX = 1000, 100, 100

# MLflow's loggers that print a store's failure (a full disk, a locked database) with its
# traceback, again on every call: the tracker says once that MLflow is unavailable.
_STORE_LOGGERS = ("mlflow.store.db.utils", "mlflow.system_metrics.system_metrics_monitor")

Group = list[tuple[int, dict[str, Any]]]  # (journal offset after the entry, entry)


def _one_line(record: logging.LogRecord) -> bool:
    """Keep a store logger's record to its first line, without the traceback."""
    record.msg, record.args = record.getMessage().splitlines()[0] if record.getMessage() else "", ()
    record.exc_info, record.exc_text = None, None
    return True


def groups(entries: Iterable[tuple[int, dict[str, Any]]]) -> Iterator[Group]:
    """The entries in order, consecutive params/metrics/tags of one node grouped for one batch
    (a param whose value changed within the group starts another, so MLflow sees both)."""
    group: Group = []
    params: dict[str, str] = {}
    for offset, e in entries:
        joins = group and e["op"] in _BATCHED and group[-1][1]["op"] in _BATCHED and e["node"] == group[-1][1]["node"]
        if joins and e["op"] == "params":
            joins = all(params.get(k, v) == v for k, v in e["params"].items())
        if group and not joins:
            yield group
            group, params = [], {}
        group.append((offset, e))
        if e["op"] == "params":
            params |= e["params"]
    if group:
        yield group


def is_rejection(err: Exception) -> bool:
    """The store answered and refused the content (e.g. a param changed), as opposed to being down."""
    text = str(err)
    down = ("OperationalError", "Max retries", "Connection", "timed out", "unable to open")
    return getattr(err, "error_code", "") == "INVALID_PARAMETER_VALUE" and not any(d in text for d in down)


class Uploader:
    """Applies journal entries of one pipeline run to an MLflow tracking store."""

    def __init__(
        self, run_dir: Path, tracking_uri: str, experiment: str, run_key: str, artifact_root: Path | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_key = run_key
        self.artifact_root = artifact_root
        self._client: Any = None
        self._experiment_id: str | None = None

    @property
    def client(self) -> Any:
        if self._client is None:
            # A server that is down should fail fast, not after minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
            from mlflow import MlflowClient

            for name in _STORE_LOGGERS:
                logging.getLogger(name).addFilter(_one_line)
            store.prepare(self.tracking_uri)
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                location = None
                if self.artifact_root is not None and not self.tracking_uri.startswith(("http:", "https:")):
                    location = (Path(self.artifact_root) / self.experiment).resolve().as_uri()
                try:
                    self._experiment_id = self.client.create_experiment(
                        self.experiment, artifact_location=location, tags=EXPERIMENT_TAGS
                    )
                except Exception:  # noqa: BLE001 - another process created it first
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
                    self._experiment_id = exp.experiment_id
            else:
                self._experiment_id = exp.experiment_id
                if exp.tags.get(EXPERIMENT_KIND) is None:  # made by an older ddlbench
                    self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, EXPERIMENT_TAGS[EXPERIMENT_KIND])
        return self._experiment_id

    def find_run(self, node: str) -> Any | None:
        runs = self.client.search_runs(
            [self.experiment_id()],
            filter_string=f"tags.`{TAG_RUN_KEY}` = '{self.run_key}' AND tags.`{TAG_NODE}` = '{node}'",
            max_results=2,
        )
        return runs[0] if runs else None

    def apply(self, group: Group, state: dict[str, Any]) -> None:
        """Apply one group of `groups`; `state["runs"]` learns the run id of a started node."""
        e = group[0][1]
        if e["op"] in _BATCHED:
            entries = [entry for _, entry in group]
            self._log_batch(
                state["runs"][e["node"]],
                {k: v for x in entries if x["op"] == "params" for k, v in x["params"].items()},
                [m for x in entries if x["op"] == "metrics" for m in x["metrics"]],
                {k: v for x in entries if x["op"] == "tags" for k, v in x["tags"].items()},
            )
        elif e["op"] == "start_run":
            self._start_run(e, state["runs"])
        else:
            self._apply_one(e, state["runs"][e["node"]])

    def _log_batch(self, rid: str, params: dict[str, str], metrics: list[dict], tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        ps = [Param(k, v) for k, v in params.items()]
        ts = [RunTag(k, v) for k, v in tags.items()]
        ms = [Metric(m["key"], m["value"], m["ts"], m["step"]) for m in metrics]
        while ps or ts or ms:
            p, ps, t, ts = ps[:_PARAMS_MAX], ps[_PARAMS_MAX:], ts[:_TAGS_MAX], ts[_TAGS_MAX:]
            room = _BATCH_MAX - len(p) - len(t)
            self.client.log_batch(rid, metrics=ms[:room], params=p, tags=t)
            ms = ms[room:]

    def _start_run(self, e: dict[str, Any], runs: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        c = self.client
        tags = {**e["tags"], TAG_RUN_KEY: self.run_key, TAG_NODE: e["node"], TAG_RUN_DIR: str(self.run_dir.resolve())}
        tags |= {TAG_OWNER + k: str(v) for k, v in (e.get("owner") or {}).items()}
        if e.get("parent"):
            tags["mlflow.parentRunId"] = runs[e["parent"]]
        rid = runs.get(e["node"])
        if rid is None:
            found = self.find_run(e["node"])
            rid = found.info.run_id if found else None
        if rid is None:
            rid = c.create_run(self.experiment_id(), start_time=e["ts"], tags=tags, run_name=e["name"]).info.run_id
        else:
            c.update_run(rid, status="RUNNING")
            c.log_batch(rid, tags=[RunTag(k, v) for k, v in tags.items()])
        runs[e["node"]] = rid

    def _apply_one(self, e: dict[str, Any], rid: str) -> None:
        c, op = self.client, e["op"]
        if op == "end_run":
            if e.get("reason"):
                c.set_tag(rid, TAG_FAILURE, e["reason"])
            c.set_terminated(rid, e["status"], end_time=e["ts"])
        elif op == "artifact":
            c.log_artifact(rid, str(self.run_dir / e["path"]), e["artifact_path"])
        elif op == "table":
            # log_table appends to an existing table: a replayed entry must not add rows twice
            if not self._has_artifact(rid, e["artifact_file"]):
                c.log_table(rid, data=e["data"], artifact_file=e["artifact_file"])
        elif op == "figure":  # the PNG the run dir holds, where the figure's artifact_file says
            parent = str(Path(e["artifact_file"]).parent)
            c.log_artifact(rid, str(self.run_dir / e["path"]), None if parent == "." else parent)
        elif op == "input":  # MLflow keeps one input per dataset and context: a replay adds none
            from mlflow.entities import Dataset, DatasetInput, InputTag

            dataset = DatasetInput(Dataset(**e["dataset"]), tags=[InputTag("mlflow.data.context", e["context"])])
            c.log_inputs(rid, datasets=[dataset])
        else:
            raise ValueError(f"journal: unknown op {op!r}")

    def _has_artifact(self, run_id: str, artifact_file: str) -> bool:
        parent = str(Path(artifact_file).parent)
        listed = self.client.list_artifacts(run_id, None if parent == "." else parent)
        return artifact_file in {a.path for a in listed}
