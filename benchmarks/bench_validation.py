"""The validation grid: the checked-in specs of specs/validation/ through `ddlbench run`, the
product's own path (issue 33), and their figures from each run's report.json and validation.json.

Per configuration: predicted (with its p10-p90) and measured iteration, the end-to-end error
(the DAG fed with the profile), the model's error (fed with the run's own in-situ layer
compute) and the repeats' spread (max/min - 1 of the measured iteration: the noise floor);
then per spec the median and worst of both errors. The one-host specs by default; the netns
ones (root needed) with --netns or by name.

    python benchmarks/bench_validation.py [SPEC ...] [--netns] [--home DIR] [--runs 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipelines.report.validation import ms, ms_interval, pct

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs" / "validation"
TARGET, NETNS_TARGET = 0.10, 0.05  # median |error| on one host, on shaped links (worst 10%)


def show(spec: Path, run_dir: Path, wall_s: float) -> None:
    report = json.loads((run_dir / "report" / "report.json").read_text())["validation"]
    val = json.loads((run_dir / "validate" / "validation.json").read_text())
    print(f"{'configuration':<40} {'n':>2} {'predicted ms':>13} {'p10-p90':>13} {'measured ms':>12} "
          f"{'error':>8} {'model':>8} {'spread':>7}")
    for c in val["configs"]:
        lo, hi = c.get("predicted_p10_s"), c.get("predicted_p90_s")
        band = ms_interval(lo, hi)
        where = "" if c["placement"] == "one host" else f" ({c['placement']})"
        print(f"{c['model'] + '-' + c['algorithm'] + '-' + c['comm'] + where:<40} {c['repeats']:>2} "
              f"{ms(c['predicted_iter_s']):>13} {band:>13} {ms(c['measured_iter_s']):>12} "
              f"{pct(c['error']):>8} {pct(c.get('model_error')):>8} {pct(c['repeat_spread']):>7}")
    target = NETNS_TARGET if spec.name.startswith("netns") else TARGET
    med, worst = report["median_abs_error"], report["worst_abs_error"]
    mmed, mworst = report["median_abs_model_error"], report["worst_abs_model_error"]
    if med is not None:
        print(f"end to end: median |error| {med:.1%} (ratio to the {target:.0%} target: {med / target:.2f}), "
              f"worst {worst:.1%} (ratio to 10%: {worst / TARGET:.2f})")
    if val.get("configs_without_prediction"):
        print(f"no prediction for {val['configs_without_prediction']} configuration(s): see no_prediction")
    if mmed is not None:
        print(f"model (in-situ compute): median |error| {mmed:.1%} (ratio to 5%: {mmed / 0.05:.2f}), "
              f"worst {mworst:.1%}")
    print(f"repeat spread: median {report['median_repeat_spread']:.1%}, worst {report['worst_repeat_spread']:.1%}; "
          f"over {len(val['configs'])} configurations")
    # The pipeline's cost around training: its whole wall time shared over the training jobs,
    # against a job's own training time (summary.json train_time_s).
    trained = [json.loads(p.read_text()).get("train_time_s") or 0.0 for p in run_dir.glob("train/*/summary.json")]
    if trained:
        per_job, own = wall_s / len(trained), sum(trained) / len(trained)
        print(f"wall time per training job {per_job:.1f} s against its training time {own:.1f} s "
              f"(ratio {per_job / own:.2f}; {len(trained)} jobs, {wall_s:.0f} s in all)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="*", type=Path, help="default: specs/validation/onehost-*.yaml")
    ap.add_argument("--netns", action="store_true", help="also the netns specs (root needed)")
    ap.add_argument("--home", type=Path, default=Path("/tmp/ddlbench-validation"))
    ap.add_argument("--runs", type=int, default=1, help="consecutive runs of each spec")
    ap.add_argument("--set", action="append", default=[], help="spec override passed to `ddlbench run`")
    args = ap.parse_args()
    specs = args.specs or sorted(SPECS.glob("onehost-*.yaml"))
    specs += sorted(SPECS.glob("netns-*.yaml")) if args.netns and not args.specs else []
    ddlbench = Path(sys.executable).parent / "ddlbench"
    print(f"load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    for spec in specs:
        for i in range(args.runs):
            key = f"{spec.stem}-{int(time.time())}-{i}"
            t0 = time.monotonic()
            sets = [a for s in args.set for a in ("--set", s)]
            proc = subprocess.run([str(ddlbench), "run", str(spec), "--home", str(args.home), "--run-key", key, *sets],
                                  capture_output=True, text=True)
            print(f"\n== {spec.name} run {i + 1}/{args.runs}: {key}, {time.monotonic() - t0:.0f} s, "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
            if proc.returncode != 0:
                print(proc.stdout[-3000:] + proc.stderr[-3000:])
                continue
            show(spec, args.home / "runs" / key, time.monotonic() - t0)


if __name__ == "__main__":
    main()
