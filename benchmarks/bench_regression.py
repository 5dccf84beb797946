"""Regression-alarm benchmark (issue 11), run by hand: `python benchmarks/bench_regression.py`.

1. Records real throughput distributions of this machine: `--rounds` short training runs of
   every config of the smoke spec (the same trainer launch the pipeline uses), round-robin so
   every config sees the same load; saved to `--save` (JSON). `--from FILE` replays a saved one.
2. Replays histories drawn from those recordings (with replacement: each history run and the
   "now" run draw `--repeats` repeats) through the alarm of `pipelines.report_regression`:
   A/A (no change) and with the "now" run slowed by 10% and 20%, for the default history length.
   Prints the false-alarm rate (goal <= 5%) and the detection rates (goal >= 95% at 20%) with
   their 95% Wilson intervals, and, as the anchor, the same rates of the old rule (the median
   against the last run's median with a fixed 10% threshold and every repeat below).

Resampling draws runs independently, so slow drifts of the machine's load (runs of one evening
that are all slow) are not in the replay; the recorded spread is that of one recording session.
The recording keeps, per round, the share of the machine's CPU time that other work used (all busy
CPU time from /proc/stat less this recording's own processes), and the header says whether the
machine was quiet: a spread recorded under load (other suites on the 2 cores) is not a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from infra.hostload import QUIET, CpuProbe
from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from pipelines.report_regression import check_throughput
from pipelines.spec import RegressionSpec, grid, load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"


def record(rounds: int, spec_path: Path, save: Path) -> dict[str, Any]:
    """`rounds` real runs of every config of the spec (repeat 0 of each), round-robin; saved to
    `save` after every round, so an interrupted recording keeps what it measured."""
    spec = load_spec(spec_path)
    entries = [e for e in grid(spec) if e["repeat"] == 0]
    rec: dict[str, Any] = {
        "spec": spec_path.name,
        "hardware": spec.hardware,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": 0,
        "cores": os.cpu_count(),
        "other_load": [],  # per round: CPU time of other work / (cores x wall time)
        "throughput": {e["key"].removesuffix("-r0"): [] for e in entries},
    }
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            probe = CpuProbe()
            for e in entries:
                cfg = prepare(e["config"], "bench")
                out = Path(d) / f"{e['key']}-{r}"
                s = launch(cfg, out, LocalProvider(), timeout_s=spec.train_timeout_s, echo=False)
                rec["throughput"][e["key"].removesuffix("-r0")].append(s["throughput_samples_per_s"])
            rec["other_load"].append(round(probe.other_share() or 0.0, 3))
            rec["rounds"] = r + 1
            save.write_text(json.dumps(rec, indent=2))
            print(f"    round {r + 1}/{rounds} recorded ({time.time() - t0:.0f} s)", flush=True)
    return rec


def old_rule(now: list[float], history: list[list[float]], drop: float = 0.10) -> bool:
    """The alarm this replaces: the median against the last run's median, a fixed threshold, and
    every repeat below that median."""
    base = statistics.median(history[0])
    return 1 - statistics.median(now) / base > drop and all(x < base for x in now)


def replay(
    values: list[float], spec: RegressionSpec, runs: int, repeats: int, slowdown: float, trials: int, seed: int
) -> tuple[int, int]:
    """Alarms of the new test and of the old rule over `trials` histories of `runs` runs drawn
    from `values` (with replacement), the "now" run slowed by `slowdown`."""
    rng = np.random.default_rng(seed)
    new = old = 0
    for _ in range(trials):
        draw = rng.choice(values, size=(runs + 1, repeats))
        history = [list(row) for row in draw[1:]]
        now = list(draw[0] * (1 - slowdown))
        new += check_throughput(now, history, spec)["regressed"]
        old += old_rule(now, history)
    return new, old



def _load(rec: dict[str, Any]) -> str:
    """The machine's load during the recording, as the header says it: quiet or loaded."""
    loads = rec.get("other_load")
    if not loads:
        return "load of other work not recorded"
    state = "a quiet machine" if max(loads) < QUIET else "a loaded machine (other work on its cores)"
    return (f"other work used {statistics.median(loads):.0%} [{min(loads):.0%}, {max(loads):.0%}] of "
            f"{rec.get('cores')} cores per round: {state}")


def _rate(k: int, n: int) -> str:
    ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
    return f"{k / n:6.1%} [{ci.low:.1%}, {ci.high:.1%}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="replay a recording saved by an earlier run")
    ap.add_argument("--save", type=Path, default=Path("bench_regression_recording.json"))
    ap.add_argument("--rounds", type=int, default=20, help="recorded runs per config")
    ap.add_argument("--spec", type=Path, default=SMOKE)
    ap.add_argument("--trials", type=int, default=2000, help="replayed histories per config and case")
    ap.add_argument("--repeats", type=int, nargs="+", default=[1, 3], help="repeats per run (smoke 1, nightly 3)")
    ap.add_argument("--alpha", type=float, default=RegressionSpec().alpha)
    ap.add_argument("--min-effect", type=float, default=RegressionSpec().min_effect)
    args = ap.parse_args()
    if args.source:
        rec = json.loads(args.source.read_text())
    else:
        rec = record(args.rounds, args.spec, args.save)
        print(f"recording saved to {args.save}")
    spec = RegressionSpec(alpha=args.alpha, min_effect=args.min_effect)
    print(f"recorded on {rec['hardware']} ({rec['recorded_at']}, {rec['rounds']} runs per config, {_load(rec)}):")
    for config, vals in rec["throughput"].items():
        med = statistics.median(vals)
        print(
            f"    {config}: {med:.0f} samples/s [{min(vals):.0f}, {max(vals):.0f}], "
            f"spread {min(vals) / med - 1:+.0%} / {max(vals) / med - 1:+.0%}"
        )
    print(
        f"alarm: alpha {spec.alpha}, min_effect {spec.min_effect:.0%}; rates with 95% Wilson intervals, "
        f"{args.trials} histories per config and case; anchor: the old rule (median vs last run's median, "
        "10% threshold, every repeat below)"
    )
    for repeats in args.repeats:
        for runs in sorted({spec.min_history, spec.history}):
            print(f"  history {runs} runs x {repeats} repeat(s):")
            for slowdown, goal in (
                (0.0, "false alarms, goal <= 5%"),
                (0.10, "detection at 10%, stated"),
                (0.20, "detection at 20%, goal >= 95%"),
            ):
                new = old = 0
                per_config = []
                for i, vals in enumerate(rec["throughput"].values()):
                    n, o = replay(vals, spec, runs, repeats, slowdown, args.trials, seed=1000 * i + runs)
                    new, old = new + n, old + o
                    per_config.append(n / args.trials)
                total = args.trials * len(per_config)
                print(
                    f"    {goal:31s}: {_rate(new, total)}  per config median {statistics.median(per_config):.1%} "
                    f"[{min(per_config):.1%}, {max(per_config):.1%}];  old rule {_rate(old, total)}"
                )


if __name__ == "__main__":
    main()
