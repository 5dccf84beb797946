"""How a stage runs: once per run key, in its own MLflow child run, journaled and flushed at its end.

A finished stage records its result (`steps/<name>.json`); calling it again returns that
record. After a failure or a kill it runs again and reopens its own MLflow run, found by tags.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.context import RunContext
from pipelines.spec import BenchSpec, Workload
from pipelines.tracking import Tracker

if TYPE_CHECKING:
    from infra import Provider


def write_json(path: Path, data: Any) -> Path:
    """Write JSON atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    return path


def run_tags(ctx: RunContext) -> dict[str, str]:
    """What identifies every run of this pipeline run (DESIGN §6); a retry finds its runs by them."""
    tags = {
        "ddlbench.hardware": ctx.hardware,
        "ddlbench.spec_hash": ctx.spec_hash,
        "ddlbench.suite": ctx.suite,
        "ddlbench.git_commit": ctx.git_commit or "unknown",
    }
    tags |= {f"airflow.{k}": str(ctx.airflow[k]) for k in ("dag_id", "run_id") if ctx.airflow.get(k)}
    return tags


def tracker(ctx: RunContext) -> Tracker:
    return ctx.tracker


def run_once(
    ctx: RunContext,
    name: str,
    body: Callable[[Tracker, str], Any],
    *,
    node: str | None = None,
    tags: dict[str, Any] | None = None,
) -> Any:
    """Run `body(tracker, node)` once in its own child run; later calls return its result.

    What the stage logs is journaled as it goes and reaches MLflow in one flush at its end
    (or when it fails); only opening the run is flushed at once, so its run id is known.
    """
    done = ctx.paths.recorded(name)
    if done.exists():
        return json.loads(done.read_text())
    t = tracker(ctx)
    node = node or name
    tags = {**run_tags(ctx), "ddlbench.step": name.split("/")[0], **(tags or {})}
    with t.batch():
        t.end_orphans()
        with t.run(node, node.split("/")[-1], tags=tags):
            result = body(t, node)
    write_json(done, result)
    return result


def provider(spec: BenchSpec) -> Provider:
    """The run's cluster provider, not yet provisioned: its ranks use the spec's training threads."""
    return spec.provider.build(threads=spec.train.get("threads", 1))


def cluster_handle(ctx: RunContext) -> dict[str, Any]:
    """The handle `provision` recorded for the run's cluster; {} when there is none to share."""
    path = ctx.paths.cluster
    return json.loads(path.read_text())["handle"] if path.exists() else {}


@contextmanager
def cluster(ctx: RunContext) -> Iterator[Provider]:
    """The run's cluster, for one task (DESIGN §5: one cluster per pipeline run): the one `provision`
    made, adopted and left up for the next task; where the provider shares none (its handle is {},
    e.g. local), a provider of the task's own, released when the task ends."""
    p = provider(ctx.spec())
    handle = cluster_handle(ctx)
    if handle:
        p.adopt(handle)
        yield p
        return
    with p:
        yield p


def workload_dir(wl: Workload, batch: int) -> str:
    """The name of a workload and batch size under profile/ (and in metric names)."""
    return f"{wl.label}-b{batch}"


def load_inputs(ctx: RunContext) -> tuple[dict[str, dict] | None, dict | None]:
    """(layers per workload dir, comm model) from profile and fit, None where skipped."""
    layers = {p.parent.name: json.loads(p.read_text()) for p in ctx.paths.layer_files()}
    model_path = ctx.paths.fit_model
    model = json.loads(model_path.read_text()) if model_path.exists() else None
    return layers or None, model


def columns(rows: list[dict[str, Any]], keys: Any = None) -> dict[str, list[Any]]:
    """Rows as the columns MLflow's log_table takes (keys: those of the first row by default)."""
    keys = list(keys if keys is not None else (rows[0] if rows else ()))
    return {k: [r.get(k) for r in rows] for k in keys}
