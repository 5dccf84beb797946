"""What the ddlbench DAGs share: task defaults, the pool, and the pipeline's task wiring.

Thin on purpose: only `airflow.sdk` (and yaml) is imported at parse time. Each task imports
`pipelines.steps` when it runs, so parsing never pulls in torch or mlflow.
Every task passes the small JSON ctx of `steps.start` and returns a small dict.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Asset, XComArg, get_current_context, task
from airflow.sdk.exceptions import AirflowTaskTerminated

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
START_DATE = pendulum.datetime(2026, 1, 1, tz="UTC")

# Accelerator slots: one slot per node a training job takes. Created from
# infra/deploy/airflow/pools.json (`airflow pools import`), or by the tests.
TRAIN_POOL = "ddlbench_nodes"


def _deployment_setting(name: str, default: float) -> float:
    """A number a deployment sets in the DAG processor's environment (parse time, so Airflow
    knows it before any task runs): a cluster's slow jobs, or a test's quick kill."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"{name}: must not be negative, got {raw!r}")
    return value


# A training task's execution_timeout, and the retries of every task but start and finish.
TRAIN_TIMEOUT = timedelta(seconds=_deployment_setting("DDLBENCH_TRAIN_TIMEOUT_S", 2 * 3600))
STEP_TIMEOUT = timedelta(hours=1)
RETRIES = int(_deployment_setting("DDLBENCH_TASK_RETRIES", 2))

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "ddlbench",
    "retries": RETRIES,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    "execution_timeout": STEP_TIMEOUT,
}

def nodes_per_job(spec_path: Path) -> int:
    """Nodes one training job of a spec takes: its provider's `nodes` option, else 1.

    Pool slots are fixed when the DAG is parsed, so this reads the DAG's default spec
    (plain YAML, no validation: that happens in `start`). A run whose Params choose
    other nodes still takes this many slots.
    """
    import yaml

    provider = (yaml.safe_load(spec_path.read_text()) or {}).get("provider") or {}
    return int((provider.get("options") or {}).get("nodes", 1))


def _context() -> dict[str, Any]:
    return get_current_context()  # type: ignore[return-value]


def airflow_info() -> dict[str, Any]:
    """Who is running: tags that let a retried task find and resume its own MLflow runs."""
    ctx = _context()
    ti = ctx["ti"]
    return {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id,
            "try_number": ti.try_number}


def run_key() -> str:
    """Stable across retries of this DAG run (steps.start makes it directory-safe)."""
    ti = _context()["ti"]
    return f"{ti.dag_id}-{ti.run_id}"


@contextmanager
def sigterm_stops_training() -> Iterator[None]:
    """Turn Airflow's SIGTERM (task killed from the UI or by the supervisor) into an exception.

    The launcher's `finally` then kills the torchrun process group it started with
    start_new_session=True, and the MLflow run's `with` block closes it as FAILED;
    without this, the default handler only calls on_kill() and the ranks outlive
    the task. Airflow's execution_timeout already raises AirflowTaskTimeout the same
    way (SIGALRM), so both kinds of kill take one path.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _stop(signum: int, frame: object) -> None:
        raise AirflowTaskTerminated(f"received signal {signal.Signals(signum).name}; "
                                    "stopping the training job")

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@task(task_id="provision")
def provision(ctx: dict) -> dict:
    from pipelines import steps

    return steps.provision(ctx)


@task(task_id="microbench")
def microbench(ctx: dict) -> dict:
    from pipelines import steps

    return steps.microbench(ctx)


@task(task_id="profile")
def profile(ctx: dict) -> dict:
    from pipelines import steps

    return steps.profile(ctx)


@task(task_id="train_configs")
def train_configs(ctx: dict) -> list[dict]:
    from pipelines import steps

    return steps.train_configs(ctx)


@task(task_id="train", pool=TRAIN_POOL, execution_timeout=TRAIN_TIMEOUT,
      map_index_template="{{ config_key }}")
def train(ctx: dict, entry: dict) -> dict:
    """One training config and repeat, in fresh torchrun processes."""
    _context()["config_key"] = entry["key"]
    from pipelines import steps

    with sigterm_stops_training():
        return steps.train(ctx, entry)


@task(task_id="fit")
def fit(ctx: dict) -> dict:
    from pipelines import steps

    return steps.fit(ctx)


@task(task_id="predict")
def predict(ctx: dict) -> dict:
    from pipelines import steps

    return steps.predict(ctx)


@task(task_id="validate")
def validate(ctx: dict, trained: list[dict]) -> dict:
    from pipelines import steps

    return steps.validate(ctx, list(trained))


@task(task_id="report")
def report(ctx: dict, trained: list[dict], validation: dict) -> dict:
    from pipelines import steps

    result = steps.report(ctx, list(trained), validation)
    # Downstream DAGs scheduled on the report Asset find the run through these.
    context = _context()
    for outlet in context["task"].outlets:
        context["outlet_events"][outlet].extra = {
            "run_key": ctx["run_key"], "run_dir": ctx["run_dir"],
            "parent_run_id": ctx["parent_run_id"], "report_md": result.get("report_md"),
            "regressions": len(result.get("regressions") or []),
        }
    return result


@task(task_id="teardown")
def teardown(ctx: dict) -> dict:
    from pipelines import steps

    return steps.teardown(ctx)


@task(task_id="finish", retries=0)
def finish(ctx: dict) -> dict:
    """Close the parent MLflow run with the DAG run's outcome so far."""
    from pipelines import steps

    c = _context()
    ti = c["ti"]
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    failed = any(s in ("failed", "upstream_failed") for s in states.values())
    return steps.finish(ctx, failed=failed)


def benchmark(ctx: XComArg, report_asset: Asset, train_slots: int = 1) -> dict[str, XComArg]:
    """Wire the pipeline after `start`: the same shape for every ddlbench DAG.

    Serial on purpose: nothing else runs on the cluster while it is measured.
    provision -> microbench -> profile -> fit -> predict (before any training, so
    predictions never see the measurements) -> train grid (mapped, pooled: a job
    takes `train_slots` pool slots) -> validate -> report (publishes `report_asset`);
    teardown and finish always run. Returns the fit and report tasks' outputs, for
    DAGs that add steps between them.
    """
    provisioned = provision(ctx)
    entries = train_configs(ctx)
    trained = train.override(pool_slots=train_slots).partial(ctx=ctx).expand(entry=entries)
    validation = validate(ctx, trained)
    reported = report.override(outlets=[report_asset])(ctx, trained, validation)
    released = teardown(ctx)
    finished = finish(ctx)

    fitted = fit(ctx)
    provisioned >> microbench(ctx) >> profile(ctx) >> fitted >> predict(ctx) >> entries
    reported >> released >> finished
    released.as_teardown(setups=[ctx.operator, provisioned.operator])
    finished.as_teardown(setups=ctx.operator)
    return {"fit": fitted, "report": reported}
