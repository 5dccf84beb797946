"""Predict iteration time, throughput, utilisation and timelines from a layer
table and a fitted communication model (DESIGN §3)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelling.dag import (
    ALGORITHMS,
    COMM_MODES,
    Costs,
    Plan,
    build_allreduce,
    build_ps,
    comm_groups,
    without_compute,
)
from modelling.fit import CommCosts, CommModelError
from modelling.layers import check_layers
from modelling.simulate import Schedule, busy_time, critical_path, simulate

WORKER_TASKS = ("data", "forward", "backward", "update")  # worker computation, by task kind
SERVER_PHASE = {"push": "comm_wait", "pull": "send", "push-apply-pull": "update"}
# Unrolled iterations: enough for the asynchronous pipelines to settle; the
# second half is the steady state that is measured.
ITERATIONS = {("ssgd", "allreduce"): 3, ("ssgd", "ps"): 4, ("odsgd", "ps"): 6, ("asgd", "ps"): 8}


def _check(algorithm: str, comm_mode: str, servers: int) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    if comm_mode not in COMM_MODES:
        raise ValueError(f"comm: unknown communication {comm_mode!r}; use allreduce or ps")
    if algorithm != "ssgd" and comm_mode != "ps":
        raise ValueError(f"comm: {algorithm} runs on a parameter server; use comm ps, not {comm_mode}")
    if comm_mode == "ps" and servers < 1:
        raise ValueError(f"servers: comm ps needs at least 1 shard, got {servers}")


def expected_straggle(samples: list[float], workers: int) -> float:
    """E[max of N iteration times] - median: what a per-iteration barrier of N workers
    waits for the slowest, from the profile's empirical distribution of whole
    iterations (P(max <= x_(i)) = (i/n)^N over the sorted samples)."""
    if workers < 2 or len(samples) < 2:
        return 0.0
    xs, n = sorted(samples), len(samples)
    e_max = sum(x * ((i / n) ** workers - ((i - 1) / n) ** workers) for i, x in enumerate(xs, 1))
    return max(e_max - statistics.median(xs), 0.0)


def build_costs(
    layers: dict[str, Any],
    comm: CommCosts,
    workers: int,
    servers: int,
    comm_mode: str,
    batch_size: int | None = None,
    algorithm: str = "ssgd",
    comm_on_cpu: bool = False,
) -> Costs:
    """Task durations for one world size; compute scales linearly to another batch size.
    Only SSGD waits for every worker every iteration, so only it pays for stragglers."""
    scale = batch_size / layers["batch_size"] if batch_size else 1.0
    samples = layers.get("iteration_samples_s") or []
    allreduce = comm.allreduce(workers) if comm_mode == "allreduce" else (lambda _m: 0.0)
    transfer = comm.transfer(workers, servers) if comm_mode == "ps" else (lambda _m: 0.0)
    rows = layers["layers"]
    return Costs(
        fwd=[r["fwd_s"] * scale for r in rows],
        bwd=[r["bwd_s"] * scale for r in rows],
        layer_bytes=[int(r["param_bytes"]) for r in rows],
        param_tensor_bytes=[r.get("param_tensor_bytes") or [int(r["param_bytes"])] for r in rows],
        data_s=layers["data_s"] * scale,
        update_s=layers["update_s"],
        pack_s=layers.get("pack_s", 0.0),
        unpack_s=layers.get("unpack_s", 0.0),
        server_update_s=layers.get("server_update_s", 0.0) + (workers - 1) * layers.get("server_add_s", 0.0),
        server_apply_s=layers.get("server_add_s", 0.0),
        allreduce_s=allreduce,
        transfer_s=transfer,
        allreduce_cpu_s=copying_part(allreduce) if comm_on_cpu else None,
        transfer_cpu_s=copying_part(transfer) if comm_on_cpu else None,
        straggle_s=expected_straggle(samples, workers) * scale if algorithm == "ssgd" else 0.0,
        comm_on_cpu=comm_on_cpu,
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


def loopback(comm_model: dict[str, Any], bandwidth_bytes_per_s: float | None = None, ranks: int = 0) -> bool:
    """Whether the comm model was measured with every rank on one host and no link of known
    rate between them: loopback, where moving bytes is CPU work that competes with compute.
    A bandwidth what-if puts a real link in its place, and a world of more ranks than were
    measured on the host is taken to span more hosts like it."""
    env = comm_model.get("environment") or {}
    return (
        env.get("hosts") == 1
        and comm_model.get("link_bytes_per_s") is None
        and bandwidth_bytes_per_s is None
        and ranks <= env.get("world_size", ranks)
    )


def _plan(
    c: Costs,
    algorithm: str,
    comm_mode: str,
    workers: int,
    servers: int,
    overlap: bool,
    bucket_mb: float,
    iterations: int,
) -> Plan:
    if comm_mode == "allreduce":
        return build_allreduce(c, workers, iterations, overlap=overlap, bucket_bytes=int(bucket_mb * 1024 * 1024))
    return build_ps(c, algorithm, workers, servers, iterations)


def _periods(plan: Plan, sched: Schedule) -> dict[str, float]:
    """Each worker's steady-state iteration period over the second half."""
    out = {}
    for owner, ends in plan.iteration_ends.items():
        k = len(ends) // 2
        out[owner] = (sched.end[ends[-1]] - sched.end[ends[k - 1]]) / (len(ends) - k)
    return out


