"""A training step's least time, before anything runs: the model's floating-point operations
counted on a few real samples where the model is small, else on the meta device (no memory, no
data), against a peak no device of its kind exceeds.

The planner (pipelines/preflight.py) multiplies it by a job's steps: a plan whose least time
is past its timeout is one that cannot finish, and only such a plan is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from training.models import build_model, example_input, sizing_model

# A step takes at least this long whatever the model: the Python of a step, the optimizer's
# launch and the data loader's index already take longer on any host.
MIN_STEP_S = 1e-5
# FLOP/s no single device of a kind exceeds (fp32 on a CPU core: 2 AVX-512 FMA units at 4 GHz give
# 128 GFLOP/s; a GPU's dense low-precision peak is about 2.5 PFLOP/s): a floor, never an estimate.
PEAK_FLOPS = {"cpu": 2e11, "cuda": 5e15}
# Forward, then backward at about twice the forward's work (gradients of inputs and of weights).
TRAIN_FACTOR = 3
# A small model is counted at this many real samples: its operations are per sample.
SIZING_SAMPLES = 2


def _matmul(out: torch.Tensor, a: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * out.numel() * a.shape[-1]


def _addmm(out: torch.Tensor, _bias: torch.Tensor, a: torch.Tensor, *_: Any, **__: Any) -> int:
    return 2 * out.numel() * a.shape[-1]


def _conv(transposed: bool) -> Callable[..., int]:
    """FlopCounterMode's conv_flop_count: every output (input, if transposed) position of every
    sample takes one multiply-add per weight."""
    def count(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, *_: Any, **__: Any) -> int:
        positions = math.prod((x if transposed else out).shape[2:])
        return 2 * x.shape[0] * w.numel() * positions

    return count


def _sdpa(_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any, **__: Any) -> int:
    """FlopCounterMode's sdpa_flop_count: the scores (q by k's transpose) and their product with v."""
    rows = math.prod(q.shape[:-1])
    return 2 * rows * k.shape[-2] * q.shape[-1] + 2 * rows * k.shape[-2] * v.shape[-1]


# The operations torch's FlopCounterMode counts, by the functions a model calls, with its
# formulas (a linear is a matmul of its input's rows by the weight's transpose).
_COUNTS: dict[Callable[..., Any], Callable[..., int]] = {
    F.linear: _matmul,
    torch.matmul: _matmul, torch.Tensor.matmul: _matmul, torch.Tensor.__matmul__: _matmul,
    torch.Tensor.__rmatmul__: lambda out, a, b, *_, **__: 2 * out.numel() * b.shape[-1],
    torch.mm: _matmul, torch.Tensor.mm: _matmul, torch.bmm: _matmul, torch.Tensor.bmm: _matmul,
    torch.addmm: _addmm, torch.baddbmm: _addmm,
    F.conv1d: _conv(False), F.conv2d: _conv(False), F.conv3d: _conv(False),
    F.conv_transpose1d: _conv(True), F.conv_transpose2d: _conv(True), F.conv_transpose3d: _conv(True),
    F.scaled_dot_product_attention: _sdpa,
}


class FlopCount(TorchFunctionMode):
    """Counts a forward's floating-point operations as torch's FlopCounterMode does, by its
    formulas, at the level of the functions a model calls: a dispatch mode's first use imports
    torch's compiler stack (about a second), a function mode's does not. A function runs with
    the mode off, so what a composite calls inside (multi-head attention's matmuls) is not seen:
    it is for models whose matmuls, convolutions and attention are called directly (every model
    `sizing_model` gives; tests/test_training_flops.py holds it to FlopCounterMode's count)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if (count := _COUNTS.get(func)) is not None:
            self.total += count(out, *args, **(kwargs or {}))
        return out


def forward_flops(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                  options: Mapping[str, int | None] | None = None) -> float | None:
    """Floating-point operations of one training-mode forward at `batch`; None when the model
    can be run neither on a few real samples nor on the meta device (the floor then rests on
    MIN_STEP_S alone). Every counted operation is per sample, so a few samples tell the batch."""
    samples = min(batch, SIZING_SAMPLES)
    try:
        with sizing_model(name, input_shape, num_classes, options) as small:
            if small is not None:
                with FlopCount() as count:
                    small(example_input(name, input_shape, samples))
                return float(count.total) * batch / samples
        from torch.utils.flop_counter import FlopCounterMode  # 0.25 s of import the small path skips

        with torch.device("meta"):
            model = build_model(name, input_shape, num_classes, options)
            x = example_input(name, input_shape, batch)
            with FlopCounterMode(display=False) as counter:
                model(x)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return None
    return float(counter.get_total_flops())


def least_step_s(flops: float | None, device: str, threads: int) -> float:
    """The least time of one training step of a forward of `flops` on `threads` cores (CPU) or one GPU."""
    peak = PEAK_FLOPS[device] * (threads if device == "cpu" else 1)
    return max(MIN_STEP_S, TRAIN_FACTOR * (flops or 0.0) / peak)
