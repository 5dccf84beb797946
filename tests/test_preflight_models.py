"""The check before launch that a model trains at the run's input (`check_model_trains`), held
against the real thing: over every torchvision classifier it refuses exactly what a real CPU
training step cannot take, each refusal one line naming its field, and where the meta device
cannot decide it decides by a real build or lets the run through; it never refuses for want of
an answer."""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import cache

import pytest
import torch
from torch import nn

from training import models
from training.models import build_model, check_model_trains, logits_of

SHAPES = [(3, 32, 32), (3, 64, 64), (3, 224, 224)]
# Real steps run for every refused model and for this many accepted ones per shape.
ACCEPTED_SAMPLE = 8
# The test builds no model past 500M parameters (2 GB of fp32 weights: vit_h_14 and
# regnet_y_128gf) for real: their verdicts are the check's alone, like the other models'.
REAL_RUN_MAX_PARAMS = 500_000_000


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """The machine is shared: one thread per test, as CI gives it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _refusal(name: str, shape: tuple[int, int, int], batch: int = 2) -> str | None:
    try:
        check_model_trains(name, shape, 10, batch)
    except ValueError as err:
        return str(err)
    return None


def _assert_one_line_naming_the_field(message: str, name: str, shape: tuple[int, int, int]) -> None:
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith((f"input_shape: {name} cannot take inputs of shape {shape}: ",
                               f"batch_size: {name} cannot train on ")), message


def _real_step_error(name: str, shape: tuple[int, int, int]) -> str | None:
    """What a real forward and backward in training mode at 2 random samples raises, if anything."""
    torch.manual_seed(0)
    model = build_model(name, shape, 10).train()
    try:
        logits_of(model(torch.randn(2, *shape))).sum().backward()
    except Exception as err:  # any failure is a failure to train
        return f"{type(err).__name__}: {err}"
    return None


@cache
def _num_params(name: str) -> int:
    """From torchvision's weight metadata: nothing is built or downloaded."""
    import torchvision

    return next(iter(torchvision.models.get_model_weights(name))).meta["num_params"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{h}x{w}" for _, h, w in SHAPES])
def test_every_torchvision_classifier_is_refused_exactly_where_a_real_step_fails(shape) -> None:
    """Every model is checked; every refused one and a seeded sample of the accepted ones,
    favouring small models (the key of each is a random number times the square root of its
    parameter count), take a real training step that must agree."""
    import torchvision

    names = sorted(torchvision.models.list_models(module=torchvision.models))
    refusals = {name: message for name in names if (message := _refusal(name, shape))}
    accepted = [name for name in names if name not in refusals]
    rng = random.Random(f"preflight-{shape}")
    sample = sorted(accepted, key=lambda name: rng.random() * _num_params(name) ** 0.5)[:ACCEPTED_SAMPLE]

    for name, message in refusals.items():
        _assert_one_line_naming_the_field(message, name, shape)
    disagree = {}
    for name in [*refusals, *sample]:
        if _num_params(name) > REAL_RUN_MAX_PARAMS:
            continue
        real = _real_step_error(name, shape)
        if (real is None) == (name in refusals):
            disagree[name] = refusals.get(name) or f"accepted, but a real step raises {real}"
    assert not disagree, disagree


def test_regnet_whose_builder_computes_with_tensors_is_accepted_at_64x64() -> None:
    """regnet computes its stage widths with tensors and reads them back: a build under
    torch.device("meta") cannot, and the check used to refuse all 16 regnets for it."""
    assert _refusal("regnet_x_400mf", (3, 64, 64)) is None
    assert _real_step_error("regnet_x_400mf", (3, 64, 64)) is None


def test_vit_at_64x64_is_refused_in_one_line_naming_the_shape() -> None:
    message = _refusal("vit_b_16", (3, 64, 64))
    assert message == ("input_shape: vit_b_16 cannot take inputs of shape (3, 64, 64): "
                       "Wrong image height! Expected 224 but got 64!")


class _ReadsItsInput(nn.Module):
    """A classifier for one input shape whose forward reads its input's values, which the meta
    device does not have: the check must build it for real to decide."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.fc = nn.Linear(shape[0] * shape[1] * shape[2], 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 if x.abs().sum().item() >= 0 else 0.0
        return self.fc(x.flatten(1)) * scale


class _ReadsItsWeights(_ReadsItsInput):
    """A classifier whose builder reads a weight's value, which the meta device does not have."""

    def __init__(self, shape: tuple[int, int, int]) -> None:
        super().__init__(shape)
        self.gain = float(self.fc.weight.detach().abs().max())


class _RaisesLongly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("input too small: " + "x" * 500 + "\nsecond line\nthird line")


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Three test models by name, each built for 3x8x8 inputs. The check's answers are kept per
    process for the registry's models; a test's own builds start and leave none."""
    fakes = {"reads-input": _ReadsItsInput, "reads-weights": _ReadsItsWeights,
             "raises-longly": lambda shape: _RaisesLongly()}
    monkeypatch.setattr(models, "check_model_name", lambda name: None)
    monkeypatch.setattr(models, "build_model", lambda name, shape, classes, options=None: fakes[name]((3, 8, 8)))
    models._failure.cache_clear()
    yield
    models._failure.cache_clear()


def test_where_the_meta_device_cannot_tell_a_real_step_decides(fake_models) -> None:
    assert _refusal("reads-input", (3, 8, 8)) is None
    message = _refusal("reads-input", (3, 4, 4))
    _assert_one_line_naming_the_field(message, "reads-input", (3, 4, 4))
    assert "cannot be multiplied" in message


def test_the_real_step_leaves_the_random_state_as_it_was(fake_models) -> None:
    torch.manual_seed(7)
    before = torch.get_rng_state()
    _refusal("reads-input", (3, 8, 8))
    assert torch.equal(torch.get_rng_state(), before)


def test_what_no_bounded_computation_can_decide_is_let_through(fake_models, monkeypatch) -> None:
    """A builder that needs its weights' values cannot be sized without a real build, and a model
    past the weight bound is not built: both are let through, even at an input they cannot take."""
    assert _refusal("reads-weights", (3, 4, 4)) is None
    monkeypatch.setattr(models, "REAL_CHECK_MAX_WEIGHT_BYTES", 100)
    assert _refusal("reads-input", (3, 4, 4)) is None


def test_a_long_many_line_error_is_refused_in_one_bounded_line(fake_models) -> None:
    message = _refusal("raises-longly", (3, 8, 8))
    _assert_one_line_naming_the_field(message, "raises-longly", (3, 8, 8))
    assert message.endswith("xxx...") and "second line" not in message


def test_one_sample_where_two_train_is_refused_naming_the_batch_through_a_real_step(fake_models,
                                                                                   monkeypatch) -> None:
    """The batch-1 rule holds where the real step decides: batch norm needs 2 samples."""
    monkeypatch.setattr(models, "build_model", lambda name, shape, classes, options=None: nn.Sequential(
        _ReadsItsInput((3, 8, 8)), nn.BatchNorm1d(10)))
    message = _refusal("reads-input", (3, 8, 8), batch=1)
    _assert_one_line_naming_the_field(message, "reads-input", (3, 8, 8))
    assert message.startswith("batch_size: reads-input cannot train on 1 sample per worker (it trains at 2 and up)")
