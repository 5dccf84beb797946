"""What the README promises, through the commands a user types (the installed `ddlbench`):

- a rerun into the same `--out` resumes from the last complete checkpoint, and SSGD then ends
  with the parameters of an uninterrupted run;
- `ddlbench profile`, `microbench`, `fit` and `validate` chained as commands, their files and
  printed figures consistent with each other;
- `ddlbench sync --abandoned` leaves no run RUNNING, where a plain `sync` leaves a pipeline run
  that may go on alone;
- `ddlbench run` whose MLflow store is down tries it again once the outage window has passed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from tests.test_training_algorithms import ssgd_reference
from tests.trainjobs import max_diff, processes_under
from training.measure.timeline import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
DDLBENCH = str(Path(sys.executable).with_name("ddlbench"))
SMOKE = REPO / "specs" / "smoke.yaml"


def ddlbench(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([DDLBENCH, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=(env or os.environ) | {"COLUMNS": "200"})
    assert done.returncode == 0, f"ddlbench {' '.join(args)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def test_a_rerun_into_the_same_out_resumes_and_ssgd_ends_as_uninterrupted(tmp_path: Path) -> None:
    out = tmp_path / "run"
    steps, every = 40, 4
    # 50 ms of sleep a step: the job runs 1.8 s or more after its first checkpoint, so the
    # SIGKILL, sent once that checkpoint is complete, lands mid-job on any machine.
    train = ["train", "--algorithm", "ssgd", "--workers", "2", "--model", "lenet5", "--dataset", "digits",
             "--batch-size", "16", "--steps", str(steps), "--checkpoint-every", str(every), "--save-params",
             "--inject-delay-ms", "50", "--out", str(out)]
    first = subprocess.Popen([DDLBENCH, *train], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("checkpoints/step-*/COMPLETE")):
            assert first.poll() is None, first.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint completed in 240 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
    finally:
        first.kill()
        first.wait()
    deadline = time.monotonic() + 15  # its agent and ranks follow it (infra/lifeline.py)
    while processes_under(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(out) == []
    assert not (out / "summary.json").exists()  # killed mid-job
    kept = max(int(p.parent.name.removeprefix("step-")) for p in out.glob("checkpoints/step-*/COMPLETE"))
    assert every <= kept < steps

    ddlbench(*train)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == steps
    assert f"resumed from the checkpoint after step {kept}" in (out / "launcher.log").read_text()
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # none lost, none twice
    params = torch.load(out / "params.pt", weights_only=True)
    assert max_diff(params, ssgd_reference(2, 16, steps)) < 1e-5


def _lenet5_layer_bytes() -> list[int]:
    from training.models import build_model

    net = build_model("lenet5", (1, 28, 28), 10)
    return [sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
            for m in net.modules() if any(True for _ in m.parameters(recurse=False))]


def test_profile_microbench_fit_and_validate_as_commands(tmp_path: Path) -> None:
    sizes, repeats = [4096, 65536, 1048576], 3
    prof = ddlbench("profile", "--out", str(tmp_path / "prof"), "--model", "lenet5", "--batch-size", "32",
                    "--dataset", "digits", "--warmup", "1", "--repeats", str(repeats))
    layers = json.loads((tmp_path / "prof" / "layers.json").read_text())
    assert (layers["model"], layers["batch_size"], layers["repeats"]) == ("lenet5", 32, repeats)
    assert [layer["param_bytes"] for layer in layers["layers"]] == _lenet5_layer_bytes()
    assert all(layer["fwd_s"] > 0 and layer["bwd_s"] > 0 for layer in layers["layers"])
    total = re.search(r"total forward ([\d.]+) ms, backward ([\d.]+) ms", prof.stdout)
    assert total, prof.stdout
    assert float(total[1]) == pytest.approx(sum(v["fwd_s"] for v in layers["layers"]) * 1e3, abs=5e-4)
    assert float(total[2]) == pytest.approx(sum(v["bwd_s"] for v in layers["layers"]) * 1e3, abs=5e-4)

    ddlbench("microbench", "--out", str(tmp_path / "mb"), "--workers", "2", "--sizes", ",".join(map(str, sizes)),
             "--repeats", str(repeats))
    comm = json.loads((tmp_path / "mb" / "comm.json").read_text())
    got = sorted((m["primitive"], m["bytes"]) for m in comm["measurements"])
    assert got == sorted((p, s) for p in ("allreduce", "p2p") for s in sizes)
    for m in comm["measurements"]:
        assert len(m["times_s"]) == repeats and min(m["times_s"]) > 0
        assert m["median_s"] == statistics.median(m["times_s"])

    ddlbench("fit", "--comm", str(tmp_path / "mb" / "comm.json"), "--out", str(tmp_path / "model.json"))
    fits = json.loads((tmp_path / "model.json").read_text())["fits"]
    assert sorted(f["primitive"] for f in fits) == ["allreduce", "p2p"]
    for f in fits:
        assert f["sizes"] == sizes and f["workers"] == 2
        # the residuals are the measurements less the fitted line, at every size
        line = [f["intercept_s"] + f["slope_s_per_byte"] * s for s in sizes]
        assert f["residuals_s"] == pytest.approx([m - p for m, p in zip(f["measured_s"], line, strict=True)],
                                                 rel=1e-9, abs=1e-15)

    run = tmp_path / "run"
    ddlbench("train", "--algorithm", "ssgd", "--workers", "2", "--model", "lenet5", "--dataset", "digits",
             "--batch-size", "32", "--steps", "30", "--out", str(run))
    shown = ddlbench("validate", "--run", str(run), "--layers", str(tmp_path / "prof" / "layers.json"),
                     "--comm-model", str(tmp_path / "model.json"), "--out", str(tmp_path / "validation.json")).stdout
    val = json.loads((tmp_path / "validation.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    (row,) = val["runs"]
    assert (row["algorithm"], row["workers"], row["model"], row["batch_size"]) == ("ssgd", 2, "lenet5", 32)
    assert row["measured_iter_s"] == summary["iter_time_s"]["p50"]
    assert row["measured_iter_mean_s"] == summary["iter_time_s"]["mean"]
    assert row["measured_breakdown_s"] == summary["breakdown_s"]
    assert row["predicted_iter_s"] > 0 and row["error"] is not None
    # The table the command prints holds, on the run's row, the figures its JSON holds (its
    # arithmetic is held to hand-written numbers in tests/test_modelling_e2e.py).
    cells = (f"{row['predicted_iter_s'] * 1e3:.2f}", f"{row['measured_iter_s'] * 1e3:.2f}", f"{row['error']:+.1%}")
    assert any(all(cell in line for cell in cells) for line in shown.splitlines()), (cells, shown)
    assert val["median_abs_error"] == val["worst_abs_error"] == abs(row["error"])


def _statuses(home: Path) -> dict[str, str]:
    from mlflow import MlflowClient

    ctx = json.loads(next((home / "runs").glob("*/ctx.json")).read_text())
    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    exp = client.get_experiment_by_name(ctx["experiment"])
    return {r.data.tags["ddlbench.node"]: r.info.status for r in client.search_runs([exp.experiment_id])}


START_AND_PROVISION = """
import sys
from pipelines import steps
ctx = steps.call("start", sys.argv[1], run_key="abandoned", home=sys.argv[2],
                  overrides={"microbench.enabled": False, "profile.enabled": False},
                  airflow={"dag_id": "ddlbench_nightly", "run_id": "manual__abandoned"})
