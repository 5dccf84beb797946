"""The in-situ per-layer timing's overhead on the training iteration (issue 33).

The same job (default: lenet5 on digits, SSGD-allreduce, 2 workers, batch 32) trained with
sampling off, at the default k (every 10th iteration) and at k = 1 (every iteration: the cost of
one sampled iteration), the variants interleaved in each repeat so a slow spell of the host falls
on all alike. Prints each variant's mean iteration (what throughput pays: a sampled iteration is
one in k, which a median would not see) and its p50, as ratios against the run without sampling,
with the repeats' spread.

First, in this process, the same iteration (forward, backward, optimizer step; 1 thread)
alternately sampled and not, 1500 pairs: the thread's CPU time of each, which preemption by
other work on the host does not inflate, so the cost of sampling stands out on a loaded host.

    python benchmarks/bench_layer_timing.py [OUT_DIR] [--steps 200] [--repeats 3] [--model lenet5] [--pairs 1500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from training.measure.layer_timing import DEFAULT_EVERY, EVERY_ENV

VARIANTS = {"off": 0, f"k={DEFAULT_EVERY}": DEFAULT_EVERY, "k=1": 1}


def one_process_step(model: str, dataset: str):
    """A model, its optimizer and one batch, on one thread: what the in-process overhead
    benchmarks time an iteration of (this one and bench_memory.py)."""
    import torch

    from training.models import build_model, natural_input_shape

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = natural_input_shape(model, (1, 28, 28) if dataset == "digits" else (3, 32, 32))
    net = build_model(model, shape, 10)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return net, opt, torch.randn(32, *shape), torch.randint(0, 10, (32,))


def in_process(model: str, dataset: str, pairs: int) -> None:
    """Paired thread CPU time of one iteration with and without sampling (k = 1)."""
    import torch
    import torch.nn.functional as F

    from training.measure.layer_timing import LayerTimer
    from training.models import logits_of

    net, opt, x, y = one_process_step(model, dataset)
    timer = LayerTimer(net, torch.device("cpu"), every=1, warmup=0)

    def iteration(sample: bool, t: int) -> float:
        t0 = time.thread_time()
        if sample:
            timer.arm(t)
        loss = F.cross_entropy(logits_of(net(x)), y)
        loss.item()
        if sample:
            timer.backward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sample:
            timer.collect()
        return time.thread_time() - t0

    for t in range(20):
        iteration(t % 2 == 0, t)
    off, on = [], []
    for t in range(pairs):
        off.append(iteration(False, t))
        on.append(iteration(True, t))
    diff = statistics.median(a - b for a, b in zip(on, off, strict=True))
    base = statistics.median(off)
    print(f"in process, CPU time: iteration {base * 1e3:.3f} ms, a sampled one {diff * 1e6:.0f} us more "
          f"({diff / base:.2%}); at k={DEFAULT_EVERY}: {diff / base / DEFAULT_EVERY:.2%} of the iteration's compute",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", type=Path, default=Path("/tmp/ddlbench-layer-timing"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--pairs", type=int, default=1500)
    args = ap.parse_args()
    in_process(args.model, args.dataset, args.pairs)
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
