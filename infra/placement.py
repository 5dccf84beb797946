"""Where a job's ranks run: the placement policy of DESIGN §5.

Workers spread evenly over the worker nodes (`devices_per_node` each when given, filling
nodes in order); parameter-server shards are either **colocated** (spread round-robin over
the worker nodes, as MXNet and BytePS deployments run them: the default) or on
**dedicated** server nodes (the last `server_nodes` nodes, which then run no worker).

Rank numbering keeps the trainer's roles: ranks 0..N-1 are workers, N..N+S-1 shards, each
role numbered in node order. A launcher starts one torchrun agent per (role, node) that
runs ranks of that role, workers' agents first: torchrun numbers an agent's ranks after
those of the agents before it (static rendezvous, `--node-rank` = agent index), so the
agents' order is the rank order. Within a node, workers' LOCAL_RANK is 0..c-1: a
`--device cuda` worker pins its local GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class PlacementError(ValueError):
    """The job's ranks cannot be placed on the cluster; the message names the field."""


class Policy(StrEnum):
    colocated = "colocated"
    dedicated = "dedicated"


@dataclass(frozen=True)
class Agent:
    """One torchrun agent: `nproc` ranks of `role` on node `node`, the first numbered `first_rank`."""

    node: int
    role: str  # "worker" or "server"
    nproc: int
    first_rank: int

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)


@dataclass(frozen=True)
class Placement:
    """Node of every rank, workers first (ranks 0..workers-1), then shards."""

    policy: Policy
    nodes: int
    workers: int
    servers: int
    node_of_rank: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return self.workers + self.servers

    def workers_on(self, node: int) -> list[int]:
        return [r for r in range(self.workers) if self.node_of_rank[r] == node]

    def servers_on(self, node: int) -> list[int]:
        return [r for r in range(self.workers, self.world_size) if self.node_of_rank[r] == node]

    def agents(self) -> list[Agent]:
        """The torchrun agents in rank order: each node's workers, then each node's shards."""
        out: list[Agent] = []
        for role, on in (("worker", self.workers_on), ("server", self.servers_on)):
            for node in range(self.nodes):
                if ranks := on(node):
                    out.append(Agent(node, role, len(ranks), ranks[0]))
        return out

    def nprocs(self) -> list[int]:
        """Every agent's rank count in rank order: the launcher's `--nprocs` (infra/zygote.py)."""
        return [a.nproc for a in self.agents()]

    @property
    def uniform(self) -> bool:
        """One agent per node, each with the same rank count: what a scheduler that starts the
        same command on every node can launch without per-node arguments."""
        agents = self.agents()
        return len({a.node for a in agents}) == len(agents) == self.nodes and len({a.nproc for a in agents}) == 1

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of_rank[a] == self.node_of_rank[b]

    def as_dict(self) -> dict[str, Any]:
        """What summary.json and MLflow record."""
        return {
            "policy": self.policy.value,
            "nodes": self.nodes,
            "workers_per_node": [len(self.workers_on(n)) for n in range(self.nodes)],
            "servers_per_node": [len(self.servers_on(n)) for n in range(self.nodes)],
            "node_of_rank": list(self.node_of_rank),
        }

    def describe(self) -> str:
        """'2 nodes, colocated: node0 w0 s2, node1 w1'."""
        parts = []
        for n in range(self.nodes):
            ranks = [f"w{r}" for r in self.workers_on(n)] + [f"s{r}" for r in self.servers_on(n)]
            parts.append(f"node{n} " + (" ".join(ranks) or "-"))
        return f"{self.nodes} nodes, {self.policy.value}: " + ", ".join(parts)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        ranks = tuple(data["node_of_rank"])
        workers = sum(data["workers_per_node"])
        return cls(Policy(data["policy"]), data["nodes"], workers, len(ranks) - workers, ranks)


def _spread(count: int, nodes: list[int], per_node: int | None) -> list[int]:
    """Nodes of `count` ranks: `per_node` per node in order when given, else evenly (the
    first count % len(nodes) nodes one more), each node's ranks consecutive."""
    if per_node is not None:
        return [nodes[i // per_node] for i in range(count)]
    base, extra = divmod(count, len(nodes))
    out: list[int] = []
    for i, node in enumerate(nodes):
        out += [node] * (base + (i < extra))
    return out


def place(workers: int, servers: int, nodes: int, policy: Policy | str = Policy.colocated, *,
          devices_per_node: int | None = None, server_nodes: int = 1,
          where: str = "provider.options") -> Placement:
    """The placement of a job of `workers` + `servers` ranks, or PlacementError naming the field."""
    try:
        policy = Policy(policy)
    except ValueError:
        raise PlacementError(f"{where}.placement: expected colocated or dedicated, got {policy!r}") from None
    if workers < 1:
        raise PlacementError(f"workers: a job needs at least 1 worker, got {workers}")
    if policy is Policy.dedicated and servers:
        if server_nodes < 1 or server_nodes >= nodes:
            raise PlacementError(
                f"{where}.server_nodes: dedicated shards need 1 to {nodes - 1} of the {nodes} nodes "
                f"(the others run the workers), got {server_nodes}")
        if servers < server_nodes:
            raise PlacementError(
                f"{where}.server_nodes: {server_nodes} dedicated server nodes for {servers} shard(s) "
                "would leave a server node empty")
        worker_nodes = list(range(nodes - server_nodes))
    else:
        worker_nodes = list(range(nodes))
    if devices_per_node is not None:
        slots = devices_per_node * len(worker_nodes)
        if workers > slots:
            raise PlacementError(
                f"{where}.devices_per_node: {workers} workers exceed the {slots} worker slots of "
                f"{len(worker_nodes)} node(s) x {devices_per_node} devices")
    else:
        worker_nodes = worker_nodes[:workers]  # never more worker nodes than workers
    ranks = _spread(workers, worker_nodes, devices_per_node)
    if policy is Policy.dedicated and servers:
        ranks += _spread(servers, list(range(nodes - server_nodes, nodes)), None)
    else:
        used = sorted(set(ranks))  # colocated: round-robin over the nodes that run workers
        ranks += sorted(used[j % len(used)] for j in range(servers))
    return Placement(policy, nodes, workers, servers, tuple(ranks))
