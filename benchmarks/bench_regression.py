"""Regression-alarm benchmark, run by hand (docs/regression.md):

    python benchmarks/bench_regression.py --save rec.json      # record (takes the cluster lock), then replay
    python benchmarks/bench_regression.py --from rec.json      # replay a recording

1. Records real training runs of every config of a spec (the trainer launch the pipeline uses),
   round-robin, each round one unslowed run and one each slowed by `train.inject_delay_ms` to 10%
   and 20% less throughput (the delay is that fraction of the round's unslowed iteration time, so
   the slowdowns are real, interleaved with unslowed runs under the same load). By default
   (`--inject busy`) each rank spends the delay as CPU work, as a slower kernel does; a sleep
   (`--inject sleep`) frees the core to the other ranks on shared cores and realises less. Each
   run keeps its run-level figures (pipelines/report/regression_stats.py: log throughput, within-run
   variance from its steps, the canary's log speed). Saved after every round.
2. Replays nights: a history of `--history` runs (unslowed) and tonight's run, each of `--repeats`
   runs drawn from the recording (with replacement), tonight's from the unslowed (A/A), 10% or 20%
   runs; with confirmation, an alarm stands only if a rerun (another draw of the same kind) alarms
   too. Prints the false-alarm rate per config and night (target <= 2%) and the detection rates
   (targets >= 80% at 10%, >= 95% at 20%) with 95% Wilson intervals, for the alarm (with and
   without confirmation: relative to the canary where the canary moved, raw elsewhere), its raw
   and relative tests alone, and the old rule (the median against
   the last run's median, 10% threshold, every repeat below), all on the same draws.

Resampling draws runs independently, so slow drifts of the machine's load (an evening of slow runs)
are not in the replay; the spread is that of one recording session. The recording keeps, per round,
the share of the machine's CPU that other work used, and the header says whether it was quiet.
A recording from before the canary (`throughput` lists only) replays with multiplied slowdowns.

With `--where CLASS ...` (data, compute, layer, update) it records and replays slowdowns per
component class instead, through the component alarm: benchmarks/bench_regression_components.py.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

from infra.hostload import QUIET, CpuProbe
from pipelines.report.regression import check_rerun, check_runs
from pipelines.report.regression_stats import from_throughputs, repeat_figures, run_level
from pipelines.spec import RegressionSpec, grid, load_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
LOCK = Path("/tmp/ddlbench-cluster.lock")
KINDS = {"aa": 0.0, "slow10": 0.10, "slow20": 0.20}


TENANT = """
import random, sys, time
rng = random.Random(int(sys.argv[1]))
while True:  # on, then off, for 0.2-3 s each: the host's speed changes within and between runs
    end = time.monotonic() + rng.uniform(0.2, 3.0)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(0.2, 3.0))
