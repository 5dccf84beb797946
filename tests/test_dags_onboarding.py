"""`ddlbench_hardware_onboarding` end to end through the CLI (`airflow dags test`), the way
scripts/main.sh runs a DAG, with both Airflow's metadata and MLflow's store on PostgreSQL
when one is reachable (CI starts it with scripts/services/postgres.sh), else on SQLite; the
PostgreSQL test then skips, or under CI=true fails naming the service (tests/conftest.py).

Runs in a subprocess: Airflow reads its database settings once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from pipelines.tracking.uri import mask_uri
from tests.airflow_services import all_succeeded
from tests.conftest import needs_service, require_service

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
PG = {"host": os.environ.get("DDLBENCH_PG_HOST", "127.0.0.1"),
      "port": int(os.environ.get("DDLBENCH_PG_PORT", "5432")),
      "user": os.environ.get("DDLBENCH_PG_ROLE", "ddlbench"),
      "password": os.environ.get("DDLBENCH_PG_PASSWORD", "ddlbench")}
FORM = {"hardware_label": "cpu-onboard-test", "provider": "local", "nodes": 1, "devices_per_node": 2,
        "bandwidth_gbps": 100, "models": ["lenet5"], "dataset": "digits", "algorithms": ["odsgd"],
        "world_sizes": [2], "base_spec": str(REPO / "specs" / "smoke.yaml")}


def _pg_admin() -> Any | None:
    """An autocommit connection as the ddlbench role, or None when no PostgreSQL answers."""
    import psycopg2

    try:
        conn = psycopg2.connect(dbname="ddlbench_airflow", connect_timeout=3, **PG)
    except psycopg2.OperationalError:
        return None
    conn.autocommit = True
    return conn


def _postgres_why_not() -> str | None:
    """Why the onboarding run cannot use PostgreSQL, or None when it can."""
    # Airflow 3 opens PostgreSQL through an async driver too (postgresql+asyncpg).
    if find_spec("asyncpg") is None:
        return "asyncpg, which Airflow 3 needs for PostgreSQL, is not installed"
    admin = _pg_admin()
    if admin is None:
        return f"no PostgreSQL on {PG['host']}:{PG['port']} (CI starts one: scripts/services/postgres.sh)"
    admin.close()
    return None


@pytest.fixture(scope="module")
def stores() -> Iterator[dict[str, str]]:
    """SQLAlchemy URIs of Airflow's metadata DB and MLflow's store: throwaway PostgreSQL
    databases when the server is up; else none (SQLite in the run's home) and why."""
    why_not = _postgres_why_not()
    admin = _pg_admin() if why_not is None else None
    if admin is None:
        yield {"backend": "sqlite", "why": why_not or "PostgreSQL stopped answering"}
        return
    suffix = uuid.uuid4().hex[:8]
    names = {"airflow": f"ddlbench_t{suffix}_airflow", "mlflow": f"ddlbench_t{suffix}_mlflow"}
    with admin.cursor() as cur:
        for name in names.values():
            cur.execute(f"CREATE DATABASE {name}")
    base = f"postgresql+psycopg2://{PG['user']}:{PG['password']}@{PG['host']}:{PG['port']}"
    try:
        yield {"backend": "postgresql", "airflow": f"{base}/{names['airflow']}",
               "mlflow": f"{base}/{names['mlflow']}"}
    finally:
        with admin.cursor() as cur:
            for name in names.values():
                cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


@pytest.fixture(scope="module")
def onboarding(stores: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One onboarding run on a small valid form: lenet5, OD-SGD, 2 workers."""
    home = tmp_path_factory.mktemp("onboarding-home")
    airflow_home = home / "airflow"
    airflow_db = stores.get("airflow", f"sqlite:///{airflow_home}/airflow.db")
    env = os.environ | {
        "AIRFLOW_HOME": str(airflow_home), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db,
        "DDLBENCH_HOME": str(home),
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    if "mlflow" in stores:
        env["MLFLOW_TRACKING_URI"] = stores["mlflow"]
    airflow_home.mkdir()
    conf = json.dumps(FORM | {"home": str(home)})
    for argv in ([AIRFLOW, "db", "migrate"],
                 [AIRFLOW, "pools", "import", str(REPO / "infra/deploy/airflow/pools.json")],
                 [AIRFLOW, "dags", "test", "ddlbench_hardware_onboarding", "-c", conf]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{argv[1:3]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (ctx_path,) = (home / "runs").glob("*/ctx.json")
    return {"home": home, "airflow_db": airflow_db, "ctx": json.loads(ctx_path.read_text())} | stores


def _airflow_states(airflow_db: str) -> tuple[list[str], dict[str, str]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(airflow_db)
    try:
        with engine.connect() as conn:
            runs = [r[0] for r in conn.execute(text(
                "SELECT state FROM dag_run WHERE dag_id = 'ddlbench_hardware_onboarding'"))]
            tis = {r[0]: r[1] for r in conn.execute(text(
                "SELECT task_id, state FROM task_instance WHERE dag_id = 'ddlbench_hardware_onboarding'"))}
    finally:
        engine.dispose()
    return runs, tis


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_onboarding_runs_end_to_end(onboarding: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    runs, tis = _airflow_states(onboarding["airflow_db"])
    assert runs == ["success"]
    assert all_succeeded(tis), tis
    assert "record_hardware_profile" in tis

    ctx = onboarding["ctx"]
    assert ctx["experiment"] == "ddlbench-onboarding" and ctx["hardware"] == "cpu-onboard-test"
    # ctx (and so XCom) holds the store's URI without its password; the real one is the environment's.
    uri = onboarding.get("mlflow", ctx["tracking_uri"])
    assert mask_uri(uri) == ctx["tracking_uri"]
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(ctx["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["ddlbench.hardware"] == "cpu-onboard-test"
    assert parent.data.tags["airflow.dag_id"] == "ddlbench_hardware_onboarding"

    # The fitted hardware profile: comm fits and layer tables, as one artifact.
    path = client.download_artifacts(ctx["parent_run_id"], "hardware_profile/hardware_profile.json",
                                     str(onboarding["home"] / "download"))
    profile = json.loads(Path(path).read_text())
    assert profile["hardware"] == "cpu-onboard-test"
    assert profile["comm_model"]["fits"] and profile["layers"]
    # The largest per-worker batch each algorithm fits in this host's memory: at least the batch
    # the run trained at on it (modelling/memory.py).
    assert set(profile["largest_batch"]) == set(profile["layers"])
    assert all(isinstance(b, int) and b >= 32 for row in profile["largest_batch"].values() for b in row.values()), \
        profile["largest_batch"]
    report = (Path(ctx["run_dir"]) / "report" / "report.md").read_text()
    assert "## The largest batch that fits" in report
    for workload, row in profile["largest_batch"].items():
        assert f"| {workload} | " + " | ".join(str(b) for b in row.values()) + " |" in report

    # Predictions for the chosen algorithm at every power of two up to 1024 workers.
    predictions = json.loads((Path(ctx["run_dir"]) / "predict" / "predictions.json").read_text())
    assert sorted({p["workers"] for p in predictions}) == [2**k for k in range(11)]
    assert all(p["throughput_samples_per_s"] > 0 for p in predictions)

    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{ctx['parent_run_id']}'")
    trained = [r for r in children if r.data.tags.get("ddlbench.config_key")]
    assert [r.data.tags["ddlbench.config_key"] for r in trained] == ["lenet5-odsgd-ps-w2-b32-r0"]
    assert trained[0].info.status == "FINISHED"
    assert trained[0].data.metrics["throughput_samples_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_service("PostgreSQL", _postgres_why_not)
def test_onboarding_ran_with_both_stores_on_postgresql(onboarding: dict[str, Any]) -> None:
    # The mark asked before the run; a server that stopped answering since fails or skips here.
    require_service("PostgreSQL", onboarding.get("why"))
    assert onboarding["airflow_db"].startswith("postgresql")
    assert onboarding["ctx"]["tracking_uri"].startswith("postgresql")
    assert ":***@" in onboarding["ctx"]["tracking_uri"]  # no password in ctx.json or XCom
    from sqlalchemy import create_engine, text

    engine = create_engine(onboarding["mlflow"])
    try:
        with engine.connect() as conn:
            statuses = {r[0]: r[1] for r in conn.execute(text("SELECT run_uuid, status FROM runs"))}
    finally:
        engine.dispose()
    assert statuses[onboarding["ctx"]["parent_run_id"]] == "FINISHED"
    assert len(statuses) >= 8  # parent, the steps and the training