steps.call("provision", ctx)
"""


def test_sync_abandoned_through_the_command_leaves_no_run_running(tmp_path: Path) -> None:
    """A pipeline run whose Airflow DAG run ended after `provision`, without `finish`: a plain
    `ddlbench sync` leaves its parent RUNNING (the run may go on); `--abandoned` ends it FAILED."""
    home = tmp_path / "home"
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    # start and provision as an Airflow DAG run's tasks run them (the parent run is the DAG
    # run's, not the task process's), in a process that has ended since.
    subprocess.run([sys.executable, "-c", START_AND_PROVISION, str(SMOKE), str(home)], cwd=REPO, env=env,
                   check=True, timeout=300)
    assert _statuses(home) == {"pipeline": "RUNNING", "provision": "FINISHED"}

    done = ddlbench("sync", "--home", str(home), env=env)
    assert _statuses(home) == {"pipeline": "RUNNING", "provision": "FINISHED"}
    assert "abandoned: uploaded 0, pending 0" in done.stdout and "orphans" not in done.stdout

    done = ddlbench("sync", "--abandoned", "abandoned", "--home", str(home), env=env)
    assert _statuses(home) == {"pipeline": "FAILED", "provision": "FINISHED"}
    assert "pending 0, orphans marked FAILED: pipeline" in done.stdout
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(home) in " ".join(p.info["cmdline"] or [])]


def test_the_mlflow_store_is_tried_again_after_the_outage_window(tmp_path: Path) -> None:
    """`ddlbench run` with the store down at its start: it journals and goes on; the store is
    back a moment later and, the window (DDLBENCH_MLFLOW_RETRY_S) past, the next stage reaches
    it: the training run samples system metrics, which only a run online while it trains has
    (nothing replays them), and every run ends FINISHED with nothing left to sync."""
    from mlflow import MlflowClient

    from pipelines.tracking.journal import Journal

    home, store = tmp_path / "home", tmp_path / "store"
    uri = f"sqlite:///{store / 'mlflow.db'}"  # no such directory yet: the store is down
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "DDLBENCH_MLFLOW_RETRY_S": "1",
           "MLFLOW_SQLALCHEMYSTORE_POOLCLASS": "NullPool", "PYTHONUNBUFFERED": "1"}
    # The microbenchmark (seconds) lies between the outage and the training, past the window;
    # 200 steps of 20 ms sleep or more give the 2 s sampler time to sample.
    sets = ['algorithms=[{"name": "ssgd"}]', "steps=200", "train.inject_delay_ms=20", "train.eval_every=0",
            "microbench.sizes=[4096,65536]", "microbench.repeats=2", "profile.enabled=false",
            "tracking.system_metrics=true"]
    run = subprocess.Popen([DDLBENCH, "run", str(SMOKE), "--run-key", "outage", "--home", str(home),
                            *(a for s in sets for a in ("--set", s))],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in run.stdout:
            seen.append(line)
            if "MLflow unavailable" in line:
                store.mkdir()  # the store is back
                break
        assert store.exists(), "".join(seen)[-3000:]
        rest = run.communicate(timeout=540)[0]
    finally:
        run.kill()
    assert run.returncode == 0, ("".join(seen) + rest)[-4000:]

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("ddlbench-adhoc")
    runs = {r.data.tags["ddlbench.node"]: r for r in client.search_runs([exp.experiment_id])}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert {"pipeline", "microbench", "train/lenet5-ssgd-allreduce-w2-b32-r0"} <= set(runs)
    trained = runs["train/lenet5-ssgd-allreduce-w2-b32-r0"].data.metrics
    assert any(k.startswith("system/") for k in trained), sorted(trained)
    assert Journal(home / "runs" / "outage").pending() == 0
