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
per-layer medians alone would drop them. On CUDA the stamps are CUDA events on
the current stream, read after one synchronize per iteration, as the in-situ
sampling's are (training/measure/device_timer.py): a host clock would time kernel launches.

The profile runs as a job through a cluster provider, in fresh processes that
a job's agent starts (modelling/measure/profile_rank.py), as training does (DESIGN §1): never
in the caller's process or its `multiprocessing` children, so it measures the
node training runs on, and works inside an Airflow task. `processes = P` starts
P ranks: rank 0 measures while ranks 1..P-1 run the same iterations as
contenders, so the CPU is contended as in a P-process training run; the
figures are rank 0's.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from infra import Job
from infra.local import LocalProvider
from modelling.measure.configs import ProfileConfig
from modelling.measure.layers import write_layers
from training.config import build_config

__all__ = ["ProfileConfig", "ProfileFailed", "profile_layers", "profile_memory", "run_profile", "write_layers"]


def _spread(xs: list[float]) -> float:
    """Interquartile range: robust to the odd preempted repeat."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return q[2] - q[0]


def build_profiled(
    model: str, batch_size: int, input_shape, dataset: str, num_classes: int, device: str, dev=None,
    model_options: dict[str, int] | None = None,
):
    """Model, optimizer and data of one profiling rank; `dev` the torch device (default `device`)."""
    import torch

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
            **(model_options or {}),
        },
        "profile",
    )
    train, _ = load_dataset(cfg, shape)
    torch.manual_seed(0)
    dev = dev or torch.device(device)
    classes = num_classes if dataset == "synthetic" else train.num_classes
    net = build_model(model, shape, classes, model_options).to(dev)
    sampler = GlobalBatchSampler(len(train), 1, batch_size, seed=0)
    # The trainer's global optimizer, so the update costs what training's does.
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    return net, opt, train, sampler, shape, dev


def timed_iteration(net, opt, train, sampler, step: int, dev, timer) -> dict[str, Any]:
    """One training iteration stamped by `timer` (training/measure/device_timer.py) and settled: the
    data and update spans in seconds, and the stamps that bound the forward and backward,
    for `timer.elapsed` against the layers' own."""
    import torch.nn.functional as F

    from training.models import logits_of

    t0 = timer.stamp()
    x, y = train.batch(sampler.indices(step, 0))
    x, y = x.to(dev), y.to(dev)
    t1 = timer.stamp()
    loss = F.cross_entropy(logits_of(net(x)), y)
    t2 = timer.stamp()
    loss.backward()
    t3 = timer.stamp()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t4 = timer.stamp()
    timer.settle()
    return {"data": timer.elapsed(t0, t1), "fwd_start": t1, "fwd_end": t2, "bwd_start": t2, "bwd_end": t3,
            "update": timer.elapsed(t3, t4)}


def _flat_ops(net, repeats: int, timer) -> dict[str, float]:
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
        t0 = timer.stamp()
        offset = 0
        for p in params:  # PSClient.gather_grads
            flat[offset : offset + p.numel()].view_as(p).copy_(p.grad)
            offset += p.numel()
        t1 = timer.stamp()
        with torch.no_grad():
            offset = 0
            for p in params:  # PSClient.load_into_params
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        t2 = timer.stamp()
        other.div_(2.0)  # the sync server (training/ps.py): average, then the optimizer step
        server.grad = other
        sgd.step()
        t3 = timer.stamp()
        other.add_(flat)  # each further worker's push adds one pass
        t4 = timer.stamp()
        timer.settle()
        spans = (timer.elapsed(t0, t1), timer.elapsed(t1, t2), timer.elapsed(t2, t3), timer.elapsed(t3, t4))
        for key, dt in zip(times, spans, strict=True):
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


_DEFAULT = ProfileConfig.model_fields


class ProfileFailed(RuntimeError):
    """The profiling job failed; the message names the rank, what it was doing and the log."""


def profile_layers(
    model: str,
    batch_size: int,
    *,
    input_shape: tuple[int, int, int] | None = None,
    dataset: str = _DEFAULT["dataset"].default,
    num_classes: int = _DEFAULT["num_classes"].default,
    model_options: dict[str, int] | None = None,
    device: str = _DEFAULT["device"].default.value,
    warmup: int = _DEFAULT["warmup"].default,
    repeats: int = _DEFAULT["repeats"].default,
    processes: int = _DEFAULT["processes"].default,
    provider=None,
    out_dir: Path | None = None,
    timeout_s: float = _DEFAULT["timeout_s"].default,
    echo: bool = False,
) -> dict[str, Any]:
    """The layer table (layers.json content) of `model` at `batch_size` per process.

    Runs `processes` ranks through `provider` (default: this host); their job files
    and log (profile.log) go to `out_dir` (default: a temporary directory, removed
    unless the job fails). A rank that fails raises ProfileFailed with its own error.
    """
    config = ProfileConfig.of(
        "profile",
        model=model,
        batch_size=batch_size,
        input_shape=input_shape,
        dataset=dataset,
        num_classes=num_classes,
        model_options=model_options or {},
        device=device,
        warmup=warmup,
        repeats=repeats,
        processes=processes,
        timeout_s=timeout_s,
    )
    return run_profile(config, provider=provider, out_dir=out_dir, echo=echo)


