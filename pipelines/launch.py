"""Validate a training job completely, then launch it through a provider.

Everything that can be checked without starting ranks is checked here, so bad
input fails before any process starts, with a message naming the option.
"""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path
from typing import Any

from infra import Job, JobResult, Provider
from infra.hostload import CpuProbe
from pipelines.disk import disk_full, free_bytes
from training import heartbeat
from training.config import ConfigError, TrainConfig, build_config

_NEARLY_FULL = 64 << 10  # free bytes below which a failed job's filesystem is taken to be full


class OutputError(RuntimeError):
    """The output directory cannot be written (full disk, permissions)."""


class JobFailed(RuntimeError):
    """A job that failed; `lead`, when known, is the first line: which rank stopped making
    progress and which ranks timed out waiting for it (training/heartbeat.py): the rank that
    ended the job while it ran, or the one the ranks' last beats show behind the rest."""

    def __init__(self, result: JobResult, lead: str | None = None) -> None:
        super().__init__("\n".join(filter(None, [lead, result.describe_failure()])))
        self.result, self.lead = result, lead


def prepare(values: dict[str, Any], source: str = "config") -> TrainConfig:
    """A validated config whose model, dataset and shapes are known to work."""
    cfg = build_config(values, source)
    # torch's modules: imported when a job is checked, never when a DAG file is parsed
    from training.datasets import check_dataset
    from training.inject import check_where
    from training.models import check_model_name
    from training.shape import batch_fits

    try:
        check_model_name(cfg.model)
        check_dataset(cfg)
        _check_model_builds(cfg)
        check_where(cfg)
    except ValueError as err:
        raise ConfigError(f"{source}.{err}") from None
    if too_big := batch_fits(cfg, source):  # a rank would find it only after every import
        raise ConfigError(too_big)
    return cfg


def _filled(out: Path, raised: dict[int, str]) -> bool:
    """Whether a failed job failed for want of space: a rank said so, or (its failure text
    unwritable too) the output's filesystem has next to nothing left."""
    said = any("No space left on device" in cause or "Disk quota exceeded" in cause for cause in raised.values())
    return said or free_bytes(out) < _NEARLY_FULL


def _check_model_builds(cfg: TrainConfig) -> None:
    from training.models import check_model_trains
    from training.shape import resolve_input_shape
    from training.text import corpus_vocab

    check_model_trains(cfg.model, resolve_input_shape(cfg), cfg.num_classes or corpus_vocab(cfg.dataset),
                       cfg.batch_size, cfg.model_options)


def _timed_launch(startup: dict[str, Any], launched_at: float, ended_at: float) -> None:
    """The launcher's part of a job's fixed cost, beside the ranks' (training/run.py
    startup_figures): `launch` (the provider, torchrun's agent and the interpreter, until the
    first rank's module starts), the whole way to training (`to_training_s`), and the way out
    after the outputs are written (`teardown_s`: the ranks' and agents' exit)."""
    startup["parts_s"] = {"launch": startup["started_at"] - launched_at, **startup["parts_s"]}
    startup["to_training_s"] = startup["training_at"] - launched_at
    startup["teardown_s"] = ended_at - startup["written_at"]


def launch(cfg: TrainConfig, out: Path, provider: Provider, timeout_s: float | None = None,
           echo: bool = True) -> dict[str, Any]:
    """Run the job; return its summary, or raise JobFailed naming the failed ranks.

    A rerun in the same directory resumes from its latest complete checkpoint.
    A run whose loss became NaN/inf returns a summary with status "diverged".
    """
    try:
        return _launch(cfg, out, provider, timeout_s, echo)
    except OSError as err:
        if full := disk_full(err, out):
            raise OutputError(f"{full}; what was written before is kept") from full
        raise OutputError(f"output directory {out}: {err.strerror} ({err.filename or 'a run file'}); "
                          "what was written before is kept") from None


def _launch(cfg: TrainConfig, out: Path, provider: Provider, timeout_s: float | None, echo: bool) -> dict[str, Any]:
    from training.checkpoint import CheckpointStore
    from training.run import DIVERGED

    out.mkdir(parents=True, exist_ok=True)
    store = CheckpointStore(out, cfg)
    if done := store.latest():  # a foreign or corrupted checkpoint fails here, before launching
        try:
            for rank in range(cfg.world_size):
                store.load(done, rank)
        except Exception as err:
            raise ConfigError(f"checkpoint: {err}") from None
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    stale = ["summary.json", "timeline.jsonl", "trace.json", DIVERGED, *(p.name for p in out.glob("failure-rank*"))]
    for name in stale:
        (out / name).unlink(missing_ok=True)
    heartbeat.clear(out)
    job = Job(module="training.run", args=[str(out.resolve())], world_size=cfg.world_size, servers=cfg.servers,
              log_path=out / "launcher.log", timeout_s=timeout_s, max_restarts=cfg.max_restarts)
    placement = provider.place_job(job).as_dict()
    (out / "placement.json").write_text(json.dumps(placement, indent=2))
    probe = CpuProbe() if provider.measures_host_load else None
    # A rank that stops beating ends the job, whether or not a peer waits for it (ASGD's don't).
    launched_at = time.time()
    with heartbeat.Watch(out, cfg.timeout_s, on_stall=job.cancel.set) as watch:
        result = provider.run(job, echo=echo)
    ended_at = time.time()
    summary_path = out / "summary.json"
    if (out / DIVERGED).exists():
        summary = {"status": "diverged", **json.loads((out / DIVERGED).read_text()),
                   "config": json.loads(cfg.model_dump_json()), "placement": placement}
        summary_path.write_text(json.dumps(summary, indent=2))
        return summary
    if not result.ok or not summary_path.exists():
        raised = {int(p.stem.removeprefix("failure-rank")): p.read_text().strip()
                  for p in out.glob("failure-rank*.txt")}
        result.causes = [raised[r] for r in sorted(raised)]
        if _filled(out, raised):  # a rank that could not write its outputs
            raise OSError(errno.ENOSPC, "No space left on device", str(out))
        stopped = watch.stopped or heartbeat.stalled(watch.beats(), cfg.timeout_s)
        raise JobFailed(result, heartbeat.describe_stall(stopped, raised) if stopped else None)
    summary = json.loads(summary_path.read_text())
    summary["placement"] = placement  # where the ranks ran (DESIGN §4: every result carries it)
    if start := summary.get("startup"):
        _timed_launch(start, launched_at, ended_at)
    env = summary.setdefault("environment", {})
    env["placement"] = placement["policy"]
    # The CPU share of the host that other work took while the job ran (None: not measurable here).
    env["host_other_cpu_share"] = probe.other_share() if probe else None
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary
