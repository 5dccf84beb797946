"""The PS microbenchmark and its fit on a real emulated cluster (netns: namespaces, a bridge,
tbf-shaped full-duplex links, torchrun across them), by placement.

A round of 2 workers to 1 shard pushes then pulls M bytes per worker: with the shard
beside worker 0 (colocated, 2 nodes) only worker 1's traffic crosses a link, M each way;
with the shard on its own node (dedicated, 3 nodes) both workers' cross the shard node's
link, 2M each way. The fit must find the link's rate either way (issue 14: it flagged a
correct colocated round as faster than the link). Needs root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.netns import NetnsProvider
from modelling.measure.microbench import run_microbench
from modelling.network.fit import fit_comm
from modelling.predict import predict
from modelling.scenario import Scenario
from tests.conftest import needs_root

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,  # measured against predicted iterations and link rates
    pytest.mark.netns,
    needs_root,
]

REPO = Path(__file__).resolve().parent.parent
RATE = 200e6 / 8  # bytes/s: slow enough that the 2 shared cores never limit the link
SIZES = [65536, 262144, 1 << 20, 4 << 20]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("nodes", "policy", "queue"), [(2, "colocated", 1), (3, "dedicated", 2)])
def test_a_ps_round_on_shaped_links_fits_the_links_rate(tmp_path, nodes: int, policy: str, queue: int) -> None:
    with NetnsProvider(nodes=nodes, bandwidth="200mbit", placement=policy) as provider:
        comm = run_microbench(2, 1, tmp_path, provider=provider, sizes=SIZES, repeats=3, link_bytes_per_s=RATE)
    assert comm["environment"]["nodes"] == nodes
    # The send-buffer ceiling of the ranks' namespaces, which sets how much of an ASGD reply the
    # shard's socket takes (modelling/measure/links.py): a namespace starts with the kernel's default.
    assert comm["environment"]["tcp_wmem_max"] >= 1 << 20
    # And the receive buffer's, which holds a waiting push within a node (ASGDPlan).
    assert comm["environment"]["tcp_rmem_max"] >= 1 << 20
    # Every PS round also times the workers' posting of it (OD-SGD's critical path).
    rounds = [r for r in comm["measurements"] if r["primitive"] == "ps"]
    assert len(rounds) == len(SIZES) and all(0 < r["post_s"] < r["median_s"] for r in rounds)
    # Dedicated, both workers' pulls share the shard node's uplink, and the round times how much
    # sooner the first is back than the last. Both ends lie within the round (after its last
    # start), so in every repeat the lead is shorter than the round. Where the link sets the
    # time (1 MiB and up, 10x tbf's 100 KB burst), a work-conserving link ends the last pull at
    # most one pull's time on it (M/R) after the first. Below that the bucket's burst carries the
    # bytes and the round is the host's scheduling (2-7 ms at 64 KiB), while the lead is the
    # second pull's wire time (1.5 ms): half the round does not bound it there. Colocated,
    # one worker crosses a link: nothing to share.
    if policy == "dedicated":
        assert all(abs(r["pull_lead_s"]) <= r["median_s"] for r in rounds)
        assert all(abs(r["pull_lead_s"]) <= r["bytes"] / RATE for r in rounds if r["bytes"] >= 1 << 20)
    else:
        assert all(r["pull_lead_s"] is None for r in rounds)
    # Every rank shares this host's cores: each round records the host's CPU time for it, which
    # grows with the bytes (16 MB more move in the largest, at well over 0.2 ns of CPU a byte)
    # and stays within what the cores can give over the loop it was read over (whose slow
    # rounds make it longer than the timed repeats' mean: that is no bound).
    cores = comm["environment"]["cpu_count"]
    assert comm["environment"]["hosts"] == 1
    assert rounds[-1]["host_cpu_s"] - rounds[0]["host_cpu_s"] > 4 * (4 << 20) * 0.2e-9
    assert all(r["host_cpu_s"] <= cores * r["host_cpu_wall_s"] for r in rounds)
    # ASGD's pass is timed in ASGD's own pattern, per worker: a worker across a link pushes and
    # pulls 4 MiB at its rate (less the burst); a colocated shard's own worker crosses none.
    passes = [r for r in comm["measurements"] if r["primitive"] == "asgd"]
    assert [r["bytes"] for r in passes] == SIZES and all(len(r["worker_mean_s"]) == 2 for r in passes)
    remote, near = passes[-1]["worker_mean_s"][1], passes[-1]["worker_mean_s"][0]
    assert remote >= 2 * (4 << 20) / RATE * 0.9
    assert (near < remote / 4) if policy == "colocated" else (near >= 2 * (4 << 20) / RATE * 0.9)
    # And per worker its reply's tail: the shard's send returns while the link still carries a
    # part of the 4 MiB reply (the socket takes up to 2 MiB of it: 84 ms at this rate), never
    # longer than the pass it ends.
    assert all(len(r["reply_tail_s"]) == 2 for r in passes)
    tail = passes[-1]["reply_tail_s"][1]
    assert 0.1 * (4 << 20) / RATE < tail < remote
    model = fit_comm(comm)
    ps = next(f for f in model["fits"] if f["primitive"] == "ps")
    assert ps["link_queue"] == queue and ps["usable"], ps["flags"]
    # The sustained rate is the link's, less TCP/IP headers and the host's noise.
    assert 0.98 <= ps["sustained_beta_s_per_byte"] * RATE < 1.35
    # The largest round: 2 * queue transfers of 4 MiB on the busiest link, at its rate (less
    # the token bucket's burst, 100 KB a transfer).
    round_s = ps["measured_s"][-1]
    assert round_s >= 2 * queue * (4 << 20) / RATE * 0.9
    for f in model["fits"]:
        assert f["usable"], f"{f['primitive']}: {f['flags']}"


GRIDS = Path(__file__).resolve().parent / "fixtures" / "grids"


@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    ("spec", "node_of_rank", "label"),
    [
        # 4 workers on 3 nodes, placed [2, 1, 1] with the shard beside worker 0, at 2 Gbit/s.
        pytest.param("netns3.yaml", [0, 0, 1, 2, 0], "3 nodes colocated", id="uneven-3-nodes"),
        # The issue's resnet20 at 75 Mbit/s with ASGD, whose predict stage failed the run.
        pytest.param("asgd75.yaml", [0, 1, 0], "2 nodes colocated", id="asgd-75mbit"),
        # Issue 49's ms-scale case: lenet5 at 400 Mbit/s, 30 steps, 2 repeats, a gradient of the
        # order of the links' token bucket.
        pytest.param("netns2-lenet5.yaml", [0, 1, 0], "2 nodes colocated", id="lenet5-400mbit"),
    ],
)
def test_an_issue_spec_is_measured_predicted_and_validated(tmp_path: Path, spec: str, node_of_rank: list[int],
                                                           label: str) -> None:
    """A spec of the issue through `ddlbench run` on netns, every algorithm. The
    microbenchmark times the link on a pair that crosses nodes and loopback on a pair within
    one (a pair by rank number timed loopback in the link's place on [2, 1, 1]); a fit
    flagged against the stated rate is predicted at that rate, with a note; every algorithm
    is predicted and has a validation row; the run ends FINISHED."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ddlbench")), "run", str(GRIDS / spec), "--home", str(tmp_path),
         "--run-key", "issue"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run = tmp_path / "runs" / "issue"
    comm = json.loads(next(run.glob("microbench/*/comm.json")).read_text())
    # each pooled round (microbench.pooled) is a job of its own, placed alike
    rounds = sorted(run.glob("microbench/*/r*/placement.json"))
    assert rounds and {json.dumps(json.loads(p.read_text())["node_of_rank"]) for p in rounds} == {
        json.dumps(node_of_rank)}
    placed = node_of_rank
    pairs = {r["primitive"]: tuple(r["pair"]) for r in comm["measurements"] if r.get("pair") is not None}
    a, b = pairs["p2p"]
    assert placed[a] != placed[b]  # the link
    a, b = pairs["loopback"]
    assert placed[a] == placed[b]  # within a node
    # A fit flagged against the stated rate (a token bucket's burst, 1 MB at 2 Gbit/s, carries
    # most of the 1 MiB message, and the sustained slope over the largest two sizes beats the
    # link) is predicted at that rate, and the prediction says so; nothing is skipped.
    model = json.loads((run / "fit" / "model.json").read_text())
    # Flagged faster than its link (not a line that noise made flat, which is used as
    # measured), per world: a 1-worker round beside its shard is loopback, and flagged, but no
    # 2-worker prediction uses it.
    flagged = {(f["primitive"], f["workers"], f["servers"]) for f in model["fits"]
               if not f["usable"] and f["beta_s_per_byte"] > 0}
    layers = json.loads(next(run.glob("profile/*/layers.json")).read_text())
    for path in run.glob("train/*/summary.json"):
        summary = json.loads(path.read_text())
        [p] = predict(layers, model, Scenario.from_summary(summary), strict=False)
        assert p["no_prediction"] is None and p["iter_time_s"] > 0
        if (summary["comm"], summary["workers"], summary["servers"] if summary["comm"] == "ps" else 0) in flagged:
            assert "wire time at the stated link rate" in p["note"], p["note"]
    predictions = json.loads((run / "predict" / "predictions.json").read_text())
    assert {p["algorithm"] for p in predictions if p["iter_time_s"]} == {"ssgd-allreduce", "ssgd-ps", "asgd-ps",
                                                                          "odsgd-ps"}
    validation = json.loads((run / "validate" / "validation.json").read_text())
    rows = {(r["algorithm"], r["comm"]): r for r in validation["runs"]}
    assert set(rows) == {("ssgd", "allreduce"), ("ssgd", "ps"), ("asgd", "ps"), ("odsgd", "ps")}
    for r in rows.values():
        assert r["placement"] == label and r["predicted_iter_s"] > 0 and r["measured_iter_s"] > 0
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "FINISHED", status
    if spec == "asgd75.yaml":  # its spec samples system metrics: each node's own series, by node
        _holds_per_node_series(tmp_path, nodes=2)
    if spec == "netns2-lenet5.yaml":
        _holds_or_says_it_is_outside_its_domain(validation)


