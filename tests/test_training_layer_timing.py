"""In-situ per-layer timing (training/measure/layer_timing.py) in real training jobs."""

from __future__ import annotations

import json
import statistics

import pytest

from modelling.measure.layers import load_layers
from training.measure.layer_timing import EVERY_ENV, INSITU_FILE
from training.measure.timeline import read_jsonl
from training.models import build_model

from .trainjobs import run_job


def _span(rec: dict, phase: str) -> float:
    s = rec["phases"].get(phase)
    return s[1] - s[0] if s else 0.0


@pytest.mark.slow  # torchrun jobs
@pytest.mark.parametrize(("algorithm", "comm", "servers", "every"), [
    ("ssgd", "allreduce", 0, 4), ("odsgd", "ps", 1, 7),
])
def test_insitu_table_from_the_run(tmp_path, monkeypatch, algorithm, comm, servers, every):
    """The lead worker writes a layer table in layers.json's format: lenet5's parameter-owning
    layers in execution order, every every-th measured iteration sampled, and the layers adding
    up to the rank's own median forward and backward over its measured iterations."""
    monkeypatch.setenv(EVERY_ENV, str(every))
    steps, warmup = 30, 2
    run_job(tmp_path, algorithm=algorithm, comm=comm, workers=2, servers=servers, steps=steps,
            batch_size=16, measure_warmup=warmup)
    table = load_layers(tmp_path / INSITU_FILE)  # checks the layers.json format
    owners = [n for n, m in build_model("lenet5", (1, 28, 28), 10).named_modules()
              if any(True for _ in m.parameters(recurse=False))]
    assert [r["name"] for r in table["layers"]] == owners
    assert table["sampled_iterations"] == len(range(warmup, steps, every))
    assert table["measured_iterations"] == steps - warmup
    mine = [r for r in read_jsonl(tmp_path / "timeline.jsonl") if r["rank"] == 0 and r["step"] >= warmup]
    forward = statistics.median(_span(r, "forward") for r in mine)
    backward = statistics.median(_span(r, "backward") for r in mine)
    assert sum(r["fwd_s"] for r in table["layers"]) == pytest.approx(forward, rel=1e-9)
    assert sum(r["bwd_s"] for r in table["layers"]) == pytest.approx(backward, rel=1e-9)
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 for r in table["layers"])
    assert table["data_s"] == pytest.approx(statistics.median(_span(r, "data") for r in mine), rel=1e-9)
    assert len(table["iteration_samples_s"]) == steps - warmup


@pytest.mark.slow  # a torchrun job
def test_no_sampling_writes_no_table(tmp_path, monkeypatch):
    """k = 0 switches sampling off: no hooks, no table (the overhead benchmark's baseline)."""
    monkeypatch.setenv(EVERY_ENV, "0")
    summary, _ = run_job(tmp_path, workers=1, steps=6, batch_size=16)
    assert summary["status"] == "completed"
    assert not (tmp_path / INSITU_FILE).exists()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
