"""Predict iteration time, throughput, utilisation and timelines from a layer
table and a fitted communication model (DESIGN §3)."""

from __future__ import annotations

import statistics
from typing import Any

from modelling.calibration import domain
from modelling.cores import on_shared_cores
from modelling.dag import Costs, Plan, comm_groups, without_compute
from modelling.measure.layers import LayersError, check_layers
from modelling.measure.links import multi_node
from modelling.measure.records import CommModelError, migrate_layers
from modelling.memory import MEMORY_FIGURES, does_not_fit, predict_memory
from modelling.network.costs import CommCosts
from modelling.network.fabric import Fabric, compute
from modelling.network.wire import wire_of
from modelling.plan import build_plan
from modelling.scenario import Scenario
from modelling.simulate import Schedule, busy_time, critical_path, simulate
from training.config import Algorithm, Comm
from training.measure.summary import shared_paces


class NoPrediction(CommModelError):
    """A scenario the model cannot predict; the message says why (DESIGN §3: a row
    "no prediction: why", never a failed run). A CommModelError, as a comm model the
    predictor refuses is: callers that skip one skip the other."""


# What a prediction row holds; a no-prediction row has them None and says why instead.
FIGURES = ("iter_time_s", "throughput_samples_per_s", "compute_s", "comm_s", "comm_max_s", "utilisation",
           "critical_path", "host_cpu_bound_s")


def no_prediction(s: Scenario, reason: str) -> dict[str, Any]:
    """The row of a scenario the model cannot predict: its identity, no figures, the reason."""
    return {"workers": s.workers, "servers": s.servers, "algorithm": s.algorithm, "comm": s.comm,
            **dict.fromkeys(FIGURES), "no_prediction": reason, "note": None}


WORKER_TASKS = ("data", "forward", "backward", "update")  # worker computation, by task kind


def expected_straggle(samples: list[float], workers: int) -> float:
    """E[max of N iteration times] - median: what a per-iteration barrier of N workers
    waits for the slowest, from the profile's empirical distribution of whole
    iterations (P(max <= x_(i)) = (i/n)^N over the sorted samples)."""
    if workers < 2 or len(samples) < 2:
        return 0.0
    xs, n = sorted(samples), len(samples)
    e_max = sum(x * ((i / n) ** workers - ((i - 1) / n) ** workers) for i, x in enumerate(xs, 1))
    return max(e_max - statistics.median(xs), 0.0)


def table(layers: dict[str, Any]) -> dict[str, Any]:
    """A layer table checked (LayersError naming what lacks) and brought up to the current
    schema (modelling/measure/records.py)."""
    check_layers(layers)
    try:
        return migrate_layers(layers)
    except ValueError as err:
        raise LayersError(str(err)) from None


def build_costs(layers: dict[str, Any], comm: CommCosts, s: Scenario) -> Costs:
    """Task durations for one world size; compute scales linearly to another batch size.
    Only SSGD waits for every worker every iteration, so only it pays for stragglers."""
    layers = table(layers)
    scale = s.batch_size / layers["batch_size"] if s.batch_size else 1.0
    samples = layers["iteration_samples_s"]
    rows = layers["layers"]
    layer_bytes = [int(r["param_bytes"]) for r in rows]
    return Costs(
        fwd=[r["fwd_s"] * scale for r in rows],
        bwd=[r["bwd_s"] * scale for r in rows],
        layer_bytes=layer_bytes,
        param_tensor_bytes=[r["param_tensor_bytes"] for r in rows],
        data_s=layers["data_s"] * scale,
        update_s=layers["update_s"],
        pack_s=layers["pack_s"],
        unpack_s=layers["unpack_s"],
        server_update_s=layers["server_update_s"] + (s.workers - 1) * layers["server_add_s"],
        # ASGD's shard applies every push with its optimizer (training/ps.py): a step, not an add.
        server_apply_s=layers["server_update_s"],
        straggle_s=expected_straggle(samples, s.workers) * scale if s.algorithm == Algorithm.ssgd else 0.0,
        wire=wire_of(comm, s, sum(layer_bytes)),
    )


