"""`ddlbench_nightly`: the nightly benchmark, every night at 02:00 (UTC; a deployment sets
another cron in DDLBENCH_NIGHTLY_SCHEDULE).

Runs the nightly spec (Params: another spec path, and overrides of any spec
field, e.g. `{"repeats": 1, "regression.min_effect": 0.2}`; `{"train.inject_delay_ms": 20}`
injects a known slowdown to test the regression alarm) through the
pipeline steps: provision, microbench, profile, fit, predict, the training grid
(one mapped task per config and repeat, named by its key), validate, report,
then teardown and finish, which always run. The report publishes the
`ddlbench_nightly_report` Asset; its event's extra holds the run key, run
directory and MLflow parent run id. Compare the results in the MLflow UI
(experiment `ddlbench-nightly`).
"""

from __future__ import annotations

import os

from airflow.sdk import Asset, Param, dag, task

from dags._common import DEFAULT_ARGS, SPECS, START_DATE, airflow_info, benchmark, nodes_per_job, run_key

NIGHTLY_SPEC = SPECS / "nightly-cpu.yaml"
# When it runs: cron, in UTC; "none" runs it only when triggered (a deployment that must
# not start the latest missed night on unpausing, as Airflow does without catch-up).
NIGHTLY_SCHEDULE = os.environ.get("DDLBENCH_NIGHTLY_SCHEDULE", "0 2 * * *")
NIGHTLY_REPORT = Asset(name="ddlbench_nightly_report", uri="ddlbench://reports/nightly")


@task(task_id="start", retries=0)
def start(params: dict | None = None) -> dict:
    """Validate the spec with its overrides and open the parent MLflow run."""
    from pipelines import steps

    assert params is not None
    return steps.start(params["spec_path"], run_key=run_key(), home=params["home"],
                       overrides=params["overrides"] or None, airflow=airflow_info())


@dag(
    dag_id="ddlbench_nightly",
    schedule=None if NIGHTLY_SCHEDULE.lower() == "none" else NIGHTLY_SCHEDULE,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["ddlbench", "benchmark"],
    doc_md=__doc__,
    params={
        "spec_path": Param(str(NIGHTLY_SPEC), type="string", minLength=1,
                           title="Benchmark spec",
                           description="Path of the benchmark spec (YAML)."),
        "overrides": Param({}, type="object", title="Spec overrides",
                           description='Spec fields to override, dotted keys reach into sections, '
                                       'e.g. {"repeats": 1, "regression.min_effect": 0.2}.'),
        "home": Param(None, type=["null", "string"], title="ddlbench home",
                      description="Run directories and the default MLflow store; "
                                  "default: $DDLBENCH_HOME or <repo>/.ddlbench."),
    },
)
def ddlbench_nightly() -> None:
    benchmark(start(), NIGHTLY_REPORT, train_slots=nodes_per_job(NIGHTLY_SPEC))


ddlbench_nightly()
