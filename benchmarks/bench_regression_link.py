"""The component alarm's rates on a slower link (issue 47; docs/regression.md, "Components: their
rates"), run by hand, or through `bench_regression.py --where link`:

    python benchmarks/bench_regression_link.py --save rec.json   # record, then replay
    python benchmarks/bench_regression_link.py --from rec.json   # replay a recording

1. Records, on an emulated 2-node cluster (netns, `tc tbf` on each node's link), the benchmark
   spec's config (benchmarks/regression-components.yaml) round by round: at the base rate
   `--mbit`, `--unslowed` training runs and one microbenchmark; at each slower rate, one of each
   on the same cluster, as a nightly's pipeline run measures its link and trains on it. A slower
   rate is sized to slow the iteration by `size`: before the rounds, runs at the base rate and at
   half of it measure the share of the iteration that the link's byte time holds (`share`: the
   iteration's change when the byte time doubles), and the byte time grows by size / share.
   Each microbenchmark is the pipeline's: `microbench.pooled` rounds of `microbench.repeats`
   after the profiled iteration's compute gap. The workload's layer profile (the model's input)
   is taken once, on this host.
2. Replays nights as the nightly makes them: a history of `--history` unslowed runs, each its
   repeats' training and one microbenchmark drawn from the recording's base rate, and tonight's
   of the slowed (or unslowed) kind; the nightly's alarm (the end-to-end test or a flagged
   component) confirmed where a rerun (the training again, the same microbenchmark: the pipeline
   reruns no microbenchmark) alarms too; whether the link's primitive is named first; and
   today's end-to-end test alone on the same draws. Attribution is the model's (modelling.predict
   on the profile and the recorded fits). Rates carry 95% Wilson intervals.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_regression import LOCK, _load, _rate  # a sibling: benchmarks run as scripts
from bench_regression_components import SPEC, UNSLOWED, kind, nights, realised

from infra.hostload import CpuProbe
from infra.netns import NetnsProvider
from modelling.measure.microbench import run_microbench
from modelling.measure.profiler import profile_layers
from modelling.network.fit import fit_comm
from pipelines.report import regression_comm
from pipelines.report.attribution import model_predictor
from pipelines.report.regression_stats import repeat_figures, run_level
from pipelines.spec import RegressionSpec, grid, load_spec

SIZES = (0.05, 0.10, 0.20)
MESSAGES = [4096, 65536, 262144, 1048576]  # the microbenchmark's sizes: latency to the link's byte rate
WHERE = "link"


def record(rounds: int, mbit: float, save: Path, sizes: list[float], unslowed: int) -> dict[str, Any]:
    """`rounds` rounds at the base rate and each slower one, under the cluster lock; saved after
    every round."""
    from infra.local import LocalProvider
    from pipelines.launch import launch, prepare

    spec = load_spec(SPEC)
    [entry] = [e for e in grid(spec) if e["repeat"] == 0]
    [wl] = spec.workloads
    rec: dict[str, Any] = {
        "spec": SPEC.name, "hardware": f"netns 2 nodes, {mbit:g} Mbit/s", "link": True,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": 0, "tenants": 0,
        "classes": [WHERE], "sizes": sizes, "mbit": mbit, "cores": os.cpu_count(), "other_load": [], "records": {},
    }
    config = entry["key"].removesuffix("-r0")
    runs = rec["records"].setdefault(config, {})
    t0 = time.time()
    mb = spec.microbench
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory() as d:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one user of the machine's benchmarks at a time
        n = 0
        rec["profile"] = profile_layers(wl.model, spec.batch_sizes[0], dataset=wl.dataset,
                                        model_options=wl.model_options, processes=2, provider=LocalProvider())
        gap = min(statistics.median(rec["profile"]["iteration_samples_s"]), 10.0)  # as the stage's gap

        def night(rate: float, trainings: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
            """Training runs and one microbenchmark on one cluster at `rate` Mbit/s."""
            nonlocal n
            out, figures = Path(d) / f"n{n}", []
            n += 1
            with NetnsProvider(nodes=2, bandwidth=f"{round(rate * 1000)}kbit") as p:
                # As the pipeline's microbench stage measures: its pooled rounds, repeats and gap.
                comms = [run_microbench(2, 0, out / f"mb{i}", provider=p, sizes=MESSAGES, repeats=mb.repeats,
                                        link_bytes_per_s=mbit * 1e6 / 8, gap_s=gap) for i in range(mb.pooled)]
                comm = {**comms[0], "pooled_rounds": len(comms), "measurements": [m for c in comms
                                                                                  for m in c["measurements"]]}
                for i in range(trainings):
                    s = launch(prepare(dict(entry["config"]), "bench"), out / f"t{i}", p,
                               timeout_s=spec.train_timeout_s, echo=False)
                    figure = repeat_figures(out / f"t{i}")
                    if figure is None or not figure.get("parts"):
                        raise SystemExit(f"{out}: the run timed no in-situ parts; the spec must sample layers")
                    rec.setdefault("summary", s)
                    figures.append(figure | {"iter_s": s["global_batch_size"] / s["throughput_samples_per_s"]})
            model = fit_comm(comm)
            rec.setdefault("comm_model", model)  # the model's network; each night's fit is swapped in
            return figures, regression_comm.record(model, rec["summary"]) or {}

        base, _ = night(mbit, 2)
        half, _ = night(mbit / 2, 2)
        iteration = statistics.median(f["iter_s"] for f in base)
        rec["share"] = share = statistics.median(f["iter_s"] for f in half) / iteration - 1
        print(f"    the link's byte time holds {share:.0%} of the iteration at {mbit:g} Mbit/s", flush=True)
        if share <= 0:
            raise SystemExit("the link holds none of the iteration at this rate: choose a slower --mbit")
        for r in range(rounds):
            probe = CpuProbe()
            figures, comm = night(mbit, unslowed)
            runs.setdefault(UNSLOWED, []).extend(f | {"comm": comm} for f in figures)
            for size in random.Random(r).sample(sizes, len(sizes)):  # interleaved, the order drawn per round
                [figure], comm = night(mbit / (1 + size / share), 1)
                round_iter = statistics.median(f["iter_s"] for f in figures)
                runs.setdefault(kind(WHERE, size), []).append(figure | {"comm": comm, "round_iter_s": round_iter})
            rec["other_load"].append(round(probe.other_share() or 0.0, 3))
            rec["rounds"] = r + 1
            save.write_text(json.dumps(rec, indent=2))
            print(f"    round {r + 1}/{rounds} recorded ({time.time() - t0:.0f} s)", flush=True)
    return rec


def replay(rec: dict[str, Any], runs: dict[str, list[dict[str, Any]]], which: str, spec: RegressionSpec,
           history: int, repeats: int, trials: int, seed: int) -> dict[str, int]:
    """Counts over `trials` nights of tonight's kind `which` against unslowed histories (each draw
    its repeats' training and one microbenchmark; the rerun trains again on tonight's)."""
    rng = np.random.default_rng(seed)
    base, pool = runs[UNSLOWED], runs[which]
    [prim] = base[0]["comm"]
    predict = model_predictor(rec["profile"], rec["comm_model"], rec["summary"])

    def draw(src: list[dict[str, Any]], comm: dict[str, Any] | None = None) -> dict[str, Any]:
        picked = [src[i] for i in rng.integers(len(src), size=repeats)]
        return run_level(picked) | {"comm": comm or src[rng.integers(len(src))]["comm"]}

    return nights(lambda: draw(base), lambda: draw(pool), lambda now: draw(pool, now["comm"]), predict, spec,
                  history, trials, lambda first: regression_comm.primitive_of(first) == prim)


def noise(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The base rate's plain SDs of log throughput and of the link's figures."""
    thr = [r["log_thr"] for r in runs[UNSLOWED]]
    rounds = {json.dumps(r["comm"], sort_keys=True): r["comm"] for r in runs[UNSLOWED]}  # one microbenchmark a round
    figs = [regression_comm.figures(c) for c in rounds.values()]
    out = [f"sd of log throughput {statistics.stdev(thr):.3f}"]
    if len(figs) > 1:
        out += [f"of log {c} {statistics.stdev(f[c] for f in figs):.3f}" for c in figs[0]]
    return ", ".join(out)