def loopback(comm_model: dict[str, Any], bandwidth_bytes_per_s: float | None = None, ranks: int = 0) -> bool:
    """Whether the comm model was measured with every rank on one host and no link of known
    rate between them: loopback, where moving bytes is CPU work that competes with compute.
    A bandwidth what-if puts a real link in its place, and a world of more ranks than were
    measured on the host is taken to span more hosts like it. Ranks placed on several
    nodes (an emulated cluster shares one hostname) talk over links: not loopback."""
    env = comm_model.get("environment") or {}
    return (
        env.get("hosts") == 1
        and env.get("nodes", 1) == 1
        and comm_model.get("link_bytes_per_s") is None
        and bandwidth_bytes_per_s is None
        and ranks <= env.get("world_size", ranks)
    )


def _periods(plan: Plan, sched: Schedule, last: float = 0.5) -> dict[str, float] | None:
    """Each worker's iteration period over the `last` fraction of the window in which every
    worker is still running, as the measured side takes it (training/measure/summary.py's
    `shared_paces`): every worker unrolls as many iterations, so where they keep their own
    paces (ASGD beside a colocated shard) the fast one is done long before the slow one,
    which then runs alone. None where that window is too short to tell."""
    owners = list(plan.iteration_ends)
    paces = shared_paces([[sched.end[t] for t in plan.iteration_ends[o]] for o in owners], last)
    return None if paces is None else dict(zip(owners, paces, strict=True))


# Unrolled iterations are doubled up to this many until the period has settled.
_MAX_ITERATIONS = 96
_SETTLED = 1e-6  # relative change of the period between the last half and the last quarter


def _steady_state(c: Costs, s: Scenario, cores: int | None = None) -> tuple[Plan, Schedule, dict[str, float]]:
    """The plan unrolled until its period has settled, its schedule and the periods.

    The start-up transient of a pipelined schedule dies away slowly when compute and
    communication nearly tie (OD-SGD, ASGD): the backlog drains by only their difference
    per iteration, and a short window then reads a period below both bounds. A window of a
    few iterations may also read the same period over its last half and quarter before the
    backlog has built up at all, so the period must also be that of half the unroll."""
    iterations, before = None, None
    while True:
        plan = build_plan(c, s, iterations)
        sched = simulate(plan.dag, cores)
        half, quarter = _periods(plan, sched), _periods(plan, sched, last=0.25)
        iterations = len(next(iter(plan.iteration_ends.values())))
        settled = half is not None and quarter is not None and before is not None and all(
            abs(half[o] - p[o]) <= _SETTLED * max(half[o], 1e-12) for o in half for p in (quarter, before)
        )
        before = half
        if settled or iterations * 2 > _MAX_ITERATIONS:
            if half is None:
                return _lapped(c, s, plan, sched, iterations, cores)
            return plan, sched, half
        iterations *= 2


def _own_pace(ends: list[float]) -> float:
    """A worker's period over the second half of its own iterations."""
    k = len(ends) // 2
    return (ends[-1] - ends[k - 1]) / (len(ends) - k) if len(ends) > 1 else ends[-1]


def _lapped(c: Costs, s: Scenario, plan: Plan, sched: Schedule, iterations: int,
            cores: int | None) -> tuple[Plan, Schedule, dict]:
    """Workers without a barrier (ASGD) that keep paces so different that, unrolled alike, the
    fast ones are done before the slow ones have run twice: each class is unrolled in
    proportion to its pace (first its own, then its pace over the window they share), so that
    every class runs over one window. A worker that laps the others is a pace, not an error."""
    owners = list(plan.iteration_ends)
    paces = [_own_pace([sched.end[t] for t in plan.iteration_ends[o]]) for o in owners]
    for _ in range(6):
        slowest = max(paces)
        counts = [min(max(iterations, round(iterations * slowest / max(p, 1e-15))), 64 * iterations) for p in paces]
        plan = build_plan(c, s, iterations, counts)
        sched = simulate(plan.dag, cores)
        shared = _periods(plan, sched)
        if shared is None:
            raise NoPrediction(
                f"{s.algorithm}-{s.comm} on {s.workers} workers: no window in which every worker runs, "
                f"with each unrolled by its pace (up to {max(counts)} iterations)"
            )
        new = [shared[o] for o in owners]
        if all(abs(a - b) <= 1e-3 * b for a, b in zip(paces, new, strict=True)):
            break
        paces = new
    return plan, sched, shared


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


