"""The memory meter's cost on the training iteration (issue 50), measured as
bench_layer_timing.py measures its sampling in process.

The same iteration (forward, backward, optimizer step; 1 thread) alternately sampled by the
memory meter (training/measure/memory.py: saved-tensor hooks in the forward, the held state counted after
the backward) and not, interleaved in pairs: the thread's CPU time of each, which preemption by
other work on the host does not inflate. Prints the sampled iteration's extra cost, its share at
the layer timer's default k (every k-th iteration sampled), and the spread over repeats.

    python benchmarks/bench_memory.py [--model lenet5] [--pairs 1500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ as a package, from anywhere


def paired_cost(model: str, dataset: str, pairs: int) -> tuple[float, float]:
    """(median CPU seconds of an iteration, median extra seconds of a sampled one)."""
    import torch
    import torch.nn.functional as F

    from benchmarks.bench_layer_timing import one_process_step
    from training.measure.memory import HeldState, MemoryMeter, optimizer_tensors
    from training.models import logits_of

    net, opt, x, y = one_process_step(model, dataset)
    params = list(net.parameters())

    def held() -> HeldState:
        return HeldState(parameters=params, gradients=[p.grad for p in params],
                         optimizer=optimizer_tensors(opt), buffers=list(net.buffers()))

    meter = MemoryMeter(torch.device("cpu"), held, every=1, warmup=0)
    never = MemoryMeter(torch.device("cpu"), held, every=0, warmup=0)

    def iteration(m: MemoryMeter, t: int) -> float:
        t0 = time.thread_time()
        with m.forward(t, 10**9):
            loss = F.cross_entropy(logits_of(net(x)), y)
        loss.item()
        loss.backward()
        m.collect()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.thread_time() - t0

    for t in range(20):
        iteration(meter if t % 2 else never, t)
    off, on = [], []
    for t in range(pairs):
        off.append(iteration(never, t))
        on.append(iteration(meter, t))
    return statistics.median(off), statistics.median(a - b for a, b in zip(on, off, strict=True))


def main() -> None:
    from training.measure.layer_timing import DEFAULT_EVERY

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    shares = []
    for r in range(args.repeats):
        base, extra = paired_cost(args.model, args.dataset, args.pairs)
        shares.append(extra / base / DEFAULT_EVERY)
        print(f"r{r}: iteration {base * 1e3:.3f} ms CPU, a sampled one {extra * 1e6:.0f} us more "
              f"({extra / base:.2%}); at k={DEFAULT_EVERY}: {shares[-1]:.3%} of the iteration", flush=True)
    print(f"{args.model}: memory sampling at k={DEFAULT_EVERY} costs {statistics.median(shares):.3%} of the "
          f"iteration [{min(shares):.3%}, {max(shares):.3%}] over {args.repeats} repeats")


if __name__ == "__main__":
    main()
