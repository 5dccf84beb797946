"""Rank script of bench_trainer.py [2]: ddlbench's PS push+pull vs raw gloo send/recv.

`python -m benchmarks.ps_vs_raw BYTES OUT_JSON` on 2 ranks: rank 0 a worker,
rank 1 a shard. Both exchange the same bytes each round: raw = send M, receive
M back; PS = PSClient push + pull against the real sync server loop.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from training.measure.timeline import Timeline
from training.ps import PSClient, ServerConfig, ShardLayout, ShardServer

ROUNDS, WARMUP = 20, 3


def main() -> None:
    nbytes, out = int(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.group.WORLD
    n = nbytes // 4
    buf = torch.zeros(n)
    # Raw: send M bytes, get M back.
    dist.barrier()
    for r in range(ROUNDS + WARMUP):
        if r == WARMUP:
            start = time.monotonic()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    raw = 2 * nbytes * ROUNDS / (time.monotonic() - start)
    # PS: the real client against the real server loop (lr 0: weights stay put).
    layout = ShardLayout.even(n, 1)
    dist.barrier()
    if rank == 0:
        param = torch.zeros(n, requires_grad=True)
        param.grad = torch.zeros(n)
        client = PSClient([param], layout, 1, group, 60.0)
        client.send_initial(client.flat_params())
        for r in range(ROUNDS + WARMUP):
            if r == WARMUP:
                start = time.monotonic()
            client.gather_grads()
            client.wait(client.start_push_pull())
        elapsed = time.monotonic() - start
        update = torch.zeros(1, dtype=torch.float64)
        dist.recv(update, 1)  # the server's time in aggregate + update, measured rounds only
        ps = 2 * nbytes * ROUNDS / elapsed
        ps_comm = 2 * nbytes * ROUNDS / (elapsed - update.item())
        with open(out, "w") as f:
            json.dump({"raw_bytes_per_s": raw, "ps_bytes_per_s": ps, "ps_comm_bytes_per_s": ps_comm,
                       "server_update_s": update.item() / ROUNDS, "bytes": nbytes}, f)
    else:
        cfg = ServerConfig(shard=0, workers=1, steps=ROUNDS + WARMUP, mode="sync", lr=0.0, momentum=0.0,
                           weight_decay=0.0, timeout_s=60.0)
        tl = Timeline(rank, "server", time.monotonic())
        server = ShardServer(cfg, layout, group, tl)
        server.receive_initial()
        server.run(0, lambda _t: None)
        spans = [r["phases"]["update"] for r in tl.records[WARMUP:]]
        dist.send(torch.tensor([sum(b - a for a, b in spans)], dtype=torch.float64), 0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
