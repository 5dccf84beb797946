"""Where an iteration's transfers run and what each costs: the one place of the model that
knows the placement (DESIGN §3, §5).

Given a world's `Wire` (the fitted comm model's look-ups, the node of every rank and the
regimes the microbenchmark measured), the fabric answers for every transfer of an iteration (a worker class's
push to a shard, a shard's pull back to it, a ring step of an allreduce) its latency, its
wire time, the CPU time of its copies and the resources it holds. Its link classes are what
the placement has:

- host: every rank on one host (no placement). A rank's transfers queue on its own link, and
  a transfer's copying is CPU work of the ranks at its two ends (loopback sockets are memory
  copies by the kernel on the caller's core).
- loopback: two ranks on one node of a cluster (a colocated shard and its node's workers).
  No link is crossed; a transfer costs the latency of a ping-pong within the node.
- link: two ranks on different nodes, over full-duplex node links: a push holds the sender
  node's uplink and the shard node's downlink, a pull the reverse.
- a what-if link of a stated rate is a link whose byte time is that rate's (CommCosts).

The DAG builders (modelling/dag.py, dag_ps.py) ask it and never look at the placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from modelling.links import multi_node

if TYPE_CHECKING:
    from modelling.dag import Costs


class Resource(NamedTuple):
    """What a task holds while it runs: a part of one rank (worker 0's compute, shard 1's
    link) or the shared network of a ring. A tuple: the simulator hashes and compares it
    millions of times a prediction, in C."""

    role: str  # "worker", "server", "node" or "network"
    index: int | None = None
    part: str = ""  # "compute", "link" or "loader"; a node's "up" or "down" link

    @property
    def owner(self) -> str:
        """The rank it belongs to, as the DAG's owners name them: worker0, server1."""
        return self.role if self.index is None else f"{self.role}{self.index}"

    @property
    def group(self) -> str:
        """The same part of every rank of its role (utilisation is per group): server.link."""
        return self.role + ("." + self.part if self.part else "")

    def __str__(self) -> str:
        return self.owner + ("." + self.part if self.part else "")


NETWORK = Resource("network")


def compute(role: str, index: int) -> Resource:
    return Resource(role, index, "compute")


def link(role: str, index: int) -> Resource:
    return Resource(role, index, "link")


def uplink(node: int) -> Resource:
    return Resource("node", node, "up")


def downlink(node: int) -> Resource:
    return Resource("node", node, "down")


@dataclass(frozen=True)
class Transfer:
    """A transfer (or a worker class's transfers sent at once): first `latency_s` of waiting
    that holds nothing, then `wire_s` that holds `links`; `cpu_s` of the wire time (None:
    all of it) also holds `cpus`, the CPUs that copy the bytes (one host's loopback)."""

    latency_s: float
    wire_s: float
    links: tuple[Resource, ...] = ()
    cpus: tuple[Resource, ...] = ()
    cpu_s: float | None = None

    @property
    def seconds(self) -> float:
        return self.latency_s + self.wire_s


def _split(workers: int, classes: int) -> list[int]:
    base, extra = divmod(workers, classes)
    return [base + (1 if k < extra else 0) for k in range(classes)]


