"""Measuring the cluster before training: communication microbenchmarks and layer profiles."""

from __future__ import annotations

import json

from pipelines.context import RunContext
from pipelines.stages.runner import cluster, columns, run_once, workload_dir
from pipelines.tracking import Tracker


def microbench(ctx: RunContext) -> dict:
    """Communication microbenchmarks at each world size of the grid (comm.json per size)."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        if not spec.microbench.enabled:
            return {"comm": [], "skipped": True}
        from modelling.microbench import run_microbench

        paths = []
        with cluster(ctx) as p:
            for n in sorted(spec.workers):
                out = ctx.paths.microbench(n)
                run_microbench(
                    n,
                    spec.servers,
                    out,
                    provider=p,
                    sizes=spec.microbench.sizes,
                    repeats=spec.microbench.repeats,
                    timeout_s=spec.microbench.timeout_s,
                    link_bytes_per_s=spec.network.bytes_per_s,
                )
                t.log_artifact(node, out / "comm.json", f"w{n}")
                paths.append(str(out / "comm.json"))
        t.log_params(
            node,
            {"workers": json.dumps(sorted(spec.workers)), "servers": spec.servers, "repeats": spec.microbench.repeats},
        )
        return {"comm": paths, "skipped": False}

    return run_once(ctx, "microbench", body)


def profile(ctx: RunContext) -> dict:
    """Layer tables of every workload and batch size, profiled under training's process count."""
    spec = ctx.spec()

    def body(t: Tracker, node: str) -> dict:
        if not spec.profile.enabled:
            return {"layers": {}, "skipped": True}
        from modelling.profiler import profile_layers, write_layers

        out: dict[str, str] = {}
        for wl in spec.workloads:
            for batch in spec.batch_sizes:
                name = workload_dir(wl, batch)
                with cluster(ctx) as p:
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
                        out_dir=ctx.paths.profile(name) / "job",
                        timeout_s=spec.profile.timeout_s,
                    )
                path = write_layers(layers, ctx.paths.profile(name))
                t.log_artifact(node, path, name)
                t.log_artifact(node, path.with_name("layers.txt"), name)
                table = columns(layers["layers"], ("name", "type", "fwd_s", "bwd_s", "param_bytes"))
                t.log_table(node, table, f"{name}/layers_table.json")
                t.log_metrics(
                    node,
                    {
                        f"{name}.forward_s": sum(r["fwd_s"] for r in layers["layers"]),
                        f"{name}.backward_s": sum(r["bwd_s"] for r in layers["layers"]),
                        f"{name}.update_s": layers["update_s"],
                        f"{name}.data_s": layers["data_s"],
                    },
                )
                out[name] = str(path)
        return {"layers": out, "skipped": False}

    return run_once(ctx, "profile", body)
