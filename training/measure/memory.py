"""Memory per rank after warm-up: summary.json's `memory` (DESIGN §4).

CUDA: the caching allocator's own peak of allocated and reserved bytes, its peak reset when
warm-up ends. CPU keeps no such count, so the peak of live tensor bytes is counted from the
objects that hold them:
- the state a rank holds from one iteration to the next, as its strategy (training/algorithms.py)
  or shard (training/ps.py) names it: parameters, gradients, optimizer state and buffers (the
  module's own, and communication's: DDP's buckets, a worker's flat PS buffers, OD-SGD's global
  copy, a shard's aggregation buffers), each storage once (by `untyped_storage().data_ptr()`),
  in the first category that names it;
- the activations autograd saves for backward, seen by `torch.autograd.graph.saved_tensors_hooks`
  in the forward of the iterations the layer timer samples (training/measure/layer_timing.py), each
  storage once and none of the state's.
A rank's peak is its state plus its largest saved activations: the moment its forward (and the
loss) has ended and its backward not yet freed anything. The process's peak RSS stands beside it.
On CUDA the breakdown is counted the same way, each tensor wherever it lives (a PS worker's
flat buffers are pinned host memory), and the peak is the device allocator's.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.measure.layer_timing import sampled
from training.models import build_model, example_input, logits_of, sizing_model

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")
_STATE = ("parameters", "gradients", "optimizer", "buffers")

_Key = tuple[str, int | None, int]


# Set while a model is sized with fake tensors (`fake_memory`): their storages have no address,
# and their own objects' addresses tell them apart while they live.
_FAKE = False


def _key(t: torch.Tensor) -> _Key:
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage._cdata if _FAKE else storage.data_ptr())


@dataclass
class HeldState:
    """The tensors a rank holds from one iteration to the next, by category."""

    parameters: list[torch.Tensor]
    gradients: list[torch.Tensor | None] = field(default_factory=list)  # None: not held now
    optimizer: list[torch.Tensor] = field(default_factory=list)
    buffers: list[torch.Tensor] = field(default_factory=list)
    # Buffers whose tensors Python cannot reach: DDP's buckets live in its C++ reducer.
    opaque_buffer_bytes: int = 0

    def count(self) -> tuple[dict[str, int], set[_Key]]:
        """Bytes per category, each storage counted once, in the first category that names it,
        and the storages counted."""
        seen: set[_Key] = set()
        out: dict[str, int] = {}
        for category in _STATE:
            n = 0
            for t in getattr(self, category):
                if t is None or (k := _key(t)) in seen:
                    continue
                seen.add(k)
                n += t.untyped_storage().nbytes()
            out[category] = n
        out["buffers"] += self.opaque_buffer_bytes
        return out, seen


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """An optimizer's state tensors (SGD's momentum buffers, made by its first step)."""
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def ddp_bucket_bytes(ddp: torch.nn.parallel.DistributedDataParallel) -> int:
    """The bytes of DDP's gradient buckets, as DDP's own logging data sizes them."""
    sizes = ddp._get_ddp_logging_data().get("bucket_sizes", "")
    return sum(int(s) for s in str(sizes).split(",") if s.strip())


def peak_rss_bytes() -> int:
    """The process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


class ActivationCounter:
    """The bytes of the distinct storages autograd saves for backward inside `counting(held)`,
    none of the state `held` names. The state is named as the forward begins and each saved
    storage judged as it is saved, while both live: after the backward frees the activations,
    a gradient or an optimizer buffer may take a freed one's address."""

    def __init__(self) -> None:
        self.saved: dict[_Key, int] = {}
        self.held: set[_Key] = set()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if (key := _key(t)) not in self.held:
            self.saved.setdefault(key, t.untyped_storage().nbytes())
        return t

    @contextmanager
    def counting(self, held: set[_Key]) -> Iterator[None]:
        self.saved, self.held = {}, held
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
            yield

    def bytes(self) -> int:
        return sum(self.saved.values())


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


# The allocator events a CUDA memory snapshot keeps (torch's own default): the latest ones.
SNAPSHOT_ENTRIES = 100_000