def predict_one(layers: dict[str, Any], comm: CommCosts, s: Scenario, host_cores: int | None = None) -> dict[str, Any]:
    """The prediction of one scenario (its comm_on_cpu decided: see `predict`)."""
    mark = len(comm.notes)
    costs, cores = on_shared_cores(build_costs(layers, comm, s), layers, s, host_cores)
    plan, sched, periods = _steady_state(costs, s, cores)
    total = sum(plan.multiplicity.values())
    iter_time = sum(periods[o] * m for o, m in plan.multiplicity.items()) / total
    batch = s.batch_size or layers["batch_size"]
    throughput = sum(m * batch / periods[o] for o, m in plan.multiplicity.items() if periods[o] > 0)
    host_bound = host_cpu_bound(costs, s, host_cores, insitu=layers.get("source") == "in situ")
    if host_bound > iter_time:  # the host's cores, not any one rank's tasks, set the pace
        throughput *= iter_time / host_bound
        iter_time = host_bound
    if s.comm == Comm.allreduce:
        # All buckets queue on the network: communication alone is their sum.
        groups = comm_groups(costs, s.overlap, s.bucket_bytes) if s.workers > 1 else []
        fab = Fabric(costs, s.workers, 0)
        comm_s = sum(fab.allreduce(nbytes, compute("worker", 0)).seconds for _, nbytes in groups)
        comm_max = comm_s
    else:
        bare, _, bare_periods = _steady_state(without_compute(costs), s)
        comm_s = sum(bare_periods[o] * m for o, m in bare.multiplicity.items()) / total
        comm_max = max(bare_periods.values())
    ends = plan.iteration_ends["worker0"]
    k = len(ends) // 2
    t0, t1 = sched.end[ends[k - 1]], sched.end[ends[-1]]
    groups_busy: dict[str, list[float]] = {}
    for res, busy in busy_time(plan.dag, sched, t0, t1).items():
        groups_busy.setdefault(res.group, []).append(busy / (t1 - t0) if t1 > t0 else 0.0)
    dag, window = plan.dag, range(k, len(ends))  # worker 0's steps in the measured window
    compute_s = sum(
        sched.durations[t]
        for t in range(len(dag))
        if dag.owners[t] == "worker0" and dag.steps[t] in window and dag.kinds[t] in (*WORKER_TASKS, "straggle")
    ) / len(window)
    return {
        "workers": s.workers,
        "servers": s.servers,
        "algorithm": s.algorithm,
        "comm": s.comm,
        "iter_time_s": iter_time,
        "throughput_samples_per_s": throughput,
        "compute_s": compute_s,
        "comm_s": comm_s,
        # The slowest worker class's communication alone: where classes keep their own paces
        # (ASGD beside a colocated shard) the mean iteration lies within
        # max(compute, comm) <= iteration <= compute + comm_max, not compute + comm.
        "comm_max_s": comm_max,
        "utilisation": {g: sum(v) / len(v) for g, v in sorted(groups_busy.items())},
        "critical_path": _compact_path(plan, sched, critical_path(plan.dag, sched, ends[-1], t0)),
        "host_cpu_bound_s": host_bound,
        "no_prediction": None,
        "note": comm.note(mark) or None,
        "domain": domain(iter_time, s.ranks, host_cores, burst_share(comm, costs, s)),
    }


def burst_share(comm: CommCosts, c: Costs, s: Scenario) -> float:
    """The node links' token bucket over a gradient's bytes, for a job placed over nodes on the
    measured links (modelling/calibration.py, the domain); 0 on one node or a what-if rate."""
    gradient = sum(c.layer_bytes)
    if not multi_node(s.node_of_rank) or not gradient or not comm.link:
        return 0.0
    return comm.bucket_s() * comm.link / gradient


