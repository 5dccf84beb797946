"""Datasets by name, and the seeded global batch order every worker shares.

A data source hands out batches by index, already adapted (channels, size) to
the model's input shape. The sampler cuts one seeded permutation per epoch into
global batches of N*b samples and gives worker k the k-th slice, so N workers
at batch b see exactly what one process at batch N*b sees.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

from infra import bounds
from training.gpt_shape import GPT_PRESETS, is_gpt
from training.text import TEXT_DATASETS, TokenSource, load_text

Shape = tuple[int, int, int]

# Held-out split of the bundled digits: fixed, independent of the training seed.
_DIGITS_TEST_FRACTION = 0.2
_DIGITS_SPLIT_SEED = 1234


def adapt(x: torch.Tensor, shape: Shape) -> torch.Tensor:
    """Convert a float batch (B,C,H,W) to the model's channels and size."""
    c, h, w = shape
    if x.shape[1] != c:
        if x.shape[1] == 1:
            x = x.expand(-1, c, -1, -1)
        elif c == 1:
            x = x.mean(dim=1, keepdim=True)
        else:
            raise ValueError(f"input_shape: cannot map {x.shape[1]} channels to {c}")
    if tuple(x.shape[2:]) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
    return x.contiguous()


class TensorSource:
    """An in-memory split: images (uint8 or float in [0, 1]) and labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, num_classes: int, shape: Shape):
        self.images, self.labels = images, labels.long()
        self.num_classes = num_classes
        self.shape = shape

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[indices]
        x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
        return adapt(x, self.shape), self.labels[indices]


class ImageFolderSource:
    """A split read lazily from an image folder (one sub-folder per class)."""

    def __init__(self, root: Path, shape: Shape):
        import torchvision
        from torchvision.transforms import v2

        tf = v2.Compose([v2.PILToTensor(), v2.Resize(shape[1:], antialias=True)])
        self.folder = torchvision.datasets.ImageFolder(str(root), transform=tf)
        self.labels = torch.tensor(self.folder.targets)
        self.num_classes = len(self.folder.classes)
        self.shape = shape

    def __len__(self) -> int:
        return len(self.folder)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.stack([self.folder[int(i)][0] for i in indices]).float().div_(255.0)
        return adapt(x, self.shape), self.labels[indices]


def _synthetic(cfg, shape: Shape) -> tuple[TensorSource, TensorSource, Shape]:
    # A fixed random linear teacher labels the inputs, so the task is learnable.
    classes = cfg.num_classes or 10
    g = torch.Generator().manual_seed(cfg.seed + 7919)
    n_test = max(cfg.synthetic_samples // 8, 16)
    x = torch.rand(cfg.synthetic_samples + n_test, *shape, generator=g)
    teacher = torch.randn(x[0].numel(), classes, generator=g)
    y = (x.flatten(1) - 0.5).matmul(teacher).argmax(dim=1)
    train = TensorSource(x[n_test:], y[n_test:], classes, shape)
    return train, TensorSource(x[:n_test], y[:n_test], classes, shape), shape


class LearnableSource:
    """The `synthetic-learnable` task: 10 (or num_classes) Gaussian classes at CIFAR shape.

    Class c has a smooth template m_c (seeded 3x4x4 noise, upsampled bilinearly to 32x32,
    scaled to an RMS of `_LEARNABLE_AMPLITUDE` per pixel); sample i is label y_i = i mod K and
    x_i = 0.5 + m_{y_i} + `_LEARNABLE_NOISE` * eps_i, eps_i standard normal, drawn from a
    generator seeded by (task seed, i). The task is fixed (the job's seed changes the data
    order and the init, not the data) and nothing is held in memory: any number of samples.
    The classes share an isotropic covariance, so the Bayes classifier is linear
    (`bayes_predict`); its accuracy, `LEARNABLE_BAYES_ACCURACY`, is what a model can reach.
    """

    def __init__(self, num_classes: int, samples: int, offset: int, shape: Shape, cache: bool = False) -> None:
        self.num_classes, self.n, self.offset, self.shape = num_classes, samples, offset, shape
        g = torch.Generator().manual_seed(_LEARNABLE_SEED)
        low = torch.randn(num_classes, 3, 4, 4, generator=g)
        m = F.interpolate(low, size=(32, 32), mode="bilinear", align_corners=False)
        self.templates = m * (_LEARNABLE_AMPLITUDE / m.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt())
        self.labels = torch.arange(offset, offset + samples) % num_classes
        # The test split is evaluated again and again: drawn once, adapted once.
        self._cached: tuple[torch.Tensor, torch.Tensor] | None = None
        if cache:
            self._cached = self.batch(torch.arange(samples))

    def __len__(self) -> int:
        return self.n

    def native(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples at the native 3x32x32, before adapting to the model's input shape."""
        noise = torch.empty(len(indices), 3, 32, 32)
        for row, i in enumerate(indices.tolist()):
            g = torch.Generator().manual_seed(_LEARNABLE_SEED * 1_000_003 + self.offset + i)
            noise[row].normal_(generator=g)
        y = self.labels[indices]
        return 0.5 + self.templates[y] + _LEARNABLE_NOISE * noise, y

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cached is not None:
            return self._cached[0][indices], self._cached[1][indices]
        x, y = self.native(indices)
        return adapt(x, self.shape), y

    def bayes_predict(self, x: torch.Tensor) -> torch.Tensor:
        """The Bayes classifier on native samples: equal priors and one isotropic covariance,
        so argmax_c <x - 0.5, m_c> - |m_c|^2 / 2."""
        m = self.templates.flatten(1)
        return ((x.flatten(1) - 0.5) @ m.T - 0.5 * m.pow(2).sum(1)).argmax(dim=1)


