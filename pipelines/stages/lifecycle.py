"""The pipeline run's frame: start it, provision its cluster, tear it down, finish it, sync it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra import ProviderError
from infra.options import excerpt
from pipelines.context import RunContext, default_tracking_uri, load_context
from pipelines.preflight import preflight
from pipelines.rundir import REPO, RunDir, default_home
from pipelines.spec import BenchSpec, SpecError, flatten, grid, load_spec
from pipelines.spec.load import load_file
from pipelines.spec.trigger import check_trigger, check_trigger_provider, spec_file
from pipelines.spec.trigger import home_dir as trigger_home
from pipelines.stages.runner import cluster, cluster_handle, provider, run_once, run_tags, tracker, write_json
from pipelines.tracking import PARENT, Tracker
from pipelines.tracking.journal import now_ms
from pipelines.tracking.uri import mask_uri

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _run_key(spec: BenchSpec, run_key: str | None) -> str:
    """The given run key made directory-safe, or name-time-hash."""
    if run_key is None:
        return f"{spec.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{spec.spec_hash()[:6]}"
    if not _UNSAFE.sub("", run_key):
        raise SpecError(f"run_key: {run_key!r} has no usable characters")
    return _UNSAFE.sub("-", run_key).strip("-")


def _new_run(
    spec: BenchSpec, entries: list[dict[str, Any]], spec_path: str, run_dir: RunDir, home: Path, airflow: dict | None
) -> RunContext:
    """Make the run dir: the resolved spec, its grid and the run context."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    write_json(run_dir.spec_json, spec.model_dump(mode="json"))
    write_json(run_dir.grid, entries)
    run_dir.spec_yaml.write_text(Path(spec_path).read_text())
    return RunContext(
        run_key=run_dir.root.name,
        run_dir=run_dir.root,
        home=home,
        tracking_uri=mask_uri(default_tracking_uri(home)),  # no password in ctx/XCom
        experiment=spec.experiment,
        spec_path=str(Path(spec_path).resolve()),
        spec_hash=spec.spec_hash(),
        hardware=spec.hardware,
        suite=spec.suite.value,
        git_commit=_git_commit(),
        airflow={k: v for k, v in (airflow or {}).items() if k in ("dag_id", "run_id")},
    )


def plan(
    spec_path: str, *, home: str | None = None, overrides: dict | None = None, airflow: dict | None = None
) -> tuple[BenchSpec, list[dict[str, Any]], Path]:
    """What `start` checks before it creates anything: the spec (+ overrides), its grid and every
    job of it (pipelines/preflight.py); a run from Airflow (`airflow` given) first keeps to what a
    trigger may choose (pipelines/spec/trigger.py), before any file is read. SpecError naming the field;
    nothing is written, no process starts and nothing is allocated past the bounds (infra/bounds.py)."""
    if airflow is not None:
        check_trigger(spec_path, home, overrides)
        check_trigger_provider(load_file(spec_file(spec_path), BenchSpec.model_fields), overrides)
    spec = load_spec(spec_file(spec_path), overrides)
    home_dir = trigger_home(home) if home else default_home().resolve()
    if home_dir is None:
        raise SpecError(f"home: {excerpt(home)} is not a path")
    entries = grid(spec)
    preflight(spec, entries, home_dir, Path(spec_path).name)
    return spec, entries, home_dir


def start(
    spec_path: str,
    *,
    run_key: str | None = None,
    home: str | None = None,
    overrides: dict | None = None,
    airflow: dict | None = None,
) -> RunContext:
    """Validate the spec (+ overrides) and check every job of it (`plan`), make the run dir, open
    or find the parent MLflow run."""
    spec, entries, home_dir = plan(spec_path, home=home, overrides=overrides, airflow=airflow)
    spec_hash = spec.spec_hash()
    run_dir = RunDir(home_dir / "runs" / _run_key(spec, run_key))
    if run_dir.ctx.exists():
        ctx = load_context(run_dir.root)
        if ctx.spec_hash != spec_hash:
            raise SpecError(
                f"run_key: {ctx.run_key!r} already ran a different spec (hash {ctx.spec_hash}, "
                f"now {spec_hash}); choose another run key"
            )
    else:
        ctx = _new_run(spec, entries, spec_path, run_dir, home_dir, airflow)
        write_json(run_dir.ctx, ctx.as_dict())
    t = tracker(ctx)
    tags = {
        **run_tags(ctx),
        "ddlbench.spec_name": spec.name,
        "mlflow.source.git.commit": ctx.git_commit or "",
        **{f"airflow.{k}": v for k, v in (airflow or {}).items() if v is not None},
    }
    with t.batch():  # the parent run is in MLflow when start returns
        t.end_orphans()
        # Under Airflow the parent belongs to the DAG run, not to this task's short-lived process.
        t.start_run(PARENT, ctx.run_key, parent=None, tags=tags, owned_by_pipeline=bool(ctx.airflow))
        if not ctx.paths.recorded("start").exists():
            t.log_params(PARENT, flatten(spec.model_dump(mode="json"), "spec."))
            t.log_artifact(PARENT, run_dir.spec_yaml, "spec")
            t.log_artifact(PARENT, run_dir.spec_json, "spec")
            write_json(ctx.paths.recorded("start"), {"started_ms": now_ms()})
    ctx.parent_run_id = t.run_id(PARENT)
    write_json(run_dir.ctx, ctx.as_dict())
    return ctx


