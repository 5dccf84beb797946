"""Training jobs end to end: accuracy, outputs, bad options, a killed worker."""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time

import psutil
import pytest
from click.testing import CliRunner

from infra.local import LocalProvider
from pipelines.cli import cli
from pipelines.launch import JobFailed, launch, prepare
from tests.trainjobs import rank_process
from training.measure.timeline import read_jsonl
from training.ps import ShardLayout

# lenet5 on digits, 2 workers x 32, 150 steps: every algorithm must pass this.
TARGET_ACCURACY = 0.85
STEPS = 150


def _untimed_s(workers: list[dict], skip: int) -> list[float]:
    """Per measured worker iteration: its period (from the previous iteration's end, or its own
    start for the first) less the time its phases cover."""
    out = []
    for rank in sorted({r["rank"] for r in workers}):
        recs = sorted((r for r in workers if r["rank"] == rank), key=lambda r: r["step"])
        for prev, r in zip([None, *recs], recs, strict=False):
            if r["step"] >= skip:
                period = r["end"] - (prev["end"] if prev else r["start"])
                out.append(period - sum(b - a for a, b in r["phases"].values()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"algorithm": "ssgd", "comm": "allreduce"},
        {"algorithm": "ssgd", "comm": "ps", "servers": 1},
        # The shard's optimizer at lr / N (DESIGN 2) and momentum 0.8, as specs/smoke.yaml runs
        # it (its ASGD options give the figures). The arrival order (the trajectory) varies from
        # run to run: 400 steps leave it a margin.
        {"algorithm": "asgd", "servers": 1, "steps": 400, "momentum_async": 0.8},
        {"algorithm": "odsgd", "servers": 1, "warmup_steps": 5},
    ],
    ids=["ssgd-allreduce", "ssgd-ps", "asgd", "odsgd"],
)
def test_each_algorithm_learns_digits(tmp_path, options):
    cfg = prepare({"model": "lenet5", "dataset": "digits", "workers": 2, "batch_size": 32,
                   "steps": STEPS, "eval_every": 50, "target_accuracy": 0.5} | options)
    steps = cfg.steps
    summary = launch(cfg, tmp_path, LocalProvider(), timeout_s=300, echo=False)
    assert summary["status"] == "completed"
    assert summary["final_accuracy"] >= TARGET_ACCURACY, summary["final_accuracy"]
    assert 0 < summary["time_to_accuracy_s"] <= summary["train_time_s"]
    assert summary["target_reached"] is True and summary["steps_to_accuracy"] in range(50, steps + 1, 50)

    # Timing figures are consistent with the timeline they come from.
    records = read_jsonl(tmp_path / "timeline.jsonl")
    workers = [r for r in records if r["role"] == "worker"]
    assert sorted({r["rank"] for r in workers}) == [0, 1]
    assert len(workers) == 2 * steps
    assert summary["throughput_samples_per_s"] > 0
    it = summary["iter_time_s"]
    assert 0 < it["p50"] <= it["p95"]
    # An iteration's period is its timed phases plus what no phase times: the loop between one
    # step's end and the next one's start (metrics, checkpoint, rank 0's evaluation) and any time
    # between phases. The breakdown and the mean period are means over the same measured records
    # of the same timeline, so  mean period == sum(breakdown) + mean(untimed)  to float rounding.
    untimed = _untimed_s(workers, summary["warmup_steps_excluded"])
    assert len(untimed) == 2 * summary["measured_steps"]
    assert sum(summary["breakdown_s"].values()) + statistics.fmean(untimed) == pytest.approx(it["mean"], rel=1e-12)
    assert min(untimed) >= 0  # the phases are disjoint spans inside their iteration
    for r in workers:
        spans = sorted(r["phases"].values())
        assert all(a <= b for a, b in spans), r
        assert r["start"] <= spans[0][0] and spans[-1][1] <= r["end"] + 1e-9
    if summary["servers"]:
        assert {r["role"] for r in records} == {"worker", "server"}
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"forward", "backward", "update"}

    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert len(losses) == steps and losses[-1] < losses[0]
    assert [m["step"] for m in metrics if "accuracy" in m] == list(range(50, steps, 50)) + [steps]
    env = summary["environment"]
    assert env["torch"] and env["world_size"] == 2 + summary["servers"]
    if options["algorithm"] == "asgd":
        st = summary["staleness"]
        assert sum(st["histogram"].values()) == 2 * steps and st["mean"] >= 0

    # Start-up: each part the launcher and the ranks timed, in the order they come, lies within the
    # whole way to training, which the launch (before any rank's module ran) is a part of.
    start = summary["startup"]
    parts = start["parts_s"]
    assert list(parts) == ["launch", "imports", "process_group", "set_up", "canary"]
    assert all(v > 0 for v in parts.values()), parts
    assert start["started_at"] < start["training_at"] < start["written_at"]
    assert max(parts.values()) < start["to_training_s"]
    assert start["to_training_s"] == pytest.approx(parts["launch"] + start["training_at"] - start["started_at"])
    assert 0 < start["teardown_s"] < 30

    _check_memory(summary, options)


