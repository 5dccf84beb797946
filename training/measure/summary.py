"""Turn the gathered timelines and counters into `summary.json` figures."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from training.config import TrainConfig
from training.measure.peak import measure_peak_flops, mfu
from training.measure.timeline import WORKER_PHASES


def _by_worker(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r["role"] == "worker":
            by_rank.setdefault(r["rank"], []).append(r)
    return {k: sorted(v, key=lambda r: r["step"]) for k, v in sorted(by_rank.items())}


def iteration_times(records: list[dict[str, Any]], skip: int) -> list[float]:
    """Per-worker iteration periods (end to end), warm-up iterations skipped."""
    out: list[float] = []
    for recs in _by_worker(records).values():
        for i, r in enumerate(recs):
            if r["step"] < skip:
                continue
            out.append(r["end"] - (recs[i - 1]["end"] if i else r["start"]))
    return out


def shared_paces(ends: list[list[float]], last: float = 1.0,
                 pauses: list[list[float]] | None = None) -> list[float] | None:
    """Each worker's period while every worker is running, from their iteration end times.

    The window spans whole iterations of the slowest worker (the last `last` fraction of
    those that fall where all workers run), and each worker's period is the window over the
    iterations it made in it, its iteration index interpolated between its own ends at the
    window's edges (so a worker that ends each iteration a hair before or after the slowest
    one, as synchronous ones do, counts neither one too many nor one too few). Without a
    barrier (ASGD) the workers keep their own paces: the one beside a colocated shard may
    step twice per step of a remote one, in alternating short and long iterations, so
    neither the pooled median nor its own median is its pace, and a fast worker's steps
    after a slow one has stopped are not. None where the window holds fewer than two of the
    slowest worker's iteration ends.

    `pauses` ([start, end] intervals: the lead worker's evaluations) are not training: the
    evaluating worker stops stepping, and the others meanwhile step against shards it leaves
    to them. The paces are then read in the stretches between pauses (each its own window,
    the whole of it) and pooled: the windows' time over the iterations made in them."""
    if not pauses:
        window = _window(ends, last)
        return None if window is None else [window[0] / n for n in window[1]]
    edges = [-np.inf, *(t for p in sorted(pauses) for t in p), np.inf]
    total, made = 0.0, [0.0] * len(ends)
    for a, b in zip(edges[::2], edges[1::2], strict=True):
        window = _window([[t for t in e if a <= t <= b] for e in ends], 1.0)
        if window is not None:
            total += window[0]
            made = [m + n for m, n in zip(made, window[1], strict=True)]
    return None if total <= 0 or min(made) <= 0 else [total / n for n in made]


def _window(ends: list[list[float]], last: float) -> tuple[float, list[float]] | None:
    """`shared_paces`' window: its length and the iterations each worker made in it."""
    if not ends or any(len(e) < 2 for e in ends):
        return None
    lo, hi = max(e[0] for e in ends), min(e[-1] for e in ends)
    slow = min(([t for t in e if lo <= t <= hi] for e in ends), key=len)
    slow = slow[len(slow) - max(2, round(len(slow) * last)):]
    if len(slow) < 2:
        return None
    t0, t1 = slow[0], slow[-1]
    made = [float(np.diff(np.interp([t0, t1], e, np.arange(len(e))))[0]) for e in ends]
    return None if min(made) <= 0 else (t1 - t0, made)


def worker_paces(records: list[dict[str, Any]], skip: int) -> list[float]:
    """`shared_paces` of the measured iterations (each worker's ends from the last warm-up
    iteration's on), the evaluations that follow some of them (`eval`) left out."""
    ends = [[r["end"] for r in recs if r["step"] >= skip - 1] for recs in _by_worker(records).values()]
    pauses = [r["eval"] for r in records if r.get("eval")]
    return shared_paces(ends, pauses=pauses) or []


def timing_figures(cfg: TrainConfig, records: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    skip = min(cfg.measure_warmup, steps - 1)
    workers = [r for r in records if r["role"] == "worker"]
    periods = iteration_times(records, skip)
    paces = worker_paces(records, skip)
    measured = [r for r in workers if r["step"] >= skip]
    if skip:
        start = min(r["end"] for r in workers if r["step"] == skip - 1)
    else:
        start = min(r["start"] for r in workers if r["step"] == 0)
    end = max(r["end"] for r in workers)
    samples = len(measured) * cfg.batch_size
    breakdown = {}
    for phase in WORKER_PHASES:
        spans = [r["phases"].get(phase) for r in measured]
        breakdown[phase] = sum((s[1] - s[0]) for s in spans if s) / max(len(measured), 1)
    return {
        "throughput_samples_per_s": samples / (end - start) if end > start else None,
        "iter_time_s": {
            "p50": float(np.percentile(periods, 50)) if periods else None,
            "p95": float(np.percentile(periods, 95)) if periods else None,
            "mean": statistics.fmean(periods) if periods else None,
            "stdev": statistics.stdev(periods) if len(periods) > 1 else 0.0,
            "worker_paces": paces,
            "worker_mean": statistics.fmean(paces) if paces else None,
        },
        "breakdown_s": breakdown,
        "measured_steps": steps - skip,
        "warmup_steps_excluded": skip,
    }


def staleness_figures(per_shard: list[dict[int, int]]) -> dict[str, Any] | None:
    total: dict[int, int] = {}
    for hist in per_shard:
        for k, v in hist.items():
            total[int(k)] = total.get(int(k), 0) + v
    if not total:
        return None
    n = sum(total.values())
    return {
        "histogram": {str(k): total[k] for k in sorted(total)},
        "mean": sum(k * v for k, v in total.items()) / n,
        "max": max(total),
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(cfg: TrainConfig) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available() and cfg.device.value == "cuda"
    return {
        "git_commit": os.environ.get("DDLBENCH_GIT_COMMIT") or _git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "device": cfg.device.value,
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_model": torch.cuda.get_device_name() if cuda else None,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "world_size": cfg.world_size,
        "link_bandwidth": cfg.link_bandwidth,
        "threads_per_process": cfg.threads,
    }


def language_model_figures(cfg: TrainConfig, lead: dict[str, Any], samples_per_s: float | None) -> dict[str, Any]:
    """tokens/s, MFU and perplexity of a language model (None for a classifier).

    MFU = flops_per_token * tokens/s / (peak * workers): the model's training FLOPs per token
    (training/gpt_shape.py: 6 N + 12 n_layer d_model seq_len) at the measured token rate, over
    the peak of one worker's device (`peak_flops`, else a GEMM benchmark at the workers'
    threads, training/measure/peak.py) times the workers."""
    lm = lead["language_model"]
    if lm is None:
        return {"throughput_tokens_per_s": None, "mfu": None, "peak_flops": None, "final_perplexity": None,
                "language_model": None}
    tokens_per_s = samples_per_s * lm["seq_len"] if samples_per_s else None
    if cfg.peak_flops:
        peak: dict[str, Any] = {"flops_per_s": cfg.peak_flops, "source": "option"}
    else:
        peak = measure_peak_flops(cfg.device.value, threads=cfg.threads)
    return {
        "throughput_tokens_per_s": tokens_per_s,
        "mfu": mfu(lm["flops_per_token"], tokens_per_s, peak["flops_per_s"], cfg.workers) if tokens_per_s else None,
        "peak_flops": peak,
        "final_perplexity": math.exp(min(lead["final_test_loss"], 700.0)),
        "language_model": lm,
    }