def _resource_group(name: str) -> str:
    role, _, part = name.partition(".")
    return "".join(ch for ch in role if not ch.isdigit()) + ("." + part if part else "")


def _compact_path(plan: Plan, sched: Schedule, path: list[int]) -> list[dict[str, Any]]:
    dag, out = plan.dag, []
    for t in path:
        kind, owner = dag.kinds[t], dag.owners[t]
        if out and out[-1]["task"] == kind and out[-1]["owner"] == owner:
            out[-1]["end_s"] = sched.end[t]
            out[-1]["tasks"] += 1
        else:
            out.append({"task": kind, "owner": owner, "start_s": sched.start[t], "end_s": sched.end[t], "tasks": 1})
    return out


def predict_one(
    layers: dict[str, Any],
    comm: CommCosts,
    *,
    algorithm: str,
    comm_mode: str,
    workers: int,
    servers: int,
    overlap: bool,
    bucket_mb: float,
    batch_size: int | None,
    comm_on_cpu: bool = False,
    host_cores: int | None = None,
) -> dict[str, Any]:
    servers = servers if comm_mode == "ps" else 0
    costs = build_costs(layers, comm, workers, servers, comm_mode, batch_size, algorithm, comm_on_cpu)
    iterations = ITERATIONS[(algorithm, comm_mode)]
    plan = _plan(costs, algorithm, comm_mode, workers, servers, overlap, bucket_mb, iterations)
    sched = simulate(plan.dag)
    periods = _periods(plan, sched)
    total = sum(plan.multiplicity.values())
    iter_time = sum(periods[o] * m for o, m in plan.multiplicity.items()) / total
    batch = batch_size or layers["batch_size"]
    throughput = sum(m * batch / periods[o] for o, m in plan.multiplicity.items() if periods[o] > 0)
    host_bound = host_cpu_bound(costs, algorithm, comm_mode, workers, servers, overlap, bucket_mb, host_cores)
    if host_bound > iter_time:  # the host's cores, not any one rank's tasks, set the pace
        throughput *= iter_time / host_bound
        iter_time = host_bound
    if comm_mode == "allreduce":
        # All buckets queue on the network: communication alone is their sum.
        comm_s = (
            sum(costs.allreduce_s(nbytes) for _, nbytes in comm_groups(costs, overlap, int(bucket_mb * 1024 * 1024)))
            if workers > 1
            else 0.0
        )
    else:
        bare = _plan(without_compute(costs), algorithm, comm_mode, workers, servers, overlap, bucket_mb, iterations)
        bare_periods = _periods(bare, simulate(bare.dag))
        comm_s = sum(bare_periods[o] * m for o, m in bare.multiplicity.items()) / total
    ends = plan.iteration_ends["worker0"]
    k = len(ends) // 2
    t0, t1 = sched.end[ends[k - 1]], sched.end[ends[-1]]
    groups: dict[str, list[float]] = {}
    for res, busy in busy_time(plan.dag, sched, t0, t1).items():
        groups.setdefault(_resource_group(res), []).append(busy / (t1 - t0) if t1 > t0 else 0.0)
    dag = plan.dag
    compute_s = sum(
        dag.durations[t]
        for t in range(len(dag))
        if dag.owners[t] == "worker0" and dag.steps[t] == 0 and dag.kinds[t] in (*WORKER_TASKS, "straggle")
    )
    return {
        "workers": workers,
        "servers": servers,
        "algorithm": algorithm,
        "comm": comm_mode,
        "iter_time_s": iter_time,
        "throughput_samples_per_s": throughput,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "utilisation": {g: sum(v) / len(v) for g, v in sorted(groups.items())},
        "critical_path": _compact_path(plan, sched, critical_path(plan.dag, sched, ends[-1], t0)),
        "host_cpu_bound_s": host_bound,
    }


