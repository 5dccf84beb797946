"""Entry point of every microbenchmark rank a job's agent starts:
`python -m modelling.measure.microbench_rank OUT_DIR`.

Reads OUT_DIR/microbench.json (workers, servers, sizes, repeats, timeout_s),
written by `modelling.measure.microbench.run_microbench`. Ranks 0..N-1 are workers,
N..N+S-1 shards, as in training. With shards, ASGD's pass is timed too, in ASGD's own
pattern (`_asgd_passes`): a synchronous round does not show what one worker's push and pull
cost while the others compute. Every rank stamps every operation on rank 0's clock
(clock_offsets); an operation's time is from its last rank's start to its last rank's end
(median and trimmed mean over repeats), and rank 0 writes OUT_DIR/comm.json. Where every
rank shares one host but talks over links (an emulated cluster of network namespaces, or a
link of stated rate), rank 0 also reads the host's busy CPU time around every allreduce and
PS loop (host_cpu_s): what the host's cores spend on moving the bytes, in the ranks and in
the kernel.
With device cuda the allreduce runs on GPU tensors (modelling/measure/microbench_device.py).
"""

from __future__ import annotations

if __name__ == "__main__":  # a rank: end with its agent, set before the seconds of importing torch
    from infra.lifeline import die_with_agent

    die_with_agent()

import json
import math
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

from modelling.measure.links import multi_node, p2p_pairs, tcp_rmem_max, tcp_wmem_max
from modelling.measure.microbench_clock import (
    HOST_CPU_LOOP_S,
    clock_offsets,
    compute,
    host_busy_s,
    host_cpu_s,
    round_times,
    timed,
    trimmed_mean,
)
from modelling.measure.microbench_device import backend_of, pin_device, rank_device
from modelling.measure.records import COMM_KIND, SCHEMA_VERSION

ASGD_PASSES = 50  # the most passes per worker and size that ASGD's pattern is timed for


def _pull_lead(stamps: list[tuple[float, float]], n: int, node_of_rank: list[int] | None) -> float | None:
    """Placed, how much sooner the first of the workers on nodes without a shard has its pull
    back than the last of them, per round, median: a shard node's uplink, a FIFO queue, does
    not share itself fairly among pulls sent at once, so the first pull queued ends well before
    the pair's joint wire time. Which worker is first changes from round to round (the order
    the shard's sends reach the queue), so the lead is the spread of the round's arrivals, not
    a difference in rank order, whose median noise pulls to zero. None where fewer than two
    such workers (or one host)."""
    if node_of_rank is None:
        return None
    shard_nodes = set(node_of_rank[n:])
    remote = [r for r in range(n) if node_of_rank[r] not in shard_nodes]
    if len(remote) < 2:
        return None
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, stamps)
    ends = [[every[r][i][1] for r in remote] for i in range(len(stamps))]
    return statistics.median(max(e) - min(e) for e in ends)


