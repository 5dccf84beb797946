"""A step killed halfway, retried while the MLflow store is unavailable, then `ddlbench sync`:
the retry completes the same MLflow runs, the pipeline goes on offline, and afterwards every
metric the journal holds is in MLflow and no run is left RUNNING."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
KEY = "resume-offline"
# Only the training step matters here: one config, no microbench or profile.
OVERRIDES = {"algorithms": [{"name": "ssgd"}], "steps": 60, "microbench.enabled": False, "profile.enabled": False}

# The first attempt of the training step dies (no cleanup, as under SIGKILL) after it opened
# its MLflow run and logged its params, before the job ran.
DIE_HALFWAY = """
import json, os, sys
from pipelines import steps
steps._launch = lambda *a, **k: os._exit(3)
ctx = json.loads(sys.argv[1])
steps.train(ctx, steps.train_configs(ctx)[0])
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from mlflow import MlflowClient

    from pipelines import steps

    root = tmp_path_factory.mktemp("resume")
    store = root / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    out: dict[str, Any] = {"root": root}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        # A new connection per session, so a store taken away is noticed at once.
        mp.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
        ctx = steps.start(str(SMOKE), run_key=KEY, home=str(root / "home"), overrides=OVERRIDES)
        entry = steps.train_configs(ctx)[0]
        node = f"train/{entry['key']}"
        client = MlflowClient(tracking_uri=uri)

        died = subprocess.run(
            [sys.executable, "-c", DIE_HALFWAY, json.dumps(ctx)], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert died.returncode == 3, died.stderr[-2000:]
        first_id = json.loads((Path(ctx["run_dir"]) / "journal.state.json").read_text())["runs"][node]
        out["status_after_kill"] = client.get_run(first_id).info.status

        (store).rename(root / "store-down")  # the store is unavailable from here
        out["trained"] = steps.train(ctx, entry)
        out["finished"] = steps.finish(ctx)
        (root / "store-down").rename(store)  # ... and back

        from pipelines.cli import cli

        out["sync"] = CliRunner().invoke(cli, ["sync", ctx["run_dir"]])
        out.update(ctx=ctx, entry=entry, node=node, client=client, first_id=first_id, uri=uri)
        yield out


@pytest.mark.faults
def test_killed_step_leaves_its_run_open_until_retried(scenario: dict[str, Any]) -> None:
    assert scenario["status_after_kill"] == "RUNNING"


def test_pipeline_goes_on_while_mlflow_is_down(scenario: dict[str, Any]) -> None:
    trained, finished = scenario["trained"], scenario["finished"]
    assert trained["status"] == "FINISHED"
    assert Path(trained["run_dir"], "summary.json").exists()
    assert finished["synced"] is False and finished["pending"] > 0
    assert trained["mlflow_run_id"] == scenario["first_id"]


def test_sync_uploads_every_journaled_metric(scenario: dict[str, Any]) -> None:
    from pipelines.journal import Journal

    assert scenario["sync"].exit_code == 0, scenario["sync"].output
    assert "pending 0" in scenario["sync"].output
    run_dir = Path(scenario["ctx"]["run_dir"])
    journal = Journal(run_dir)
    assert journal.pending() == 0
    runs = journal.read_state()["runs"]
    client = scenario["client"]
    expected: dict[tuple[str, str], dict[int, float]] = {}
    for _, e in journal.entries():
        if e["op"] == "metrics":
            for m in e["metrics"]:
                expected.setdefault((e["node"], m["key"]), {})[m["step"]] = m["value"]
    assert len(expected[(scenario["node"], "train/loss")]) == 60
    for (node, key), points in expected.items():
        got = {m.step: m.value for m in client.get_metric_history(runs[node], key)}
        assert got == pytest.approx(points), (node, key)


def test_retry_completed_the_same_runs_and_none_is_left_running(scenario: dict[str, Any]) -> None:
    client = scenario["client"]
    exp = client.get_experiment_by_name("ddlbench-adhoc")
    runs = client.search_runs([exp.experiment_id], f"tags.`ddlbench.run_key` = '{KEY}'")
    nodes = sorted(r.data.tags["ddlbench.node"] for r in runs)
    assert nodes == ["pipeline", scenario["node"]]
    status = {r.data.tags["ddlbench.node"]: r.info.status for r in runs}
    assert status == {"pipeline": "FINISHED", scenario["node"]: "FINISHED"}
    child = client.get_run(scenario["first_id"])
    assert child.data.params["algorithm"] == "ssgd"
    assert child.data.metrics["throughput_samples_per_s"] > 0


def test_sync_marks_runs_of_dead_processes_failed(scenario: dict[str, Any]) -> None:
    """A step whose process died and that nobody retries: sync ends its run FAILED."""
    from pipelines import steps
    from pipelines.journal import Journal

    ctx = scenario["ctx"]
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    journal = Journal(Path(ctx["run_dir"]))
    journal.append(
        {
            "op": "start_run",
            "node": "orphan",
            "parent": "pipeline",
            "name": "orphan",
            "tags": {},
            "ts": 1,
            "owner": {"host": platform.node(), "pid": int(dead.stdout)},
        }
    )
    res = steps.sync(ctx["run_dir"])
    assert res["orphans_failed"] == ["orphan"] and res["pending"] == 0
    orphan = journal.read_state()["runs"]["orphan"]
    assert scenario["client"].get_run(orphan).info.status == "FAILED"


def test_content_mlflow_refuses_is_set_aside_and_the_rest_uploaded(scenario: dict[str, Any]) -> None:
    """A param whose value changed is refused by MLflow (not a store outage): the entry goes to
    journal.rejected.jsonl and the entries after it still reach MLflow."""
    from pipelines import steps
    from pipelines.journal import Journal

    ctx = scenario["ctx"]
    journal = Journal(Path(ctx["run_dir"]))
    journal.append({"op": "params", "node": "pipeline", "params": {"spec.repeats": "7"}})
    journal.append(
        {"op": "metrics", "node": "pipeline", "metrics": [{"key": "after_refusal", "value": 1.5, "step": 0, "ts": 2}]}
    )
    res = steps.sync(ctx["run_dir"])
    assert res["pending"] == 0 and res["error"] is None
    rejected = [json.loads(line) for line in (Path(ctx["run_dir"]) / "journal.rejected.jsonl").open()]
    assert [r["entry"]["params"] for r in rejected] == [{"spec.repeats": "7"}]
    parent = scenario["client"].get_run(journal.read_state()["runs"]["pipeline"])
    assert parent.data.params["spec.repeats"] == "1"
    assert parent.data.metrics["after_refusal"] == 1.5
