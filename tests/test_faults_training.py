"""Faults injected into real training jobs: kill-and-resume, a killed shard,
a straggler past the timeout, divergence, a corrupted checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
from click.testing import CliRunner

from infra.local import LocalProvider
from pipelines.cli import cli
from pipelines.launch import JobFailed, launch, prepare
from tests.conftest import needs_root
from tests.test_training_algorithms import ssgd_reference
from tests.trainjobs import max_diff, rank_process
from training.config import ConfigError
from training.measure.timeline import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.faults]


def steps_logged(out: Path) -> int:
    try:
        return sum(1 for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line)
    except FileNotFoundError:
        return 0


def inject(out: Path, rank: int, sig: int, after_steps: int, log: list[float]) -> threading.Thread:
    """Send `sig` to `rank` once rank 0 has logged `after_steps` steps."""

    def go() -> None:
        proc = rank_process(out, rank)
        while steps_logged(out) < after_steps:
            time.sleep(0.05)
        log.append(time.monotonic())
        os.kill(proc.pid, sig)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def no_ranks_left(out: Path) -> bool:
    return not any("training.run" in (p.info["cmdline"] or []) and str(out) in (p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]))


def test_ssgd_killed_and_resumed_equals_uninterrupted(tmp_path):
    out = tmp_path.resolve()
    steps = 24
    cfg = prepare({"model": "lenet5", "dataset": "digits", "workers": 2, "batch_size": 16, "steps": steps,
                   "checkpoint_every": 4, "max_restarts": 1, "save_params": True})
    killed: list[float] = []
    inject(out, 1, signal.SIGKILL, 10, killed)
    summary = launch(cfg, out, LocalProvider(), timeout_s=300, echo=False)
    assert killed, "the fault was never injected"
    assert summary["status"] == "completed" and summary["steps"] == steps
    log = (out / "launcher.log").read_text()
    assert "resumed from the checkpoint after step" in log
    params = torch.load(out / "params.pt", weights_only=True)
    assert max_diff(params, ssgd_reference(2, 16, steps)) < 1e-5
    # Every completed step is logged exactly once: none lost, none duplicated.
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    workers = [r for r in read_jsonl(out / "timeline.jsonl") if r["role"] == "worker"]
    assert sorted((r["rank"], r["step"]) for r in workers) == [(k, t) for k in range(2) for t in range(steps)]


@pytest.mark.parametrize("algorithm", ["asgd", "odsgd"])
def test_ps_algorithms_resume_and_finish(tmp_path, algorithm):
    out = tmp_path.resolve()
    cfg = prepare({"model": "lenet5", "dataset": "digits", "algorithm": algorithm, "workers": 2, "servers": 1,
                   "batch_size": 16, "steps": 20, "checkpoint_every": 4, "max_restarts": 1})
    killed: list[float] = []
    inject(out, 2 if algorithm == "asgd" else 0, signal.SIGKILL, 9, killed)  # a shard; a worker
    summary = launch(cfg, out, LocalProvider(), timeout_s=300, echo=False)
    assert killed and summary["status"] == "completed"
    assert "resumed from the checkpoint after step" in (out / "launcher.log").read_text()
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] == list(range(1, 21))
    if algorithm == "asgd":  # every push of every worker was applied exactly once
        assert sum(summary["staleness"]["histogram"].values()) == 2 * 20


def test_killed_shard_fails_the_job_naming_it(tmp_path):
    out = tmp_path.resolve()
    cfg = prepare({"model": "mlp", "dataset": "synthetic", "algorithm": "ssgd", "comm": "ps", "servers": 1,
                   "workers": 2, "batch_size": 16, "steps": 100_000, "timeout_s": 30})
    killed: list[float] = []
    inject(out, 2, signal.SIGKILL, 3, killed)
    with pytest.raises(JobFailed) as err:
        launch(cfg, out, LocalProvider(), timeout_s=240, echo=False)
    assert time.monotonic() - killed[0] < 30
    assert "rank 2 exited with -9 (SIGKILL)" in str(err.value)
    assert no_ranks_left(out)


@pytest.mark.parametrize(("options", "stop", "role"), [
    ({"algorithm": "ssgd", "overlap": False}, 1, "worker"),
    ({"algorithm": "odsgd", "servers": 1}, 2, "server"),
    ({"algorithm": "odsgd", "servers": 1}, 1, "worker"),
], ids=["ssgd-worker", "odsgd-shard", "odsgd-worker"])
def test_a_stopped_rank_is_named_by_role_in_the_first_line(tmp_path, options, stop, role):
    """A stopped rank (SIGSTOP): its peers' waits time out, and the error's first line names
    the rank that stopped (its heartbeat ended), by role and step, and who waited for it;
    gloo's source path stays out of it."""
    out = tmp_path.resolve()
    timeout = 8  # every wait's but the ranks' wait for each other's set-up
    cfg = prepare({"model": "lenet5", "dataset": "digits", "workers": 2, "batch_size": 16,
                   "steps": 100_000, "timeout_s": timeout, **options})
    stopped: list[float] = []
    inject(out, stop, signal.SIGSTOP, 3, stopped)
    with pytest.raises(JobFailed) as err:
        launch(cfg, out, LocalProvider(), timeout_s=240, echo=False)
    assert stopped, f"the job failed before the fault was injected: {err.value}"
    detected = time.monotonic() - stopped[0]
    assert detected < timeout + 20, detected
    first, *rest = str(err.value).splitlines()
    print(first)
    match = re.fullmatch(rf"rank {stop} \({role}\) stopped answering at step (\d+)"
                         r"; ranks? ([\d, ]+) timed out waiting for it(?:; ranks? [\d, ]+ failed in turn)?", first)
    assert match, first
    waiters = [int(r) for r in match.group(2).split(", ")]
    assert stop not in waiters and set(waiters) <= {0, 1, 2}, first
    assert "gloo" not in first and ".cc:" not in first
    # The step named is where the stopped rank was: its peers waited on that step or the next
    # (it may have stopped after its part of its step, before beginning the next). OD-SGD's
    # workers wait for the global update one step late (W_g(t) is step t-1's), so they run
    # one step further before they wait for what the stopped rank never sent.
    failed_at = [int(m) for m in re.findall(r"failed during \w+ of step (\d+)", "\n".join(rest))]
    named, delay = int(match.group(1)), 1 if options["algorithm"] == "odsgd" else 0
    assert failed_at and all(named - 1 <= s <= named + 1 + delay for s in failed_at), (first, rest)
    assert no_ranks_left(out)


