"""The tracking journal: ordered, survives torn writes, knows open runs; an unreachable
MLflow server makes the tracker go on offline quickly."""

from __future__ import annotations

import platform
import socket
import time
from pathlib import Path

import pytest

from pipelines.tracking import Tracker
from pipelines.tracking.journal import Journal, owner


def test_entries_resume_from_an_offset_and_skip_a_torn_last_line(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.append({"op": "start_run", "node": "a", "owner": owner()})
    j.append({"op": "metrics", "node": "a", "metrics": []})
    with open(j.path, "a") as f:
        f.write('{"op": "end_run", "no')  # a writer killed mid-line
    entries = list(j.entries())
    assert [e["op"] for _, e in entries] == ["start_run", "metrics"]
    first_end = entries[0][0]
    assert [e["op"] for _, e in j.entries(first_end)] == ["metrics"]
    j.write_state({"offset": first_end, "runs": {}})
    assert j.pending() == 1


def test_open_nodes_are_the_started_and_not_ended(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    for e in (
        {"op": "start_run", "node": "a"},
        {"op": "start_run", "node": "b"},
        {"op": "end_run", "node": "a"},
        {"op": "start_run", "node": "c"},
        {"op": "end_run", "node": "c"},
        {"op": "start_run", "node": "c"},
    ):
        j.append(e)
    assert sorted(j.open_nodes()) == ["b", "c"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_journals_and_goes_on_offline(tmp_path: Path) -> None:
    t = Tracker(tmp_path, f"http://127.0.0.1:{_closed_port()}", "ddlbench-adhoc", "k")
    t0 = time.monotonic()
    t.start_run("pipeline", "k", parent=None, tags={"x": "1"})
    assert not t.online and t.last_error
    for step in range(50):
        t.log_metrics("pipeline", {"loss": 1.0 / (step + 1)}, step=step)
    t.end_run("pipeline", "FINISHED")
    assert time.monotonic() - t0 < 30, "an unreachable store must not stall the pipeline"
    assert t.journal.pending() == 52
    assert t.flush() is False and t.journal.pending() == 52


def test_tracking_credentials_never_reach_ctx_and_come_from_the_environment(monkeypatch):
    from pipelines.tracking.uri import mask_uri, resolve_uri

    real = "postgresql://ddlbench:s3cret@127.0.0.1:5432/ddlbench_mlflow"
    stored = mask_uri(real)
    assert stored == "postgresql://ddlbench:***@127.0.0.1:5432/ddlbench_mlflow"
    assert "s3cret" not in stored
    assert mask_uri("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    assert resolve_uri(stored) == real
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://other:x@127.0.0.1/db")
    with pytest.raises(RuntimeError, match="tracking_uri: .* needs its credentials from MLFLOW_TRACKING_URI"):
        resolve_uri(stored)


def test_a_parent_owned_by_the_pipeline_run_outlives_the_task_that_opened_it(tmp_path: Path) -> None:
    """Under Airflow, `start` opens the parent and its process exits: the next task's orphan sweep
    must not end it; a child whose process died is ended; the parent is an orphan only once the
    pipeline run is over (status recorded) or known abandoned."""
    import subprocess
    import sys

    from mlflow import MlflowClient

    from pipelines.tracking.journal import Journal

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    Tracker(run_dir, uri, "ddlbench-adhoc", "k").start_run("pipeline", "k", parent=None, owned_by_pipeline=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    j = Journal(run_dir)
    j.append({"op": "start_run", "node": "profile", "parent": "pipeline", "name": "profile", "tags": {},
              "ts": 1, "owner": {"host": platform.node(), "pid": int(dead.stdout)}})
    live = Tracker(run_dir, uri, "ddlbench-adhoc", "k")
    live.start_run("fit", "fit")

    sweeper = Tracker(run_dir, uri, "ddlbench-adhoc", "k")  # another task's process
    assert sweeper.end_orphans() == ["profile"]
    client = MlflowClient(tracking_uri=uri)
    runs = j.read_state()["runs"]
    assert client.get_run(runs["pipeline"]).info.status == "RUNNING"
    assert client.get_run(runs["fit"]).info.status == "RUNNING"
    assert client.get_run(runs["profile"]).info.status == "FAILED"

    assert sweeper.end_orphans(abandoned=True) == ["pipeline"]
    assert client.get_run(runs["pipeline"]).info.status == "FAILED"
