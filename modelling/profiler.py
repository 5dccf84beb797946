"""The layer profiler: per parameter-owning layer, forward and backward time,
parameter and output bytes, in execution order (DESIGN §3).

Each repeat is one real training iteration (batch load, forward, backward,
optimizer step) with hooks that stamp the clock: a forward hook when a layer's
forward ends, a post-accumulate-grad hook when each of its gradients is ready.
A layer is charged the time since the previous stamp, so the work of
parameter-free modules (activations, pooling, the loss) lands on the next layer
that owns parameters. Each layer's median is then scaled so the layers add up
to the median whole forward+backward pass (`layer_time_scale`): on a
time-shared CPU, preemptions land in a different layer each repeat and
per-layer medians alone would drop them. On CUDA the clock synchronises the
device first.

`processes > 1` starts that many profiling processes in all (this one and
P-1 contenders running the same iterations), so the CPU is contended as in a
P-process training run; the figures are this process's.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import statistics
import time
from typing import Any

from modelling.layers import write_layers

__all__ = ["profile_layers", "write_layers"]


def _spread(xs: list[float]) -> float:
    """Interquartile range: robust to the odd preempted repeat."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def _setup(model: str, batch_size: int, input_shape, dataset: str, num_classes: int, device: str):
    import torch

    from training.config import build_config
    from training.datasets import GlobalBatchSampler, load_dataset, native_shape
    from training.models import build_model, natural_input_shape

    shape = tuple(input_shape) if input_shape else natural_input_shape(model, native_shape(dataset))
    cfg = build_config(
        {
            "model": model,
            "dataset": dataset,
            "batch_size": batch_size,
            "steps": 1,
            "workers": 1,
            "num_classes": num_classes if dataset == "synthetic" else None,
            "input_shape": shape,
            "device": device,
            "synthetic_samples": max(16, 4 * batch_size),
        },
        "profile",
    )
    train, _ = load_dataset(cfg, shape)
    torch.manual_seed(0)
    dev = torch.device(device)
    net = build_model(model, shape, num_classes if dataset == "synthetic" else train.num_classes).to(dev)
    sampler = GlobalBatchSampler(len(train), 1, batch_size, seed=0)
    # The trainer's global optimizer, so the update costs what training's does.
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return net, opt, train, sampler, shape, dev


def _clock(dev):
    import torch

    if dev.type == "cuda":

        def now() -> float:
            torch.cuda.synchronize(dev)
            return time.perf_counter()

        return now
    return time.perf_counter


def _iteration(net, opt, train, sampler, step: int, dev, now) -> dict[str, float]:
    import torch.nn.functional as F

    from training.models import logits_of

    t0 = now()
    x, y = train.batch(sampler.indices(step, 0))
    x, y = x.to(dev), y.to(dev)
    t1 = now()
    loss = F.cross_entropy(logits_of(net(x)), y)
    t2 = now()
    loss.backward()
    t3 = now()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t4 = now()
    return {"data": t1 - t0, "fwd_start": t1, "fwd_end": t2, "bwd_start": t2, "bwd_end": t3, "update": t4 - t3}


def _contend(args: tuple, ready, stop) -> None:
    """A contender: the same iterations as the profiled process, until told to stop."""
    import torch

    torch.set_num_threads(1)
    net, opt, train, sampler, _, dev = _setup(*args)
    now = _clock(dev)
    ready.wait()
    step = 0
    while not stop.is_set():
        _iteration(net, opt, train, sampler, step, dev, now)
        step += 1


def _flat_ops(net, repeats: int, now) -> dict[str, float]:
    """What the PS client, the server loop and DDP do with flat buffers."""
    import torch

    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    numel = sum(p.numel() for p in params)
    flat = torch.zeros(numel, device=params[0].device)
    other = torch.randn(numel, device=params[0].device)
    server = torch.nn.Parameter(torch.zeros(numel, device=params[0].device))
    sgd = torch.optim.SGD([server], lr=0.01, momentum=0.9)
    times: dict[str, list[float]] = {"pack_s": [], "unpack_s": [], "server_update_s": [], "server_add_s": []}
    for _ in range(repeats + 1):
        t0 = now()
        offset = 0
        for p in params:  # PSClient.gather_grads
            flat[offset : offset + p.numel()].view_as(p).copy_(p.grad)
            offset += p.numel()
        t1 = now()
        with torch.no_grad():
            offset = 0
            for p in params:  # PSClient.load_into_params
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        t2 = now()
        other.div_(2.0)  # the sync server (training/ps.py): average, then the optimizer step
        server.grad = other
        sgd.step()
        t3 = now()
        other.add_(flat)  # each further worker's push adds one pass
        t4 = now()
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[key].append(dt)
    for p in params:
        p.grad = None
    return {k: statistics.median(v[1:]) for k, v in times.items()}


def _environment(device: str, processes: int) -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "torch": torch.__version__,
        "device": device,
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "gpu_model": torch.cuda.get_device_name() if device == "cuda" else None,
        "hostname": platform.node(),
        "python": platform.python_version(),
        "threads_per_process": 1,
        "processes": processes,
    }


