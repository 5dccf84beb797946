"""The sections of the benchmark spec (pipelines/spec.py's BenchSpec): provider,
workloads, algorithms, network, microbench, profile, what-ifs, regression, tracking.

The profile and microbench sections are modelling's own settings
(modelling.configs) with an `enabled` flag; link rates read through
modelling.units.parse_rate.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from modelling.configs import MicrobenchSettings, ProfileSettings
from modelling.units import parse_rate
from training.config import Algorithm, Comm, default_comm

# Options that the grid itself sets; a spec gives them through its own fields.
GRID_FIELDS = {
    "model",
    "dataset",
    "algorithm",
    "comm",
    "workers",
    "servers",
    "batch_size",
    "steps",
    "epochs",
    "target_accuracy",
    "link_bandwidth",
    "input_shape",
    "num_classes",
    "data_root",
    "seed",
}


class Suite(StrEnum):
    nightly = "nightly"
    onboarding = "onboarding"
    adhoc = "adhoc"


class Section(BaseModel):
    """A spec section: frozen, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderSpec(Section):
    name: str = Field("local", description="Cluster provider: local, netns, slurm or kubernetes.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the provider.")

    @model_validator(mode="after")
    def _typed_options(self) -> ProviderSpec:
        """The provider and its options are checked when the spec loads, by the provider's own
        options model (infra), not minutes later when the cluster is provisioned."""
        from infra import ProviderError, validate_provider_options

        try:
            validate_provider_options(self.name, self.options)
        except ProviderError as err:
            raise ValueError(str(err).removeprefix("provider.").removeprefix("provider: ")) from None
        return self


class Workload(Section):
    model: str = Field(description="Model name (training.models).")
    dataset: str = Field(description="Dataset name (training.datasets).")
    input_shape: tuple[int, int, int] | None = Field(None, description="C,H,W; default: the model's.")
    num_classes: int | None = Field(None, ge=2, description="Classes; default: the dataset's.")
    data_root: Path | None = Field(None, description="Local root of the dataset files.")

    @property
    def label(self) -> str:
        return f"{self.model}-{self.dataset}"


class AlgorithmSpec(Section):
    name: Algorithm = Field(description="ssgd, asgd or odsgd.")
    comm: Comm | None = Field(None, description="allreduce or ps; default: allreduce for ssgd, ps otherwise.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Further TrainConfig options of this algorithm "
        "(overlap, bucket_mb, compensation, warmup_steps, ...).",
    )

    @model_validator(mode="after")
    def _check(self) -> AlgorithmSpec:
        if self.name != Algorithm.ssgd and self.comm == Comm.allreduce:
            raise ValueError(f"comm: {self.name.value} runs on a parameter server; use comm: ps, not allreduce")
        grid = sorted(GRID_FIELDS & set(self.options))
        if grid:
            raise ValueError(f"options: {grid[0]!r} is set by the grid; set it in the spec's own field")
        return self

    @property
    def comm_mode(self) -> Comm:
        return self.comm or default_comm(self.name)

    @property
    def label(self) -> str:
        return f"{self.name.value}-{self.comm_mode.value}"


class NetworkSpec(Section):
    link_bandwidth: str | None = Field(
        None, description="Link rate such as 1gbit or 100mbit (recorded, and a bound for the comm fit)."
    )

    @field_validator("link_bandwidth")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rate(v)
        return v

    @property
    def bytes_per_s(self) -> float | None:
        return parse_rate(self.link_bandwidth) if self.link_bandwidth else None


class MicrobenchSpec(MicrobenchSettings):
    """The pipeline's microbenchmarks: modelling's settings, whether to run them, and the protocol
    that makes the validation figures hold (benchmarks/bench_validation.py runs it)."""

    enabled: bool = True
    pooled: int = Field(
        3, ge=1, le=20, description="Microbenchmark rounds, pooled (each size's median over them) and one "
        "interval input each: one taken in a quiet or busy spell of the host would shift every prediction."
    )
    gap_s: float | None = Field(
        None, ge=0, description="Computation before each timed operation; default the profiled models' median "
        "compute iteration (communication costs more after a longer stretch of computation)."
    )
    max_size_factor: float = Field(
        4.0, ge=1, description="Without `sizes`: sizes from 4 KiB up to this many times the largest model's "
        "parameter bytes, every factor of 4."
    )
    budget_s: float = Field(
        120.0, gt=0, description="Without `sizes`: the largest sizes are dropped until the rounds' estimated "
        "wire time (at the spec's link rate, else 1 GB/s) fits this budget."
    )


class ProfileSpec(ProfileSettings):
    """The pipeline's layer profiles: modelling's settings, and whether to run them."""

    enabled: bool = True
    pooled: int = Field(
        3, ge=1, le=20, description="Profile rounds of each workload, pooled (each time the median over "
        "them, modelling.layers.pool_layers) and one interval input each."
    )


class WhatIfSpec(Section):
    workers: list[int] = Field(default_factory=list, description="Extra world sizes to predict.")
    link_bandwidths: list[str] = Field(default_factory=list, description="Extra link rates to predict.")

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: list[int]) -> list[int]:
        if any(w < 1 for w in v):
            raise ValueError(f"every worker count must be at least 1, got {v}")
        return v

    @field_validator("link_bandwidths")
    @classmethod
    def _rates(cls, v: list[str]) -> list[str]:
        for rate in v:
            parse_rate(rate)
        return v


class RegressionSpec(Section):
    """The regression alarm (pipelines/report_regression.py): this run against its history."""

    history: int = Field(
        10, ge=2, le=100, description="Earlier FINISHED runs of the same spec and hardware compared against."
    )
    min_history: int = Field(
        3, ge=2, le=100, description="Fewer earlier runs than this: no statement, the check says the history is short."
    )
    alpha: float = Field(
        0.01, gt=0, lt=0.5, description="Significance of the one-sided test (A/A false alarms: bench_regression.py)."
    )
    min_effect: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Smallest throughput slowdown (fraction) that is a regression, however significant.",
    )
    prediction_error_rise: float = Field(
        0.10, gt=0, description="Smallest rise of the median absolute prediction error (absolute) that is a regression."
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "throughput_drop" in data:
            raise ValueError(
                "throughput_drop: renamed min_effect (the smallest slowdown that is a regression, now judged "
                "against the history of the spec with a statistical test)"
            )
        return data

    @model_validator(mode="after")
    def _check(self) -> RegressionSpec:
        if self.min_history > self.history:
            raise ValueError(f"min_history: {self.min_history} is above history ({self.history})")
        return self


class TrackingSpec(Section):
    system_metrics: bool = Field(True, description="Sample CPU/memory into the training runs.")
