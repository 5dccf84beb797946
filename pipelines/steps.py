"""The pipeline's steps as Airflow tasks and tests call them: small JSON dicts in and out.

A thin boundary over `pipelines.stages`: each step turns the ctx dict (XCom, ctx.json) into
a `RunContext` and calls its stage; `start` returns the ctx as a dict again. Training runs
its job through `_launch`, looked up here at call time, so a test can replace it.
"""

from __future__ import annotations

from pipelines import stages
from pipelines.context import as_context, default_home, default_tracking_uri
from pipelines.stages import STAGES, sync
from pipelines.stages.train import launch_job as _launch

__all__ = [
    "STAGES",
    "default_home",
    "default_tracking_uri",
    "finish",
    "fit",
    "microbench",
    "predict",
    "profile",
    "provision",
    "record_hardware_profile",
    "report",
    "start",
    "sync",
    "teardown",
    "train",
    "train_configs",
    "validate",
]


def start(
    spec_path: str,
    *,
    run_key: str | None = None,
    home: str | None = None,
    overrides: dict | None = None,
    airflow: dict | None = None,
) -> dict:
    """Validate the spec (+ overrides), make the run dir, open or find the parent MLflow run."""
    return stages.start(spec_path, run_key=run_key, home=home, overrides=overrides, airflow=airflow).as_dict()


def provision(ctx: dict) -> dict:
    return stages.provision(as_context(ctx))


def microbench(ctx: dict) -> dict:
    return stages.microbench(as_context(ctx))


def profile(ctx: dict) -> dict:
    return stages.profile(as_context(ctx))


def fit(ctx: dict) -> dict:
    return stages.fit(as_context(ctx))


def predict(ctx: dict) -> dict:
    return stages.predict(as_context(ctx))


def train_configs(ctx: dict) -> list[dict]:
    return stages.train_configs(as_context(ctx))


def train(ctx: dict, entry: dict) -> dict:
    return stages.train(as_context(ctx), entry, launch=_launch)


def validate(ctx: dict, trained: list[dict]) -> dict:
    return stages.validate(as_context(ctx), trained)


def report(ctx: dict, trained: list[dict], validation: dict) -> dict:
    return stages.report(as_context(ctx), trained, validation)


def record_hardware_profile(ctx: dict) -> dict:
    return stages.record_hardware_profile(as_context(ctx))


def teardown(ctx: dict) -> dict:
    return stages.teardown(as_context(ctx))


def finish(ctx: dict, failed: bool = False) -> dict:
    return stages.finish(as_context(ctx), failed=failed)

