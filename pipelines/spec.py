"""The benchmark spec: one pydantic schema, validated before anything runs.

A spec names the hardware, the provider, the workloads (model x dataset), the
algorithms, the grid (workers x batch sizes x repeats), how long to train, the
network, what to predict beyond the measured grid, and the regression
thresholds. Every training config of the grid is also validated as a
`TrainConfig`, so a spec that loads is a spec whose jobs start.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from enum import StrEnum
from itertools import product
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training.config import Algorithm, Comm, ConfigError, build_config, format_validation_error, load_yaml

SPEC_VERSION = 1

# Options that the grid itself sets; a spec gives them through its own fields.
_GRID_FIELDS = {
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
_LINK_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9}


class SpecError(ConfigError):
    """The spec is wrong; the message names the field and the bad value."""


class Suite(StrEnum):
    nightly = "nightly"
    onboarding = "onboarding"
    adhoc = "adhoc"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderSpec(_Strict):
    name: str = Field("local", description="Cluster provider: local, netns, slurm or kubernetes.")
    options: dict[str, Any] = Field(default_factory=dict, description="Keyword options of the provider.")


class Workload(_Strict):
    model: str = Field(description="Model name (training.models).")
    dataset: str = Field(description="Dataset name (training.datasets).")
    input_shape: tuple[int, int, int] | None = Field(None, description="C,H,W; default: the model's.")
    num_classes: int | None = Field(None, ge=2, description="Classes; default: the dataset's.")
    data_root: Path | None = Field(None, description="Local root of the dataset files.")

    @property
    def label(self) -> str:
        return f"{self.model}-{self.dataset}"


class AlgorithmSpec(_Strict):
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
        grid = sorted(_GRID_FIELDS & set(self.options))
        if grid:
            raise ValueError(f"options: {grid[0]!r} is set by the grid; set it in the spec's own field")
        return self

    @property
    def comm_mode(self) -> Comm:
        return self.comm or (Comm.allreduce if self.name == Algorithm.ssgd else Comm.ps)

    @property
    def label(self) -> str:
        return f"{self.name.value}-{self.comm_mode.value}"


class NetworkSpec(_Strict):
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


class MicrobenchSpec(_Strict):
    enabled: bool = True
    sizes: list[int] | None = Field(None, description="Message sizes in bytes; default: the microbench's.")
    repeats: int = Field(5, ge=1)
    timeout_s: float = Field(600.0, gt=0)

    @field_validator("sizes")
    @classmethod
    def _sizes(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 1):
            raise ValueError(f"every size must be a positive byte count, got {v}")
        return v


class ProfileSpec(_Strict):
    enabled: bool = True
    warmup: int = Field(3, ge=0)
    repeats: int = Field(10, ge=1)
    timeout_s: float = Field(600.0, gt=0, description="Kill one profiling job after this long.")


class WhatIfSpec(_Strict):
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


class RegressionSpec(_Strict):
    throughput_drop: float = Field(
        0.10, gt=0, lt=1, description="Flag when the median throughput over repeats falls by more than this fraction."
    )
    prediction_error_rise: float = Field(
        0.10, gt=0, description="Flag when the median absolute prediction error rises by more than this (absolute)."
    )


class TrackingSpec(_Strict):
    system_metrics: bool = Field(True, description="Sample CPU/memory into the training runs.")


class BenchSpec(_Strict):
    """A benchmark: what to run, where, how often, and what counts as a regression."""

    version: int = Field(SPEC_VERSION, description="Spec format version.")
    name: str = Field(description="Short name of the benchmark (letters, digits, - and _).")
    suite: Suite = Field(Suite.adhoc, description="nightly, onboarding or adhoc (the MLflow experiment).")
    hardware: str = Field(description="Hardware label results are compared under, e.g. cpu-2core.")
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    workloads: list[Workload] = Field(min_length=1)
    algorithms: list[AlgorithmSpec] = Field(min_length=1)
    workers: list[int] = Field(min_length=1, description="World sizes N of the training grid.")
    servers: int = Field(1, ge=1, le=256, description="Parameter-server shards for comm=ps.")
    batch_sizes: list[int] = Field([32], min_length=1, description="Per-worker batch sizes.")
    steps: int | None = Field(None, ge=1, description="Iterations per worker (or give epochs).")
    epochs: float | None = Field(None, gt=0, description="Epochs per run (or give steps).")
    repeats: int = Field(
        1, ge=1, le=100, description="Runs per config (seed = repeat index); figures are medians over them."
    )
    target_accuracy: float | None = Field(None, gt=0, le=1)
    train: dict[str, Any] = Field(
        default_factory=dict, description="TrainConfig options of every run (lr, momentum, eval_every, threads, ...)."
    )
    train_timeout_s: float = Field(1800.0, gt=0, description="Kill one training job after this long.")
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    microbench: MicrobenchSpec = Field(default_factory=MicrobenchSpec)
    profile: ProfileSpec = Field(default_factory=ProfileSpec)
    what_if: WhatIfSpec = Field(default_factory=WhatIfSpec)
    regression: RegressionSpec = Field(default_factory=RegressionSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)

    @field_validator("name", "hardware")
    @classmethod
    def _label(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", v):
            raise ValueError(f"use 1-64 letters, digits, '.', '-' or '_', got {v!r}")
        return v

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != SPEC_VERSION:
            raise ValueError(f"this ddlbench reads spec version {SPEC_VERSION}, got {v}")
        return v

    @field_validator("workers", "batch_sizes")
    @classmethod
    def _positive_unique(cls, v: list[int]) -> list[int]:
        if any(x < 1 for x in v):
            raise ValueError(f"every entry must be at least 1, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"entries must be distinct, got {v}")
        return v

    @field_validator("train")
    @classmethod
    def _train(cls, v: dict[str, Any]) -> dict[str, Any]:
        grid = sorted(_GRID_FIELDS & set(v))
        if grid:
            raise ValueError(f"{grid[0]!r} is set by the grid; set it in the spec's own field")
        return v

    @model_validator(mode="after")
    def _check(self) -> BenchSpec:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("steps/epochs: give exactly one of them")
        labels = [a.label + str(sorted(a.options.items())) for a in self.algorithms]
        if len(set(labels)) != len(labels):
            raise ValueError("algorithms: the same algorithm and comm is listed twice with the same options")
        return self

    @property
    def experiment(self) -> str:
        return f"ddlbench-{self.suite.value}"

    def spec_hash(self) -> str:
        """Identity of what is measured: equal hashes mean comparable runs."""
        canon = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


def parse_rate(rate: str) -> float:
    """'1gbit' -> bytes per second (bit units are /8; 'b', 'kb', 'mb', 'gb' are bytes)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", rate)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _LINK_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"expected a positive rate such as 1gbit, 100mbit or 125mb, got {rate!r}")
    return float(m.group(1)) * _LINK_UNITS[unit]


