"""The whole nightly grid on a netns cluster, run by hand (issue 51): `python
benchmarks/bench_nightly_netns.py [--nodes 2 3]`, as root.

`specs/nightly-cpu.yaml` through `ddlbench run`, reduced in steps, repeats, microbenchmark and
profile as tests/test_pipeline_netns.py reduces it, on one cluster of each size that provision
makes and teardown removes: every workload x algorithm x worker count, and each workload's
1-worker baseline (33 jobs in today's spec). Checks what the CI test checks of its cut (every
key FINISHED in MLflow, every summary completed on its nodes, the namespaces removed), counts
the grid from the spec's own lists, and prints the wall time and the pipeline's share spent
training. Too slow for CI on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ holds the run and its checks; run as a script from anywhere

from pipelines.spec import load_spec  # noqa: E402
from pipelines.spec.load import parse_set  # noqa: E402
from tests.test_pipeline_netns import NIGHTLY_CPU, _run_nightly, _sets  # noqa: E402


def one(nodes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        run_dir, _, keys = _run_nightly(Path(tmp), nodes, [])
        wall = time.monotonic() - t0
        spec = load_spec(NIGHTLY_CPU, parse_set(_sets(nodes, [])))
        per_repeat = len(spec.workloads) * len(spec.batch_sizes) * (len(spec.algorithms) * len(spec.workers) + 1)
        assert 1 not in spec.workers and len(keys) == len(set(keys)) == spec.repeats * per_repeat, keys
        training = sum(json.loads((run_dir / "train" / k / "summary.json").read_text())["train_time_s"] for k in keys)
        print(f"{nodes} nodes: {len(keys)} jobs FINISHED in {wall:.0f} s; training {training:.0f} s of it "
              f"(ratio {training / wall:.2f}); load average {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 3])
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_nightly_netns: network namespaces need root")
    for nodes in args.nodes:
        one(nodes)


if __name__ == "__main__":
    main()
