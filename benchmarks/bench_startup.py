"""A job's start-up (issue 51), run by hand: `python benchmarks/bench_startup.py [--repeats 5]`.

Runs one-step jobs as a user does (`ddlbench train`, 2 workers, lenet5 on digits) on the local
provider and, as root, on a 2-node netns cluster, and prints where their seconds go, each part
as the median over repeats with its range:
- the command's wall time, and the launch to the first step (`startup.to_training_s`) against
  the goal of 3 s on the local provider;
- the parts (summary.json `startup.parts_s`): `launch` (the provider, the agent's interpreter
  and its imports, until a rank's module starts), `imports`, `process_group`, `set_up` (model,
  data, optimizer), `canary`; and `teardown_s` (from the outputs written to the job's end).
`--source DIR` runs another checkout's code (an older commit's worktree) for a before/after of
the command's wall time; a checkout without start-up figures prints the wall time alone.
`--warm` runs the same jobs one after another in one process, on one cluster, inside
`infra.warm.agents()`, as a pipeline run does: the first job starts each node's warm server, the
later ones fork their agents from it; it prints the later jobs (wall time: the job's launch call).
Run one benchmark at a time; a figure from a loaded host says so (the 1-minute load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--algorithm", "ssgd", "--workers", "2", "--model", "lenet5", "--dataset", "digits",
       "--batch-size", "32", "--steps", "1"]
NETNS = ["--provider", "netns", "--nodes", "2", "--bandwidth", "1gbit"]


def one_job(source: Path, out: Path, extra: list[str]) -> dict:
    env = os.environ | {"PYTHONPATH": str(source)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", *JOB, *extra, "--out", str(out)],
                          cwd=source, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode:
        raise SystemExit(f"job failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    startup = json.loads((out / "summary.json").read_text()).get("startup")
    return {"wall_s": wall, "startup": startup}


# The jobs of one pipeline run: one cluster (a run's provision, adopted by its stages) and one
# warm-agents block in one process; each job as `ddlbench train` launches it.
WARM_JOBS = """
import json, sys, time
from pathlib import Path
from infra import warm
from pipelines.launch import launch, prepare
from pipelines.spec.sections import ProviderSpec
out, repeats, provider = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
cfg = prepare({"algorithm": "ssgd", "workers": 2, "model": "lenet5", "dataset": "digits", "batch_size": 32,
               "steps": 1}, "bench")
walls = []
with ProviderSpec(**provider).build(threads=cfg.threads) as cluster, warm.agents():
    for r in range(repeats):
        t0 = time.monotonic()
        launch(cfg, out / f"r{r}", cluster, echo=False)
        walls.append(time.monotonic() - t0)
print(json.dumps(walls))
"""
PROVIDERS = {"local": {"name": "local"}, "netns": {"name": "netns", "options": {"nodes": 2, "bandwidth": "1gbit"}}}


def warm_jobs(source: Path, out: Path, provider: dict, repeats: int) -> list[dict]:
    """`repeats` jobs after the warm server's first, one process: their wall times and start-ups."""
    env = os.environ | {"PYTHONPATH": str(source)}
    proc = subprocess.run([sys.executable, "-c", WARM_JOBS, str(out), str(repeats + 1), json.dumps(provider)],
                          cwd=source, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"warm jobs failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    walls = json.loads(proc.stdout.strip().splitlines()[-1])
    return [{"wall_s": w, "startup": json.loads((out / f"r{r}" / "summary.json").read_text()).get("startup")}
            for r, w in enumerate(walls)][1:]


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s [{min(xs):.2f}-{max(xs):.2f}]"


def report(label: str, runs: list[dict]) -> None:
    print(f"{label}: {len(runs)} repeats, median [range]")
    print(f"  command wall time       {spread([r['wall_s'] for r in runs])}")
    timed = [r["startup"] for r in runs if r["startup"]]
    if not timed:
        print("  (this checkout records no start-up parts)")
        return
    print(f"  ranks started by        {', '.join(sorted({s.get('launcher', 'torchrun') for s in timed}))}")
    to_training = [s["to_training_s"] for s in timed]
    print(f"  launch to first step    {spread(to_training)}  (goal <= 3 s on the local provider: "
          f"ratio {statistics.median(to_training) / 3.0:.2f})")
    for part in timed[0]["parts_s"]:
        print(f"    {part:<21} {spread([s['parts_s'][part] for s in timed])}")
    print(f"  teardown                {spread([s['teardown_s'] for s in timed])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--source", type=Path, default=ROOT, help="the checkout whose code runs the jobs")
    ap.add_argument("--no-netns", action="store_true", help="the local provider only")
    ap.add_argument("--warm", action="store_true", help="jobs after the first in one warm-agents block")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; source {args.source}")
    cases = [("local, 2 workers", [])]
    if not args.no_netns and os.geteuid() == 0:
        cases.append(("netns, 2 nodes x 1 worker", NETNS))
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in cases:
            one_job(args.source, Path(tmp) / "warm", extra)  # the page cache warm, as a nightly's is
            if args.warm:
                provider = PROVIDERS["netns" if extra else "local"]
                report(f"{label}, warm agents", warm_jobs(args.source, Path(tmp) / label[:5], provider, args.repeats))
                continue
            runs = [one_job(args.source, Path(tmp) / f"{label[:5]}{r}", extra) for r in range(args.repeats)]
            report(label, runs)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
