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

Workloads: lenet5 on the bundled digits (target 0.9), the compute-bound resnet20 on
synthetic-learnable (CIFAR shape, Bayes accuracy 0.933; target 0.6 by default), and the
transformer row: gpt-tiny on the Markov source, judged by its evaluation loss (lower is
better; the chain's entropy rate 1.58 nats is the best any model reaches, its unigram
entropy 2.76 the best without context; target 2.7, below the latter): its figures are the
final loss and time to the target loss, claim 1 becomes OD-SGD's loss minus SSGD's (in nats).
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
    # lr 0.3: at the default 0.05 SGD takes thousands of steps to leave the unigram plateau.
    "gpt-tiny-markov": {"model": "gpt-tiny", "dataset": "markov", "seq_len": 32, "target_loss": 2.7, "lr": 0.3,
                        "batch_size": 16},
    # The demo's workload (specs/demo.yaml): gpt-mini on the standard library's source as bytes.
    "gpt-mini-stdlib": {"model": "gpt-mini", "dataset": "stdlib-text", "seq_len": 32, "target_loss": 2.7,
                        "lr": 0.05, "batch_size": 32},
}
# What a workload is judged by: (final figure, time to target, steps to target, target) keys.
ACCURACY = ("final_accuracy", "time_to_accuracy_s", "steps_to_accuracy", "target_accuracy")
LOSS = ("final_test_loss", "time_to_loss_s", "steps_to_loss", "target_loss")


def judged_by(workload: str) -> tuple[str, str, str, str]:
    return LOSS if "target_loss" in WORKLOADS[workload] else ACCURACY
ALGORITHMS: dict[str, dict[str, Any]] = {
    "ssgd-allreduce": {"algorithm": "ssgd", "comm": "allreduce"},
    "ssgd-ps": {"algorithm": "ssgd", "comm": "ps", "servers": 1},
    "asgd": {"algorithm": "asgd", "servers": 1},
    # The shard's momentum lowered for the stale gradients' own (specs/smoke.yaml says why).
    "asgd-m08": {"algorithm": "asgd", "servers": 1, "momentum_async": 0.8},
    # Without the shard's momentum: the demo's GPT (specs/demo.yaml says why).
    "asgd-m0": {"algorithm": "asgd", "servers": 1, "momentum_async": 0.0},
    "odsgd": {"algorithm": "odsgd", "servers": 1},
    "odsgd-dc": {"algorithm": "odsgd", "servers": 1, "compensation": "dc"},
    # The authors' public configs: no local momentum, an SSGD warm-up (not run by default).
    "odsgd-paper": {"algorithm": "odsgd", "servers": 1, "momentum_local": 0.0, "warmup_steps": 25},
}
DEFAULT_ALGORITHMS = ["ssgd-allreduce", "ssgd-ps", "asgd", "odsgd", "odsgd-dc"]


def spread(values: list[float | None]) -> str:
    """median [min, max] of the numbers among `values`, with how many are missing (a target not
    reached, a run diverged)."""
    nums = [v for v in values if v is not None]
    if not nums:
        return "-"
    fmt = "{:.0f}" if all(float(v).is_integer() for v in nums) else "{:.3f}"  # steps, or figures
    text = f"{fmt.format(statistics.median(nums))} [{fmt.format(min(nums))}, {fmt.format(max(nums))}]"
    return text + (f" ({len(values) - len(nums)} missing)" if len(nums) < len(values) else "")


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
                values = {"batch_size": 32, "lr": 0.05, **WORKLOADS[args.workload], **ALGORITHMS[name],
                          "workers": args.workers, "steps": args.steps, "eval_every": args.eval_every,
                          "momentum": 0.9, "seed": seed, "threads": 1, "timeout_s": 120,
                          "link_bandwidth": args.bandwidth if args.cluster == "netns" else None}
                values |= {k: v for k, v in (("batch_size", args.batch_size), ("lr", args.lr)) if v is not None}
                if args.cluster == "netns" and "servers" in values:
                    # One shard per node, colocated with its node's worker (DESIGN §5's default, as
                    # MXNet and BytePS deployments run them): each node's link carries half the model.
                    values["servers"] = args.workers
                final, to_target, steps_to, target = judged_by(args.workload)
                if args.target is not None:
                    values[target] = args.target
                s = launch(prepare(values, "bench"), out / f"{name}-s{seed}", provider, timeout_s=3600, echo=False)
                if s.get("status") == "diverged":  # an outcome of the algorithm, counted, not a crash
                    print(f"  {name} seed {seed}: diverged at step {s['step']} (loss {s['loss']})", flush=True)
                    results[name].append({final: None, to_target: None, steps_to: None, "diverged": True,
                                          "target_reached": False, "throughput_samples_per_s": None,
                                          "train_time_s": None})
                    continue
                results[name].append(s)
                tta = s[to_target]
                reached = (f"{tta:.1f} s ({s[steps_to]} steps)" if tta is not None
                           else f"not reached in {values['steps']} steps")
                tokens = f", {s['throughput_tokens_per_s']:.0f} tokens/s" if s.get("throughput_tokens_per_s") else ""
                print(f"  {name} seed {seed}: {final} {s[final]:.3f}, time to {s[target]}: {reached}, "
                      f"{s['throughput_samples_per_s']:.0f} samples/s{tokens}", flush=True)
    return results


