"""The CPU validation grid (issue 3): train, profile, microbench, predict, compare.

Each algorithm with 2 workers (+1 shard for the PS ones), on a compute-bound
model (lenet5 on digits) and a communication-bound one (mlp on synthetic
3x32x32 inputs, 5.3 M parameters), each configuration trained `--repeats`
times, the repeats interleaved so that a slow spell of the host falls on all
configurations alike. A layer profile is taken after every run, with as many
concurrent processes as the run has workers, and the model's profiles are
pooled (modelling.layers.pool_layers). The comm model comes from a
microbenchmark on the same provider, one per model, whose ranks compute for as
long as the model's iteration before each timed operation. Prints predicted vs measured iteration
time per configuration (measured: the median over repeats of each run's median
iteration, DESIGN §4) and the median and worst absolute error against the 10%
target.

    python benchmarks/bench_validation.py [OUT_DIR] [--steps 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from infra.local import LocalProvider
from modelling.fit import fit_comm
from modelling.layers import pool_layers, write_layers
from modelling.microbench import run_microbench
from modelling.profiler import profile_layers
from modelling.validate import summarise, validate_runs
from pipelines.launch import launch, prepare

MODELS = [("lenet5", "digits"), ("mlp", "synthetic")]
CONFIGS = [("ssgd", "allreduce", 0), ("ssgd", "ps", 1), ("asgd", "ps", 1), ("odsgd", "ps", 1)]
WORKERS, BATCH = 2, 32
TARGET = 0.10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path, default=Path("/tmp/ddlbench-validation"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3, help="training runs per configuration")
    ap.add_argument(
        "--profile-processes",
        choices=["world", "workers"],
        default="workers",
        help="profile with as many processes as the run has workers (the pipeline's choice: a shard "
        "waits on the network and computes little, so it does not contend like a worker) or its whole world",
    )
    args = ap.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    provider = LocalProvider()
    profile_processes = {"world": WORKERS + 1, "workers": WORKERS}[args.profile_processes]
    comm_models: dict[str, dict] = {}
    profiles: dict[str, list[dict]] = {}
    for name, dataset in MODELS:
        # Communication costs more after a longer stretch of computation (cold caches, idle
        # threads to wake), so each model's microbenchmark computes for as long between
        # operations as the model's iteration does.
        first = profile_layers(name, BATCH, dataset=dataset, processes=profile_processes, repeats=20)
        profiles[name] = [first]
        gap = statistics.median(first["iteration_samples_s"])
        comm = run_microbench(
            WORKERS,
            1,
            out / f"microbench-{name}",
            provider=provider,
            sizes=[4096 * 2**i for i in range(14)],
            repeats=15,
            gap_s=gap,
        )
        comm_models[name] = fit_comm(comm)
        (out / f"model-{name}.json").write_text(json.dumps(comm_models[name], indent=2))
        print(f"{name}: microbenchmark with {gap * 1e3:.1f} ms of computation before each operation")
    runs: dict[str, list[Path]] = {name: [] for name, _ in MODELS}
    for repeat in range(args.repeats):
        for name, dataset in MODELS:
            for algorithm, comm_mode, servers in CONFIGS:
                run = out / f"{name}-{algorithm}-{comm_mode}-r{repeat}"
                cfg = prepare(
                    {
                        "model": name,
                        "dataset": dataset,
                        "algorithm": algorithm,
                        "comm": comm_mode,
                        "workers": WORKERS,
                        "servers": servers,
                        "batch_size": BATCH,
                        "steps": args.steps,
                    },
                    "bench",
                )
                launch(cfg, run, provider, timeout_s=600, echo=False)
                profiled = profile_layers(name, BATCH, dataset=dataset, processes=profile_processes, repeats=20)
                write_layers(profiled, run / "own")
                profiles[name].append(profiled)
                runs[name].append(run)
    rows = []
    for name, dirs in runs.items():  # every run of a model predicted from its pooled profile
        pooled = pool_layers(profiles[name])
        for d in dirs:
            write_layers(pooled, d)
        rows += validate_runs(dirs, comm_model=comm_models[name])["runs"]
    result = summarise(rows)
    print(f"{'configuration':<24} {'repeats':>7} {'predicted ms':>13} {'measured ms':>12} {'error':>8}  per run")
    per_run = {r["run"]: r for r in result["runs"]}
    for c in result["configs"]:
        label = f"{c['model']}-{c['algorithm']}-{c['comm']}"
        each = " ".join(f"{per_run[r]['error']:+.0%}" for r in c["runs"])
        print(
            f"{label:<24} {c['repeats']:>7} {c['predicted_iter_s'] * 1e3:>13.2f} "
            f"{c['measured_iter_s'] * 1e3:>12.2f} {c['error']:>+8.1%}  {each}"
        )
    med, worst = result["median_abs_error"], result["worst_abs_error"]
    print(
        f"median |error| {med:.1%} (ratio to the 10% target: {med / TARGET:.2f}); "
        f"worst {worst:.1%} (ratio {worst / TARGET:.2f}), over configurations"
    )
    single = sorted(abs(r["error"]) for r in result["runs"])
    print(
        f"single runs, each against its own median: median |error| {statistics.median(single):.1%}; "
        f"worst {single[-1]:.1%}"
    )
    vs_mean = sorted(abs(r["error_vs_mean"]) for r in result["runs"])
    print(
        f"single runs against their mean iteration: median |error| {statistics.median(vs_mean):.1%}; "
        f"worst {vs_mean[-1]:.1%}"
    )
    print(
        f"conditions: {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after, {time.monotonic() - t0:.0f} s in all"
    )
    (out / "validation.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
