"""Wall time of each DAG run under the real scheduler against `airflow dags test` of the same conf.

    python benchmarks/bench_scheduler.py [--repeats 1] [--dag nightly|onboarding|both]

The anchor is `airflow dags test` (one process, no task supervisor), measured in the same
run on a SQLite Airflow home as `scripts/main.sh` uses; the scheduler side is the real
deployment the tests use (api-server, dag-processor, scheduler, LocalExecutor, PostgreSQL;
tests/airflow_services.py), triggered and polled through the REST API. Repeats alternate
the two. Prints median [min, max] of each and the ratio scheduler / dags test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.airflow_services import AIRFLOW, AirflowServices  # noqa: E402

SMOKE = REPO / "specs" / "smoke.yaml"
CONFS = {
    "ddlbench_nightly": {"spec_path": str(SMOKE)},
    "ddlbench_hardware_onboarding": {"hardware_label": "box-a", "provider": "local", "nodes": 1,
                                     "devices_per_node": 2, "models": ["lenet5"], "world_sizes": [2]},
}


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.1f} s [{min(xs):.1f}, {max(xs):.1f}]"


def dags_test(dag_id: str, conf: dict, root: Path) -> float:
    home = root / "airflow"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    }
    for argv in (["db", "migrate"], ["pools", "import", str(REPO / "infra/deploy/airflow/pools.json")]):
        subprocess.run([AIRFLOW, *argv], env=env, check=True, capture_output=True, timeout=600)
    t0 = time.monotonic()
    done = subprocess.run([AIRFLOW, "dags", "test", dag_id, "-c", json.dumps(conf | {"home": str(root / "ddl")})],
                          env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    status = json.loads(next((root / "ddl" / "runs").glob("*/status.json")).read_text())["status"]
    if status != "FINISHED":
        raise SystemExit(f"airflow dags test {dag_id} ended {status}:\n{done.stdout[-3000:]}")
    return wall


def scheduled(af: AirflowServices, dag_id: str, conf: dict, root: Path) -> float:
    r = af.trigger(dag_id, conf | {"home": str(root / "ddl")})
    r.raise_for_status()
    t0 = time.monotonic()
    run = af.wait_for_run(dag_id, r.json()["dag_run_id"], 1800, every_s=1.0)
    wall = time.monotonic() - t0
    if run["state"] != "success":
        raise SystemExit(f"{dag_id} under the scheduler ended {run['state']}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--dag", choices=["nightly", "onboarding", "both"], default="both")
    args = ap.parse_args()
    dags = [d for d in CONFS if args.dag == "both" or args.dag in d]
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.2f} on {os.cpu_count()} cores" + (" (loaded)" if load > 0.5 else ""))
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scheduler-") as tmp:
        root = Path(tmp)
        env = {"DDLBENCH_NIGHTLY_SCHEDULE": "none"}
        with AirflowServices(root / "services", env) as af:
            for dag_id in dags:
                af.wait_for_dag(dag_id)
                af.unpause(dag_id)
            for i in range(args.repeats):
                for dag_id in dags:
                    conf = CONFS[dag_id]
                    times.setdefault((dag_id, "dags test"), []).append(
                        dags_test(dag_id, conf, root / f"test-{dag_id}-{i}"))
                    times.setdefault((dag_id, "scheduler"), []).append(
                        scheduled(af, dag_id, conf, root / f"sched-{dag_id}-{i}"))
                    print(f"  repeat {i}: {dag_id} dags test {times[(dag_id, 'dags test')][-1]:.1f} s, "
                          f"scheduler {times[(dag_id, 'scheduler')][-1]:.1f} s", flush=True)
    print(f"\n{'DAG':32} {'airflow dags test (anchor)':>28} {'real scheduler':>28} {'ratio':>7}")
    for dag_id in dags:
        anchor, sched = times[(dag_id, "dags test")], times[(dag_id, "scheduler")]
        ratio = statistics.median(sched) / statistics.median(anchor)
        print(f"{dag_id:32} {_spread(anchor):>28} {_spread(sched):>28} {ratio:7.2f}")


if __name__ == "__main__":
    main()