def _row(primitive: str, workers: int, servers: int, nbytes: int, times: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {
        "primitive": primitive,
        "workers": workers,
        "servers": servers,
        "bytes": nbytes,
        "median_s": statistics.median(times),
        "mean_s": trimmed_mean(times),
        "spread_s": q[2] - q[0],
        "times_s": times,
    }


def _median_post(posts: list[float], n: int) -> float:
    """The median over every worker's repeats of the time it took to post a round (a shard
    posts none: it contributes nothing)."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, posts if dist.get_rank() < n else [])
    return statistics.median([t for per_rank in every[:n] for t in per_rank] or [0.0])


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
    gap = spec["gap_s"]
    timeout = timedelta(seconds=spec["timeout_s"])
    torch.set_num_threads(1)
    device = spec.get("device", "cpu")  # modelling/measure/microbench_device.py
    pinned = pin_device(device, n)
    dist.init_process_group(backend=backend_of(device), timeout=timeout)
    rank = dist.get_rank()
    workers = dist.new_group(ranks=list(range(n)), timeout=timeout)
    dev = rank_device(device, pinned, rank, n, workers, timeout)
    rows: list[dict[str, Any]] = []
    placement = out / "placement.json"  # written by modelling.measure.microbench before the launch
    placed = {"node_of_rank": json.loads(placement.read_text())["node_of_rank"]} if placement.exists() else {}
    pairs = p2p_pairs(n, placed.get("node_of_rank"))
    offset = clock_offsets()[rank]
    hosts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, platform.node())
    # Every rank on this host's cores but talking over links (an emulated cluster's nodes, or a
    # link of stated rate): what moving the bytes costs the host's cores, ranks and kernel, is
    # read around the loops. On loopback it is not: there the model holds the transfers' own
    # copying on the ranks' CPUs (modelling/predict.py's `loopback`), and never reads it.
    on_links = multi_node(placed.get("node_of_rank")) or spec.get("link_bytes_per_s") is not None
    host_cpu = len(set(hosts)) == 1 and on_links
    for nbytes in spec["sizes"]:
        numel = max(nbytes // 4, 1)
        buf = torch.ones(numel, pin_memory=dev.pin)
        if n > 1:
            op = dev.allreduce_op(buf, rank < n)
            busy = (host_busy_s(), time.monotonic()) if rank == 0 else None
            stamps = timed(op, repeats, gap, computes=rank < n, offset_s=offset)
            row = _row("allreduce", n, 0, numel * 4, round_times(stamps, range(n)))
            if host_cpu:
                row |= host_cpu_s(op, row["times_s"], busy, gap, rank < n, n)
            rows.append(row)
        for primitive, (a, b) in pairs.items():  # one ping-pong per link class the placement uses
            stamps = timed(lambda b_=buf, a=a, b=b: _ping_pong(b_, rank, a, b), repeats, gap,
                            computes=rank in (a, b) and rank < n, offset_s=offset)
            rows.append(_row(primitive, 2, 0, numel * 4, [t / 2 for t in round_times(stamps, (a, b))])
                        | {"pair": [a, b]})
        if s:
            # Receive buffers made once, as the trainer's are: a fresh large tensor per round
            # would time the kernel's page faults and zeroing, not the transfer.
            recv = _push_pull_buffers(numel, rank, n, s, dev.pin)
            posts: list[float] = []
            busy = (host_busy_s(), time.monotonic()) if rank == 0 else None
            stamps = timed(lambda b=buf, r=recv, p=posts: _push_pull(b, r, rank, n, s, timeout, p), repeats, gap,
                            computes=rank < n, offset_s=offset)
            row = _row("ps", n, s, numel * 4, round_times(stamps, range(n))) | placed
            row["post_s"] = _median_post(posts[1:], n)  # the first: the warm-up
            row["pull_lead_s"] = _pull_lead(stamps, n, placed.get("node_of_rank"))
            if host_cpu:
                op = lambda b=buf, r=recv: _push_pull(b, r, rank, n, s, timeout)  # noqa: E731
                row |= host_cpu_s(op, row["times_s"], busy, gap, rank < n, n)
            rows.append(row)
            # As many passes as a host-CPU loop lasts, at least `repeats`: a pass's time has a
            # long tail (a shard that waits a time slice for a core), and 5 samples miss it.
            per_pass = statistics.median(row["times_s"]) + gap
            count = max(repeats, min(ASGD_PASSES, math.ceil(HOST_CPU_LOOP_S / per_pass)))
            passes, tails = _asgd_passes(buf, recv, rank, n, s, count, gap, timeout, offset)
            row = _row("asgd", n, s, numel * 4, [x for per_worker in passes for x in per_worker]) | placed
            rows.append(row | {"worker_mean_s": [trimmed_mean(x) for x in passes],
                               "reply_tail_s": [statistics.median(x) for x in tails]})
    if rank == 0:
        comm = {
            "kind": COMM_KIND,
            "schema_version": SCHEMA_VERSION,
            "workers": n,
            "servers": s,
            "sizes": spec["sizes"],
            "repeats": repeats,
            "link_bytes_per_s": spec.get("link_bytes_per_s"),
            "gap_s": gap,
            "measurements": rows,
            # One hostname may hold several nodes (network namespaces): count both.
            "environment": _environment(n + s)
            | {"hosts": len(set(hosts)), "nodes": len(set(placed.get("node_of_rank", [0])))} | dev.environment(),
        }
        (out / "comm.json").write_text(json.dumps(comm, indent=2))
    dist.destroy_process_group()
    return 0


def _ping_pong(buf: torch.Tensor, rank: int, a: int = 0, b: int = 1) -> None:
    """Rank a -> rank b and back: twice the one-way time."""
    if rank == a:
        dist.send(buf, b)
        dist.recv(buf, b)
    elif rank == b:
        dist.recv(buf, a)
        dist.send(buf, a)


def _push_pull_buffers(numel: int, rank: int, n: int, s: int, pin: bool = False) -> list[torch.Tensor]:
    """A worker's pull buffer (the whole vector, pinned where `pin`), or a shard's N push buffers."""
    if rank < n:
        return [torch.zeros(numel, pin_memory=pin)]
    a, b = _shards(numel, s)[rank - n]
    return [torch.zeros(b - a) for _ in range(n)]


def _push_pull(buf: torch.Tensor, recv: list[torch.Tensor], rank: int, n: int, s: int, timeout: timedelta,
               posts: list[float] | None = None) -> None:
    """One SSGD-PS round as training/ps.py does it: every worker pushes its slice to
    each shard and pulls it back; each shard receives all N, then sends to all N. A
    worker appends to `posts` how long posting its sends and receives took: the CPU time
    before it could go on (gloo writes into the socket from the caller's thread), which
    OD-SGD pays on its critical path and the others inside their wait."""
    bounds = _shards(buf.numel(), s)
    if rank < n:
        works = []
        t0 = time.perf_counter()
        for shard, (a, b) in enumerate(bounds):
            works.append(dist.isend(buf[a:b], n + shard))
            works.append(dist.irecv(recv[0][a:b], n + shard))
        if posts is not None:
            posts.append(time.perf_counter() - t0)
        for w in works:
            w.wait(timeout)
        return
    a, b = bounds[rank - n]
    for w in [dist.irecv(recv[k], k) for k in range(n)]:
        w.wait(timeout)
    for w in [dist.isend(buf[a:b], k) for k in range(n)]:
        w.wait(timeout)


def _asgd_passes(buf: torch.Tensor, recv: list[torch.Tensor], rank: int, n: int, s: int, count: int,
                 gap_s: float, timeout: timedelta,
                 offset_s: float = 0.0) -> tuple[list[list[float]], list[list[float]]]:
    """ASGD's pattern, as training/ps.py runs it: every worker, on its own, computes `gap_s`,
    then pushes its slice to every shard and pulls it back (one pass); each shard serves
    one push at a time from any worker, replying to it. No barrier between passes: the
    others compute while one is served, and on a host with fewer cores than ranks the
    shard and its threads wait for a core (on 2 cores, lenet5's 246 KB after 3.4 ms of
    computation: about 1 ms a pass, where the synchronous round's transfers give 0.3).
    Per worker, each pass but the first (a warm-up) from the later of its start and the
    moment its shards were free (they ended the pass before theirs): its service, without the
    queue behind other workers' passes, which the DAG's serial shard adds itself. And per
    worker and pass, its reply's tail: from the moment the last of its shards returned from
    sending the reply (its socket had taken it) to the worker's pass end, what the link
    still carried while the shard served on (ASGDPlan's buffered part; over a 1 Gbit/s netns
    link more than the send buffer holds, as tbf's queue and TCP's window hold some too).
    All stamps on rank 0's clock; the same lists on every rank."""
    own: list[Any] = []
    dist.barrier()
    if rank < n:
        for _ in range(count + 1):
            compute(gap_s)
            t0 = time.perf_counter()
            _push_pull(buf, recv, rank, n, s, timeout)
            own.append((t0 - offset_s, time.perf_counter() - offset_s))
    else:
        a, b = _shards(buf.numel(), s)[rank - n]
        for _ in range(n * (count + 1)):
            src = dist.recv(recv[0])  # any worker: served on arrival
            dist.send(buf[a:b], src)
            own.append((src, time.perf_counter() - offset_s))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, own)
    out, tails = [], []
    for w in range(n):
        # Per shard, where in its serving order each of worker w's passes came; the pass it
        # served before that one freed it.
        order = [(done, [j for j, (src, _) in enumerate(done) if src == w]) for done in every[n:]]
        served, tail = [], []
        for i, (t0, t1) in enumerate(every[w]):
            free = max([t0] + [done[mine[i] - 1][1] for done, mine in order if mine[i]])
            served.append(max(t1 - free, 0.0))
            replied = max(done[mine[i]][1] for done, mine in order)
            tail.append(min(max(t1 - replied, 0.0), t1 - t0))
        out.append(served[1:])
        tails.append(tail[1:])
    return out, tails


def _environment(world: int) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "backend": "gloo",
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "world_size": world,
        "python": platform.python_version(),
        "tcp_wmem_max": tcp_wmem_max(),  # how much of a send its socket absorbs (modelling/measure/links.py)
        "tcp_rmem_max": tcp_rmem_max(),  # and the receiver's, while it does not read
    }


@record
def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m modelling.measure.microbench_rank OUT_DIR (started by a job's agent)", file=sys.stderr)
        return 2
    return run(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
