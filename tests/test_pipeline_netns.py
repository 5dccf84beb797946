"""`specs/nightly-cpu.yaml` on a netns cluster of 2 and of 3 nodes through `ddlbench run`: every
configuration of the grid (5 algorithms x 2 models x 2 and 4 workers, and the 1-worker baselines)
to FINISHED, on one cluster that provision made and teardown removed, reduced in steps, repeats,
microbenchmark and profile.

Too slow for CI on a 2-core machine (22 jobs each: 30 min for 2 nodes here, loaded), so it runs
when DDLBENCH_NIGHTLY_NETNS=1; CI runs the nightly DAG on a 2-node cluster with one model at 2
workers instead (tests/test_dags.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NIGHTLY_CPU = REPO / "specs" / "nightly-cpu.yaml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="netns tests need root (network namespaces)"),
    pytest.mark.skipif(os.environ.get("DDLBENCH_NIGHTLY_NETNS") != "1",
                       reason="the whole nightly grid on netns: set DDLBENCH_NIGHTLY_NETNS=1"),
    pytest.mark.timeout(3600),
]

REDUCED = [
    "steps=12", "repeats=1", "train.measure_warmup=2", "train.eval_every=0", "microbench.sizes=[4096,65536,1048576]",
    "microbench.repeats=1", "profile.warmup=1", "profile.repeats=2", "tracking.system_metrics=false",
]


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.parametrize("nodes", [2, 3])
def test_nightly_cpu_runs_every_configuration_on_a_netns_cluster(tmp_path: Path, nodes: int) -> None:
    from mlflow import MlflowClient

    from pipelines.spec import grid, load_spec

    sets = [f"provider.options={{nodes: {nodes}, bandwidth: 1gbit}}", "provider.name=netns",
            "network.link_bandwidth=1gbit", *REDUCED]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ddlbench")), "run", str(NIGHTLY_CPU), "--home", str(tmp_path),
         "--run-key", "nightly-netns", *(a for s in sets for a in ("--set", s))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3500,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run_dir = tmp_path / "runs" / "nightly-netns"
    handle = json.loads((run_dir / "cluster.json").read_text())["handle"]
    assert len(handle["nodes"]) == nodes
    assert not {n for n in _namespaces() if handle["tag"] in n}  # torn down

    overrides = {"provider.name": "netns", "provider.options": {"nodes": nodes, "bandwidth": "1gbit"}}
    keys = [e["key"] for e in grid(load_spec(NIGHTLY_CPU, overrides | {"repeats": 1}))]
    assert len(keys) == 22  # 5 algorithms x 2 models x 2 and 4 workers, and each model's 1-worker baseline
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-nightly")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trained = {r.data.tags["ddlbench.config_key"]: r.info.status for r in runs if "ddlbench.config_key" in r.data.tags}
    assert trained == dict.fromkeys(keys, "FINISHED")
    assert {r.info.status for r in runs} == {"FINISHED"}
    for key in keys:
        summary = json.loads((run_dir / "train" / key / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["placement"]["nodes"] == nodes, key
