"""The parameter-server algorithms' DAGs (DESIGN §3): worker classes pushing to and pulling
from S shards, iteration by iteration, one builder per algorithm of training/algorithms.py.

Each says only what happens between backward and the next forward: how gradients reach the
shards (`exchange`) and what the worker's update waits for (`update`). What a transfer costs
and holds is the fabric's (modelling/network/fabric.py); a builder never looks at the placement.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from modelling.dag import Costs, Plan, add_transfer, after, comm_task
from modelling.network.fabric import OWN_PULL, SENDS_RETURNED, SHARD_PULLS, Fabric, Resource, compute
from modelling.simulate import Dag
from training.config import Algorithm


class _PSBuilder:
    """The iteration loop every PS algorithm shares: load, forward, backward and pack, the
    exchange with the shards, the update."""

    concurrent = True  # the round posts every transfer at once (Fabric's worker classes)

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        self.c, self.servers, self.dag = c, servers, Dag()
        self.fab = Fabric(c, workers, servers, concurrent=self.concurrent, max_classes=max_classes)
        self.mult, self.shard_bytes = self.fab.mult, self.fab.shard_bytes
        self.owners = [f"worker{k}" for k in range(len(self.mult))]
        self.prev_update: list[int | None] = [None] * len(self.mult)
        self.prev_push: list[list[int | None]] = [[None] * servers for _ in self.mult]
        self.active = list(range(len(self.mult)))

    def build(self, iterations: int, counts: Sequence[int] | None = None) -> Plan:
        """`iterations` of every class, or `counts[k]` of class k (ASGD's classes keep their
        own paces: one that laps the others is unrolled further, so they all run over one window)."""
        counts = list(counts) if counts is not None else [iterations] * len(self.mult)
        ends: dict[str, list[int]] = {w: [] for w in self.owners}
        for t in range(max(counts)):
            self.active = [k for k in range(len(self.mult)) if t < counts[k]]
            packs = {k: self._compute(t, k) for k in self.active}
            pulls = self.exchange(t, packs)
            for k in self.active:
                self.prev_update[k] = self.update(t, k, packs[k], pulls[k])
                ends[self.owners[k]].append(self.prev_update[k])
        return Plan(self.dag, ends, dict(zip(self.owners, self.mult, strict=True)))

    def _compute(self, t: int, k: int) -> int:
        """Load, forward, backward and pack: the task that has the gradients ready to send."""
        c, dag, w, cpu, p = self.c, self.dag, self.owners[k], (compute("worker", k),), self.mult[k]
        data = dag.add("data", c.data_s, (Resource("worker", k, "loader"),), (self.prev_update[k],),
                       kind="data", owner=w, step=t, procs=p)
        fwd = dag.add("forward", sum(c.fwd), cpu, (data,), kind="forward", owner=w, step=t, procs=p)
        bwd = dag.add("backward", sum(c.bwd), cpu, (fwd,), kind="backward", owner=w, step=t, procs=p)
        if c.straggle_s:  # the shard's barrier waits for the slowest worker's push
            bwd = dag.add("straggler", c.straggle_s, (), (bwd,), kind="straggle", owner=w, step=t)
        # OD-SGD reuses the push buffer, so its previous push must have left.
        return dag.add("pack", c.pack_s, cpu, (bwd, *self.prev_push[k]), kind="backward", owner=w, step=t,
                       procs=p)

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        """Per worker class, the tasks that bring back its share of the global model."""
        raise NotImplementedError

    def update(self, t: int, k: int, pack: int, pulls: list[int]) -> int:
        """The worker's update: copy the pulled model in (unpack); it waits for this step's pulls."""
        return self.dag.add("update", self.c.unpack_s, (compute("worker", k),), (pack, *pulls),
                            kind="update", owner=self.owners[k], step=t, procs=self.mult[k])


class _SyncServer(_PSBuilder):
    """The SSGD-PS server loop of each shard: receive all N pushes, update, send N pulls."""

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        super().__init__(c, workers, servers, max_classes)
        self.shard_free: list[int | None] = [None] * servers  # the shard's last pull has ended
        self.sent: list[int | None] = [None] * servers  # the shard's sends have returned
        self.pulled: list[list[int | None]] = [[None] * servers for _ in self.mult]  # class k's last pull from s

    def _transfer(self, name: str, t: int, k: int, s: int, deps, push: bool) -> int:
        return add_transfer(self.dag, name, self.fab.ps(k, s, push), deps, kind="comm", owner=self.owners[k], step=t)

    def _shared(self, t: int, s: int, shard_pulls: list[int]) -> list[int]:
        """When each class's pull from shard s is back (Fabric.pull_ends): pulls that share a
        link end together, or in its queue's order."""
        return [after(self.dag, f"pulled s{s}", end.wait_s, [shard_pulls[j] for j in end.after], kind="pulled",
                      owner=f"server{s}", step=t) for end in self.fab.pull_ends(s)]

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        pulls: list[list[int]] = [[] for _ in self.mult]
        for s in range(self.servers):
            pushes = []
            for k in range(len(self.mult)):
                self.prev_push[k][s] = self._transfer(f"push s{s}", t, k, s, (packs[k], *self._free(k, s)), True)
                pushes.append(self.prev_push[k][s])
            update = self.dag.add("server update", self.c.server_update_s / self.servers, (compute("server", s),),
                                  pushes, kind="server_update", owner=f"server{s}", step=t, procs=1)
            shard_pulls = [self._transfer(f"pull s{s}", t, k, s, (update,), False) for k in range(len(self.mult))]
            for k, pull in enumerate(self._shared(t, s, shard_pulls)):
                pulls[k].append(pull)
                self.pulled[k][s] = pull
            self.shard_free[s] = self.dag.add("server ready", 0.0, (), shard_pulls, kind="server_ready",
                                              owner=f"server{s}", step=t)
            self.sent[s] = self.dag.add("sends returned", self.fab.sends_returned_s(s), (), (update,),
                                        kind="server_ready", owner=f"server{s}", step=t)
        return pulls

    def _free(self, k: int, s: int) -> tuple[int | None, ...]:
        """What class k's next push to shard s waits for (Fabric.push_waits)."""
        events = {OWN_PULL: self.pulled[k][s], SENDS_RETURNED: self.sent[s], SHARD_PULLS: self.shard_free[s]}
        return tuple(events[e] for e in self.fab.push_waits(s))


