"""Models by name: ddlbench's own small models, every torchvision classifier, and the
GPT-style language models (training/gpt.py).

Models know nothing about distribution. All are randomly initialised; nothing
is downloaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cache, lru_cache

import torch
from torch import nn

from training.gpt import GPT
from training.gpt_shape import GPT_PRESETS, OWN_OPTIONS, is_gpt, preset_seq_len, resolve_shape

# The mlp's hidden layers and their width unless a spec says (n_layer, d_model): a few million
# parameters, a communication-bound model.
MLP_DEPTH, MLP_WIDTH = 3, 1024


def _mlp(input_shape: tuple[int, int, int], num_classes: int,
         options: Mapping[str, int | None] | None = None) -> nn.Module:
    """`n_layer` hidden layers of `d_model` units, each followed by a ReLU."""
    depth = (options or {}).get("n_layer") or MLP_DEPTH
    width = (options or {}).get("d_model") or MLP_WIDTH
    n_in = input_shape[0] * input_shape[1] * input_shape[2]
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(depth):
        layers += [nn.Linear(n_in if i == 0 else width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def _lenet5(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    c, h, w = input_shape
    if min(h, w) < 16:
        raise ValueError(f"input_shape: lenet5 needs at least 16x16 inputs, got {h}x{w}")
    fh, fw = (h // 2 - 4) // 2, (w // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * fh * fw, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, num_classes),
    )


class _BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _resnet20(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The CIFAR ResNet-20 of He et al. (2016): 3 stages of 3 basic blocks."""
    layers: list[nn.Module] = [
        nn.Conv2d(input_shape[0], 16, 3, 1, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
    ]
    c = 16
    for c_out, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(_BasicBlock(c, c_out, stride if i == 0 else 1))
            c = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    return nn.Sequential(*layers)


_OWN: dict[str, tuple[Callable[..., nn.Module], tuple[int, int, int] | None]] = {
    # name: (builder, natural input shape; None = the dataset's own)
    "mlp": (_mlp, None),
    "lenet5": (_lenet5, (1, 28, 28)),
    "resnet20": (_resnet20, (3, 32, 32)),
}

# torchvision builders that need options to build without pretrained weights.
_TV_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}
_TV_SHAPE = {"inception_v3": (3, 299, 299)}


@cache
def torchvision_models() -> frozenset[str]:
    import torchvision

    return frozenset(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name: str) -> None:
    if name not in _OWN and not is_gpt(name) and name not in torchvision_models():
        own = ", ".join(sorted(_OWN) + list(GPT_PRESETS))
        raise ValueError(
            f"model: unknown model {name!r}; use one of {own} or a torchvision "
            "classification builder name (e.g. resnet50, alexnet, vgg16)"
        )


