"""Entry point of every microbenchmark rank started by torchrun:
`python -m modelling.microbench_rank OUT_DIR`.

Reads OUT_DIR/microbench.json (workers, servers, sizes, repeats, timeout_s),
written by `modelling.microbench.run_microbench`. Ranks 0..N-1 are workers,
N..N+S-1 shards, as in training. Rank 0 times every operation (after a barrier,
median over repeats) and writes OUT_DIR/comm.json.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from modelling.fit import COMM_KIND


def _timed(op, repeats: int, group=None) -> list[float]:
    """One untimed warm-up, then `repeats` timings, each started together after a barrier."""
    out = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        op()
        if i:
            out.append(time.perf_counter() - t0)
    return out


def _row(primitive: str, workers: int, servers: int, nbytes: int, times: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {
        "primitive": primitive,
        "workers": workers,
        "servers": servers,
        "bytes": nbytes,
        "median_s": statistics.median(times),
        "spread_s": q[2] - q[0],
        "times_s": times,
    }


def _shards(numel: int, servers: int) -> list[tuple[int, int]]:
    base, extra = divmod(numel, servers)
    bounds, start = [], 0
    for s in range(servers):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def run(out: Path) -> int:
    spec = json.loads((out / "microbench.json").read_text())
    n, s, repeats = spec["workers"], spec["servers"], spec["repeats"]
    timeout = timedelta(seconds=spec["timeout_s"])
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo", timeout=timeout)
    rank = dist.get_rank()
    workers = dist.new_group(ranks=list(range(n)), timeout=timeout)
    rows: list[dict[str, Any]] = []
    for nbytes in spec["sizes"]:
        numel = max(nbytes // 4, 1)
        buf = torch.ones(numel)
        if n > 1:
            times = _timed(lambda b=buf: dist.all_reduce(b, group=workers) if rank < n else None, repeats)
            rows.append(_row("allreduce", n, 0, numel * 4, times))
        times = _timed(lambda b=buf: _ping_pong(b, rank), repeats)
        rows.append(_row("p2p", 2, 0, numel * 4, [t / 2 for t in times]))
        if s:
            times = _timed(lambda b=buf: _push_pull(b, rank, n, s, timeout), repeats)
            rows.append(_row("ps", n, s, numel * 4, times))
    if rank == 0:
        comm = {
            "kind": COMM_KIND,
            "workers": n,
            "servers": s,
            "sizes": spec["sizes"],
            "repeats": repeats,
            "link_bytes_per_s": spec.get("link_bytes_per_s"),
            "measurements": rows,
            "environment": _environment(n + s),
        }
        (out / "comm.json").write_text(json.dumps(comm, indent=2))
    dist.destroy_process_group()
    return 0


def _ping_pong(buf: torch.Tensor, rank: int) -> None:
    """Rank 0 -> rank 1 and back: twice the one-way time."""
    if rank == 0:
        dist.send(buf, 1)
        dist.recv(buf, 1)
    elif rank == 1:
        dist.recv(buf, 0)
        dist.send(buf, 0)


def _push_pull(buf: torch.Tensor, rank: int, n: int, s: int, timeout: timedelta) -> None:
    """One SSGD-PS round as training/ps.py does it: every worker pushes its slice to
    each shard and pulls it back; each shard receives all N, then sends to all N."""
    bounds = _shards(buf.numel(), s)
    if rank < n:
        works = []
        for shard, (a, b) in enumerate(bounds):
            works.append(dist.isend(buf[a:b], n + shard))
            works.append(dist.irecv(buf[a:b].clone(), n + shard))
        for w in works:
            w.wait(timeout)
        return
    a, b = bounds[rank - n]
    slices = [torch.empty(b - a) for _ in range(n)]
    for w in [dist.irecv(slices[k], k) for k in range(n)]:
        w.wait(timeout)
    for w in [dist.isend(buf[a:b], k) for k in range(n)]:
        w.wait(timeout)


def _environment(world: int) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "backend": "gloo",
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "world_size": world,
        "python": platform.python_version(),
    }


@record
def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m modelling.microbench_rank OUT_DIR (started by torchrun)", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
