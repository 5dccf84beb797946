"""The host-speed canary: a fixed compute kernel and a memory copy, timed on every rank just
before and just after a training run's steps (docs/regression.md).

The regression alarm divides a run's throughput by the canary's speed, so a host that is slower
tonight for every workload (other work on its cores, a throttled clock) is not read as a
regression of one workload. The canary runs on every rank at once, after a barrier, so it meets
the same contention the training ranks meet, with the rank's own torch thread count. On a GPU
rank the kernel is a GEMM on the device (timed with a synchronize), otherwise on the CPU.

The work is fixed (not a fixed time), so its rate is comparable between runs; both phases
together (before and after) take about 0.1 s per rank on a quiet CPU.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where the canary runs: pipelines read its figures without it
    import torch

GEMM_N = 128  # a 128x128 fp32 matmul: 4.2 MFLOP, cache-resident, what a small layer costs
GEMM_REPS = 150  # about 7 ms on one quiet core: the canary costs about 0.1 s per run in all
COPY_BYTES = 16 << 20  # larger than a typical last-level cache, so the copy measures memory bandwidth
COPY_REPS = 4
KINDS = ("gemm_gflops", "copy_gbps")


def _timed(fn: Any, reps: int, device: torch.device) -> float:
    import torch

    fn(1)  # warm: first-call allocations and kernel selection are no measure of the host
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn(reps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def measure(device: torch.device | None = None) -> dict[str, float]:
    """The canary's rates on this rank: GFLOP/s of the GEMM loop, GB/s of the copy loop."""
    import torch

    device = device or torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(GEMM_N, GEMM_N, generator=gen).to(device)
    b = torch.rand(GEMM_N, GEMM_N, generator=gen).to(device)
    src = torch.ones(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)

    c = torch.empty_like(a)

    def gemm(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, b, out=c)

    def copy(reps: int) -> None:
        for _ in range(reps):
            dst.copy_(src)

    flops = 2 * GEMM_N**3 * GEMM_REPS
    moved = 2 * COPY_BYTES * COPY_REPS  # read and write
    return {
        "gemm_gflops": flops / _timed(gemm, GEMM_REPS, device) / 1e9,
        "copy_gbps": moved / _timed(copy, COPY_REPS, device) / 1e9,
    }


def speed_log(rates: dict[str, float]) -> float:
    """One figure of host speed: the mean log rate of the two kernels (what the alarm divides by)."""
    return statistics.fmean(math.log(rates[k]) for k in KINDS)


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `canary`: each rank's rates before and after the steps, their medians over
    the ranks, and `speed_log`, the mean of the before and after speed (log) the alarm uses."""
    ranks = [r for r in per_rank if r.get("before") and r.get("after")]
    if not ranks:
        return {"ranks": per_rank, "speed_log": None}
    out: dict[str, Any] = {"ranks": per_rank}
    for when in ("before", "after"):
        out[when] = {k: statistics.median(r[when][k] for r in ranks) for k in KINDS}
    out["speed_log"] = statistics.fmean(speed_log(out[w]) for w in ("before", "after"))
    out["seconds"] = max(r.get("seconds", 0.0) for r in ranks)
    return out


def metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The canary's MLflow metrics of a training run: canary_<kind>_<before|after>, canary_speed_log."""
    c = summary.get("canary") or {}
    out = {f"canary_{k}_{w}": c[w][k] for w in ("before", "after") if c.get(w) for k in KINDS}
    if c.get("speed_log") is not None:
        out["canary_speed_log"] = c["speed_log"]
    return out


class Canary:
    """One rank's canary: `run("before")` and `run("after")` around the steps, then `result()`."""

    def __init__(self, device: torch.device, rank: int) -> None:
        self.device, self.rank = device, rank
        self.figures: dict[str, Any] = {"rank": rank, "device": device.type, "seconds": 0.0}

    def run(self, when: str) -> None:
        t0 = time.perf_counter()
        self.figures[when] = measure(self.device)
        self.figures["seconds"] += time.perf_counter() - t0

    def result(self) -> dict[str, Any]:
        return self.figures
