"""The grid's predictions: every algorithm of a spec at the grid's and the what-if world sizes
and link rates, each job placed as the spec's provider would place it. The predict stage writes
them (pipelines/stages/model.py); the interval stage re-makes them from every pooled round's
inputs (pipelines/stages/interval.py)."""

from __future__ import annotations

import itertools
from typing import Any

from infra import ProviderError
from modelling.predict import predict as predict_model
from modelling.scenario import Scenario
from pipelines.preflight import capacity_bytes
from pipelines.spec import BenchSpec, parse_rate
from pipelines.stages.runner import workload_dir


def predictions(spec: BenchSpec, layers_by: dict[str, dict], model: dict) -> list[dict[str, Any]]:
    """Every algorithm at the grid's and the what-if world sizes, at the measured and what-if rates."""
    sizes = sorted(set(spec.workers) | set(spec.what_if.workers))
    placed = placements(spec, sizes)
    rates = [(spec.network.link_bandwidth, spec.network.bytes_per_s)]
    rates += [(r, parse_rate(r)) for r in spec.what_if.link_bandwidths]
    rows: list[dict[str, Any]] = []
    for wl in spec.workloads:
        for batch in spec.batch_sizes:
            layers = layers_by[workload_dir(wl, batch)]
            capacity = capacity_bytes(spec, layers.get("device", "cpu"))
            for algo in spec.algorithms:
                for (label, rate), n in itertools.product(rates, sizes):
                    scenario = spec_scenario(spec, algo, n, placed, bandwidth_bytes_per_s=rate, batch_size=batch)
                    for p in predict_model(layers, model, scenario, strict=False, capacity_bytes=capacity):
                        rows.append(
                            {
                                "workload": wl.label,
                                "batch_size": batch,
                                "algorithm": algo.label,
                                "workers": p["workers"],
                                "link_bandwidth": label or "measured",
                                "iter_time_s": p["iter_time_s"],
                                "throughput_samples_per_s": p["throughput_samples_per_s"],
                                "compute_s": p.get("compute_s"),
                                "comm_s": p.get("comm_s"),
                                # The fullest rank's tensor bytes and their breakdown (modelling/memory.py).
                                "memory_bytes": p.get("memory_bytes"),
                                "memory_breakdown": p.get("memory_breakdown"),
                                "what_if": p["workers"] not in spec.workers or rate != rates[0][1],
                                # Why the model gave no figures (DESIGN §3), or what it assumed.
                                "no_prediction": p.get("no_prediction"),
                                "note": p.get("note"),
                                "domain": p.get("domain", "validated"),
                            }
                        )
    return rows


def spec_scenario(spec: BenchSpec, algo: Any, workers: int,
                  placed: dict[tuple[int, int], tuple[int, ...]], **what_if: Any) -> Any:
    """The Scenario of one of the spec's algorithms at `workers`, placed as `placements` says (none
    where the cluster cannot place it), with what-ifs (a link rate, a batch)."""
    s = Scenario.of("spec", algorithm=algo.name.value, comm=algo.comm_mode.value, workers=workers,
                    servers=spec.servers, **what_if, **Scenario.settings_in(algo.options))
    return s.model_copy(update={"node_of_rank": placed.get((workers, s.servers))})


def placements(spec: BenchSpec, sizes: list[int]) -> dict[tuple[int, int], tuple[int, ...]]:
    """(workers, servers) -> the node of every rank as the spec's provider places that job
    (DESIGN §5), for the grid's and the what-if world sizes; a what-if this cluster cannot
    place is predicted without a placement (a cluster like it, large enough)."""
    provider = spec.provider.build()  # provisions nothing
    out = {}
    for n, servers in itertools.product(sizes, {0, spec.servers}):
        try:
            out[(n, servers)] = provider.place(n, servers).node_of_rank
        except ProviderError:
            continue
    return out
