"""The `slurm` provider against real SLURM daemons: the single-node cluster of
scripts/services/slurm.sh, and the multi-node one of scripts/services/slurm-cluster.sh (one
slurmd per network namespace, on links shaped with tc tbf)."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra import Job, ProviderError, get_provider
from infra.netns import parse_bandwidth
from infra.placement import Placement
from infra.slurm import SlurmProvider, controller_up
from tests.conftest import needs_service

ROOT = Path(__file__).resolve().parent.parent
MULTI_CONF = Path("/etc/slurm-multi/slurm.conf")


def _single_why_not() -> str | None:
    if controller_up():
        return None
    return "slurmctld does not answer `scontrol ping` (CI starts it with scripts/services/slurm.sh)"


def _multi_cluster() -> tuple[int, int] | None:
    """(nodes, link rate in bits/s) of slurm-cluster.sh's cluster when it answers, else None."""
    if not controller_up(MULTI_CONF):
        return None
    m = re.search(r"^# ddlbench slurm-cluster: nodes=(\d+) rate=(\S+)$", MULTI_CONF.read_text(), re.MULTILINE)
    return (int(m.group(1)), parse_bandwidth(m.group(2))) if m else None


def _multi_why_not() -> str | None:
    found = _multi_cluster()
    if found is not None and found[0] >= 2:
        return None
    what = "has fewer than 2 nodes" if found else f"does not answer `scontrol ping` ({MULTI_CONF})"
    return f"the multi-node cluster {what} (CI starts it with scripts/services/slurm-cluster.sh)"


needs_slurm = needs_service("SLURM (single-node)", _single_why_not)
needs_multi = needs_service("SLURM (multi-node)", _multi_why_not)
def _multi_provider(**options) -> SlurmProvider:
    return SlurmProvider(nodes=2, time_limit="10", slurm_conf=str(MULTI_CONF), network_interface="eth0", **options)


def test_batch_script_carries_every_request(tmp_path):
    provider = get_provider(
        "slurm",
        nodes=2,
        gpus_per_node=4,
        time_limit="01:30:00",
        partition="gpu",
        account="ml",
        cpus_per_node=16,
        python="python3",
    )
    job = Job(
        module="training.run",
        args=[str(tmp_path / "run dir")],
        world_size=8,
        log_path=tmp_path / "launcher.log",
    )
    script = provider.batch_script(job)
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --time=01:30:00",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=ml",
        "#SBATCH --cpus-per-task=16",
        f"#SBATCH --output={tmp_path / 'launcher.log'}",
    ):
        assert line in script.splitlines()
    sruns = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 2  # 8 workers on 2 nodes x 4 GPUs: one agent per node
    for node, srun in enumerate(sruns):
        assert srun.endswith(" &")
        for word in (
            "--nodes=1 --ntasks=1 --overlap --gres=gpu:4",
            f'--nodelist="${{DDLBENCH_NODES[{node}]}}"',
            "-m infra.zygote --nprocs=4,4",
            f"--agent={node}",
            '--master-addr="$DDLBENCH_MASTER_ADDR"',
            "-m training.run",
        ):
            assert word in srun
        words = shlex.split(srun.removesuffix(" &"))
        assert words[-3:] == ["-m", "training.run", str(tmp_path / "run dir")]  # a space survives
        assert words[words.index("--overlap") + 3] == "python3"
    assert "DDLBENCH_MASTER_ADDR=${DDLBENCH_NODES[0]}" in script.splitlines()