def _check_memory(summary: dict, options: dict) -> None:
    """Memory on every rank (training/measure/memory.py): what each holds, from the objects that hold it."""
    memory, servers = summary["memory"], summary["servers"]
    ranks = memory["ranks"]
    assert [(r["rank"], r["role"]) for r in ranks] == (
        [(0, "worker"), (1, "worker")] + [(2 + s, "server") for s in range(servers)])
    top = max(ranks, key=lambda r: r["peak_bytes"])
    assert {k: memory[k] for k in ("peak_bytes", "peak_rss_bytes", "breakdown")} == {
        k: top[k] for k in ("peak_bytes", "peak_rss_bytes", "breakdown")}
    assert memory["reserved_bytes"] is None  # CPU
    weights = 4 * summary["parameters"]
    # Each worker's further state: the optimizer's momentum where it steps itself, and its
    # communication buffers: DDP's buckets (one copy of the gradients); a PS worker's push and
    # pull buffers (two slots each under OD-SGD, whose global copy W_g is the pull slot being
    # read, and a copy of its own in its SSGD warm-up, which the sampled step 2 falls in).
    if options["algorithm"] == "ssgd" and options["comm"] == "allreduce":
        optimizer, buffers = weights, weights
    elif options["algorithm"] == "odsgd":
        optimizer, buffers = weights, 5 * weights
    else:
        optimizer, buffers = 0, 2 * weights
    for r in ranks:
        b = r["breakdown"]
        assert r["peak_rss_bytes"] >= r["peak_bytes"] == sum(b.values()) > 0, r
        if r["role"] == "worker":
            assert (b["parameters"], b["gradients"], b["optimizer"], b["buffers"]) == (
                weights, weights, optimizer, buffers), (options, r)
            assert b["activations"] > 0
        else:  # a shard: its share of the weights, their momentum, and where the pushes land
            start, end = ShardLayout.even(summary["parameters"], servers).bounds[r["rank"] - 2]
            shard = 4 * (end - start)
            landing = 1 if options["algorithm"] == "asgd" else summary["workers"]  # async: one buffer
            assert (b["parameters"], b["optimizer"], b["activations"]) == (shard, shard, 0), r
            # The shard's gradient is the push buffer the others are summed into.
            assert b["gradients"] + b["buffers"] == landing * shard, r


BAD_OPTIONS = [
    (["--model", "resnet9000"], "model: unknown model 'resnet9000'"),
    (["--workers", "0"], "workers"),
    (["--algorithm", "ssgd", "--comm", "ps", "--servers", "0"], "servers: comm=ps needs at least 1"),
    (["--algorithm", "asgd", "--comm", "allreduce"], "comm: asgd runs on a parameter server"),
    (["--dataset", "mnist"], "data_root: mnist needs a local data root"),
    (["--dataset", "cifar10", "--data-root", "/nonexistent/cifar"], "data_root: /nonexistent/cifar does not exist"),
    (["--dataset", "imagenet"], "dataset: unknown dataset 'imagenet'"),
    (["--epochs", "1", "--steps", "3"], "steps/epochs: give exactly one"),
    (["--input-shape", "1,8,8"], "input_shape: lenet5 cannot take inputs of shape (1, 8, 8): lenet5 needs at least"),
    (["--input-shape", "3,x,1"], "expected C,H,W"),
    (["--batch-size", "-4"], "batch_size"),
    (["--lr", "0"], "lr"),
    (["--momentum", "1.5"], "momentum"),
    (["--compensation", "magic"], "'magic' is not one of"),
    (["--workers", "2", "--batch-size", "720", "--model", "lenet5", "--dataset", "digits"],
     "batch_size: a global batch of 2 workers x 720 = 1440 exceeds the 1438 training samples of digits"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[m.split(":")[0] for _, m in BAD_OPTIONS])
def test_bad_options_fail_before_any_process_starts(tmp_path, args, message):
    out = tmp_path / "out"
    extra = [] if "--steps" in args else ["--steps", "5"]
    result = CliRunner().invoke(cli, ["train", "--out", str(out), *extra, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()  # nothing was launched


def test_bad_yaml_config_names_file_and_field(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: lenet5\nworkers: 2\nbatchsize: 8\nsteps: 3\n")
    result = CliRunner().invoke(cli, ["train", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"{cfg}.batchsize: Extra inputs are not permitted" in result.output
    missing = CliRunner().invoke(cli, ["train", "--config", str(tmp_path / "nope.yaml"), "--out", "o"])
    assert missing.exit_code == 2 and "nope.yaml: no such file" in missing.output


@pytest.mark.slow
def test_killed_worker_fails_the_job_naming_the_rank(tmp_path):
    out = tmp_path.resolve()
    cfg = prepare({"model": "mlp", "dataset": "synthetic", "algorithm": "odsgd", "servers": 1,
                   "workers": 2, "batch_size": 16, "steps": 100_000, "timeout_s": 30})
    killed_at: list[float] = []

    def kill_rank_1() -> None:
        proc = rank_process(out, 1)
        while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").stat().st_size:
            time.sleep(0.2)  # training is under way
        killed_at.append(time.monotonic())
        os.kill(proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    with pytest.raises(JobFailed) as err:
        launch(cfg, out, LocalProvider(), timeout_s=240, echo=False)
    detected = time.monotonic() - killed_at[0]
    assert detected < 30, detected
    failed = err.value.result.failed_ranks
    assert any(f["rank"] == 1 and f.get("signal") == "SIGKILL" for f in failed), failed
    assert "rank 1 exited with -9 (SIGKILL)" in str(err.value)
    assert not any("training.run" in " ".join(p.info["cmdline"] or []) and str(out) in " ".join(p.info["cmdline"] or [])
                   for p in psutil.process_iter(["cmdline"]))
