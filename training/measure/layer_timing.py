"""In-situ per-layer compute: forward and backward time of every parameter-owning layer,
sampled inside training every k-th iteration, written as a layer table (layers.json's format)
to the run directory as `layers_insitu.json`.

A sampled iteration registers hooks for its forward and backward only (none stay on the
others): a forward hook stamps the end of each layer's forward, a post-accumulate-grad hook
the moment each of its gradients is ready, as the profiler does (modelling/measure/profiler.py), so a
layer is charged the time since the previous stamp and parameter-free work lands on the next
layer that owns parameters. On CUDA the stamps are CUDA events, read after the iteration's own
synchronisation, so sampling adds no synchronisation of its own.

On a CPU rank with one intra-op thread each stamp also reads the thread's CPU clock, and the
table carries each layer's CPU seconds (`fwd_cpu_s`, `bwd_cpu_s`) and the update's
(`update_cpu_s`, read by the timeline on every iteration). Where other work shares the
cores, the scheduler takes the rank off its core in slices of milliseconds, as long as a small
model's layers: the wall time of the layer that was running when it did grows by the whole slice,
so the layers' shares of the wall time move with the host's load, while their CPU seconds are
the work the layer did (docs/regression.md, "Components"). With more intra-op threads the
calling thread's clock misses the pool's work, and CUDA kernels run off the host: no CPU seconds.

The sampled iterations give each layer's share of the pass; the totals are the run's own
median forward and backward over every measured iteration of the rank's timeline, which the
trainer records anyway. The DAG fed with this table predicts what the model itself gets wrong,
with the drift between a separate profile and the run taken out (the "model error").
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.measure.device_timer import timer_for

INSITU_FILE = "layers_insitu.json"
EVERY_ENV = "DDLBENCH_LAYER_TIMING_EVERY"
DEFAULT_EVERY = 10


def sampling_every() -> int:
    """k: every k-th measured iteration is sampled (0: none). The environment's value, so a
    benchmark can run the same job with and without sampling."""
    raw = os.environ.get(EVERY_ENV, "")
    try:
        return max(int(raw), 0) if raw else DEFAULT_EVERY
    except ValueError:
        raise ValueError(f"{EVERY_ENV}: expected a whole number of iterations, got {raw!r}") from None


def sampled(step: int, every: int, warmup: int) -> bool:
    """Whether iteration `step` is sampled: every `every`-th from `warmup` on (`every` 0: none).
    The memory meter (training/measure/memory.py) samples the same iterations."""
    return bool(every) and step >= warmup and (step - warmup) % every == 0


class LayerTimer:
    """Samples per-layer forward/backward time of `net` every `every`-th iteration from `warmup` on."""

    def __init__(self, net: nn.Module, device: torch.device, every: int, warmup: int) -> None:
        self.every, self.warmup = every, warmup
        self.timer = timer_for(device)  # CUDA events on a GPU (training/measure/device_timer.py)
        self.cuda = self.timer.cuda
        self.names = {m: n for n, m in net.named_modules()}
        self.owners = [m for m in net.modules() if any(True for _ in m.parameters(recurse=False))]
        # The calling thread's CPU clock beside each stamp, where it holds all of a layer's work.
        self.cpu_clock = not self.cuda and torch.get_num_threads() == 1
        self.samples: list[dict[nn.Module, tuple[float, float]]] = []
        self.cpu_samples: list[dict[nn.Module, tuple[float, float]]] = []
        self.out_bytes: dict[nn.Module, int] = {}
        self._handles: list[Any] = []
        self._fwd: list[tuple[nn.Module, Any]] = []
        self._bwd: list[tuple[nn.Module, Any]] = []
        self._start: Any = None
        self._bstart: Any = None

    def _stamp(self) -> Any:
        """The device stamp, and the thread's CPU clock with it where it is read."""
        return (self.timer.stamp(), time.thread_time()) if self.cpu_clock else (self.timer.stamp(), 0.0)

    def _elapsed(self, a: Any, b: Any) -> float:
        return self.timer.elapsed(a[0], b[0])

    def arm(self, step: int) -> None:
        """Before the forward of `step`: hooks on, if this iteration is sampled."""
        if not sampled(step, self.every, self.warmup):
            return
        self._fwd, self._bwd = [], []

        def on_forward(module: nn.Module, _inputs: Any, output: Any) -> None:
            self._fwd.append((module, self._stamp()))
            if module not in self.out_bytes and hasattr(output, "numel"):
                self.out_bytes[module] = output.numel() * output.element_size()

        for m in self.owners:
            self._handles.append(m.register_forward_hook(on_forward))
            for p in m.parameters(recurse=False):
                if p.requires_grad:
                    self._handles.append(
                        p.register_post_accumulate_grad_hook(lambda _p, m=m: self._bwd.append((m, self._stamp())))
                    )
        self._start = self._stamp()

    def backward(self) -> None:
        """Right before loss.backward(): the end of the forward (the loss included) and the start of the backward."""
        if self._handles:
            self._bstart = self._stamp()

    def collect(self) -> None:
        """After the iteration (the device synchronised): hooks off, the sample kept."""
        if not self._handles:
            return
        for h in self._handles:
            h.remove()
        self._handles = []
        self.timer.settle()
        self.samples.append(self._charge(self._elapsed))
        if self.cpu_clock:
            self.cpu_samples.append(self._charge(lambda a, b: b[1] - a[1]))

    def _charge(self, elapsed: Any) -> dict[nn.Module, tuple[float, float]]:
        """Each layer's forward and backward of the sampled iteration, by the clock `elapsed` reads."""
        fwd: dict[nn.Module, float] = {}
        bwd: dict[nn.Module, float] = {}
        prev = self._start
        for m, s in self._fwd:
            fwd[m] = fwd.get(m, 0.0) + elapsed(prev, s)
            prev = s
        if self._fwd:  # the loss, as the profiler charges it: to the last layer
            last = self._fwd[-1][0]
            fwd[last] += elapsed(prev, self._bstart)
        prev = self._bstart
        for m, s in self._bwd:
            bwd[m] = bwd.get(m, 0.0) + elapsed(prev, s)
            prev = s
        return {m: (fwd.get(m, 0.0), bwd.get(m, 0.0)) for m in fwd}

    def table(self, records: list[dict[str, Any]], model: str, batch_size: int) -> dict[str, Any] | None:
        """The in-situ layer table: each layer's median share of the sampled passes, scaled to the
        rank's median forward and backward over its measured iterations (`records`, its timeline)."""
        measured = [r for r in records if r["step"] >= self.warmup and "forward" in r["phases"]]
        if not self.samples or not measured:
            return None

        def span(r: dict[str, Any], phase: str) -> float:
            s = r["phases"].get(phase)
            return s[1] - s[0] if s else 0.0

        order = list(dict.fromkeys(m for m, _ in self._fwd))  # execution order, as the profiler lists it
        med_f = {m: statistics.median(s[m][0] for s in self.samples if m in s) for m in order}
        med_b = {m: statistics.median(s[m][1] for s in self.samples if m in s) for m in order}
        forward = statistics.median(span(r, "forward") for r in measured)
        backward = statistics.median(span(r, "backward") for r in measured)
        kf = forward / sum(med_f.values()) if sum(med_f.values()) > 0 else 1.0
        kb = backward / sum(med_b.values()) if sum(med_b.values()) > 0 else 1.0
        rows = []
        for m in order:
            ps = list(m.parameters(recurse=False))
            rows.append({
                "name": self.names[m] or type(m).__name__,
                "type": type(m).__name__,
                "fwd_s": med_f[m] * kf,
                "bwd_s": med_b[m] * kb,
                "param_bytes": sum(p.numel() * p.element_size() for p in ps),
                "param_tensor_bytes": [p.numel() * p.element_size() for p in ps],
                "output_bytes": self.out_bytes.get(m, 0),
            } | self._cpu_row(m))
        return {
            "model": model,
            "batch_size": batch_size,
            "device": "cuda" if self.cuda else "cpu",
            "source": "in situ",
            "layers": rows,
            "data_s": statistics.median(span(r, "data") for r in measured),
            # The worker's update phase: the optimizer step under allreduce, loading the pulled
            # weights under a parameter server (the profile's unpack); kept as measured.
            "update_s": statistics.median(span(r, "update") for r in measured),
            **self._cpu_update(measured),
            # Whole-iteration compute of every measured iteration (data, forward, backward): the
            # run's own jitter, which a barrier waits for.
            "iteration_samples_s": [span(r, "data") + span(r, "forward") + span(r, "backward") for r in measured],
            "sampled_iterations": len(self.samples),
            "sampling_every": self.every,
            "measured_iterations": len(measured),
        }

    def _cpu_row(self, m: nn.Module) -> dict[str, float]:
        """The layer's median CPU seconds over the sampled passes, unscaled (none without the clock)."""
        if not self.cpu_samples:
            return {}
        return {"fwd_cpu_s": statistics.median(s[m][0] for s in self.cpu_samples if m in s),
                "bwd_cpu_s": statistics.median(s[m][1] for s in self.cpu_samples if m in s)}

    def _cpu_update(self, measured: list[dict[str, Any]]) -> dict[str, float]:
        """The update phase's median CPU seconds, where the timeline read the clock for it."""
        cpu = [r["cpu_s"]["update"] for r in measured if "update" in r.get("cpu_s", {})]
        return {"update_cpu_s": statistics.median(cpu)} if self.cpu_clock and cpu else {}

    def write(self, out: Path, records: list[dict[str, Any]], model: str, batch_size: int) -> Path | None:
        table = self.table(records, model, batch_size)
        if table is None:
            return None
        path = out / INSITU_FILE
        path.write_text(json.dumps(table, indent=2))
        return path
