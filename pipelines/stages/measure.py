"""Measuring the cluster before training: communication microbenchmarks and layer profiles.

One protocol for the pipeline and the validation benchmark (benchmarks/bench_validation.py
runs specs through this path): each workload is profiled in `profile.pooled` rounds, pooled
(each time the median over the rounds); the communication is measured in `microbench.pooled`
rounds, pooled, whose ranks compute for as long as the models' iteration before each timed
operation (communication costs more after a longer stretch of computation: cold caches, idle
threads to wake); and the sizes measured are those the spec's models need, up to a few times
the largest model's parameter bytes, within a stated time budget. Each round is kept
(profile/NAME/rI, microbench/wN/rI): the prediction intervals re-predict from them.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from infra.warm import agents as warm_agents
from modelling.measure.layers import load_layers, pool_layers, write_layers
from modelling.measure.microbench import run_microbench
from modelling.measure.profiler import profile_layers
from pipelines.context import RunContext
from pipelines.spec import BenchSpec
from pipelines.stages.runner import cluster, columns, run_once, workload_dir, write_json
from pipelines.tracking import Tracker

SMALLEST = 4096
PRIMITIVES = 3  # allreduce, point-to-point, parameter-server rounds


def _profile_round(ctx: RunContext, spec: BenchSpec, wl: Any, batch: int, i: int, p: Any) -> dict[str, Any]:
    """Round i of a workload's profile (profile/NAME/rI/layers.json), measured once."""
    out = ctx.paths.profile(workload_dir(wl, batch)) / f"r{i}"
    if (out / "layers.json").exists():
        return load_layers(out / "layers.json")
    layers = profile_layers(
        wl.model,
        batch,
        input_shape=wl.input_shape,
        dataset=wl.dataset,
        num_classes=wl.num_classes or 10,
        model_options=wl.model_options,
        device=spec.train.get("device", "cpu"),
        warmup=spec.profile.warmup,
        repeats=spec.profile.repeats,
        processes=max(spec.workers),
        provider=p,
        out_dir=out / "job",
        timeout_s=spec.profile.timeout_s,
    )
    write_layers(layers, out)
    return layers


def plan_sizes(param_bytes: int, spec: BenchSpec) -> dict[str, Any]:
    """The message sizes: every factor of 4 from 4 KiB to `max_size_factor` x the largest model's
    parameter bytes, the largest dropped (down to 3 sizes) until the rounds' estimated wire time
    (each primitive moving 2 N x the size per operation) fits `budget_s`."""
    mb = spec.microbench
    top = max(param_bytes * mb.max_size_factor, 16 * SMALLEST)  # 3 sizes at least: a line and a check
    sizes = [SMALLEST]
    while sizes[-1] < top:
        sizes.append(sizes[-1] * 4)
    rate = spec.network.bytes_per_s or 1e9
    per_byte = mb.pooled * mb.repeats * PRIMITIVES * 2 * max(spec.workers) * len(spec.workers) / rate

    def cost(xs: list[int]) -> float:
        return sum(xs) * per_byte

    while len(sizes) > 3 and cost(sizes) > mb.budget_s:
        sizes.pop()
    return {"sizes": sizes, "estimated_s": cost(sizes), "budget_s": mb.budget_s,
            "covers_model": sizes[-1] >= param_bytes}


def microbench(ctx: RunContext) -> dict:
    """Communication microbenchmarks at each world size of the grid, in pooled rounds (comm.json per
    size: every round's measurements)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        if not spec.microbench.enabled:
            return {"comm": [], "skipped": True}
        mb = spec.microbench
        paths = []
        with cluster(ctx) as p, warm_agents():  # several jobs: one warm agent per node (infra/warm.py)
            firsts = [_profile_round(ctx, spec, wl, b, 0, p) for wl in spec.workloads for b in spec.batch_sizes]
            gap = mb.gap_s if mb.gap_s is not None else statistics.median(
                statistics.median(f["iteration_samples_s"]) for f in firsts)
            gap = min(gap, 10.0)
            params = max(sum(r["param_bytes"] for r in f["layers"]) for f in firsts)
            plan = plan_sizes(params, spec) if mb.sizes is None else {"sizes": sorted(mb.sizes)}
            rounds: dict[int, list[dict[str, Any]]] = {}
            for i in range(mb.pooled):
                for n in sorted(spec.workers):
                    comm = run_microbench(
                        n, spec.servers, ctx.paths.microbench(n) / f"r{i}", provider=p, sizes=plan["sizes"],
                        repeats=mb.repeats, timeout_s=mb.timeout_s, link_bytes_per_s=spec.network.bytes_per_s,
                        gap_s=gap, device=spec.train.get("device", "cpu"),  # as training communicates
                    )
                    rounds.setdefault(n, []).append(comm)
        for n, comms in rounds.items():
            out = ctx.paths.microbench(n) / "comm.json"
            write_json(out, {**comms[0], "pooled_rounds": len(comms),
                             "measurements": [m for c in comms for m in c["measurements"]]})
            t.log_artifact(node, out, f"w{n}")
            paths.append(str(out))
        t.log_params(node, {"workers": json.dumps(sorted(spec.workers)), "servers": spec.servers,
                            "repeats": mb.repeats, "pooled": mb.pooled, "gap_s": f"{gap:.6f}",
                            "sizes": ",".join(map(str, plan["sizes"]))})
        return {"comm": paths, "skipped": False, "gap_s": gap, **plan}

    return run_once(ctx, "microbench", body)


def profile(ctx: RunContext) -> dict:
    """Layer tables of every workload and batch size, profiled under training's process count in
    `profile.pooled` rounds and pooled (round 0 may come from the microbenchmark stage)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        if not spec.profile.enabled:
            return {"layers": {}, "skipped": True}
        out: dict[str, str] = {}
        with cluster(ctx) as p, warm_agents():  # one cluster, and one warm agent per node, for every round
            for wl, batch in itertools.product(spec.workloads, spec.batch_sizes):
                name = workload_dir(wl, batch)
                tables = [_profile_round(ctx, spec, wl, batch, i, p) for i in range(spec.profile.pooled)]
                layers = pool_layers(tables)
                path = write_layers(layers, ctx.paths.profile(name))
                t.log_artifact(node, path, name)
                t.log_artifact(node, path.with_name("layers.txt"), name)
                table = columns(layers["layers"], ("name", "type", "fwd_s", "bwd_s", "param_bytes"))
                t.log_table(node, table, f"{name}/layers_table.json")
                rounds = [sum(r["fwd_s"] + r["bwd_s"] for r in x["layers"]) for x in tables]
                t.log_metrics(
                    node,
                    {
                        f"{name}.forward_s": sum(r["fwd_s"] for r in layers["layers"]),
                        f"{name}.backward_s": sum(r["bwd_s"] for r in layers["layers"]),
                        f"{name}.update_s": layers["update_s"],
                        f"{name}.data_s": layers["data_s"],
                        # How far the rounds' passes lie apart: the profile's own noise floor.
                        f"{name}.rounds_spread": max(rounds) / min(rounds) - 1 if min(rounds) > 0 else None,
                    },
                )
                out[name] = str(Path(path))
        return {"layers": out, "skipped": False}

    return run_once(ctx, "profile", body)
