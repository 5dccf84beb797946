"""The training job's configuration: one pydantic model, one source of truth.

The same definitions feed validation, the CLI help and the YAML loader. A bad
value fails here, naming the field, before any process is launched.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra import bounds
from training.gpt_shape import GPT_OPTIONS, GPT_PRESETS, OWN_OPTIONS, is_gpt

# The choices of the options below: a member's value is its name, so each is named once.
Algorithm = StrEnum("Algorithm", ["ssgd", "asgd", "odsgd"])
Comm = StrEnum("Comm", ["allreduce", "ps"])
Compensation = StrEnum("Compensation", ["none", "dc"])
Device = StrEnum("Device", ["cpu", "cuda"])
# Where an injected slowdown is spent (training/inject.py): a component class, or one module.
INJECT_CLASSES = ("data", "compute", "update")
INJECT_LAYER = "layer:"

# What makes a learning rate or a momentum valid, for the global optimizer and the local ones alike.
LearningRate = Annotated[float, Field(gt=0)]
Momentum = Annotated[float, Field(ge=0, lt=1)]
# One input sample's C, H and W (a sequence: 1, 1, length), each bounded (infra/bounds.py).
Dim = Annotated[int, Field(ge=1, le=bounds.INPUT_DIM.limit)]
InputShape = tuple[Dim, Dim, Dim]


def check_input_shape(shape: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
    """A shape whose sample fits the bound on its values (infra/bounds.py)."""
    if shape is not None and shape[0] * shape[1] * shape[2] > bounds.SAMPLE_ELEMENTS.limit:
        raise ValueError(f"{shape} holds {shape[0] * shape[1] * shape[2]:,} values a sample, above the bound of "
                         f"{bounds.SAMPLE_ELEMENTS.limit:,} ({bounds.SAMPLE_ELEMENTS.reason})")
    return shape


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the field."""


def default_comm(algorithm: Algorithm | str) -> Comm:
    """allreduce for ssgd; the asynchronous algorithms run on a parameter server."""
    return Comm.allreduce if Algorithm(algorithm) == Algorithm.ssgd else Comm.ps


