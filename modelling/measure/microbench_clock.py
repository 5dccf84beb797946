"""The microbenchmark's clock and timing (modelling/measure/microbench_rank.py): every rank's
operations stamped on rank 0's clock, an operation timed from its last rank's start to its
last rank's end, the compute gap before each, and the host's CPU time around a loop."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psutil
import torch
import torch.distributed as dist

_SCRATCH = torch.ones(64, 64)


def compute(seconds: float) -> None:
    """Busy CPU work, as a training step does between its communications."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(_SCRATCH, _SCRATCH)


def timed(op, repeats: int, gap_s: float = 0.0, group=None, computes: bool = True,
           offset_s: float = 0.0) -> list[tuple[float, float]]:
    """One untimed warm-up, then `repeats` timings, each as (start, end) on rank 0's clock
    (this rank's perf_counter less `offset_s`). Each starts after a barrier and then
    `gap_s` of computation on every rank that `computes` (a worker): training reaches its
    communication from compute, not from a barrier, and pays for what that costs (threads
    to wake); a back-to-back loop on hot threads does not.
    The other ranks sleep through the gap, as a shard waits blocked in its receive (or, for
    an allreduce, is not there at all): one that computed would compete with the workers
    for the host's cores, and start its receive a scheduler's time slice late."""
    out = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        if computes:
            compute(gap_s)
        else:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        op()
        t1 = time.perf_counter()
        if i:
            out.append((t0 - offset_s, t1 - offset_s))
    return out


def clock_offsets(tries: int = 20) -> list[float]:
    """Every rank's perf_counter minus rank 0's (rank 0's entry 0), the same list on every
    rank. Per rank, from the fastest of `tries` ping-pongs with rank 0 (NTP's estimate: the
    reply's stamp against the round trip's midpoint, off by at most half that round trip).
    Ranks on one kernel share CLOCK_MONOTONIC and come out near 0; SLURM's or Kubernetes'
    nodes need it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    offsets = torch.zeros(world, dtype=torch.float64)
    stamp = torch.zeros(1, dtype=torch.float64)
    for k in range(1, world):
        best = math.inf
        for _ in range(tries):
            if rank == 0:
                t_a = time.perf_counter()
                dist.send(stamp, k)
                dist.recv(stamp, k)
                t_b = time.perf_counter()
                if t_b - t_a < best:
                    best, offsets[k] = t_b - t_a, stamp.item() - (t_a + t_b) / 2
            elif rank == k:
                dist.recv(stamp, 0)
                stamp.fill_(time.perf_counter())
                dist.send(stamp, 0)
    dist.broadcast(offsets, 0)
    return offsets.tolist()


def round_times(stamps: list[tuple[float, float]], ranks: Sequence[int]) -> list[float]:
    """Per repeat, an operation's time from the moment the last of `ranks` started it to the
    moment the last ended it (every rank's stamps on rank 0's clock). A round ends for all
    only when its last rank is done: a worker beside its shard has its pull back before a
    remote one's has crossed the link, and a synchronous step waits for the last. It starts
    when the last arrives: the barrier before it releases the ranks a scheduler's slice or
    two apart on a busy host (1-2 ms, measured on 2 cores), and a rank that waits for a late
    one pays that skew, which training, where the ranks arrive from the same compute, does not."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, stamps)
    return [
        max(every[r][i][1] for r in ranks) - max(every[r][i][0] for r in ranks) for i in range(len(stamps))
    ]


def host_busy_s() -> float:
    """The host's busy CPU-seconds since boot over all its cores (user, nice, system, irq and
    softirq: the kernel's network stack is softirq; Linux's /proc/stat, through psutil). The
    kernel counts in ticks (10 ms a core), so only a loop of many operations is measured
    with it."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


# The host's CPU time is read over at least this long a loop: the kernel counts it in ticks.
HOST_CPU_LOOP_S = 0.5


def host_cpu_s(op, times: list[float], busy_before: tuple[float, float] | None, gap_s: float, computes: bool,
                computing: int) -> dict[str, float | None]:
    """The host's CPU-seconds per operation, less the computation of the `computing` ranks
    before each, over the timed loop just run (its warm-up and repeats; `busy_before` read
    by rank 0 before it, None on the others) and, where that loop was shorter
    than HOST_CPU_LOOP_S, as many more operations as make it up (a tick is 10 ms a core;
    6 operations of a few ms would read as 0 or a multiple of it). Collective: every rank
    calls it with the same `times` (from round_times) and takes part in the extra ones.
    `busy_before`: rank 0's (host_busy_s(), time.monotonic()) before the timed loop. Also the
    loop's wall time per operation (host_cpu_wall_s): the CPU time is read over it, and its
    slow operations make it longer than the timed repeats' mean."""
    per_op = statistics.median(times) + gap_s
    done = len(times) + 1
    extra = max(math.ceil(HOST_CPU_LOOP_S / max(per_op, 1e-4)) - done, 0)
    for _ in range(extra):  # no barrier between them: the ranks meet in the operation, as in training
        if computes:
            compute(gap_s)
        else:
            time.sleep(gap_s)
        op()
    dist.barrier()
    if busy_before is None:  # not rank 0
        return {"host_cpu_s": None, "host_cpu_wall_s": None}
    cpu, wall = busy_before
    ops = done + extra
    return {"host_cpu_s": (host_busy_s() - cpu) / ops - computing * gap_s,
            "host_cpu_wall_s": (time.monotonic() - wall) / ops}


def trimmed_mean(times: list[float], cut: float = 0.2) -> float:
    """The mean without the fastest and slowest `cut` of the samples. The expected cost is
    what throughput pays; trimming keeps one descheduled outlier from deciding it, while a
    bimodal latency (a vCPU woken from idle, common on VMs) still counts in proportion,
    where a median would flip between the modes from run to run."""
    xs = sorted(times)
    k = int(len(xs) * cut)
    return statistics.fmean(xs[k : len(xs) - k] or xs)
