"""The task DAG and its list-scheduling simulator (DESIGN §3).

A task has a duration, the resources it occupies for all of that time (a
transfer holds the sender's and the receiver's link at once) and the tasks it
depends on. Every resource serves one task at a time, first come first served
by the time a task became ready (ties: the order tasks were added). The
simulator is event driven and exact for that policy: ready times leave the
heap in non-decreasing order, so a task can always start at
max(ready, when each of its resources frees up).

A task may `absorb` part of its duration in its wait: what it could do before
its resources were free (a push that waits for its shard is already in the
socket buffers when the shard takes it) ends it that much sooner, at most the
time it waited. Its start, and so the order in which resources serve, is as
without it.

Where the ranks share one host's cores (an emulated cluster, loopback), a task that is
CPU work stands for `procs` processes on them, and `simulate(dag, cores)` shares the cores
among the processes computing at each moment (modelling/cores.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field

from modelling.cores import SHARE_ROUNDS, settled, shared_durations


@dataclass
class Dag:
    """Tasks in insertion order; a task's dependencies must already exist."""

    names: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    resources: list[tuple[Hashable, ...]] = field(default_factory=list)  # any hashable: dag.Resource
    deps: list[tuple[int, ...]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    owners: list[str] = field(default_factory=list)  # which worker or server the task belongs to
    steps: list[int] = field(default_factory=list)
    absorbs: list[float] = field(default_factory=list)  # of its duration, what a wait can absorb
    # CPU work: how many processes on the host's cores the task stands for (0: not CPU work).
    procs: list[int] = field(default_factory=list)

    def add(
        self,
        name: str,
        duration: float,
        resources: tuple[Hashable, ...],
        deps=(),
        *,
        kind: str = "",
        owner: str = "",
        step: int = 0,
        absorbs: float = 0.0,
        procs: int = 0,
    ) -> int:
        deps = tuple(deps)
        if None in deps:  # a builder's optional dependency (the first step has no previous one)
            deps = tuple(d for d in deps if d is not None)
        n = len(self.names)
        if duration < 0:
            raise ValueError(f"task {name}: negative duration {duration}")
        if absorbs and not 0.0 <= absorbs <= duration:
            raise ValueError(f"task {name}: absorbs {absorbs} s of its wait, not within its duration {duration}")
        if deps and (max(deps) >= n or min(deps) < 0):
            raise ValueError(f"task {name}: depends on a task that does not exist yet")
        self.names.append(name)
        self.durations.append(duration)
        self.resources.append(resources)
        self.deps.append(deps)
        self.kinds.append(kind or name)
        self.owners.append(owner)
        self.steps.append(step)
        self.absorbs.append(absorbs)
        self.procs.append(procs)
        return n

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class Schedule:
    start: list[float]
    end: list[float]
    # The task that held up each task's start: a dependency or the resource's previous user.
    blocker: list[int | None]
    # Each task's duration as it ran: its own, or stretched by sharing the host's cores.
    durations: list[float]


def simulate(dag: Dag, cores: int | None = None) -> Schedule:
    """The schedule of `dag`; with `cores`, its CPU work shares them (modelling/cores.py): the
    durations and the schedule are iterated to a fixed point, where each CPU task's duration
    is what sharing the cores with the processes the schedule has beside it gives."""
    durations = list(dag.durations)
    sched = _schedule(dag, durations)
    if not cores or not any(dag.procs):
        return sched
    for _ in range(SHARE_ROUNDS):
        stretched = shared_durations(dag, sched, cores)
        if settled(durations, stretched):
            break
        durations = stretched
        sched = _schedule(dag, durations)
    return sched


def _schedule(dag: Dag, durations: list[float]) -> Schedule:
    n = len(dag)
    waiting = [len(d) for d in dag.deps]
    succ: list[list[int]] = [[] for _ in range(n)]
    for t, ds in enumerate(dag.deps):
        for d in ds:
            succ[d].append(t)
    start = [0.0] * n
    end = [0.0] * n
    blocker: list[int | None] = [None] * n
    ready_at = [0.0] * n
    ready_by: list[int | None] = [None] * n  # the dependency that finished last
    free: dict[Hashable, float] = {}
    last_user: dict[Hashable, int] = {}
    heap = [(0.0, t) for t in range(n) if waiting[t] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
        ready, t = heapq.heappop(heap)
        begin, why = ready, ready_by[t]
        for r in dag.resources[t]:
            f = free.get(r, 0.0)
            if f > begin:
                begin, why = f, last_user[r]
        start[t], blocker[t] = begin, why
        finish = begin + durations[t] - min(dag.absorbs[t], begin - ready)
        end[t] = finish
        for r in dag.resources[t]:
            free[r] = finish
            last_user[r] = t
        done += 1
        for s in succ[t]:
            if finish >= ready_at[s]:
                ready_at[s], ready_by[s] = finish, t
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(heap, (ready_at[s], s))
    if done != n:
        raise ValueError(f"the task graph has a cycle: {n - done} tasks never became ready")
    return Schedule(start, end, blocker, durations)


def critical_path(dag: Dag, sched: Schedule, last: int, since: float = 0.0) -> list[int]:
    """Tasks that determined `last`'s finish, back to time `since`, in time order."""
    path = [last]
    t = sched.blocker[last]
    while t is not None and sched.end[t] > since:
        path.append(t)
        t = sched.blocker[t]
    return path[::-1]


def busy_time(dag: Dag, sched: Schedule, t0: float, t1: float) -> dict[Hashable, float]:
    """Per resource: time spent serving tasks within [t0, t1]."""
    busy: dict[Hashable, float] = {}
    for t in range(len(dag)):
        a, b = max(sched.start[t], t0), min(sched.end[t], t1)
        for r in dag.resources[t]:
            busy.setdefault(r, 0.0)
            if b > a:
                busy[r] += b - a
    return busy
