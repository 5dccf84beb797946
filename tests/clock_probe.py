"""A torchrun job for the microbenchmark's timing (`python -m tests.clock_probe DIR`): the clock
offsets of 3 ranks, then allreduces between ranks 0 and 1 where rank 1 arrives LATE_S late,
timed as the microbenchmark times them. Rank 0 writes DIR/clock.json."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from modelling.measure.microbench_clock import clock_offsets, round_times, timed

LATE_S = 0.03

if __name__ == "__main__":
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    pair = dist.new_group(ranks=[0, 1])
    offsets = clock_offsets()
    buf = torch.ones(1024)
    stamps = timed(
        lambda: dist.all_reduce(buf, group=pair) if rank < 2 else None,
        9,
        LATE_S if rank == 1 else 0.0,
        computes=False,
        offset_s=offsets[rank],
    )
    aligned = round_times(stamps, range(2))
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, stamps)
    if rank == 0:
        own = [end - start for start, end in stamps]
        # How much later rank 1 started than rank 0, on rank 0's clock: LATE_S, give or take the
        # barrier's release skew between the two ranks.
        late = [s1 - s0 for (s0, _), (s1, _) in zip(every[0], every[1], strict=True)]
        Path(sys.argv[1], "clock.json").write_text(
            json.dumps({"offsets": offsets, "own": own, "aligned": aligned, "late": late}))
    dist.destroy_process_group()