def config_key(
    workload: Workload, algo: AlgorithmSpec, workers: int, batch_size: int, repeat: int, variant: int | None = None
) -> str:
    """Readable and unique: `lenet5-odsgd-ps-w2-b32-r0` (`-v1` when an algorithm is listed twice)."""
    name = workload.model if workload.dataset in ("digits", "synthetic") else workload.label
    v = f"-v{variant}" if variant else ""
    return f"{name}-{algo.label}{v}-w{workers}-b{batch_size}-r{repeat}"


def grid(spec: BenchSpec) -> list[dict[str, Any]]:
    """Every training run: [{"key", "config" (TrainConfig values), "repeat"}], validated."""
    seen: dict[str, int] = {}
    entries = []
    for (wi, wl), (ai, algo), workers, batch in product(
        enumerate(spec.workloads), enumerate(spec.algorithms), spec.workers, spec.batch_sizes
    ):
        variant = seen.setdefault(algo.label, ai)
        values: dict[str, Any] = {
            **spec.train,
            **algo.options,
            "model": wl.model,
            "dataset": wl.dataset,
            "algorithm": algo.name.value,
            "comm": algo.comm_mode.value,
            "workers": workers,
            "servers": spec.servers if algo.comm_mode == Comm.ps else 0,
            "batch_size": batch,
            "steps": spec.steps,
            "epochs": spec.epochs,
            "target_accuracy": spec.target_accuracy,
            "link_bandwidth": spec.network.link_bandwidth,
        }
        for opt in ("input_shape", "num_classes", "data_root"):
            if getattr(wl, opt) is not None:
                values[opt] = getattr(wl, opt)
        source = f"spec.algorithms[{ai}]" if algo.options else "spec.train"
        cfg = build_config(values, f"{source} (workloads[{wi}], workers={workers}, batch={batch})")
        for repeat in range(spec.repeats):
            key = config_key(wl, algo, workers, batch, repeat, variant=ai - variant or None)
            entries.append({"key": key, "config": {**cfg.model_dump(mode="json"), "seed": repeat}, "repeat": repeat})
    return entries


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge overrides; a dotted key ('regression.throughput_drop') reaches into sections."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        node = out
        *parents, leaf = str(key).split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SpecError(f"overrides.{key}: {p} is not a section")
        if isinstance(value, dict) and isinstance(node.get(leaf), dict):
            node[leaf] = _merge(node[leaf], value)
        else:
            node[leaf] = value
    return out


def validate_spec(values: dict[str, Any], source: str = "spec") -> BenchSpec:
    """A BenchSpec whose whole grid is valid, or SpecError naming each bad field and value."""
    try:
        spec = BenchSpec(**values)
    except ValidationError as err:
        raise SpecError(format_validation_error(err, source)) from None
    except TypeError as err:
        raise SpecError(f"{source}: {err}") from None
    try:
        grid(spec)
    except ConfigError as err:
        raise SpecError(str(err)) from None
    return spec


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> BenchSpec:
    """Read, merge overrides (e.g. Airflow Params) and validate a spec file."""
    path = Path(path)
    try:
        values = load_yaml(path)
    except ConfigError as err:
        raise SpecError(str(err)) from None
    if overrides:
        values = _merge(values, {str(k).replace("-", "_"): v for k, v in overrides.items()})
    return validate_spec(values, source=path.name)


def flatten(values: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts and lists as flat `a.b.0` keys with string values (MLflow params)."""
    out: dict[str, str] = {}
    if isinstance(values, dict):
        for k, v in values.items():
            out |= flatten(v, f"{prefix}{k}.")
    elif isinstance(values, list | tuple) and values and any(isinstance(v, dict) for v in values):
        for i, v in enumerate(values):
            out |= flatten(v, f"{prefix}{i}.")
    else:
        out[prefix.rstrip(".")] = json.dumps(values) if isinstance(values, list | tuple) else str(values)
    return out