def _holds_or_says_it_is_outside_its_domain(validation: dict) -> None:
    """Every configuration is predicted within max(10%, 2 x its repeat spread), or is marked
    outside the validated domain with an 80% interval that holds its measurement: never a
    narrow interval missed by 80% (issue 49)."""
    from modelling.calibration import WITHIN_BURST

    assert len(validation["configs"]) == 4
    for c in validation["configs"]:
        name = f"{c['algorithm']}-{c['comm']}: {c['error']:+.1%} (spread {c['repeat_spread']:.1%}), {c['domain']}"
        if c["domain"] == "validated":
            assert abs(c["error"]) <= max(0.10, 2 * c["repeat_spread"]), name
        else:
            assert c["interval_low_s"] <= c["measured_iter_s"] <= c["interval_high_s"], (name, c)
        # the mechanism: lenet5's 247 KB gradient meets the links' bucket (about 200 KB at 400 Mbit/s)
        assert c["domain"] == WITHIN_BURST, name


def _holds_per_node_series(home: Path, nodes: int) -> None:
    """Every training run holds each node's CPU, memory and network, under MLflow's node layout:
    every node moved bytes over its link (the gradients cross it) and held memory; what one node
    sent, the other received, to what the bridge's own frames add."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-adhoc").experiment_id
    trains = client.search_runs([exp], "tags.`ddlbench.node` LIKE 'train/%'")
    assert trains
    for run in trains:
        m = run.data.metrics
        assert "system/cpu_utilization_percentage" in m  # the host's own, as before

        def series(key: str, run_id: str = run.info.run_id) -> list[float]:
            return [x.value for x in client.get_metric_history(run_id, key)]

        for i in range(nodes):
            node = f"system/node-{i}/"
            assert m[node + "network_transmit_megabytes"] > 0 and max(series(node + "memory_rss_megabytes")) > 0, m
            cpu = series(node + "cpu_utilization_percentage")
            assert max(cpu) > 0 and all(0 <= c <= 100 for c in cpu), cpu
        sent = [m[f"system/node-{i}/network_transmit_megabytes"] for i in range(nodes)]
        received = [m[f"system/node-{i}/network_receive_megabytes"] for i in range(nodes)]
        assert sum(received) == pytest.approx(sum(sent), rel=0.05), (sent, received)
