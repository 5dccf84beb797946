"""Entry point of every rank a job's agent starts: `python -m training.run OUT_DIR`.

Ranks 0..N-1 are workers, ranks N..N+S-1 parameter-server shards. The job's
config is `OUT_DIR/config.json`, written (and validated) by the launcher.
Rank 0 gathers every rank's timeline and counters and writes `summary.json`,
`timeline.jsonl` and `trace.json`.
"""

from __future__ import annotations

import time

_STARTED_AT = time.time()  # this rank's module starts: its start-up's parts count from here

if __name__ == "__main__":  # a rank: end with its agent, set before the seconds of importing torch
    from infra.lifeline import die_with_agent

    die_with_agent()

import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.rendezvous import rendezvous

from training.checkpoint import CheckpointStore
from training.config import Algorithm, Comm, TrainConfig
from training.heartbeat import Heartbeat
from training.measure import canary as host_canary
from training.measure import memory
from training.measure.summary import environment, language_model_figures, staleness_figures, timing_figures
from training.measure.timeline import Timeline, to_chrome_trace, write_jsonl
from training.ps import ServerConfig, ShardLayout, ShardServer
from training.shape import resolve_steps
from training.trainer import Diverged, Trainer

DIVERGED = "diverged.json"  # written by the rank that saw a NaN/inf loss
EXIT_DIVERGED = 3  # a rank's exit status, and `ddlbench train`'s, for a loss that became NaN/inf
STARTUP_TIMEOUT_S = 300.0  # the longest the ranks wait for each other's set-up


def _setup(cfg: TrainConfig) -> tuple[int, Any, Any, Any, torch.device]:
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise RuntimeError(f"the launcher started {world} ranks but the config needs {cfg.world_size}")
    torch.set_num_threads(cfg.threads)
    timeout = timedelta(seconds=cfg.timeout_s)
    device = torch.device("cpu")
    if cfg.device.value == "cuda" and rank < cfg.workers:
        local = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if cfg.device.value == "cuda" else "gloo"
    # The agent's store outlives a restart: a per-attempt prefix keeps a restarted
    # job from reading the addresses of the ranks it replaced.
    store, _, _ = next(rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"ddlbench/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)
    # Point-to-point (PS traffic) and control messages always go over gloo.
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if cfg.device.value == "cuda" else dist.group.WORLD
    workers_group = dist.new_group(ranks=list(range(cfg.workers)), timeout=timeout)
    startup = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(cfg.timeout_s, STARTUP_TIMEOUT_S)))
    return rank, ctrl, workers_group, startup, device


def _barrier(group) -> None:
    dist.all_reduce(torch.zeros(1), group=group)


def _job_shape(cfg: TrainConfig, rank: int, trainer, group) -> tuple[int, int]:
    """Rank 0 resolves epochs into steps and counts the parameters; every rank,
    servers too, learns both."""
    shape = torch.zeros(2, dtype=torch.long)
    if rank == 0:
        shape[0] = resolve_steps(cfg, len(trainer.train_set))
        shape[1] = sum(p.numel() for p in trainer.strategy.params)
    dist.broadcast(shape, src=0, group=group)
    return int(shape[0]), int(shape[1])


