"""One prediction scenario: the settings of one configuration the model predicts.

The one place for the defaults of a prediction: DDP's bucket size and overlap
are TrainConfig's (so training and the model agree), and `default_comm` is the
rule for the communication an algorithm uses when none is given.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from modelling.measure.configs import Config
from training.config import Algorithm, Comm, TrainConfig, default_comm

ALGORITHMS = tuple(a.value for a in Algorithm)
COMM_MODES = tuple(c.value for c in Comm)
_TRAIN = TrainConfig.model_fields


class Scenario(Config):
    """One configuration to predict: algorithm, communication, world and what-ifs.
    `Scenario.of("scenario", **values)` gives errors as `scenario.comm: ...`."""

    algorithm: str = Field(_TRAIN["algorithm"].default.value, description="ssgd, asgd or odsgd.")
    comm: str | None = Field(
        None, validate_default=True, description="allreduce or ps; default: allreduce for ssgd, ps otherwise."
    )
    workers: int = Field(_TRAIN["workers"].default, ge=1, description="World size N.")
    servers: int = Field(1, ge=0, description="Parameter-server shards S (comm ps); 0 for allreduce.")
    overlap: bool = Field(_TRAIN["overlap"].default, description=_TRAIN["overlap"].description)
    bucket_mb: float = Field(
        _TRAIN["bucket_mb"].default, description="DDP bucket size in MB; 0 = per-layer wait-free backpropagation."
    )
    batch_size: int | None = Field(None, ge=1, description="Per-worker batch; default the profiled one.")
    bandwidth_bytes_per_s: float | None = Field(None, gt=0, description="What-if link rate instead of the fit's.")
    comm_on_cpu: bool | None = Field(
        None, description="Transfers hold the CPUs at their ends; default: when the comm model is loopback."
    )
    node_of_rank: tuple[int, ...] | None = Field(
        None,
        description="The node of every rank, workers then shards, as the provider places them "
        "(infra/placement.py); default: one host.",
    )
    # The optimizers' momenta decide whether they hold a momentum buffer (modelling/memory.py).
    momentum: float = Field(_TRAIN["momentum"].default, ge=0, description=_TRAIN["momentum"].description)
    momentum_local: float | None = Field(None, ge=0, description=_TRAIN["momentum_local"].description)
    momentum_async: float | None = Field(None, ge=0, description=_TRAIN["momentum_async"].description)

    @field_validator("algorithm")
    @classmethod
    def _algorithm(cls, v: str) -> str:
        if v not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {v!r}; use one of {', '.join(ALGORITHMS)}")
        return v

    @field_validator("comm")
    @classmethod
    def _comm(cls, v: str | None, info: ValidationInfo) -> str:
        algorithm = info.data.get("algorithm")
        if v is None:
            return default_comm(algorithm).value
        if v not in COMM_MODES:
            raise ValueError(f"unknown communication {v!r}; use allreduce or ps")
        if algorithm not in (None, Algorithm.ssgd.value) and v != Comm.ps.value:
            raise ValueError(f"{algorithm} runs on a parameter server; use comm ps, not {v}")
        return v

    @field_validator("servers")
    @classmethod
    def _servers(cls, v: int, info: ValidationInfo) -> int:
        comm = info.data.get("comm")
        if comm == Comm.allreduce.value:
            return 0
        if comm == Comm.ps.value and v < 1:
            raise ValueError(f"comm ps needs at least 1 shard, got {v}")
        return v

    @field_validator("node_of_rank")
    @classmethod
    def _placed(cls, v: tuple[int, ...] | None, info: ValidationInfo) -> tuple[int, ...] | None:
        workers, servers = info.data.get("workers"), info.data.get("servers")
        if v is not None and workers is not None and servers is not None and len(v) != workers + servers:
            raise ValueError(f"places {len(v)} ranks, but the job has {workers} workers + {servers} shards")
        if v is not None and min(v, default=0) < 0:
            raise ValueError(f"node numbers start at 0, got {list(v)}")
        return v

    @classmethod
    def from_train_config(cls, cfg: TrainConfig, **overrides: Any) -> Scenario:
        """The scenario of a training job (overrides: what-ifs such as bandwidth_bytes_per_s)."""
        values = cfg.model_dump(mode="json", include=set(cls.model_fields) & set(TrainConfig.model_fields))
        return cls.of("scenario", **{**values, **overrides})

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> Scenario:
        """The scenario a training run's summary.json names (missing settings: the defaults)."""
        config = summary.get("config") or {}
        values = {
            "algorithm": summary["algorithm"],
            "comm": summary["comm"],
            "workers": summary["workers"],
            "servers": summary.get("servers") or 1,
            "overlap": summary.get("overlap"),
            "bucket_mb": config.get("bucket_mb"),
            "batch_size": summary["batch_size"],
            "node_of_rank": (summary.get("placement") or {}).get("node_of_rank"),
            **{k: config.get(k) for k in ("momentum", "momentum_local", "momentum_async")},
        }
        return cls.of("scenario", **{k: v for k, v in values.items() if v is not None})

    @classmethod
    def settings_in(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The scenario settings among TrainConfig-style options (e.g. a spec algorithm's)."""
        return {k: v for k, v in options.items() if k in cls.model_fields}

    def with_workers(self, workers: int) -> Scenario:
        """The same scenario at another world size (a placement is of one world size: give
        each its own)."""
        if workers == self.workers:
            return self
        return Scenario.of("scenario", **{**self.model_dump(), "workers": workers})

    @property
    def effective_momentum_local(self) -> float:
        return self.momentum if self.momentum_local is None else self.momentum_local

    @property
    def effective_momentum_async(self) -> float:
        return self.momentum if self.momentum_async is None else self.momentum_async

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 1024 * 1024)

    @property
    def ranks(self) -> int:
        """Workers and shards: the processes of the job."""
        return self.workers + self.servers
