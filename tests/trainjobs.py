"""Run real training jobs (torchrun, gloo) for tests, and single-process references."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.nn.functional as F

from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from training.datasets import GlobalBatchSampler, load_dataset
from training.models import build_model
from training.shape import resolve_input_shape


def run_job(out: Path, timeout_s: float = 240, **options: Any) -> tuple[dict, dict[str, torch.Tensor]]:
    """Launch a real job; return its summary and final parameters."""
    values = {"model": "lenet5", "dataset": "digits", "save_params": True, "timeout_s": 60} | options
    cfg = prepare(values, "test")
    summary = launch(cfg, out, LocalProvider(), timeout_s=timeout_s, echo=False)
    return summary, torch.load(out / "params.pt", weights_only=True)


class Reference:
    """The model, data and batches of a job, in this process, for reference updates."""

    def __init__(self, **options: Any) -> None:
        values = {"model": "lenet5", "dataset": "digits", "steps": 1} | options
        self.cfg = cfg = prepare(values, "reference")
        shape = resolve_input_shape(cfg)
        self.train, _ = load_dataset(cfg, shape)
        self.shape = shape
        self.sampler = GlobalBatchSampler(len(self.train), cfg.workers, cfg.batch_size, cfg.seed)

    def model(self) -> torch.nn.Module:
        torch.manual_seed(self.cfg.seed)
        return build_model(self.cfg.model, self.shape, self.train.num_classes)

    def grads(self, model: torch.nn.Module, step: int, rank: int) -> list[torch.Tensor]:
        """The gradient a rank computes, at the rank's thread count: a reduction's order
        follows the thread count, and a ReLU's or a max-pool's tie turns a one-ulp difference
        into another gradient, which a few asynchronous updates grow past any tolerance."""
        x, y = self.train.batch(self.sampler.indices(step, rank))
        model.zero_grad(set_to_none=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(self.cfg.threads)
        try:
            F.cross_entropy(model(x), y).backward()
        finally:
            torch.set_num_threads(threads)
        return [p.grad.detach().clone() for p in model.parameters()]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def rank_process(out: Path, rank: int, timeout_s: float = 120) -> psutil.Process:
    """The process of `rank` of the job writing to `out`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = p.info["cmdline"] or []
                if "training.run" in cmd and str(out) in cmd and is_rank(p, rank):
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never started")


def is_rank(p: psutil.Process, rank: int) -> bool:
    """Whether `p` is that rank: a forked one by its name (infra/zygote.py), torchrun's by its environment."""
    return p.name() == f"rank-{rank}" or p.environ().get("RANK") == str(rank)


def processes_under(path: Path) -> list[str]:
    """Processes whose command line names `path` (a job's run directory, a run's home)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(path) in cmd:
            found.append(f"{p.info['pid']}: {cmd[:160]}")
    return found