def run(out: Path) -> int:
    marks = {"started": _STARTED_AT, "imported": time.time()}  # wall clock: the launcher's is the same host's
    cfg = TrainConfig.model_validate_json((out / "config.json").read_text())
    if (out / DIVERGED).exists():  # a torchrun restart of a diverged job: diverged again
        return EXIT_DIVERGED
    rank, ctrl, workers_group, startup, device = _setup(cfg)
    marks["process_group"] = time.time()
    is_worker = rank < cfg.workers
    role = "worker" if is_worker else "server"
    tl = Timeline(rank, role, time.monotonic())
    store = CheckpointStore(out, cfg)
    trainer = server = None
    heartbeat = Heartbeat(out, rank, role, tl).start()  # names this rank if it stops (pipelines/launch.py)
    try:
        if is_worker:
            trainer = Trainer(cfg, rank, tl, device, workers_group, ctrl, out)
        # Set-up (model, data, a shard's buffers, a checkpoint's load) takes seconds more on a busy
        # host, and unevenly: its waits are on the start-up group, with a start-up allowance.
        steps, numel = _job_shape(cfg, rank, trainer, startup)
        if not is_worker:
            is_async = cfg.algorithm == Algorithm.asgd
            sc = ServerConfig(
                shard=rank - cfg.workers, workers=cfg.workers, steps=steps,
                mode="async" if is_async else "sync",
                lr=cfg.effective_lr_async if is_async else cfg.lr,
                momentum=cfg.effective_momentum_async if is_async else cfg.momentum,
                weight_decay=cfg.weight_decay, timeout_s=cfg.timeout_s,
            )
            server = ShardServer(sc, ShardLayout.even(numel, cfg.servers), ctrl, tl)
        marks["set_up"] = time.time()
        done = _agree(store.latest() if rank == 0 else 0, startup)
        clock = 0.0
        if done:
            state = store.load(done, rank)
            if is_worker:
                clock = trainer.load_checkpoint_state(state)
            else:
                server.load_state_dict(state["server"])
                tl.records, clock = list(state["records"]), state["clock"]
            print(f"rank {rank}: resumed from the checkpoint after step {done}", flush=True)
        canary = host_canary.Canary(device, rank)
        _barrier(startup)  # every rank times the canary at once, as they will train
        canary.run("before")
        _barrier(startup)
        tl.epoch = time.monotonic() - clock  # the common clock, continued across a resume
        marks["canary"] = time.time()

        def on_step(t: int) -> None:
            if not (cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0 and t + 1 < steps):
                return
            tl.current = f"checkpoint after step {t}"
            if is_worker:
                state = trainer.checkpoint_state(trainer.loss_value)
            else:
                state = {"server": server.state_dict(), "records": tl.records, "clock": tl.now()}
            store.save(t + 1, rank, state)
            _barrier(ctrl)
            if rank == 0:
                store.mark_complete(t + 1, cfg.keep_checkpoints)

        result: dict[str, Any] = {"rank": rank, "role": role}
        if is_worker:
            result |= trainer.run(steps, done, on_step)
            result["traffic"] = trainer.strategy.stats.as_dict()
        else:
            if not done:
                server.receive_initial()
            server.run(done, on_step)
            result["traffic"] = server.stats.as_dict()
            result["memory"] = memory.held_figures(rank, role, server.held_state())
        _barrier(ctrl)
        canary.run("after")
        result["records"], result["canary"], result["startup"] = tl.records, canary.result(), marks
        gathered: list[Any] | None = [None] * cfg.world_size if rank == 0 else None
        tl.current = "gathering results"
        dist.gather_object(result, gathered, dst=0, group=ctrl)
    except Diverged as err:
        (out / DIVERGED).write_text(json.dumps({"rank": rank, "step": err.step, "loss": str(err.loss)}))
        print(f"rank {rank}: diverged: {err}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    except Exception as err:
        what = f"rank {rank} ({role}) failed during {tl.current}: {type(err).__name__}: {err}"
        print(what, file=sys.stderr, flush=True)
        # The launcher's message: without gloo's source location ("[.../unbound_buffer.cc:81] ").
        (out / f"failure-rank{rank}.txt").write_text(_SOURCE_LOCATION.sub("", what) + "\n")
        raise
    finally:
        heartbeat.stop()
    if rank == 0:
        _write_outputs(cfg, out, steps, gathered)
    dist.destroy_process_group()
    return 0


_SOURCE_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|h|hpp):\d+\]\s*")


def _agree(value: int, group) -> int:
    """Rank 0's value, on every rank."""
    t = torch.tensor([value], dtype=torch.long)
    dist.broadcast(t, src=0, group=group)
    return int(t.item())


# The marks a rank stamps on its way to training, each ending the part named beside it.
STARTUP_PARTS = {"imported": "imports", "process_group": "process_group", "set_up": "set_up", "canary": "canary"}


def startup_figures(marks: list[dict[str, float]]) -> dict[str, Any]:
    """Where the ranks' seconds before the first step went: each part (imports, the process
    group, model and data set-up, the canary) as its slowest rank took it, and the wall-clock
    moments the first rank's module started and the last rank began training (the launcher
    adds its own launch and end, pipelines/launch.py)."""
    ends = list(STARTUP_PARTS)
    parts = {STARTUP_PARTS[e]: max(m[e] - m[b] for m in marks)
             for b, e in zip(["started", *ends[:-1]], ends, strict=True)}
    # How the ranks were started: forked by a warm server's agent, by a cold agent, or by torchrun.
    return {"parts_s": parts, "launcher": os.environ.get("DDLBENCH_LAUNCHER", "torchrun"),
            "started_at": min(m["started"] for m in marks),
            "training_at": max(m["canary"] for m in marks), "written_at": time.time()}


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
        "target_reached": lead["target_reached"],
        "time_to_accuracy_s": lead["time_to_accuracy_s"],
        "steps_to_accuracy": lead["steps_to_accuracy"],
        "target_loss": cfg.target_loss,
        "time_to_loss_s": lead["time_to_loss_s"],
        "steps_to_loss": lead["steps_to_loss"],
        "parameters": lead["parameters"],
        "parameter_bytes": lead["parameter_bytes"],
        "staleness": staleness_figures([s["traffic"]["staleness"] for s in servers])
        if cfg.algorithm.value == "asgd" else None,
        "bytes_sent": {str(w["rank"]): w["traffic"]["bytes_sent"] for w in workers},
        "bytes_received": {str(w["rank"]): w["traffic"]["bytes_received"] for w in workers},
        "environment": environment(cfg),
        "canary": host_canary.summarise([r["canary"] for r in results]),
        "memory": memory.summarise(r["memory"] for r in results),
        "startup": startup_figures([r["startup"] for r in results]),
        "config": json.loads(cfg.model_dump_json()),
    }
    summary |= language_model_figures(cfg, lead, summary["throughput_samples_per_s"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


@record
def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m training.run OUT_DIR (started by a job's agent)", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    code = main()
    # A rank's outputs are written and its process group destroyed: the interpreter's own
    # teardown (torch's and its compiler stack's modules) takes most of a second and does
    # nothing a finished rank needs, so the rank leaves at once. A failure raises out of
    # main() instead and exits the usual way (torch elastic's error file).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
