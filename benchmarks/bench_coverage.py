"""Interval coverage (issue 49): every validation spec of specs/validation/, the demo and the
ms-scale lenet5 case through `ddlbench run`, in turn, on one pipeline home, so each run's
intervals calibrate on the validations before it (the product's path: the hardware's history
in MLflow). Per run and overall: the share of configurations whose measured iteration lies in
its 80% interval, inside and outside the validated domain, and the intervals' median width
against the end-to-end error's median. "before" replays the intervals of stop 57's code on the
same rows (one pooled history; outside the old domain, ms-scale with more ranks than cores,
the half-widths doubled).

    python benchmarks/bench_coverage.py [--runs 1] [--only NAME ...] [--home DIR]
    python benchmarks/bench_coverage.py --replay benchmarks/bench_coverage_recording.json

Each finished run is appended to the recording (--save), which the tests read as a recorded
validation history (tests/test_modelling_trust.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from modelling.calibration import LEVEL, conformal_quantile, group, log_ratio

REPO = Path(__file__).resolve().parent.parent
CASES = [*sorted((REPO / "specs" / "validation").glob("*.yaml")), REPO / "specs" / "demo.yaml",
         REPO / "tests" / "fixtures" / "grids" / "netns2-lenet5.yaml"]
RECORDING = REPO / "benchmarks" / "bench_coverage_recording.json"
KEEP = ("model", "algorithm", "comm", "workers", "servers", "placement", "repeats", "predicted_iter_s",
        "measured_iter_s", "predicted_p10_s", "predicted_p90_s", "interval_low_s", "interval_high_s",
        "interval_kind", "calibration_runs", "domain", "error", "model_error", "model_error_samples",
        "repeat_spread")


def run_case(spec: Path, home: Path, i: int) -> dict[str, Any] | None:
    ddlbench = Path(sys.executable).parent / "ddlbench"
    key = f"{spec.stem}-{int(time.time())}-{i}"
    t0 = time.monotonic()
    proc = subprocess.run([str(ddlbench), "run", str(spec), "--home", str(home), "--run-key", key],
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    print(f"== {spec.name} run {i + 1}: {wall:.0f} s, load average {os.getloadavg()[0]:.2f}", flush=True)
    path = home / "runs" / key / "validate" / "validation.json"
    if proc.returncode != 0 or not path.exists():
        print(proc.stdout[-2000:] + proc.stderr[-2000:])
        return None
    val = json.loads(path.read_text())
    return {"case": spec.stem, "run": key, "wall_s": wall, "cpu_count": os.cpu_count(),
            "calibration_history": val.get("calibration_history"),
            "configs": [{k: c.get(k) for k in KEEP} for c in val["configs"]]}


def old_interval(c: dict[str, Any], history: list[float], cores: int) -> tuple[float, float]:
    """Stop 57's interval: the pooled history's conformal quantile (else +-10%), widened to hold
    p10-p90, its half-widths doubled in log where the old domain rule put the row outside."""
    p, q = c["predicted_iter_s"], conformal_quantile(history)
    half = math.log1p(0.10) if q is None else q
    lo = min(p * math.exp(-half), c.get("predicted_p10_s") or p)
    hi = max(p * math.exp(half), c.get("predicted_p90_s") or p)
    if (c["workers"] + (c.get("servers") or 0)) > cores and p < 0.05:
        lo, hi = p * (lo / p) ** 2, p * (hi / p) ** 2
    return lo, hi


def figures(rows: list[tuple[dict[str, Any], float, float]]) -> str:
    """'covered k of n (share), median width w, median |error| e, width / 2e' of (config, lo, hi)."""
    rows = [(c, lo, hi) for c, lo, hi in rows if c["predicted_iter_s"] and lo is not None]
    if not rows:
        return "no predicted configuration"
    inside = sum(lo <= c["measured_iter_s"] <= hi for c, lo, hi in rows)
    width = statistics.median((hi - lo) / c["predicted_iter_s"] for c, lo, hi in rows)
    err = statistics.median(abs(c["error"]) for c, _, _ in rows)
    return (f"covered {inside} of {len(rows)} ({inside / len(rows):.0%}), median width {width:.1%}, "
            f"median |error| {err:.1%}, width / (2 x error) {width / (2 * err) if err else float('nan'):.2f}")


def report(recording: list[dict[str, Any]]) -> None:
    history: list[float] = []
    before, after = [], []
    for r in recording:
        old = [(c, *old_interval(c, history, r["cpu_count"])) for c in r["configs"] if c["predicted_iter_s"]]
        new = [(c, c["interval_low_s"], c["interval_high_s"]) for c in r["configs"]]
        print(f"{r['case']:<22} {r['run'][-12:]:>12} ({len(history)} earlier scores)")
        print(f"    before: {figures(old)}")
        print(f"    after:  {figures(new)}")
        for c, lo, hi in new:
            if c["predicted_iter_s"]:
                mark = "in " if lo <= c["measured_iter_s"] <= hi else "OUT"
                name = f"{c['model']}-{c['algorithm']}-{c['comm']}"
                print(f"      {mark} {name:<24} predicted {c['predicted_iter_s'] * 1e3:8.2f}"
                      f" [{lo * 1e3:.2f}-{hi * 1e3:.2f}] {c['interval_kind']:<10} measured "
                      f"{c['measured_iter_s'] * 1e3:8.2f} ({c['error']:+.1%}, spread {c['repeat_spread']:.1%})"
                      f" {'' if c['domain'] == 'validated' else c['domain']}")
        before += old
        after += new
        scores = (log_ratio(c["predicted_iter_s"], c["measured_iter_s"]) for c in r["configs"])
        history += [s for s in scores if s is not None]
    print(f"\nall {len(recording)} runs, the {LEVEL:.0%} intervals:")
    print(f"  before: {figures(before)}")
    print(f"  after:  {figures(after)}")
    for g in ("validated", "outside"):
        print(f"  after, {g}: {figures([x for x in after if group(x[0]['domain']) == g])}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1, help="consecutive runs of each case")
    ap.add_argument("--only", nargs="*", default=None, help="case names (spec stems) to run")
    ap.add_argument("--home", type=Path, default=Path("/tmp/ddlbench-coverage"))
    ap.add_argument("--save", type=Path, default=RECORDING)
    ap.add_argument("--replay", type=Path, default=None, help="report a recording without running")
    args = ap.parse_args()
    if args.replay:
        report(json.loads(args.replay.read_text()))
        return
    print(f"load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    recording = json.loads(args.save.read_text()) if args.save.exists() else []
    for i in range(args.runs):
        for spec in CASES:
            if args.only and spec.stem not in args.only:
                continue
            if (r := run_case(spec, args.home, i)) is not None:
                recording.append(r)
                args.save.write_text(json.dumps(recording, indent=1) + "\n")
    report(recording)


if __name__ == "__main__":
    main()