def test_batch_script_of_a_non_uniform_placement(tmp_path):
    """2 workers + 1 shard on 2 nodes: node0 runs a worker and the shard, node1 a worker; three
    agents in rank order, each its own step on its node, the job failing with the first."""
    provider = SlurmProvider(nodes=2, gpus_per_node=1, slurm_conf=None, network_interface="eth0")
    job = Job("training.run", ["run"], world_size=3, servers=1, log_path=tmp_path / "launcher.log")
    assert provider.place_job(job).describe() == "2 nodes, colocated: node0 w0 s2, node1 w1"
    lines = provider.batch_script(job).splitlines()
    assert "#SBATCH --gpus-per-node=1" in lines and "#SBATCH --nodes=2" in lines
    assert "export GLOO_SOCKET_IFNAME=eth0" in lines and "export NCCL_SOCKET_IFNAME=eth0" in lines
    sruns = [shlex.split(line.removesuffix(" &")) for line in lines if line.startswith("srun ")]

    def option(words: list[str], name: str) -> str | None:
        return next((w.split("=", 1)[1] for w in words if w.startswith(f"--{name}=")), None)

    got = [tuple(option(w, name) for name in ("nodelist", "gres", "agent")) for w in sruns]
    assert got == [
        ("${DDLBENCH_NODES[0]}", "gpu:1", "0"),  # node0's worker: rank 0, its GPU
        ("${DDLBENCH_NODES[1]}", "gpu:1", "1"),  # node1's worker: rank 1
        ("${DDLBENCH_NODES[0]}", None, "2"),  # the shard beside node0's worker: no GPU
    ]
    assert all(option(w, "nprocs") == "1,1,1" for w in sruns)
    assert lines[-1] == 'exit "$status"' and "for _ in 0 1 2; do" in lines
    # 4 workers on 2 nodes with 3 GPUs each: devices_per_node follows gpus_per_node (3 + 1)
    wide = SlurmProvider(nodes=2, gpus_per_node=3).batch_script(Job("training.run", [], 4, log_path=Path("x")))
    assert re.findall(r"--gres=gpu:(\d+)", wide) == ["3", "1"]
    assert re.findall(r"--nprocs=(\S+)", wide) == ["3,1", "3,1"]
    restarting = SlurmProvider(nodes=2, gpus_per_node=3).batch_script(
        Job("training.run", [], 4, log_path=Path("x"), max_restarts=1))
    assert re.findall(r"--nproc-per-node=(\d+)", restarting) == ["3", "1"]  # torchrun's: each agent's own


def test_option_errors():
    with pytest.raises(ProviderError, match="provider.options.time_limit"):
        SlurmProvider(time_limit="an hour")
    with pytest.raises(ProviderError, match="provider.options.nodes"):
        SlurmProvider(nodes=0)
    with pytest.raises(ProviderError, match="provider.options.gpus_per_node"):
        SlurmProvider(gpus_per_node=-1)
    with pytest.raises(ProviderError, match="provider.options: .*unexpected keyword argument 'queue'"):
        get_provider("slurm", queue="gpu")
    with pytest.raises(ProviderError, match="provider.options.slurm_conf: /no/such/slurm.conf is not a file"):
        SlurmProvider(slurm_conf="/no/such/slurm.conf")
    with pytest.raises(ProviderError, match="provider.options.network_interface: expected an interface name"):
        SlurmProvider(network_interface="eth0; reboot")
    with pytest.raises(ProviderError, match="provider.options.devices_per_node: 3 workers exceed the 2"):
        SlurmProvider(nodes=2, gpus_per_node=1).batch_script(Job("training.run", [], 3, log_path=Path("x")))
    with pytest.raises(ProviderError, match="a cluster handle names a job_id and 2 nodes"):
        SlurmProvider(nodes=2).adopt({"job_id": "7", "nodes": ["a"]})


@needs_slurm
def test_more_nodes_than_the_partition_has_is_a_clear_error():
    with pytest.raises(ProviderError, match="provider.options.nodes: 64 nodes requested"):
        SlurmProvider(nodes=64).provision()


