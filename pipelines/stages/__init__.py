"""The benchmark pipeline's stages (DESIGN §1), for Airflow and the CLI alike.

`STAGES` is their order: the CLI runs them in it and the DAGs wire their tasks in it
(tests/test_dags.py holds the two together). Each stage writes its outputs to
the run directory first and logs the same to MLflow through the journal; see runner.py
for how a stage runs once per run key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.stages.confirm import confirm, suspects
from pipelines.stages.lifecycle import finish, provision, start, sync, teardown
from pipelines.stages.measure import microbench, profile
from pipelines.stages.model import fit, predict, validate
from pipelines.stages.publish import record_hardware_profile, report
from pipelines.stages.train import train, train_configs


@dataclass(frozen=True)
class Stage:
    """One stage of the pipeline: an Airflow task of the same name."""

    name: str
    run: Callable[..., Any]
    needs: tuple[str, ...] = ()  # earlier stages whose results it takes, after the run context
    mapped: bool = False  # runs once per entry of the result of its one need (the training grid)
    always: bool = False  # runs also after a failure (teardown, finish)
    takes_outcome: bool = False  # is told whether the run failed (`failed=`)


STAGES: tuple[Stage, ...] = (
    Stage("start", start),
    Stage("provision", provision),
    Stage("microbench", microbench),
    Stage("profile", profile),
    Stage("fit", fit),
    Stage("predict", predict),  # before any training, so predictions never see the measurements
    Stage("train_configs", train_configs),
    Stage("train", train, needs=("train_configs",), mapped=True),
    Stage("validate", validate, needs=("train",)),
    Stage("suspects", suspects, needs=("train",)),  # configs whose throughput alarms
    Stage("confirm", confirm, needs=("suspects",), mapped=True),  # each rerun once, same cluster
    Stage("report", report, needs=("train", "validate", "confirm")),
    Stage("teardown", teardown, always=True),
    Stage("finish", finish, always=True, takes_outcome=True),
)

__all__ = [
    "STAGES",
    "Stage",
    "confirm",
    "finish",
    "fit",
    "microbench",
    "predict",
    "profile",
    "provision",
    "record_hardware_profile",
    "report",
    "start",
    "suspects",
    "sync",
    "teardown",
    "train",
    "train_configs",
    "validate",
]
