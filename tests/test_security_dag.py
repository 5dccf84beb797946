"""The nightly triggered with a file that is no spec (issue 38), at the `dag.test()` level: the
run fails at `start`, nothing after it runs, no MLflow store or run directory is made, and
neither the task's output nor Airflow's task logs hold any of the file's content.

Runs in a fresh interpreter with an Airflow home of its own (SQLite), so it shares nothing
with tests/test_dags.py's session-wide Airflow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
CANARY = "ddlbench-canary:$6$CANARYSALT$CANARYHASHCANARYHASHCANARYHASH:20593:0:99999:7:::\n"

PROBE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from sqlalchemy import select

dag = DagBag(dag_folder=sys.argv[1]).get_dag("ddlbench_nightly")
run = dag.test(run_conf={"spec_path": sys.argv[2], "home": sys.argv[3]})
with create_session() as session:
    tis = session.scalars(select(TaskInstance).where(TaskInstance.run_id == run.run_id)).all()
    states = {ti.task_id: str(ti.state) for ti in tis}
print("PROBE-RESULT " + json.dumps({"state": str(run.state), "tis": states}))
"""


def _dag_test(tmp_path: Path, spec_path: str) -> tuple[dict, str, Path]:
    airflow_home, home = tmp_path / "airflow", tmp_path / "homes" / "nightly"
    env = {**os.environ, "PYTHONPATH": str(REPO), "AIRFLOW_HOME": str(airflow_home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home}/airflow.db",
           "DDLBENCH_HOME_ROOT": str(tmp_path / "homes"), "DDLBENCH_TASK_RETRIES": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([AIRFLOW, "db", "migrate"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run([sys.executable, "-c", PROBE, str(REPO / "dags"), spec_path, str(home)],
                          capture_output=True, text=True, env=env, timeout=600)
    output = done.stdout + done.stderr
    result = next(line for line in done.stdout.splitlines() if line.startswith("PROBE-RESULT "))
    logs = "".join(p.read_text(errors="replace") for p in (airflow_home / "logs").rglob("*") if p.is_file()) \
        if (airflow_home / "logs").exists() else ""
    return json.loads(result.removeprefix("PROBE-RESULT ")), output + logs, home


def _refused_at_start(result: dict, home: Path) -> None:
    assert result["state"] == "failed", result
    assert result["tis"]["start"] == "failed", result
    ran = {t: s for t, s in result["tis"].items() if t != "start" and s in ("success", "running", "failed")}
    assert ran == {}, result  # nothing after start ran: no provision, no training, no teardown
    assert not home.exists()  # no run directory, no MLflow store


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_file_outside_the_spec_directories_fails_start_without_its_content(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(CANARY)
    result, output, home = _dag_test(tmp_path, str(secret))
    _refused_at_start(result, home)
    assert "spec_path:" in output and "is outside the deployment's spec directories" in output
    assert "CANARY" not in output and "ddlbench-canary" not in output
    if os.access("/etc/shadow", os.R_OK):  # the issue's own input, where the test may read it
        result, output, home = _dag_test(tmp_path / "etc", "/etc/shadow")
        _refused_at_start(result, home)
        for line in Path("/etc/shadow").read_text().splitlines():
            assert line.strip() not in output
            name, _, rest = line.partition(":")
            assert f"{name}:{rest[:12]}" not in output
