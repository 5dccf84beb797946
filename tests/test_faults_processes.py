"""A launcher killed outright (SIGKILL: the OOM killer, a lost worker) leaves no process of its
job behind: its agent dies with it and every rank with its agent (infra/lifeline.py);
the MLflow runs it left RUNNING are ended FAILED by `ddlbench sync`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.trainjobs import is_rank, processes_under, rank_process

pytestmark = [pytest.mark.slow, pytest.mark.faults]

REPO = Path(__file__).resolve().parent.parent
DDLBENCH = str(Path(sys.executable).with_name("ddlbench"))
GONE_WITHIN_S = 10


def gone_within(path: Path, seconds: float) -> list[str]:
    """What is still running under `path` after waiting up to `seconds` for it to end."""
    deadline = time.monotonic() + seconds
    while (left := processes_under(path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_sigkill_of_ddlbench_train_ends_its_agent_and_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [DDLBENCH, "train", "--algorithm", "odsgd", "--workers", "2", "--servers", "1", "--model", "lenet5",
         "--dataset", "digits", "--batch-size", "16", "--steps", "1000000", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        ranks = [rank_process(out, r) for r in range(3)]
        agent = ranks[0].parent()
        assert agent is not None and "infra.zygote" in " ".join(agent.cmdline())
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        killed = time.monotonic()
        assert gone_within(out, GONE_WITHIN_S) == []
        print(f"`ddlbench train`'s job gone {time.monotonic() - killed:.1f} s after its SIGKILL")
    finally:
        launcher.kill()
        for p in psutil.process_iter(["cmdline"]):  # never leak into the next test
            if str(out) in " ".join(p.info["cmdline"] or []):
                p.kill()


def test_sigkill_of_ddlbench_run_leaves_no_process_and_sync_fails_its_runs(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    launcher = subprocess.Popen(
        [DDLBENCH, "run", str(REPO / "specs" / "smoke.yaml"), "--home", str(home),
         "--set", 'algorithms=[{"name": "ssgd"}]', "--set", "steps=1000000", "--set", "epochs=null",
         "--set", "train_timeout_s=3600", "--set", "microbench.enabled=false", "--set", "profile.enabled=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        runs = home / "runs"
        deadline = time.monotonic() + 180
        while not list(runs.glob("*/train/*/metrics.jsonl")) and time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.stderr.read()
            time.sleep(0.5)
        (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
        assert processes_under(run_dir), "the training job never started"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        killed = time.monotonic()
        assert gone_within(run_dir, GONE_WITHIN_S) == []
        print(f"`ddlbench run`'s job gone {time.monotonic() - killed:.1f} s after its SIGKILL")
    finally:
        launcher.kill()

    done = subprocess.run([DDLBENCH, "sync", str(run_dir)], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "orphans marked FAILED" in done.stdout
    ctx = json.loads((run_dir / "ctx.json").read_text())
    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    experiment = client.get_experiment_by_name(ctx["experiment"])
    statuses = {r.info.run_name: r.info.status for r in client.search_runs([experiment.experiment_id])}
    assert statuses and "RUNNING" not in statuses.values(), statuses
    assert statuses[ctx["run_key"]] == "FAILED"  # the parent: its process is gone
    trained = [r for r in client.search_runs([experiment.experiment_id]) if "ddlbench.config_key" in r.data.tags]
    assert trained and {r.info.status for r in trained} == {"FAILED"}  # the train run it was in


def test_a_profiling_rank_that_dies_fails_the_profile_at_once_naming_it(tmp_path: Path) -> None:
    """The profile runs in torchrun's processes: a contender killed mid-profile ends the job
    (no barrier waited out) with an error naming the rank and its signal."""
    import threading

    from modelling.measure.profiler import ProfileFailed, profile_layers

    out = tmp_path / "profile"
    killed: list[float] = []

    def kill_contender() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                try:
                    cmd = p.info["cmdline"] or []
                    if "modelling.measure.profile_rank" in cmd and str(out) in cmd and is_rank(p, 1):
                        if (out / "profile-job.json").exists():
                            time.sleep(3)  # let it reach its iterations
                            killed.append(time.monotonic())
                            p.kill()
                            return
                except psutil.Error:
                    continue
            time.sleep(0.2)

    killer = threading.Thread(target=kill_contender, daemon=True)
    killer.start()
    with pytest.raises(ProfileFailed, match=r"rank 1 exited with -9 \(SIGKILL\)"):
        profile_layers("lenet5", 16, dataset="digits", processes=2, warmup=2, repeats=10_000, out_dir=out,
                       timeout_s=600)
    killer.join()
    assert killed, "the contender was never killed"
    assert processes_under(out) == []
