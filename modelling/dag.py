"""The task DAG of one training configuration, unrolled over iterations (DESIGN §3).

Tasks follow what the trainer really does (training/trainer.py, algorithms.py,
ps.py): data is loaded synchronously at the start of an iteration; SSGD with
allreduce overlaps DDP's bucketed allreduce with backward (or one flat allreduce
after it); the PS server is one loop per shard (receive, update, send); ASGD's
server serves one push at a time, update and reply included; OD-SGD starts the
push and pull of step t and updates locally with W_g(t), pulled during t-1.

Workers are symmetric, so SSGD-allreduce simulates one representative worker on
a ring of N. The PS algorithms simulate up to `max_classes` worker classes, each
standing for `multiplicity` identical workers whose transfers queue back to back
on the shard's link.

Placed on several nodes (`Costs.node_of_rank`, DESIGN §5), worker classes are formed
within each node (`_PSBuilder.concurrent`), and transfers hold full-duplex node links (modelling/links.py): a
push the sender node's uplink and the shard node's downlink, a pull the reverse. A
colocated shard's own node's workers reach it without crossing a link (a transfer
of their latency alone), while the node's link carries the other nodes' traffic to
it; a dedicated shard's node runs no worker. A shard node's uplink, a FIFO queue, hands
the first of the pulls sent at once back sooner than the last, by what the microbenchmark
measured (`_SyncServer._shared`), and a worker's next push waits for its own pull, not the
shard's last (`_SyncServer._free`: gloo's rendezvous on the pair's one connection). Comm on
the CPU (loopback) does not apply between nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from modelling.links import multi_node
from modelling.scenario import Scenario
from modelling.simulate import Dag


@dataclass
class Costs:
    """Per-iteration task durations of one worker, in seconds, for one world size."""

    fwd: list[float]
    bwd: list[float]  # in forward (layer) order; backward runs them in reverse
    layer_bytes: list[int]
    param_tensor_bytes: list[list[int]]  # per layer, its parameter tensors in registration order
    data_s: float
    update_s: float  # the optimizer step on the worker
    pack_s: float = 0.0  # copy gradients into a flat buffer
    unpack_s: float = 0.0  # copy a flat buffer back into the parameters
    server_update_s: float = 0.0  # sync shard: average N pushes + optimizer step
    server_apply_s: float = 0.0  # async shard: apply one push
    straggle_s: float = 0.0  # a barrier's expected wait for the slowest of the N workers
    allreduce_s: Callable[[int], float] = lambda _m: 0.0  # bytes -> seconds, for this N
    transfer_s: Callable[[int], float] = lambda _m: 0.0  # one push or pull of m bytes to a shard
    # Loopback: every rank on one host, where moving bytes is memory copies by the CPUs of
    # a transfer's two ends: that part holds their compute as well as their links. The
    # rest of a transfer (latency: waiting for a peer, waking a thread) leaves the CPU free.
    comm_on_cpu: bool = False
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
    host_comm_cpu_s: Callable[[int], float] | None = None
    # Per worker rank, the model's bytes -> seconds of its ASGD pass (a push to every shard and
    # the replies, no apply), as the microbenchmark timed it in ASGD's own pattern; None: from
    # the synchronous round's transfers.
    asgd_pass_s: Sequence[Callable[[float], float]] | None = None
    # Per worker rank, the model's bytes -> seconds that the link still carries an ASGD reply
    # after the shard has returned from sending it, as the microbenchmark timed it; None: the
    # socket's `send_buffer_bytes` at the transfer's rate.
    asgd_reply_tail_s: Sequence[Callable[[float], float]] | None = None

    @property
    def model_bytes(self) -> int:
        return sum(self.layer_bytes)


@dataclass(frozen=True)
class Resource:
    """What a task holds while it runs: a part of one rank (worker 0's compute, shard 1's
    link) or the shared network of a ring."""

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


@dataclass
class Plan:
    """A built DAG and where to read its results."""

    dag: Dag
    iteration_ends: dict[str, list[int]]  # worker owner -> the task ending each step
    multiplicity: dict[str, int] = field(default_factory=dict)


def comm_task(
    dag: Dag,
    name: str,
    duration: float,
    cpu_s: float | None,
    links: tuple[Resource, ...],
    cpus: tuple[Resource, ...],
    deps,
    **kw,
) -> int:
    """A transfer on its links; on loopback (cpus given) its copying part, cpu_s of the
    duration (None: all of it), also holds those CPUs, after the latency part."""
    if not cpus:
        return dag.add(name, duration, links, deps, **kw)
    cpu = duration if cpu_s is None else min(max(cpu_s, 0.0), duration)
    if cpu < duration:
        deps = (dag.add(name, duration - cpu, links, deps, **kw),)
    return dag.add(name, cpu, links + cpus, deps, **kw)


def ddp_buckets(
    tensor_bytes_backward: list[int], cap_bytes: int, first_cap_bytes: int | None = None
) -> list[list[int]]:
    """DDP's bucket assignment (torch `_compute_bucket_assignment_by_size`) over
    parameter tensors in gradient-ready order: fill a bucket until it reaches its
    cap, the first bucket with `first_cap_bytes`. The trainer passes bucket_cap_mb
    explicitly, which makes torch use that cap for the first bucket too."""
    limit = first_cap_bytes or cap_bytes
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, nbytes in enumerate(tensor_bytes_backward):
        current.append(i)
        size += nbytes
        if size >= limit:
            buckets.append(current)
            current, size = [], 0
            limit = cap_bytes
    if current:
        buckets.append(current)
    return buckets


def _split(workers: int, classes: int) -> list[int]:
    base, extra = divmod(workers, classes)
    return [base + (1 if k < extra else 0) for k in range(classes)]


def build_allreduce(c: Costs, workers: int, iterations: int, *, overlap: bool, bucket_bytes: int) -> Plan:
    """SSGD-allreduce on one representative worker. bucket_bytes <= 0: per-layer WFBP."""
    dag = Dag()
    w, cpu, net, loader = "worker0", compute("worker", 0), NETWORK, Resource("worker", 0, "loader")
    cpus = (cpu,) if c.comm_on_cpu else ()
    ar_cpu = c.allreduce_cpu_s or (lambda _m: None)
    n_layers = len(c.fwd)
    ends: list[int] = []
    prev_update: int | None = None
    prev_comm: int | None = None
    groups = comm_groups(c, overlap, bucket_bytes) if workers > 1 else []
    for t in range(iterations):
        data = dag.add("data", c.data_s, (loader,), (prev_update,), kind="data", owner=w, step=t)
        last = data
        for layer in range(n_layers):
            last = dag.add(f"f{layer}", c.fwd[layer], (cpu,), (last,), kind="forward", owner=w, step=t)
        done_at: dict[int, int] = {}
        for layer in reversed(range(n_layers)):
            last = dag.add(f"b{layer}", c.bwd[layer], (cpu,), (last,), kind="backward", owner=w, step=t)
            done_at[layer] = last
        if groups and c.straggle_s:
            # The last gradients are ready everywhere only once the slowest worker's are.
            last = dag.add("straggler", c.straggle_s, (), (last,), kind="straggle", owner=w, step=t)
            done_at[groups[-1][0]] = last
        before_update = last
        if groups and not overlap:
            pack = dag.add("pack", c.pack_s, (cpu,), (last,), kind="backward", owner=w, step=t)
            prev_comm = comm_task(
                dag,
                "allreduce",
                c.allreduce_s(c.model_bytes),
                ar_cpu(c.model_bytes),
                (net,),
                cpus,
                (pack, prev_comm),
                kind="allreduce",
                owner=w,
                step=t,
            )
            before_update = prev_comm
        elif groups:
            for j, (ready_layer, nbytes) in enumerate(groups):
                prev_comm = comm_task(
                    dag,
                    f"c{j}",
                    c.allreduce_s(nbytes),
                    ar_cpu(nbytes),
                    (net,),
                    cpus,
                    (done_at[ready_layer], prev_comm),
                    kind="allreduce",
                    owner=w,
                    step=t,
                )
            before_update = prev_comm
        deps = (last, before_update)
        if groups:  # copy the reduced gradients back (DDP's bucket copy, or the unflatten)
            deps = (dag.add("unpack", c.unpack_s, (cpu,), deps, kind="update", owner=w, step=t),)
        prev_update = dag.add("update", c.update_s, (cpu,), deps, kind="update", owner=w, step=t)
        ends.append(prev_update)
    return Plan(dag, {w: ends}, {w: workers})


def comm_groups(c: Costs, overlap: bool, bucket_bytes: int) -> list[tuple[int, int]]:
    """(layer whose backward makes the group ready, bytes) in launch order."""
    layers_back = [layer for layer in reversed(range(len(c.fwd))) if c.layer_bytes[layer] > 0]
    if not overlap:
        return [(layers_back[-1], c.model_bytes)] if layers_back else []
    if bucket_bytes <= 0:
        return [(layer, c.layer_bytes[layer]) for layer in layers_back]
    owner, sizes = [], []
    for layer in layers_back:
        # Within a layer, gradients become ready in reverse registration order too.
        for nbytes in reversed(c.param_tensor_bytes[layer]):
            owner.append(layer)
            sizes.append(nbytes)
    out = []
    for bucket in ddp_buckets(sizes, bucket_bytes):
        out.append((owner[bucket[-1]], sum(sizes[i] for i in bucket)))
    return out


class _PSBuilder:
    """Worker classes pushing to and pulling from S shards, iteration by iteration. As the
    strategies of training/algorithms.py do, each algorithm says only what happens between
    backward and the next forward: how gradients reach the shards (`exchange`) and what
    the worker's update waits for (`update`).

    `concurrent`: the round posts every transfer at once, so on node links (placed) the
    workers of one node share its link and finish together: one class per node. A link
    serving them one after the other would let the first served compute while the last
    still waits, a pipelining that a fairly shared link does not give."""

    concurrent = True

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        self.c, self.servers, self.dag = c, servers, Dag()
        self.placed = multi_node(c.node_of_rank)
        self.first_worker: list[int] = []  # a worker rank each class stands for
        if self.placed:  # classes within each node: its workers share its links
            worker_nodes = list(c.node_of_rank[:workers])
            self.class_node, self.mult = [], []
            for node in sorted(set(worker_nodes)):
                count = worker_nodes.count(node)
                classes = 1 if self.concurrent else min(count, max(1, round(max_classes * count / workers)))
                for m in _split(count, classes):
                    self.class_node.append(node)
                    self.mult.append(m)
                    self.first_worker.append(worker_nodes.index(node))
            self.shard_node = list(c.node_of_rank[workers:])
        else:
            self.mult = _split(workers, min(workers, max_classes))
            self.first_worker = [sum(self.mult[:k]) for k in range(len(self.mult))]
        self.owners = [f"worker{k}" for k in range(len(self.mult))]
        self.shard_bytes = [
            c.model_bytes // servers + (1 if s < c.model_bytes % servers else 0) for s in range(servers)
        ]
        self.prev_update: list[int | None] = [None] * len(self.mult)
        self.prev_push: list[list[int | None]] = [[None] * servers for _ in self.mult]

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
        c, dag, w, cpu = self.c, self.dag, self.owners[k], (compute("worker", k),)
        data = dag.add("data", c.data_s, (Resource("worker", k, "loader"),), (self.prev_update[k],),
                       kind="data", owner=w, step=t)
        fwd = dag.add("forward", sum(c.fwd), cpu, (data,), kind="forward", owner=w, step=t)
        bwd = dag.add("backward", sum(c.bwd), cpu, (fwd,), kind="backward", owner=w, step=t)
        if c.straggle_s:  # the shard's barrier waits for the slowest worker's push
            bwd = dag.add("straggler", c.straggle_s, (), (bwd,), kind="straggle", owner=w, step=t)
        # OD-SGD reuses the push buffer, so its previous push must have left.
        return dag.add("pack", c.pack_s, cpu, (bwd, *self.prev_push[k]), kind="backward", owner=w, step=t)

    def links(self, k: int, s: int, push: bool) -> tuple[Resource, ...]:
        """What a push (or pull) between worker class k and shard s holds: the two ranks'
        links on one host; placed, the node links it crosses, or () within a node."""
        if not self.placed:
            return (link("worker", k), link("server", s))
        src, dst = (self.class_node[k], self.shard_node[s]) if push else (self.shard_node[s], self.class_node[k])
        return () if src == dst else (uplink(src), downlink(dst))

    def transfer_s(self, k: int, s: int, nbytes: int) -> float:
        """One transfer of nbytes; within a node (placed), only its latency: no link to cross."""
        if self.placed and self.class_node[k] == self.shard_node[s]:
            local = self.c.local_transfer_s
            return self.c.transfer_s(0) if local is None else local
        return self.c.transfer_s(nbytes)

    def cpus(self, k: int, s: int | None = None) -> tuple[Resource, ...]:
        """The CPUs a loopback transfer copies on: the worker's, and the shard's."""
        if not self.c.comm_on_cpu or self.placed:
            return ()
        return (compute("worker", k),) if s is None else (compute("worker", k), compute("server", s))

    def copy_s(self, m: int, times: float) -> float | None:
        return None if self.c.transfer_cpu_s is None else times * self.c.transfer_cpu_s(m)

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        """Per worker class, the tasks that bring back its share of the global model."""
        raise NotImplementedError

    def update(self, t: int, k: int, pack: int, pulls: list[int]) -> int:
        """The worker's update: copy the pulled model in (unpack); it waits for this step's pulls."""
        return self.dag.add("update", self.c.unpack_s, (compute("worker", k),), (pack, *pulls),
                            kind="update", owner=self.owners[k], step=t)


class _SyncServer(_PSBuilder):
    """The SSGD-PS server loop of each shard: receive all N pushes, update, send N pulls."""

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        super().__init__(c, workers, servers, max_classes)
        self.shard_free: list[int | None] = [None] * servers  # the shard's loop is back at receive
        self.pulled: list[list[int | None]] = [[None] * servers for _ in self.mult]  # class k's last pull from s

    def _latency_and_link_s(self, k: int, s: int) -> tuple[float, float]:
        """Over a node link, transfers sent at once wait out their latencies together and queue
        only for their bytes (modelling/fit.py): the latency holds no link, and a class's
        transfers pay it once. (latency, what class k's transfers to or from s hold the link for)."""
        one = self.transfer_s(k, s, self.shard_bytes[s])
        latency = min(self.transfer_s(k, s, 0), one)
        return latency, self.mult[k] * (one - latency)

    def _transfer(self, name: str, t: int, k: int, s: int, deps, push: bool) -> int:
        nbytes = self.shard_bytes[s]
        duration = self.mult[k] * self.transfer_s(k, s, nbytes)
        links = self.links(k, s, push)
        if self.placed and links:
            latency, duration = self._latency_and_link_s(k, s)
            deps = (self.dag.add(name, latency, (), deps, kind="comm", owner=self.owners[k], step=t),)
        return comm_task(self.dag, name, duration, self.copy_s(nbytes, self.mult[k]), links, self.cpus(k, s), deps,
                         kind="comm", owner=self.owners[k], step=t)

    def _shared(self, t: int, s: int, shard_pulls: list[int]) -> list[int]:
        """Placed, the pulls that cross the shard node's uplink are sent at once. Shared fairly,
        each ends when the last does (a join), not one after another as the link's queue
        orders them; where the microbenchmark measured the first back `lead` sooner than the
        last (`Costs.pull_lead_s`: a FIFO queue is not fair), the j-th of r ends
        lead (r-1-j)/(r-1) before the last, and no sooner than in queue order. Within a node,
        or on one host, each pull as it is."""
        if not self.placed:
            remote = list(range(len(self.mult)))
        else:
            remote = [k for k in range(len(self.mult)) if self.class_node[k] != self.shard_node[s]]
        if len(remote) < 2:
            return shard_pulls
        lead = self.c.pull_lead_s(self.shard_bytes[s]) if self.placed and self.c.pull_lead_s else 0.0
        if lead <= 0.0:
            joined = self.dag.add(f"pulled s{s}", 0.0, (), [shard_pulls[k] for k in remote], kind="pulled",
                                  owner=f"server{s}", step=t)
            return [joined if k in remote else pull for k, pull in enumerate(shard_pulls)]
        ends = [0.0]  # in queue order
        for k in remote:
            ends.append(ends[-1] + self._latency_and_link_s(k, s)[1])
        out = list(shard_pulls)
        last, r = ends[-1], len(remote)
        for j, k in enumerate(remote[:-1]):
            wait = max(last - lead * (r - 1 - j) / (r - 1) - ends[j + 1], 0.0)
            out[k] = self.dag.add(f"pulled s{s}", wait, (), (shard_pulls[k],), kind="pulled",
                                  owner=f"server{s}", step=t)
        return out

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        pulls: list[list[int]] = [[] for _ in self.mult]
        for s in range(self.servers):
            pushes = []
            for k in range(len(self.mult)):
                self.prev_push[k][s] = self._transfer(f"push s{s}", t, k, s, (packs[k], self._free(k, s)), True)
                pushes.append(self.prev_push[k][s])
            update = self.dag.add("server update", self.c.server_update_s / self.servers, (compute("server", s),),
                                  pushes, kind="server_update", owner=f"server{s}", step=t)
            shard_pulls = [self._transfer(f"pull s{s}", t, k, s, (update,), False) for k in range(len(self.mult))]
            for k, pull in enumerate(self._shared(t, s, shard_pulls)):
                pulls[k].append(pull)
                self.pulled[k][s] = pull
            self.shard_free[s] = self.dag.add("server ready", 0.0, (), shard_pulls, kind="server_ready",
                                              owner=f"server{s}", step=t)
        return pulls

    def _free(self, k: int, s: int) -> int | None:
        """What class k's next push to shard s waits for. gloo sends a message only once its
        receiver has posted the receive, and says so on the pair's one connection, behind the
        bytes it sends the other way: after the shard's pull to k. Placed, a shard whose sends
        fit the socket's buffer (`send_buffer_bytes`) posts its next receives at once, so that
        pull is all; a larger one posts them once its sends are written, near its last pull's
        end: its loop's turn (`shard_free`). That turn too where the pulls' lead was not
        measured (their ends joined, the two are one for a remote class)."""
        if self.placed and self.c.pull_lead_s and self.shard_bytes[s] <= self.c.send_buffer_bytes:
            return self.pulled[k][s]
        return self.shard_free[s]


class PSSSGDPlan(_SyncServer):
    """SSGD over a parameter server: every worker waits for W_g(t+1)."""


class ODSGDPlan(_SyncServer):
    """OD-SGD: the local update uses W_g(t), pulled during t-1; this step's pull runs on."""

    def __init__(self, c: Costs, workers: int, servers: int, max_classes: int = 8) -> None:
        super().__init__(c, workers, servers, max_classes)
        self.prev_pulls: list[list[int]] = [[] for _ in self.mult]  # the pulls of W_g(t)

    def update(self, t: int, k: int, pack: int, pulls: list[int]) -> int:
        c, cpu, w = self.c, (compute("worker", k),), self.owners[k]
        if c.post_s:  # posting this step's push and pull, before the wait for W_g(t)
            pack = self.dag.add("post", c.post_s, cpu, (pack,), kind="update", owner=w, step=t)
        deps, self.prev_pulls[k] = (pack, *self.prev_pulls[k]), pulls
        return self.dag.add("update", c.unpack_s + c.update_s, cpu, deps, kind="update", owner=w, step=t)


class ASGDPlan(_PSBuilder):
    """ASGD: each shard serves one push at a time, its update and reply included; no barrier.

    A reply that crosses a node link is a socket send: the shard goes back to receiving once
    the socket has taken it (all but its last `send_buffer_bytes`), while the link carries
    the rest (the part the microbenchmark measured still on the link when the shard's send
    returned, where it measured it). On one host the copy is the transfer, so the shard's loop holds it throughout;
    so it does within a node, where a colocated shard's own workers reach it in a memory
    copy. Beside a colocated shard the workers then keep two paces: worker 0 (the shard's
    node) is served whenever the loop is free of worker 1's push and reply, so it steps
    several times per step of worker 1 (measured with mlp: 2.5-2.7 at 200 Mbit/s, 1.5-1.9
    at 1 Gbit/s; the plan gives 3 and 2). A push within the node that waits for the loop
    lies in the two sockets' buffers meanwhile (`socket_buffer_bytes`), so the loop, when it
    takes it, passes that part sooner (the DAG's absorbed wait): with mlp at 1 Gbit/s, 14 ms
    in the timeline against 21.5 ms for a push that finds the loop free. Without it the race
    for the loop after worker 1's reply goes to worker 1 by 0.3 ms, and worker 0 steps once."""

    concurrent = False  # the shard's serial loop, not the link, orders the workers

    def transfer_s(self, k: int, s: int, nbytes: int) -> float:
        """Half the class's measured pass where the microbenchmark timed ASGD's (its push and
        the reply; a pass to every shard at once, so of the whole model's bytes)."""
        passes = self.c.asgd_pass_s
        if passes is None:
            return super().transfer_s(k, s, nbytes)
        return passes[self.first_worker[k]](nbytes * self.servers) / 2

    def exchange(self, t: int, packs: dict[int, int]) -> list[list[int]]:
        c, pulls = self.c, [[] for _ in self.mult]
        for k in self.active:
            w = self.owners[k]
            for s in range(self.servers):
                if self.placed and self.class_node[k] != self.shard_node[s]:
                    pulls[k].append(self._served(t, k, s, packs[k]))
                    continue
                # One pass of the shard's serial loop: receive, apply, reply.
                nbytes = self.shard_bytes[s]
                transfer = self.transfer_s(k, s, nbytes)
                serve = self.mult[k] * (2 * transfer + c.server_apply_s / self.servers)
                copies = self.copy_s(nbytes, 2 * self.mult[k])
                cpu_s = None if copies is None else copies + self.mult[k] * c.server_apply_s / self.servers
                links = tuple(dict.fromkeys(self.links(k, s, True) + self.links(k, s, False)))
                # Within a node of a cluster, the part of the push in the sockets' buffers.
                buffered = min(c.socket_buffer_bytes / nbytes, 1.0) if self.placed and nbytes else 0.0
                pulls[k].append(comm_task(self.dag, f"push-apply-pull s{s}", serve, cpu_s,
                                          (*links, compute("server", s)), self.cpus(k), (packs[k],),
                                          kind="comm", owner=w, step=t,
                                          absorbs=self.mult[k] * buffered * transfer))
        return pulls

    def _served(self, t: int, k: int, s: int, pack: int) -> int:
        """Placed: one pass of the shard's loop for the class's pushes (receive, apply, and reply
        until the socket has taken all but the last reply's buffered part) holds the shard;
        then that part crosses the pull's links while the shard serves on."""
        c, w = self.c, self.owners[k]
        nbytes, m = self.shard_bytes[s], self.mult[k]
        transfer = self.transfer_s(k, s, nbytes)
        tails = c.asgd_reply_tail_s
        if tails is not None:  # as measured: more than the socket holds where a queue holds some too
            buffered = min(tails[self.first_worker[k]](nbytes * self.servers) / transfer, 1.0) if transfer > 0 else 1.0
        else:
            buffered = min(c.send_buffer_bytes / nbytes, 1.0) if nbytes else 1.0  # of one reply
        serve = m * (transfer + c.server_apply_s / self.servers) + (m - buffered) * transfer
        # The pass holds the push's links, not the pull's: a link the next pass held from its
        # start would keep this reply's last part waiting behind a whole push, where the shard's
        # loop, which sends only after it has received, is what orders the replies.
        loop = self.dag.add(f"push-apply-pull s{s}", serve, (*self.links(k, s, True), compute("server", s)),
                            (pack,), kind="comm", owner=w, step=t)
        return self.dag.add(f"pull s{s}", buffered * transfer, self.links(k, s, False), (loop,),
                            kind="comm", owner=w, step=t)


PS_PLANS: dict[str, type[_PSBuilder]] = {"ssgd": PSSSGDPlan, "asgd": ASGDPlan, "odsgd": ODSGDPlan}
# Unrolled iterations: enough for the asynchronous pipelines to settle; the
# second half is the steady state that is measured.
ITERATIONS = {("ssgd", "allreduce"): 3, ("ssgd", "ps"): 4, ("odsgd", "ps"): 6, ("asgd", "ps"): 8}


def build_ps(c: Costs, algorithm: str, workers: int, servers: int, iterations: int, max_classes: int = 8,
             counts: Sequence[int] | None = None) -> Plan:
    """SSGD-PS, ASGD or OD-SGD: worker classes pushing to and pulling from S shards."""
    return PS_PLANS[algorithm](c, workers, servers, max_classes).build(iterations, counts)


def build_plan(c: Costs, s: Scenario, iterations: int | None = None, counts: Sequence[int] | None = None) -> Plan:
    """The unrolled DAG of scenario `s` (its world size; costs for that world size), over
    `iterations` (default: enough for the algorithm's usual pipeline to settle), or per
    worker class `counts` (ASGD only: its classes need not keep step)."""
    iterations = iterations or ITERATIONS[(s.algorithm, s.comm)]
    if s.comm == "allreduce":
        return build_allreduce(c, s.workers, iterations, overlap=s.overlap, bucket_bytes=s.bucket_bytes)
    return build_ps(c, s.algorithm, s.workers, s.servers, iterations, counts=counts if s.algorithm == "asgd" else None)


def without_compute(c: Costs) -> Costs:
    """The same iteration with every worker computation free: communication alone."""
    n = len(c.fwd)
    return replace(
        c, fwd=[0.0] * n, bwd=[0.0] * n, data_s=0.0, update_s=0.0, pack_s=0.0, unpack_s=0.0, straggle_s=0.0
    )
