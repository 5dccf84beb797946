"""The microbenchmark's device (modelling/measure/microbench_rank.py, `ddlbench microbench --device`).

On cpu every buffer is a host tensor and every primitive runs over gloo. On cuda the ranks
start as training's do (training/run.py): the process group is "cpu:gloo,cuda:nccl", each
worker pins its GPU by LOCAL_RANK, and the shards stay on the host. The allreduce then runs on
GPU tensors, over NCCL; the point-to-point and parameter-server primitives keep to gloo on host
buffers, pinned on the workers as the PS client's are (training/ps.py). NCCL refuses two ranks
of one communicator on one GPU, so where workers share a GPU (2 workers on a 1-GPU machine) the
allreduce of GPU tensors runs over gloo instead, and comm.json's environment says which.
A GPU's work ends after its call returns: the allreduce synchronises the device before the
clock is read, so every rank's stamps stay on the one host clock the timing aligns
(modelling/measure/microbench_clock.py), which CUDA events, per device, are not.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def backend_of(device: str) -> str:
    """The process group's backend: gloo on cpu; on cuda NCCL for GPU tensors, as training's."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def no_cuda_reason() -> str | None:
    """Why a cuda microbenchmark cannot run on this host, or None: checked before any rank
    starts, since each rank would otherwise fail on its own."""
    if torch.cuda.is_available():
        return None
    return f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}) sees no CUDA device"


@dataclass
class RankDevice:
    """Where this rank's allreduce runs, and over which group."""

    name: str
    device: torch.device
    group: Any
    allreduce_backend: str = "gloo"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def pin(self) -> bool:
        """Whether gloo's host buffers are pinned: on a GPU worker, as the PS client's."""
        return self.cuda

    def allreduce_op(self, host: torch.Tensor, active: bool) -> Callable[[], None]:
        """One allreduce over the workers (a no-op where not `active`, a shard): of `host`
        itself on cpu; on cuda of a GPU copy of it, the device synchronised at its end."""
        if not self.cuda:
            return lambda: dist.all_reduce(host, group=self.group) if active else None
        buf = host.to(self.device)

        def op() -> None:
            if active:
                dist.all_reduce(buf, group=self.group)
                torch.cuda.synchronize(self.device)

        return op

    def environment(self) -> dict[str, Any]:
        """comm.json's environment entries of the device: none on cpu, as before --device."""
        if not self.cuda:
            return {}
        return {"device": "cuda", "backend": backend_of("cuda"), "allreduce_backend": self.allreduce_backend,
                "gpu_model": torch.cuda.get_device_name(self.device), **self.extra}


def pin_device(name: str, n: int) -> torch.device:
    """This rank's device, set before its process group starts as training's is: the cpu, or for
    a cuda worker (RANK below `n`) its GPU by LOCAL_RANK; a shard keeps to the host."""
    if name != "cuda" or int(os.environ.get("RANK", 0)) >= n:
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def rank_device(name: str, device: torch.device, rank: int, n: int, workers: Any,
                timeout: timedelta | None) -> RankDevice:
    """Where this rank's allreduce runs, on `device` (pin_device's). Collective on cuda: the
    workers' GPUs are compared to choose the allreduce's group, the same on every rank."""
    if name != "cuda":
        return RankDevice(name, device, workers)
    gpus: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gpus, _gpu_id(device) if rank < n else None)
    shared = len(set(gpus[:n])) < n
    if not shared:
        return RankDevice(name, device, workers, "nccl", {"gpus": n})
    group = dist.new_group(ranks=list(range(n)), backend="gloo", timeout=timeout)
    return RankDevice(name, device, group, "gloo", {"gpus": len(set(gpus[:n])),
                                                    "allreduce_note": "workers share a GPU: NCCL refuses that"})


def _gpu_id(device: torch.device) -> str:
    """The GPU's identity across ranks: its host and UUID (an index differs under
    CUDA_VISIBLE_DEVICES)."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", device.index)
    return f"{platform.node()}/{uuid}"
