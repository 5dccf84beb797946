"""Everything about a spec that can be checked before any process, run directory or MLflow
run exists: every job of the grid (model, dataset, data root, shapes: `launch.prepare`),
each global batch against its data set, and that the home can be written. Where every job's
ranks go on the provider's nodes is checked earlier, when the spec loads
(`pipelines.spec.placement.placement_problems`).

`start` calls `preflight` first, so `ddlbench run` and both DAGs' `start` task fail at
once with one line per problem, naming the field and the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infra import ProviderError
from modelling.memory import human_bytes, node_bytes, predict_memory
from modelling.scenario import Scenario
from pipelines.launch import prepare
from pipelines.spec import BenchSpec, SpecError
from pipelines.spec.load import by_field
from training.config import ConfigError, build_config
from training.gpt_shape import GPT_OPTIONS

# The error the memory prediction is held to (tests/test_modelling_memory.py): a job predicted to
# need up to this much more than its devices hold may still fit, and is not refused.
MEMORY_ERROR = 0.05


def preflight(spec: BenchSpec, entries: list[dict[str, Any]], home: Path, source: str = "spec") -> None:
    """SpecError listing every problem of `spec` and its grid `entries`; nothing is created."""
    problems = _jobs(spec, entries, source) + _writable(home)
    if problems:
        raise SpecError("\n".join(by_field(problems)))


def _jobs(spec: BenchSpec, entries: list[dict[str, Any]], source: str) -> list[str]:
    problems, checked, sized, own = [], {}, {}, {}
    for entry in entries:
        cfg = entry["config"]
        # Repeats and algorithms share model, data and shapes: check each combination once.
        what = tuple(str(cfg.get(k)) for k in ("model", "dataset", "data_root", "input_shape", "num_classes",
                                                 "workers", "batch_size", "synthetic_samples", "steps", "epochs",
                                                 "threads", "device", *GPT_OPTIONS))
        where = f"{source}.grid[{entry['key']}]"
        if what not in checked:
            checked[what] = None
            try:
                _generated_fits(build_config(cfg, where), where)  # arithmetic first: a refusal builds no model
                checked[what] = prepare(cfg, source=where)
            except ConfigError as err:
                problems.append(str(err))
                continue
            # prepare checked the batch against the data
            if problem := _finishes(checked[what], where, spec.train_timeout_s):
                problems.append(problem)
        if checked[what] is None:
            continue
        # Memory depends on the algorithm and its optimizers too: each configuration once, each
        # model sized once.
        one = build_config(cfg, where)
        key = (what, one.algorithm, one.comm, one.servers, one.momentum, one.momentum_local, one.momentum_async,
               one.overlap)
        if key not in sized:
            sized[key] = None
            if (capacity := capacity_bytes(spec, one.device.value)) is not None:
                if what not in own:
                    own[what] = _own_memory(one)
                sized[key] = _fits(spec, one, where, own[what], capacity)
            if sized[key]:
                problems.append(sized[key])
    return problems


def _generated_fits(cfg: Any, where: str) -> None:
    from training.datasets import check_generated_size
    from training.shape import resolve_input_shape

    try:
        check_generated_size(cfg, resolve_input_shape(cfg))
    except ValueError as err:
        raise ConfigError(f"{where}.{err}") from None


def _finishes(cfg: Any, where: str, timeout_s: float) -> str | None:
    """Why a job cannot finish within the spec's timeout, from its steps and the least time a step
    of its model can take (training/flops.py); None when it may. No profile exists yet at start:
    the floor is a bound no device exceeds, so only what surely fails is refused."""
    from training.datasets import train_samples
    from training.flops import forward_flops, least_step_s
    from training.shape import resolve_input_shape, resolve_steps
    from training.text import corpus_vocab

    shape = resolve_input_shape(cfg)
    steps = resolve_steps(cfg, train_samples(cfg, shape))
    step_s = least_step_s(forward_flops(cfg.model, shape, cfg.num_classes or corpus_vocab(cfg.dataset), cfg.batch_size,
                                        cfg.model_options), cfg.device.value, cfg.threads)
    if steps * step_s <= timeout_s:
        return None
    field = "steps" if cfg.steps is not None else "epochs"
    return (f"{where}.{field}: {steps:,} steps take at least {steps * step_s:,.0f} s (at least {step_s * 1e3:.3g} ms "
            f"a step on any {cfg.device.value} device), past train_timeout_s of {timeout_s:,.0f} s")


def capacity_bytes(spec: BenchSpec, device: str) -> int | None:
    """The memory of one device (a GPU's, or one CPU node's): the spec's `memory.device`, else
    this host's where the provider is local (a GPU's total, the node's available memory on
    CPU); None where nothing says (a remote cluster's nodes are not this host)."""
    if spec.memory.device is not None:
        return int(spec.memory.device)
    if spec.provider.name != "local":
        return None
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else None
    import psutil

    return psutil.virtual_memory().available


def _own_memory(cfg: Any) -> dict[str, Any] | None:
    """The model's own memory figures (a profile's `memory` section), sized on a few real samples
    or on fake tensors (training/measure/memory.py `size_memory`); None where neither can."""
    from training.measure.memory import size_memory
    from training.shape import resolve_input_shape
    from training.text import corpus_vocab

    return size_memory(cfg.model, resolve_input_shape(cfg), cfg.num_classes or corpus_vocab(cfg.dataset),
                       cfg.batch_size, cfg.model_options)


def _fits(spec: BenchSpec, cfg: Any, where: str, mem: dict[str, Any] | None, capacity: int) -> str | None:
    """Why a job's ranks cannot fit in `capacity` bytes a device, by the model's prediction
    (modelling/memory.py) from its own figures `mem` (`_own_memory`); None where they may, or
    where `mem` is unknown. The prediction's own error (MEMORY_ERROR) is given to the job: only
    what surely fails is refused."""
    if mem is None:
        return None
    try:
        placed = spec.provider.build().place(cfg.workers, cfg.servers).node_of_rank
    except ProviderError:  # the spec's placement check names it
        placed = None
    s = Scenario.from_train_config(cfg, node_of_rank=placed)
    need = node_bytes(predict_memory({"batch_size": cfg.batch_size, "memory": mem}, s)["memory_ranks"], s,
                      cfg.device.value)
    if need <= capacity * (1 + MEMORY_ERROR):
        return None
    held = "a GPU" if cfg.device.value == "cuda" else "a node"
    has = "memory.device" if spec.memory.device is not None else "this host (memory.device states another)"
    return (f"{where}.batch_size: {cfg.model} at a batch of {cfg.batch_size} ({s.algorithm} over {s.comm}, "
            f"{cfg.workers} workers) needs {human_bytes(need)} on {held}, more than the {human_bytes(capacity)} of "
            f"{has}")


def _writable(home: Path) -> list[str]:
    """The home's run directories can be made: the nearest existing folder is writable."""
    target = Path(home) / "runs"
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"home: {home} cannot be written ({existing} is not a writable folder)"]
    return []
