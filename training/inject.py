"""Injected slowdowns, each in one component class, to test the regression alarm.

`train.inject_delay_ms` slows every iteration of a worker by that long; `train.inject_where`
says which component spends it, so that a check of one component (a phase of the timeline, a
row of the in-situ layer table) sees it where a real regression of that component would be:

- `data`: at the end of the data phase, a sleep (CPU work with `inject_busy`);
- `compute`: after every leaf module's forward, and as its backward begins, each its share of
  the previous iteration's measured compute, as a slower kernel library would;
- `layer:<name>`: in one module of `model.named_modules()`, half after its forward and half as
  its backward begins;
- `update`: at the end of the worker's update phase.

All but `data` are CPU work of the rank's thread, whatever `inject_busy` says: a slower kernel
is more work, not a wait. A layer's backward share is spent as its backward begins (the gradient
of its output ready) rather than after it, so that what times a layer by stamps (the in-situ
table, the profiler) charges it to that layer. A delay of 0 installs nothing.
"""

from __future__ import annotations

import difflib
import time
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from training.config import INJECT_LAYER, TrainConfig
from training.measure.timeline import Timeline
from training.models import build_model
from training.shape import resolve_input_shape
from training.text import corpus_vocab


def spin(seconds: float) -> None:
    """Spend `seconds` of this thread's CPU time: work, as a slower kernel is, not a wait."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def inject_delay(seconds: float, busy: bool) -> None:
    """Slow the iteration by `seconds`: a sleep, or as much CPU time of this thread spent spinning.
    A code regression is more work on the rank's core; where ranks share cores, a sleep instead
    hands the core to the others, which then run faster, so the iteration slows by less."""
    if busy:
        spin(seconds)
    else:
        time.sleep(seconds)


def layer_name(where: str) -> str | None:
    """The module an `inject_where` of `layer:<name>` names; None for a component class."""
    return where.removeprefix(INJECT_LAYER) if where.startswith(INJECT_LAYER) else None


def find_module(net: nn.Module, name: str, model: str) -> nn.Module:
    """The module `name` of `net`, or a ValueError naming inject_where and a few names that exist."""
    modules = dict(net.named_modules())
    if name in modules:
        return modules[name]
    names = [n for n in modules if n]
    few = difflib.get_close_matches(name, names, n=5, cutoff=0.5) or names[:8]
    more = ", ..." if len(names) > len(few) else ""
    raise ValueError(f"inject_where: {model} has no module {name!r}; its modules include "
                     f"{', '.join(few)}{more} (a name of model.named_modules())")


def check_where(cfg: TrainConfig) -> None:
    """Refuse a `layer:` naming no module of the model, before any process starts. The model is
    built on the meta device; a builder that cannot build there leaves the check to the rank."""
    name = layer_name(cfg.inject_where)
    if name is None:
        return
    try:
        with torch.device("meta"):
            net = build_model(cfg.model, resolve_input_shape(cfg), cfg.num_classes or corpus_vocab(cfg.dataset),
                              cfg.model_options)
    except Exception:  # noqa: BLE001 - the builder needs real tensors: the rank's build checks the name
        return
    find_module(net, name, cfg.model)


def install(cfg: TrainConfig, net: nn.Module, timeline: Timeline) -> None:
    """Put the configured slowdown in place on a worker: in its timeline's data or update phase,
    or as hooks on `net`'s modules."""
    if not cfg.inject_delay_ms:
        return
    seconds = cfg.inject_delay_ms / 1e3
    where = cfg.inject_where
    if where == "data":
        timeline.slowdowns["data"] = lambda: inject_delay(seconds, busy=cfg.inject_busy)
    elif where == "update":
        timeline.slowdowns["update"] = lambda: spin(seconds)
    elif where == "compute":
        ComputeSlowdown(net, seconds)
    else:
        LayerSlowdown(find_module(net, layer_name(where) or "", cfg.model), seconds)


def _grad_output(output: Any) -> torch.Tensor | None:
    """The output tensor whose gradient starts a module's backward (None: it has none)."""
    tensors = output if isinstance(output, (tuple, list)) else (output,)
    return next((t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad), None)


class ComputeSlowdown:
    """`seconds` an iteration spread over the leaf modules' forward and backward passes.

    Each leaf's forward is timed between its forward pre- and post-hooks; its backward from the
    gradient of its output (a hook on that tensor) to the next such gradient, or to the end of
    the backward pass (an autograd engine callback, queued before DDP's so that the wait for its
    last buckets is not compute). The injected work is left out of the times. An iteration
    spends, in each layer's forward and backward, `seconds` times that layer-phase's share of
    the previous iteration's measured compute; the first iteration only measures. Forwards
    without gradients (an evaluation) are neither timed nor slowed."""

    def __init__(self, net: nn.Module, seconds: float) -> None:
        self.seconds = seconds
        self.shares: dict[tuple[nn.Module, str], float] = {}  # the previous iteration's
        self.times: dict[tuple[nn.Module, str], float] = defaultdict(float)  # this iteration's
        self._started = 0.0
        self._open: nn.Module | None = None  # the module whose backward is running
        self._since = 0.0
        self._in_backward = False
        for m in net.modules():
            if next(m.children(), None) is None:
                m.register_forward_pre_hook(self._before_forward)
                m.register_forward_hook(self._after_forward)

    def _before_forward(self, _m: nn.Module, _inputs: Any) -> None:
        self._started = time.perf_counter()

    def _after_forward(self, m: nn.Module, _inputs: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        self.times[m, "forward"] += time.perf_counter() - self._started
        spin(self.seconds * self.shares.get((m, "forward"), 0.0))
        out = _grad_output(output)
        if out is not None:
            out.register_hook(lambda _grad, m=m: self._backward_begins(m))

    def _backward_begins(self, m: nn.Module) -> None:
        if self._in_backward:
            self._close()
        else:
            self._in_backward = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ends)
        spin(self.seconds * self.shares.get((m, "backward"), 0.0))
        self._open, self._since = m, time.perf_counter()

    def _close(self) -> None:
        if self._open is not None:
            self.times[self._open, "backward"] += time.perf_counter() - self._since
            self._open = None

    def _backward_ends(self) -> None:
        self._close()
        self._in_backward = False
        total = sum(self.times.values())
        self.shares = {k: v / total for k, v in self.times.items()} if total > 0 else {}
        self.times = defaultdict(float)


class LayerSlowdown:
    """`seconds` an iteration in one module: half after its first forward of the iteration, half
    as that call's backward begins. A module whose output needs no gradient has no backward and
    spends all of it in its forward."""

    def __init__(self, module: nn.Module, seconds: float) -> None:
        self.seconds = seconds
        self._spent_forward = False  # this iteration's forward half is spent; its backward's is due
        module.register_forward_hook(self._after_forward)

    def _after_forward(self, _m: nn.Module, _inputs: Any, output: Any) -> None:
        if not torch.is_grad_enabled() or self._spent_forward:
            return
        out = _grad_output(output)
        if out is None:
            spin(self.seconds)
            return
        spin(self.seconds / 2)
        self._spent_forward = True
        out.register_hook(self._backward_begins)

    def _backward_begins(self, _grad: torch.Tensor) -> None:
        spin(self.seconds / 2)
        self._spent_forward = False