@pytest.mark.slow
@needs_slurm
def test_two_worker_training_job_through_slurm(tmp_path):
    from pipelines.launch import launch, prepare

    cfg = prepare(
        {
            "model": "lenet5",
            "dataset": "digits",
            "workers": 2,
            "batch_size": 16,
            "steps": 5,
            "measure_warmup": 1,
            "timeout_s": 60,
        },
        "test",
    )
    with SlurmProvider(nodes=1, time_limit="10") as provider:
        summary = launch(cfg, tmp_path, provider, timeout_s=240, echo=False)
        job_id = provider.last_job_id
        assert provider.final_state(job_id) == ("COMPLETED", 0)
    assert summary["status"] == "completed" and summary["workers"] == 2 and summary["steps"] == 5
    assert math.isfinite(summary["final_loss"])
    assert (tmp_path / "launcher.log").exists()
    assert provider.queue_state(job_id) is None


@pytest.mark.slow
@needs_slurm
def test_a_job_past_its_timeout_is_cancelled_and_leaves_no_process(tmp_path):
    marker = f"time.sleep(600.{time.time_ns() % 10**6})"
    job = Job(
        module="timeit",
        args=["-n", "1", "-r", "1", "-s", "import time", marker],
        world_size=1,
        log_path=tmp_path / "launcher.log",
        timeout_s=4,
    )
    start = time.monotonic()
    with SlurmProvider() as provider:
        result = provider.run(job, echo=False)
        state, _ = provider.final_state(provider.last_job_id)
    assert result.timed_out and not result.ok
    assert state == "CANCELLED"
    assert time.monotonic() - start < 4 + 30
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not left


@pytest.mark.slow
@needs_slurm
def test_a_cancelled_job_is_scancelled_and_leaves_no_process(tmp_path):
    """The launcher's cancel (it saw a rank stop beating) ends the job as its timeout does."""
    marker = f"time.sleep(600.{time.time_ns() % 10**6})"
    job = Job(module="timeit", args=["-n", "1", "-r", "1", "-s", "import time", marker], world_size=1,
              log_path=tmp_path / "launcher.log", timeout_s=120)
    start = time.monotonic()
    with SlurmProvider() as provider:
        threading.Timer(4, job.cancel.set).start()
        result = provider.run(job, echo=False)
        state, _ = provider.final_state(provider.last_job_id)
    assert result.cancelled and not result.ok and not result.timed_out
    assert state == "CANCELLED"
    assert time.monotonic() - start < 4 + 30
    assert not subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout


@pytest.mark.slow
@needs_slurm
def test_a_failing_job_reports_its_rank(tmp_path):
    job = Job(
        module="ddlbench_no_such_module",
        args=[],
        world_size=1,
        log_path=tmp_path / "launcher.log",
        timeout_s=120,
    )
    with SlurmProvider() as provider:
        result = provider.run(job, echo=False)
    assert not result.ok and not result.timed_out
    assert result.failed_ranks and result.failed_ranks[0]["rank"] == 0
    assert "No module named ddlbench_no_such_module" in result.log_path.read_text()


