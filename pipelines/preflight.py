"""Everything about a spec that can be checked before any process, run directory or MLflow
run exists: every job of the grid (model, dataset, data root, shapes: `launch.prepare`),
each global batch against its data set, and that the home can be written. Where every job's
ranks go on the provider's nodes is checked earlier, when the spec loads
(`pipelines.spec_placement.placement_problems`).

`start` calls `preflight` first, so `ddlbench run` and both DAGs' `start` task fail at
once with one line per problem, naming the field and the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipelines.spec import BenchSpec, SpecError


def preflight(spec: BenchSpec, entries: list[dict[str, Any]], home: Path, source: str = "spec") -> None:
    """SpecError listing every problem of `spec` and its grid `entries`; nothing is created."""
    problems = _jobs(entries, source) + _writable(home)
    if problems:
        raise SpecError("\n".join(dict.fromkeys(problems)))


def _jobs(entries: list[dict[str, Any]], source: str) -> list[str]:
    from pipelines.launch import prepare
    from training.config import ConfigError
    from training.gpt_shape import GPT_OPTIONS

    problems, seen = [], set()
    for entry in entries:
        cfg = entry["config"]
        # Repeats and algorithms share model, data and shapes: check each combination once.
        what = tuple(str(cfg.get(k)) for k in ("model", "dataset", "data_root", "input_shape", "num_classes",
                                                 "workers", "batch_size", "synthetic_samples", *GPT_OPTIONS))
        if what in seen:
            continue
        seen.add(what)
        where = f"{source}.grid[{entry['key']}]"
        try:
            checked = prepare(cfg, source=where)
        except ConfigError as err:
            problems.append(str(err))
            continue
        if problem := _batch_fits(checked, where):
            problems.append(problem)
    return problems


def _batch_fits(cfg: Any, where: str) -> str | None:
    from training.datasets import load_dataset
    from training.trainer import resolve_input_shape

    train, _ = load_dataset(cfg, resolve_input_shape(cfg))
    if cfg.workers * cfg.batch_size > len(train):
        return (f"{where}.batch_size: a global batch of {cfg.workers} workers x {cfg.batch_size} = "
                f"{cfg.workers * cfg.batch_size} exceeds the {len(train)} training samples of {cfg.dataset}")
    return None


def _writable(home: Path) -> list[str]:
    """The home's run directories can be made: the nearest existing folder is writable."""
    target = Path(home) / "runs"
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [f"home: {home} cannot be written ({existing} is not a writable folder)"]
    return []