def host_cpu_bound(
    c: Costs,
    algorithm: str,
    comm_mode: str,
    workers: int,
    servers: int,
    overlap: bool,
    bucket_mb: float,
    host_cores: int | None,
) -> float:
    """On loopback every rank shares one host: an iteration cannot take less than the CPU
    time all ranks spend in it over the cores they can use. Each rank runs on one core
    at a time; a transfer's copying keeps the CPUs at both of its ends busy (into and out
    of the socket), a ring allreduce's every rank's. 0 when comm is not on the CPU."""
    if not c.comm_on_cpu or not host_cores:
        return 0.0
    per_worker = sum(c.fwd) + sum(c.bwd) + c.data_s
    if comm_mode == "ps" or workers > 1:  # one allreduce worker has nothing to copy
        per_worker += c.unpack_s
        per_worker += c.pack_s if (comm_mode == "ps" or not overlap) else 0.0  # DDP fills buckets in backward
    per_worker += c.update_s if (comm_mode == "allreduce" or algorithm == "odsgd") else 0.0
    work = workers * per_worker
    if comm_mode == "allreduce":
        groups = comm_groups(c, overlap, int(bucket_mb * 1024 * 1024)) if workers > 1 else []
        copying = c.allreduce_cpu_s or c.allreduce_s
        work += workers * sum(copying(nbytes) for _, nbytes in groups)
    else:
        shard = c.model_bytes / servers
        copying = c.transfer_cpu_s or c.transfer_s
        work += 2 * 2 * workers * servers * copying(int(shard))  # push and pull, two ends each
        work += c.server_update_s if algorithm != "asgd" else workers * c.server_apply_s
    return work / min(host_cores, workers + servers)


def predict(
    layers: dict[str, Any],
    comm_model: dict[str, Any],
    *,
    algorithm: str,
    comm_mode: str,
    workers: list[int],
    servers: int = 1,
    bandwidth_bytes_per_s: float | None = None,
    bucket_mb: float = 25.0,
    overlap: bool = True,
    batch_size: int | None = None,
    comm_on_cpu: bool | None = None,
) -> list[dict[str, Any]]:
    """One prediction per world size in `workers`. bucket_mb <= 0 means per-layer WFBP.
    comm_on_cpu: transfers hold the CPUs at their ends (None: when the comm model is loopback)."""
    _check(algorithm, comm_mode, servers)
    check_layers(layers)
    if any(n < 1 for n in workers):
        raise ValueError(f"workers: every world size must be at least 1, got {workers}")
    comm = CommCosts(comm_model, bandwidth_bytes_per_s)
    return [
        predict_one(
            layers,
            comm,
            algorithm=algorithm,
            comm_mode=comm_mode,
            workers=n,
            servers=servers,
            overlap=overlap,
            bucket_mb=bucket_mb,
            batch_size=batch_size,
            comm_on_cpu=(
                loopback(comm_model, bandwidth_bytes_per_s, n + (servers if comm_mode == "ps" else 0))
                if comm_on_cpu is None
                else comm_on_cpu
            ),
            host_cores=(comm_model.get("environment") or {}).get("cpu_count"),
        )
        for n in workers
    ]


