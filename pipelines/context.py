"""The run context and the run directory: one definition of what a pipeline run is and where
its files live (DESIGN §1).

`RunContext` is what `start` writes to `<run_dir>/ctx.json` and what Airflow passes between
tasks as small JSON (`RunContext.model_validate(ctx)` in, `.model_dump(mode="json")` out).
`RunDir` (pipelines/rundir.py) names every path of the run directory.
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from pipelines.rundir import RunDir
from pipelines.spec import BenchSpec
from pipelines.tracking import Tracker
from pipelines.tracking.uri import resolve_uri


class RunContext(BaseModel):
    """What identifies a pipeline run and where it keeps its files and results."""

    model_config = ConfigDict(extra="forbid")

    run_key: str = Field(description="Directory-safe name of the run, stable across retries.")
    run_dir: Path = Field(description="The run directory, `<home>/runs/<run_key>`: the local source of truth.")
    home: Path = Field(description="ddlbench home: run directories, default MLflow store and artifacts.")
    tracking_uri: str = Field(description="MLflow tracking URI, its password masked.")
    experiment: str = Field(description="MLflow experiment (one per suite).")
    parent_run_id: str | None = Field(None, description="MLflow id of the parent run, once uploaded.")
    spec_path: str = Field(description="The spec file the run started from.")
    spec_hash: str = Field(description="Hash of the resolved spec: a run key runs one spec only.")
    hardware: str = Field(description="Hardware label of the spec.")
    suite: str = Field(description="nightly, onboarding or adhoc.")
    git_commit: str | None = Field(None, description="ddlbench's git commit, when known.")
    airflow: dict[str, str] = Field(default_factory=dict, description="Airflow dag_id and run_id, when under Airflow.")

    @property
    def paths(self) -> RunDir:
        return RunDir(self.run_dir)

    def as_dict(self) -> dict[str, Any]:
        """The small JSON of ctx.json and XCom."""
        return self.model_dump(mode="json")

    def spec(self) -> BenchSpec:
        """The run's resolved spec, as `start` validated it."""
        return self.resolved_spec

    @cached_property
    def resolved_spec(self) -> BenchSpec:
        """Read once per context: the stages of one process share their context, and so the spec."""
        return BenchSpec.model_validate(json.loads(self.paths.spec_json.read_text()))

    @cached_property
    def tracker(self) -> Tracker:
        """The run's MLflow tracker, one per context (stages run in a row share its state)."""
        return Tracker(self.run_dir, resolve_uri(self.tracking_uri), self.experiment, self.run_key,
                       artifact_root=self.home / "mlartifacts", made=True)


def as_context(ctx: dict[str, Any] | RunContext) -> RunContext:
    """The typed context of a ctx dict (XCom, ctx.json) at a public step's boundary."""
    return ctx if isinstance(ctx, RunContext) else RunContext.model_validate(ctx)


def load_context(run_dir: Path | str) -> RunContext:
    return RunContext.model_validate_json(RunDir(run_dir).ctx.read_text())


def default_tracking_uri(home: Path) -> str:
    """$MLFLOW_TRACKING_URI, else the SQLite store in the home."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"
