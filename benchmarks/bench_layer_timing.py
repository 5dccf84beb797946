"""The in-situ per-layer timing's overhead on the training iteration (issue 33).

The same job (default: lenet5 on digits, SSGD-allreduce, 2 workers, batch 32) trained with
sampling off, at the default k (every 10th iteration) and at k = 1 (every iteration: the cost of
one sampled iteration), the variants interleaved in each repeat so a slow spell of the host falls
on all alike. Prints each variant's mean iteration (what throughput pays: a sampled iteration is
one in k, which a median would not see) and its p50, as ratios against the run without sampling,
with the repeats' spread.

    python benchmarks/bench_layer_timing.py [OUT_DIR] [--steps 200] [--repeats 3] [--model lenet5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
from pathlib import Path

from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from training.layer_timing import DEFAULT_EVERY, EVERY_ENV

VARIANTS = {"off": 0, f"k={DEFAULT_EVERY}": DEFAULT_EVERY, "k=1": 1}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path, default=Path("/tmp/ddlbench-layer-timing"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--dataset", default="digits")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    print(f"load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    got: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for repeat in range(args.repeats):
        for label, every in VARIANTS.items():
            os.environ[EVERY_ENV] = str(every)
            cfg = prepare({"model": args.model, "dataset": args.dataset, "algorithm": "ssgd", "comm": "allreduce",
                           "workers": 2, "batch_size": 32, "steps": args.steps}, "bench")
            summary = launch(cfg, args.out / f"{label}-r{repeat}", LocalProvider(), timeout_s=600, echo=False)
            got[label].append(summary["iter_time_s"])
            print(f"  r{repeat} {label:>5}: mean {summary['iter_time_s']['mean'] * 1e3:.2f} ms, "
                  f"p50 {summary['iter_time_s']['p50'] * 1e3:.2f} ms", flush=True)
    os.environ.pop(EVERY_ENV, None)
    base = {k: statistics.median(r[k] for r in got["off"]) for k in ("mean", "p50")}
    print(f"{'variant':>7} {'mean ms':>9} {'ratio':>7} {'p50 ms':>8} {'ratio':>7}  per-repeat mean ratio (paired)")
    for label, rows in got.items():
        mean, p50 = (statistics.median(r[k] for r in rows) for k in ("mean", "p50"))
        paired = " ".join(f"{r['mean'] / o['mean']:.3f}" for r, o in zip(rows, got["off"], strict=True))
        print(f"{label:>7} {mean * 1e3:>9.2f} {mean / base['mean']:>7.3f} {p50 * 1e3:>8.2f} "
              f"{p50 / base['p50']:>7.3f}  {paired}")
    spread = [max(r[k] for r in got["off"]) / min(r[k] for r in got["off"]) - 1 for k in ("mean", "p50")]
    print(f"repeat spread without sampling (max/min - 1): mean {spread[0]:.1%}, p50 {spread[1]:.1%}; "
          f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