def natural_input_shape(name: str, dataset_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The C,H,W a model is fed by default, given the dataset's own shape. A language model's
    input is a token sequence, written (1, 1, seq_len)."""
    if is_gpt(name):
        return (1, 1, preset_seq_len(name))
    if name in _OWN:
        return _OWN[name][1] or dataset_shape
    return _TV_SHAPE.get(name, (3, 224, 224))


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int,
                options: Mapping[str, int | None] | None = None) -> nn.Module:
    """A freshly initialised model; seed torch before calling for a reproducible init.

    A GPT's `num_classes` is its corpus's vocabulary, `input_shape[2]` its sequence length,
    and `options` its GPT_OPTIONS (None: the preset's); the mlp takes its OWN_OPTIONS."""
    check_model_name(name)
    if is_gpt(name):
        return GPT(resolve_shape(name, {**(options or {}), "seq_len": input_shape[2]}, num_classes))
    if name in OWN_OPTIONS:
        return _OWN[name][0](input_shape, num_classes, options)
    if name in _OWN:
        return _OWN[name][0](input_shape, num_classes)
    import torchvision

    kwargs = dict(_TV_KWARGS.get(name, {}))
    return torchvision.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)


def example_input(name: str, input_shape: tuple[int, int, int], batch: int) -> torch.Tensor:
    """A batch of zeros of what `name` takes: token ids for a GPT, images otherwise."""
    if is_gpt(name):
        return torch.zeros(batch, input_shape[2], dtype=torch.long)
    return torch.zeros(batch, *input_shape)


# A real build decides only where the meta device cannot, and only this many bytes of weights
# (fp32: 256M parameters); a bigger model is let through, its run's own error naming a problem.
REAL_CHECK_MAX_WEIGHT_BYTES = 1 << 30
# A model this small at an input this small is checked by a real step at once (_small).
SMALL_CHECK_MAX_WEIGHT_BYTES = 16 << 20
SMALL_CHECK_MAX_INPUT = 3 * 64 * 64
# A refusal quotes torch's reason on one line, cut to this many characters.
_REASON_CHARS = 200


def check_model_trains(name: str, input_shape: tuple[int, int, int], num_classes: int, batch_size: int,
                       options: Mapping[str, int | None] | None = None) -> None:
    """Refuse, in one line naming the field, what cannot train at the run's input shape and
    per-worker batch; let through what trains and what this check cannot decide.

    The model is built with its weights on the meta device and run forward in training mode at
    the run's batch: an error there is the input's. Where the meta device cannot tell (the
    builder or the forward needs a tensor's data), a real build on the CPU runs forward and
    backward at up to 2 samples, if its weights fit REAL_CHECK_MAX_WEIGHT_BYTES. Batch norm
    after global pooling needs 2 samples: 1 that fails where 2 trains is refused as batch_size."""
    check_model_name(name)
    if is_gpt(name):  # option errors name their own field
        resolve_shape(name, {**(options or {}), "seq_len": input_shape[2]}, num_classes)
    failure = _training_failure(name, input_shape, num_classes, batch_size, options)
    if failure is None:
        return
    if batch_size < 2 and _training_failure(name, input_shape, num_classes, 2, options) is None:
        raise ValueError(f"batch_size: {name} cannot train on {batch_size} sample per worker "
                         f"(it trains at 2 and up): {failure}")
    raise ValueError(f"input_shape: {name} cannot take inputs of shape {input_shape}: {failure}")


def _training_failure(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                      options: Mapping[str, int | None] | None) -> str | None:
    """Why a training step at `batch` inputs of `input_shape` fails, in one line; None where it
    trains or where neither the meta device nor a bounded real build can tell. Asked once per
    process for each model, shape and batch: a grid's configurations share them."""
    return _failure(name, tuple(input_shape), num_classes, batch, tuple(sorted((options or {}).items())))


@lru_cache(maxsize=256)
def _failure(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
             option_items: tuple[tuple[str, int | None], ...]) -> str | None:
    options = dict(option_items) or None
    try:
        with _weights_on_meta():
            model = build_model(name, input_shape, num_classes, options)
    except ValueError as err:
        # ddlbench's own builders refuse a shape they cannot take, naming the field; another
        # builder's ValueError is about its options, which the run's own build names.
        return _one_line(err).removeprefix("input_shape: ") if str(err).startswith("input_shape:") else None
    except Exception:  # the builder needs a tensor's data; unsized, a real build could be too big
        return None
    if _small(model, input_shape):  # a real step costs less than the meta device's first use
        return _real_training_failure(name, input_shape, num_classes, min(batch, 2), options)
    model.to("meta").train()
    with torch.device("meta"):
        x = example_input(name, input_shape, batch)
    try:
        model(x)
        return None
    except Exception as err:
        if not _meta_cannot_tell(err):
            return _one_line(err)
    if sum(p.numel() * p.element_size() for p in model.parameters()) > REAL_CHECK_MAX_WEIGHT_BYTES:
        return None
    # A shape error shows at 2 samples as at more: 2 keeps the real step small (1 stays 1: batch norm).
    return _real_training_failure(name, input_shape, num_classes, min(batch, 2), options)


def _small(model: nn.Module, input_shape: tuple[int, int, int]) -> bool:
    """Whether a real step at 2 samples is cheap: a meta forward's first use imports torch's
    compiler stack (its Python reference kernels go through torch._dynamo), about a second,
    where such a model's real step takes milliseconds."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    most = min(SMALL_CHECK_MAX_WEIGHT_BYTES, REAL_CHECK_MAX_WEIGHT_BYTES)
    return weights <= most and math.prod(input_shape) <= SMALL_CHECK_MAX_INPUT


@contextmanager
def sizing_model(name: str, input_shape: tuple[int, int, int], num_classes: int,
                 options: Mapping[str, int | None] | None = None) -> Iterator[nn.Module | None]:
    """A model to size (its operations, its bytes) at a few samples of real data, where that is
    cheap (`_small`); None where it is not, and the caller sizes it on the meta device or fake
    tensors. The caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        try:
            with _weights_on_meta():
                small = _small(build_model(name, input_shape, num_classes, options), input_shape)
            model = build_model(name, input_shape, num_classes, options).train() if small else None
        except Exception:  # not buildable so: the caller's own path decides
            model = None
        yield model


@contextmanager
def _weights_on_meta() -> Iterator[None]:
    """While a builder runs, each parameter it registers moves to the meta device: weights take
    no memory and their initialisation no time, while the builder's own arithmetic stays real.
    Under torch.device("meta") that arithmetic is meta too, and a builder that reads it back
    (regnet computes its widths with tensors) fails. The patch is process-wide while it lasts."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            param = nn.Parameter(param.to("meta"), param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _meta_cannot_tell(err: Exception) -> bool:
    """Whether a meta forward's error is the meta device's, not the input's: an op without a meta
    kernel raises NotImplementedError, one that needs data or mixes devices names meta; shape
    checks raise RuntimeError, ValueError (batch norm), AssertionError (ViT) or IndexError."""
    if isinstance(err, NotImplementedError) or "meta" in str(err).lower():
        return True
    return not isinstance(err, (RuntimeError, ValueError, AssertionError, IndexError))


def _real_training_failure(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                           options: Mapping[str, int | None] | None) -> str | None:
    """A real forward and backward in training mode; the caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        try:
            model = build_model(name, input_shape, num_classes, options).train()
        except Exception:  # not the input's: the run's own build names it
            return None
        try:
            logits_of(model(example_input(name, input_shape, batch))).float().sum().backward()
        except (MemoryError, torch.OutOfMemoryError):
            return None
        except Exception as err:  # whatever fails at the run's input is the input's
            return _one_line(err)
    return None


def _one_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    line = lines[0].strip() if lines else type(err).__name__
    return line if len(line) <= _REASON_CHARS else line[:_REASON_CHARS - 3] + "..."


def logits_of(output: torch.Tensor | tuple) -> torch.Tensor:
    """Some torchvision models return named tuples in training mode."""
    if isinstance(output, torch.Tensor):
        return output
    return output[0]
