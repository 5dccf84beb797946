"""Which node links a parameter-server round crosses, from where the ranks run (DESIGN §5).

`node_of_rank` is a placement's node per rank (infra/placement.py: workers 0..N-1, then the
S shards). Links are full duplex: each node has an uplink (what it sends) and a downlink
(what it receives), and a transfer between two ranks of one node crosses neither. In a
push, every worker sends M/S bytes to each shard: a node's uplink carries its workers'
pushes to the shards of other nodes, its downlink its shards' pushes from workers of
other nodes; a pull is the same in reverse. None, or every rank on one node, is one host:
there the transfers to a shard queue on that shard's own (loopback) link, N per direction.
"""

from __future__ import annotations

from collections.abc import Sequence


def multi_node(node_of_rank: Sequence[int] | None) -> bool:
    """Whether the ranks span more than one node (links between them, not loopback)."""
    return node_of_rank is not None and len(set(node_of_rank)) > 1


def ps_link_queue(workers: int, servers: int, node_of_rank: Sequence[int] | None) -> int:
    """Transfers of M/S bytes that queue on the busiest link, one way, in one push (or pull)
    phase of N workers and S shards: what a round of push then pull pays twice.

    One host: the N transfers on a shard's link. Over nodes: the most that one node's uplink
    or downlink carries; 0 when no transfer leaves its node."""
    if not multi_node(node_of_rank):
        return workers
    if len(node_of_rank) != workers + servers:
        raise ValueError(f"node_of_rank: {len(node_of_rank)} ranks placed for {workers} workers + {servers} shards")
    worker_nodes, shard_nodes = list(node_of_rank[:workers]), list(node_of_rank[workers:])
    busiest = 0
    for node in set(node_of_rank):
        w, s = worker_nodes.count(node), shard_nodes.count(node)
        busiest = max(busiest, w * (servers - s), s * (workers - w))
    return busiest
