"""A training step's least time, before anything runs: the model's floating-point operations
counted on the meta device (no memory, no data), against a peak no device of its kind exceeds.

The planner (pipelines/preflight.py) multiplies it by a job's steps: a plan whose least time
is past its timeout is one that cannot finish, and only such a plan is refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from training.models import build_model, example_input

# A step takes at least this long whatever the model: the Python of a step, the optimizer's
# launch and the data loader's index already take longer on any host.
MIN_STEP_S = 1e-5
# FLOP/s no single device of a kind exceeds (fp32 on a CPU core: 2 AVX-512 FMA units at 4 GHz give
# 128 GFLOP/s; a GPU's dense low-precision peak is about 2.5 PFLOP/s): a floor, never an estimate.
PEAK_FLOPS = {"cpu": 2e11, "cuda": 5e15}
# Forward, then backward at about twice the forward's work (gradients of inputs and of weights).
TRAIN_FACTOR = 3


def forward_flops(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                  options: Mapping[str, int | None] | None = None) -> float | None:
    """Floating-point operations of one training-mode forward at `batch`; None when the model
    cannot be run on the meta device (the floor then rests on MIN_STEP_S alone)."""
    try:
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
