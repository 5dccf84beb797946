"""A pipeline run's wall time against its training time (issue 51), run by hand:
`python benchmarks/bench_pipeline.py specs/demo.yaml [--repeats 2] [--set steps=100]`.

Runs `ddlbench run SPEC` as a user does, each repeat in a fresh home, and prints from the run's
MLflow records:
- the ratio of training time (the training runs' `train_time_s`, their steps alone, summed) to
  the pipeline's wall time, goal >= 0.7;
- each stage's seconds (its MLflow run's start to end; the training stage's jobs summed), and
  the training jobs' seconds outside their steps (start-up, evaluation, teardown);
median over repeats with the range. A fresh home's MLflow store is a copy of this machine's
template (pipelines/tracking/store.py): the first repeat on a new machine makes it, and says so.
Run one benchmark at a time; a figure from a loaded host says so (the 1-minute load average).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.7


def one_run(spec: Path, sets: list[str], home: Path) -> dict[str, float]:
    from mlflow import MlflowClient

    from pipelines.tracking import store

    template_made = not list(store.cache_dir().glob("mlflow-*-empty.db"))
    args = [sys.executable, "-m", "pipelines.cli", "run", str(spec), "--home", str(home)]
    for s in sets:
        args += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"})
    wall = time.monotonic() - t0
    if proc.returncode:
        sys.exit(f"ddlbench run failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id], max_results=5000)]
    parts: dict[str, float] = defaultdict(float)
    training = 0.0
    for r in runs:
        step = r.data.tags.get("ddlbench.step")
        if step is None or r.info.end_time is None:
            continue
        seconds = (r.info.end_time - r.info.start_time) / 1000
        parts[step] += seconds
        if step == "train":
            training += r.data.metrics.get("train_time_s", 0.0)
            parts["train, outside the steps"] += seconds - r.data.metrics.get("train_time_s", 0.0)
    return {"wall": wall, "training": training, "ratio": training / wall, "template_made": float(template_made),
            **{f"stage {k}": v for k, v in parts.items()}}


def _fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a spec override, as ddlbench run")
    a = parser.parse_args()
    results = []
    for i in range(a.repeats):
        with tempfile.TemporaryDirectory(prefix="ddlbench-bench-pipeline-") as tmp:
            results.append(one_run(a.spec.resolve(), a.sets, Path(tmp) / "home"))
        made = " (this repeat made the machine's MLflow store template)" if results[-1]["template_made"] else ""
        print(f"repeat {i}: wall {results[-1]['wall']:.1f} s, training {results[-1]['training']:.1f} s, "
              f"ratio {results[-1]['ratio']:.2f}{made}", flush=True)
    print(f"\n{a.spec.name} {' '.join(a.sets)}: {a.repeats} repeats, median [range]; "
          f"1-minute load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"  pipeline wall (s)       {_fmt([r['wall'] for r in results])}")
    print(f"  training, its steps (s) {_fmt([r['training'] for r in results])}")
    ratios = [r["ratio"] for r in results]
    print(f"  training / wall         {statistics.median(ratios):8.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
          f"  (goal >= {GOAL}: {statistics.median(ratios) / GOAL:.2f} of it)")
    for key in sorted({k for r in results for k in r if k.startswith("stage ")}):
        print(f"  {key[6:]:<24}{_fmt([r.get(key, 0.0) for r in results])}")


if __name__ == "__main__":
    main()