def host_cpu_bound(c: Costs, s: Scenario, host_cores: int | None, insitu: bool = False) -> float:
    """Where every rank shares one host (loopback, or an emulated cluster's nodes), an
    iteration cannot take less than the CPU time all ranks spend in it over the cores they
    can use; each rank runs on one core at a time. Communication's part: on loopback, its
    copying (as the DAG's tasks hold it): a transfer's keeps the CPUs at both of its ends
    busy (into and out of the socket), a ring allreduce's every rank's. On an emulated
    cluster's nodes, where the DAG's transfers hold links, not CPUs, the host's CPU time that
    the microbenchmark measured for one allreduce or ps round (ranks and kernel alike: the
    veth links' network stack runs on the same cores). 0 when neither applies.

    Compute timed in situ (`insitu`) is wall time under the run's own sharing of the cores: its
    ranks computed at no less than cores/ranks of their speed, so the CPU work it holds is at
    least that fraction of its time, which the bound counts (it stays a lower bound)."""
    ps = s.comm == Comm.ps
    fab = Fabric(c, s.workers, s.servers if ps else 0)
    if not host_cores or not fab.on_one_host():
        return 0.0
    timed_share = min(1.0, host_cores / s.ranks) if insitu else 1.0
    per_worker = (sum(c.fwd) + sum(c.bwd) + c.data_s) * timed_share
    if ps or s.workers > 1:  # one allreduce worker has nothing to copy
        per_worker += c.unpack_s
        per_worker += c.pack_s if (ps or not s.overlap) else 0.0  # DDP fills buckets in backward
    per_worker += c.update_s if (not ps or s.algorithm == Algorithm.odsgd) else 0.0
    work = s.workers * per_worker
    if not ps:
        groups = comm_groups(c, s.overlap, s.bucket_bytes) if s.workers > 1 else []
        work += sum(fab.host_cpu_s(nbytes, ring=True) for _, nbytes in groups)
    else:  # one round per iteration: every worker's push and pull
        work += fab.host_cpu_s(c.model_bytes, ring=False)
        work += c.server_update_s if s.algorithm != Algorithm.asgd else s.workers * c.server_apply_s
    return work / min(host_cores, s.ranks)


def resolve_scenario(scenario: Scenario | None, settings: dict[str, Any]) -> Scenario:
    """The scenario given, or one from the keyword settings of the older call
    (algorithm=, comm_mode=, servers=, bandwidth_bytes_per_s=, bucket_mb=, ...)."""
    if scenario is not None:
        if settings:
            raise TypeError(f"give a Scenario or its settings, not both (got {', '.join(sorted(settings))})")
        return scenario
    if "comm_mode" in settings:
        settings["comm"] = settings.pop("comm_mode")
    return Scenario.of("scenario", **settings)


def cores_of(comm_model: dict[str, Any]) -> int | None:
    """The cores of the host the comm model was measured on (None: not recorded)."""
    return (comm_model.get("environment") or {}).get("cpu_count")


def decided_scenario(s: Scenario, comm_model: dict[str, Any]) -> Scenario:
    """comm_on_cpu None: whether the comm model is loopback for this world, and the world
    itself on one node (placed over nodes, its transfers cross links)."""
    if s.comm_on_cpu is not None:
        return s
    on_cpu = loopback(comm_model, s.bandwidth_bytes_per_s, s.ranks) and not multi_node(s.node_of_rank)
    return s.model_copy(update={"comm_on_cpu": on_cpu})


def predict(
    layers: dict[str, Any],
    comm_model: dict[str, Any],
    scenario: Scenario | None = None,
    *,
    workers: list[int] | None = None,
    strict: bool = True,
    capacity_bytes: int | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """One prediction per world size in `workers` (default: the scenario's), in order.
    A world the model cannot predict (CommModelError, NoPrediction) raises where `strict`;
    otherwise its row has no figures and a `no_prediction` reason (`no_prediction`).

    `predict(layers, comm_model, Scenario(...), workers=[...])`; the keyword settings
    of a Scenario (algorithm=, comm_mode= for comm, servers=, bucket_mb=, ...) work in
    its place. bucket_mb <= 0 means per-layer WFBP. comm_on_cpu: transfers hold the CPUs
    at their ends (None: when the comm model is loopback). A world whose fullest device needs
    more than `capacity_bytes` (modelling/memory.py) is a row "does not fit: ...", never a time."""
    scenario = resolve_scenario(scenario, settings)
    layers = table(layers)
    sizes = [scenario.workers] if workers is None else list(workers)
    if any(n < 1 for n in sizes):
        raise ValueError(f"workers: every world size must be at least 1, got {sizes}")
    comm = CommCosts(comm_model, scenario.bandwidth_bytes_per_s)
    host_cores = cores_of(comm_model)
    out = []
    for n in sizes:
        s = decided_scenario(scenario.with_workers(n), comm_model)
        try:
            row = predict_one(layers, comm, s, host_cores)
        except CommModelError as err:  # NoPrediction among them
            if strict:
                raise
            row = no_prediction(s, str(err))
        row |= predict_memory(layers, s)  # what it holds, whether or not its time is known
        if reason := does_not_fit(row, s, layers.get("device", "cpu"), capacity_bytes):
            row = no_prediction(s, reason) | {k: row[k] for k in MEMORY_FIGURES}
        out.append(row)
    return out
