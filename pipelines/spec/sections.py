"""The sections of the benchmark spec (pipelines/spec/__init__.py's BenchSpec): provider,
workloads, algorithms, network, microbench, profile, what-ifs, memory; the regression alarm's
and tracking's are in pipelines/spec/alarm.py.

The profile and microbench sections are modelling's own settings
(modelling.measure.configs) with an `enabled` flag; link rates read through
infra.units.parse_rate.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

from infra import ProviderError, bounds, get_provider, validate_provider_options
from infra.units import parse_rate
from modelling.measure.configs import MicrobenchSettings, ProfileSettings
from training.config import Algorithm, Comm, InputShape, check_input_shape, default_comm
from training.gpt_shape import GPT_OPTIONS

if TYPE_CHECKING:
    from infra import Provider

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
    "target_loss",
    *GPT_OPTIONS,
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

    def build(self, threads: int | None = None) -> Provider:
        """The provider of this section, not yet provisioned (building one provisions nothing; it
        is a context manager that releases what it holds). `threads`: a job's threads per rank,
        the provider's `threads_per_process` unless the section sets it."""
        options = dict(self.options)
        if threads is not None:
            options.setdefault("threads_per_process", threads)
        return get_provider(self.name, **options)

    @model_validator(mode="after")
    def _typed_options(self) -> ProviderSpec:
        """The provider and its options are checked when the spec loads, by the provider's own
        options model (infra), not minutes later when the cluster is provisioned."""
        try:
            validate_provider_options(self.name, self.options)
        except ProviderError as err:
            raise ValueError(str(err).removeprefix("provider.").removeprefix("provider: ")) from None
        return self


# A GPT option in workload names: the letters of the transformer literature.
_OPTION_CODES = {"n_layer": "L", "d_model": "d", "n_head": "h", "seq_len": "T", "vocab_size": "V"}


class Workload(Section):
    model: str = Field(description="Model name (training.models).")
    dataset: str = Field(description="Dataset name (training.datasets).")
    input_shape: InputShape | None = Field(None, description="C,H,W; default: the model's.")
    num_classes: int | None = Field(None, ge=2, le=bounds.NUM_CLASSES.limit, description="Classes; default: the "
                                    "dataset's.")
    data_root: Path | None = Field(None, description="Local root of the dataset files.")
    n_layer: int | None = Field(
        None, ge=1, le=1024, description="GPT: transformer blocks (default: the preset's); mlp: hidden layers (3).")
    d_model: int | None = Field(
        None, ge=1, le=65536, description="GPT: model width (default: the preset's); mlp: hidden width (1024).")
    n_head: int | None = Field(None, ge=1, le=1024, description="GPT: attention heads (default: the preset's).")
    seq_len: int | None = Field(
        None, ge=1, le=bounds.INPUT_DIM.limit, description="GPT: tokens per sequence (default: the preset's context).")
    vocab_size: int | None = Field(None, ge=2, le=1 << 20, description="GPT: vocabulary (default: the corpus's).")
    target_accuracy: float | None = Field(
        None, gt=0, le=1, description="Accuracy for time-to-accuracy of this workload (default: the spec's).")
    target_loss: float | None = Field(None, gt=0, description="Evaluation loss for time-to-loss (lower is better).")

    _shape = field_validator("input_shape")(check_input_shape)

    @model_validator(mode="after")
    def _sequence_shape(self) -> Workload:
        """A GPT's seq_len is also its input shape (1, 1, seq_len): what the profile is fed."""
        if self.seq_len is not None and self.input_shape is None:
            object.__setattr__(self, "input_shape", (1, 1, self.seq_len))
        return self

    @property
    def name(self) -> str:
        """The model and the options given, briefly: `gpt-mini-L2-T32` (n_layer 2, seq_len 32)."""
        return self.model + "".join(f"-{code}{getattr(self, k)}" for k, code in _OPTION_CODES.items()
                                    if getattr(self, k) is not None)

    @property
    def label(self) -> str:
        return f"{self.name}-{self.dataset}"

    @property
    def model_options(self) -> dict[str, int]:
        """A GPT's options besides seq_len (which is its input shape), or the mlp's, as the profile
        takes them."""
        return {k: getattr(self, k) for k in GPT_OPTIONS if k != "seq_len" and getattr(self, k) is not None}

    def grid_values(self) -> dict[str, Any]:
        """What this workload sets in each of its training configs."""
        keys = ("input_shape", "num_classes", "data_root", "target_loss", *GPT_OPTIONS)
        values = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if "target_accuracy" in self.model_fields_set:
            values["target_accuracy"] = self.target_accuracy
        return values


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
        None, ge=0, le=10, description="Computation before each timed operation; default the profiled models' median "
        "compute iteration (communication costs more after a longer stretch of computation)."
    )
    max_size_factor: float = Field(
        4.0, ge=1, le=bounds.SIZE_FACTOR.limit,
        description="Without `sizes`: sizes from 4 KiB up to this many times the largest model's "
        "parameter bytes, every factor of 4."
    )
    budget_s: float = Field(
        120.0, gt=0, le=bounds.BUDGET_S.limit,
        description="Without `sizes`: the largest sizes are dropped until the rounds' estimated "
        "wire time (at the spec's link rate, else 1 GB/s) fits this budget."
    )


class ProfileSpec(ProfileSettings):
    """The pipeline's layer profiles: modelling's settings, and whether to run them."""

    enabled: bool = True
    pooled: int = Field(
        3, ge=1, le=20, description="Profile rounds of each workload, pooled (each time the median over "
        "them, modelling.measure.layers.pool_layers) and one interval input each."
    )


class WhatIfSpec(Section):
    workers: list[Annotated[int, Field(le=bounds.PREDICTED_WORKERS.limit)]] = Field(
        default_factory=list, max_length=bounds.WHAT_IF_ENTRIES.limit, description="Extra world sizes to predict.")
    link_bandwidths: list[str] = Field(
        default_factory=list, max_length=bounds.WHAT_IF_ENTRIES.limit, description="Extra link rates to predict.")

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


class MemorySpec(Section):
    device: ByteSize | None = Field(
        None, le=bounds.DEVICE_MEMORY_BYTES.limit,
        description="The memory of one device (24gb, 16GiB): a GPU's, or on CPU one node's, shared by the ranks "
        "placed on it. A configuration predicted not to fit is refused before anything runs, and a what-if "
        "that does not fit is predicted as such. Default: this host's when the provider is local (a GPU's "
        "total memory, the node's available memory on CPU); none, and no refusal, otherwise.")

    @field_validator("device")
    @classmethod
    def _positive(cls, v: ByteSize | None) -> ByteSize | None:
        if v is not None and v <= 0:
            raise ValueError(f"must be more than 0 bytes, got {v}")
        return v