class MemoryMeter:
    """One worker's memory: `forward(t, steps)` around each forward, `collect()` after each
    backward, `result(...)` at the end.

    The iterations sampled are the layer timer's (every `every`-th from `warmup` on), or the last
    one where none of those comes; CUDA's peak is reset at the first measured iteration, where
    the allocator's history starts if a `snapshot` file is asked for (written by `result`)."""

    def __init__(self, device: torch.device, held: Callable[[], HeldState], every: int, warmup: int,
                 snapshot: Path | None = None) -> None:
        self.device, self.held, self.every, self.warmup, self.snapshot = device, held, every, warmup, snapshot
        self.cuda = device.type == "cuda"
        self.counter = ActivationCounter()
        self.state = dict.fromkeys(_STATE, 0)
        self.activations: int | None = None  # None: no iteration sampled yet
        self._counted = False

    @contextmanager
    def forward(self, step: int, steps: int) -> Iterator[None]:
        """Around iteration `step`'s forward and loss: its saved activations counted if sampled."""
        if self.cuda and step == min(self.warmup, steps - 1):
            torch.cuda.reset_peak_memory_stats(self.device)
            if self.snapshot is not None:
                torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
        if not (sampled(step, self.every, self.warmup) or (step == steps - 1 and self.activations is None)):
            yield
            return
        with self.counter.counting(self._look()):
            yield
        self._counted = True

    def collect(self) -> None:
        """After a sampled iteration's backward (its gradients held): the state and activations."""
        if not self._counted:
            return
        self._counted = False
        self._look()
        self.activations = max(self.activations or 0, self.counter.bytes())

    def _look(self) -> set[_Key]:
        counts, held = self.held().count()
        self.state = {k: max(v, counts[k]) for k, v in self.state.items()}
        return held

    def result(self, rank: int, role: str) -> dict[str, Any]:
        """This rank's figures, after one more look at the state (optimizer state made late)."""
        self._look()
        if self.cuda and self.snapshot is not None:
            torch.cuda.memory._dump_snapshot(str(self.snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
        return rank_figures(rank, role, self.device, self.state, self.activations or 0)


def rank_figures(rank: int, role: str, device: torch.device, state: dict[str, int],
                 activations: int) -> dict[str, Any]:
    """A rank's entry of summary.json's `memory.ranks` (and its CUDA reserved peak)."""
    breakdown = {c: activations if c == "activations" else state[c] for c in CATEGORIES}
    cuda = device.type == "cuda"
    return {
        "rank": rank,
        "role": role,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else sum(breakdown.values()),
        "peak_rss_bytes": peak_rss_bytes(),
        "reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
        "breakdown": breakdown,
    }


def held_figures(rank: int, role: str, held: HeldState) -> dict[str, Any]:
    """The figures of a rank with no forward (a parameter-server shard): its state alone."""
    counts, _ = held.count()
    return rank_figures(rank, role, torch.device("cpu"), counts, 0)


RANK_KEYS = ("rank", "role", "peak_bytes", "peak_rss_bytes", "breakdown")


def summarise(per_rank: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `memory`: the figures of the rank with the largest peak, and every rank's."""
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    top = max(ranks, key=lambda r: r["peak_bytes"])
    return {
        "peak_bytes": top["peak_bytes"],
        "peak_rss_bytes": top["peak_rss_bytes"],
        "reserved_bytes": top["reserved_bytes"],
        "breakdown": top["breakdown"],
        "ranks": [{k: r[k] for k in RANK_KEYS} for r in ranks],
    }


def model_memory(net: torch.nn.Module, batch_of: Callable[[int], tuple[torch.Tensor, torch.Tensor | None]],
                 batch: int) -> dict[str, Any]:
    """A model's own memory figures, the profile's `memory` (modelling/memory.py predicts from
    them): its parameters, gradients and module buffers, counted as the trainer counts them, and
    the bytes its forward and loss save for backward at `batch` and at half of it, as fixed plus
    per-sample bytes. `batch_of(n)` gives n samples on the model's device, the targets None where
    any will do (class 0 of every output: a model of fake tensors, sized without memory)."""
    import torch.nn.functional as F

    trainable = [p for p in net.parameters() if p.requires_grad]
    state = HeldState(parameters=list(net.parameters()), buffers=list(net.buffers()))
    counts, held = state.count()
    batches = sorted({max(1, batch // 2), batch})
    saved = []
    counter = ActivationCounter()
    for n in batches:
        x, y = batch_of(n)
        with counter.counting(held):
            logits = logits_of(net(x))
            if y is None:  # (batch, classes, ...) -> (batch, ...)
                y = torch.zeros(logits.shape[:1] + logits.shape[2:], dtype=torch.long, device=logits.device)
            loss = F.cross_entropy(logits, y)
        saved.append(counter.bytes())
        del loss, logits
    per_sample = (saved[-1] - saved[0]) / (batches[-1] - batches[0]) if len(batches) > 1 else saved[0] / batch
    return {
        "parameter_bytes": counts["parameters"],
        "gradient_bytes": sum(p.numel() * p.element_size() for p in trainable),
        "trainable_numel": sum(p.numel() for p in trainable),
        "buffer_bytes": counts["buffers"],
        "activations": {"batches": batches, "saved_bytes": saved, "per_sample_bytes": per_sample,
                        "fixed_bytes": saved[-1] - per_sample * batches[-1]},
    }


# A small model is sized on this many real samples and half of it: its saved bytes are fixed
# plus per sample (model_memory's two batches), so two small batches tell the run's.
SIZING_SAMPLES = 4


def size_memory(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                options: dict[str, int | None] | None = None) -> dict[str, Any] | None:
    """model_memory before anything runs (pipelines/preflight.py): on a few real samples where
    the model is small (training/models.py `sizing_model`: milliseconds), else on fake tensors
    (`fake_memory`); None where the model can run neither way."""
    with sizing_model(name, input_shape, num_classes, options) as small:
        if small is not None:
            try:
                return model_memory(small, lambda n: (example_input(name, input_shape, n), None),
                                    min(batch, SIZING_SAMPLES))
            except (RuntimeError, ValueError):  # batch norm at 1 sample: the fake tensors decide
                pass
    return fake_memory(name, input_shape, num_classes, batch, options)


def fake_memory(name: str, input_shape: tuple[int, int, int], num_classes: int, batch: int,
                options: dict[str, int | None] | None = None) -> dict[str, Any] | None:
    """model_memory of a model built and run on fake CPU tensors (no memory, no time; the first
    use imports torch's compiler stack, about a second); None where the model cannot run so.
    Fake tensors, not the meta device: they dispatch as a CPU tensor does (attention takes the
    CPU's fused kernel, which saves less than the meta device's reference one)."""
    global _FAKE
    from torch._subclasses.fake_tensor import FakeTensorMode

    _FAKE = True
    try:
        with FakeTensorMode():
            net = build_model(name, input_shape, num_classes, options)
            return model_memory(net, lambda n: (example_input(name, input_shape, n), None), batch)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return None
    finally:
        _FAKE = False
