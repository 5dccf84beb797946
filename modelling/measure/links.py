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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What a TCP socket takes from a sender before its send blocks: half of the send buffer's
# ceiling (tcp_wmem's maximum; the other half is the kernel's per-packet overhead), on
# Linux's default 4 MiB ceiling 2 MiB. A send returns once its bytes are in that buffer, so a
# reply smaller than it returns long before the link has carried it, and a larger one returns
# that buffer's worth of wire time before the link is done (docs/model-core.md).
DEFAULT_TCP_WMEM_MAX = 4 << 20
TCP_WMEM = Path("/proc/sys/net/ipv4/tcp_wmem")
# A receiver's buffer, which autotuning grows up to tcp_rmem's maximum (Linux's default 6 MiB;
# distributions and hosts raise it, so the comm model records the host's own), half of it data
# as the send buffer's is.
DEFAULT_TCP_RMEM_MAX = 6 << 20
TCP_RMEM = Path("/proc/sys/net/ipv4/tcp_rmem")


def _ceiling(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return None


def tcp_wmem_max() -> int | None:
    """This network namespace's send-buffer ceiling (bytes), or None where it cannot be read."""
    return _ceiling(TCP_WMEM)


def tcp_rmem_max() -> int | None:
    """This network namespace's receive-buffer ceiling (bytes), or None where it cannot be read."""
    return _ceiling(TCP_RMEM)


def send_buffer_bytes(environment: Mapping[str, Any] | None) -> int:
    """The bytes of a send that the socket absorbs, so that the sender goes on while the link
    carries them: from the comm model's recorded tcp_wmem ceiling, else Linux's default."""
    ceiling = (environment or {}).get("tcp_wmem_max") or DEFAULT_TCP_WMEM_MAX
    return int(ceiling) // 2


def socket_buffer_bytes(environment: Mapping[str, Any] | None) -> int:
    """The bytes of a send that the two ends' sockets hold while the receiver does not read:
    the send buffer's part and the receive buffer's half (tcp_rmem's recorded ceiling, else
    Linux's default). Within a node, a push that waits for its shard has that much of itself
    there when the shard takes it (of mlp's 21 MB over loopback, 18 MiB under 4 MiB and 32 MiB
    ceilings)."""
    ceiling = (environment or {}).get("tcp_rmem_max") or DEFAULT_TCP_RMEM_MAX
    return send_buffer_bytes(environment) + int(ceiling) // 2


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


def p2p_pairs(workers: int, node_of_rank: Sequence[int] | None) -> dict[str, tuple[int, int]]:
    """The rank pairs a ping-pong times, one per link class the placement uses (DESIGN §3):
    'p2p' two ranks on different nodes, where training's ring steps and PS transfers cross a
    link (two workers if any two are on different nodes, else a worker and a shard); 'loopback'
    two ranks on one node, where a colocated shard's workers and a node's ring neighbours copy
    through the kernel. On one node the only class is loopback, and 'p2p' times it (ranks 0, 1).
    Uneven placements ([2, 1, 1]) put ranks 0 and 1 on one node: a pair by rank number would
    time loopback in the link's place."""
    ranks = len(node_of_rank) if node_of_rank is not None else 0
    if not multi_node(node_of_rank):
        return {"p2p": (0, 1)}
    by_role = [range(workers), range(ranks)]  # workers first, then any rank
    cross = next((0, b) for group in by_role for b in group if node_of_rank[b] != node_of_rank[0])
    pairs = {"p2p": cross}
    for group in by_role:
        same = next(((a, b) for a in group for b in group if a < b and node_of_rank[a] == node_of_rank[b]), None)
        if same is not None:
            pairs["loopback"] = same
            break
    return pairs
