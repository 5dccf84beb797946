"""The run directory's layout: `RunDir` names every path of `<home>/runs/<run_key>/`, so no stage
spells one as a string literal (DESIGN §1), and the home the runs live in. Paths only: the run
context (pipelines/context.py), the spec's trigger scope and the tracking (pipelines/tracking/)
read it, and it imports nothing of theirs."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATUS = "status.json"  # a pipeline run's outcome, written by its last step


class RunDir:
    """The layout of `<home>/runs/<run_key>/`."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    @property
    def ctx(self) -> Path:
        return self.root / "ctx.json"

    @property
    def spec_json(self) -> Path:
        return self.root / "spec.json"

    @property
    def spec_yaml(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def grid(self) -> Path:
        return self.root / "grid.json"

    @property
    def status(self) -> Path:
        return self.root / STATUS

    @property
    def cluster(self) -> Path:
        """The run's cluster as `provision` made it: provider name and handle (small JSON)."""
        return self.root / "cluster.json"

    @property
    def fit_model(self) -> Path:
        return self.root / "fit" / "model.json"

    @property
    def predictions(self) -> Path:
        return self.root / "predict" / "predictions.json"

    @property
    def validation(self) -> Path:
        return self.root / "validate" / "validation.json"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def hardware_profile(self) -> Path:
        return self.root / "hardware_profile.json"

    def microbench(self, workers: int) -> Path:
        return self.root / "microbench" / f"w{workers}"

    def comm_files(self) -> list[Path]:
        """The microbenchmarks' comm.json of every world size measured."""
        return sorted((self.root / "microbench").glob("w*/comm.json"))

    def profile(self, name: str) -> Path:
        return self.root / "profile" / name

    def layer_files(self) -> list[Path]:
        """The profiler's layers.json of every workload dir."""
        return sorted((self.root / "profile").glob("*/layers.json"))

    def train(self, key: str) -> Path:
        return self.root / "train" / key

    def recorded(self, step: str) -> Path:
        """A finished step's result: its presence makes the step run once."""
        return self.root / "steps" / f"{step}.json"


def default_home() -> Path:
    """ddlbench home: $DDLBENCH_HOME, else .ddlbench in the repository."""
    return Path(os.environ.get("DDLBENCH_HOME") or REPO / ".ddlbench")
