"""The benchmark spec: one pydantic schema, validated before anything runs.

A spec names the hardware, the provider, the workloads (model x dataset), the
algorithms, the grid (workers x batch sizes x repeats), how long to train, the
network, what to predict beyond the measured grid, and the regression
thresholds. Every training config of the grid is also validated as a
`TrainConfig`, so a spec that loads is a spec whose jobs start.

The package holds everything about a spec before it runs: this module's schema and grid, its
sections (`sections`), loading a file with overrides and one-line errors (`load`), where every
job lands on the provider's nodes (`placement`) and what a DAG trigger may choose (`trigger`).
It may import training's config, modelling's settings and infra; the stages, the report and the
CLI import it.
"""

from __future__ import annotations

import hashlib
import json
import re
from itertools import product
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator

from infra import bounds
from infra.credentials import mask_secrets
from infra.units import parse_rate
from pipelines.spec.alarm import RegressionSpec, TrackingSpec
from pipelines.spec.load import (
    SpecError,
    by_field,
    check_overrides,
    format_spec_error,
    load_file,
    merge_overrides,
    one_error,
)
from pipelines.spec.placement import placement_problems
from pipelines.spec.sections import (
    GRID_FIELDS,
    AlgorithmSpec,
    MemorySpec,
    MicrobenchSpec,
    NetworkSpec,
    ProfileSpec,
    ProviderSpec,
    Section,
    Suite,
    WhatIfSpec,
    Workload,
)
from training.config import Comm, ConfigError, TrainConfig

# Training options that slow a run on purpose (to test the regression alarm): not what is measured.
INJECTED_OPTIONS = ("inject_delay_ms", "inject_busy", "inject_where")

__all__ = [
    "SPEC_VERSION", "AlgorithmSpec", "BenchSpec", "MemorySpec", "MicrobenchSpec", "NetworkSpec", "ProfileSpec",
    "ProviderSpec", "RegressionSpec", "SpecError", "Suite", "TrackingSpec", "WhatIfSpec", "Workload", "config_key",
    "config_of", "flatten", "grid", "load_spec", "parse_rate", "validate_spec",
]

SPEC_VERSION = 1
# Training configs one spec may ask for (before repeats): bounds the time a spec takes to load.
MAX_GRID_CONFIGS = 1024


class BenchSpec(Section):
    """A benchmark: what to run, where, how often, and what counts as a regression."""

    version: int = Field(SPEC_VERSION, description="Spec format version.")
    name: str = Field(description="Short name of the benchmark (letters, digits, - and _).")
    suite: Suite = Field(Suite.adhoc, description="nightly, onboarding or adhoc (the MLflow experiment).")
    hardware: str = Field(description="Hardware label results are compared under, e.g. cpu-2core.")
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    workloads: list[Workload] = Field(min_length=1)
    algorithms: list[AlgorithmSpec] = Field(min_length=1)
    workers: list[Annotated[int, Field(le=bounds.WORKERS.limit)]] = Field(
        min_length=1, description="World sizes N of the training grid.")
    servers: int = Field(1, ge=1, le=bounds.SERVERS.limit, description="Parameter-server shards for comm=ps.")
    batch_sizes: list[Annotated[int, Field(le=bounds.BATCH_SIZE.limit)]] = Field(
        [32], min_length=1, description="Per-worker batch sizes.")
    steps: int | None = Field(None, ge=1, le=bounds.STEPS.limit, description="Iterations per worker (or give epochs).")
    epochs: float | None = Field(None, gt=0, le=bounds.EPOCHS.limit, description="Epochs per run (or give steps).")
    repeats: int = Field(
        1, ge=1, le=100, description="Runs per config (seed = repeat index); figures are medians over them."
    )
    target_accuracy: float | None = Field(None, gt=0, le=1)
    scaling: bool | None = Field(
        None,
        description="Add a 1-worker SSGD (allreduce) run per workload and batch size, the measured baseline of "
        "scaling efficiency; default: when workers lists more than one size. Without one the report says "
        "'no 1-worker baseline'.",
    )
    train: dict[str, Any] = Field(
        default_factory=dict, description="TrainConfig options of every run (lr, momentum, eval_every, threads, ...)."
    )
    train_timeout_s: float = Field(
        1800.0, gt=0, le=bounds.JOB_TIMEOUT_S.limit, description="Kill one training job after this long.")
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    microbench: MicrobenchSpec = Field(default_factory=MicrobenchSpec)
    profile: ProfileSpec = Field(default_factory=ProfileSpec)
    what_if: WhatIfSpec = Field(default_factory=WhatIfSpec)
    memory: MemorySpec = Field(default_factory=MemorySpec)
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
        grid = sorted(GRID_FIELDS & set(v))
        if grid:
            raise ValueError(f"{grid[0]!r} is set by the grid; set it in the spec's own field")
        return v

    @model_validator(mode="after")
    def _check(self) -> BenchSpec:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("steps/epochs: give exactly one of them")
        configs = len(self.workloads) * len(self.algorithms) * len(self.workers) * len(self.batch_sizes)
        if configs > MAX_GRID_CONFIGS:
            raise ValueError(
                f"workloads x algorithms x workers x batch_sizes: {configs} training configs, more than the "
                f"{MAX_GRID_CONFIGS} a spec may ask for"
            )
        labels = [a.label + str(sorted(a.options.items())) for a in self.algorithms]
        if len(set(labels)) != len(labels):
            raise ValueError("algorithms: the same algorithm and comm is listed twice with the same options")
        return self

    @property
    def experiment(self) -> str:
        return f"ddlbench-{self.suite.value}"

    def spec_hash(self) -> str:
        """Identity of what is measured: equal hashes mean comparable runs.

        Left out: the regression section (how runs are judged, not what is measured) and the
        training options `inject_delay_ms`, `inject_busy` and `inject_where` (a slowdown injected
        to test the alarm must be judged against the history of the spec it slows down)."""
        doc = self.model_dump(mode="json", exclude={"regression"})
        for options in (doc["train"], *(algo["options"] for algo in doc["algorithms"])):
            for key in INJECTED_OPTIONS:
                options.pop(key, None)
        canon = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