def report(results: dict[str, list[dict[str, Any]]], steps: int, workload: str) -> None:
    final, to_target, steps_to, _ = judged_by(workload)
    print(f"\n{'algorithm':16} {final:32} {to_target:40} {steps_to:36} samples/s")
    for name, runs in results.items():
        tta = [r[to_target] for r in runs]
        reached = spread(tta) if any(t is not None for t in tta) else f"not reached in {steps} steps"
        diverged = sum(bool(r.get("diverged")) for r in runs)
        print(f"{name:16} {spread([r[final] for r in runs]):32} {reached:40} "
              f"{spread([r[steps_to] for r in runs]):36} "
              f"{spread([r['throughput_samples_per_s'] for r in runs])}"
              + (f"  ({diverged} of {len(runs)} diverged)" if diverged else ""))
    if "odsgd" not in results:
        return
    od = results["odsgd"]
    print("\nThe OD-SGD paper's claims, median over seeds (per-seed figures in brackets):")
    for anchor in ("ssgd-ps", "ssgd-allreduce"):
        if anchor in results:
            pairs = [(a, b) for a, b in zip(od, results[anchor], strict=True)
                     if a[final] is not None and b[final] is not None]  # seeds where neither diverged
            if not pairs:
                continue
            if final == "final_accuracy":
                diffs = [100 * (a[final] - b[final]) for a, b in pairs]
                print(f"  accuracy OD-SGD - {anchor}: {statistics.median(diffs):+.2f} pp "
                      f"[{min(diffs):+.2f}, {max(diffs):+.2f}] (claim: >= -0.5 pp)")
            else:
                diffs = [a[final] - b[final] for a, b in pairs]
                print(f"  evaluation loss OD-SGD - {anchor}: {statistics.median(diffs):+.3f} nats "
                      f"[{min(diffs):+.3f}, {max(diffs):+.3f}] (the claim's analogue: close to 0)")
    for anchor in ("ssgd-ps", "ssgd-allreduce", "asgd", "asgd-m08"):
        if anchor not in results:
            continue
        ours, theirs = _median([r[to_target] for r in od]), _median([r[to_target] for r in results[anchor]])
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "- (a target not reached)"
        print(f"  time-to-target OD-SGD / {anchor}: {ratio} (claim: < 1 where communication matters)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="lenet5-digits")
    ap.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=DEFAULT_ALGORITHMS)
    ap.add_argument("--cluster", choices=["local", "netns"], default="local")
    ap.add_argument("--bandwidth", default="100mbit", help="netns: each node's link rate (tc units)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None, help="default: the workload's, else 32")
    ap.add_argument("--lr", type=float, default=None, help="default: the workload's, else 0.05")
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--target", type=float, default=None,
                    help="target accuracy, or loss for a language model (default: the workload's)")
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's summary figures here")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ddlb-convergence-"))
    where = "one host" if args.cluster == "local" else f"netns, {args.workers} nodes at {args.bandwidth}"
    batch = args.batch_size or WORKLOADS[args.workload].get("batch_size", 32)
    print(f"{args.workload}, {args.workers} workers x {batch}, {args.steps} steps, "
          f"{args.seeds} seeds, {where}; runs in {out}", flush=True)
    results = run(args, out)
    report(results, args.steps, args.workload)
    if args.json:
        keys = (*judged_by(args.workload)[:3], "target_reached", "throughput_samples_per_s", "train_time_s")
        args.json.write_text(json.dumps({n: [{k: r[k] for k in keys} | {"diverged": bool(r.get("diverged"))}
                                             for r in rs] for n, rs in results.items()},
                                        indent=2))


if __name__ == "__main__":
    main()
