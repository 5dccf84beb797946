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

Where each transfer runs, what it costs and what it holds (one host's ranks' links and
CPUs, a node's uplink and downlink, nothing within a node) is the fabric's
(modelling/network/fabric.py); the builders here and in modelling/dag_ps.py ask it and never look
at the placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from modelling.network.fabric import Fabric, Resource, Transfer, compute
from modelling.network.wire import Wire
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
    # What the comm model says this world's transfers cost, where they run: the fabric's.
    wire: Wire = field(default_factory=Wire)

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


def after(dag: Dag, name: str, wait_s: float, tasks, **kw) -> int:
    """The last of `tasks` to end, plus `wait_s`: a task that holds nothing. With no wait and
    one task before it, it would add nothing, so that task is returned and the simulator
    schedules one task fewer (a shard's pulls are most often in that shape)."""
    before = tuple(t for t in tasks if t is not None)  # a first step has no previous task
    if wait_s == 0.0 and len(before) == 1:
        return before[0]
    return dag.add(name, wait_s, (), before, **kw)


def add_transfer(dag: Dag, name: str, tr: Transfer, deps, **kw) -> int:
    """A transfer's tasks (modelling/network/fabric.py): its latency, which holds nothing, then its wire
    time on its links (its copying part on its CPUs too). The last of them."""
    if tr.latency_s > 0 or not (tr.links or tr.wire_s):
        deps = (after(dag, name, tr.latency_s, deps, **kw),)
        if not (tr.links or tr.wire_s):
            return deps[0]
    return comm_task(dag, name, tr.wire_s, tr.cpu_s, tr.links, tr.cpus, deps, **kw)


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


def build_allreduce(c: Costs, workers: int, iterations: int, *, overlap: bool, bucket_bytes: int) -> Plan:
    """SSGD-allreduce on one representative worker. bucket_bytes <= 0: per-layer WFBP."""
    dag = Dag()
    w, cpu, loader = "worker0", compute("worker", 0), Resource("worker", 0, "loader")
    fab = Fabric(c, workers, 0)
    p = workers  # the worker stands for all N, computing at once
    n_layers = len(c.fwd)
    ends: list[int] = []
    prev_update: int | None = None
    prev_comm: int | None = None
    groups = comm_groups(c, overlap, bucket_bytes) if workers > 1 else []
    for t in range(iterations):
        data = dag.add("data", c.data_s, (loader,), (prev_update,), kind="data", owner=w, step=t, procs=p)
        last = data
        for layer in range(n_layers):
            last = dag.add(f"f{layer}", c.fwd[layer], (cpu,), (last,), kind="forward", owner=w, step=t, procs=p)
        done_at: dict[int, int] = {}
        for layer in reversed(range(n_layers)):
            last = dag.add(f"b{layer}", c.bwd[layer], (cpu,), (last,), kind="backward", owner=w, step=t, procs=p)
            done_at[layer] = last
        if groups and c.straggle_s:
            # The last gradients are ready everywhere only once the slowest worker's are.
            last = dag.add("straggler", c.straggle_s, (), (last,), kind="straggle", owner=w, step=t)
            done_at[groups[-1][0]] = last
        before_update = last
        if groups and not overlap:
            pack = dag.add("pack", c.pack_s, (cpu,), (last,), kind="backward", owner=w, step=t, procs=p)
            prev_comm = add_transfer(dag, "allreduce", fab.allreduce(c.model_bytes, cpu), (pack, prev_comm),
                                     kind="allreduce", owner=w, step=t)
            before_update = prev_comm
        elif groups:
            for j, (ready_layer, nbytes) in enumerate(groups):
                prev_comm = add_transfer(dag, f"c{j}", fab.allreduce(nbytes, cpu), (done_at[ready_layer], prev_comm),
                                         kind="allreduce", owner=w, step=t)
            before_update = prev_comm
        deps = (last, before_update)
        if groups:  # copy the reduced gradients back (DDP's bucket copy, or the unflatten)
            deps = (dag.add("unpack", c.unpack_s, (cpu,), deps, kind="update", owner=w, step=t, procs=p),)
        prev_update = dag.add("update", c.update_s, (cpu,), deps, kind="update", owner=w, step=t, procs=p)
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


def without_compute(c: Costs) -> Costs:
    """The same iteration with every worker computation free: communication alone."""
    n = len(c.fwd)
    return replace(
        c, fwd=[0.0] * n, bwd=[0.0] * n, data_s=0.0, update_s=0.0, pack_s=0.0, unpack_s=0.0, straggle_s=0.0
    )
