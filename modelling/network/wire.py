"""What moving bytes costs one world, read once from the fitted comm model (modelling/network/costs.py's
`CommCosts`) for a scenario's placement: the `Wire` that the fabric (modelling/network/fabric.py)
alone answers transfers from. Every regime the microbenchmark measured is a field here, set
only where the scenario has it (a placed parameter server, ASGD, loopback's copying)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modelling.measure.links import multi_node, send_buffer_bytes, socket_buffer_bytes
from modelling.measure.records import CommModelError
from modelling.network.costs import CommCosts
from modelling.scenario import Scenario
from training.config import Algorithm, Comm


@dataclass
class Wire:
    """What the fitted comm model (modelling/network/costs.py's `CommCosts`) says one world's transfers
    cost, and what the fabric needs to know of where they run: the placement, the sockets'
    buffers, and the regimes the microbenchmark measured. Every regime correction of the model
    is an input here and is applied by `Fabric` alone. Seconds; bytes -> seconds look-ups."""

    allreduce_s: Callable[[int], float] = lambda _m: 0.0  # bytes -> seconds, for this N
    transfer_s: Callable[[int], float] = lambda _m: 0.0  # one push or pull of m bytes to a shard
    # Loopback: every rank on one host, where moving bytes is memory copies by the CPUs of
    # a transfer's two ends: that part holds their compute as well as their links. The
    # rest of a transfer (latency: waiting for a peer, waking a thread) leaves the CPU free.
    on_cpu: bool = False
    allreduce_cpu_s: Callable[[int], float] | None = None  # the copying part; None: all of it
    transfer_cpu_s: Callable[[int], float] | None = None
    # The node of every rank (workers, then shards) when placed on several nodes; None: one host.
    node_of_rank: Sequence[int] | None = None
    # Placed, what a socket takes of a send before it blocks the sender (modelling/measure/links.py):
    # an ASGD shard's reply of at most this many bytes leaves it free while the link carries it.
    send_buffer_bytes: int = 0
    # Placed, what the two ends' sockets hold of a send while the receiver does not read
    # (modelling/measure/links.py): within a node, an ASGD push that waits for its shard has at most
    # this many bytes there when the shard takes it, and passes that much sooner.
    socket_buffer_bytes: int = 0
    # Placed, a worker's CPU time to post a round's sends and receives (gloo writes into the
    # socket from the caller): on OD-SGD's critical path, inside the others' wait.
    post_s: float = 0.0
    # Placed, shard bytes -> how much sooner a shard's first remote worker (rank order) has its
    # pull back than its last, as measured (CommCosts.pull_lead); None or 0: a fair share, all
    # back together.
    pull_lead_s: Callable[[int], float] | None = None
    # Placed, one transfer between two ranks of one node (a colocated shard and its node's
    # workers): a loopback copy, which crosses no link; None: transfer_s at 0 bytes.
    local_transfer_s: float | None = None
    # An emulated cluster's nodes (every rank on one host, transfers on links), the host's
    # CPU-seconds of one allreduce or ps round, ranks and kernel, as measured (CommCosts.host_cpu):
    # for the bound of the host's cores (predict.host_cpu_bound), not a task. None: not measured,
    # or loopback, where the transfers' copying holds the DAG's CPUs instead.
    host_cpu_s: Callable[[int], float] | None = None
    # Per worker rank, the model's bytes -> seconds of its ASGD pass (a push to every shard and
    # the replies, no apply), as the microbenchmark timed it in ASGD's own pattern; None: from
    # the synchronous round's transfers.
    asgd_pass_s: Sequence[Callable[[float], float]] | None = None
    # Per worker rank, the model's bytes -> seconds that the link still carries an ASGD reply
    # after the shard has returned from sending it, as the microbenchmark timed it; None: the
    # socket's `send_buffer_bytes` at the link's byte time.
    asgd_reply_tail_s: Sequence[Callable[[float], float]] | None = None
    # Placed, the seconds of the link's rate that one direction of a node link passes at once
    # after a worker's computation, where transfer_s charges its sustained rate
    # (CommCosts.link_burst: its token bucket); 0: none, or transfer_s holds it already.
    link_burst_s: float = 0.0


def wire_of(comm: CommCosts, s: Scenario, model_bytes: int) -> Wire:
    """Scenario `s`'s wire, from its comm model: its primitive's look-ups for its world, and
    the regimes of its placement."""
    allreduce = comm.allreduce(s.workers) if s.comm == Comm.allreduce else (lambda _m: 0.0)
    transfer = comm.transfer(s.workers, s.servers) if s.comm == Comm.ps else (lambda _m: 0.0)
    on_cpu = bool(s.comm_on_cpu)
    placed_ps = s.comm == Comm.ps and multi_node(s.node_of_rank)
    asgd = s.algorithm == Algorithm.asgd
    return Wire(
        allreduce_s=allreduce,
        transfer_s=transfer,
        on_cpu=on_cpu,
        allreduce_cpu_s=copying_part(allreduce) if on_cpu else None,
        transfer_cpu_s=copying_part(transfer) if on_cpu else None,
        node_of_rank=s.node_of_rank,
        send_buffer_bytes=send_buffer_bytes(comm.environment),
        socket_buffer_bytes=socket_buffer_bytes(comm.environment) if placed_ps else 0,
        post_s=comm.post(s.workers, s.servers)(model_bytes) if placed_ps else 0.0,
        local_transfer_s=comm.loopback_latency() if placed_ps else None,
        pull_lead_s=comm.pull_lead(s.workers, s.servers) if placed_ps else None,
        # Measured host CPU where the DAG's CPUs do not hold the copies (an emulated cluster's
        # nodes); on loopback the copying part of the transfers is that CPU time already.
        host_cpu_s=comm.host_cpu(s.comm, s.workers, s.servers) if not on_cpu else None,
        asgd_pass_s=comm.asgd_pass(s.workers, s.servers) if asgd else None,
        asgd_reply_tail_s=comm.asgd_reply_tail(s.workers, s.servers) if asgd and placed_ps else None,
        link_burst_s=comm.link_burst(s.workers, s.servers) if placed_ps else 0.0,
    )


def copying_part(cost: Callable[[int], float]) -> Callable[[int], float]:
    """bytes -> the seconds of a transfer that grow with its size: the copying a CPU does
    (the asymptotic per-byte cost, from the cost past 64 MiB, times the bytes). What is
    left of the cost (its latency) is waiting, not work."""
    big = 1 << 26
    try:
        per_byte = max((cost(2 * big) - cost(big)) / big, 0.0)
    except CommModelError:  # no slope to extrapolate along: count all of it as copying
        return cost
    return lambda m: min(cost(m), m * per_byte)