def provision(ctx: RunContext) -> dict:
    """Create the run's cluster, once (DESIGN §5): its handle goes to `cluster.json`, where every
    microbench, profile and train task finds and adopts it; `teardown` releases it.

    Under Airflow the cluster outlives this task's process; under `ddlbench run` it is also
    released should that one process die. A retry finds the recorded cluster and keeps it if it is
    still up, else makes a new one."""
    spec = ctx.spec()
    path = ctx.paths.cluster
    if path.exists() and ctx.paths.recorded("provision").exists():
        try:
            with cluster(ctx) as p:
                p.provision()  # an adopted cluster: checks that it is still there
        except ProviderError:
            path.unlink()
            ctx.paths.recorded("provision").unlink()

    def body(t: Tracker, node: str) -> dict:
        p = provider(spec)
        stale = cluster_handle(ctx)
        if stale:  # a provision that died between creating its cluster and recording its step
            p.adopt(stale)
            p.teardown()
            p = provider(spec)
        started = time.monotonic()
        try:
            nodes = [{"name": n.name, "address": n.address}
                     for n in p.provision_shared(owner=None if ctx.airflow else os.getpid())]
            handle = p.handle()
            write_json(path, {"provider": spec.provider.name, "handle": handle})
        except BaseException:
            p.teardown()
            raise
        if not handle:  # nothing shared (local): each task uses a provider of its own
            p.teardown()
        t.log_params(
            node,
            {
                "provider": spec.provider.name,
                "nodes": len(nodes),
                **flatten(spec.provider.options, "provider.options."),
            },
        )
        t.log_metrics(node, {"provision_s": time.monotonic() - started})
        t.set_tags(PARENT, {"ddlbench.provider": spec.provider.name})
        return {"provider": spec.provider.name, "nodes": nodes, "handle": handle}

    return run_once(ctx, "provision", body)


def teardown(ctx: RunContext) -> dict:
    """Release the run's cluster; always runs, also after failures and killed tasks, and may run twice."""
    spec = ctx.spec()
    p = provider(spec)
    handle = cluster_handle(ctx)
    if handle:
        p.adopt(handle)
    p.teardown()
    tracker(ctx).set_tags(PARENT, {"ddlbench.teardown": datetime.now(UTC).isoformat(timespec="seconds")})
    return {"provider": spec.provider.name, "torn_down": True, "handle": handle}


def finish(ctx: RunContext, failed: bool = False) -> dict:
    """Close the parent run FINISHED or FAILED; child runs still open are orphans: FAILED."""
    t = tracker(ctx)
    t.journal.release_reserve()  # its space is for these last records (pipelines/tracking/journal.py)
    status = "FAILED" if failed else "FINISHED"
    with t.batch():
        orphans = t.end_orphans(everyone=True, keep=(PARENT,))
        t.end_run(PARENT, status)
        synced = t.flush(force=True)
    write_json(ctx.paths.status, {"status": status, "finished_ms": now_ms()})
    return {
        "run_key": ctx.run_key,
        "status": status,
        "orphans_failed": orphans,
        "synced": synced,
        "pending": t.journal.pending(),
        "parent_run_id": t.run_id(PARENT),
    }


def sync(run_dir: str | Path, tracking_uri: str | None = None, abandoned: bool = False) -> dict[str, Any]:
    """Upload what the run's journal holds and MLflow lacks; end orphaned runs FAILED.

    `abandoned`: the pipeline run will not go on (its Airflow DAG run ended without `finish`),
    so its parent run, which no process owns, is an orphan too.
    """
    ctx = json.loads(RunDir(run_dir).ctx.read_text())
    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri  # where a masked URI finds its credentials
        ctx["tracking_uri"] = mask_uri(tracking_uri)
    t = tracker(RunContext.model_validate(ctx))
    before = t.journal.pending()
    orphans = t.end_orphans(abandoned=abandoned)
    t.flush(force=True)
    pending = t.journal.pending()
    return {
        "run_key": ctx["run_key"],
        "uploaded": before + len(orphans) - pending,
        "pending": pending,
        "orphans_failed": orphans,
        "error": t.last_error,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
