"""The update algorithms: each a small strategy for what happens between the
end of backward and the next forward (DESIGN §2).

A strategy owns the model wrapper, the optimizer and the communication. The
trainer calls `step(t)` after backward, and `finish()` once at the end, which
leaves the final global model in the worker's parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from training.config import Algorithm, Comm, Compensation, TrainConfig
from training.measure.memory import HeldState, ddp_bucket_bytes, optimizer_tensors
from training.measure.timeline import Timeline
from training.ps import PSClient, ShardLayout, TrafficStats


class Strategy:
    """Base: the bare model and plain per-iteration bookkeeping."""

    def __init__(self, cfg: TrainConfig, model: nn.Module, timeline: Timeline) -> None:
        self.cfg, self.timeline = cfg, timeline
        self.net = model  # the bare model
        self.model = model  # what the trainer calls forward on
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stats = TrafficStats()
        self.last_grad_time = 0.0
        # A gradient hook (not a post-accumulate hook, which breaks DDP's reducer)
        # times the end of backward compute.
        for p in self.params:
            p.register_hook(self._on_grad)

    def _on_grad(self, _grad: torch.Tensor) -> None:
        self.last_grad_time = self.timeline.now()

    def backward_compute_end(self) -> float:
        """When backward's last gradient was accumulated (compute, not comm)."""
        return self.last_grad_time

    def start(self, resumed: bool) -> None:
        """Called once on every worker after all ranks are up (and state is restored)."""

    def step(self, t: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Leave the final global model in the parameters."""

    def checkpoint_state(self) -> dict:
        """The algorithm's state beyond the model's parameters (optimizers, buffers)."""
        return {}

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore what `checkpoint_state` returned."""

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def held_state(self) -> HeldState:
        """The tensors this worker holds from one iteration to the next (training/measure/memory.py)."""
        return HeldState(parameters=list(self.net.parameters()), gradients=[p.grad for p in self.params],
                         buffers=list(self.net.buffers()))


def _sgd(params, lr: float, momentum: float, weight_decay: float) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


class AllreduceSSGD(Strategy):
    """SSGD with allreduce: DDP with bucketed overlap, or one flat allreduce."""

    def __init__(self, cfg: TrainConfig, model: nn.Module, timeline: Timeline, group) -> None:
        super().__init__(cfg, model, timeline)
        self.group = group
        self.opt = _sgd(self.params, cfg.lr, cfg.momentum, cfg.weight_decay)
        if cfg.overlap and cfg.workers > 1:
            device_ids = [torch.cuda.current_device()] if cfg.device.value == "cuda" else None
            self.model = nn.parallel.DistributedDataParallel(
                model, device_ids=device_ids, bucket_cap_mb=cfg.bucket_mb,
                forward_sync_buffers=False, process_group=group,
            )

    def step(self, t: int) -> None:
        tl = self.timeline
        if not self.cfg.overlap and self.cfg.workers > 1:
            with tl.phase("comm_exposed"):
                grads = [p.grad for p in self.params]
                flat = _flatten_dense_tensors(grads)
                dist.all_reduce(flat, group=self.group)
                flat.div_(self.cfg.workers)
                for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                    g.copy_(synced)
            nbytes = flat.numel() * flat.element_size()
            # Ring allreduce moves 2(N-1)/N of the bytes each way per rank.
            moved = int(2 * (self.cfg.workers - 1) / self.cfg.workers * nbytes)
            self.stats.bytes_sent += moved
            self.stats.bytes_received += moved
        elif self.cfg.workers > 1:
            nbytes = sum(p.numel() * p.element_size() for p in self.params)
            moved = int(2 * (self.cfg.workers - 1) / self.cfg.workers * nbytes)
            self.stats.bytes_sent += moved
            self.stats.bytes_received += moved
        with tl.phase("update"):
            self.opt.step()
            self.zero_grad()

    def held_state(self) -> HeldState:
        held = super().held_state()
        held.optimizer = optimizer_tensors(self.opt)
        if isinstance(self.model, nn.parallel.DistributedDataParallel):
            held.opaque_buffer_bytes = ddp_bucket_bytes(self.model)
        return held

    def checkpoint_state(self) -> dict:
        return {"opt": self.opt.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        self.opt.load_state_dict(state["opt"])


class _PSStrategy(Strategy):
    def __init__(self, cfg: TrainConfig, model: nn.Module, timeline: Timeline, group,
                 rank: int, slots: int = 1) -> None:
        super().__init__(cfg, model, timeline)
        numel = sum(p.numel() for p in self.params)
        self.client = PSClient(self.params, ShardLayout.even(numel, cfg.servers), cfg.workers,
                               group, cfg.timeout_s, slots=slots)
        self.stats = self.client.stats
        self.rank = rank

    def start(self, resumed: bool) -> None:
        if self.rank == 0 and not resumed:
            self.client.send_initial(self.client.flat_params())

    def held_state(self) -> HeldState:
        held = super().held_state()
        held.buffers += [*self.client.grads, *self.client.weights]
        return held


class _PushPullStrategy(_PSStrategy):
    """Push g, wait for the shards' reply W, load it: the server decides what W is."""

    def step(self, t: int) -> None:
        tl = self.timeline
        with tl.phase("comm_exposed"):
            self.client.gather_grads()
            self.client.wait(self.client.start_push_pull())
        with tl.phase("update"):
            self.client.load_into_params(self.client.weights[0])
            self.zero_grad()


class PSSSGD(_PushPullStrategy):
    """SSGD on a parameter server: push, wait for the averaged update, pull."""


class ASGD(_PushPullStrategy):
    """Asynchronous SGD: push g, the shard applies it on arrival and replies with W."""

    def finish(self) -> None:
        self.client.wait(self.client.start_pull())
        self.client.load_into_params(self.client.weights[0])


class ODSGD(_PSStrategy):
    """One-step Delay SGD (Xu et al., TACO 2020).

    Iteration t: push g_t and start pulling W_g(t+1) without waiting, then the
    local update W_k(t+1) = LocalOpt(W_g(t), g_t), where W_g(t) was pulled
    during iteration t-1 (waited for only if it has not arrived yet).
    """

    def __init__(self, cfg: TrainConfig, model: nn.Module, timeline: Timeline, group, rank: int) -> None:
        super().__init__(cfg, model, timeline, group, rank, slots=2)
        self.local_opt = _sgd(self.params, cfg.effective_lr_local, cfg.effective_momentum_local,
                              cfg.weight_decay)
        self.weights_global = self.client.flat_params()  # W_g(0) = the common init
        self.pending: list | None = None  # the pull of W_g(t), started in iteration t-1
        self.pending_slot = 0

    def _global_weights(self) -> torch.Tensor:
        """W_g(t): the pull started last iteration, or the one already held."""
        if self.pending is not None:
            self.client.wait(self.pending)
            self.pending = None
            self.weights_global = self.client.weights[self.pending_slot]
        return self.weights_global

    def step(self, t: int) -> None:
        tl = self.timeline
        cfg = self.cfg
        slot = (t + 1) % 2
        if t < cfg.warmup_steps:  # warm-up: plain SSGD-PS, W_k(t+1) = W_g(t+1)
            with tl.phase("comm_exposed"):
                self.client.gather_grads(slot)
                self.client.wait(self.client.start_push_pull(slot))
            with tl.phase("update"):
                # A copy: the slot is refilled by a later pull while this is still in use.
                self.weights_global = self.client.weights[slot].clone()
                self.client.load_into_params(self.weights_global)
                self.zero_grad()
            return
        with tl.phase("comm_exposed"):
            # Packing and posting the round are the worker's own time, not hidden: gloo writes
            # into the socket from this thread. Then W_g(t), if it has not arrived yet.
            self.client.gather_grads(slot)
            works = self.client.start_push_pull(slot)
            w_global = self._global_weights()
        with tl.phase("update"):
            if cfg.compensation == Compensation.dc:
                # DC-ASGD: g' = g + lambda * g * g * (W_g(t) - W_k(t)), elementwise.
                with torch.no_grad():
                    for p, view in self.client.views(w_global):
                        g = p.grad
                        p.grad = g + cfg.dc_lambda * g * g * (view.to(p.device) - p)
            self.client.load_into_params(w_global)
            self.local_opt.step()
            self.zero_grad()
        self.pending, self.pending_slot = works, slot

    def finish(self) -> None:
        """The final global model W_g(T)."""
        self.client.load_into_params(self._global_weights())

    def held_state(self) -> HeldState:
        held = super().held_state()
        held.optimizer = optimizer_tensors(self.local_opt)
        held.buffers.append(self.weights_global)  # after warm-up, one of the client's pull slots
        return held

    def checkpoint_state(self) -> dict:
        # Waiting for the pull in flight changes nothing but when W_g(t+1) is awaited.
        return {"local_opt": self.local_opt.state_dict(), "weights_global": self._global_weights().clone()}

    def load_checkpoint_state(self, state: dict) -> None:
        self.local_opt.load_state_dict(state["local_opt"])
        self.weights_global = state["weights_global"]
        self.pending = None


def make_strategy(cfg: TrainConfig, model: nn.Module, timeline: Timeline, rank: int,
                  workers_group, ps_group) -> Strategy:
    if cfg.algorithm == Algorithm.ssgd and cfg.comm == Comm.allreduce:
        return AllreduceSSGD(cfg, model, timeline, workers_group)
    if cfg.algorithm == Algorithm.ssgd:
        return PSSSGD(cfg, model, timeline, ps_group, rank)
    if cfg.algorithm == Algorithm.asgd:
        return ASGD(cfg, model, timeline, ps_group, rank)
    return ODSGD(cfg, model, timeline, ps_group, rank)
