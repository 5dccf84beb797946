"""The pieces the pipeline's stages share: the run directory's names, the summary <-> MLflow
metric mapping both ways, and a stage's journal reaching MLflow in one batched flush."""

from __future__ import annotations

from pathlib import Path

from pipelines.context import RunContext
from pipelines.metrics import summary_from_metrics, summary_metrics
from pipelines.tracking import Tracker
from pipelines.tracking.upload import groups

CTX = {
    "run_key": "k", "run_dir": "/tmp/h/runs/k", "home": "/tmp/h", "tracking_uri": "sqlite:////tmp/h/mlflow.db",
    "experiment": "ddlbench-adhoc", "parent_run_id": None, "spec_path": "/s.yaml", "spec_hash": "abc",
    "hardware": "cpu-local", "suite": "adhoc", "git_commit": None, "airflow": {},
}


def test_run_context_is_the_ctx_dict_and_names_the_run_dirs_paths() -> None:
    ctx = RunContext.model_validate(CTX)
    assert ctx.as_dict() == CTX
    root = Path(CTX["run_dir"])
    p = ctx.paths
    assert p.train("a-r0") == root / "train" / "a-r0"
    assert p.microbench(2) == root / "microbench" / "w2"
    assert p.profile("lenet5-b32") == root / "profile" / "lenet5-b32"
    assert (p.fit_model, p.predictions, p.validation) == (
        root / "fit" / "model.json", root / "predict" / "predictions.json", root / "validate" / "validation.json")
    assert (p.recorded("train/a-r0"), p.status, p.ctx) == (
        root / "steps" / "train" / "a-r0.json", root / "status.json", root / "ctx.json")


def test_summary_metrics_round_trip() -> None:
    summary = {"throughput_samples_per_s": 100.0, "final_accuracy": 0.9, "train_time_s": 3.0,
               "iter_time_s": {"p50": 0.01, "p90": 0.02},
               "breakdown_s": {"data": 0.001, "forward": 0.002, "backward": 0.003, "comm_exposed": 0.0, "update": 0.1},
               "staleness": {"mean": 1.5, "max": 3}, "model": "lenet5"}
    metrics = summary_metrics(summary)
    assert metrics["iter_time_p50_s"] == 0.01 and metrics["forward_s"] == 0.002
    assert metrics["staleness_max_steps"] == 3 and "model" not in metrics
    back = summary_from_metrics(metrics)
    assert back["iter_time_s"] == summary["iter_time_s"]
    assert back["breakdown_s"] == summary["breakdown_s"]
    assert back["staleness"] == summary["staleness"]
    assert {k: back[k] for k in ("throughput_samples_per_s", "final_accuracy", "train_time_s")} == {
        "throughput_samples_per_s": 100.0, "final_accuracy": 0.9, "train_time_s": 3.0}



def test_summary_metrics_carry_the_largest_ranks_memory_and_each_ranks_peak() -> None:
    ranks = [{"rank": 0, "role": "worker", "peak_bytes": 900, "peak_rss_bytes": 9000, "breakdown": {}},
             {"rank": 1, "role": "server", "peak_bytes": 300, "peak_rss_bytes": 8000, "breakdown": {}}]
    summary = {"memory": {"peak_bytes": 900, "peak_rss_bytes": 9000, "reserved_bytes": None, "breakdown": {},
                          "ranks": ranks}}
    assert {k: v for k, v in summary_metrics(summary).items() if k.startswith("memory.")} == {
        "memory.peak_bytes": 900, "memory.peak_rss_bytes": 9000,
        "memory.rank0.peak_bytes": 900, "memory.rank1.peak_bytes": 300}
    assert not any(k.startswith("memory.") for k in summary_metrics({"final_loss": 1.0}))

def test_groups_batch_one_nodes_params_metrics_tags_and_keep_a_changed_param_apart() -> None:
    entries = [
        {"op": "start_run", "node": "a"},
        {"op": "params", "node": "a", "params": {"x": "1"}},
        {"op": "metrics", "node": "a", "metrics": []},
        {"op": "tags", "node": "a", "tags": {}},
        {"op": "params", "node": "a", "params": {"x": "2"}},
        {"op": "metrics", "node": "b", "metrics": []},
        {"op": "artifact", "node": "b"},
        {"op": "end_run", "node": "b"},
    ]
    got = [[e["op"] + ":" + e["node"] for _, e in g] for g in groups(enumerate(entries, 1))]
    assert got == [["start_run:a"], ["params:a", "metrics:a", "tags:a"], ["params:a"], ["metrics:b"],
                   ["artifact:b"], ["end_run:b"]]


def test_a_batch_uploads_once_at_its_end_and_a_started_run_at_once(tmp_path: Path, monkeypatch) -> None:
    t = Tracker(tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}", "ddlbench-adhoc", "k")
    flushes = []
    real = t.flush
    monkeypatch.setattr(t, "flush", lambda force=False: flushes.append(t.journal.pending()) or real(force))
    with t.batch():
        t.start_run("pipeline", "k", parent=None)
        assert t.run_id("pipeline") is not None
        for step in range(20):
            t.log_metrics("pipeline", {"loss": 1.0 / (step + 1)}, step=step)
        t.set_tags("pipeline", {"x": "1"})
        t.end_run("pipeline")
        assert t.journal.pending() == 22
    assert flushes == [1, 22] and t.journal.pending() == 0
    run = t.client.get_run(t.run_id("pipeline"))
    assert run.info.status == "FINISHED" and run.data.tags["x"] == "1"
    assert len(t.client.get_metric_history(run.info.run_id, "loss")) == 20