class TrainConfig(BaseModel):
    """One distributed training job (DESIGN §2)."""

    model_config = ConfigDict(extra="forbid", use_enum_values=False, validate_assignment=True)

    model: str = Field(
        "lenet5",
        description="mlp, lenet5, resnet20, a torchvision classifier (resnet50, ...) or a GPT language model "
        "(gpt-tiny, gpt-mini, gpt2-small).")
    dataset: str = Field(
        "digits",
        description="Dataset: synthetic (random, for throughput), synthetic-learnable (CIFAR-shaped Gaussian "
        "classes, Bayes accuracy 0.933, no download), digits, mnist, cifar10, imagefolder; for a GPT: stdlib-text "
        "(the Python standard library's source, bytes) or markov (an order-2 Markov chain of known entropy rate).",
    )
    data_root: Path | None = Field(None, description="Local root of mnist, cifar10 or imagefolder data.")
    download: bool = Field(False, description="Allow torchvision to download mnist/cifar10 into data_root.")
    input_shape: InputShape | None = Field(None, description="C,H,W fed to the model (default: natural).")
    num_classes: int | None = Field(
        None, ge=2, le=bounds.NUM_CLASSES.limit, description="Number of classes; default: the dataset's.")
    synthetic_samples: int = Field(
        4096, ge=16, le=bounds.SAMPLES.limit,
        description="Training samples of the synthetic datasets (markov: sequences).")
    n_layer: int | None = Field(
        None, ge=1, le=1024, description="GPT: transformer blocks (default: the preset's); mlp: hidden layers (3).")
    d_model: int | None = Field(
        None, ge=1, le=65536, description="GPT: model width (default: the preset's); mlp: hidden width (1024).")
    n_head: int | None = Field(None, ge=1, le=1024, description="GPT: attention heads; must divide d_model.")
    seq_len: int | None = Field(
        None, ge=1, le=65536, description="GPT: tokens per sequence, at most the preset's context (default: it).")
    vocab_size: int | None = Field(
        None, ge=2, le=1 << 20, description="GPT: vocabulary, at least the corpus's token ids (default: the corpus's).")
    algorithm: Algorithm = Field(Algorithm.ssgd, description="Update algorithm: ssgd, asgd or odsgd.")
    comm: Comm | None = Field(None, description="allreduce (ssgd only) or ps; default: allreduce for ssgd, else ps.")
    workers: int = Field(2, ge=1, le=bounds.WORKERS.limit, description="Number of worker processes N.")
    servers: int = Field(
        0, ge=0, le=bounds.SERVERS.limit, description="Parameter-server shards S (comm=ps needs at least 1).")
    batch_size: int = Field(32, ge=1, le=bounds.BATCH_SIZE.limit, description="Per-worker batch size b.")
    steps: int | None = Field(None, ge=1, le=bounds.STEPS.limit, description="Training iterations per worker.")
    epochs: float | None = Field(
        None, gt=0, le=bounds.EPOCHS.limit, description="Epochs over the training split (instead of steps).")
    lr: LearningRate = Field(0.05, description="Learning rate of the global optimizer.")
    momentum: Momentum = Field(0.9, description="Momentum of the global optimizer.")
    weight_decay: float = Field(0.0, ge=0, description="Weight decay of the global optimizer.")
    lr_async: LearningRate | None = Field(
        None,
        description="ASGD: learning rate of the shard's optimizer, applied to each push on arrival; "
        "default lr / workers, so a round of N pushes moves about as far as one SSGD step.")
    momentum_async: Momentum | None = Field(
        None,
        description="ASGD: momentum of the shard's optimizer (its buffer lives on the shard, as in "
        "MXNet dist_async); default momentum. 0 gives the plain rule W <- W - lr_async * g. "
        "Stale gradients add momentum of their own (Mitliagkas et al. 2016): on lenet5/digits, "
        "2 workers, 500 steps, 0.9 collapsed to chance in 2 of 10 runs, 0.8 in none of 20.")
    lr_local: LearningRate | None = Field(
        None,
        description="OD-SGD: learning rate of the local update; default lr, so the local step "
        "approximates the global one (DESIGN 2).")
    momentum_local: Momentum | None = Field(
        None,
        description="OD-SGD: momentum of the local update; default momentum. The authors' public MXNet "
        "configs use 0 with an SSGD warm-up; on lenet5/digits that reached 0.89 in 250 steps, the default "
        "0.97 (benchmarks/bench_convergence.py, variant odsgd-paper).")
    warmup_steps: int = Field(
        0, ge=0,
        description="OD-SGD: the first iterations run as SSGD-PS. The authors' public configs warm up "
        "with SSGD; 0 here, which learnt better with the default local momentum (see momentum_local).")
    compensation: Compensation = Field(
        Compensation.none,
        description="OD-SGD local-update compensation: none, or dc (DC-ASGD's g + lambda*g*g*(W_g - W_k)).")
    dc_lambda: float = Field(0.04, ge=0, description="Delay-compensation strength lambda (DC-ASGD's 0.04).")
    bucket_mb: float = Field(
        25.0, gt=0, le=bounds.BUCKET_MB.limit, description="DDP bucket size in MB (ssgd allreduce, overlap on).")
    overlap: bool = Field(True, description="ssgd allreduce: overlap bucketed allreduce with backward (DDP).")
    seed: int = Field(0, ge=0, le=bounds.SEED.limit, description="Seed of model init, data order and synthetic data.")
    device: Device = Field(Device.cpu, description="cpu (gloo) or cuda (NCCL allreduce, pinned-host PS).")
    measure_warmup: int = Field(2, ge=0, le=bounds.STEPS.limit, description="Iterations excluded from timing figures.")
    eval_every: int = Field(0, ge=0, le=bounds.STEPS.limit, description="Evaluate every K steps (0: only at the end).")
    target_accuracy: float | None = Field(None, gt=0, le=1, description="Accuracy for time_to_accuracy_s.")
    target_loss: float | None = Field(None, gt=0, description="Evaluation loss (lower is better) for time_to_loss_s.")
    peak_flops: float | None = Field(
        None, gt=0,
        description="Peak FLOP/s of one worker's device for MFU (default: measured by a GEMM microbenchmark).")
    threads: int = Field(1, ge=1, le=bounds.THREADS.limit, description="torch threads per process.")
    timeout_s: float = Field(
        45.0, gt=0, le=bounds.OP_TIMEOUT_S.limit,
        description="Timeout of every blocking collective or point-to-point op.")
    link_bandwidth: str | None = Field(None, description="Known link rate recorded with results (e.g. 1gbit).")
    save_params: bool = Field(False, description="Write the final parameters to params.pt (for checks).")
    memory_snapshot: bool = Field(
        False, description="CUDA: record the allocator's history from the first measured iteration and write "
        "memory_snapshot.rank<k>.pickle per worker (open it at pytorch.org/memory_viz).")
    checkpoint_every: int = Field(
        0, ge=0, le=bounds.STEPS.limit, description="Checkpoint every K steps (0: never); a rerun resumes.")
    keep_checkpoints: int = Field(
        2, ge=1, le=bounds.CHECKPOINTS_KEPT.limit, description="Complete checkpoints kept on disk.")
    max_restarts: int = Field(0, ge=0, le=100, description="torchrun restarts of a failed job (resumes).")
    inject_delay_ms: float = Field(
        0.0, ge=0, le=60000, description="Slow every iteration by this long, in the component inject_where names "
        "(tests the regression alarm).",
    )
    inject_busy: bool = Field(
        False, description="Spend inject_delay_ms as CPU work of the rank (a slower kernel, as a code regression "
        "is) instead of a sleep, which frees the core to the other ranks.",
    )
    inject_where: str = Field(
        "data", description="Which component spends inject_delay_ms: data (the data phase), compute (every "
        "layer's forward and backward, each its share of the previous iteration's measured compute, as a slower "
        "kernel library), layer:<module> (a name of model.named_modules(), e.g. layer:features.3: half in its "
        "forward, half in its backward) or update (the worker's update phase: the optimizer step; under a "
        "parameter server, loading the pulled weights). All but data are CPU work, whatever inject_busy says.",
    )

    _shape = field_validator("input_shape")(check_input_shape)

    @field_validator("inject_where")
    @classmethod
    def _check_where(cls, where: str) -> str:
        if where in INJECT_CLASSES or re.fullmatch(rf"{INJECT_LAYER}\w+(\.\w+)*", where):
            return where
        raise ValueError(f"expected {', '.join(INJECT_CLASSES)} or {INJECT_LAYER}<module name> (a dotted name of "
                         f"model.named_modules(), e.g. {INJECT_LAYER}features.3), got {where!r}")

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.comm is None:
            self.comm = default_comm(self.algorithm)
        if self.algorithm != Algorithm.ssgd and self.comm != Comm.ps:
            raise ValueError(
                f"comm: {self.algorithm.value} runs on a parameter server; use comm=ps, not {self.comm.value}"
            )
        if self.comm == Comm.ps and self.servers < 1:
            raise ValueError("servers: comm=ps needs at least 1 parameter-server shard, got 0")
        if self.comm == Comm.allreduce and self.servers:
            raise ValueError(f"servers: comm=allreduce uses no parameter server, got {self.servers}")
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("steps/epochs: give exactly one of them")
        if self.memory_snapshot and self.device != Device.cuda:
            raise ValueError(f"memory_snapshot: a snapshot is the CUDA allocator's history; device is "
                             f"{self.device.value}")
        if not is_gpt(self.model):
            own = OWN_OPTIONS.get(self.model, ())
            given = [f for f in GPT_OPTIONS if getattr(self, f) is not None and f not in own]
            if given:
                raise ValueError(f"{given[0]}: only a GPT model ({', '.join(GPT_PRESETS)}) takes it, not {self.model}")
        elif self.input_shape is not None:
            if self.input_shape[:2] != (1, 1):
                raise ValueError(f"input_shape: a GPT takes token sequences (1, 1, seq_len), got {self.input_shape}")
            if self.seq_len not in (None, self.input_shape[2]):
                raise ValueError(f"seq_len: {self.seq_len} differs from input_shape's {self.input_shape[2]}")
        return self

    @property
    def model_options(self) -> dict[str, int | None]:
        """A GPT's options (None: the preset's), or the mlp's depth and width."""
        return {f: getattr(self, f) for f in GPT_OPTIONS}

    @property
    def world_size(self) -> int:
        return self.workers + self.servers

    @property
    def effective_lr_async(self) -> float:
        return self.lr_async if self.lr_async is not None else self.lr / self.workers

    @property
    def effective_momentum_async(self) -> float:
        return self.momentum_async if self.momentum_async is not None else self.momentum

    @property
    def effective_lr_local(self) -> float:
        return self.lr_local if self.lr_local is not None else self.lr

    @property
    def effective_momentum_local(self) -> float:
        return self.momentum_local if self.momentum_local is not None else self.momentum


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line per problem: `source.field: message (got value)`."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        # A check across fields names its field at the start of its message.
        loc = ".".join(str(p) for p in e["loc"]) or ("" if re.match(r"[\w/]+: ", msg) else "(root)")
        got = e.get("input")
        shown = "" if isinstance(got, dict) or e["type"] == "value_error" else f" (got {got!r})"
        lines.append(f"{source}.{loc}: {msg}{shown}" if loc else f"{source}.{msg}{shown}")
    return "\n".join(lines)


def build_config(values: dict[str, Any], source: str = "config") -> TrainConfig:
    """Validate `values` into a TrainConfig, or raise ConfigError naming each bad field."""
    try:
        return TrainConfig(**values)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of options, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
