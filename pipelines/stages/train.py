"""Training one config and repeat of the grid, in fresh torchrun processes through the provider."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pipelines.context import RunContext
from pipelines.launch import JobFailed, launch, prepare
from pipelines.metrics import summary_metrics
from pipelines.spec import config_of, flatten, grid
from pipelines.stages.runner import cluster, cluster_handle, provider, run_once, tracker, write_json
from pipelines.tracking import Tracker
from pipelines.tracking.journal import now_ms
from pipelines.tracking.node_metrics import NodeMetrics
from training.gpt_shape import is_gpt
from training.measure.timeline import read_jsonl

TRAIN_ARTIFACTS = ("config.json", "summary.json", "metrics.jsonl", "timeline.jsonl", "trace.json", "launcher.log")
_CURVES = {
    "loss": "train/loss",
    "throughput_samples_per_s": "train/throughput_samples_per_s",
    "accuracy": "eval/accuracy",
    "test_loss": "eval/test_loss",
}
_TAGGED = ("model", "dataset", "algorithm", "comm", "workers", "batch_size")

Launch = Callable[[RunContext, Any, Path], dict[str, Any]]
# What fixes a run's data, besides its name: same values, same data (the seed orders it).
_DATA_FIELDS = ("dataset", "input_shape", "num_classes", "data_root", "synthetic_samples")


def dataset_entity(config: dict[str, Any]) -> dict[str, Any]:
    """The MLflow Dataset (name, digest, source) of a training config: the bundled digits come
    from scikit-learn, synthetic data from the generator, files from the data root."""
    from training.text import TEXT_DATASETS, corpus_fingerprint

    data = {k: config.get(k) for k in _DATA_FIELDS}
    if config["dataset"] == "synthetic":  # drawn from the run's seed
        data["seed"] = config.get("seed")
    if config["dataset"] in TEXT_DATASETS:  # the corpus's size and hash: the stdlib differs between Pythons
        data["seq_len"] = config.get("seq_len")
        data["corpus"] = corpus_fingerprint(config["dataset"])
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
    if config.get("data_root"):
        source_type, source = "local", {"uri": Path(config["data_root"]).resolve().as_uri()}
    else:
        origin = "sklearn.datasets.load_digits" if config["dataset"] == "digits" else f"ddlbench:{config['dataset']}"
        source_type, source = "code", {"tags": {"mlflow.source.name": origin}}
    profile = {k: v for k, v in data.items() if v is not None and k != "dataset"}
    return {
        "name": config["dataset"],
        "digest": digest,
        "source_type": source_type,
        "source": json.dumps(source),
        "profile": json.dumps(profile),
    }


def train_configs(ctx: RunContext) -> list[dict]:
    """The grid: [{"key", "config", "repeat"}], one entry per config and repeat.

    `start` writes it (grid.json) when it validates the spec; a run dir from before that is
    given its grid here, once.
    """
    path = ctx.paths.grid
    if not path.exists():
        write_json(path, grid(ctx.spec()))
    return json.loads(path.read_text())


def launch_job(ctx: RunContext, cfg: Any, out: Path) -> dict[str, Any]:
    """Run the training job on the run's cluster; its summary."""
    with cluster(ctx) as p:
        return launch(cfg, out, p, timeout_s=ctx.spec().train_timeout_s, echo=False)


def _metric_rows(metrics_path: Path, t0_ms: int) -> list[dict[str, Any]]:
    """Per-step curves from metrics.jsonl, stamped at the time each step happened."""
    rows = []
    for r in read_jsonl(metrics_path) if metrics_path.exists() else []:
        ts = t0_ms + int(1000 * (r.get("time_s") or 0.0))
        rows += [
            {"key": name, "value": float(r[k]), "step": int(r["step"]), "ts": ts}
            for k, name in _CURVES.items()
            if r.get(k) is not None
        ]
    return rows


@contextmanager
def _system_metrics(t: Tracker, node: str, ctx: RunContext) -> Iterator[None]:
    """CPU/memory/network sampled into the run while it trains, when MLflow is reachable: the
    host's (MLflow's monitor) and, on a multi-node cluster the provider can read, each node's
    own (pipelines/tracking/node_metrics.py).

    Sampled live, not journaled: when MLflow is down there is nothing to replay.
    """
    spec = ctx.spec()
    run_id = t.run_id(node)
    if not (spec.tracking.system_metrics and t.online and run_id):
        yield
        return
    from mlflow import MlflowClient
    from mlflow.entities import Metric
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=2, tracking_uri=t.tracking_uri)
    monitor.start()
    cluster_nodes, handle = provider(spec), cluster_handle(ctx)
    client = MlflowClient(tracking_uri=t.tracking_uri)

    def log(metrics: dict[str, float], step: int) -> None:
        stamp = now_ms()
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, step) for k, v in metrics.items()])

    per_node = None
    if handle and cluster_nodes.nodes > 1:
        with suppress(Exception):  # a cluster it cannot read has no per-node series, and trains
            cluster_nodes.adopt(handle)
            per_node = NodeMetrics(cluster_nodes.node_usage, log).start()
    try:
        yield
    finally:
        with suppress(Exception):  # samples are a nicety; never fail a run on them
            monitor.finish()
        if per_node is not None:
            per_node.stop()


def train(ctx: RunContext, entry: dict, launch: Launch = launch_job) -> dict:
    """One config and repeat of the grid, run by `launch` (fresh torchrun processes)."""
    key = entry["key"]
    node = f"train/{key}"
    out = ctx.paths.train(key)
    tags = {
        "ddlbench.config": config_of(key),
        "ddlbench.config_key": key,
        "ddlbench.repeat": entry["repeat"],
        **{f"ddlbench.{k}": entry["config"][k] for k in _TAGGED},
    }

    def body(t: Tracker, node: str) -> dict:
        from training.trainer import language_model_params

        spec = ctx.spec()
        cfg = prepare(entry["config"], source=f"train[{key}]")
        t.log_params(node, flatten(cfg.model_dump(mode="json")))
        placement = provider(spec).place(cfg.workers, cfg.servers)  # where its ranks run (DESIGN §5)
        t.log_params(node, flatten(placement.as_dict(), "placement."))
        t.set_tags(node, {"ddlbench.placement": placement.policy.value})
        t.log_input(node, dataset_entity(cfg.model_dump(mode="json")))
        if is_gpt(cfg.model):  # the resolved dimensions and token counts, not only the options given
            t.log_params(node, flatten(language_model_params(cfg), "language_model."))
        t0 = now_ms()
        try:
            with _system_metrics(t, node, ctx):
                summary = launch(ctx, cfg, out)
        except JobFailed:
            t.log_artifact(node, out / "launcher.log", "training")  # why it failed, next to the run
            raise
        t.log_metric_rows(node, _metric_rows(out / "metrics.jsonl", t0))
        t.log_metrics(node, summary_metrics(summary), step=summary.get("steps") or 0)
        for name in TRAIN_ARTIFACTS:
            if (out / name).exists():
                t.log_artifact(node, out / name, "training")
        for snapshot in sorted(out.glob("memory_snapshot.rank*.pickle")):  # asked for by train.memory_snapshot
            t.log_artifact(node, snapshot, "memory")
        return {"key": key, "run_dir": str(out), "mlflow_run_id": t.run_id(node), "status": "FINISHED"}

    result = run_once(ctx, node, body, node=node, tags=tags)
    if result.get("mlflow_run_id") is None:  # recorded while MLflow was down: it may be known now
        result["mlflow_run_id"] = tracker(ctx).run_id(node)
    return result
