"""`specs/nightly-cpu.yaml` on a netns cluster through `ddlbench run`, reduced in steps, repeats,
microbenchmark and profile, on one cluster that provision made and teardown removed.

One model (mlp on digits, communication-bound), two algorithms (SSGD over allreduce, OD-SGD
over a parameter server), 2 workers on 2 nodes, every stage of the pipeline. The whole grid on 2
and 3 nodes is a benchmark run by hand (benchmarks/bench_nightly_netns.py): too slow for CI on a
2-core machine.

Needs root for the namespaces: outside CI it skips without, under CI=true it fails
(tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_root

REPO = Path(__file__).resolve().parent.parent
NIGHTLY_CPU = REPO / "specs" / "nightly-cpu.yaml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    needs_root,
]

REDUCED = [
    "steps=12", "repeats=1", "train.measure_warmup=2", "train.eval_every=0", "microbench.sizes=[4096,65536,1048576]",
    "microbench.repeats=1", "profile.warmup=1", "profile.repeats=2", "tracking.system_metrics=false",
]
# The CI cut of the grid: the communication-bound model, the allreduce and the PS family.
CI_CUT = [
    "workloads=[{model: mlp, dataset: digits}]",
    "algorithms=[{name: ssgd, comm: allreduce, options: {overlap: true, bucket_mb: 25}}, {name: odsgd}]",
    "workers=[2]",
]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _sets(nodes: int, extra: list[str]) -> list[str]:
    """The `--set`s of a reduced nightly run on a netns cluster of `nodes`."""
    return [f"provider.options={{nodes: {nodes}, bandwidth: 1gbit}}", "provider.name=netns",
            "network.link_bandwidth=1gbit", *REDUCED, *extra]


def _run_nightly(home: Path, nodes: int, extra: list[str]) -> tuple[Path, dict[str, Any], list[str]]:
    """`ddlbench run` of the nightly spec on a netns cluster of `nodes`: the run's directory, its
    cluster handle and the grid's keys; asserts it exited 0, made `nodes` nodes, removed them and
    trained every key of the grid to FINISHED."""
    from mlflow import MlflowClient

    from pipelines.spec import grid, load_spec

    sets = _sets(nodes, extra)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ddlbench")), "run", str(NIGHTLY_CPU), "--home", str(home),
         "--run-key", "nightly-netns", *(a for s in sets for a in ("--set", s))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3500,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run_dir = home / "runs" / "nightly-netns"
    handle = json.loads((run_dir / "cluster.json").read_text())["handle"]
    assert len(handle["nodes"]) == nodes
    assert not {n for n in _namespaces() if handle["tag"] in n}  # torn down

    from pipelines.spec.load import parse_set

    keys = [e["key"] for e in grid(load_spec(NIGHTLY_CPU, parse_set(sets)))]
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-nightly")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trained = {r.data.tags["ddlbench.config_key"]: r.info.status for r in runs if "ddlbench.config_key" in r.data.tags}
    assert trained == dict.fromkeys(keys, "FINISHED")
    assert {r.info.status for r in runs} == {"FINISHED"}
    for key in keys:
        summary = json.loads((run_dir / "train" / key / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["placement"]["nodes"] == nodes, key
    return run_dir, handle, keys


@pytest.mark.timeout(600)
def test_nightly_cut_runs_two_algorithms_across_two_netns_nodes(tmp_path: Path) -> None:
    run_dir, _, keys = _run_nightly(tmp_path, 2, CI_CUT)
    assert sorted(keys) == ["mlp-odsgd-ps-w2-b32-r0", "mlp-ssgd-allreduce-w2-b32-r0"]
    for key in keys:
        summary = json.loads((run_dir / "train" / key / "summary.json").read_text())
        assert summary["steps"] == 12, key
        # one worker a node: every step's gradients cross the shaped link
        assert summary["placement"]["workers_per_node"] == [1, 1], key
        assert summary["iter_time_s"]["p50"] > 0, key
