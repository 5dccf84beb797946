"""The `slurm` provider against the real single-node SLURM that scripts/services/slurm.sh starts."""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from infra import Job, ProviderError, get_provider
from infra.slurm import SlurmProvider, controller_up

ROOT = Path(__file__).resolve().parent.parent
needs_slurm = pytest.mark.skipif(
    not controller_up(),
    reason="slurmctld is not running (CI starts it with scripts/services/slurm.sh)",
)


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
    srun = script.splitlines()[-1]
    assert srun.startswith("exec srun --kill-on-bad-exit=1")
    for word in (
        "--nproc-per-node=4",
        "--nnodes=2",
        '--node-rank="$SLURM_NODEID"',
        '--master-addr="$DDLBENCH_MASTER_ADDR"',
        "-m training.run",
    ):
        assert word in srun
    # one quoting level for srun's `bash -c`, one inside: a run dir with a space survives both
    inner = shlex.split(shlex.split(srun)[-1])
    assert inner[-3:] == ["-m", "training.run", str(tmp_path / "run dir")]
    assert inner[0] == "python3" and "--node-rank=$SLURM_NODEID" in inner


def test_option_errors():
    with pytest.raises(ProviderError, match="provider.options.time_limit"):
        SlurmProvider(time_limit="an hour")
    with pytest.raises(ProviderError, match="provider.options.nodes"):
        SlurmProvider(nodes=0)
    with pytest.raises(ProviderError, match="provider.options.gpus_per_node"):
        SlurmProvider(gpus_per_node=-1)
    with pytest.raises(ProviderError, match="provider.options: .*unexpected keyword argument 'queue'"):
        get_provider("slurm", queue="gpu")
    with pytest.raises(ProviderError, match=r"the job.s placement \(2 nodes, colocated: node0 w0 w1, node1 w2\)"):
        SlurmProvider(nodes=2).batch_script(Job("training.run", [], 3, log_path=Path("x")))


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
