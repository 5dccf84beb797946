"""The host-speed canary: a fixed compute kernel and a memory copy, timed on every rank just
before and just after a training run's steps (docs/regression.md).

The regression alarm divides a run's throughput by the canary's speed, so a host that is slower
tonight for every workload (other work on its cores, a throttled clock) is not read as a
regression of one workload. The canary runs on every rank at once, after a barrier, so it meets
the same contention the training ranks meet, with the rank's own torch thread count. On a GPU
rank the kernel is a GEMM on the device (timed with a synchronize), otherwise on the CPU.

The work is fixed (not a fixed time), so its rate is comparable between runs; both phases
together (before and after) take about 0.1 s per rank on a quiet CPU.

Each rank also reads its threads' scheduler accounting (/proc/self/task/*/schedstat: time on a
CPU, time runnable but waiting for one) over each canary and over the steps: the CPU share,
on / (on + waiting), recorded as a diagnostic. It is not in `speed_log`: on a loaded host every
wake-up from a sleep or a blocking receive waits for a core, so the steps' share falls when the
workload itself blocks more (a slower workload would be explained away as a slower host); the
kernels, timed outside the steps, see the host alone.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where the canary runs: pipelines read its figures without it
    import torch

GEMM_N = 128  # a 128x128 fp32 matmul: 4.2 MFLOP, cache-resident, what a small layer costs
GEMM_REPS = 150  # about 7 ms on one quiet core: the canary costs about 0.1 s per run in all
COPY_BYTES = 16 << 20  # larger than a typical last-level cache, so the copy measures memory bandwidth
COPY_REPS = 4
KINDS = ("gemm_gflops", "copy_gbps")
SHARES = ("before", "steps", "after")


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


def sched_ns() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable and waiting) of this process's threads so far; None without
    schedstat. Threads that ended before the reading are not in it, so spans are taken between
    readings of a steady set of threads (the training's)."""
    on = wait = 0
    try:
        for task in Path("/proc/self/task").iterdir():
            try:
                fields = (task / "schedstat").read_text().split()
            except OSError:  # the thread ended between listing and reading
                continue
            on, wait = on + int(fields[0]), wait + int(fields[1])
    except OSError:
        return None
    return on, wait


def share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The CPU share between two readings: on / (on + waiting); None if unknown."""
    if not start or not end:
        return None
    on, wait = end[0] - start[0], end[1] - start[1]
    return on / (on + wait) if on > 0 and wait >= 0 else None


def speed_log(rates: dict[str, float]) -> float:
    """The canary's log rate: the mean of the two kernels' log rates."""
    return statistics.fmean(math.log(rates[k]) for k in KINDS)


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's `canary`: each rank's rates before and after the steps and its CPU shares,
    their medians over the ranks, `speed_log`, the mean of the log rates of both kernels before
    and after the steps, and `gemm_log`, the GEMM's alone, which the regression alarm uses."""
    ranks = [r for r in per_rank if r.get("before") and r.get("after")]
    if not ranks:
        return {"ranks": per_rank, "speed_log": None}
    out: dict[str, Any] = {"ranks": per_rank}
    for when in ("before", "after"):
        out[when] = {k: statistics.median(r[when][k] for r in ranks) for k in KINDS}
    shares = {w: [r["share"][w] for r in ranks if (r.get("share") or {}).get(w)] for w in SHARES}
    out["cpu_share"] = {w: statistics.median(v) if len(v) == len(ranks) else None for w, v in shares.items()}
    out["speed_log"] = statistics.fmean(speed_log(out[w]) for w in ("before", "after"))
    # What the regression alarm divides by: the GEMM alone. The copy's rate (memory bandwidth)
    # moves by a quarter from one moment to the next on a shared host while the workloads'
    # throughput does not follow it, so it would read as a host that moved.
    out["gemm_log"] = statistics.fmean(math.log(out[w]["gemm_gflops"]) for w in ("before", "after"))
    out["seconds"] = max(r.get("seconds", 0.0) for r in ranks)
    return out


def metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The canary's MLflow metrics of a training run: canary_<kind>_<before|after>,
    canary_cpu_share_<before|steps|after>, canary_speed_log, canary_gemm_log."""
    c = summary.get("canary") or {}
    out = {f"canary_{k}_{w}": c[w][k] for w in ("before", "after") if c.get(w) for k in KINDS}
    out |= {f"canary_cpu_share_{w}": v for w, v in (c.get("cpu_share") or {}).items() if v is not None}
    for key in ("speed_log", "gemm_log"):
        if c.get(key) is not None:
            out[f"canary_{key}"] = c[key]
    return out


class Canary:
    """One rank's canary: `run("before")` and `run("after")` around the steps, then `result()`."""

    def __init__(self, device: torch.device, rank: int) -> None:
        self.device, self.rank = device, rank
        self.figures: dict[str, Any] = {"rank": rank, "device": device.type, "seconds": 0.0, "share": {}}
        self._ended: tuple[int, int] | None = None

    def run(self, when: str) -> None:
        t0, s0 = time.perf_counter(), sched_ns()
        if when == "after":  # the steps: from the end of the canary before to this one
            self.figures["share"]["steps"] = share(self._ended, s0)
        self.figures[when] = measure(self.device)
        self._ended = sched_ns()
        self.figures["share"][when] = share(s0, self._ended)
        self.figures["seconds"] += time.perf_counter() - t0

    def result(self) -> dict[str, Any]:
        return self.figures