def _launch_in_a_process(tmp_path: Path, marker: str) -> tuple[subprocess.Popen, str]:
    """A launcher process running a 2-rank job that sleeps (`marker` in its command lines); the
    launcher and the job's SLURM id once the ranks run."""
    code = (
        "import sys; from pathlib import Path; from infra import Job; from infra.slurm import SlurmProvider\n"
        "job = Job(module='timeit', args=['-n', '1', '-r', '1', '-s', 'import time', sys.argv[1]], world_size=2,\n"
        "          log_path=Path(sys.argv[2]))\n"
        "with SlurmProvider() as provider:\n"
        "    provider.run(job, echo=False)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code, marker, str(tmp_path / "launcher.log")], cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(_ranks(marker)) < 2:
        assert launcher.poll() is None and time.monotonic() < deadline, "the job's ranks never started"
        time.sleep(0.2)
    (job_id,) = _jobs_of(launcher.pid)
    return launcher, job_id


def _ranks(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]


def _jobs_of(launcher_pid: int) -> list[str]:
    """The queued or running SLURM jobs whose comment names this launcher."""
    out = subprocess.run(["squeue", "-h", "--me", "-o", "%i|%k"], capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if f".{launcher_pid}." in line]


def _gone_within(launcher_pid: int, marker: str, seconds: float) -> tuple[list[str], list[psutil.Process]]:
    deadline = time.monotonic() + seconds
    while (_jobs_of(launcher_pid) or _ranks(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _jobs_of(launcher_pid), _ranks(marker)


@pytest.mark.slow
@pytest.mark.faults
@needs_slurm
def test_sigkill_of_the_launcher_cancels_its_slurm_job_within_10_s(tmp_path):
    marker = f"time.sleep(600.{time.time_ns() % 10**6})"
    launcher, job_id = _launch_in_a_process(tmp_path, marker)
    try:
        launcher.kill()
        launcher.wait()
        t0 = time.monotonic()
        assert _gone_within(launcher.pid, marker, 10) == ([], [])
        print(f"slurm job {job_id} gone {time.monotonic() - t0:.1f} s after its launcher's SIGKILL")
        state, _ = SlurmProvider().final_state(job_id)
        assert state == "CANCELLED"
    finally:
        subprocess.run(["scancel", *_jobs_of(launcher.pid)], capture_output=True)


@pytest.mark.slow
@pytest.mark.faults
@needs_slurm
def test_a_job_whose_launcher_and_watchdog_died_is_cancelled_by_ddlbench_cleanup(tmp_path):
    marker = f"time.sleep(600.{time.time_ns() % 10**6})"
    launcher, job_id = _launch_in_a_process(tmp_path, marker)
    try:
        (watchdog,) = [
            p
            for p in psutil.Process(launcher.pid).children()
            if "--on-death" in p.cmdline() and str(launcher.pid) in p.cmdline()
        ]
        watchdog.kill()
        while watchdog.is_running() and watchdog.status() != psutil.STATUS_ZOMBIE:  # dead, unreaped
            time.sleep(0.05)
        launcher.kill()
        launcher.wait()
        time.sleep(2)
        assert _jobs_of(launcher.pid) == [job_id]  # nothing else would have cancelled it
        done = subprocess.run(
            [str(Path(sys.executable).with_name("ddlbench")), "cleanup"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"slurm job {job_id}" in done.stdout
        assert _gone_within(launcher.pid, marker, 10) == ([], [])
    finally:
        subprocess.run(["scancel", *_jobs_of(launcher.pid)], capture_output=True)


def _link_bound_s(summary: dict, rate_bps: int) -> float:
    """The least time per step the shaped links allow, from the workers' byte counts and the
    recorded placement: the bytes a step sends out of the busiest node over the link's rate.
    A PS worker splits its pushes (sent) and pulls (received) evenly over the shards, and only
    what goes to or comes from another node's shard crosses a link; an allreduce worker alone
    on its node sends every byte to the other nodes. Synchronous PS pulls only after every push
    has arrived, so a worker's remote pushes and pulls take their sum, one after the other, and
    so do a shard's pushes from and pulls to remote workers."""
    placement = Placement.from_dict(summary["placement"])
    sent = {int(r): b for r, b in summary["bytes_sent"].items()}
    received = {int(r): b for r, b in summary["bytes_received"].items()}
    leaving = [0.0] * placement.nodes
    in_turn: list[float] = []
    shard_turn = dict.fromkeys(range(placement.workers, placement.world_size), 0.0)
    for w in range(placement.workers):
        node = placement.node_of_rank[w]
        if not placement.servers:
            assert placement.workers_on(node) == [w]
            leaving[node] += sent[w]
            continue
        remote = [s for s in range(placement.workers, placement.world_size) if not placement.same_node(w, s)]
        pushed, pulled = sent[w] * len(remote) / placement.servers, received[w] * len(remote) / placement.servers
        leaving[node] += pushed
        for s in remote:
            leaving[placement.node_of_rank[s]] += received[w] / placement.servers
            shard_turn[s] += (sent[w] + received[w]) / placement.servers
        in_turn.append(pushed + pulled)
    if summary["algorithm"] != "ssgd":  # asynchronous PS: pushes and pulls of a step may overlap
        in_turn = []
    elif placement.servers:
        in_turn += shard_turn.values()
    return max(leaving + in_turn) / summary["steps"] / (rate_bps / 8)


def _mlp_config(**overrides):
    from pipelines.launch import prepare

    # mlp: 8.7 MB of parameters a step, compute a few ms: the shaped link sets the pace
    base = {"model": "mlp", "dataset": "digits", "workers": 2, "batch_size": 16, "steps": 12, "measure_warmup": 2,
            "timeout_s": 120}
    return prepare(base | overrides, "test")


def _assert_paced_by_the_link(summary: dict, what: str) -> None:
    bound = _link_bound_s(summary, _multi_cluster()[1])
    measured = summary["iter_time_s"]["p50"]
    print(f"{what}: iteration p50 {measured:.3f} s, link bound {bound:.3f} s, ratio {measured / bound:.2f}")
    assert bound > 0.1  # the test measures the link, not loopback: MBs a step on a shaped link
    assert measured >= bound


@pytest.mark.slow
@pytest.mark.alone  # a measured bandwidth
@needs_multi
def test_allreduce_across_two_slurm_nodes_crosses_the_shaped_link(tmp_path):
    """2 workers, one per node, a batch job of their own: the ring's bytes cross the link."""
    from pipelines.launch import launch

    with _multi_provider() as provider:
        summary = launch(_mlp_config(), tmp_path, provider, timeout_s=240, echo=False)
        assert provider.final_state(provider.last_job_id) == ("COMPLETED", 0)
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert summary["placement"] == {"policy": "colocated", "nodes": 2, "workers_per_node": [1, 1],
                                    "servers_per_node": [0, 0], "node_of_rank": [0, 1]}
    assert json.loads((tmp_path / "placement.json").read_text())["node_of_rank"] == [0, 1]
    _assert_paced_by_the_link(summary, "allreduce, 2 nodes")


@pytest.mark.slow
@needs_multi
def test_ps_with_a_colocated_shard_as_steps_of_a_run_allocation(tmp_path):
    """2 workers + 1 shard beside worker 0 (node0 runs 2 ranks, node1 one: 3 agents), run as
    steps of the allocation a pipeline run holds: one process provisions it, another adopts its
    handle. Worker 1's pushes and pulls cross the link; worker 0's stay on node0."""
    from pipelines.launch import launch

    owner = _multi_provider()
    owner.provision_shared()
    handle = json.loads(json.dumps(owner.handle()))  # what travels between a run's tasks
    try:
        assert handle["nodes"] == ["snode0", "snode1"]
        task = _multi_provider()
        task.adopt(handle)
        summary = launch(_mlp_config(comm="ps", servers=1), tmp_path, task, timeout_s=240, echo=False)
        assert task.queue_state(handle["job_id"]) == "RUNNING"  # the allocation outlives the job
    finally:
        owner.teardown()
    assert owner.queue_state(handle["job_id"]) not in ("RUNNING", "PENDING")
    with pytest.raises(ProviderError, match=f"allocation \\(job {handle['job_id']}\\) is .*not RUNNING"):
        _multi_provider().adopt(handle)
    assert summary["status"] == "completed" and summary["comm"] == "ps" and summary["servers"] == 1
    assert summary["placement"] == {"policy": "colocated", "nodes": 2, "workers_per_node": [1, 1],
                                    "servers_per_node": [1, 0], "node_of_rank": [0, 1, 0]}
    _assert_paced_by_the_link(summary, "ps 2+1 colocated, 2 nodes")


@pytest.mark.slow
@needs_multi
def test_a_failing_agent_fails_the_whole_two_node_job_at_once(tmp_path):
    """Rank 1 (node1's agent) raises while rank 0 would sleep for 10 minutes: the batch script
    stops the other step and the job fails, naming rank 1."""
    marker = f"600.{time.time_ns() % 10**6}"
    statement = f"time.sleep({marker}) if os.environ['RANK'] == '0' else 1 / 0"
    job = Job("timeit", ["-n", "1", "-r", "1", "-s", "import os, time", statement], world_size=2,
              log_path=tmp_path / "launcher.log", timeout_s=120)
    start = time.monotonic()
    with _multi_provider() as provider:
        result = provider.run(job, echo=False)
        state, _ = provider.final_state(provider.last_job_id)
    assert state == "FAILED" and not result.ok and not result.timed_out
    assert time.monotonic() - start < 60
    assert [f["rank"] for f in result.failed_ranks] == [1]
    assert "ZeroDivisionError" in result.log_path.read_text()
    assert not subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout


@pytest.mark.slow
@pytest.mark.faults
@needs_multi
def test_sigkill_of_a_launcher_ends_its_steps_but_not_the_run_allocation(tmp_path):
    """A task's launcher killed outright: its steps' ranks are gone within 10 s; the run's
    allocation stays for the run's other tasks until teardown."""
    marker = f"time.sleep(600.{time.time_ns() % 10**6})"
    owner = _multi_provider()
    owner.provision_shared()
    handle = owner.handle()
    code = (
        "import json, sys; from pathlib import Path; from infra import Job; from infra.slurm import SlurmProvider\n"
        "p = SlurmProvider(nodes=2, slurm_conf=sys.argv[3], network_interface='eth0')\n"
        "p.adopt(json.loads(sys.argv[4]))\n"
        "job = Job(module='timeit', args=['-n', '1', '-r', '1', '-s', 'import time', sys.argv[1]], world_size=2,\n"
        "          log_path=Path(sys.argv[2]))\n"
        "p.run(job, echo=False)\n"
    )
    argv = [sys.executable, "-c", code, marker, str(tmp_path / "launcher.log"), str(MULTI_CONF), json.dumps(handle)]
    launcher = subprocess.Popen(argv, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while len([p for p in _ranks(marker) if "srun" not in p.info["cmdline"][0]]) < 4:  # 2 agents, 2 ranks
            assert launcher.poll() is None and time.monotonic() < deadline, "the job's ranks never started"
            time.sleep(0.2)
        launcher.kill()
        launcher.wait()
        t0 = time.monotonic()
        while _ranks(marker) and time.monotonic() - t0 < 10:
            time.sleep(0.2)
        assert _ranks(marker) == []
        print(f"steps' ranks gone {time.monotonic() - t0:.1f} s after their launcher's SIGKILL")
        assert owner.queue_state(handle["job_id"]) == "RUNNING"
    finally:
        launcher.kill()
        owner.teardown()


@needs_multi
def test_a_run_allocation_whose_owner_died_is_cancelled_as_an_orphan():
    from infra.slurm import cancel_orphans

    owner_process = subprocess.Popen(["sleep", "600"])
    provider = _multi_provider()
    try:
        provider.provision_shared(owner=owner_process.pid)
        job_id = provider.handle()["job_id"]
        assert job_id not in cancel_orphans(MULTI_CONF)  # its owner lives
        owner_process.kill()
        owner_process.wait()
        done = subprocess.run(  # not the default cluster: swept when named
            [str(Path(sys.executable).with_name("ddlbench")), "cleanup", "--slurm-conf", str(MULTI_CONF)],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"slurm job {job_id} ({MULTI_CONF})" in done.stdout
        deadline = time.monotonic() + 30  # scancel signals; slurmctld ends the job on its own time
        while provider.queue_state(job_id) in {"RUNNING", "PENDING"} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert provider.queue_state(job_id) not in {"RUNNING", "PENDING"}
    finally:
        owner_process.kill()
        provider.teardown()


@needs_multi
def test_an_allocation_the_cluster_refuses_is_a_clear_error():
    with pytest.raises(ProviderError, match="slurm: sbatch refused the run's allocation: .*gres"):
        _multi_provider(gpus_per_node=1).provision_shared()