def profile_layers(
    model: str,
    batch_size: int,
    *,
    input_shape: tuple[int, int, int] | None = None,
    dataset: str = "synthetic",
    num_classes: int = 10,
    device: str = "cpu",
    warmup: int = 3,
    repeats: int = 10,
    processes: int = 1,
) -> dict[str, Any]:
    """The layer table (layers.json content) of `model` at `batch_size` per process."""
    import torch

    if batch_size < 1:
        raise ValueError(f"batch_size: must be at least 1, got {batch_size}")
    if processes < 1:
        raise ValueError(f"processes: must be at least 1, got {processes}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats/warmup: need repeats >= 1 and warmup >= 0, got {repeats}/{warmup}")
    from training.models import check_model_name

    check_model_name(model)  # before any process starts
    args = (model, batch_size, input_shape, dataset, num_classes, device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as every training rank runs
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Barrier(processes), ctx.Event()
    contenders = [ctx.Process(target=_contend, args=(args, ready, stop), daemon=True) for _ in range(processes - 1)]
    try:
        for c in contenders:
            c.start()
        net, opt, train, sampler, shape, dev = _setup(*args)
        ready.wait(timeout=300)
        table = _measure(net, opt, train, sampler, dev, warmup, repeats)
    finally:
        stop.set()
        for c in contenders:
            c.join(30)
            if c.is_alive():
                c.kill()
        torch.set_num_threads(threads)
    return {
        "model": model,
        "batch_size": batch_size,
        "device": device,
        "input_shape": list(shape),
        "dataset": dataset,
        "processes": processes,
        "warmup": warmup,
        "repeats": repeats,
        **table,
        "environment": _environment(device, processes),
    }


def _measure(net, opt, train, sampler, dev, warmup: int, repeats: int) -> dict[str, Any]:
    now = _clock(dev)
    names = {m: n for n, m in net.named_modules()}
    owners = [m for m in net.modules() if any(True for _ in m.parameters(recurse=False))]
    fwd_stamp: dict[Any, float] = {}
    out_bytes: dict[Any, int] = {}
    grad_stamp: dict[Any, float] = {}
    handles = []

    def on_forward(module, _inputs, output) -> None:
        fwd_stamp[module] = now()
        if hasattr(output, "numel"):
            out_bytes[module] = output.numel() * output.element_size()

    for m in owners:
        handles.append(m.register_forward_hook(on_forward))
        for p in m.parameters(recurse=False):
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(lambda _p, m=m: grad_stamp.__setitem__(m, now())))
    per_layer: dict[Any, dict[str, list[float]]] = {m: {"fwd": [], "bwd": []} for m in owners}
    data, update, compute, passes = [], [], [], []
    order: list[Any] = []
    try:
        for step in range(warmup + repeats):
            fwd_stamp.clear()
            grad_stamp.clear()
            it = _iteration(net, opt, train, sampler, step, dev, now)
            if step < warmup:
                continue
            order = sorted(fwd_stamp, key=fwd_stamp.get)
            prev = it["fwd_start"]
            for m in order:
                per_layer[m]["fwd"].append(fwd_stamp[m] - prev)
                prev = fwd_stamp[m]
            per_layer[order[-1]]["fwd"][-1] += it["fwd_end"] - prev  # the loss
            prev = it["bwd_start"]
            for m in sorted(grad_stamp, key=grad_stamp.get):
                per_layer[m]["bwd"].append(grad_stamp[m] - prev)
                prev = grad_stamp[m]
            data.append(it["data"])
            update.append(it["update"])
            passes.append(it["bwd_end"] - it["fwd_start"])
            compute.append(it["data"] + passes[-1] + it["update"])
    finally:
        for h in handles:
            h.remove()
    # Per-layer medians miss the preemptions a time-shared CPU spreads over whole
    # passes; scale them so they add up to the median forward+backward pass.
    medians = {
        m: (statistics.median(per_layer[m]["fwd"]), statistics.median(per_layer[m]["bwd"] or [0.0])) for m in order
    }
    total = sum(f + b for f, b in medians.values())
    scale = statistics.median(passes) / total if total > 0 else 1.0
    rows = []
    for m in order:
        ps = list(m.parameters(recurse=False))
        f, b = per_layer[m]["fwd"], per_layer[m]["bwd"] or [0.0]
        rows.append(
            {
                "name": names[m] or type(m).__name__,
                "type": type(m).__name__,
                "fwd_s": medians[m][0] * scale,
                "bwd_s": medians[m][1] * scale,
                "fwd_spread_s": _spread(f),
                "bwd_spread_s": _spread(b),
                "param_bytes": sum(p.numel() * p.element_size() for p in ps),
                "param_tensor_bytes": [p.numel() * p.element_size() for p in ps],
                "output_bytes": out_bytes.get(m, 0),
            }
        )
    return {
        "layers": rows,
        "layer_time_scale": scale,
        "update_s": statistics.median(update),
        "update_spread_s": _spread(update),
        "data_s": statistics.median(data),
        "data_spread_s": _spread(data),
        # Whole iterations, for the straggler term of synchronous algorithms.
        "iteration_samples_s": compute,
        **_flat_ops(net, repeats, now),
    }
