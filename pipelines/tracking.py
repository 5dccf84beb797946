"""MLflow tracking through the journal (DESIGN §6).

Every call appends to the run dir's journal first, then uploads whatever the
journal holds that MLflow has not seen yet. Uploading is the same code for a
live pipeline and for `ddlbench sync`, so what works offline-then-sync is what
works online. When MLflow is unreachable (server down, database locked) the
tracker says so once, stops trying for a while and the pipeline goes on.

Runs are found again by tags (`ddlbench.run_key` + `ddlbench.node`), so a
retried step, in any process, reopens its own run instead of making another.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pipelines.context import STATUS
from pipelines.journal import Journal, now_ms, owner, owner_alive

log = logging.getLogger(__name__)

PARENT = "pipeline"
TAG_RUN_KEY = "ddlbench.run_key"
TAG_NODE = "ddlbench.node"
_RETRY_AFTER_S = 300.0
_PARAM_MAX = 6000


class Tracker:
    """Journal-first MLflow logging for one pipeline run dir."""

    def __init__(
        self, run_dir: Path, tracking_uri: str, experiment: str, run_key: str, artifact_root: Path | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.journal = Journal(self.run_dir)
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_key = run_key
        self.artifact_root = artifact_root
        self._client: Any = None
        self._experiment_id: str | None = None
        self._down_until = 0.0
        self.last_error: str | None = None
        # Figures logged by this process, uploaded with mlflow's log_figure; a later
        # sync (another process) uploads the PNG the journal points to instead.
        self._figures: dict[str, Any] = {}
        self._batching = 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Journal what the block logs and upload it in one flush when it ends, also on failure."""
        self._batching += 1
        try:
            yield
        finally:
            self._batching -= 1
            if not self._batching:
                self.flush()

    # -- writing -----------------------------------------------------------------------------
    def _write(self, entry: dict[str, Any]) -> None:
        self.journal.append(entry)
        self.flush()

    def start_run(
        self,
        node: str,
        name: str,
        parent: str | None = PARENT,
        tags: dict[str, str] | None = None,
        owned_by_pipeline: bool = False,
    ) -> None:
        """Open (or reopen) a node's run. Its owner is this process, or with `owned_by_pipeline`
        the pipeline run itself (an Airflow run's parent: its tasks are many short processes)."""
        self._write(
            {
                "op": "start_run",
                "node": node,
                "parent": parent,
                "name": name,
                "tags": {k: str(v) for k, v in (tags or {}).items()},
                "ts": now_ms(),
                "owner": {"pipeline": self.run_key} if owned_by_pipeline else owner(),
            }
        )

    def end_run(self, node: str, status: str = "FINISHED") -> None:
        self._write({"op": "end_run", "node": node, "status": status, "ts": now_ms()})

    def log_params(self, node: str, params: dict[str, Any]) -> None:
        self._write({"op": "params", "node": node, "params": {k: str(v)[:_PARAM_MAX] for k, v in params.items()}})

    def log_metrics(self, node: str, metrics: dict[str, float | None], step: int = 0) -> None:
        ts = now_ms()
        rows = [{"key": k, "value": float(v), "step": step, "ts": ts} for k, v in metrics.items() if v is not None]
        self.log_metric_rows(node, rows)

    def log_metric_rows(self, node: str, rows: list[dict[str, Any]]) -> None:
        """Rows of {"key", "value", "step", "ts"} (curves with their own steps and times)."""
        if rows:
            self._write({"op": "metrics", "node": node, "metrics": rows})

    def set_tags(self, node: str, tags: dict[str, Any]) -> None:
        self._write({"op": "tags", "node": node, "tags": {k: str(v) for k, v in tags.items()}})

    def log_artifact(self, node: str, path: Path, artifact_path: str | None = None) -> None:
        self._write({"op": "artifact", "node": node, "path": self._rel(path), "artifact_path": artifact_path})

    def log_table(self, node: str, data: dict[str, list[Any]], artifact_file: str) -> None:
        self._write({"op": "table", "node": node, "data": data, "artifact_file": artifact_file})

    def log_figure(self, node: str, fig: Any, artifact_file: str) -> Path:
        """Save the figure in the run dir (source of truth), log it, and close it."""
        path = self.run_dir / "figures" / node.replace("/", "_") / Path(artifact_file).name
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self._figures[self._rel(path)] = fig
        self._write({"op": "figure", "node": node, "path": self._rel(path), "artifact_file": artifact_file})
        self._figures.pop(self._rel(path), None)
        import matplotlib.pyplot as plt

        plt.close(fig)
        return path

    @contextmanager
    def run(
        self, node: str, name: str, parent: str | None = PARENT, tags: dict[str, str] | None = None
    ) -> Iterator[None]:
        """A child run that ends FINISHED, or FAILED when the block raises."""
        self.start_run(node, name, parent, tags)
        try:
            yield
        except BaseException:
            self.end_run(node, "FAILED")
            raise
        self.end_run(node, "FINISHED")

    def end_orphans(
        self, *, everyone: bool = False, keep: tuple[str, ...] = (), abandoned: bool = False
    ) -> list[str]:
        """End FAILED the runs left open by processes that died (or all open ones but `keep`).

        A run owned by the pipeline run (not a process) is an orphan only once that run is
        over: its status is recorded (`finish` ran), or the caller knows it `abandoned`.
        """
        over = abandoned or (self.run_dir / STATUS).exists()
        ended = []
        for node, start in self.journal.open_nodes().items():
            own = start.get("owner") or {}
            alive = not over if "pipeline" in own else owner_alive(own)
            if node in keep or (not everyone and alive):
                continue
            self.journal.append(
                {
                    "op": "end_run",
                    "node": node,
                    "status": "FAILED",
                    "ts": now_ms(),
                    "reason": "orphaned: its process ended without closing it",
                }
            )
            ended.append(node)
        self.flush()
        return ended

    def run_id(self, node: str) -> str | None:
        return self.journal.read_state()["runs"].get(node)

    def _rel(self, path: Path) -> str:
        path = Path(path).resolve()
        try:
            return str(path.relative_to(self.run_dir.resolve()))
        except ValueError:
            return str(path)

    # -- uploading ---------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        if self._client is None:
            # A server that is down should fail fast, not after minutes of retries.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def online(self) -> bool:
        return time.monotonic() >= self._down_until

    def flush(self, force: bool = False) -> bool:
        """Upload journal entries MLflow has not seen; False when MLflow is unavailable."""
        if not (force or self.online):
            return False
        with self.journal.locked():
            state = self.journal.read_state()
            for offset, entry in self.journal.entries(state["offset"]):
                try:
                    self._apply(entry, state)
                except Exception as err:  # noqa: BLE001 - the store's failures are all handled alike
                    if not _is_rejection(err):
                        self._went_down(err)
                        return False
                    self._reject(entry, err)
                state["offset"] = offset
                self.journal.write_state(state)
        self._down_until = 0.0
        self.last_error = None
        return True

    def _went_down(self, err: Exception) -> None:
        """Stop trying for a while; the journal keeps everything for the next flush or sync."""
        self._down_until = time.monotonic() + _RETRY_AFTER_S
        self.last_error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        log.warning(
            "MLflow unavailable (%s); journaling to %s, run `ddlbench sync` later",
            self.last_error,
            self.journal.path,
        )

    def _reject(self, entry: dict[str, Any], err: Exception) -> None:
        """MLflow refused this entry's content (not its availability): set it aside, go on."""
        log.warning("MLflow rejected a journal entry (%s); kept in journal.rejected.jsonl", err)
        with open(self.run_dir / "journal.rejected.jsonl", "a") as f:
            f.write(json.dumps({"entry": entry, "error": str(err)[:1000]}, default=str) + "\n")

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is None:
                location = None
                if self.artifact_root is not None and not self.tracking_uri.startswith(("http:", "https:")):
                    location = (Path(self.artifact_root) / self.experiment).resolve().as_uri()
                try:
                    self._experiment_id = self.client.create_experiment(self.experiment, artifact_location=location)
                except Exception:  # noqa: BLE001 - another process created it first
                    exp = self.client.get_experiment_by_name(self.experiment)
                    if exp is None:
                        raise
                    self._experiment_id = exp.experiment_id
            else:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    def find_run(self, node: str) -> Any | None:
        runs = self.client.search_runs(
            [self.experiment_id()],
            filter_string=f"tags.`{TAG_RUN_KEY}` = '{self.run_key}' AND tags.`{TAG_NODE}` = '{node}'",
            max_results=2,
        )
        return runs[0] if runs else None

    def _apply(self, e: dict[str, Any], state: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        c, runs, op = self.client, state["runs"], e["op"]
        if op == "start_run":
            tags = {**e["tags"], TAG_RUN_KEY: self.run_key, TAG_NODE: e["node"]}
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
            return
        rid = runs[e["node"]]
        if op == "end_run":
            c.set_terminated(rid, e["status"], end_time=e["ts"])
        elif op == "params":
            items = [Param(k, v) for k, v in e["params"].items()]
            for i in range(0, len(items), 100):
                c.log_batch(rid, params=items[i : i + 100])
        elif op == "metrics":
            ms = [Metric(m["key"], m["value"], m["ts"], m["step"]) for m in e["metrics"]]
            for i in range(0, len(ms), 1000):
                c.log_batch(rid, metrics=ms[i : i + 1000])
        elif op == "tags":
            c.log_batch(rid, tags=[RunTag(k, v) for k, v in e["tags"].items()])
        elif op == "artifact":
            c.log_artifact(rid, str(self.run_dir / e["path"]), e["artifact_path"])
        elif op == "table":
            # log_table appends to an existing table: a replayed entry must not add rows twice
            if not self._has_artifact(rid, e["artifact_file"]):
                c.log_table(rid, data=e["data"], artifact_file=e["artifact_file"])
        elif op == "figure":
            fig = self._figures.get(e["path"])
            if fig is not None:
                c.log_figure(rid, fig, e["artifact_file"])
            else:
                parent = str(Path(e["artifact_file"]).parent)
                c.log_artifact(rid, str(self.run_dir / e["path"]), None if parent == "." else parent)
        else:
            raise ValueError(f"journal: unknown op {op!r}")

    def _has_artifact(self, run_id: str, artifact_file: str) -> bool:
        parent = str(Path(artifact_file).parent)
        listed = self.client.list_artifacts(run_id, None if parent == "." else parent)
        return artifact_file in {a.path for a in listed}


def _is_rejection(err: Exception) -> bool:
    """The store answered and refused the content (e.g. a param changed), as opposed to being down."""
    text = str(err)
    down = ("OperationalError", "Max retries", "Connection", "timed out", "unable to open")
    return getattr(err, "error_code", "") == "INVALID_PARAMETER_VALUE" and not any(d in text for d in down)


_TRACKERS: dict[str, Tracker] = {}
_MASK = "***"


def mask_uri(uri: str) -> str:
    """The tracking URI without its password: what ctx.json, XCom and logs may hold."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:{_MASK}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def resolve_uri(stored: str) -> str:
    """The real URI for a masked one: credentials come from the environment only."""
    if f":{_MASK}@" not in stored:
        return stored
    real = os.environ.get("MLFLOW_TRACKING_URI", "")
    if mask_uri(real) != stored:
        raise RuntimeError(
            f"tracking_uri: {stored} needs its credentials from MLFLOW_TRACKING_URI in this process's "
            "environment (an Airflow connection or the deployment's env file), and that is not set to it"
        )
    return real


def tracker_for(ctx: dict[str, Any]) -> Tracker:
    """One tracker per run dir and process (steps called in a row share its state)."""
    key = str(Path(ctx["run_dir"]).resolve())
    t = _TRACKERS.get(key)
    uri = resolve_uri(ctx["tracking_uri"])
    if t is None or t.tracking_uri != uri:
        t = Tracker(
            Path(ctx["run_dir"]),
            uri,
            ctx["experiment"],
            ctx["run_key"],
            artifact_root=Path(ctx["home"]) / "mlartifacts",
        )
        _TRACKERS[key] = t
    return t
