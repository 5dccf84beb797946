"""`ddlbench run` of the nightly spec reduced to its GPT workload (gpt-tiny with 3 blocks,
fewer steps, one repeat, 2 workers, smaller measurements) ends FINISHED, with tokens/s, MFU, the model's dimensions
and token counts, the corpus's hash and predictions in a real SQLite MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training.text import corpus_fingerprint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parent.parent
KEY = "gpt-e2e"


def _reduced_nightly(tmp_path: Path) -> Path:
    spec = yaml.safe_load((REPO / "specs" / "nightly-cpu.yaml").read_text())
    gpt = [w for w in spec["workloads"] if w["model"].startswith("gpt")]
    assert gpt, "the nightly spec trains a GPT"
    spec |= {
        "name": "gpt-e2e",
        "suite": "adhoc",
        "workloads": [gpt[0] | {"model": "gpt-tiny", "n_layer": 3, "target_loss": 4.5}],
        "algorithms": [a for a in spec["algorithms"] if a["name"] in ("ssgd", "odsgd")][::2],
        "workers": [2],
        "batch_sizes": [8],
        "steps": 12,
        "repeats": 1,
        "what_if": {"workers": [4]},
        "microbench": {"sizes": [4096, 65536, 1048576], "repeats": 2, "timeout_s": 300},
        "profile": {"warmup": 1, "repeats": 3},
    }
    spec["train"] |= {"eval_every": 6, "measure_warmup": 2}
    path = tmp_path / "gpt-e2e.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_nightly_run_of_the_gpt_finishes_with_tokens_mfu_and_predictions(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"COLUMNS": "250"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ddlbench"), "run", str(_reduced_nightly(tmp_path)),
         "--run-key", KEY, "--home", str(home)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_home(home)


def check_home(home: Path) -> None:
    """What the run left in its home and its MLflow store."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-adhoc")
    runs = {r.data.tags["ddlbench.node"]: r
            for r in client.search_runs([exp.experiment_id], f"tags.`ddlbench.run_key` = '{KEY}'", max_results=50)}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    trained = [n for n in runs if n.startswith("train/")]
    assert len(trained) == 2 and all(n.startswith("train/gpt-tiny-L3-T32-") for n in trained)
    fingerprint = corpus_fingerprint("stdlib-text")
    for node in trained:
        run = runs[node]
        summary = json.loads((home / "runs" / KEY / "train" / node.removeprefix("train/") / "summary.json").read_text())
        m, params = run.data.metrics, run.data.params
        assert m["throughput_tokens_per_s"] == pytest.approx(summary["throughput_tokens_per_s"])
        assert m["throughput_tokens_per_s"] == pytest.approx(32 * summary["throughput_samples_per_s"])
        assert m["mfu"] == pytest.approx(summary["mfu"]) and 0 < m["mfu"] < 1
        assert m["final_perplexity"] == pytest.approx(summary["final_perplexity"])
        assert (params["language_model.n_layer"], params["language_model.d_model"], params["language_model.n_head"],
                params["language_model.seq_len"], params["language_model.vocab_size"]) == ("3", "32", "2", "32", "256")
        lm = summary["language_model"]
        assert params["language_model.train_tokens"] == str(lm["train_tokens"])
        assert params["language_model.tokens_per_step"] == str(2 * 8 * 32)
        assert params["language_model.flops_per_token"] == str(lm["flops_per_token"])
        [data] = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert data.dataset.name == "stdlib-text"
        assert json.loads(data.dataset.profile)["corpus"]["sha256"] == fingerprint["sha256"]
        assert json.loads(data.dataset.profile)["corpus"]["bytes"] == fingerprint["bytes"]
    # The validation compared both trained runs, each against its own measured iteration, and
    # its MLflow run carries the figure validation.json holds.
    val = json.loads((home / "runs" / KEY / "validate" / "validation.json").read_text())
    assert len(val["runs"]) == len(val["configs"]) == 2 and val["configs_without_prediction"] == 0
    for row in val["runs"]:
        summary = json.loads((home / "runs" / KEY / "train" / row["run"] / "summary.json").read_text())
        assert row["measured_iter_s"] == summary["iter_time_s"]["p50"] > 0
        assert row["predicted_iter_s"] > 0 and row["error"] is not None
    assert runs["validate"].data.metrics["median_abs_error"] == pytest.approx(val["median_abs_error"])
    layers = json.loads(next((home / "runs" / KEY / "profile").glob("*/layers.json")).read_text())
    # The profile is of the model trained: the workload's n_layer reaches it.
    assert [r["name"] for r in layers["layers"]] == ["embed", "blocks.0", "blocks.1", "blocks.2", "head"]
    md = (home / "runs" / KEY / "report" / "report.md").read_text()
    assert "## Language models" in md and "tokens/s | MFU" in md
