"""The parameter server: flat shards, a client for workers and a server loop.

The model's parameters, flattened in `model.parameters()` order, are cut into S
contiguous shards of near-equal size; shard s lives on rank N+s. A push sends a
worker's flat gradient slice to each shard and a pull receives the shard's flat
weights: one message per shard and direction, over torch.distributed
point-to-point on a gloo group. GPU tensors are staged through pinned host
buffers. Every wait has a timeout.

Server modes (DESIGN §2):
- sync (SSGD-PS, OD-SGD): wait for the N pushes of step t, average them in
  rank order, apply GlobalOpt (SGD with momentum and weight decay), send
  W_g(t+1) to every worker.
- async (ASGD, MXNet `dist_async`): apply each push on arrival with the
  shard's optimizer (SGD at lr_async with momentum_async and the global weight
  decay, its momentum buffer kept here), reply with the current W to the
  pusher; record staleness (server updates between the version a gradient was
  computed on and the version it is applied to) and the arrival order: each
  push's server record in the timeline names its `src` worker and `staleness`,
  so the shard's update sequence can be replayed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from training.measure.memory import HeldState, optimizer_tensors
from training.measure.timeline import Timeline


@dataclass(frozen=True)
class ShardLayout:
    """Contiguous [start, end) ranges of the flat parameter vector, one per shard."""

    bounds: tuple[tuple[int, int], ...]

    @classmethod
    def even(cls, numel: int, shards: int) -> ShardLayout:
        base, extra = divmod(numel, shards)
        bounds, start = [], 0
        for s in range(shards):
            end = start + base + (1 if s < extra else 0)
            bounds.append((start, end))
            start = end
        return cls(tuple(bounds))

    @property
    def numel(self) -> int:
        return self.bounds[-1][1]


@dataclass
class TrafficStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    staleness: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "staleness": dict(self.staleness),
        }


def _wait_all(works: list, timeout: timedelta) -> None:
    for w in works:
        w.wait(timeout)


class PSClient:
    """A worker's side: flat buffers, non-blocking push and pull to every shard."""

    def __init__(self, params: list[torch.Tensor], layout: ShardLayout, first_server: int,
                 group: dist.ProcessGroup, timeout_s: float, slots: int = 1) -> None:
        self.params, self.layout, self.first_server = params, layout, first_server
        self.group, self.timeout = group, timedelta(seconds=timeout_s)
        pin = params[0].is_cuda
        # Slots: OD-SGD double-buffers pushes (g_t may still be in flight while g_{t+1}
        # is gathered) and pulls (W_g(t) is in use while W_g(t+1) arrives).
        self.grads = [torch.zeros(layout.numel, pin_memory=pin) for _ in range(slots)]
        self.weights = [torch.zeros(layout.numel, pin_memory=pin) for _ in range(slots)]
        self._offsets = []
        o = 0
        for p in params:
            self._offsets.append((o, o + p.numel()))
            o += p.numel()
        self.stats = TrafficStats()

    def views(self, flat: torch.Tensor):
        for p, (a, b) in zip(self.params, self._offsets, strict=True):
            yield p, flat[a:b].view_as(p)

    def gather_grads(self, slot: int = 0) -> torch.Tensor:
        """Copy the parameters' gradients into the flat push buffer of `slot`."""
        flat = self.grads[slot]
        for p, view in self.views(flat):
            view.copy_(p.grad, non_blocking=True)
        if self.params[0].is_cuda:
            torch.cuda.current_stream().synchronize()
        return flat

    def flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).cpu() for p in self.params])

    def load_into_params(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, view in self.views(flat):
                p.copy_(view, non_blocking=True)

    def send_initial(self, flat: torch.Tensor) -> None:
        """Worker 0 seeds every shard with the initial weights W_g(0)."""
        works = [
            dist.isend(flat[a:b].contiguous(), self.first_server + s, group=self.group)
            for s, (a, b) in enumerate(self.layout.bounds)
        ]
        _wait_all(works, self.timeout)

    def start_push_pull(self, slot: int = 0) -> list:
        """Start pushing the flat gradient of `slot` and pulling new weights into `slot`."""
        works = []
        for s, (a, b) in enumerate(self.layout.bounds):
            dst = self.first_server + s
            works.append(dist.isend(self.grads[slot][a:b], dst, group=self.group))
            works.append(dist.irecv(self.weights[slot][a:b], dst, group=self.group))
            self.stats.bytes_sent += (b - a) * 4
            self.stats.bytes_received += (b - a) * 4
        return works

    def start_pull(self, slot: int = 0) -> list:
        works = []
        for s, (a, b) in enumerate(self.layout.bounds):
            works.append(dist.irecv(self.weights[slot][a:b], self.first_server + s, group=self.group))
            self.stats.bytes_received += (b - a) * 4
        return works

    def wait(self, works: list) -> None:
        _wait_all(works, self.timeout)


@dataclass
class ServerConfig:
    shard: int
    workers: int
    steps: int
    mode: str  # "sync" or "async"
    # The shard's optimizer: GlobalOpt for sync; for async lr_async and momentum_async.
    lr: float
    momentum: float
    weight_decay: float
    timeout_s: float


class ShardServer:
    """One parameter-server shard: its weights, optimizer state and counters."""

    def __init__(self, cfg: ServerConfig, layout: ShardLayout, group: dist.ProcessGroup,
                 timeline: Timeline) -> None:
        self.cfg, self.group, self.timeline = cfg, group, timeline
        start, end = layout.bounds[cfg.shard]
        self.timeout = timedelta(seconds=cfg.timeout_s)
        self.stats = TrafficStats()
        self.param = torch.nn.Parameter(torch.zeros(end - start))
        self.opt = torch.optim.SGD([self.param], lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)
        # Where pushes land: one buffer per worker in sync mode (a step's N pushes are all in
        # before its update), one in async mode (each push applied on arrival).
        self.bufs = [torch.empty_like(self.param.data) for _ in range(cfg.workers if cfg.mode == "sync" else 1)]
        self.version = 0  # server updates applied (async)
        self.seen = [0] * cfg.workers  # the version each worker last received (async)

    @property
    def nbytes(self) -> int:
        return self.param.numel() * 4

    def receive_initial(self) -> None:
        """W_g(0) from worker 0."""
        dist.recv(self.param.data, src=0, group=self.group)
        self.stats.bytes_received += self.nbytes

    def held_state(self) -> HeldState:
        """The shard's weights, its gradient (a push buffer), momentum and push buffers."""
        return HeldState(parameters=[self.param], gradients=[self.param.grad],
                         optimizer=optimizer_tensors(self.opt), buffers=list(self.bufs))

    def state_dict(self) -> dict:
        return {"w": self.param.detach().clone(), "opt": self.opt.state_dict(), "version": self.version,
                "seen": list(self.seen), "traffic": self.stats.as_dict()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.param.copy_(state["w"])
        self.opt.load_state_dict(state["opt"])
        self.version, self.seen = state["version"], list(state["seen"])
        t = state["traffic"]
        self.stats = TrafficStats(t["bytes_sent"], t["bytes_received"],
                                  Counter({int(k): v for k, v in t["staleness"].items()}))

    def run(self, done: int, on_step: Callable[[int], None]) -> None:
        """Serve steps done..steps-1; `on_step(t)` after each worker step t completes."""
        if self.cfg.mode == "sync":
            self._run_sync(done, on_step)
        else:
            self._run_async(done, on_step)

    def _run_sync(self, done: int, on_step: Callable[[int], None]) -> None:
        cfg, tl, group = self.cfg, self.timeline, self.group
        bufs = self.bufs
        for t in range(done, cfg.steps):
            tl.begin(t)
            with tl.phase("comm_exposed"):
                _wait_all([dist.irecv(bufs[k], k, group=group) for k in range(cfg.workers)], self.timeout)
            with tl.phase("update"):
                g = bufs[0]  # summed in place, in rank order: bufs[0] is received anew next step
                for b in bufs[1:]:
                    g.add_(b)
                if cfg.workers > 1:
                    g.div_(cfg.workers)
                self.param.grad = g
                self.opt.step()
            with tl.phase("send"):
                _wait_all([dist.isend(self.param.data, k, group=group) for k in range(cfg.workers)],
                          self.timeout)
            tl.end()
            self.stats.bytes_received += cfg.workers * self.nbytes
            self.stats.bytes_sent += cfg.workers * self.nbytes
            on_step(t)

    def _run_async(self, done: int, on_step: Callable[[int], None]) -> None:
        cfg, tl, group = self.cfg, self.timeline, self.group
        w = self.param.data
        buf = self.bufs[0]
        for push in range(done * cfg.workers, cfg.steps * cfg.workers):
            tl.begin(push)
            with tl.phase("comm_exposed"):
                src = dist.recv(buf, group=group)  # any source: applied on arrival
            with tl.phase("update"):
                staleness = self.version - self.seen[src]
                self.stats.staleness[staleness] += 1
                self.param.grad = buf
                self.opt.step()
                self.version += 1
            with tl.phase("send"):
                dist.send(w, src, group=group)
                self.seen[src] = self.version
            tl.end().update(src=src, staleness=staleness)  # the arrival order, for a replay
            self.stats.bytes_received += self.nbytes
            self.stats.bytes_sent += self.nbytes
            if (push + 1) % cfg.workers == 0:
                # Workers step in lockstep only at checkpoints, where all N pushes of
                # step t are in before any worker passes the checkpoint barrier.
                on_step((push + 1) // cfg.workers - 1)
        for k in range(cfg.workers):  # the final global model
            dist.send(w, k, group=group)
            self.stats.bytes_sent += self.nbytes
