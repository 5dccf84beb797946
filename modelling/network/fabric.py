"""Where an iteration's transfers run and what each costs: the one place of the model that
knows the placement (DESIGN §3, §5).

Given a world's `Wire` (modelling/network/wire.py: the fitted comm model read once, the node of every
rank and the regimes the microbenchmark measured), the fabric answers for every transfer of an
iteration (a worker class's push to a shard, a shard's pull back to it, a ring step of an
allreduce) its latency, its wire time, the CPU time of its copies and the resources it holds. Its link classes are what
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from modelling.measure.links import multi_node

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

# What a push to a synchronous shard may wait for (Fabric.push_waits).
OWN_PULL, SENDS_RETURNED, SHARD_PULLS = "own pull", "sends returned", "shard's pulls"


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


@dataclass(frozen=True)
class Pass:
    """One pass of an ASGD shard's serial loop for a worker class's pushes: receive, apply,
    reply. `serve_s` holds the shard's compute and `links` (its copying part `cpu_s`, None:
    all of it, also `cpus`); `absorbs_s` of it is what a wait for the loop absorbs (bytes
    that lay in the sockets' buffers meanwhile). Then `tail`, the reply's part that the link
    still carries while the shard serves on."""

    serve_s: float
    links: tuple[Resource, ...]
    cpus: tuple[Resource, ...]
    cpu_s: float | None
    absorbs_s: float
    tail: Transfer


class PullEnd(NamedTuple):
    """When a class's pull from a shard is back: `wait_s` after the last of the pulls of the
    classes `after` (its own among them) ends."""

    after: tuple[int, ...]
    wait_s: float = 0.0


def _split(workers: int, classes: int) -> list[int]:
    base, extra = divmod(workers, classes)
    return [base + (1 if k < extra else 0) for k in range(classes)]


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

    def _links(self, k: int, s: int, push: bool) -> tuple[Resource, ...]:
        """What a push (or pull) between class k and shard s holds: the two ranks' links on one
        host; the node links it crosses; nothing within a node."""
        kind = self.link_class(k, s)
        if kind == "host":
            return (link("worker", k), link("server", s))
        if kind == "loopback":
            return ()
        src, dst = (self.class_node[k], self.shard_node[s]) if push else (self.shard_node[s], self.class_node[k])
        return (uplink(src), downlink(dst))

    def _cpus(self, k: int, s: int | None = None) -> tuple[Resource, ...]:
        """The CPUs a loopback transfer on one host copies on: the worker's, and the shard's."""
        if not self.w.on_cpu or self.placed:
            return ()
        return (compute("worker", k),) if s is None else (compute("worker", k), compute("server", s))

    def _copy_s(self, nbytes: int, times: float) -> float | None:
        """The copying part of `times` transfers of nbytes (None: all of each is copying)."""
        return None if self.w.transfer_cpu_s is None else times * self.w.transfer_cpu_s(nbytes)

    # One transfer's time.

    def _one(self, k: int, s: int, nbytes: int) -> float:
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
        one = self._one(k, s, nbytes)
        links = self._links(k, s, push)
        if self.link_class(k, s) == "link":
            latency = min(self._one(k, s, 0), one)
            # The direction's bucket, filled while the class computed, passes its share of the
            # round's first bytes at once; the shards across the link share it.
            remote = sum(1 for node in self.shard_node if node != self.class_node[k])
            return Transfer(latency, max(m * (one - latency) - self.w.link_burst_s / remote, 0.0), links)
        if not links:  # within a node: latency only
            return Transfer(m * one, 0.0)
        return Transfer(0.0, m * one, links, self._cpus(k, s), self._copy_s(nbytes, m))

    def allreduce(self, nbytes: int, cpu: Resource) -> Transfer:
        """One allreduce of nbytes on the ring (the shared network); on loopback its copying
        part also holds the worker's CPU."""
        w = self.w
        cpus = (cpu,) if w.on_cpu else ()
        cpu_s = None if w.allreduce_cpu_s is None else w.allreduce_cpu_s(nbytes)
        return Transfer(0.0, w.allreduce_s(nbytes), (NETWORK,), cpus, cpu_s)

    def _copy_cpu_s(self, nbytes: int, ring: bool) -> float:
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
        the copying (`_copy_cpu_s`), as the DAG's tasks hold it. 0 elsewhere."""
        if self.w.host_cpu_s is not None:
            return self.w.host_cpu_s(nbytes)
        return self._copy_cpu_s(nbytes, ring) if self.w.on_cpu else 0.0

    def post(self, k: int) -> Transfer:
        """Class k's posting of a round's sends and receives, before it waits for the model it
        updates with: CPU time of its own where measured (gloo writes into the socket from the
        caller); nothing on one host, where the transfers' copies hold the CPUs instead."""
        return Transfer(0.0, self.w.post_s, (), (compute("worker", k),))

    # A synchronous shard's round: its pulls, sent at once; what the next push waits for.

    def _sharing(self, s: int) -> list[int]:
        """The classes whose pulls from shard s share one link: every class on one host (the
        shard's link); over nodes, the classes off the shard's node (its uplink)."""
        return [k for k in range(len(self.mult)) if self.link_class(k, s) != "loopback"]

    def _pull_lead(self, s: int) -> float:
        """How much sooner shard s's first remote class has its pull back than its last. A node's
        uplink is a FIFO queue (the qdisc), not a fair share: the first pull posted leaves
        first. 0 where not measured (or on one host): the pulls share the link and all end
        when the last does."""
        lead = self.w.pull_lead_s
        return lead(self.shard_bytes[s]) if self.placed and lead else 0.0

    def pull_ends(self, s: int) -> list[PullEnd]:
        """When each class's pull from shard s is back, given when each pull alone would end.
        The pulls that share the shard's link (`_sharing`) are sent at once. Shared fairly,
        each ends when the last does; where the first is back `lead` sooner than the last
        (`_pull_lead`: a FIFO uplink), the j-th of r ends lead (r-1-j)/(r-1) before the last,
        and no sooner than in queue order. A pull that shares its link with no other ends as
        it would alone."""
        classes = range(len(self.mult))
        remote = self._sharing(s)
        lead = self._pull_lead(s)
        if len(remote) < 2:
            return [PullEnd((k,)) for k in classes]
        if lead <= 0.0:
            return [PullEnd(tuple(remote)) if k in remote else PullEnd((k,)) for k in classes]
        ends = [0.0]  # in queue order
        for k in remote:
            ends.append(ends[-1] + self.ps(k, s, False).wire_s)
        out = [PullEnd((k,)) for k in classes]
        last, r = ends[-1], len(remote)
        for j, k in enumerate(remote[:-1]):
            out[k] = PullEnd((k,), max(last - lead * (r - 1 - j) / (r - 1) - ends[j + 1], 0.0))
        return out

    def push_waits(self, s: int) -> tuple[str, ...]:
        """What a worker's next push to shard s waits for, of OWN_PULL (its own pull from s, as
        `pull_ends` has it back), SENDS_RETURNED (`sends_returned_s` after the shard's update)
        and SHARD_PULLS (the shard's last pull). gloo sends a message only once its receiver has
        posted the receive, and says so on the pair's one connection, behind the bytes it sends
        the other way; the shard posts its next receives once its sends have returned: own pull
        and sends returned. Where the pulls' lead is not measured the pulls end together, and
        that is the shard's last pull."""
        return (OWN_PULL, SENDS_RETURNED) if self.placed and self.w.pull_lead_s else (SHARD_PULLS,)

    def sends_returned_s(self, s: int) -> float:
        """How long after its update shard s's sends of the pulls that cross links have all
        returned. A socket send returns once the kernel holds the rest of its bytes (the
        socket's send buffer, the qdisc's queue, TCP's window), so the shard's loop is free
        while the link still carries that much: the pulls' wire time less the bytes the kernel
        holds at the link's byte time, as the microbenchmark timed them in the reply's tail
        where it did, else the send buffer's bytes."""
        remote = self._sharing(s)
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

    def asgd_pass(self, k: int, s: int, apply_s: float) -> Pass:
        """One pass of shard s's loop for class k's `mult[k]` pushes, each applied in `apply_s`.
        Where the reply crosses a link, the shard goes back to receiving once its socket send
        has returned (`_reply_on_link`): the pass holds the push's links and the shard, and
        the reply's last part crosses the pull's links as its tail while the shard serves on.
        The pass holds the push's links, not the pull's: a link the next pass held from its
        start would keep this reply's tail waiting behind a whole push, where the shard's
        loop, which sends only after it has received, is what orders the replies.
        Elsewhere the copies are the transfer and the pass holds it all, with its CPUs on one
        host; a push within a node that waited for the loop lay in the sockets' buffers
        meanwhile (`_push_in_buffers`), so the pass is that much sooner once it takes it."""
        m, one = self.mult[k], self._asgd_one(k, s)
        on_link = self._reply_on_link(k, s)
        if on_link is not None:
            return Pass(m * (one + apply_s) + (m - on_link) * one, self._links(k, s, True), (), None, 0.0,
                        Transfer(0.0, on_link * one, self._links(k, s, False)))
        copies = self._copy_s(self.shard_bytes[s], 2 * m)
        links = tuple(dict.fromkeys(self._links(k, s, True) + self._links(k, s, False)))
        return Pass(m * (2 * one + apply_s), links, self._cpus(k), None if copies is None else copies + m * apply_s,
                    m * self._push_in_buffers(k, s) * one, Transfer(0.0, 0.0))

    def _asgd_one(self, k: int, s: int) -> float:
        """One way of class k's ASGD pass with shard s: half the pass the microbenchmark timed
        in ASGD's own pattern (a push to every shard and the replies, of the whole model's
        bytes), where it did; else one transfer."""
        passes = self.w.asgd_pass_s
        if passes is None:
            return self._one(k, s, self.shard_bytes[s])
        return passes[self.first_worker[k]](self.shard_bytes[s] * self.servers) / 2

    def _reply_on_link(self, k: int, s: int) -> float | None:
        """The fraction of shard s's reply to class k that a link still carries once the shard
        has returned from sending it: a socket send returns once the kernel has taken the
        bytes (the socket's send buffer, the qdisc's queue and TCP's window hold them), so the
        shard goes back to receiving while the link drains them: at most the reply's own time
        on the link. As the microbenchmark timed it where it did, else the send buffer's bytes
        (half of tcp_wmem's ceiling) at the link's byte time. None where the reply crosses no
        link (one host, within a node): there the copy is the transfer, and the loop holds it."""
        if self.link_class(k, s) != "link":
            return None
        nbytes, one = self.shard_bytes[s], self._asgd_one(k, s)
        if not nbytes or one <= 0:
            return 1.0
        wire = max(self._one(k, s, nbytes) - self._one(k, s, 0), 0.0)  # the reply's bytes on the link
        return min(self._held_s(k, nbytes, wire) / one, 1.0)

    def _push_in_buffers(self, k: int, s: int) -> float:
        """The fraction of a push within a node that lies in the two ends' socket buffers while
        it waits for the shard's loop (the sender's send buffer and the receiver's receive
        buffer fill before the send blocks), and so passes that much sooner once taken. 0 on
        one host, where the transfer's copies are CPU work that waits with it."""
        nbytes = self.shard_bytes[s]
        if self.link_class(k, s) != "loopback" or not nbytes:
            return 0.0
        return min(self.w.socket_buffer_bytes / nbytes, 1.0)
