"""Entry point of every rank started by torchrun: `python -m training.run OUT_DIR`.

Ranks 0..N-1 are workers, ranks N..N+S-1 parameter-server shards. The job's
config is `OUT_DIR/config.json`, written (and validated) by the launcher.
Rank 0 gathers every rank's timeline and counters and writes `summary.json`,
`timeline.jsonl` and `trace.json`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from training.config import Comm, TrainConfig
from training.ps import ServerConfig, ShardLayout, serve
from training.summary import environment, staleness_figures, timing_figures
from training.timeline import Timeline, to_chrome_trace, write_jsonl


def _setup(cfg: TrainConfig) -> tuple[int, Any, Any, torch.device]:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise RuntimeError(f"torchrun started {world} ranks but the config needs {cfg.world_size}")
    torch.set_num_threads(cfg.threads)
    timeout = timedelta(seconds=cfg.timeout_s)
    device = torch.device("cpu")
    if cfg.device.value == "cuda" and rank < cfg.workers:
        local = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if cfg.device.value == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timeout)
    # Point-to-point (PS traffic) and control messages always go over gloo.
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if cfg.device.value == "cuda" else dist.group.WORLD
    workers_group = dist.new_group(ranks=list(range(cfg.workers)), timeout=timeout)
    return rank, ctrl, workers_group, device


def _barrier(group) -> None:
    dist.all_reduce(torch.zeros(1), group=group)


def _job_shape(cfg: TrainConfig, rank: int, trainer, group) -> tuple[int, int]:
    """Rank 0 resolves epochs into steps and counts the parameters; every rank,
    servers too, learns both."""
    from training.trainer import resolve_steps

    shape = torch.zeros(2, dtype=torch.long)
    if rank == 0:
        shape[0] = resolve_steps(cfg, len(trainer.train_set))
        shape[1] = sum(p.numel() for p in trainer.strategy.params)
    dist.broadcast(shape, src=0, group=group)
    return int(shape[0]), int(shape[1])


def run(out: Path) -> int:
    cfg = TrainConfig.model_validate_json((out / "config.json").read_text())
    rank, ctrl, workers_group, device = _setup(cfg)
    is_worker = rank < cfg.workers
    trainer = None
    if is_worker:
        from training.trainer import Trainer

        epoch_probe = Timeline(rank, "worker", time.monotonic())
        trainer = Trainer(cfg, rank, epoch_probe, device, workers_group, ctrl, out)
    steps, numel = _job_shape(cfg, rank, trainer, ctrl)
    _barrier(ctrl)
    epoch = time.monotonic()  # the common epoch of every rank's timeline
    result: dict[str, Any] = {"rank": rank}
    if is_worker:
        trainer.timeline.epoch = epoch
        result |= trainer.run(steps)
        result |= {"role": "worker", "records": trainer.timeline.records,
                   "traffic": trainer.strategy.stats.as_dict()}
    else:
        tl = Timeline(rank, "server", epoch)
        shard = rank - cfg.workers
        layout = ShardLayout.even(numel, cfg.servers)
        sc = ServerConfig(
            shard=shard, workers=cfg.workers, steps=steps,
            mode="async" if cfg.algorithm.value == "asgd" else "sync",
            lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
            lr_async=cfg.effective_lr_async, timeout_s=cfg.timeout_s,
        )
        stats = serve(sc, layout, ctrl, tl)
        result |= {"role": "server", "records": tl.records, "traffic": stats.as_dict()}
    gathered: list[Any] | None = [None] * cfg.world_size if rank == 0 else None
    dist.gather_object(result, gathered, dst=0, group=ctrl)
    if rank == 0:
        _write_outputs(cfg, out, steps, gathered)
    dist.destroy_process_group()
    return 0


def _write_outputs(cfg: TrainConfig, out: Path, steps: int, results: list[dict[str, Any]]) -> None:
    records = sorted((r for res in results for r in res["records"]), key=lambda r: (r["rank"], r["step"]))
    write_jsonl(out / "timeline.jsonl", records)
    (out / "trace.json").write_text(json.dumps(to_chrome_trace(records)))
    lead = results[0]
    workers = [r for r in results if r["role"] == "worker"]
    servers = [r for r in results if r["role"] == "server"]
    summary: dict[str, Any] = {
        "status": "completed",
        "algorithm": cfg.algorithm.value,
        "comm": cfg.comm.value,
        "overlap": cfg.overlap if cfg.comm == Comm.allreduce else None,
        "workers": cfg.workers,
        "servers": cfg.servers,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "batch_size": cfg.batch_size,
        "global_batch_size": cfg.batch_size * cfg.workers,
        "steps": steps,
        **timing_figures(cfg, records, steps),
        "train_time_s": max(w["train_time_s"] for w in workers),
        "final_loss": lead["final_loss"],
        "final_test_loss": lead["final_test_loss"],
        "final_accuracy": lead["final_accuracy"],
        "target_accuracy": cfg.target_accuracy,
        "time_to_accuracy_s": lead["time_to_accuracy_s"],
        "parameters": lead["parameters"],
        "parameter_bytes": lead["parameter_bytes"],
        "staleness": staleness_figures([s["traffic"]["staleness"] for s in servers])
        if cfg.algorithm.value == "asgd" else None,
        "bytes_sent": {str(w["rank"]): w["traffic"]["bytes_sent"] for w in workers},
        "bytes_received": {str(w["rank"]): w["traffic"]["bytes_received"] for w in workers},
        "environment": environment(cfg),
        "config": json.loads(cfg.model_dump_json()),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


@record
def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m training.run OUT_DIR (started by torchrun)", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
