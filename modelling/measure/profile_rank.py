"""Entry point of every profiling rank a job's agent starts:
`python -m modelling.measure.profile_rank OUT_DIR`.

Reads OUT_DIR/profile-job.json, written by `modelling.measure.profiler.profile_layers`.
Every rank builds the model and its data, then all meet at a barrier. Rank 0
measures the layer table and writes OUT_DIR/profile-result.json; ranks 1..P-1
run the same training iterations as contenders until rank 0 tells them it is
done (a key in the job's store, polled between iterations), so the CPU or device is
shared as in a P-process training run. A rank that fails writes
OUT_DIR/failure-rank<R>.txt saying what it was doing.
"""

from __future__ import annotations

if __name__ == "__main__":  # a rank: end with its agent, set before the seconds of importing torch
    from infra.lifeline import die_with_agent

    die_with_agent()

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.rendezvous import rendezvous

from modelling.measure.profiler import PROFILE_JOB, PROFILE_RESULT, build_profiled, profile_table, timed_iteration
from training.measure.device_timer import timer_for

_DONE = "ddlbench/profile-done"  # set in the job's store by rank 0 when it has measured


def _device(name: str) -> torch.device:
    if name != "cuda":
        return torch.device(name)
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def run(out: Path) -> int:
    job = json.loads((out / PROFILE_JOB).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # as every training rank runs
    doing = "starting"
    try:
        if world != job["processes"]:
            raise RuntimeError(f"the launcher started {world} ranks but the profile needs {job['processes']}")
        timeout = timedelta(seconds=job["timeout_s"])
        store, _, _ = next(rendezvous("env://", timeout=timeout))
        dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        doing = f"building {job['model']} and its data"
        shape = tuple(job["input_shape"]) if job["input_shape"] else None
        net, opt, train, sampler, shape, dev = build_profiled(job["model"], job["batch_size"], shape, job["dataset"],
                                                      job["num_classes"], job["device"], _device(job["device"]),
                                                      job.get("model_options"))
        doing = "waiting for the other profiling ranks"
        dist.barrier()
        if rank == 0:
            doing = "measuring the layers"
            table = profile_table(job, net, opt, train, sampler, shape, dev)
            store.set(_DONE, "1")
            tmp = out / (PROFILE_RESULT + ".tmp")
            tmp.write_text(json.dumps(table, indent=2))
            tmp.replace(out / PROFILE_RESULT)
        else:
            doing = "contending with the measuring rank"
            timer, step = timer_for(dev), 0
            while not store.check([_DONE]):
                timed_iteration(net, opt, train, sampler, step, dev, timer)
                step += 1
        doing = "finishing"
        dist.barrier()
        dist.destroy_process_group()
    except Exception as err:
        what = f"profile rank {rank} failed while {doing}: {type(err).__name__}: {err}"
        print(what, file=sys.stderr, flush=True)
        (out / f"failure-rank{rank}.txt").write_text(what + "\n")
        raise
    return 0


@record
def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m modelling.measure.profile_rank OUT_DIR (started by a job's agent)", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
