"""What the ddlbench DAGs share: task defaults, the pool, and one task per stage of `STAGES`.

Thin on purpose: only `airflow.sdk`, the stage table (pipelines/stages/__init__.py) and yaml are
imported at parse time. Each task imports `pipelines.steps` when it runs, so parsing never pulls
in torch or mlflow. Every task passes the small JSON ctx of the first stage and returns small JSON.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Asset, XComArg, get_current_context, task
from airflow.sdk.exceptions import AirflowTaskTerminated

from pipelines.stages import STAGES, Stage

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
    try:
        value = default if raw is None else float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {raw!r}") from None
    if value >= 0:
        return value
    raise ValueError(f"{name}: must not be negative, got {raw!r}")


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
# What every ddlbench DAG is: no catch-up, one run at a time (a benchmark owns its cluster).
DAG_ARGS: dict[str, Any] = {
    "start_date": START_DATE,
    "catchup": False,
    "max_active_runs": 1,
    "default_args": DEFAULT_ARGS,
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
    """Stable across retries of this DAG run (the first stage makes it directory-safe)."""
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


def _results(stage: Stage, results: tuple[Any, ...]) -> list[Any]:
    """The XCom values of a stage's needs as plain values (a mapped task's are a lazy sequence)."""
    mapped = {s.name for s in STAGES if s.mapped}
    return [list(r) if need in mapped else r for need, r in zip(stage.needs, results, strict=True)]


def _publish(ctx: dict, result: dict) -> None:
    """What downstream DAGs scheduled on the report Asset find the run by."""
    context = _context()
    for outlet in context["task"].outlets:
        context["outlet_events"][outlet].extra = {
            "run_key": ctx["run_key"], "run_dir": ctx["run_dir"],
            "parent_run_id": ctx["parent_run_id"], "report_md": result.get("report_md"),
            "regressions": len(result.get("regressions") or []),
        }


def _run_failed() -> bool:
    """Whether any task of this DAG run has failed so far."""
    ti = _context()["ti"]
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    return any(s in ("failed", "upstream_failed") for s in states.values())


def _task(stage: Stage, report_asset: Asset, train_slots: int) -> Any:
    """The Airflow task of a stage after the first: what only Airflow decides (pool, timeout,
    retries, outlets) comes from the stage's kind."""
    if stage.mapped:
        def body(ctx: dict, entry: dict) -> Any:
            """One entry of its need (a training config and repeat, or a suspect to rerun)."""
            from infra import warm
            from pipelines import steps

            _context()["config_key"] = entry["key"]
            warm.keep()  # the run's later jobs in this process fork warm (`airflow dags test`)
            with sigterm_stops_training():
                return steps.call(stage.name, ctx, entry)

        return task(body, task_id=stage.name, pool=TRAIN_POOL, pool_slots=train_slots,
                    execution_timeout=TRAIN_TIMEOUT, map_index_template="{{ config_key }}")

    def run(ctx: dict, *results: Any) -> Any:
        from infra import warm
        from pipelines import steps

        # One pool of warm agents for the tasks a process runs (`airflow dags test` runs them
        # all; the scheduler each in its own), stopped before the run's teardown and finish.
        if stage.always:
            warm.release()
        else:
            warm.keep()
        outcome = {"failed": _run_failed()} if stage.takes_outcome else {}
        result = steps.call(stage.name, ctx, *_results(stage, results), **outcome)
        if stage.publishes:
            _publish(ctx, result)
        return result

    options: dict[str, Any] = {"task_id": stage.name}
    if stage.takes_outcome:
        options["retries"] = 0  # it reports the run's outcome once
    if stage.publishes:
        options["outlets"] = [report_asset]
    return task(run, **options)


def _gathered(stage: Stage) -> Any:
    """The results of a mapped stage that may map over nothing. Airflow skips a mapped task over an
    empty list, and every task after a skipped one; this task runs unless one of them failed, and
    takes no ctx, since a task that follows the setup task directly must run on ALL_SUCCESS."""

    def gather(results: Any) -> list:
        return list(results or [])

    return task(gather, task_id=f"{stage.name}_results", trigger_rule="none_failed")


def first_task(spec_of: Callable[[dict[str, Any]], tuple[str, dict | None]]) -> Any:
    """The first stage's task: validate the spec and open the parent MLflow run. `spec_of(params)`
    is the DAG's choice of (spec path, overrides) from its Params."""

    def run(params: dict | None = None) -> dict:
        from pipelines import steps

        assert params is not None
        spec_path, overrides = spec_of(params)
        return steps.call(STAGES[0].name, spec_path, run_key=run_key(), home=params["home"],
                          overrides=overrides, airflow=airflow_info())

    return task(run, task_id=STAGES[0].name, retries=0)


def benchmark(spec_of: Callable[[dict[str, Any]], tuple[str, dict | None]], report_asset: Asset,
              *, suite: str, train_slots: int = 1) -> None:
    """Wire the pipeline: one task per stage of `STAGES` that runs in `suite`, in its order.

    Serial on purpose: nothing else runs on the cluster while it is measured. Each task follows
    the one before it; a suite's own stage follows the one before it and joins the stage it names.
    The mapped stage runs once per grid entry in the pool (a job takes `train_slots` slots); the
    `always` stages are teardown tasks, so they run after failures too.
    """
    ctx = first_task(spec_of)()
    done: dict[str, XComArg] = {}
    previous = ctx
    side: list[tuple[Stage, XComArg]] = []
    for stage in STAGES[1:]:
        if not stage.runs_in(suite):
            continue
        make = _task(stage, report_asset, train_slots)
        needs = [done[n] for n in stage.needs]
        if stage.mapped:
            out = make.partial(ctx=ctx).expand(entry=needs[0])
            if stage.may_be_empty:  # gathered, so that an empty map does not skip the stages after it
                previous >> out
                previous = out
                out = _gathered(stage)(out)
        else:
            out = make(ctx, *needs)
        if stage.always:  # a teardown of the first task, and of the setups it releases
            made = [done[s.name] for s in STAGES if s.setup and s.name in done] if stage.releases else []
            out.as_teardown(setups=[x.operator for x in (ctx, *made)])
        previous >> out
        if stage.suite is None:
            previous = out
        else:
            side.append((stage, out))
        done[stage.name] = out
    for stage, out in side:
        out >> done[stage.joins]
