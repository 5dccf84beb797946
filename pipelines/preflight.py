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

from pipelines.spec import BenchSpec, SpecError
from pipelines.spec.load import by_field


def preflight(spec: BenchSpec, entries: list[dict[str, Any]], home: Path, source: str = "spec") -> None:
    """SpecError listing every problem of `spec` and its grid `entries`; nothing is created."""
    problems = _jobs(entries, source, spec.train_timeout_s) + _writable(home)
    if problems:
        raise SpecError("\n".join(by_field(problems)))


def _jobs(entries: list[dict[str, Any]], source: str, timeout_s: float) -> list[str]:
    from pipelines.launch import prepare
    from training.config import ConfigError, build_config
    from training.gpt_shape import GPT_OPTIONS

    problems, seen = [], set()
    for entry in entries:
        cfg = entry["config"]
        # Repeats and algorithms share model, data and shapes: check each combination once.
        what = tuple(str(cfg.get(k)) for k in ("model", "dataset", "data_root", "input_shape", "num_classes",
                                                 "workers", "batch_size", "synthetic_samples", "steps", "epochs",
                                                 "threads", "device", *GPT_OPTIONS))
        if what in seen:
            continue
        seen.add(what)
        where = f"{source}.grid[{entry['key']}]"
        try:
            _generated_fits(build_config(cfg, where), where)  # arithmetic first: a refusal builds no model
            checked = prepare(cfg, source=where)
        except ConfigError as err:
            problems.append(str(err))
            continue
        if problem := _finishes(checked, where, timeout_s):  # prepare checked the batch against the data
            problems.append(problem)
    return problems


def _generated_fits(cfg: Any, where: str) -> None:
    from training.config import ConfigError
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


def _writable(home: Path) -> list[str]:
    """The home's run directories can be made: the nearest existing folder is writable."""
    target = Path(home) / "runs"
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"home: {home} cannot be written ({existing} is not a writable folder)"]
    return []
