"""The settings of the profiler and the microbenchmarks: one pydantic model each.

The same definitions feed validation, the options of `ddlbench profile` and
`ddlbench microbench`, and the spec's `profile` and `microbench` sections (which
extend the *Settings part with an `enabled` flag).
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from infra import bounds
from training.config import Device, InputShape, format_validation_error


class Config(BaseModel):
    """A frozen config that refuses unknown fields; `of` gives errors naming the field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def of(cls, source: str, **values: Any) -> Self:
        """Validated values, or ValueError: `source.field: problem (got value)` per problem."""
        try:
            return cls(**values)
        except ValidationError as err:
            raise ValueError(format_validation_error(err, source)) from None


class ProfileSettings(Config):
    """How the layer profile measures."""

    warmup: int = Field(3, ge=0, le=bounds.REPEATS.limit, description="Iterations run before timing starts.")
    repeats: int = Field(
        10, ge=1, le=bounds.REPEATS.limit, description="Timed iterations; every figure is their median.")
    timeout_s: float = Field(
        600.0, gt=0, le=bounds.OP_TIMEOUT_S.limit, description="Kill one profiling job after this long.")


class ProfileConfig(ProfileSettings):
    """One layer profile: what to profile, and how (`modelling.measure.profiler.profile_layers`)."""

    model: str = Field(description="Model name (as for `ddlbench train`).")
    batch_size: int = Field(ge=1, le=bounds.BATCH_SIZE.limit, description="Per-process batch size.")
    device: Device = Field(Device.cpu, description="cpu or cuda.")
    processes: int = Field(
        1, ge=1, le=bounds.WORKERS.limit,
        description="Concurrent profiling processes: the training run's process count on this host."
    )
    dataset: str = Field("synthetic", description="Where input batches come from.")
    input_shape: InputShape | None = Field(None, description="C,H,W; default: the model's natural shape.")
    num_classes: int = Field(10, ge=2, le=bounds.NUM_CLASSES.limit, description="Classes of the synthetic dataset.")
    model_options: dict[str, int] = Field(
        default_factory=dict, description="A GPT's n_layer, d_model, n_head, vocab_size (default: the preset's).")


# 4 KiB .. 16 MiB, every factor of 4: a few seconds on a laptop.
DEFAULT_SIZES = [4096 * 4**i for i in range(7)]


class MicrobenchSettings(Config):
    """How the communication microbenchmarks measure."""

    sizes: list[int] | None = Field(
        None, max_length=bounds.MESSAGE_SIZES.limit,
        description="Message sizes in bytes (comma separated on the command line); default 4 KiB .. 16 MiB."
    )
    repeats: int = Field(5, ge=1, le=bounds.REPEATS.limit, description="Timed operations per primitive and size.")
    timeout_s: float = Field(600.0, gt=0, le=bounds.OP_TIMEOUT_S.limit, description="Kill the job after this many s.")

    @field_validator("sizes", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                return [int(s) for s in v.split(",") if s.strip()]
            except ValueError:
                raise ValueError(f"expected a comma list of byte counts such as 4096,65536, got {v!r}") from None
        return v

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError(f"every size must be a positive byte count, got {v}")
        if v is not None and max(v) > bounds.MESSAGE_BYTES.limit:
            raise ValueError(f"{max(v):,} bytes is above the bound of {bounds.MESSAGE_BYTES.limit:,} "
                             f"({bounds.MESSAGE_BYTES.reason})")
        return v


class MicrobenchConfig(MicrobenchSettings):
    """One microbenchmark job (`modelling.measure.microbench.run_microbench`)."""

    workers: int = Field(ge=1, le=bounds.WORKERS.limit, description="Worker ranks N.")
    servers: int = Field(
        0, ge=0, le=bounds.SERVERS.limit, validate_default=True,
        description="Parameter-server shards S (push/pull is measured when S >= 1)."
    )
    link_bytes_per_s: float | None = Field(
        None, gt=0, description="The link's known rate, recorded so `fit` can flag impossible fits."
    )
    gap_s: float = Field(
        0.002, ge=0, le=10, description="Computation before each timed operation, as a training step's."
    )
    device: Device = Field(
        Device.cpu, description="cpu, or cuda: the allreduce on GPU tensors (NCCL), each worker on its GPU."
    )

    @field_validator("sizes")
    @classmethod
    def _measurable(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) < 2 or min(v) < 4):
            raise ValueError(f"need two or more message sizes of at least 4 bytes, got {sorted(v)}")
        return v

    @field_validator("servers")
    @classmethod
    def _ranks(cls, v: int, info: ValidationInfo) -> int:
        workers = info.data.get("workers")
        if workers is not None and workers + v < 2:
            raise ValueError(f"a microbenchmark needs at least 2 ranks (workers + servers), got {workers} + {v}")
        return v

    @property
    def measured_sizes(self) -> list[int]:
        return sorted(self.sizes or DEFAULT_SIZES)
