"""Wrong specs fail before anything starts: `ddlbench run` exits 2 with one line naming the
field and the value, no traceback, and leaves the home (run directories, MLflow store) as it
was; the checks the spec's fields cannot make alone are pipelines/preflight.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli import cli

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"

WRONG = [
    ("provider=ssh; rm -rf /", ['provider={"name": "ssh; rm -rf /"}'],
     "provider: unknown provider 'ssh; rm -rf /'; available: local, netns, slurm, kubernetes"),
    ("netns with 0 nodes", ['provider={"name": "netns", "options": {"nodes": 0}}'],
     "provider.options.nodes: expected a positive integer, got 0"),
    ("unknown slurm option", ['provider={"name": "slurm", "options": {"partitionz": "debug"}}'],
     "provider.options: unexpected keyword argument 'partitionz'"),
    ("netns bandwidth", ['provider={"name": "netns", "options": {"nodes": 1, "bandwidth": "fast"}}'],
     "bandwidth: expected a positive rate such as 100mbit"),
    ("unknown model", ['workloads=[{"model": "resnet9000", "dataset": "digits"}]'],
     "grid[resnet9000-ssgd-allreduce-w2-b32-r0].model: unknown model 'resnet9000'"),
    ("unknown dataset", ['workloads=[{"model": "lenet5", "dataset": "imagenet22k"}]'],
     "dataset"),
    ("mnist without a data root", ['workloads=[{"model": "lenet5", "dataset": "mnist"}]'],
     "grid[lenet5-mnist-ssgd-allreduce-w2-b32-r0].data_root: mnist needs a local data root"),
    ("a data root that is not there",
     ['workloads=[{"model": "lenet5", "dataset": "cifar10", "data_root": "/no/such/dir"}]'],
     "data_root: /no/such/dir does not exist"),
    ("a batch larger than the data set", ["batch_sizes=[1000]"],
     "batch_size: a global batch of 2 workers x 1000 = 2000 exceeds the 1438 training samples of digits"),
    ("inputs too small for the model",
     ['workloads=[{"model": "lenet5", "dataset": "synthetic", "input_shape": [1, 4, 4]}]'],
     "input_shape: lenet5 cannot take inputs of shape (1, 4, 4)"),
    ("dedicated shards that leave no node for the workers",
     ['provider={"name": "netns", "options": {"nodes": 2, "placement": "dedicated", "server_nodes": 2}}'],
     "provider.options.server_nodes: dedicated shards need 1 to 1 of the 2 nodes (the others run the workers), "
     "got 2 (a job of workers=2 + servers=1 (training))"),
    ("more workers than the nodes' devices", ['provider={"name": "netns", "options": {"nodes": 2, '
                                              '"devices_per_node": 1}}', "workers=[4]"],
     "provider.options.devices_per_node: 4 workers exceed the 2 worker slots of 2 node(s) x 1 devices "
     "(a job of workers=4 + servers=0 (training))"),
    ("an unknown placement policy", ['provider={"name": "netns", "options": {"placement": "spread"}}'],
     "provider.options.placement: Input should be 'colocated' or 'dedicated' (got 'spread')"),
    ("no workers", ["workers=[0]"], "workers"),
    ("an unknown algorithm", ['algorithms=[{"name": "hogwild"}]'], "algorithms.0.name"),
    ("an unknown spec field", ["warmup_stpes=3"], "warmup_stpes"),
    ("a configuration that cannot fit the memory it states", ['memory={"device": "1mb"}'],
     "grid[lenet5-ssgd-allreduce-w2-b32-r0].batch_size: lenet5 at a batch of 32 (ssgd over allreduce, 2 workers) "
     "needs "),
    ("a memory that is not a size", ['memory={"device": "lots"}'], "memory.device"),
    ("a memory snapshot on a CPU", ['train={"memory_snapshot": true}'],
     "train (workloads[0], workers=2, batch=32).memory_snapshot: a snapshot is the CUDA allocator's history; "
     "device is cpu"),
    ("a memory past its bound", ['memory={"device": "2PiB"}'], "memory.device"),
]


@pytest.mark.parametrize(("case", "sets", "message"), WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_spec_fails_before_anything_starts(tmp_path: Path, case: str, sets: list[str], message: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    args = ["run", str(SMOKE), "--home", str(home)]
    for s in sets:
        args += ["--set", s]
    out = CliRunner(env={"MLFLOW_TRACKING_URI": None}).invoke(cli, args)
    assert out.exit_code == 2, out.output
    assert message in out.output, out.output
    assert "Traceback" not in out.output
    assert list(home.iterdir()) == []  # no run directory, no MLflow store
