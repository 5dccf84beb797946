"""A real Airflow deployment on this machine, for tests and benchmarks: api-server,
dag-processor and scheduler (LocalExecutor) on a throwaway PostgreSQL database, driven
through the REST API (`/api/v2`, a token from `/auth/token`) as a user's client is.

PostgreSQL is the one `scripts/services/postgres.sh` starts (role `ddlbench`, CREATEDB).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
POOLS = REPO / "infra" / "deploy" / "airflow" / "pools.json"
SETTINGS = REPO / "infra" / "deploy" / "airflow" / "config"
PG = {"host": "127.0.0.1", "port": 5432, "user": os.environ.get("DDLBENCH_PG_ROLE", "ddlbench"),
      "password": os.environ.get("DDLBENCH_PG_PASSWORD", "ddlbench")}
TERMINAL = {"success", "failed"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _admin(sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dbname="postgres", connect_timeout=10, **PG)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def postgres_why_not() -> str | None:
    """Why `AirflowServices` cannot start on this machine's PostgreSQL, or None when it can: the
    server answers as the ddlbench role, which may create databases, and Airflow 3 has its async
    driver. For `needs_service("PostgreSQL", postgres_why_not)` (tests/conftest.py)."""
    if find_spec("asyncpg") is None:  # Airflow 3 opens PostgreSQL through postgresql+asyncpg too
        return "asyncpg, which Airflow 3 needs for PostgreSQL, is not installed"
    import psycopg2

    where = f"{PG['host']}:{PG['port']} as {PG['user']}"
    try:
        conn = psycopg2.connect(dbname="postgres", connect_timeout=3, **PG)
    except psycopg2.OperationalError as err:
        first = (str(err).strip().splitlines() or ["no answer"])[0]
        return f"no PostgreSQL on {where} ({first}); CI starts one: scripts/services/postgres.sh"
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT rolcreatedb FROM pg_roles WHERE rolname = current_user")
            (createdb,) = cur.fetchone()
    finally:
        conn.close()
    return None if createdb else f"the role {PG['user']} may not create databases (scripts/services/postgres.sh)"


class AirflowServices:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = Path(root)
        self.port = _free_port()
        self.database = f"ddlbench_airflow_test_{os.getpid()}_{secrets.token_hex(3)}"
        self.password = secrets.token_hex(8)
        home = self.root / "airflow"
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "postgresql+psycopg2://{user}:{password}@{host}:{port}/".format(**PG)
            + self.database,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            # Every process signs and checks the task tokens with the same secret.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # as a new deployment has them
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # The deployment's local settings, as infra/deploy/airflow/env.sh puts them.
            "PYTHONPATH": os.pathsep.join([str(SETTINGS), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **(env or {}),
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)  # each run's home holds its own store
        self.base = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self._token: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> AirflowServices:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _cli(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self, timeout_s: float = 240) -> None:
        (self.root / "airflow").mkdir(parents=True, exist_ok=True)
        (self.root / "airflow" / "passwords.json").write_text(f'{{"admin": "{self.password}"}}')
        _admin(f"CREATE DATABASE {self.database}")
        try:
            self._cli("db", "migrate")
            self._cli("pools", "import", str(POOLS))
            logs = self.root / "service-logs"
            logs.mkdir(exist_ok=True)
            for name in ("api-server", "dag-processor", "scheduler"):
                log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - the process holds it
                self.procs[name] = subprocess.Popen([AIRFLOW, name], env=self.env, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited with {p.returncode}:\n{self.log_tail(name)}")
            try:
                health = requests.get(f"{self.base}/api/v2/monitor/health", timeout=5).json()
                if health.get("scheduler", {}).get("status") == "healthy" and \
                        health.get("dag_processor", {}).get("status") == "healthy":
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"Airflow was not healthy after {timeout_s:.0f} s:\n{self.log_tail('scheduler')}")

    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.root / "service-logs" / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        # The deployment is thrown away (its database dropped below): a service that has not left
        # 5 s after SIGTERM is killed (one of the three has taken the whole of a 30 s grace).
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        try:
            _admin(f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")
        except Exception:  # noqa: BLE001 - a database left behind is only disk
            pass

    # -- the REST API --------------------------------------------------------------------------
    def token(self) -> str:
        if self._token is None:
            r = requests.post(f"{self.base}/auth/token", json={"username": "admin", "password": self.password},
                              timeout=30)
            r.raise_for_status()
            self._token = r.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token()}"} | kwargs.pop("headers", {})
        return requests.request(method, f"{self.base}/api/v2{path}", headers=headers, timeout=60, **kwargs)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> dict[str, Any]:
        """The DAG once the dag-processor has parsed it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.api("GET", f"/dags/{dag_id}")
            if r.status_code == 200:
                return r.json()
            time.sleep(2)
        raise RuntimeError(f"{dag_id} never appeared:\n{self.log_tail('dag-processor')}")

    def unpause(self, dag_id: str) -> None:
        r = self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        r.raise_for_status()

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> requests.Response:
        return self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        r.raise_for_status()
        return r.json()

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float,
                     watch: Callable[[], None] | None = None, every_s: float = 2.0) -> dict[str, Any]:
        """Poll the run to a terminal state (calling `watch` at each poll); its last state."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.dag_run(dag_id, run_id)
            if watch is not None:
                watch()
            if run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} {run_id} still {run['state']} after {timeout_s:.0f} s")
            time.sleep(every_s)

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """What a task instance logged, one event per line, as the UI shows it."""
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                     params={"full_content": "true"}, headers={"Accept": "application/json"})
        r.raise_for_status()
        content = r.json().get("content", [])
        if isinstance(content, str):
            return content
        return "\n".join(str(e.get("event", e)) + (f" {e['error_detail']}" if e.get("error_detail") else "")
                         if isinstance(e, dict) else str(e) for e in content)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        r = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        r.raise_for_status()
        return r.json()["task_instances"]


# With no history no configuration alarms, so the mapped `confirm` maps over nothing and Airflow
# marks it skipped (its gathering task and the report still run).
NO_SUSPECT = {"confirm": "skipped"}


def all_succeeded(states: dict[str, str]) -> bool:
    """Every task succeeded, but a `confirm` with no suspect to rerun, which is skipped."""
    return all(s == "success" or NO_SUSPECT.get(t) == s for t, s in states.items())
