"""A new SQLite MLflow store is a copy of an empty one MLflow made (pipelines/tracking/store.py):
the same schema as MLflow's own, never over a store that exists, one store when many processes
make it at once, and MLflow's own where no template can be made."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.tracking import store

REPO = Path(__file__).resolve().parent.parent


def _schema(path: Path) -> tuple[list[tuple[str, list[str]]], list[tuple[str]], list[tuple[str, str]]]:
    """The tables' and indexes' clauses, the migration version and the experiments of a store.
    A table's clauses are a set: MLflow's migrations write a table's constraints in an order
    that changes from one store it makes to the next."""
    with sqlite3.connect(path) as db:
        return (sorted((name, sorted(re.split(r",\s*\n\s*", sql)))
                       for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")),
                db.execute("SELECT version_num FROM alembic_version").fetchall(),
                db.execute("SELECT experiment_id, name FROM experiments").fetchall())


@pytest.mark.slow  # MLflow makes a store twice here: seconds each
def test_a_copied_store_is_the_store_mlflow_makes_and_takes_runs(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    own, copied = tmp_path / "own.db", tmp_path / "copied.db"
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()
    store.prepare(f"sqlite:///{copied}")
    assert list((tmp_path / "cache" / "ddlbench").glob("mlflow-*-empty.db"))
    assert _schema(copied) == _schema(own)
    client = MlflowClient(tracking_uri=f"sqlite:///{copied}")
    run = client.create_run(client.create_experiment("ddlbench-adhoc"))
    client.log_metric(run.info.run_id, "loss", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}


def test_a_store_that_exists_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    path.write_bytes(b"a store with runs in it")
    store.prepare(f"sqlite:///{path}")
    assert path.read_bytes() == b"a store with runs in it"


@pytest.mark.parametrize("uri", ["http://localhost:5000", "postgresql://u@h/db", "sqlite:///{tmp}/x.db?timeout=5",
                                 "sqlite:///{tmp}/missing-dir/x.db", "file:///{tmp}/mlruns"])
def test_another_store_is_left_to_mlflow(tmp_path: Path, uri: str) -> None:
    store.prepare(uri.format(tmp=tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_without_a_cache_mlflow_makes_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cache").write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store.prepare(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no store, no half-made file


def test_processes_making_one_store_at_once_make_one_store(tmp_path: Path) -> None:
    """Four processes prepare the same new store at once (the template made before, as on a
    machine that has made a store): one copy is published, the others leave it, no file is left
    over, and the store opens."""
    store.prepare(f"sqlite:///{tmp_path / 'warm.db'}")  # the machine's template, made once
    path = tmp_path / "stores" / "mlflow.db"
    path.parent.mkdir()
    code = ("import sys; from pipelines.tracking import store; sys.stdin.read(); "
            "store.prepare(sys.argv[1]); print(open(sys.argv[2], 'rb').read(16))")
    procs = [subprocess.Popen([sys.executable, "-c", code, f"sqlite:///{path}", str(path)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:  # released together once all have started
        p.stdin.close()
    outs = [p.stdout.read() for p in procs]
    for p in procs:
        p.wait(timeout=60)
    assert [p.returncode for p in procs] == [0] * 4
    assert set(outs) == {"b'SQLite format 3\\x00'\n"}
    assert [p.name for p in path.parent.iterdir()] == ["mlflow.db"]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM experiments").fetchall() == [("Default",)]