"""


def tenants(count: int) -> list[subprocess.Popen]:
    """`count` processes of other work, each in a session of its own as another user's job is,
    busy about half the time in spells of random length."""
    return [subprocess.Popen([sys.executable, "-c", TENANT, str(i)], start_new_session=True) for i in range(count)]


def record(rounds: int, spec_path: Path, save: Path, steps: int | None, inject: str = "busy",
           load: int = 0) -> dict[str, Any]:
    """`rounds` rounds of real runs of every config of the spec (repeat 0), each an unslowed run
    and runs slowed by 10% and 20%, the delay spent as `inject` ("busy": CPU work of each rank,
    as a slower kernel is; "sleep"); with `load` tenants of other work running throughout; under
    the cluster lock; saved after every round."""
    spec = load_spec(spec_path)
    entries = [e for e in grid(spec) if e["repeat"] == 0]
    rec: dict[str, Any] = {
        "spec": spec_path.name,
        "hardware": spec.hardware,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rounds": 0,
        "inject": inject,
        "tenants": load,
        "cores": os.cpu_count(),
        "other_load": [],  # per round: CPU time of other work / (cores x wall time)
        "records": {e["key"].removesuffix("-r0"): {k: [] for k in KINDS} for e in entries},
    }
    t0 = time.time()
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory() as d:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one user of the machine's benchmarks at a time
        others = tenants(load)
        try:
            _rounds(rec, entries, spec, rounds, steps, inject, save, Path(d), t0)
        finally:
            for p in others:
                p.kill()
                p.wait()
    return rec


def _rounds(rec: dict[str, Any], entries: list[dict[str, Any]], spec: Any, rounds: int, steps: int | None,
            inject: str, save: Path, d: Path, t0: float) -> None:
    from infra.local import LocalProvider
    from pipelines.launch import launch, prepare

    for r in range(rounds):
        probe = CpuProbe()
        for e in entries:
            config = e["key"].removesuffix("-r0")
            iteration = None
            for kind, slow in KINDS.items():
                values = dict(e["config"], **({"steps": steps} if steps else {}))
                if slow:  # iteration x s / (1 - s) of sleep: s less throughput
                    values["inject_delay_ms"] = round(1000 * iteration * slow / (1 - slow), 2)
                    values["inject_busy"] = inject == "busy"
                out = Path(d) / f"{config}-{r}-{kind}"
                s = launch(prepare(values, "bench"), out, LocalProvider(), timeout_s=spec.train_timeout_s,
                           echo=False)
                if not slow:
                    iteration = s["global_batch_size"] / s["throughput_samples_per_s"]
                rec["records"][config][kind].append(
                    {**repeat_figures(out), "delay_ms": values.get("inject_delay_ms", 0.0)}
                )
        rec["other_load"].append(round(probe.other_share() or 0.0, 3))
        rec["rounds"] = r + 1
        save.write_text(json.dumps(rec, indent=2))
        print(f"    round {r + 1}/{rounds} recorded ({time.time() - t0:.0f} s)", flush=True)


def legacy(rec: dict[str, Any]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """A recording of throughputs only: runs known by their throughput, slowdowns multiplied in."""
    out = {}
    for config, values in rec["throughput"].items():
        out[config] = {
            kind: [{**from_throughputs([v * (1 - slow)]), "repeats": 1} for v in values] for kind, slow in KINDS.items()
        }
    return out


def old_rule(now: list[float], history: list[list[float]], drop: float = 0.10) -> bool:
    """The alarm of before the statistical test: the median against the last run's median, a fixed
    threshold, and every repeat below that median."""
    base = statistics.median(history[0])
    return 1 - statistics.median(now) / base > drop and all(x < base for x in now)


def replay(records: dict[str, list[dict[str, Any]]], kind: str, spec: RegressionSpec, runs: int, repeats: int,
           trials: int, seed: int) -> dict[str, int]:
    """Alarms over `trials` nights: the alarm without and with confirmation, its raw and relative
    tests alone, the old rule, the nights the canary moved; history from the unslowed runs, tonight
    (and its rerun) from `kind`."""
    rng = np.random.default_rng(seed)
    base, now_pool = records["aa"], records[kind]

    def draw(pool: list[dict[str, Any]]) -> tuple[dict[str, Any], list[float]]:
        picks = [pool[i] for i in rng.integers(len(pool), size=repeats)]
        return run_level(picks), [math.exp(p["log_thr"]) for p in picks]

    counts = dict.fromkeys(("alarm", "confirmed", "raw", "relative", "moved", "old"), 0)
    for _ in range(trials):
        hist = [draw(base) for _ in range(runs)]
        now, now_thr = draw(now_pool)
        res = check_runs(now, [h for h, _ in hist], spec, power=False)
        counts["alarm"] += res["regressed"]
        counts["raw"] += res["raw"]["regressed"]
        counts["relative"] += bool(res["normalised"] and res["normalised"]["regressed"])
        counts["moved"] += res["basis"] == "canary"
        counts["old"] += old_rule(now_thr, [t for _, t in hist])
        if res["regressed"]:
            counts["confirmed"] += check_rerun(draw(now_pool)[0], [h for h, _ in hist], spec, power=False)["regressed"]
    return counts


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
    if sys.argv[1:3] == ["--where", "link"]:  # a slower link: the link component's benchmark
        from bench_regression_link import main as link

        return link(sys.argv[3:])
    if "--where" in sys.argv:  # slowdowns per component class: the component alarm's benchmark
        from bench_regression_components import main as components

        return components(sys.argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="replay a recording saved by an earlier run")
    ap.add_argument("--save", type=Path, default=Path("bench_regression_recording.json"))
    ap.add_argument("--rounds", type=int, default=12, help="recorded rounds (each: unslowed, 10%%, 20%% per config)")
    ap.add_argument("--spec", type=Path, default=SMOKE)
    ap.add_argument("--steps", type=int, help="training steps per recorded run (the spec's if not given)")
    ap.add_argument("--inject", choices=["busy", "sleep"], default="busy",
                    help="the injected delay as CPU work of each rank (a slower kernel) or as a sleep")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="other work while recording: N processes, each busy about half the time in random spells")
    ap.add_argument("--trials", type=int, default=2000, help="replayed nights per config and case")
    ap.add_argument("--repeats", type=int, nargs="+", default=[3], help="repeats per run (nightly 3)")
    ap.add_argument("--history", type=int, nargs="+", default=[RegressionSpec().history], help="history runs")
    ap.add_argument("--alpha", type=float, default=RegressionSpec().alpha)
    ap.add_argument("--min-effect", type=float, default=RegressionSpec().min_effect)
    ap.add_argument("--confirm-alpha", type=float, default=RegressionSpec().confirm_alpha,
                    help="significance at which a rerun confirms an alarm")
    ap.add_argument("--host-alpha", type=float, default=RegressionSpec().host_alpha,
                    help="significance of the test that the canary moved (the relative test decides where it did)")
    args = ap.parse_args()
    if args.source:
        rec = json.loads(args.source.read_text())
    else:
        rec = record(args.rounds, args.spec, args.save, args.steps, args.inject, args.load)
        print(f"recording saved to {args.save}")
    records = rec.get("records") or legacy(rec)
    older = [r for kinds in records.values() for runs in kinds.values() for r in runs if "canary_gemm_log" not in r]
    for r in older:  # recorded before the GEMM-only canary: its canary is both kernels' (speed_log)
        r["canary_gemm_log"] = r.get("canary_log")
    spec = RegressionSpec(alpha=args.alpha, min_effect=args.min_effect, host_alpha=args.host_alpha,
                          confirm_alpha=args.confirm_alpha)
    print(f"recorded on {rec['hardware']} ({rec['recorded_at']}, {rec['rounds']} rounds, {_load(rec)}; "
          f"delays injected as {rec.get('inject', 'sleep')}"
          + ("; canary: both kernels, recorded before the GEMM-only canary" if older else "") + "):")
    for config, kinds in records.items():
        thr = [math.exp(r["log_thr"]) for r in kinds["aa"]]
        med = statistics.median(thr)
        norm = [r["log_thr"] - r["canary_gemm_log"] for r in kinds["aa"] if r.get("canary_gemm_log") is not None]
        print(f"    {config}: {med:.0f} samples/s, spread {min(thr) / med - 1:+.0%} / {max(thr) / med - 1:+.0%}; "
              f"sd of log throughput {statistics.stdev(math.log(t) for t in thr):.3f}"
              + (f", relative to the canary {statistics.stdev(norm):.3f}" if len(norm) > 1 else ""))
        for kind in ("slow10", "slow20"):
            got = statistics.median(r["log_thr"] for r in kinds[kind]) - statistics.median(math.log(t) for t in thr)
            print(f"      {kind}: median throughput {math.expm1(got):+.1%} against the unslowed runs")
    print(f"alarm: alpha {spec.alpha}, min_effect {spec.min_effect:.0%}, host_alpha {spec.host_alpha}, "
          f"confirm_alpha {spec.confirm_alpha}; "
          "rates with 95% Wilson intervals over "
          f"{args.trials} nights per config and case")
    goals = {"aa": "false alarms (<= 2%)", "slow10": "caught at 10% (>= 80%)", "slow20": "caught at 20% (>= 95%)"}
    for repeats in args.repeats:
        for runs in args.history:
            print(f"  history {runs} runs x {repeats} repeat(s):")
            for kind, goal in goals.items():
                total = dict.fromkeys(("alarm", "confirmed", "raw", "relative", "moved", "old"), 0)
                for i, kinds in enumerate(records.values()):
                    got = replay(kinds, kind, spec, runs, repeats, args.trials, seed=1000 * i + 10 * runs + repeats)
                    total = {k: total[k] + got[k] for k in total}
                n = args.trials * len(records)
                print(f"    {goal:24s} alarm {_rate(total['alarm'], n)}; confirmed {_rate(total['confirmed'], n)}; "
                      f"raw test {_rate(total['raw'], n)}; relative test {_rate(total['relative'], n)}; "
                      f"old rule {_rate(total['old'], n)}; canary moved {total['moved'] / n:.1%}")


if __name__ == "__main__":
    main()
