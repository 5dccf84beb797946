"""The anchor of bench_trainer.py: a DDP training loop written the textbook way.

Started by torchrun: `python -m benchmarks.textbook_ddp MODEL BATCH STEPS WARMUP OUT_JSON`.
Same model registry, same data and batches as `ddlbench train`: synthetic images, or for a
GPT the stdlib-text corpus (the throughput is then sequences/s).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from training.config import build_config
from training.datasets import GlobalBatchSampler, load_dataset
from training.gpt_shape import is_gpt
from training.models import build_model
from training.shape import resolve_input_shape


def main() -> None:
    model_name, out = sys.argv[1], sys.argv[5]
    batch, steps, warmup = (int(a) for a in sys.argv[2:5])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = "stdlib-text" if is_gpt(model_name) else "synthetic"
    cfg = build_config({"model": model_name, "dataset": dataset, "workers": world, "batch_size": batch,
                        "steps": steps})
    shape = resolve_input_shape(cfg)
    train, _ = load_dataset(cfg, shape)
    sampler = GlobalBatchSampler(len(train), world, batch, cfg.seed)
    torch.manual_seed(cfg.seed)
    model = DDP(build_model(model_name, shape, train.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    for t in range(steps):
        if t == warmup:
            dist.barrier()
            start = time.monotonic()
        x, y = train.batch(sampler.indices(t, rank))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.monotonic() - start
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"throughput_samples_per_s": (steps - warmup) * batch * world / elapsed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