def test_divergence_is_recorded_not_a_crash(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["train", "--out", str(out), "--workers", "2", "--steps", "50",
                                      "--lr", "1e6", "--momentum", "0.9", "--quiet"])
    assert result.exit_code == 3, result.output
    assert "diverged: loss" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and 1 <= summary["step"] <= 50


def test_corrupted_or_foreign_checkpoint_is_refused_before_launch(tmp_path):
    out = tmp_path.resolve()
    base = {"model": "lenet5", "dataset": "digits", "workers": 1, "batch_size": 16, "steps": 6,
            "checkpoint_every": 2}
    launch(prepare(base), out, LocalProvider(), timeout_s=120, echo=False)
    latest = max(out.glob("checkpoints/step-*/rank0.pt"))
    # Foreign: a different learning rate changes the trajectory.
    with pytest.raises(ConfigError, match=r"written by a job with other options"):
        launch(prepare(base | {"lr": 0.5, "steps": 8}), out, LocalProvider(), echo=False)
    latest.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=rf"checkpoint: {latest}: not a readable ddlbench checkpoint"):
        launch(prepare(base | {"steps": 8}), out, LocalProvider(), echo=False)
    assert not (out / "launcher.log").read_text().count("resumed")  # nothing was launched since


@needs_root
def test_full_output_disk_fails_cleanly_and_keeps_what_was_written(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mnt)], check=True)
    try:
        out = mnt / "run"
        # mlp checkpoints are ~20 MB: the first one fills the disk after 4 logged steps.
        result = CliRunner().invoke(cli, ["train", "--out", str(out), "--model", "mlp", "--dataset", "synthetic",
                                          "--workers", "1", "--steps", "20", "--checkpoint-every", "4", "--quiet"])
        assert result.exit_code == 1, result.output
        assert re.search(rf"failed: no space left on device: {re.escape(str(out))}\S* \([^)]*left on its "
                         r"filesystem\); what was written before is kept", result.output), result.output
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        assert not any(out.glob("checkpoints/step-*/COMPLETE"))  # no half-written checkpoint is trusted
        assert no_ranks_left(out)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
