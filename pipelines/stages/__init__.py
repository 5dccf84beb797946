"""The benchmark pipeline's stages (DESIGN §1, docs/design.md), for Airflow and the CLI alike.

`STAGES` is the one list of them, in their order: `ddlbench run` runs them in it and both DAGs
make one task per stage from it (dags/_common.py), so a stage added here appears in all three.
Each entry names a function of the same name in `pipelines.stages.<module>`; it is imported
only when the stage runs, so the DAG files read this table without loading torch or MLflow.
Each stage writes its outputs to the run directory first and logs the same to MLflow through
the journal; see runner.py for how a stage runs once per run key.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: an Airflow task of the same name and a step of `ddlbench run`."""

    name: str
    module: str  # pipelines.stages.<module> defines the function `name`
    needs: tuple[str, ...] = ()  # earlier stages whose results it takes, after the run context
    mapped: bool = False  # runs once per entry of the result of its one need (the training grid)
    may_be_empty: bool = False  # (mapped) its need may be an empty list
    setup: bool = False  # makes what a `releases` stage gives back (the run's cluster)
    always: bool = False  # runs also after a failure (teardown, finish)
    releases: bool = False  # gives back what the `setup` stages made
    takes_outcome: bool = False  # is told whether the run failed (`failed=`)
    publishes: bool = False  # its result is the run's report, which a DAG publishes as an Asset
    suite: str | None = None  # runs only in runs of this suite, beside the others
    joins: str | None = None  # (a suite's stage) the stage that waits for it

    @property
    def run(self) -> Callable[..., Any]:
        """The stage's function (imports its module)."""
        return getattr(import_module(f"{__name__}.{self.module}"), self.name)

    def runs_in(self, suite: str) -> bool:
        return self.suite is None or self.suite == suite


STAGES: tuple[Stage, ...] = (
    Stage("start", "lifecycle"),
    Stage("provision", "lifecycle", setup=True),
    Stage("microbench", "measure"),
    Stage("profile", "measure"),
    Stage("fit", "model"),
    # Onboarding only: the fitted comm model and layer tables, for other runs to predict from.
    Stage("record_hardware_profile", "publish", suite="onboarding", joins="report"),
    Stage("predict", "model"),  # before any training, so predictions never see the measurements
    Stage("train_configs", "train"),
    Stage("train", "train", needs=("train_configs",), mapped=True),
    Stage("validate", "model", needs=("train",)),
    Stage("suspects", "confirm", needs=("train",)),  # configs whose throughput alarms
    Stage("confirm", "confirm", needs=("suspects",), mapped=True, may_be_empty=True),  # each rerun once, same cluster
    Stage("report", "publish", needs=("train", "validate", "confirm"), publishes=True),
    Stage("teardown", "lifecycle", always=True, releases=True),
    Stage("finish", "lifecycle", always=True, takes_outcome=True),
)


def stage(name: str) -> Stage:
    """The stage of this name, or KeyError listing the stages."""
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no stage {name!r}; the stages are {', '.join(s.name for s in STAGES)}")


# The project's packages, and what their functions import when a stage runs (the modules'
# tops import the rest): what a task process would otherwise import itself.
PROJECT = ("infra", "training", "modelling", "pipelines")
IMPORTED_WHEN_RUN = ("mlflow", "mlflow.store.tracking.sqlalchemy_store", "alembic", "matplotlib.pyplot")


def preload() -> None:
    """Import every module of the project (but a package's `__main__`, which runs its command)
    and what a stage imports when it runs: for a process that forks task processes, the
    Airflow scheduler (infra/deploy/airflow/config/airflow_local_settings.py), so that each
    task starts with them."""
    for root in PROJECT:
        for m in pkgutil.walk_packages(import_module(root).__path__, f"{root}."):
            if not m.name.endswith(".__main__"):
                import_module(m.name)
    for name in IMPORTED_WHEN_RUN:
        import_module(name)


__all__ = ["STAGES", "Stage", "preload", "stage"]