def predicted_timeline(
    layers: dict[str, Any],
    comm_model: dict[str, Any],
    *,
    algorithm: str,
    comm_mode: str,
    workers: int,
    servers: int = 1,
    bandwidth_bytes_per_s: float | None = None,
    bucket_mb: float = 25.0,
    overlap: bool = True,
    batch_size: int | None = None,
    comm_on_cpu: bool | None = None,
) -> list[dict[str, Any]]:
    """The simulated schedule as timeline records (training/timeline.py's format):
    one record per worker (class) and step, and per server shard and step."""
    _check(algorithm, comm_mode, servers)
    check_layers(layers)
    servers = servers if comm_mode == "ps" else 0
    comm = CommCosts(comm_model, bandwidth_bytes_per_s)
    if comm_on_cpu is None:
        comm_on_cpu = loopback(comm_model, bandwidth_bytes_per_s, workers + servers)
    costs = build_costs(layers, comm, workers, servers, comm_mode, batch_size, algorithm, comm_on_cpu)
    plan = _plan(costs, algorithm, comm_mode, workers, servers, overlap, bucket_mb, ITERATIONS[(algorithm, comm_mode)])
    sched = simulate(plan.dag)
    return _records(plan, sched)


def _server_of(resources: tuple[str, ...]) -> str:
    return next(r.partition(".")[0] for r in resources if r.startswith("server"))


def _records(plan: Plan, sched: Schedule) -> list[dict[str, Any]]:
    dag = plan.dag
    spans: dict[tuple[str, int], dict[str, list[float]]] = {}

    def mark(owner: str, step: int, phase: str, t: int) -> None:
        span = spans.setdefault((owner, step), {}).setdefault(phase, [sched.start[t], sched.end[t]])
        span[0], span[1] = min(span[0], sched.start[t]), max(span[1], sched.end[t])

    for t, kind in enumerate(dag.kinds):
        if kind in WORKER_TASKS:
            mark(dag.owners[t], dag.steps[t], kind, t)
        elif kind == "server_update":
            mark(dag.owners[t], dag.steps[t], "update", t)
        elif kind == "comm":  # a push, a pull, or ASGD's whole push-apply-pull
            phase = SERVER_PHASE[dag.names[t].partition(" ")[0]]
            mark(_server_of(dag.resources[t]), dag.steps[t], phase, t)
    ranks = {o: i for i, o in enumerate(plan.iteration_ends)}
    records = []
    for (owner, step), phases in spans.items():
        if owner in ranks:
            role, rank = "worker", ranks[owner]
            # As the trainer records it: waiting from the end of backward to the update.
            if phases["update"][0] > phases["backward"][1]:
                phases["comm_wait"] = [phases["backward"][1], phases["update"][0]]
        else:
            role, rank = "server", len(ranks) + int(owner.removeprefix("server"))
        records.append(
            {
                "rank": rank,
                "role": role,
                "step": step,
                "start": min(a for a, _ in phases.values()),
                "end": max(b for _, b in phases.values()),
                "phases": phases,
            }
        )
    return sorted(records, key=lambda r: (r["rank"], r["step"]))


def write_chrome_trace(records: list[dict[str, Any]], path: Path) -> Path:
    from training.timeline import to_chrome_trace

    path.write_text(json.dumps(to_chrome_trace(records, label="predicted")))
    return path


_COLOURS = {
    "data": "#9e9e9e",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "comm_wait": "#c44e52",
    "update": "#8172b2",
    "send": "#dd8452",
}


def write_gantt(records: list[dict[str, Any]], path: Path, title: str = "predicted timeline") -> Path:
    """A Gantt chart PNG: one row per rank, one bar per phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({(r["rank"], r["role"]) for r in records})
    row = {rank: i for i, (rank, _) in enumerate(ranks)}
    fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * len(ranks)))
    for rec in records:
        for phase, (a, b) in rec["phases"].items():
            if b > a:
                ax.broken_barh(
                    [(a * 1e3, (b - a) * 1e3)], (row[rec["rank"]] - 0.4, 0.8), facecolors=_COLOURS.get(phase, "#333333")
                )
    ax.set_yticks(range(len(ranks)), [f"{role} {rank}" for rank, role in ranks])
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    ax.legend(
        handles=[Patch(color=c, label=p) for p, c in _COLOURS.items()], loc="upper right", fontsize="small", ncol=3
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
