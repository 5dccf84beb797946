"""Convergence of the algorithms, measured like a benchmark (issue 13), run by hand:

    python -m benchmarks.bench_convergence                           # lenet5/digits, one host
    python -m benchmarks.bench_convergence --cluster netns --bandwidth 100mbit   # needs root
    python -m benchmarks.bench_convergence --workload resnet20-learnable --steps 400

Runs SSGD (allreduce and PS), ASGD, OD-SGD and OD-SGD with delay compensation, each over
`--seeds` seeds (a seed sets the init and the data order, as the spec's repeats do), and
prints per algorithm: final accuracy, time-to-accuracy (training seconds, warm-up included,
evaluation excluded; "not reached in K steps" when it was not), steps to accuracy and
throughput, each as median [min, max] over the seeds. Then the OD-SGD paper's two claims
(Xu et al., TACO 2020) as figures against their anchors, from the same run:

1. OD-SGD final accuracy minus SSGD-PS final accuracy, in points (claim: >= -0.5 pp);
2. OD-SGD time-to-accuracy / SSGD-PS's and / ASGD's (claim: below 1 on a link where
   communication matters, i.e. `--cluster netns` with a shaped `--bandwidth`; there the
   parameter-server algorithms run one shard per node, colocated with the workers).

Workloads: lenet5 on the bundled digits (target 0.9), and the compute-bound resnet20 on
synthetic-learnable (CIFAR shape, Bayes accuracy 0.933; target 0.6 by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from pipelines.launch import launch, prepare

WORKLOADS: dict[str, dict[str, Any]] = {
    "lenet5-digits": {"model": "lenet5", "dataset": "digits", "target_accuracy": 0.9},
    "resnet20-learnable": {"model": "resnet20", "dataset": "synthetic-learnable", "synthetic_samples": 50_000,
                           "target_accuracy": 0.6},
}
ALGORITHMS: dict[str, dict[str, Any]] = {
    "ssgd-allreduce": {"algorithm": "ssgd", "comm": "allreduce"},
    "ssgd-ps": {"algorithm": "ssgd", "comm": "ps", "servers": 1},
    "asgd": {"algorithm": "asgd", "servers": 1},
    # The shard's momentum lowered for the stale gradients' own (specs/smoke.yaml says why).
    "asgd-m08": {"algorithm": "asgd", "servers": 1, "momentum_async": 0.8},
    "odsgd": {"algorithm": "odsgd", "servers": 1},
    "odsgd-dc": {"algorithm": "odsgd", "servers": 1, "compensation": "dc"},
    # The authors' public configs: no local momentum, an SSGD warm-up (not run by default).
    "odsgd-paper": {"algorithm": "odsgd", "servers": 1, "momentum_local": 0.0, "warmup_steps": 25},
}
DEFAULT_ALGORITHMS = ["ssgd-allreduce", "ssgd-ps", "asgd", "odsgd", "odsgd-dc"]


def spread(values: list[float | None]) -> str:
    """median [min, max] of the numbers among `values`, with how many are missing."""
    nums = [v for v in values if v is not None]
    if not nums:
        return "-"
    fmt = "{:.0f}" if all(float(v).is_integer() for v in nums) else "{:.3f}"  # steps, or figures
    text = f"{fmt.format(statistics.median(nums))} [{fmt.format(min(nums))}, {fmt.format(max(nums))}]"
    return text + (f" ({len(values) - len(nums)} not reached)" if len(nums) < len(values) else "")


def _median(values: list[float | None]) -> float | None:
    nums = [v for v in values if v is not None]
    return statistics.median(nums) if nums else None


def _provider(args: argparse.Namespace):
    if args.cluster == "local":
        from infra.local import LocalProvider

        return LocalProvider()
    from infra.netns import NetnsProvider

    return NetnsProvider(nodes=args.workers, bandwidth=args.bandwidth)


def run(args: argparse.Namespace, out: Path) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {a: [] for a in args.algorithms}
    with _provider(args) as provider:
        # Seeds outermost, algorithms alternating: a drift of the machine's load spreads
        # over every algorithm instead of landing on one.
        for seed in range(args.seeds):
            for name in args.algorithms:
                values = {**WORKLOADS[args.workload], **ALGORITHMS[name], "workers": args.workers,
                          "batch_size": args.batch_size, "steps": args.steps, "eval_every": args.eval_every,
                          "lr": args.lr, "momentum": 0.9, "seed": seed, "threads": 1, "timeout_s": 120,
                          "link_bandwidth": args.bandwidth if args.cluster == "netns" else None}
                if args.cluster == "netns" and "servers" in values:
                    # One shard per node, colocated with its node's worker (DESIGN §5's default, as
                    # MXNet and BytePS deployments run them): each node's link carries half the model.
                    values["servers"] = args.workers
                if args.target is not None:
                    values["target_accuracy"] = args.target
                s = launch(prepare(values, "bench"), out / f"{name}-s{seed}", provider, timeout_s=3600, echo=False)
                results[name].append(s)
                tta = s["time_to_accuracy_s"]
                reached = (f"{tta:.1f} s ({s['steps_to_accuracy']} steps)" if tta is not None
                           else f"not reached in {values['steps']} steps")
                print(f"  {name} seed {seed}: accuracy {s['final_accuracy']:.3f}, "
                      f"time to {s['target_accuracy']}: {reached}, "
                      f"{s['throughput_samples_per_s']:.0f} samples/s", flush=True)
    return results


def report(results: dict[str, list[dict[str, Any]]], steps: int) -> None:
    print(f"\n{'algorithm':16} {'final accuracy':32} {'time to accuracy s':40} {'steps to accuracy':36} "
          "samples/s")
    for name, runs in results.items():
        tta = [r["time_to_accuracy_s"] for r in runs]
        reached = spread(tta) if any(t is not None for t in tta) else f"not reached in {steps} steps"
        print(f"{name:16} {spread([r['final_accuracy'] for r in runs]):32} {reached:40} "
              f"{spread([r['steps_to_accuracy'] for r in runs]):36} "
              f"{spread([r['throughput_samples_per_s'] for r in runs])}")
    if "odsgd" not in results:
        return
    od = results["odsgd"]
    print("\nThe OD-SGD paper's claims, median over seeds (per-seed figures in brackets):")
    for anchor in ("ssgd-ps", "ssgd-allreduce"):
        if anchor in results:
            pairs = zip(od, results[anchor], strict=True)
            diffs = [100 * (a["final_accuracy"] - b["final_accuracy"]) for a, b in pairs]
            print(f"  accuracy OD-SGD - {anchor}: {statistics.median(diffs):+.2f} pp "
                  f"[{min(diffs):+.2f}, {max(diffs):+.2f}] (claim: >= -0.5 pp)")
    for anchor in ("ssgd-ps", "ssgd-allreduce", "asgd", "asgd-m08"):
        if anchor not in results:
            continue
        ours, theirs = _median([r["time_to_accuracy_s"] for r in od]), _median(
            [r["time_to_accuracy_s"] for r in results[anchor]])
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "- (a target not reached)"
        print(f"  time-to-accuracy OD-SGD / {anchor}: {ratio} (claim: < 1 where communication matters)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="lenet5-digits")
    ap.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=DEFAULT_ALGORITHMS)
    ap.add_argument("--cluster", choices=["local", "netns"], default="local")
    ap.add_argument("--bandwidth", default="100mbit", help="netns: each node's link rate (tc units)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--target", type=float, default=None, help="target accuracy (default: the workload's)")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's summary figures here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ddlb-convergence-"))
    where = "one host" if args.cluster == "local" else f"netns, {args.workers} nodes at {args.bandwidth}"
    print(f"{args.workload}, {args.workers} workers x {args.batch_size}, {args.steps} steps, "
          f"{args.seeds} seeds, {where}; runs in {out}", flush=True)
    results = run(args, out)
    report(results, args.steps)
    if args.json:
        keys = ("final_accuracy", "time_to_accuracy_s", "steps_to_accuracy", "target_reached",
                "throughput_samples_per_s", "train_time_s")
        args.json.write_text(json.dumps({n: [{k: r[k] for k in keys} for r in rs] for n, rs in results.items()},
                                        indent=2))


if __name__ == "__main__":
    main()
