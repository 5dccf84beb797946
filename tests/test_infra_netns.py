"""The `netns` provider: real namespaces, bridge, tbf-shaped veth links, ranks across them.

Needs root (skipped otherwise). Links are shaped to 100 Mbit/s so this 2-core host, not the
CPU, is never what limits the measured bandwidth.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra import Job, ProviderError, get_provider
from infra.netns import NetnsProvider, cleanup_stale, parse_bandwidth
from tests.conftest import needs_root

ROOT = Path(__file__).resolve().parent.parent
netns = [pytest.mark.netns, needs_root]


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def assert_gone(provider: NetnsProvider, run_dir: Path | None = None) -> None:
    """No namespace, link or bridge of this provider remains, nor a process of its run."""
    assert not {n for n in namespaces() if provider.tag in n}
    assert provider.tag not in links()
    if run_dir is not None:
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(run_dir) not in ps


def tx_bytes(provider: NetnsProvider, node: int) -> int:
    out = subprocess.run(
        [
            "ip",
            "-j",
            "-s",
            "-n",
            provider.ns_name(node),
            "link",
            "show",
            "dev",
            provider.ifname(node),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def test_bandwidth_parsing_and_option_errors():
    assert parse_bandwidth("100mbit") == 100_000_000
    assert parse_bandwidth("1gbit") == 10**9
    assert parse_bandwidth("10gbit") == 10**10
    assert parse_bandwidth("2.5Gbit") == 2_500_000_000
    for bad in ("fast", "100", "-1gbit", "1gb/s"):
        with pytest.raises(ProviderError, match="provider.options.bandwidth"):
            NetnsProvider(bandwidth=bad)
    with pytest.raises(ProviderError, match="provider.options.subnet: 8.8.8.0/24 is outside"):
        NetnsProvider(subnet="8.8.8.0/24")
    with pytest.raises(ProviderError, match="room for 2 nodes, 3 requested"):
        NetnsProvider(nodes=3, subnet="10.9.0.0/30")
    with pytest.raises(ProviderError, match="provider.options.nodes"):
        NetnsProvider(nodes=0)
    with pytest.raises(ProviderError, match="provider.options: .*unexpected keyword argument 'gpus'"):
        get_provider("netns", gpus=1)
    with pytest.raises(ProviderError, match="unknown provider 'mesos'; available: local, netns"):
        get_provider("mesos")


def test_an_impossible_placement_is_refused_before_anything_starts(tmp_path):
    provider = NetnsProvider(nodes=2, placement="dedicated", server_nodes=2)
    job = Job(module="training.run", args=[], world_size=3, servers=1, log_path=tmp_path / "log")
    with pytest.raises(ProviderError, match=r"provider.options.server_nodes: dedicated shards need 1 to 1 of the 2 "):
        provider.run(job)
    assert not provider.provisioned


def test_without_root_a_clear_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ProviderError, match="netns: network namespaces need root"):
        NetnsProvider(nodes=2).provision()


@pytest.mark.parametrize("nodes", [2, 3])
@pytest.mark.netns
@needs_root
def test_cluster_comes_up_shaped_and_tears_down_cleanly(nodes):
    provider = NetnsProvider(nodes=nodes, bandwidth="200mbit", subnet="192.168.77.0/24")
    with provider:
        addrs = [n.address for n in provider.provision()]
        assert addrs == [f"192.168.77.{i + 1}" for i in range(nodes)]
        assert {provider.ns_name(i) for i in range(nodes)} <= namespaces()
        for i in range(nodes):
            ns = provider.ns_name(i)
            addr = subprocess.run(
                ["ip", "-n", ns, "-br", "addr", "show", "dev", provider.ifname(i)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert f"192.168.77.{i + 1}/24" in addr and "UP" in addr
            qdisc = subprocess.run(
                ["tc", "-n", ns, "qdisc", "show", "dev", provider.ifname(i)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "tbf" in qdisc and "rate 200Mbit" in qdisc
        # the subnet exists only inside the namespaces: the host has no route into it
        route = subprocess.run(["ip", "route", "get", "192.168.77.1"], capture_output=True, text=True)
        assert f"db{provider.tag}" not in route.stdout
    assert_gone(provider)


@pytest.mark.netns
@needs_root
def test_a_failed_provision_removes_what_it_built():
    provider = NetnsProvider(nodes=3)
    # node 1's namespace name is taken, so provisioning fails after node 0 and the bridge exist
    subprocess.run(["ip", "netns", "add", provider.ns_name(1)], check=True)
    with pytest.raises(ProviderError, match="netns add .*-1.*exists"):
        provider.provision()
    assert not provider.provisioned
    assert_gone(provider)


@pytest.mark.netns
@needs_root
def test_a_killed_owner_leaves_nothing_behind_after_the_next_provision():
    code = (
        "from infra.netns import NetnsProvider; import time; p = NetnsProvider(nodes=2); "
        "p.provision(); print(p.tag, flush=True); time.sleep(60)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    tag = owner.stdout.readline().strip()
    assert any(tag in n for n in namespaces())
    owner.kill()
    owner.wait()
    removed = cleanup_stale()
    assert len([n for n in removed if tag in n]) == 2
    assert not any(tag in n for n in namespaces()) and tag not in links()


def _owner() -> tuple[subprocess.Popen, str]:
    """A process that provisions a 2-node cluster and keeps it; the process and the cluster's tag."""
    code = (
        "from infra.netns import NetnsProvider; import time; p = NetnsProvider(nodes=2); "
        "p.provision(); print(p.tag, flush=True); time.sleep(120)"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    tag = owner.stdout.readline().strip()
    assert tag and len([n for n in namespaces() if tag in n]) == 2
    return owner, tag


@pytest.mark.faults
@pytest.mark.netns
@needs_root
def test_ddlbench_cleanup_removes_a_dead_owners_cluster_and_leaves_a_live_one():
    dead, dead_tag = _owner()
    live, live_tag = _owner()
    try:
        dead.kill()
        dead.wait()
        done = subprocess.run([str(Path(sys.executable).with_name("ddlbench")), "cleanup"], capture_output=True,
                              text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert len([line for line in done.stdout.splitlines() if "netns namespace" in line and dead_tag in line]) == 2
        assert not any(dead_tag in n for n in namespaces()) and dead_tag not in links()
        assert len([n for n in namespaces() if live_tag in n]) == 2 and f"db{live_tag}" in links()
    finally:
        live.kill()
        live.wait()
        cleanup_stale()
    assert not any(live_tag in n for n in namespaces())


@pytest.mark.slow
@pytest.mark.alone  # a measured bandwidth
@pytest.mark.netns
@needs_root
def test_allreduce_bandwidth_matches_the_shaped_rate(tmp_path):
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_netns import measure_allreduce

    with NetnsProvider(nodes=2, bandwidth="100mbit") as provider:
        fig = measure_allreduce(provider, size_bytes=4 << 20, repeats=3, workdir=tmp_path)
    ratio = fig["bus_bytes_per_s"] / (100e6 / 8)
    print(f"allreduce bus bandwidth {fig['bus_bytes_per_s'] / 1e6:.2f} MB/s = {ratio:.3f} x 100mbit")
    assert fig["world_size"] == 2
    assert 0.85 <= ratio <= 1.05, fig
    assert_gone(provider, tmp_path)


def train_values(**options) -> dict:
    return {
        "model": "lenet5",
        "dataset": "digits",
        "batch_size": 16,
        "steps": 6,
        "timeout_s": 60,
        "measure_warmup": 1,
    } | options


@pytest.mark.slow
@pytest.mark.netns
@needs_root
@pytest.mark.parametrize(
    ("algorithm", "comm", "workers", "servers", "nodes", "placement", "node_of_rank"),
    [
        ("ssgd", "allreduce", 2, 0, 2, "colocated", [0, 1]),
        ("ssgd", "ps", 2, 2, 2, "colocated", [0, 1, 0, 1]),  # node0: w0 s2, node1: w1 s3 (3 agents)
        ("asgd", "ps", 1, 1, 2, "dedicated", [0, 1]),
        ("odsgd", "ps", 2, 1, 3, "dedicated", [0, 1, 2]),
    ],
)
def test_algorithms_train_across_nodes(tmp_path, algorithm, comm, workers, servers, nodes, placement, node_of_rank):
    from pipelines.launch import launch, prepare

    cfg = prepare(
        train_values(algorithm=algorithm, comm=comm, workers=workers, servers=servers, link_bandwidth="100mbit"),
        "test",
    )
    with NetnsProvider(nodes=nodes, bandwidth="100mbit", placement=placement) as provider:
        summary = launch(cfg, tmp_path, provider, timeout_s=180, echo=False)
        sent = [tx_bytes(provider, i) for i in range(nodes)]
    assert summary["status"] == "completed"
    assert summary["algorithm"] == algorithm and summary["workers"] == workers
    assert summary["servers"] == servers and summary["steps"] == 6
    assert math.isfinite(summary["final_loss"])
    assert summary["placement"]["policy"] == placement and summary["placement"]["node_of_rank"] == node_of_rank
    assert json.loads((tmp_path / "placement.json").read_text()) == summary["placement"]
    # every node's ranks really talked over its shaped link: each sent at least half a model's
    # worth per step (allreduce halves on two nodes; a PS worker pushes to the remote shards)
    assert min(sent) >= 6 * summary["parameter_bytes"] / 2, (sent, summary["parameter_bytes"])
    assert_gone(provider, tmp_path)


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.alone  # the time to notice the lost node
@pytest.mark.netns
@needs_root
def test_a_node_dropping_off_the_network_fails_the_job_in_bounded_time(tmp_path):
    from pipelines.launch import JobFailed, launch, prepare

    op_timeout_s = 20
    cfg = prepare(train_values(steps=5000, timeout_s=op_timeout_s), "test")
    provider = NetnsProvider(nodes=2, bandwidth="100mbit")
    down_at: list[float] = []

    def cut_link_once_training_runs() -> None:
        metrics = tmp_path / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text()):
            time.sleep(0.2)
        provider.set_link(1, up=False)
        down_at.append(time.monotonic())

    with provider:
        cutter = threading.Thread(target=cut_link_once_training_runs, daemon=True)
        cutter.start()
        with pytest.raises(JobFailed) as failed:
            launch(cfg, tmp_path, provider, timeout_s=240, echo=False)
        ended = time.monotonic()
        cutter.join(1)
    assert down_at, "training never started"
    elapsed = ended - down_at[0]
    print(f"job failed {elapsed:.1f} s after the link went down (op timeout {op_timeout_s} s)")
    assert not failed.value.result.timed_out
    assert elapsed < op_timeout_s + 20
    assert_gone(provider, tmp_path)


# -- one cluster per pipeline run: a keeper owns it, other processes adopt its handle ---------
def _provision_shared_elsewhere(**options) -> dict:
    """A process that provisions a shared cluster and exits at once, as Airflow's provision task
    does; the cluster's handle."""
    code = (
        "import json, sys; from infra.netns import NetnsProvider\n"
        "p = NetnsProvider(**json.loads(sys.argv[1])); p.provision_shared(); print(json.dumps(p.handle()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, json.dumps(options)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    return json.loads(done.stdout)


def _keeper_pid(handle: dict) -> int:
    return int(handle["keeper"].split(".")[-2])


def _alive(pid: int) -> bool:
    from infra.lifeline import Launcher

    return Launcher.of(pid).start != 0


@pytest.mark.netns
@needs_root
def test_a_shared_cluster_outlives_its_provisioner_until_the_adopters_teardown():
    handle = _provision_shared_elsewhere(nodes=2, bandwidth="200mbit")
    keeper = _keeper_pid(handle)
    names = [n["name"] for n in handle["nodes"]]
    assert names == [f"ddlb-{keeper}-{handle['tag']}-{i}" for i in range(2)]  # owned by the keeper
    assert set(names) <= namespaces() and _alive(keeper)
    cleanup_stale()  # another provider's sweep: a live keeper's cluster is not stale
    assert set(names) <= namespaces()

    task = NetnsProvider(nodes=2, bandwidth="200mbit")
    task.adopt(handle)
    assert [n.name for n in task.provision()] == names and task.handle() == handle
    qdisc = subprocess.run(["tc", "-n", names[1], "qdisc", "show", "dev", task.ifname(1)],
                           capture_output=True, text=True, check=True).stdout
    assert "rate 200Mbit" in qdisc
    with pytest.raises(ProviderError, match="provider.options.nodes: the run's cluster .* has 2 nodes, .* give 3"):
        NetnsProvider(nodes=3).adopt(handle)

    released = NetnsProvider(nodes=2)
    released.adopt(handle)
    released.teardown()
    released.teardown()  # teardown may run twice
    assert not set(names) & namespaces() and handle["tag"] not in links() and not _alive(keeper)
    late = NetnsProvider(nodes=2)
    late.adopt(handle)
    with pytest.raises(ProviderError, match=rf"netns: the run's cluster {handle['tag']} is gone: its keeper"):
        late.provision()


@pytest.mark.netns
@needs_root
def test_a_killed_keeper_leaves_a_stale_cluster_that_cleanup_removes():
    handle = _provision_shared_elsewhere(nodes=2)
    os.kill(_keeper_pid(handle), 9)
    deadline = time.monotonic() + 10
    while _alive(_keeper_pid(handle)) and time.monotonic() < deadline:
        time.sleep(0.05)
    removed = cleanup_stale()
    assert sorted(n for n in removed if handle["tag"] in n) == [n["name"] for n in handle["nodes"]]
    assert handle["tag"] not in links()


@pytest.mark.netns
@needs_root
def test_the_keeper_removes_the_cluster_past_its_lease_or_when_its_owner_dies():
    leased = _provision_shared_elsewhere(nodes=2, lease_s=1)
    code = (
        "import os; from infra.netns import NetnsProvider; import time; p = NetnsProvider(nodes=2)\n"
        "p.provision_shared(owner=os.getpid()); print(p.tag, flush=True); time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    tag = owner.stdout.readline().strip()
    assert len([n for n in namespaces() if tag in n]) == 2
    owner.kill()  # the one `ddlbench run` process, killed outright
    owner.wait()
    deadline = time.monotonic() + 20
    # the keeper removes the bridge last, then exits: wait for both
    while time.monotonic() < deadline and (any(t in links() for t in (tag, leased["tag"]))
                                           or _alive(_keeper_pid(leased))):
        time.sleep(0.1)
    for gone in (tag, leased["tag"]):
        assert not any(gone in n for n in namespaces()) and gone not in links()
    assert not _alive(_keeper_pid(leased))


DDLBENCH = str(Path(sys.executable).with_name("ddlbench"))
TINY_PS = ["--model", "lenet5", "--dataset", "digits", "--algorithm", "ssgd", "--comm", "ps", "--workers", "2",
           "--servers", "1", "--batch-size", "16", "--steps", "6", "--measure-warmup", "1", "--quiet"]


@pytest.mark.parametrize(("args", "message"), [
    (["--provider", "netns", "--nodes", "0"], "provider.options.nodes: expected a positive integer, got 0"),
    (["--provider", "netns", "--bandwidth", "100"], "provider.options.bandwidth: expected a positive rate"),
    (["--bandwidth", "1gbit"], "provider.options: unexpected keyword argument 'bandwidth'"),
    (["--provider", "netns", "--provider-option", "gpus=1"], "provider.options: unexpected keyword argument 'gpus'"),
    (["--provider", "netns", "--nodes", "2", "--placement", "dedicated", "--provider-option", "server_nodes=2"],
     "provider.options.server_nodes: dedicated shards need 1 to 1 of the 2 nodes"),
])
def test_ddlbench_train_refuses_bad_provider_options_naming_them(tmp_path, args, message):
    from click.testing import CliRunner

    from pipelines.cli import cli

    done = CliRunner().invoke(cli, ["train", *TINY_PS, *args, "--out", str(tmp_path / "out")])
    assert done.exit_code == 2, done.output
    assert message in done.output
    assert not (tmp_path / "out").exists()  # nothing launched


@pytest.mark.slow
@pytest.mark.netns
@needs_root
def test_ddlbench_train_runs_one_job_on_a_netns_cluster(tmp_path):
    before = namespaces()
    out = tmp_path / "out"
    done = subprocess.run([DDLBENCH, "train", *TINY_PS, "--provider", "netns", "--nodes", "2",
                           "--bandwidth", "200mbit", "--placement", "colocated", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 6 and summary["servers"] == 1
    assert summary["placement"] == {"policy": "colocated", "nodes": 2, "workers_per_node": [1, 1],
                                    "servers_per_node": [1, 0], "node_of_rank": [0, 1, 0]}
    assert summary["environment"]["link_bandwidth"] == "200mbit"
    assert not {n for n in namespaces() - before if n.startswith("ddlb-")}  # torn down


@pytest.mark.netns
@needs_root
def test_a_keeper_whose_provisioner_dies_before_handing_the_cluster_over_removes_it():
    tag = "c0ffee"
    keeper = subprocess.Popen([sys.executable, "-m", "infra.netns", "keep", tag, "1", "600", "0"],
                              stdin=subprocess.PIPE, cwd=ROOT)
    name = f"ddlb-{keeper.pid}-{tag}-0"
    subprocess.run(["ip", "netns", "add", name], check=True)  # what the provisioner had built
    assert name in namespaces()
    keeper.stdin.close()  # the provisioner died: no "d" came
    assert keeper.wait(60) == 0
    assert name not in namespaces()
