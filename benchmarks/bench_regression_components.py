"""The component alarm's rates on real injected slowdowns (issue 47; docs/regression.md,
"Components: their rates"), run by hand, or through `bench_regression.py --where ...`:

    python benchmarks/bench_regression_components.py --save rec.json   # record, then replay
    python benchmarks/bench_regression_components.py --from rec.json   # replay a recording

1. Records real training runs of every config of a spec (the trainer launch the pipeline uses),
   round by round: `--unslowed` unslowed runs, then one run per component class and size, each
   slowed through `train.inject_where` by `size` of the round's unslowed iteration (`data`: the
   data phase; `compute`: every layer in proportion to its time; `layer`: one layer, chosen at
   random per config and kept for the recording, so a night's repeats slow the same one;
   `update`: the optimizer step; all CPU work of the rank). Each run keeps its run-level figures
   and its in-situ parts (regression_stats.repeat_figures), and the realised slowdown is printed,
   so what a size claims is checked against what the runs did.
2. Replays nights as the nightly makes them: a history of `--history` unslowed runs and tonight's
   run of `--repeats` repeats, each drawn from the recording (with replacement); the nightly's
   alarm (the end-to-end test or a flagged component), confirmed where a rerun (another draw of
   the same kind) alarms too; whether the slowed component is the first one named; and today's
   end-to-end test alone on the same draws. Rates carry 95% Wilson intervals.

The replay's attribution adds up the parts' seconds and the rest of the unslowed iteration
(`adding_up`) where the nightly re-predicts with the model: the recording keeps no profile or
comm model. Resampling draws runs independently, so the host's slow drifts
within a night are not in the replay; the spread is that of one recording session.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_regression import LOCK, REPO, _load, _rate, tenants  # a sibling: benchmarks run as scripts

from infra.hostload import CpuProbe
from pipelines.report.regression import check_rerun, check_runs
from pipelines.report.regression_components import CPU, check_components, run_parts
from pipelines.report.regression_stats import repeat_figures, run_level
from pipelines.spec import RegressionSpec, grid, load_spec

SPEC = REPO / "benchmarks" / "regression-components.yaml"
CLASSES = ("data", "compute", "layer", "update")
SIZES = (0.05, 0.10, 0.20)
UNSLOWED = "aa"


def kind(where: str, size: float) -> str:
    return f"{where}@{size:g}"


def record(rounds: int, spec_path: Path, save: Path, classes: list[str], sizes: list[float], unslowed: int,
           load: int, seed: int) -> dict[str, Any]:
    """`rounds` rounds of real runs of every config of the spec (repeat 0), under the cluster lock,
    with `load` tenants of other work throughout; saved after every round."""
    spec = load_spec(spec_path)
    entries = [e for e in grid(spec) if e["repeat"] == 0]
    rec: dict[str, Any] = {
        "spec": spec_path.name, "hardware": spec.hardware, "components": True,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rounds": 0, "tenants": load,
        "classes": classes, "sizes": sizes, "cores": os.cpu_count(), "other_load": [],
        "layers": {}, "records": {},
    }
    rng = random.Random(seed)
    t0 = time.time()
    with open(LOCK, "a") as lock, tempfile.TemporaryDirectory() as d:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one user of the machine's benchmarks at a time
        others = tenants(load)
        try:
            for r in range(rounds):
                probe = CpuProbe()
                for e in entries:
                    _round(rec, e, spec, r, classes, sizes, unslowed, rng, Path(d))
                rec["other_load"].append(round(probe.other_share() or 0.0, 3))
                rec["rounds"] = r + 1
                save.write_text(json.dumps(rec, indent=2))
                print(f"    round {r + 1}/{rounds} recorded ({time.time() - t0:.0f} s)", flush=True)
        finally:
            for p in others:
                p.kill()
                p.wait()
    return rec


def _round(rec: dict[str, Any], entry: dict[str, Any], spec: Any, r: int, classes: list[str], sizes: list[float],
           unslowed: int, rng: random.Random, d: Path) -> None:
    from infra.local import LocalProvider
    from pipelines.launch import launch, prepare

    config = entry["key"].removesuffix("-r0")
    runs = rec["records"].setdefault(config, {})

    def run(name: str, **inject: Any) -> dict[str, Any]:
        out = d / f"{config}-{r}-{name}"
        s = launch(prepare(dict(entry["config"], **inject), "bench"), out, LocalProvider(),
                   timeout_s=spec.train_timeout_s, echo=False)
        figure = repeat_figures(out)
        if figure is None or not figure.get("parts"):
            raise SystemExit(f"{out}: the run timed no in-situ parts; the spec's train options must sample layers")
        return {**figure, "iter_s": s["global_batch_size"] / s["throughput_samples_per_s"], **inject}

    base = [run(f"{UNSLOWED}{i}") for i in range(unslowed)]
    runs.setdefault(UNSLOWED, []).extend(base)
    iteration = statistics.median(b["iter_s"] for b in base)
    if config not in rec["layers"]:  # one layer a recording: a night's repeats slow the same one
        names = sorted({k.split(" ", 1)[1] for k in base[0]["parts"] if k.startswith("forward ")})
        rec["layers"][config] = rng.choice(names)
    for where in classes:
        target = f"layer:{rec['layers'][config]}" if where == "layer" else where
        for size in sizes:
            runs.setdefault(kind(where, size), []).append(
                run(kind(where, size), inject_delay_ms=round(1000 * iteration * size, 3), inject_where=target,
                    inject_busy=True) | {"round_iter_s": iteration})


def adding_up(unslowed: list[dict[str, Any]]) -> Callable[[dict[str, float]], float]:
    """The iteration from its parts: their sum and the rest of the iteration the unslowed runs
    measured beside them (the exposed communication, the step's glue), the median over the runs.
    It stands in for the model's re-prediction, which the recording has no profile for."""
    rest = statistics.median(r["iter_s"] - sum(v for k, v in r["parts"].items() if not k.startswith(CPU)
                                               and k != "samples") for r in unslowed)
    return lambda parts: sum(parts.values()) + max(rest, 0.0)


def expected_first(where: str, layer: str) -> tuple[str, ...]:
    """The components whose naming first is right for a slowdown of `where`."""
    if where == "layer":
        return (f"forward {layer} share", f"backward {layer} share")
    return (where,)


def nights(draw_base: Callable[[], dict[str, Any]], draw_now: Callable[[], dict[str, Any]],
           draw_rerun: Callable[[dict[str, Any]], dict[str, Any]], predict: Callable[..., float] | None,
           spec: RegressionSpec, history: int, trials: int, named: Callable[[str], bool]) -> dict[str, int]:
    """Counts over `trials` nights, each a history of `history` draws of `draw_base` against
    tonight's `draw_now`: the nightly's alarm (end to end or a flagged component) confirmed by a
    rerun (`draw_rerun(tonight)`), whether the first component named is the right one (`named`),
    and today's end-to-end test alone, confirmed, on the same draws."""
    keys = ("confirmed", "e2e_confirmed", "components", "named_first")
    counts = dict.fromkeys(keys, 0)
    for _ in range(trials):
        hist = [draw_base() for _ in range(history)]
        now = draw_now()
        e2e = check_runs(now, hist, spec, power=False)["regressed"]
        parts = check_components(now, hist, spec.alpha, spec.min_effect, predict, spec.host_alpha)
        flagged = bool(parts and parts["flagged"])
        counts["components"] += flagged
        if not (e2e or flagged):
            continue
        rerun = draw_rerun(now)
        loose = max(spec.alpha, spec.confirm_alpha)
        e2e_again = check_rerun(rerun, hist, spec, power=False)["regressed"]
        again = check_components(rerun, hist, loose, spec.min_effect, predict, spec.host_alpha)
        if e2e_again or (again and again["flagged"]):
            counts["confirmed"] += 1
            counts["named_first"] += flagged and named(parts["flagged"][0])
        counts["e2e_confirmed"] += e2e and e2e_again
    return counts


def replay(runs: dict[str, list[dict[str, Any]]], which: str, spec: RegressionSpec, history: int, repeats: int,
           trials: int, seed: int, layer: str) -> dict[str, int]:
    """Counts over `trials` nights of tonight's kind `which` against unslowed histories."""
    rng = np.random.default_rng(seed)
    base, pool = runs[UNSLOWED], runs[which]
    where = which.split("@")[0]

    def draw(src: list[dict[str, Any]]) -> dict[str, Any]:
        return run_level([src[i] for i in rng.integers(len(src), size=repeats)])

    return nights(lambda: draw(base), lambda: draw(pool), lambda _now: draw(pool), adding_up(base), spec, history,
                  trials, lambda first: first in expected_first(where, layer))


def realised(runs: dict[str, list[dict[str, Any]]], which: str) -> float:
    """The kind's median iteration against its rounds' unslowed iteration, less one."""
    return statistics.median(r["iter_s"] / r["round_iter_s"] for r in runs[which]) - 1


def noise(runs: dict[str, list[dict[str, Any]]]) -> str:
    """The unslowed runs' plain SDs: of log throughput, and of the parts the alarm tests (the
    compute in CPU seconds where the runs have them), the figures a reader sets a size against."""
    thr = [r["log_thr"] for r in runs[UNSLOWED]]
    parts = [run_parts([r["parts"]]) for r in runs[UNSLOWED]]
    out = [f"sd of log throughput {statistics.stdev(thr):.3f}"]
    work = [p.get("cpu_seconds") or p["seconds"] for p in parts]
    compute = [sum(v for k, v in w.items() if k.startswith(("forward ", "backward "))) for w in work]
    out.append(f"of log compute {statistics.stdev(math.log(c) for c in compute):.3f}")
    for name in ("update", "data"):
        if all(p["seconds"].get(name, 0) > 0 for p in parts):
            out.append(f"of log {name} {statistics.stdev(math.log(p['seconds'][name]) for p in parts):.3f}")
    return ", ".join(out)


def report(rec: dict[str, Any], spec: RegressionSpec, history: int, repeats: int, trials: int) -> None:
    print(f"recorded on {rec['hardware']} ({rec['recorded_at']}, {rec['rounds']} rounds, {_load(rec)}; "
          f"slowdowns as CPU work of the rank, sized to {', '.join(f'{s:.0%}' for s in rec['sizes'])} of the "
          f"round's iteration)")
    print(f"alarm: alpha {spec.alpha}, min_effect {spec.min_effect:.0%}, confirm_alpha {spec.confirm_alpha}; "
          f"history {history} runs x {repeats} repeat(s), {trials} nights per config and case; rates with 95% "
          "Wilson intervals; 'nightly' is the end-to-end test or a flagged component, confirmed by a rerun;\n"
          "'end-to-end' today's test alone, confirmed, on the same draws")
    for i, (config, runs) in enumerate(rec["records"].items()):
        layer = rec["layers"][config]
        print(f"  {config} ({len(runs[UNSLOWED])} unslowed runs; {noise(runs)}; slowed layer {layer}):")
        a = replay(runs, UNSLOWED, spec, history, repeats, trials, 7919 * i, layer)
        print(f"    {'false alarms (<= 1%)':26s} nightly {_rate(a['confirmed'], trials)}; "
              f"end-to-end {_rate(a['e2e_confirmed'], trials)}; components flagged before the rerun "
              f"{_rate(a['components'], trials)}")
        for j, which in enumerate(k for k in runs if k != UNSLOWED):
            c = replay(runs, which, spec, history, repeats, trials, 7919 * i + j + 1, layer)
            first = f"{c['named_first'] / c['confirmed']:.0%} of {c['confirmed']}" if c["confirmed"] else "-"
            print(f"    {which:12s} realised {realised(runs, which):+6.1%}: caught {_rate(c['confirmed'], trials)}; "
                  f"named first {first}; end-to-end {_rate(c['e2e_confirmed'], trials)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="source", type=Path, help="replay a recording saved by an earlier run")
    ap.add_argument("--save", type=Path, default=Path("bench_regression_components.json"))
    ap.add_argument("--spec", type=Path, default=SPEC)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--where", nargs="+", choices=CLASSES, default=list(CLASSES), help="component classes slowed")
    ap.add_argument("--sizes", type=float, nargs="+", default=list(SIZES), help="slowdowns, fractions of the iteration")
    ap.add_argument("--unslowed", type=int, default=2, help="unslowed runs per round and config")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="other work while recording: N processes, each busy about half the time in random spells")
    ap.add_argument("--seed", type=int, default=47, help="the choice of the slowed layer")
    ap.add_argument("--trials", type=int, default=1000, help="replayed nights per config and case")
    ap.add_argument("--repeats", type=int, default=3, help="repeats per run (nightly 3)")
    ap.add_argument("--history", type=int, default=RegressionSpec().history, help="history runs")
    args = ap.parse_args(argv)
    if any(not 0 < s < 1 for s in args.sizes):
        ap.error("--sizes: fractions between 0 and 1")
    if args.source:
        rec = json.loads(args.source.read_text())
    else:
        rec = record(args.rounds, args.spec, args.save, args.where, args.sizes, args.unslowed, args.load, args.seed)
        print(f"recording saved to {args.save}")
    report(rec, RegressionSpec(), args.history, args.repeats, args.trials)


if __name__ == "__main__":
    main()
