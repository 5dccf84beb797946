"""A step SIGKILLed halfway through its training job, retried while the MLflow store is
unavailable, then `ddlbench sync`: the retry completes the same MLflow runs, the pipeline goes on
offline, and afterwards every metric the journal holds is in MLflow and no run is left RUNNING.

The module's scenario is read, never changed: a test that adds to a run's journal or store works
on its own copy of both (`own_run`), so the tests pass in any order."""

from __future__ import annotations

import json
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.trainjobs import processes_under

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
KEY = "resume-offline"
STEPS = 200
# Only the training step matters here: one config, no microbench or profile. 20 ms of sleep a
# step gives the job a floor of 4 s whatever the machine's speed, so the SIGKILL, sent once the
# first step is logged, lands mid-job.
OVERRIDES = {"algorithms": [{"name": "ssgd"}], "steps": STEPS, "train.inject_delay_ms": 20,
             "microbench.enabled": False, "profile.enabled": False}

# The training step as Airflow's task runs it, in a process of its own: the test SIGKILLs it.
TRAIN_STEP = """
import json, sys
from pipelines import steps
ctx = json.loads(sys.argv[1])
steps.call("train", ctx, steps.call("train_configs", ctx)[0])
"""


def _logged_steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    steps = []
    for line in metrics.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except (json.JSONDecodeError, KeyError):
            break  # a row being written
    return steps


def _sigkill_mid_job(ctx: dict[str, Any], out: Path) -> dict[str, Any]:
    """Run the training step in a process, SIGKILL it once its job logged a step; what was seen."""
    step = subprocess.Popen([sys.executable, "-c", TRAIN_STEP, json.dumps(ctx)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _logged_steps(out / "metrics.jsonl"):
            assert step.poll() is None, f"the step ended before it was killed: {step.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "the training job logged no step in 240 s"
            time.sleep(0.05)
        step.send_signal(signal.SIGKILL)
        assert step.wait(10) == -signal.SIGKILL
        # its torchrun agent and ranks follow it (infra/lifeline.py)
        deadline = time.monotonic() + 15
        while (left := processes_under(out)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return {"left": left, "logged": _logged_steps(out / "metrics.jsonl"),
                "summary": (out / "summary.json").exists()}
    finally:
        step.kill()
        step.wait()


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
        ctx = steps.call("start", str(SMOKE), run_key=KEY, home=str(root / "home"), overrides=OVERRIDES)
        entry = steps.call("train_configs", ctx)[0]
        node = f"train/{entry['key']}"
        client = MlflowClient(tracking_uri=uri)

        out["kill"] = _sigkill_mid_job(ctx, Path(ctx["run_dir"]) / "train" / entry["key"])
        first_id = json.loads((Path(ctx["run_dir"]) / "journal.state.json").read_text())["runs"][node]
        out["status_after_kill"] = client.get_run(first_id).info.status

        (store).rename(root / "store-down")  # the store is unavailable from here
        out["trained"] = steps.call("train", ctx, entry)
        out["finished"] = steps.call("finish", ctx)
        (root / "store-down").rename(store)  # ... and back

        from pipelines.cli import cli

        out["sync"] = CliRunner().invoke(cli, ["sync", ctx["run_dir"]])
        out.update(ctx=ctx, entry=entry, node=node, client=client, first_id=first_id, uri=uri)
        yield out


@pytest.fixture
def own_run(scenario: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A copy of the scenario's run directory and MLflow store, for a test that changes them:
    the paths in ctx.json and the store's artifact locations point into the copy."""
    from mlflow import MlflowClient

    root = scenario["root"]
    shutil.copytree(root / "home", tmp_path / "home")
    shutil.copytree(root / "store", tmp_path / "store")
    ctx_path = tmp_path / "home" / "runs" / KEY / "ctx.json"
    ctx_path.write_text(ctx_path.read_text().replace(str(root), str(tmp_path)))
    with sqlite3.connect(tmp_path / "store" / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
                   (str(root), str(tmp_path)))
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (str(root), str(tmp_path)))
    db.close()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return {"ctx": json.loads(ctx_path.read_text()), "client": MlflowClient(tracking_uri=uri)}


def test_the_kill_landed_mid_job_and_left_no_process(scenario: dict[str, Any]) -> None:
    kill = scenario["kill"]
    assert kill["left"] == []
    assert kill["logged"] and max(kill["logged"]) < STEPS - 1 and not kill["summary"]


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
    from pipelines.tracking.journal import Journal

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
    assert len(expected[(scenario["node"], "train/loss")]) == STEPS
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


def test_sync_marks_runs_of_dead_processes_failed(own_run: dict[str, Any]) -> None:
    """A step whose process died and that nobody retries: sync ends its run FAILED."""
    from pipelines import steps
    from pipelines.tracking.journal import Journal

    ctx = own_run["ctx"]
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
    assert own_run["client"].get_run(orphan).info.status == "FAILED"


def test_content_mlflow_refuses_is_set_aside_and_the_rest_uploaded(own_run: dict[str, Any]) -> None:
    """A param whose value changed is refused by MLflow (not a store outage): the entry goes to
    journal.rejected.jsonl and the entries after it still reach MLflow."""
    from pipelines import steps
    from pipelines.tracking.journal import Journal

    ctx = own_run["ctx"]
    journal = Journal(Path(ctx["run_dir"]))
    journal.append({"op": "params", "node": "pipeline", "params": {"spec.repeats": "7"}})
    journal.append(
        {"op": "metrics", "node": "pipeline", "metrics": [{"key": "after_refusal", "value": 1.5, "step": 0, "ts": 2}]}
    )
    res = steps.sync(ctx["run_dir"])
    assert res["pending"] == 0 and res["error"] is None
    rejected = [json.loads(line) for line in (Path(ctx["run_dir"]) / "journal.rejected.jsonl").open()]
    assert [r["entry"]["params"] for r in rejected] == [{"spec.repeats": "7"}]
    parent = own_run["client"].get_run(journal.read_state()["runs"]["pipeline"])
    assert parent.data.params["spec.repeats"] == "1"
    assert parent.data.metrics["after_refusal"] == 1.5
