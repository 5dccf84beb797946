"""One host's cores, shared by the processes that compute at each moment (DESIGN §3).

Where every rank runs on one host (an emulated cluster's nodes, or loopback) with fewer
cores than ranks, the kernel's scheduler time-shares the cores among the runnable
processes: with n of them computing on c cores, each progresses at min(1, c/n) of its own
speed. A task that is CPU work holds `procs` processes (a worker class stands for that
many workers) and its duration in the DAG is its work at full speed; sharing stretches it
by however many others compute beside it, moment by moment. Where the workers take turns
(a shard's pulls arrive one after another) each computes at full speed; where they compute
at once (a ring's workers) each at c/n.

The list scheduler fixes a task's start from its dependencies and resources, given every
task's duration, and processor sharing fixes the CPU tasks' ends given their starts: the
simulator iterates the two to a fixed point, where the durations it schedules with are those
that sharing the cores from the starts it schedules gives.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from modelling.network.fabric import Fabric
from training.config import Comm

if TYPE_CHECKING:
    from modelling.dag import Costs
    from modelling.scenario import Scenario
    from modelling.simulate import Dag, Schedule

SHARE_ROUNDS = 40  # the fixed point's rounds at most: a handful suffices where tasks take turns
_SETTLED = 1e-7  # relative change of every duration between two rounds


def settled(before: list[float], after: list[float]) -> bool:
    return all(abs(a - b) <= _SETTLED * max(a, b, 1e-9) for a, b in zip(before, after, strict=True))


def shared_durations(dag: Dag, sched: Schedule, cores: int) -> list[float]:
    """Every task's duration where the CPU tasks start as in `sched` and share `cores`, event
    by event: between two events (a start, an end) each of the `busy` processes computing
    progresses at min(1, cores / busy). Tasks that are not CPU work keep theirs."""
    cpu = sorted((t for t in range(len(dag)) if dag.procs[t] > 0 and dag.durations[t] > 0),
                 key=lambda t: (sched.start[t], t))
    out = list(dag.durations)
    left = {t: dag.durations[t] for t in cpu}
    active: list[int] = []
    now, i = 0.0, 0
    while i < len(cpu) or active:
        busy = sum(dag.procs[t] for t in active)
        rate = min(1.0, cores / busy) if busy else 1.0
        to_end = min((left[t] for t in active), default=math.inf) / rate
        to_start = sched.start[cpu[i]] - now if i < len(cpu) else math.inf
        step = max(min(to_end, to_start), 0.0)
        for t in active:
            left[t] -= step * rate
        now += step
        if to_end <= to_start:  # the least remaining work ends, with any that end at this instant
            ended = {min(active, key=left.__getitem__)} | {t for t in active if left[t] <= 1e-12 * dag.durations[t]}
            for t in ended:
                out[t] = now - sched.start[t]
            active = [t for t in active if t not in ended]
        else:
            active.append(cpu[i])
            i += 1
    return out


def on_shared_cores(c: Costs, layers: dict[str, Any], s: Scenario, host_cores: int | None) -> tuple[Costs, int | None]:
    """Where every rank runs on one host of `host_cores` cores (`Fabric.on_one_host`), the
    costs with each computation's work at full speed, and the cores to share among its ranks
    where they are fewer (else None): the simulator shares them among the
    processes computing at each moment (shared_durations). The profile timed `processes`
    ranks computing at once on its host's cores, each at min(1, cores/processes) of its
    speed: its times are that work stretched. Compute timed in situ (validate.insitu_layers)
    ran with the sharing training had, and is taken as it is."""
    servers = s.servers if s.comm == Comm.ps else 0
    if not host_cores or layers.get("source") == "in situ" or not Fabric(c, s.workers, servers).on_one_host():
        return c, None
    env = layers.get("environment") or {}
    processes = int(layers.get("processes") or env.get("processes") or 1)
    share = min(1.0, (env.get("cpu_count") or host_cores) / processes)

    def work(x: float) -> float:
        return x * share

    work_costs = replace(
        c, fwd=[work(x) for x in c.fwd], bwd=[work(x) for x in c.bwd], data_s=work(c.data_s),
        update_s=work(c.update_s), pack_s=work(c.pack_s), unpack_s=work(c.unpack_s),
        server_update_s=work(c.server_update_s), server_apply_s=work(c.server_apply_s),
        # Where the profile's processes outnumbered its cores, the spread of their iteration times
        # is the order the scheduler served them in, not work: ranks that compute at once all end
        # by the time their whole work is done (the scheduler is work-conserving), which sharing
        # gives as the computation's end, and a rank computing alone is served at once.
        straggle_s=c.straggle_s if share >= 1.0 else 0.0,
    )
    return work_costs, (host_cores if s.ranks > host_cores else None)