class PSSSGDPlan(_SyncServer):
    """SSGD over a parameter server: every worker waits for W_g(t+1)."""


class ODSGDPlan(_SyncServer):
    """OD-SGD: the local update uses W_g(t), pulled during t-1; this step's pull runs on."""

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        super().__init__(c, workers, servers, max_classes)
        self.prev_pulls: list[list[int]] = [[] for _ in self.mult]  # the pulls of W_g(t)

    def update(self, t: int, k: int, pack: int, pulls: list[int]) -> int:
        c, cpu, w, p = self.c, (compute("worker", k),), self.owners[k], self.mult[k]
        # Posting this step's push and pull, before the wait for W_g(t).
        pack = add_transfer(self.dag, "post", self.fab.post(k), (pack,), kind="update", owner=w, step=t, procs=p)
        deps, self.prev_pulls[k] = (pack, *self.prev_pulls[k]), pulls
        return self.dag.add("update", c.unpack_s + c.update_s, cpu, deps, kind="update", owner=w, step=t, procs=p)


class ASGDPlan(_PSBuilder):
    """ASGD: each shard serves one push at a time, its update and reply included; no barrier.
    What one pass of a shard's loop holds, and what of its reply the link carries after it,
    is the fabric's (Fabric.asgd_pass). Beside a colocated shard the workers keep two paces:
    the shard's own node's worker is served whenever the loop is free of a remote worker's
    push and reply, so it steps several times per step of the remote one."""

    concurrent = False  # the shard's serial loop, not the link, orders the workers

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        pulls: list[list[int]] = [[] for _ in self.mult]
        for k, s in itertools.product(self.active, range(self.servers)):
            served = self.fab.asgd_pass(k, s, self.c.server_apply_s / self.servers)
            kw = {"kind": "comm", "owner": self.owners[k], "step": t}
            loop = comm_task(self.dag, f"push-apply-pull s{s}", served.serve_s, served.cpu_s,
                             (*served.links, compute("server", s)), served.cpus, (packs[k],),
                             absorbs=served.absorbs_s, **kw)
            pulls[k].append(add_transfer(self.dag, f"pull s{s}", served.tail, (loop,), **kw))
        return pulls


PS_PLANS: dict[Algorithm, type[_PSBuilder]] = {
    Algorithm.ssgd: PSSSGDPlan, Algorithm.asgd: ASGDPlan, Algorithm.odsgd: ODSGDPlan,
}


def build_ps(c: Costs, algorithm: Algorithm | str, workers: int, servers: int, iterations: int,
             max_classes: int = 8, counts: Sequence[int] | None = None) -> Plan:
    """SSGD-PS, ASGD or OD-SGD: worker classes pushing to and pulling from S shards."""
    return PS_PLANS[Algorithm(algorithm)](c, workers, servers, max_classes).build(iterations, counts)