def run_profile(
    config: ProfileConfig, *, provider=None, out_dir: Path | None = None, echo: bool = False
) -> dict[str, Any]:
    """profile_layers of a ProfileConfig."""
    from training.models import check_model_name

    check_model_name(config.model)  # before any process starts
    job_spec = config.model_dump(mode="json")
    if out_dir is not None:
        return _run_job(job_spec, Path(out_dir), provider, echo)
    tmp = Path(tempfile.mkdtemp(prefix="ddlbench-profile-"))
    table = _run_job(job_spec, tmp, provider, echo)
    shutil.rmtree(tmp, ignore_errors=True)  # kept after a failure: the error names its log
    return table


def _run_job(job_spec: dict[str, Any], out: Path, provider, echo: bool) -> dict[str, Any]:
    if provider is None:
        provider = LocalProvider()
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / PROFILE_RESULT
    result_path.unlink(missing_ok=True)
    for stale in out.glob("failure-rank*.txt"):
        stale.unlink()
    (out / PROFILE_JOB).write_text(json.dumps(job_spec, indent=2))
    job = Job(
        module="modelling.measure.profile_rank",
        args=[str(out.resolve())],
        world_size=job_spec["processes"],
        log_path=out / "profile.log",
        timeout_s=job_spec["timeout_s"],
    )
    result = provider.run(job, echo=echo)
    if not result.ok or not result_path.exists():
        result.causes = [p.read_text().strip() for p in sorted(out.glob("failure-rank*.txt"))]
        raise ProfileFailed(f"profile of {job_spec['model']} at batch {job_spec['batch_size']}: "
                            f"{result.describe_failure()}")
    return json.loads(result_path.read_text())


# The job's files in its directory: what to profile (written here), the table (by rank 0).
PROFILE_JOB = "profile-job.json"
PROFILE_RESULT = "profile-result.json"


def profile_table(job: dict[str, Any], net, opt, train, sampler, shape, dev) -> dict[str, Any]:
    """Rank 0's measurement, as profile_layers returns it."""
    table = _measure(net, opt, train, sampler, dev, job["warmup"], job["repeats"])
    return {
        "model": job["model"],
        "batch_size": job["batch_size"],
        "device": job["device"],
        "input_shape": list(shape),
        "dataset": job["dataset"],
        "processes": job["processes"],
        "warmup": job["warmup"],
        "repeats": job["repeats"],
        **table,
        "memory": _memory(net, train, sampler, dev, job["batch_size"]),
        "environment": _environment(job["device"], job["processes"]),
    }


def _memory(net, train, sampler, dev, batch_size: int) -> dict[str, Any]:
    """The table's `memory` section: the model's own figures on the profile's first batches."""
    from training.measure.memory import model_memory

    def batch_of(n: int):
        x, y = train.batch(sampler.indices(0, 0)[:n])
        return x.to(dev), y.to(dev)

    return model_memory(net, batch_of, batch_size)


def profile_memory(model: str, batch_size: int, input_shape, dataset: str, num_classes: int,
                   model_options: dict[str, int] | None = None, device: str = "cpu") -> dict[str, Any]:
    """The `memory` section of a profile alone, measured in this process (no timing, no ranks)."""
    net, _, train, sampler, _, dev = build_profiled(model, batch_size, input_shape, dataset, num_classes, device,
                                                    model_options=model_options)
    return _memory(net, train, sampler, dev, batch_size)


def _measure(net, opt, train, sampler, dev, warmup: int, repeats: int) -> dict[str, Any]:
    from training.measure.device_timer import timer_for

    timer = timer_for(dev)
    names = {m: n for n, m in net.named_modules()}
    owners = [m for m in net.modules() if any(True for _ in m.parameters(recurse=False))]
    # Each layer's last stamp, with its place in stamping order: CUDA events do not sort by time.
    seq = itertools.count()
    fwd_stamp: dict[Any, tuple[int, Any]] = {}
    out_bytes: dict[Any, int] = {}
    grad_stamp: dict[Any, tuple[int, Any]] = {}
    handles = []

    def on_forward(module, _inputs, output) -> None:
        fwd_stamp[module] = (next(seq), timer.stamp())
        if hasattr(output, "numel"):
            out_bytes[module] = output.numel() * output.element_size()

    def on_grad(m) -> None:
        grad_stamp[m] = (next(seq), timer.stamp())

    for m in owners:
        handles.append(m.register_forward_hook(on_forward))
        for p in m.parameters(recurse=False):
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(lambda _p, m=m: on_grad(m)))
    per_layer: dict[Any, dict[str, list[float]]] = {m: {"fwd": [], "bwd": []} for m in owners}
    data, update, compute, passes = [], [], [], []
    order: list[Any] = []
    try:
        for step in range(warmup + repeats):
            fwd_stamp.clear()
            grad_stamp.clear()
            it = timed_iteration(net, opt, train, sampler, step, dev, timer)
            if step < warmup:
                continue
            order = sorted(fwd_stamp, key=lambda m: fwd_stamp[m][0])
            prev = it["fwd_start"]
            for m in order:
                per_layer[m]["fwd"].append(timer.elapsed(prev, fwd_stamp[m][1]))
                prev = fwd_stamp[m][1]
            per_layer[order[-1]]["fwd"][-1] += timer.elapsed(prev, it["fwd_end"])  # the loss
            prev = it["bwd_start"]
            for m in sorted(grad_stamp, key=lambda m: grad_stamp[m][0]):
                per_layer[m]["bwd"].append(timer.elapsed(prev, grad_stamp[m][1]))
                prev = grad_stamp[m][1]
            data.append(it["data"])
            update.append(it["update"])
            passes.append(timer.elapsed(it["fwd_start"], it["bwd_end"]))
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
        **_flat_ops(net, repeats, timer),
    }
