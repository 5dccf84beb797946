"""`ddlbench_nightly`: the nightly benchmark, every night at 02:00 (UTC; a deployment sets
another cron in DDLBENCH_NIGHTLY_SCHEDULE).

Runs the nightly spec (Params: another spec path, and overrides of any spec
field, e.g. `{"repeats": 1, "regression.min_effect": 0.2}`; `{"train.inject_delay_ms": 20}`
injects a known slowdown to test the regression alarm) through the
pipeline's stages: provision, microbench, profile, fit, predict, the training grid
(one mapped task per config and repeat, named by its key), validate, report,
then teardown and finish, which always run. The report publishes the
`ddlbench_nightly_report` Asset; its event's extra holds the run key, run
directory and MLflow parent run id. Compare the results in the MLflow UI
(experiment `ddlbench-nightly`).
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import Asset, Param, dag

from dags._common import DAG_ARGS, SPECS, benchmark, nodes_per_job

NIGHTLY_SPEC = SPECS / "nightly-cpu.yaml"
# When it runs: cron, in UTC; "none" runs it only when triggered (a deployment that must
# not start the latest missed night on unpausing, as Airflow does without catch-up).
NIGHTLY_SCHEDULE = os.environ.get("DDLBENCH_NIGHTLY_SCHEDULE", "0 2 * * *")
NIGHTLY_REPORT = Asset(name="ddlbench_nightly_report", uri="ddlbench://reports/nightly")


def spec_of(params: dict[str, Any]) -> tuple[str, dict | None]:
    """The spec and its overrides, as the Params give them."""
    return params["spec_path"], params["overrides"] or None


@dag(
    dag_id="ddlbench_nightly",
    schedule=None if NIGHTLY_SCHEDULE.lower() == "none" else NIGHTLY_SCHEDULE,
    tags=["ddlbench", "benchmark"],
    doc_md=__doc__,
    **DAG_ARGS,
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
    benchmark(spec_of, NIGHTLY_REPORT, suite="nightly", train_slots=nodes_per_job(NIGHTLY_SPEC))


ddlbench_nightly()