# The learnable task: fixed, independent of the job's seed. Amplitude and noise set the
# Bayes accuracy (LEARNABLE_BAYES_ACCURACY: `bayes_predict` on 20k samples gave 0.933, on the
# 2000 test samples 0.93-0.94; an mlp reached 0.77 in 300 steps at batch 64, still rising).
_LEARNABLE_SEED = 2718
_LEARNABLE_AMPLITUDE = 0.06
_LEARNABLE_NOISE = 1.0
_LEARNABLE_TEST_OFFSET = 1 << 40  # test samples are drawn from their own index range
_LEARNABLE_TEST_SAMPLES = 2000
LEARNABLE_BAYES_ACCURACY = 0.933


def _learnable(cfg, shape: Shape) -> tuple[LearnableSource, LearnableSource, Shape]:
    classes = cfg.num_classes or 10
    return (
        LearnableSource(classes, cfg.synthetic_samples, 0, shape),
        LearnableSource(classes, _LEARNABLE_TEST_SAMPLES, _LEARNABLE_TEST_OFFSET, shape, cache=True),
        (3, 32, 32),
    )


@cache
def _digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits (its `load_digits`), read from the file it ships: importing
    scikit-learn takes seconds of every rank's start and of every preflight."""
    import gzip

    import numpy as np

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("dataset: digits needs scikit-learn, which ships it; install scikit-learn")
    with gzip.open(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz") as f:
        data = np.loadtxt(f, delimiter=",")
    return torch.tensor(data[:, :-1], dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(data[:, -1]).long()


def _digits_test_count(samples: int) -> int:
    return int(samples * _DIGITS_TEST_FRACTION)


def _digits(cfg, shape: Shape) -> tuple[TensorSource, TensorSource, Shape]:
    images, y = _digits_arrays()
    x = images / 16.0
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(_DIGITS_SPLIT_SEED))
    n_test = _digits_test_count(len(y))
    test, train = order[:n_test], order[n_test:]
    # Resize once: the whole set is tiny.
    x = adapt(x, shape)
    return (
        TensorSource(x[train], y[train], 10, shape),
        TensorSource(x[test], y[test], 10, shape),
        (1, 8, 8),
    )


def _torchvision_split(cfg, cls_name: str) -> Callable[[bool], object]:
    import torchvision

    cls = getattr(torchvision.datasets, cls_name)
    root = Path(cfg.data_root) if cfg.data_root else None

    def split(train: bool) -> object:
        if root is None:
            raise ValueError(f"data_root: {cfg.dataset} needs a local data root (--data-root)")
        try:
            return cls(str(root), train=train, download=cfg.download)
        except RuntimeError as err:
            raise ValueError(
                f"data_root: {cfg.dataset} not found under {root} ({err}); "
                "put the data there or pass --download"
            ) from None

    return split


def _mnist(cfg, shape: Shape) -> tuple[TensorSource, TensorSource, Shape]:
    split = _torchvision_split(cfg, "MNIST")
    tr, te = split(True), split(False)
    mk = lambda s: TensorSource(s.data.unsqueeze(1), s.targets, 10, shape)  # noqa: E731
    return mk(tr), mk(te), (1, 28, 28)


def _cifar10(cfg, shape: Shape) -> tuple[TensorSource, TensorSource, Shape]:
    split = _torchvision_split(cfg, "CIFAR10")
    tr, te = split(True), split(False)

    def mk(s) -> TensorSource:
        return TensorSource(torch.from_numpy(s.data).permute(0, 3, 1, 2), torch.tensor(s.targets), 10, shape)

    return mk(tr), mk(te), (3, 32, 32)


def _imagefolder(cfg, shape: Shape) -> tuple[ImageFolderSource, ImageFolderSource, Shape]:
    if cfg.data_root is None:
        raise ValueError("data_root: imagefolder needs a local data root with train/ and val/")
    root = Path(cfg.data_root)
    test_dir = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
    if not (root / "train").is_dir() or test_dir is None:
        raise ValueError(f"data_root: {root} must hold train/ and val/ (or test/) class folders")
    return ImageFolderSource(root / "train", shape), ImageFolderSource(test_dir, shape), (3, *shape[1:])


def _text(cfg, shape: Shape) -> tuple[TokenSource, TokenSource, Shape]:
    train, test = load_text(cfg, shape[2])
    return train, test, shape


DATASETS = {
    "synthetic": _synthetic,
    "synthetic-learnable": _learnable,
    "digits": _digits,
    "mnist": _mnist,
    "cifar10": _cifar10,
    "imagefolder": _imagefolder,
    "stdlib-text": _text,
    "markov": _text,
}
_NATIVE_SHAPE: dict[str, Shape] = {
    "digits": (1, 8, 8),
    "mnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "synthetic": (3, 32, 32),
    "synthetic-learnable": (3, 32, 32),
    "imagefolder": (3, 224, 224),
    # Token sequences (1, 1, seq_len): the length is the model's.
    "stdlib-text": (1, 1, 0),
    "markov": (1, 1, 0),
}


def native_shape(name: str) -> Shape:
    if name not in DATASETS:
        raise ValueError(f"dataset: unknown dataset {name!r}; use one of {', '.join(DATASETS)}")
    return _NATIVE_SHAPE[name]


def generated_bytes(cfg, shape: Shape) -> int:
    """Bytes a generated data set holds in memory at `shape` (0 for data read from files or
    drawn on demand): what `synthetic_samples` costs every rank."""
    values = shape[0] * shape[1] * shape[2]
    if cfg.dataset == "synthetic":
        return (cfg.synthetic_samples + max(cfg.synthetic_samples // 8, 16)) * values * 4
    if cfg.dataset == "synthetic-learnable":
        return _LEARNABLE_TEST_SAMPLES * values * 4
    if cfg.dataset == "markov":
        return (cfg.synthetic_samples + 1024) * (shape[2] + 1) * 8  # its test split: at most 1024 sequences
    return 0


def check_generated_size(cfg, shape: Shape) -> None:
    """ValueError naming the field when a generated data set would not fit its bound."""
    held, most = generated_bytes(cfg, shape), bounds.data_bytes()
    if held > most.limit:
        field = "input_shape" if cfg.dataset == "synthetic-learnable" else "synthetic_samples"
        raise ValueError(f"{field}: {cfg.synthetic_samples:,} samples of {cfg.dataset} at input_shape {tuple(shape)} "
                         f"take {held / 2**30:,.1f} GiB, above the bound of {most.limit / 2**30:,.1f} GiB "
                         f"({most.reason})")


def train_samples(cfg, shape: Shape) -> int:
    """Samples of the training split, without generating a generated data set."""
    if cfg.dataset in ("synthetic", "synthetic-learnable", "markov"):
        check_generated_size(cfg, shape)
        return cfg.synthetic_samples
    if cfg.dataset == "digits":  # counted without resizing every image to the model's input
        samples = len(_digits_arrays()[1])
        return samples - _digits_test_count(samples)
    return len(load_dataset(cfg, shape)[0])


def load_dataset(cfg, shape: Shape):
    """(train, test) sources for `cfg.dataset`, adapted to `shape`."""
    native_shape(cfg.dataset)
    check_generated_size(cfg, shape)
    train, test, _ = DATASETS[cfg.dataset](cfg, shape)
    return train, test


def check_dataset(cfg) -> None:
    """Fail early, naming the option, when the data cannot be found or does not suit the model."""
    native_shape(cfg.dataset)
    if is_gpt(cfg.model) != (cfg.dataset in TEXT_DATASETS):
        text = ", ".join(TEXT_DATASETS)
        if is_gpt(cfg.model):
            raise ValueError(f"dataset: {cfg.model} is a language model; train it on {text}, not {cfg.dataset}")
        raise ValueError(f"dataset: {cfg.dataset} holds token sequences, for a language model "
                         f"({', '.join(GPT_PRESETS)}), not {cfg.model}")
    if cfg.dataset in ("mnist", "cifar10", "imagefolder"):
        if cfg.data_root is None:
            raise ValueError(f"data_root: {cfg.dataset} needs a local data root (--data-root)")
        if not Path(cfg.data_root).is_dir() and not cfg.download:
            raise ValueError(f"data_root: {cfg.data_root} does not exist (pass --download to fetch {cfg.dataset})")
        if cfg.dataset != "imagefolder" and not cfg.download:
            load_dataset(cfg, _NATIVE_SHAPE[cfg.dataset])
        if cfg.dataset == "imagefolder":
            _imagefolder(cfg, _NATIVE_SHAPE["imagefolder"])


class GlobalBatchSampler:
    """Seeded global batches of workers*batch_size samples; worker k takes slice k."""

    def __init__(self, n: int, workers: int, batch_size: int, seed: int):
        self.global_batch = workers * batch_size
        if n < self.global_batch:
            raise ValueError(
                f"batch_size: a global batch of {self.global_batch} exceeds the {n} training samples"
            )
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.steps_per_epoch = n // self.global_batch
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def indices(self, step: int, rank: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._perm, self._epoch = torch.randperm(self.n, generator=g), epoch
        start = pos * self.global_batch + rank * self.batch_size
        return self._perm[start : start + self.batch_size]
