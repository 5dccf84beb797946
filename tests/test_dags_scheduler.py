"""The DAGs under the real Airflow scheduler, as users run them: api-server, dag-processor and
scheduler with the LocalExecutor on PostgreSQL, every task in its own supervised process.
Runs are triggered and polled through the REST API, and checked through MLflow's client.

One deployment serves the module. It never schedules a nightly by itself
(DDLBENCH_NIGHTLY_SCHEDULE=none: unpausing would otherwise start the latest missed night at
once), runs each task once (a flaky task fails the test instead of being retried away), and
kills a training task after 60 s (the failing case below).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.airflow_services import REPO, AirflowServices, all_succeeded, postgres_why_not
from tests.conftest import needs_service
from tests.trainjobs import processes_under

# Every test runs on the module's deployment, whose metadata database is a throwaway one on
# PostgreSQL: without the server each skips (outside CI) or fails naming it (CI=true) at setup,
# before the fixture would start anything.
pytestmark = [pytest.mark.slow, needs_service("PostgreSQL", postgres_why_not)]

SMOKE = REPO / "specs" / "smoke.yaml"
# The smoke grid's jobs here train 100 steps, the onboarding's 500 (the smoke spec's), each
# task in 8 s or less (its process starts with what the scheduler preloaded); the timeout case
# below waits this long for its kill.
TRAIN_TIMEOUT_S = 30
SHORT = {"steps": 100}
DEPLOYMENT = {
    "DDLBENCH_NIGHTLY_SCHEDULE": "none",
    "DDLBENCH_TASK_RETRIES": "0",
    "DDLBENCH_TRAIN_TIMEOUT_S": str(TRAIN_TIMEOUT_S),
}
ONBOARDING_FORM = {"hardware_label": "box-a", "provider": "local", "nodes": 1, "devices_per_node": 2,
                   "models": ["lenet5"], "world_sizes": [2], "algorithms": ["ssgd", "odsgd"]}


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServices]:
    # Each test's home lies under pytest's base temp: the deployment's home root (pipelines/spec/trigger.py).
    home_root = {"DDLBENCH_HOME_ROOT": str(tmp_path_factory.getbasetemp())}
    with AirflowServices(tmp_path_factory.mktemp("scheduler"), DEPLOYMENT | home_root) as af:
        for dag_id in ("ddlbench_nightly", "ddlbench_hardware_onboarding"):
            assert af.wait_for_dag(dag_id)["is_paused"] is True  # as a new deployment has them
            af.unpause(dag_id)
        yield af


def _mlflow_runs(home: Path) -> tuple[dict[str, Any], list[Any]]:
    """(ctx, every MLflow run of the pipeline run) of the one run under `home`."""
    from mlflow import MlflowClient

    (ctx_path,) = (home / "runs").glob("*/ctx.json")
    ctx = json.loads(ctx_path.read_text())
    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    experiment = client.get_experiment_by_name(ctx["experiment"])
    return ctx, client.search_runs([experiment.experiment_id], max_results=1000)


class ParentWatch:
    """The parent MLflow run's status at every poll while the DAG run goes on."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.seen: list[str] = []

    def __call__(self) -> None:
        ctx_path = next((self.home / "runs").glob("*/ctx.json"), None) if (self.home / "runs").exists() else None
        if ctx_path is None:
            return
        ctx = json.loads(ctx_path.read_text())
        if not ctx.get("parent_run_id"):
            return
        from mlflow import MlflowClient

        status = MlflowClient(tracking_uri=ctx["tracking_uri"]).get_run(ctx["parent_run_id"]).info.status
        self.seen.append(status)


def _run(airflow: AirflowServices, dag_id: str, conf: dict[str, Any], home: Path,
         timeout_s: float = 900) -> tuple[dict[str, Any], list[dict[str, Any]], ParentWatch, float]:
    r = airflow.trigger(dag_id, conf | {"home": str(home)})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    watch = ParentWatch(home)
    t0 = time.monotonic()
    run = airflow.wait_for_run(dag_id, run_id, timeout_s, watch=watch)
    wall = time.monotonic() - t0
    print(f"{dag_id} under the scheduler: {run['state']} in {wall:.1f} s")
    return run, airflow.task_instances(dag_id, run_id), watch, wall


def _mapped(pid: int) -> str:
    """The files process `pid` has mapped (its loaded libraries)."""
    return Path(f"/proc/{pid}/maps").read_text()


def _states(tis: list[dict[str, Any]]) -> dict[str, str]:
    return {f"{t['task_id']}[{t['map_index']}]" if t["map_index"] >= 0 else t["task_id"]: t["state"] for t in tis}


