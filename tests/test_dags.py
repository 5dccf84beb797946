"""The Airflow DAGs (dags/): they parse fast and thin, have the promised shape, reject bad
Params, and run end to end through `dag.test()` on the smoke spec, checked in MLflow.

Airflow reads its configuration when first imported, so the session fixture sets a temp
AIRFLOW_HOME (SQLite) before any test imports airflow, migrates it once and loads the
committed pools file; tests import airflow inside their bodies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DAGS = REPO / "dags"
SMOKE = REPO / "specs" / "smoke.yaml"
POOLS = REPO / "infra" / "deploy" / "airflow" / "pools.json"
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
PIPELINE_TASKS = {"start", "provision", "microbench", "profile", "fit", "predict", "train_configs",
                  "train", "validate", "report", "teardown", "finish"}


def airflow_env(home: Path) -> dict[str, str]:
    """A self-contained Airflow: its home, our DAGs, no examples, quiet logs."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if "airflow" in sys.modules:
        pytest.fail("airflow was imported before the test Airflow home was configured")
    home = tmp_path_factory.mktemp("airflow")
    patch = pytest.MonkeyPatch()
    for key, value in airflow_env(home).items():
        patch.setenv(key, value)
    for argv in ([AIRFLOW, "db", "migrate"], [AIRFLOW, "pools", "import", str(POOLS)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    yield home
    patch.undo()


@pytest.fixture()
def dagbag(airflow_home: Path) -> Any:
    """A fresh parse of dags/ (tests may change a task of their own copy)."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_imports_without_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"ddlbench_nightly", "ddlbench_hardware_onboarding"}
    # The shared helper module is ignored (.airflowignore), not parsed as a DAG file.
    assert sorted(Path(s.file).name for s in dagbag.dagbag_stats) == [
        "ddlbench_hardware_onboarding.py", "ddlbench_nightly.py"]


def test_dag_files_parse_fast_without_heavy_imports(airflow_home: Path) -> None:
    """In a fresh interpreter: parsing imports no torch, mlflow or pipelines, in well under 1 s."""
    probe = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "print(json.dumps({'errors': list(bag.import_errors),"
        " 'durations': {s.file: s.duration.total_seconds() for s in bag.dagbag_stats},"
        " 'heavy': sorted(m for m in ('torch', 'mlflow', 'pipelines', 'training', 'modelling')"
        " if m in sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env=os.environ | airflow_env(airflow_home))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == [] and result["heavy"] == []
    assert len(result["durations"]) == 2
    for file, seconds in result["durations"].items():
        assert seconds < 0.5, f"{file} took {seconds:.2f} s to parse"


def _order(dag: Any) -> list[str]:
    return [t.task_id for t in dag.topological_sort()]


def test_nightly_dag_shape(dagbag: Any) -> None:
    from airflow.sdk import Asset

    dag = dagbag.get_dag("ddlbench_nightly")
    assert dag.schedule == "0 2 * * *"
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.params["spec_path"] == str(REPO / "specs" / "nightly-cpu.yaml")
    assert dag.params["overrides"] == {} and dag.params["home"] is None
    assert set(dag.task_dict) == PIPELINE_TASKS
    order = _order(dag)
    steps = ["start", "provision", "microbench", "profile", "fit", "predict", "train_configs",
             "train", "validate", "report", "teardown", "finish"]
    assert sorted(order, key=steps.index) == order

    train = dag.get_task("train")
    assert train.pool == "ddlbench_nodes" and train.pool_slots == 1
    assert train.retries == 2 and train.retry_exponential_backoff
    assert train.execution_timeout == timedelta(hours=2)
    assert train.map_index_template == "{{ config_key }}"
    for task in dag.tasks:
        assert task.execution_timeout is not None, task.task_id
        assert task.retries == (0 if task.task_id in ("start", "finish") else 2), task.task_id

    teardown, finish = dag.get_task("teardown"), dag.get_task("finish")
    assert teardown.is_teardown and finish.is_teardown
    assert {"start", "provision"} <= teardown.upstream_task_ids
    assert dag.get_task("start").is_setup and dag.get_task("provision").is_setup
    assert dag.get_task("report").outlets == [Asset(name="ddlbench_nightly_report",
                                                    uri="ddlbench://reports/nightly")]


def test_onboarding_dag_shape(dagbag: Any) -> None:
    dag = dagbag.get_dag("ddlbench_hardware_onboarding")
    assert dag.schedule is None
    assert {"hardware_label", "provider", "nodes", "devices_per_node", "bandwidth_gbps", "models",
            "algorithms", "world_sizes"} <= set(dag.params)
    assert set(dag.task_dict) == PIPELINE_TASKS | {"record_hardware_profile"}
    assert dag.get_task("train").pool == "ddlbench_nodes"
    assert {"fit"} <= dag.get_task("record_hardware_profile").upstream_task_ids
    assert "record_hardware_profile" in dag.get_task("report").upstream_task_ids
    assert dag.get_task("teardown").is_teardown


@pytest.mark.parametrize(("conf", "message"), [
    ({"provider": "ftp"},
     "param provider: 'ftp' is not one of ['local', 'netns', 'slurm', 'kubernetes']"),
    ({"nodes": 0}, "param nodes: 0 is less than the minimum of 1"),
    ({"hardware_label": "../../etc"}, "param hardware_label: '../../etc' does not match"),
    ({"hardware_label": "h100; rm -rf ~"}, "param hardware_label: 'h100; rm -rf ~' does not match"),
    ({"world_sizes": [0]}, "param world_sizes: 0 is less than the minimum of 1"),
])
def test_onboarding_rejects_bad_params_before_anything_runs(dagbag: Any, tmp_path: Path,
                                                            conf: dict, message: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.get_dag("ddlbench_hardware_onboarding")
    with pytest.raises(ParamValidationError) as err:
        dag.test(run_conf={"home": str(tmp_path)} | conf)
    assert message in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no run directory, no MLflow store: nothing started


def test_onboarding_rejects_fields_that_contradict_each_other(airflow_home: Path) -> None:
    from dags.ddlbench_hardware_onboarding import FORM, OnboardingError, onboarding_overrides

    form = {name: param.value for name, param in FORM.items()}
    with pytest.raises(OnboardingError,
                       match=r"nodes: the local provider runs on this one host; got 2"):
        onboarding_overrides(form | {"nodes": 2})
    with pytest.raises(OnboardingError, match=r"world_sizes: \[8\] exceed nodes x devices_per_node "
                                              r"= 2 x 2 = 4"):
        onboarding_overrides(form | {"provider": "netns", "nodes": 2, "world_sizes": [2, 8]})
    spec = onboarding_overrides(form | {"world_sizes": [2], "algorithms": ["ssgd", "odsgd"]})
    assert spec["workers"] == [2] and spec["suite"] == "onboarding"
    assert spec["what_if"]["workers"] == [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert spec["algorithms"] == [{"name": "ssgd", "comm": "allreduce"},
                                  {"name": "odsgd", "comm": "ps"}]
