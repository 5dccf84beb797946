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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from modelling.simulate import Dag

ALGORITHMS = ("ssgd", "asgd", "odsgd")
COMM_MODES = ("allreduce", "ps")


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

    @property
    def model_bytes(self) -> int:
        return sum(self.layer_bytes)


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
    links: tuple[str, ...],
    cpus: tuple[str, ...],
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
    w, cpu, net, loader = "worker0", "worker0.compute", "network", "worker0.loader"
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


def build_ps(c: Costs, algorithm: str, workers: int, servers: int, iterations: int, max_classes: int = 8) -> Plan:
    """SSGD-PS, ASGD or OD-SGD: worker classes pushing to and pulling from S shards."""
    dag = Dag()
    mult = _split(workers, min(workers, max_classes))
    owners = [f"worker{k}" for k in range(len(mult))]
    shard_bytes = [c.model_bytes // servers + (1 if s < c.model_bytes % servers else 0) for s in range(servers)]
    ends: dict[str, list[int]] = {w: [] for w in owners}
    prev_update: list[int | None] = [None] * len(mult)
    prev_push: list[list[int | None]] = [[None] * servers for _ in mult]
    prev_pulls: list[list[int]] = [[] for _ in mult]  # OD-SGD: the pulls of W_g(t)
    shard_free: list[int | None] = [None] * servers  # sync server: its loop is back at receive

    def cpu_of(w: str, s: int | None = None) -> tuple[str, ...]:
        """The CPUs a loopback transfer copies on: the worker's, and the shard's."""
        if not c.comm_on_cpu:
            return ()
        return (f"{w}.compute",) if s is None else (f"{w}.compute", f"server{s}.compute")

    def copy_s(m: int, times: float) -> float | None:
        return None if c.transfer_cpu_s is None else times * c.transfer_cpu_s(m)

    for t in range(iterations):
        packs = []
        for k, w in enumerate(owners):
            cpu = f"{w}.compute"
            data = dag.add("data", c.data_s, (f"{w}.loader",), (prev_update[k],), kind="data", owner=w, step=t)
            fwd = dag.add("forward", sum(c.fwd), (cpu,), (data,), kind="forward", owner=w, step=t)
            bwd = dag.add("backward", sum(c.bwd), (cpu,), (fwd,), kind="backward", owner=w, step=t)
            if c.straggle_s:  # the shard's barrier waits for the slowest worker's push
                bwd = dag.add("straggler", c.straggle_s, (), (bwd,), kind="straggle", owner=w, step=t)
            # OD-SGD reuses the push buffer, so its previous push must have left.
            packs.append(dag.add("pack", c.pack_s, (cpu,), (bwd, *prev_push[k]), kind="backward", owner=w, step=t))
        pulls: list[list[int]] = [[] for _ in mult]
        if algorithm == "asgd":
            for k, w in enumerate(owners):
                for s in range(servers):
                    # One pass of the shard's serial loop: receive, apply, reply.
                    serve = mult[k] * (2 * c.transfer_s(shard_bytes[s]) + c.server_apply_s / servers)
                    copies = copy_s(shard_bytes[s], 2 * mult[k])
                    pulls[k].append(
                        comm_task(
                            dag,
                            f"push-apply-pull s{s}",
                            serve,
                            None if copies is None else copies + mult[k] * c.server_apply_s / servers,
                            (f"{w}.link", f"server{s}.link", f"server{s}.compute"),
                            cpu_of(w),
                            (packs[k],),
                            kind="comm",
                            owner=w,
                            step=t,
                        )
                    )
        else:
            for s in range(servers):
                pushes = []
                for k, w in enumerate(owners):
                    push = comm_task(
                        dag,
                        f"push s{s}",
                        mult[k] * c.transfer_s(shard_bytes[s]),
                        copy_s(shard_bytes[s], mult[k]),
                        (f"{w}.link", f"server{s}.link"),
                        cpu_of(w, s),
                        (packs[k], shard_free[s]),
                        kind="comm",
                        owner=w,
                        step=t,
                    )
                    prev_push[k][s] = push
                    pushes.append(push)
                update = dag.add(
                    "server update",
                    c.server_update_s / servers,
                    (f"server{s}.compute",),
                    pushes,
                    kind="server_update",
                    owner=f"server{s}",
                    step=t,
                )
                shard_pulls = []
                for k, w in enumerate(owners):
                    pull = comm_task(
                        dag,
                        f"pull s{s}",
                        mult[k] * c.transfer_s(shard_bytes[s]),
                        copy_s(shard_bytes[s], mult[k]),
                        (f"{w}.link", f"server{s}.link"),
                        cpu_of(w, s),
                        (update,),
                        kind="comm",
                        owner=w,
                        step=t,
                    )
                    pulls[k].append(pull)
                    shard_pulls.append(pull)
                shard_free[s] = dag.add(
                    "server ready", 0.0, (), shard_pulls, kind="server_ready", owner=f"server{s}", step=t
                )
        for k, w in enumerate(owners):
            cpu = f"{w}.compute"
            if algorithm == "odsgd":
                # Local update with W_g(t), pulled during t-1; this step's pull runs on.
                deps = (packs[k], *prev_pulls[k])
                prev_pulls[k] = pulls[k]
            else:
                deps = (packs[k], *pulls[k])
            prev_update[k] = dag.add(
                "update", c.unpack_s + c.update_s * (algorithm == "odsgd"), (cpu,), deps, kind="update", owner=w, step=t
            )
            ends[w].append(prev_update[k])
    return Plan(dag, ends, dict(zip(owners, mult, strict=True)))


def without_compute(c: Costs) -> Costs:
    """The same iteration with every worker computation free: communication alone."""
    n = len(c.fwd)
    return Costs(
        fwd=[0.0] * n,
        bwd=[0.0] * n,
        layer_bytes=c.layer_bytes,
        param_tensor_bytes=c.param_tensor_bytes,
        data_s=0.0,
        update_s=0.0,
        server_update_s=c.server_update_s,
        server_apply_s=c.server_apply_s,
        allreduce_s=c.allreduce_s,
        transfer_s=c.transfer_s,
        comm_on_cpu=c.comm_on_cpu,
        allreduce_cpu_s=c.allreduce_cpu_s,
        transfer_cpu_s=c.transfer_cpu_s,
    )