@pytest.mark.timeout(1200)
def test_nightly_runs_to_success_under_the_scheduler(airflow: AirflowServices, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run, tis, watch, _ = _run(airflow, "ddlbench_nightly", {"spec_path": str(SMOKE), "overrides": SHORT}, home)
    states = _states(tis)
    assert run["state"] == "success", f"{states}\n{airflow.log_tail('scheduler')}"
    assert all_succeeded(states), states
    assert len([t for t in tis if t["task_id"] == "train"]) == 3  # the smoke grid
    # The scheduler, which forks every task, imported what they import (the deployment's
    # airflow_local_settings.py); the API server, which forks none, did not.
    assert "libtorch" in _mapped(airflow.procs["scheduler"].pid)
    assert "libtorch" not in _mapped(airflow.procs["api-server"].pid)

    ctx, runs = _mlflow_runs(home)
    assert {r.info.status for r in runs} == {"FINISHED"}
    parent = next(r for r in runs if r.info.run_id == ctx["parent_run_id"])
    assert parent.data.tags["airflow.dag_id"] == "ddlbench_nightly"
    assert watch.seen and "FAILED" not in watch.seen, watch.seen  # the parent lived through every task
    assert {r.data.tags.get("ddlbench.step") for r in runs} >= {"profile", "microbench", "train", "report"}
    # The profile ran as a job of its own, in fresh processes (one per worker), not in the task.
    # Each pooled round (profile.pooled, 2 in the smoke spec) is a job of its own.
    profile_dirs = sorted((Path(ctx["run_dir"]) / "profile").glob("*/r*/job"))
    assert [p.parent.name for p in profile_dirs] == ["r0", "r1"]
    profile_dir = profile_dirs[0]
    assert json.loads((profile_dir / "profile-job.json").read_text())["processes"] == 2
    table = json.loads((profile_dir / "profile-result.json").read_text())  # written by the job's rank 0
    assert table["environment"]["processes"] == 2 and table["layers"]


@pytest.mark.timeout(1200)
def test_onboarding_runs_to_success_and_records_the_hardware_profile(airflow: AirflowServices,
                                                                     tmp_path: Path) -> None:
    from mlflow import MlflowClient

    home = tmp_path / "home"
    run, tis, watch, _ = _run(airflow, "ddlbench_hardware_onboarding", ONBOARDING_FORM, home)
    states = _states(tis)
    assert run["state"] == "success", f"{states}\n{airflow.log_tail('scheduler')}"
    assert all_succeeded(states), states

    ctx, runs = _mlflow_runs(home)
    assert ctx["experiment"] == "ddlbench-onboarding" and ctx["hardware"] == "box-a"
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert watch.seen and "FAILED" not in watch.seen, watch.seen
    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    names = {a.path for a in client.list_artifacts(ctx["parent_run_id"], "hardware_profile")}
    assert names == {"hardware_profile/hardware_profile.json"}
    profile = json.loads(Path(client.download_artifacts(ctx["parent_run_id"], "hardware_profile/hardware_profile.json",
                                                        str(tmp_path / "download"))).read_text())
    assert profile["hardware"] == "box-a" and profile["comm_model"]["fits"]
    assert list(profile["layers"]) == ["lenet5-synthetic-b32"]


def test_a_bad_form_value_is_refused_at_trigger_and_creates_no_run(airflow: AirflowServices,
                                                                   tmp_path: Path) -> None:
    before = airflow.api("GET", "/dags/ddlbench_hardware_onboarding/dagRuns").json()["total_entries"]
    r = airflow.trigger("ddlbench_hardware_onboarding", ONBOARDING_FORM | {"nodes": 0, "home": str(tmp_path)})
    assert r.status_code == 400 and "nodes" in r.text, r.text
    assert airflow.api("GET", "/dags/ddlbench_hardware_onboarding/dagRuns").json()["total_entries"] == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_a_bad_trigger_that_passes_the_form_fails_in_start_naming_the_field_and_creates_no_run(
        airflow: AirflowServices, tmp_path: Path) -> None:
    """A model name is any string to the form; preflight (in `start`) knows the registry."""
    home = tmp_path / "home"
    run, tis, _, _ = _run(airflow, "ddlbench_hardware_onboarding", ONBOARDING_FORM | {"models": ["resnet9000"]},
                          home, timeout_s=300)
    states = _states(tis)
    assert run["state"] == "failed" and states["start"] == "failed", states
    assert not {s for t, s in states.items() if t != "start"} & {"success", "running", "failed"}, states
    log = airflow.task_log("ddlbench_hardware_onboarding", run["dag_run_id"], "start")
    assert "].model: unknown model 'resnet9000'" in log, log[-3000:]
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []
    assert not (home / "mlflow.db").exists()  # no store, so no MLflow run


@pytest.mark.faults
@pytest.mark.timeout(900)
def test_a_training_task_killed_by_its_execution_timeout_fails_the_run_and_leaves_nothing(
        airflow: AirflowServices, tmp_path: Path) -> None:
    home = tmp_path / "home"
    overrides = {"algorithms": [{"name": "odsgd"}], "steps": 10**6, "epochs": None, "train_timeout_s": 3600,
                 "microbench.enabled": False, "profile.enabled": False}
    run, tis, _, wall = _run(airflow, "ddlbench_nightly", {"spec_path": str(SMOKE), "overrides": overrides}, home)
    states = _states(tis)
    assert run["state"] == "failed", states
    assert states["train[0]"] == "failed" and states["validate"] == "upstream_failed", states
    assert states["teardown"] == "success" and states["finish"] == "success", states
    assert wall >= TRAIN_TIMEOUT_S  # it was the timeout that ended it, not an early failure
    assert processes_under(home) == []

    ctx, runs = _mlflow_runs(home)
    (trained,) = [r for r in runs if "ddlbench.config_key" in r.data.tags]
    assert trained.info.status == "FAILED"
    assert all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    assert {r.info.run_id: r.info.status for r in runs}[ctx["parent_run_id"]] == "FAILED"
    log = (Path(ctx["run_dir"]) / "train").glob("*/launcher.log")
    assert any(p.stat().st_size > 0 for p in log)  # the job had started before the kill


def _forked_by_an_agent(p: psutil.Process) -> bool:
    try:
        parent = p.parent()
        return parent is not None and "infra.zygote" in " ".join(parent.cmdline())
    except psutil.Error:
        return True  # gone: no agent of a live job


@pytest.mark.faults
@pytest.mark.timeout(900)
def test_sigkill_of_a_task_process_running_train_leaves_no_process_and_no_running_mlflow_run(
        airflow: AirflowServices, tmp_path: Path) -> None:
    """The task process itself killed outright (an OOM kill): its agent and ranks die
    with it within 10 s; Airflow fails the task, and `finish` ends its MLflow run FAILED."""
    home = tmp_path / "home"
    overrides = {"algorithms": [{"name": "ssgd"}], "steps": 10**6, "epochs": None, "train_timeout_s": 3600,
                 "microbench.enabled": False, "profile.enabled": False}
    r = airflow.trigger("ddlbench_nightly", {"spec_path": str(SMOKE), "overrides": overrides, "home": str(home)})
    assert r.status_code == 200, r.text
    run_id = r.json()["dag_run_id"]
    deadline = time.monotonic() + 300
    agent = None
    while agent is None and time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            # the agent, not one of its forked ranks (which keep its command line)
            if "infra.zygote" in cmd and str(home) in cmd and not _forked_by_an_agent(p):
                agent = p
        time.sleep(0.5)
    assert agent is not None, "the training job never started"
    while len(processes_under(home)) < 3 and time.monotonic() < deadline:  # the agent and its 2 ranks
        time.sleep(0.2)
    task_process = agent.parent()
    assert task_process is not None
    task_process.kill()
    left_at = time.monotonic() + 10
    while processes_under(home) and time.monotonic() < left_at:
        time.sleep(0.2)
    assert processes_under(home) == []

    run = airflow.wait_for_run("ddlbench_nightly", run_id, 300)
    states = _states(airflow.task_instances("ddlbench_nightly", run_id))
    assert run["state"] == "failed" and states["train[0]"] == "failed", states
    assert states["finish"] == "success", states
    ctx, runs = _mlflow_runs(home)
    assert all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    (trained,) = [r for r in runs if "ddlbench.config_key" in r.data.tags]
    assert trained.info.status == "FAILED"


@pytest.mark.timeout(900)
def test_a_hostile_trigger_is_refused_at_start(airflow: AirflowServices, tmp_path: Path) -> None:
    """The nightly triggered through the REST API with a spec path outside the deployment's spec
    directories, and with overrides that would add a command to the SLURM batch script: each run
    fails at `start` naming the Param or field, nothing after it runs, no MLflow run or run
    directory exists, the command never ran, and the task log holds none of the file."""
    pwned = tmp_path / "pwned"
    hostile = {"provider.name": "slurm", "provider.options.partition": f"debug\necho PWNED > {pwned}",
               "provider.options.account": f"acct\ntouch {pwned}"}
    cases = [({"spec_path": "/etc/shadow", "overrides": hostile}, ["spec_path: '/etc/shadow' is outside"]),
             ({"spec_path": str(SMOKE), "overrides": hostile},
              [f"overrides.provider.options.{name}: only the deployment sets it" for name in ("account", "partition")])]
    for i, (conf, expected) in enumerate(cases):
        home = tmp_path / f"home{i}"
        run, tis, _, _ = _run(airflow, "ddlbench_nightly", conf, home, timeout_s=300)
        states = _states(tis)
        assert run["state"] == "failed" and states["start"] == "failed", states
        assert not {s for t, s in states.items() if t != "start"} & {"success", "running", "failed"}, states
        log = airflow.task_log("ddlbench_nightly", run["dag_run_id"], "start")
        assert all(e in log for e in expected), log[-3000:]
        try:  # the file, where this test's user may read it
            shadow = Path("/etc/shadow").read_text().splitlines()
        except OSError:
            shadow = []
        assert not [line for line in shadow if line.strip() and line in log]
        assert not home.exists()  # no run directory and no MLflow store: no MLflow run at all, none RUNNING
    assert not pwned.exists()
