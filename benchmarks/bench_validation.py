"""The CPU validation grid (issue 3): train, profile, microbench, predict, compare.

Each algorithm with 2 workers (+1 shard for the PS ones), on a compute-bound
model (lenet5 on digits) and a communication-bound one (mlp on synthetic
3x32x32 inputs, 5.3 M parameters). The profile is taken with as many concurrent
processes as the training world has (DESIGN §3), and the comm model comes from
a microbenchmark on the same provider. Prints predicted vs measured iteration
time per run and the median and worst absolute error against the 10% target.

    python benchmarks/bench_validation.py [OUT_DIR] [--steps 60]
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
from modelling.layers import write_layers
from modelling.microbench import run_microbench
from modelling.profiler import profile_layers
from modelling.validate import validate_runs
from pipelines.launch import launch, prepare

MODELS = [("lenet5", "digits"), ("mlp", "synthetic")]
CONFIGS = [("ssgd", "allreduce", 0), ("ssgd", "ps", 1), ("asgd", "ps", 1), ("odsgd", "ps", 1)]
WORKERS, BATCH = 2, 32
TARGET = 0.10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path, default=Path("/tmp/ddlbench-validation"))
    ap.add_argument("--steps", type=int, default=60)
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
    comm = run_microbench(
        WORKERS, 1, out / "microbench", provider=provider, sizes=[4096 * 2**i for i in range(14)], repeats=15
    )
    model = fit_comm(comm)
    (out / "model.json").write_text(json.dumps(model, indent=2))
    runs = []
    for name, dataset in MODELS:
        for algorithm, comm_mode, servers in CONFIGS:
            run = out / f"{name}-{algorithm}-{comm_mode}"
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
            # Profiled right after its run, so both see the same load from whatever else
            # shares the host, with the training world's process count (or its workers').
            write_layers(
                profile_layers(
                    name,
                    BATCH,
                    dataset=dataset,
                    processes=WORKERS + (servers if args.profile_processes == "world" else 0),
                    repeats=20,
                ),
                run,
            )
            runs.append(run)
    result = validate_runs(runs, comm_model=model)
    print(f"{'run':<28} {'predicted ms':>13} {'p50 ms':>8} {'error':>8} {'mean ms':>8} {'vs mean':>8}")
    for r in result["runs"]:
        print(
            f"{Path(r['run']).name:<28} {r['predicted_iter_s'] * 1e3:>13.2f} "
            f"{r['measured_iter_s'] * 1e3:>8.2f} {r['error']:>+8.1%} "
            f"{r['measured_iter_mean_s'] * 1e3:>8.2f} {r['error_vs_mean']:>+8.1%}"
        )
    med, worst = result["median_abs_error"], result["worst_abs_error"]
    print(
        f"against the median iteration time: median |error| {med:.1%} (ratio to the 10% target: "
        f"{med / TARGET:.2f}); worst {worst:.1%} (ratio {worst / TARGET:.2f})"
    )
    vs_mean = sorted(abs(r["error_vs_mean"]) for r in result["runs"])
    print(f"against the mean iteration time: median |error| {statistics.median(vs_mean):.1%}; worst {vs_mean[-1]:.1%}")
    print(
        f"conditions: {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before and "
        f"{os.getloadavg()[0]:.2f} after, {time.monotonic() - t0:.0f} s in all"
    )
    (out / "validation.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
