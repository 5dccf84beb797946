"""A prediction's timeline: the simulated schedule as the trainer's timeline records, and
its Gantt chart and Chrome trace (DESIGN §3's outputs), apart from the prediction itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelling.cores import on_shared_cores
from modelling.dag import Plan
from modelling.network.costs import CommCosts
from modelling.plan import build_plan
from modelling.predict import WORKER_TASKS, build_costs, cores_of, decided_scenario, resolve_scenario, table
from modelling.scenario import Scenario
from modelling.simulate import Schedule, simulate
from training.measure.timeline import to_chrome_trace

SERVER_PHASE = {"push": "comm_exposed", "pull": "send", "push-apply-pull": "update"}


def predicted_timeline(
    layers: dict[str, Any], comm_model: dict[str, Any], scenario: Scenario | None = None, **settings: Any
) -> list[dict[str, Any]]:
    """The simulated schedule as timeline records (training/measure/timeline.py's format):
    one record per worker (class) and step, and per server shard and step.
    Called as `predict` is, with one world size (workers=N among the settings)."""
    s = decided_scenario(resolve_scenario(scenario, settings), comm_model)
    layers = table(layers)
    costs = build_costs(layers, CommCosts(comm_model, s.bandwidth_bytes_per_s), s)
    costs, cores = on_shared_cores(costs, layers, s, cores_of(comm_model))
    plan = build_plan(costs, s)
    return _records(plan, simulate(plan.dag, cores))


def _server_of(task_name: str) -> str:
    """'push s1' -> 'server1': every PS transfer's name ends with its shard."""
    return "server" + task_name.rpartition(" s")[2]


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
            mark(_server_of(dag.names[t]), dag.steps[t], phase, t)
    ranks = {o: i for i, o in enumerate(plan.iteration_ends)}
    records = []
    for (owner, step), phases in spans.items():
        if owner in ranks:
            role, rank = "worker", ranks[owner]
            # As the trainer records it: waiting from the end of backward to the update.
            if phases["update"][0] > phases["backward"][1]:
                phases["comm_exposed"] = [phases["backward"][1], phases["update"][0]]
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
    path.write_text(json.dumps(to_chrome_trace(records, label="predicted")))
    return path


_COLOURS = {
    "data": "#9e9e9e",
    "forward": "#4c72b0",
    "backward": "#55a868",
    "comm_exposed": "#c44e52",
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