@dataclass
class Wire:
    """What the fitted comm model (modelling/costs.py's `CommCosts`) says one world's transfers
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
    # Placed, what a socket takes of a send before it blocks the sender (modelling/links.py):
    # an ASGD shard's reply of at most this many bytes leaves it free while the link carries it.
    send_buffer_bytes: int = 0
    # Placed, what the two ends' sockets hold of a send while the receiver does not read
    # (modelling/links.py): within a node, an ASGD push that waits for its shard has at most
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


class Fabric:
    """The transfers of one world (`c`'s costs, its wire's `node_of_rank` placement) between worker
    classes and shards. Worker classes stand for `mult[k]` identical workers; placed, they are
    formed within each node (a node's workers share its links). `concurrent`: a round posts
    every transfer at once, so a node's workers share its link fairly and finish together:
    one class per node (a link serving them one after the other would let the first served
    compute while the last still waits, a pipelining a fairly shared link does not give)."""

    def __init__(self, c: Costs, workers: int, servers: int, *, concurrent: bool = True,
                 max_classes: int = 8) -> None:
        self.w, self.servers = c.wire, servers
        self.placed = multi_node(self.w.node_of_rank)
        self.mult: list[int] = []
        self.first_worker: list[int] = []  # a worker rank each class stands for
        self.class_node: list[int | None] = []
        self.shard_node: list[int | None] = [None] * servers
        if self.placed:
            worker_nodes = list(self.w.node_of_rank[:workers])
            for node in sorted(set(worker_nodes)):
                count = worker_nodes.count(node)
                classes = 1 if concurrent else min(count, max(1, round(max_classes * count / workers)))
                for m in _split(count, classes):
                    self.class_node.append(node)
                    self.mult.append(m)
                    self.first_worker.append(worker_nodes.index(node))
            self.shard_node = list(self.w.node_of_rank[workers:])
        else:
            self.mult = _split(workers, min(workers, max_classes))
            self.first_worker = [sum(self.mult[:k]) for k in range(len(self.mult))]
            self.class_node = [None] * len(self.mult)
        model = c.model_bytes
        self.shard_bytes = [model // servers + (1 if s < model % servers else 0) for s in range(servers)]

    # Link classes and the resources they hold.

    def link_class(self, k: int, s: int) -> str:
        """'host', 'loopback' or 'link' (the module's docstring) between class k and shard s."""
        if not self.placed:
            return "host"
        return "loopback" if self.class_node[k] == self.shard_node[s] else "link"

    def links(self, k: int, s: int, push: bool) -> tuple[Resource, ...]:
        """What a push (or pull) between class k and shard s holds: the two ranks' links on one
        host; the node links it crosses; nothing within a node."""
        kind = self.link_class(k, s)
        if kind == "host":
            return (link("worker", k), link("server", s))
        if kind == "loopback":
            return ()
        src, dst = (self.class_node[k], self.shard_node[s]) if push else (self.shard_node[s], self.class_node[k])
        return (uplink(src), downlink(dst))

    def cpus(self, k: int, s: int | None = None) -> tuple[Resource, ...]:
        """The CPUs a loopback transfer on one host copies on: the worker's, and the shard's."""
        if not self.w.on_cpu or self.placed:
            return ()
        return (compute("worker", k),) if s is None else (compute("worker", k), compute("server", s))

    def copy_s(self, nbytes: int, times: float) -> float | None:
        """The copying part of `times` transfers of nbytes (None: all of each is copying)."""
        return None if self.w.transfer_cpu_s is None else times * self.w.transfer_cpu_s(nbytes)

    # One transfer's time.

    def one(self, k: int, s: int, nbytes: int) -> float:
        """One transfer of nbytes between class k and shard s. Within a node it crosses no link:
        its latency alone (the ping-pong within the node where measured; else the link's, as a
        loopback copy is no slower), whatever the bytes."""
        if self.link_class(k, s) == "loopback":
            local = self.w.local_transfer_s
            return self.w.transfer_s(0) if local is None else local
        return self.w.transfer_s(nbytes)

    def ps(self, k: int, s: int, push: bool) -> Transfer:
        """Class k's transfers of shard s's bytes (a push, or a pull back). Over a node link,
        transfers sent at once wait out their latencies together and queue only for their
        bytes: the latency (one transfer's at 0 bytes) holds no link and is paid once per
        class. On one host every transfer queues on the shard's link, latency and all (a
        loopback transfer's latency is the CPUs' copies and wake-ups, which queue too)."""
        nbytes, m = self.shard_bytes[s], self.mult[k]
        one = self.one(k, s, nbytes)
        links = self.links(k, s, push)
        if self.link_class(k, s) == "link":
            latency = min(self.one(k, s, 0), one)
            # The direction's bucket, filled while the class computed, passes its share of the
            # round's first bytes at once; the shards across the link share it.
            remote = sum(1 for node in self.shard_node if node != self.class_node[k])
            return Transfer(latency, max(m * (one - latency) - self.w.link_burst_s / remote, 0.0), links)
        if not links:  # within a node: latency only
            return Transfer(m * one, 0.0)
        return Transfer(0.0, m * one, links, self.cpus(k, s), self.copy_s(nbytes, m))

    def allreduce(self, nbytes: int, cpu: Resource) -> Transfer:
        """One allreduce of nbytes on the ring (the shared network); on loopback its copying
        part also holds the worker's CPU."""
        w = self.w
        cpus = (cpu,) if w.on_cpu else ()
        cpu_s = None if w.allreduce_cpu_s is None else w.allreduce_cpu_s(nbytes)
        return Transfer(0.0, w.allreduce_s(nbytes), (NETWORK,), cpus, cpu_s)

    def copy_cpu_s(self, nbytes: int, ring: bool) -> float:
        """The CPU-seconds of copies in one allreduce of nbytes (`ring`) or one PS round (every
        worker's push and pull of each shard's share of nbytes) on one host's loopback: each
        transfer copies at both its ends (into and out of the socket), each rank of a ring
        copies its share of every step."""
        w, workers = self.w, sum(self.mult)
        if ring:
            return workers * (w.allreduce_cpu_s or w.allreduce_s)(nbytes)
        copy = w.transfer_cpu_s or w.transfer_s
        return 2 * 2 * workers * self.servers * copy(int(nbytes / self.servers))

    def on_one_host(self) -> bool:
        """Whether every rank's communication costs the one host's CPUs: loopback, or an emulated
        cluster's nodes whose network stack the microbenchmark measured on the host."""
        return self.w.on_cpu or self.w.host_cpu_s is not None

    def host_cpu_s(self, nbytes: int, ring: bool) -> float:
        """The host's CPU-seconds of one allreduce of nbytes (`ring`) or one PS round of them
        (`on_one_host`): on an emulated cluster's nodes, as the microbenchmark measured it (ranks
        and kernel alike: the veth links' network stack runs on the same cores); on loopback,
        the copying (`copy_cpu_s`), as the DAG's tasks hold it. 0 elsewhere."""
        if self.w.host_cpu_s is not None:
            return self.w.host_cpu_s(nbytes)
        return self.copy_cpu_s(nbytes, ring) if self.w.on_cpu else 0.0

    def post_cpu_s(self) -> float:
        """A worker's CPU time to post a round's sends and receives (gloo writes into the socket
        from the caller); 0 on one host, where the transfers' copies hold the CPUs instead."""
        return self.w.post_s

    # A synchronous shard's round: its pulls, sent at once.

    def sharing(self, s: int) -> list[int]:
        """The classes whose pulls from shard s share one link: every class on one host (the
        shard's link); over nodes, the classes off the shard's node (its uplink)."""
        return [k for k in range(len(self.mult)) if self.link_class(k, s) != "loopback"]

    def pull_lead(self, s: int) -> float:
        """How much sooner shard s's first remote class has its pull back than its last. A node's
        uplink is a FIFO queue (the qdisc), not a fair share: the first pull posted leaves
        first. 0 where not measured (or on one host): the pulls share the link and all end
        when the last does."""
        lead = self.w.pull_lead_s
        return lead(self.shard_bytes[s]) if self.placed and lead else 0.0

    def push_waits_for_own_pull(self, s: int) -> bool:
        """Whether a worker's next push to shard s waits for its own pull (and the shard's sends'
        return, sends_returned_s), not the shard's last pull. gloo sends a message only once its
        receiver has posted the receive, and says so on the pair's one connection, behind the
        bytes it sends the other way; the shard posts its next receives once its sends have
        returned. Where the pulls' lead is not measured the pulls end together, and the two
        are one."""
        return bool(self.placed and self.w.pull_lead_s)

    def sends_returned_s(self, s: int) -> float:
        """How long after its update shard s's sends of the pulls that cross links have all
        returned. A socket send returns once the kernel holds the rest of its bytes (the
        socket's send buffer, the qdisc's queue, TCP's window), so the shard's loop is free
        while the link still carries that much: the pulls' wire time less the bytes the kernel
        holds at the link's byte time, as the microbenchmark timed them in the reply's tail
        where it did, else the send buffer's bytes."""
        remote = self.sharing(s)
        total = self.shard_bytes[s] * len(remote)
        if not total:
            return 0.0
        wire = sum(self.ps(k, s, False).wire_s for k in remote)
        return wire - self._held_s(remote[-1], total, wire)

    def _held_s(self, k: int, nbytes: float, wire: float) -> float:
        """Of a send of `nbytes` from a shard to class k, taking `wire` seconds on the link, the
        seconds the link still carries once the send has returned: the kernel's held bytes, as
        the microbenchmark timed them in the ASGD reply's tail where it did, else the send
        buffer's; at most the send's own wire time."""
        w = self.w
        if w.asgd_reply_tail_s is not None:
            return min(w.asgd_reply_tail_s[self.first_worker[k]](nbytes * self.servers), wire)
        return min(w.send_buffer_bytes / nbytes, 1.0) * wire

    # ASGD: a shard's serial loop of receive, apply, reply.

    def asgd_one(self, k: int, s: int) -> float:
        """One way of class k's ASGD pass with shard s: half the pass the microbenchmark timed
        in ASGD's own pattern (a push to every shard and the replies, of the whole model's
        bytes), where it did; else one transfer."""
        passes = self.w.asgd_pass_s
        if passes is None:
            return self.one(k, s, self.shard_bytes[s])
        return passes[self.first_worker[k]](self.shard_bytes[s] * self.servers) / 2

    def reply_on_link(self, k: int, s: int) -> float | None:
        """The fraction of shard s's reply to class k that a link still carries once the shard
        has returned from sending it: a socket send returns once the kernel has taken the
        bytes (the socket's send buffer, the qdisc's queue and TCP's window hold them), so the
        shard goes back to receiving while the link drains them: at most the reply's own time
        on the link. As the microbenchmark timed it where it did, else the send buffer's bytes
        (half of tcp_wmem's ceiling) at the link's byte time. None where the reply crosses no
        link (one host, within a node): there the copy is the transfer, and the loop holds it."""
        if self.link_class(k, s) != "link":
            return None
        nbytes, one = self.shard_bytes[s], self.asgd_one(k, s)
        if not nbytes or one <= 0:
            return 1.0
        wire = max(self.one(k, s, nbytes) - self.one(k, s, 0), 0.0)  # the reply's bytes on the link
        return min(self._held_s(k, nbytes, wire) / one, 1.0)

    def push_in_buffers(self, k: int, s: int) -> float:
        """The fraction of a push within a node that lies in the two ends' socket buffers while
        it waits for the shard's loop (the sender's send buffer and the receiver's receive
        buffer fill before the send blocks), and so passes that much sooner once taken. 0 on
        one host, where the transfer's copies are CPU work that waits with it."""
        nbytes = self.shard_bytes[s]
        if self.link_class(k, s) != "loopback" or not nbytes:
            return 0.0
        return min(self.w.socket_buffer_bytes / nbytes, 1.0)

