"""What a configuration trains on: its input shape, its number of steps, and whether its global
batch can be drawn from the training set. The one answer the
trainer, the injected slowdowns (training/inject.py) and the launcher's checks before any process
starts (pipelines/preflight.py, pipelines/launch.py) all read."""

from __future__ import annotations

import math

from training.config import TrainConfig
from training.datasets import native_shape, train_samples
from training.models import natural_input_shape


def resolve_input_shape(cfg: TrainConfig) -> tuple[int, int, int]:
    """(channels, height, width) of one sample; a language model's is (1, 1, seq_len)."""
    if cfg.seq_len is not None:
        return (1, 1, cfg.seq_len)
    return cfg.input_shape or natural_input_shape(cfg.model, native_shape(cfg.dataset))


def resolve_steps(cfg: TrainConfig, n_train: int) -> int:
    """The steps to train: `steps`, or `epochs` of the training set's global batches (at least one)."""
    if cfg.steps is not None:
        return cfg.steps
    per_epoch = n_train // (cfg.workers * cfg.batch_size)
    return max(1, math.ceil(cfg.epochs * per_epoch))


def batch_fits(cfg: TrainConfig, where: str) -> str | None:
    """Why the global batch cannot be drawn from the training set (one line naming `where`'s
    field), or None: a rank would find it only after every import."""
    try:
        samples = train_samples(cfg, resolve_input_shape(cfg))
    except ValueError as err:
        return f"{where}.{err}"
    if cfg.workers * cfg.batch_size > samples:
        return (f"{where}.batch_size: a global batch of {cfg.workers} workers x {cfg.batch_size} = "
                f"{cfg.workers * cfg.batch_size} exceeds the {samples} training samples of {cfg.dataset}")
    return None
