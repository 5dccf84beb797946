"""MLflow tracking through the journal (DESIGN §6).

Every call appends to the run dir's journal first; what the journal holds that MLflow has
not seen is uploaded by `flush` (pipelines/tracking/upload.py). Inside `batch()` (a stage)
only opening a run is uploaded at once, so its run id is known; the rest goes up in one
flush when the block ends, also when it fails. Uploading is the same code for a live
pipeline and for `ddlbench sync`, so what works offline-then-sync is what works online.
When MLflow is unreachable (server down, database locked) the tracker says so once, stops
trying for a while and the pipeline goes on. When the run directory vanishes, with the journal
in it, the tracker ends the run's runs in MLflow directly, FAILED, and raises `RunDirGone`.

The package is everything between a stage and MLflow: this module's `Tracker`, the journal each
call goes to first (`journal`), its upload (`upload`), the ending of runs whose owner died
(`stranded`), the tracking URI with its password masked (`uri`) and a new SQLite store made as a
copy of an empty one (`store`). It may import the run context and infra; the stages and the CLI
import it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from infra.credentials import mask_secrets
from pipelines.rundir import STATUS
from pipelines.tracking.journal import Journal, RunDirGone, now_ms, owner, owner_alive
from pipelines.tracking.stranded import end_stranded
from pipelines.tracking.upload import Uploader, groups, is_rejection
from pipelines.tracking.uri import mask_uri

log = logging.getLogger(__name__)

PARENT = "pipeline"
# How long a store that failed is left alone before the next upload tries it again.
_RETRY_AFTER_S = float(os.environ.get("DDLBENCH_MLFLOW_RETRY_S", "300"))
_PARAM_MAX = 6000


class Tracker:
    """Journal-first MLflow logging for one pipeline run dir."""

    def __init__(
        self,
        run_dir: Path,
        tracking_uri: str,
        experiment: str,
        run_key: str,
        artifact_root: Path | None = None,
        made: bool = False,
    ) -> None:
        """`made`: the run directory exists already (`start` made it); a missing one has vanished."""
        self.run_dir = Path(run_dir)
        if mask_uri(tracking_uri) != tracking_uri:
            # MLflow prints a link to every run it ends, the URI's password in it, to stdout (the task log)
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self.journal = Journal(self.run_dir, made=made)
        self.tracking_uri = tracking_uri
        self.run_key = run_key
        self.uploader = Uploader(self.run_dir, tracking_uri, experiment, run_key, artifact_root)
        self._down_until = 0.0
        self.last_error: str | None = None
        self._batching = 0
        self.vanished: RunDirGone | None = None  # the first sign that the run directory is gone

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
        self._append(entry)
        if not self._batching or entry["op"] == "start_run":
            self.flush()

    def _append(self, entry: dict[str, Any]) -> None:
        try:
            self.journal.append(entry)
        except RunDirGone as gone:
            self._end_vanished(gone)

    def _end_vanished(self, gone: RunDirGone) -> NoReturn:
        """The run directory went with its journal, so nothing will replay what it held: end the
        run's runs in MLflow directly, FAILED, while this process still can (once), and raise."""
        if self.vanished is None:
            self.vanished = gone
            try:
                swept = end_stranded(self.client, run_key=self.run_key, experiment_ids=[self.experiment_id()],
                                     vanished=self.run_dir, dying=owner())
                gone.ended = [run.info.run_name for run in swept.ended]
            except Exception as err:  # noqa: BLE001 - the store down as well: `sync --abandoned` ends them later
                log.warning("MLflow unavailable (%s): the runs of %s stay RUNNING until "
                            "`ddlbench sync --abandoned %s`", mask_secrets((str(err).splitlines() or [''])[0])[:300],
                            self.run_key, self.run_key)
        gone.ended = self.vanished.ended
        raise gone

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
                "tags": {k: mask_secrets(str(v)) for k, v in (tags or {}).items()},
                "ts": now_ms(),
                # the host: where its run directory is, which `sync --abandoned` looks for
                "owner": {"pipeline": self.run_key, "host": platform.node()} if owned_by_pipeline else owner(),
            }
        )

    def end_run(self, node: str, status: str = "FINISHED") -> None:
        self._write({"op": "end_run", "node": node, "status": status, "ts": now_ms()})

    def log_params(self, node: str, params: dict[str, Any]) -> None:
        masked = {k: mask_secrets(str(v))[:_PARAM_MAX] for k, v in params.items()}
        self._write({"op": "params", "node": node, "params": masked})

    def log_metrics(self, node: str, metrics: dict[str, float | None], step: int = 0) -> None:
        ts = now_ms()
        rows = [{"key": k, "value": float(v), "step": step, "ts": ts} for k, v in metrics.items() if v is not None]
        self.log_metric_rows(node, rows)

    def log_metric_rows(self, node: str, rows: list[dict[str, Any]]) -> None:
        """Rows of {"key", "value", "step", "ts"} (curves with their own steps and times)."""
        if rows:
            self._write({"op": "metrics", "node": node, "metrics": rows})

    def set_tags(self, node: str, tags: dict[str, Any]) -> None:
        self._write({"op": "tags", "node": node, "tags": {k: mask_secrets(str(v)) for k, v in tags.items()}})

    def log_artifact(self, node: str, path: Path, artifact_path: str | None = None) -> None:
        self._write({"op": "artifact", "node": node, "path": self._rel(path), "artifact_path": artifact_path})

    def log_table(self, node: str, data: dict[str, list[Any]], artifact_file: str) -> None:
        self._write({"op": "table", "node": node, "data": data, "artifact_file": artifact_file})

    def log_input(self, node: str, dataset: dict[str, Any], context: str = "training") -> None:
        """An MLflow dataset input of the run: `dataset` holds name, digest, source_type, source."""
        self._write({"op": "input", "node": node, "dataset": dataset, "context": context})

    def log_figure(self, node: str, fig: Any, artifact_file: str) -> Path:
        """Save the figure in the run dir (source of truth), log it, and close it."""
        path = self.run_dir / "figures" / node.replace("/", "_") / Path(artifact_file).name
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self._write({"op": "figure", "node": node, "path": self._rel(path), "artifact_file": artifact_file})
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
            self._append(
                {
                    "op": "end_run",
                    "node": node,
                    "status": "FAILED",
                    "ts": now_ms(),
                    "reason": "orphaned: its process ended without closing it",
                }
            )
            ended.append(node)
        if not self._batching:
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
        return self.uploader.client

    def experiment_id(self) -> str:
        return self.uploader.experiment_id()

    @property
    def online(self) -> bool:
        return time.monotonic() >= self._down_until

    def flush(self, force: bool = False) -> bool:
        """Upload journal entries MLflow has not seen; False when MLflow is unavailable."""
        if not (force or self.online):
            return False
        try:
            with self.journal.locked():
                state = self.journal.read_state()
                for group in groups(self.journal.entries(state["offset"])):
                    if not self._upload(group, state):
                        return False
        except RunDirGone as gone:
            self._end_vanished(gone)
        self._down_until = 0.0
        self.last_error = None
        return True

    def _upload(self, group: list[tuple[int, dict[str, Any]]], state: dict[str, Any]) -> bool:
        """Apply a group and record how far the journal reached; False when the store is down.
        A group the store refuses is retried entry by entry: only what it refuses is set aside."""
        try:
            self.uploader.apply(group, state)
        except Exception as err:  # noqa: BLE001 - the store's failures are all handled alike
            self.journal.check()  # an artifact gone with the run directory: not the store's failure
            if not is_rejection(err):
                self._went_down(err)
                return False
            if len(group) > 1:
                return all(self._upload([item], state) for item in group)
            self._reject(group[0][1], err)
        state["offset"] = group[-1][0]
        self.journal.write_state(state)
        return True

    def _went_down(self, err: Exception) -> None:
        """Stop trying for a while; the journal keeps everything for the next flush or sync."""
        self._down_until = time.monotonic() + _RETRY_AFTER_S
        self.last_error = f"{type(err).__name__}: {mask_secrets((str(err).splitlines() or [''])[0])[:300]}"
        log.warning(
            "MLflow unavailable (%s); journaling to %s, run `ddlbench sync` later",
            self.last_error,
            self.journal.path,
        )

    def _reject(self, entry: dict[str, Any], err: Exception) -> None:
        """MLflow refused this entry's content (not its availability): set it aside, go on."""
        error = mask_secrets(str(err))[:1000]
        log.warning("MLflow rejected a journal entry (%s); kept in journal.rejected.jsonl", error[:300])
        with open(self.run_dir / "journal.rejected.jsonl", "a") as f:
            f.write(json.dumps({"entry": entry, "error": error}, default=str) + "\n")
