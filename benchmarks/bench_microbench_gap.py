"""Does a timed operation cost the same after a short gap of computation as after the model's
whole iteration (issue 51)? Run by hand:
`python benchmarks/bench_microbench_gap.py [--full 0.08] [--short 0.02] [--rounds 4]`.

Runs microbenchmark rounds (2 workers, 1 shard, on this host) alternately at the full gap (the
anchor: the demo's iteration, 80 ms) and at the short one, interleaved so a slow spell of the
host falls on both, and prints per primitive and size the median over rounds of each round's
median at the short gap against the full one, with the full gap's own round-to-round range
(the noise floor: a ratio inside it is no difference). ASGD's passes are left out: their
gap sets how often the workers meet at the shard, not how warm anything is.
Run one benchmark at a time; a figure from a loaded host says so (the 1-minute load average).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.local import LocalProvider  # noqa: E402
from infra.warm import agents  # noqa: E402
from modelling.measure.microbench import run_microbench  # noqa: E402

SIZES = [4096, 65536, 1048576, 4194304]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", type=float, default=0.08, help="the anchor gap, s (the demo's iteration)")
    ap.add_argument("--short", type=float, default=0.02, help="the gap compared with it, s")
    ap.add_argument("--rounds", type=int, default=4, help="rounds at each gap, interleaved")
    ap.add_argument("--repeats", type=int, default=15, help="timed operations per primitive and size (the demo's)")
    args = ap.parse_args()
    medians: dict[float, dict[tuple[str, int], list[float]]] = {g: defaultdict(list) for g in (args.full, args.short)}
    with LocalProvider() as p, agents(), tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for gap in (args.full, args.short):
                comm = run_microbench(2, 1, Path(tmp) / f"g{gap}-r{i}", provider=p, sizes=SIZES,
                                      repeats=args.repeats, timeout_s=600, gap_s=gap)
                for m in comm["measurements"]:
                    if m["primitive"] != "asgd":
                        medians[gap][(m["primitive"], m["bytes"])].append(m["median_s"])
            print(f"round {i + 1} of {args.rounds} done", file=sys.stderr)
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds at each gap, {args.repeats} repeats; 1-minute load average now {load:.2f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'primitive':10s} {'bytes':>9s} {'full (ms)':>10s} {'full range':>17s} {'short/full':>10s} "
          f"{'short range':>17s}  inside the full gap's range")
    inside = 0
    for key in sorted(medians[args.full]):
        full, short = medians[args.full][key], medians[args.short][key]
        f, s = statistics.median(full), statistics.median(short)
        lo, hi = min(full) / f, max(full) / f
        ok = lo <= s / f <= hi
        inside += ok
        print(f"{key[0]:10s} {key[1]:9d} {f * 1e3:10.3f} {f'[{lo:.2f}-{hi:.2f}]':>17s} {s / f:10.2f} "
              f"{f'[{min(short) / f:.2f}-{max(short) / f:.2f}]':>17s}  {'yes' if ok else 'no'}")
    print(f"{inside} of {len(medians[args.full])} short-gap medians inside the full gap's round-to-round range")


if __name__ == "__main__":
    main()