def report(rec: dict[str, Any], spec: RegressionSpec, history: int, repeats: int, trials: int) -> None:
    print(f"recorded on {rec['hardware']} ({rec['recorded_at']}, {rec['rounds']} rounds, {_load(rec)}; the "
          f"link's byte time {rec['share']:.0%} of the iteration, slowed to slow it by "
          f"{', '.join(f'{s:.0%}' for s in rec['sizes'])})")
    print(f"alarm: alpha {spec.alpha}, min_effect {spec.min_effect:.0%}, confirm_alpha {spec.confirm_alpha}; "
          f"history {history} runs x {repeats} repeat(s), {trials} nights per case; rates with 95% Wilson "
          "intervals; 'nightly' is the end-to-end test or a flagged component, confirmed by a rerun;\n"
          "'end-to-end' today's test alone, confirmed, on the same draws")
    for config, runs in rec["records"].items():
        print(f"  {config} ({len(runs[UNSLOWED])} unslowed runs; {noise(runs)}):")
        a = replay(rec, runs, UNSLOWED, spec, history, repeats, trials, 7919)
        print(f"    {'false alarms (<= 1%)':26s} nightly {_rate(a['confirmed'], trials)}; "
              f"end-to-end {_rate(a['e2e_confirmed'], trials)}; components flagged before the rerun "
              f"{_rate(a['components'], trials)}")
        for j, which in enumerate(k for k in runs if k != UNSLOWED):
            c = replay(rec, runs, which, spec, history, repeats, trials, 7919 + j + 1)
            first = f"{c['named_first'] / c['confirmed']:.0%} of {c['confirmed']}" if c["confirmed"] else "-"
            print(f"    {which:12s} realised {realised(runs, which):+6.1%}: caught {_rate(c['confirmed'], trials)}; "
                  f"named first {first}; end-to-end {_rate(c['e2e_confirmed'], trials)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="replay a recording saved by an earlier run")
    ap.add_argument("--save", type=Path, default=Path("bench_regression_link.json"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--mbit", type=float, default=200.0, help="the base link rate, Mbit/s")
    ap.add_argument("--sizes", type=float, nargs="+", default=list(SIZES), help="slowdowns, fractions of the iteration")
    ap.add_argument("--unslowed", type=int, default=2, help="unslowed training runs per round")
    ap.add_argument("--trials", type=int, default=1000, help="replayed nights per case")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per run (nightly 3)")
    ap.add_argument("--history", type=int, default=RegressionSpec().history, help="history runs")
    args = ap.parse_args(argv)
    if any(not 0 < s < 1 for s in args.sizes):
        ap.error("--sizes: fractions between 0 and 1")
    if not 1 <= args.mbit <= 10_000:
        ap.error("--mbit: a rate between 1 and 10000 Mbit/s")
    if args.source:
        rec = json.loads(args.source.read_text())
    else:
        rec = record(args.rounds, args.mbit, args.save, args.sizes, args.unslowed)
        print(f"recording saved to {args.save}")
    report(rec, RegressionSpec(), args.history, args.repeats, args.trials)


if __name__ == "__main__":
    main()