def config_key(
    workload: Workload, algo: AlgorithmSpec, workers: int, batch_size: int, repeat: int, variant: int | None = None
) -> str:
    """Readable and unique: `lenet5-odsgd-ps-w2-b32-r0` (`-v1` when an algorithm is listed twice)."""
    # A model on its usual data goes by its own name; a GPT's options are part of it.
    name = workload.name if workload.dataset in ("digits", "synthetic", "stdlib-text") else workload.label
    v = f"-v{variant}" if variant else ""
    return f"{name}-{algo.label}{v}-w{workers}-b{batch_size}-r{repeat}"


def config_of(key: str) -> str:
    """The config of a grid key, without its repeat index: `lenet5-odsgd-ps-v4-w2-b32-r1` ->
    `lenet5-odsgd-ps-v4-w2-b32` (the `ddlbench.config` tag MLflow groups repeats by)."""
    return re.sub(r"-r\d+$", "", key)


def wants_scaling_baseline(spec: BenchSpec) -> bool:
    """Whether the grid adds the 1-worker baseline runs (1 worker not already in the grid)."""
    asked = spec.scaling if spec.scaling is not None else len(spec.workers) > 1
    return asked and 1 not in spec.workers


def _baseline_algorithm(spec: BenchSpec) -> tuple[int, AlgorithmSpec]:
    """The grid's SSGD over allreduce (its options too) when listed, else a plain one."""
    for ai, algo in enumerate(spec.algorithms):
        if algo.label == "ssgd-allreduce":
            return ai, algo
    return len(spec.algorithms), AlgorithmSpec(name="ssgd", comm="allreduce")


def grid(spec: BenchSpec) -> list[dict[str, Any]]:
    """Every training run: [{"key", "config" (TrainConfig values), "repeat"}], validated; the
    1-worker baseline runs (`wants_scaling_baseline`) come last."""
    seen: dict[str, int] = {}
    jobs = [
        (wi, wl, ai, algo, workers, batch)
        for (wi, wl), (ai, algo), workers, batch in product(
            enumerate(spec.workloads), enumerate(spec.algorithms), spec.workers, spec.batch_sizes
        )
    ]
    grid_size = len(jobs)
    if wants_scaling_baseline(spec):
        ai, algo = _baseline_algorithm(spec)
        jobs += [
            (wi, wl, ai, algo, 1, batch) for (wi, wl), batch in product(enumerate(spec.workloads), spec.batch_sizes)
        ]
    entries, configs = [], []
    for wi, wl, ai, algo, workers, batch in jobs:
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
        values |= wl.grid_values()
        source = f"spec.algorithms[{ai}]" if algo.options else "spec.train"
        try:
            cfg = TrainConfig(**values)
        except ValidationError as err:
            where = f"{source} (workloads[{wi}], workers={workers}, batch={batch})"
            raise SpecError(format_spec_error(err, where)) from None
        configs.append((wl, algo, workers, batch, ai - variant or None, cfg))
    # The grid's repeats interleaved (every configuration once, then again): a slow spell of the
    # host falls on all configurations alike instead of on every repeat of one. The baselines last.
    order = [(r, c) for r in range(spec.repeats) for c in configs[:grid_size]]
    order += [(r, c) for c in configs[grid_size:] for r in range(spec.repeats)]
    for repeat, (wl, algo, workers, batch, var, cfg) in order:
        key = config_key(wl, algo, workers, batch, repeat, variant=var)
        entries.append({"key": key, "config": {**cfg.model_dump(mode="json"), "seed": repeat}, "repeat": repeat})
    return entries


def validate_spec(values: dict[str, Any], source: str = "spec") -> BenchSpec:
    """A BenchSpec whose whole grid is valid, or SpecError naming each bad field and value."""
    try:
        spec = BenchSpec(**values)
    except ValidationError as err:
        raise SpecError(format_spec_error(err, source)) from None
    except TypeError as err:
        raise SpecError(one_error([f"{source}: {err}"])) from None
    # A spec lands in MLflow params, artifacts and the run directory: it may hold no password.
    if held := [k for k, v in flatten(spec.model_dump(mode="json")).items() if mask_secrets(v) != v]:
        raise SpecError(f"{source}.{held[0]}: holds a password or token; the deployment gives credentials "
                        "through the environment (MLFLOW_TRACKING_URI, a kubeconfig), never a spec")
    try:
        entries = grid(spec)
    except ConfigError as err:
        raise SpecError(str(err)) from None
    if problems := placement_problems(spec, entries, source):
        raise SpecError(one_error(by_field(problems, "jobs")))
    return spec


def load_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> BenchSpec:
    """Read a spec file within pipelines/spec/load.py's limits, merge overrides (Airflow Params,
    `--set`; the same limits) and validate it."""
    path = Path(path)
    values = load_file(path, BenchSpec.model_fields)
    if overrides:
        values = merge_overrides(values, check_overrides(overrides))
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
