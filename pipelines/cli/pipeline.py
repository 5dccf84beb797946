"""`ddlbench run | sync` (the benchmark pipeline and its MLflow journal); `compare` is in cli/compare.py."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from infra.warm import agents as warm_agents
from pipelines import steps
from pipelines.cli.compare import compare
from pipelines.disk import disk_full
from pipelines.launch import JobFailed
from pipelines.spec.load import parse_set
from pipelines.stages import STAGES
from pipelines.tracking.journal import Journal, RunDirGone
from pipelines.tracking.stranded import end_stranded
from pipelines.tracking.upload import TAG_RUN_KEY
from training.config import ConfigError


class SpecRefused(click.ClickException):
    """A spec or `--set` value refused: its one-line reasons, exit 2 (as click's usage errors)."""

    exit_code = 2


def _run(spec: Path, run_key: str | None, home: Path | None, tracking_uri: str | None, sets: tuple[str, ...]) -> None:
    from rich.console import Console

    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    console = Console()
    first, *rest = STAGES
    try:
        ctx = first.run(
            str(spec), run_key=run_key, home=str(home) if home else None, overrides=parse_set(sets) or None
        )
    except ConfigError as err:  # SpecError too
        raise SpecRefused(str(err)) from None
    except RunDirGone as err:
        _vanished(err)
    except OSError as err:  # the run directory or its journal cannot be written
        if (full := disk_full(err)) is None:
            raise
        click.echo(f"ddlbench run: {full}", err=True)
        sys.exit(1)
    console.print(
        f"run [bold]{ctx.run_key}[/] in {ctx.run_dir}  (MLflow {ctx.tracking_uri}, experiment {ctx.experiment})"
    )
    results, failed = _run_stages(console, ctx, rest)
    if "vanished" in results:  # nothing of the run is left to summarise
        _vanished(results["vanished"])
    done = next(results[s.name] for s in rest if s.takes_outcome)
    trained = next((results.get(s.name, []) for s in rest if s.mapped), [])
    reported = next((results.get(s.name, {}) for s in rest if s.publishes), {})
    validation = json.loads(ctx.paths.validation.read_text()) if ctx.paths.validation.exists() else {}
    from pipelines.cli.run_summary import print_run_summary

    print_run_summary(console, ctx, trained, validation, reported, done)
    if failed:
        sys.exit(1)


def _run_stages(console: Any, ctx: Any, stages: list[Any]) -> tuple[dict[str, Any], bool]:
    """Run the stages after `start` in order (teardown and finish always); their results and
    whether the run failed. A training job that fails fails the run, not the grid."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    failed = False
    results: dict[str, Any] = {}
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:

        def train_grid(stage: Any, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            nonlocal failed
            trained = results[stage.name] = []
            task = progress.add_task(stage.name, total=len(entries))
            for entry in entries:
                progress.update(task, description=f"{stage.name} {entry['key']}")
                try:
                    trained.append(stage.run(ctx, entry))
                except JobFailed as err:
                    failed = True
                    console.print(f"[red]{stage.name} {entry['key']} failed:[/] {err}")
                    trained.append({"key": entry["key"], "status": "FAILED", "run_dir": None, "mlflow_run_id": None})
                progress.advance(task)
            progress.update(task, description=stage.name)
            return trained

        current = None
        try:
            # One warm agent per node for every job of the run (infra/warm.py), stopped before
            # the teardown.
            with warm_agents():
                for stage in (s for s in stages if not s.always and s.runs_in(ctx.suite)):
                    current = stage.name
                    args = [results[n] for n in stage.needs]
                    if stage.mapped:
                        train_grid(stage, *args)
                        continue
                    task = progress.add_task(stage.name, total=1)
                    results[stage.name] = stage.run(ctx, *args)
                    progress.update(task, completed=1)
        except Exception as err:  # noqa: BLE001 - reported, then the run ends FAILED
            failed = True
            _report(console, err, results, current)
        except BaseException:
            failed = True
            raise
        finally:
            for stage in (s for s in stages if s.always):
                try:
                    results[stage.name] = stage.run(ctx, failed=failed) if stage.takes_outcome else stage.run(ctx)
                except Exception as err:  # a full disk (the journal keeps the rest) or a vanished run dir
                    if disk_full(err) is None and not isinstance(err, RunDirGone):
                        raise
                    failed = True
                    _report(console, err, results, stage.name)
            outcome = next(s.name for s in stages if s.takes_outcome)
            done = results[outcome] = results.get(outcome) or _unfinished(ctx)
            if done["pending"] and "disk_full" in results:
                console.print(
                    f"[yellow]the journal keeps {done['pending']} entries MLflow lacks: once space is freed, "
                    f"`ddlbench sync {ctx.run_dir}` uploads them and ends the runs left open FAILED[/]",
                    soft_wrap=True,
                )
            elif done["pending"]:
                console.print(
                    f"[yellow]MLflow unreachable: {done['pending']} journal entries wait for "
                    f"`ddlbench sync {ctx.run_dir}`[/]"
                )
    return results, failed


def _report(console: Any, err: Exception, results: dict[str, Any], stage: str | None) -> None:
    """One line for a failed stage, which it names; a full disk names its path and space
    (pipelines/disk.py); a vanished run directory is kept for the run's last line."""
    from rich.markup import escape

    if isinstance(err, RunDirGone):
        results.setdefault("vanished", err)
    elif full := disk_full(err):
        results.setdefault("disk_full", str(full))
        console.print(f"[red]{escape(str(full))}[/]", soft_wrap=True)
    else:
        where = f"{stage} failed: " if stage else ""
        console.print(f"[red]{where}{type(err).__name__}: {escape(str(err))}[/]", soft_wrap=True)


def _vanished(err: RunDirGone) -> NoReturn:
    """The run's one last line (stderr), exit 1: its directory vanished; what became of its MLflow runs."""
    key = err.run_dir.name
    if err.ended is None:
        runs = f"its MLflow runs stay RUNNING until `ddlbench sync --abandoned {key}` (MLflow unavailable)"
    else:
        runs = f"{len(err.ended)} MLflow runs of it ended FAILED"
    click.echo(f"ddlbench run: {err}; {runs}", err=True)
    sys.exit(1)


def _unfinished(ctx: Any) -> dict[str, Any]:
    """`finish`'s result when it could not run to its end (its disk full)."""
    return {"run_key": ctx.run_key, "status": "FAILED", "orphans_failed": [], "synced": False,
            "pending": Journal(ctx.run_dir).pending(), "parent_run_id": None}


run = click.Command(
    "run",
    callback=_run,
    help="Run a benchmark spec end to end without Airflow: provision, microbench, profile, fit, "
    "predict, train the grid, validate, report, teardown. Rerunning a run key resumes it.",
    params=[
        click.Argument(["spec"], type=click.Path(path_type=Path, exists=True, dir_okay=False)),
        click.Option(["--run-key"], default=None, help="Resume or name this run; default: name-time-hash."),
        click.Option(
            ["--home"],
            type=click.Path(path_type=Path),
            default=None,
            help="Run dirs and the default MLflow store; default $DDLBENCH_HOME or ./.ddlbench.",
        ),
        click.Option(
            ["--tracking-uri"],
            default=None,
            help="MLflow tracking URI; default $MLFLOW_TRACKING_URI or sqlite:///<home>/mlflow.db.",
        ),
        click.Option(
            ["--set", "sets"],
            multiple=True,
            metavar="KEY=VALUE",
            help="Override a spec field (dotted keys reach into sections); repeatable.",
        ),
    ],
)


_RUN_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def _sync(targets: tuple[str, ...], home: Path | None, tracking_uri: str | None, abandoned: bool) -> None:
    from rich.console import Console

    home = home or steps.default_home()
    runs_root = home / "runs"
    dirs = [Path(t) if Path(t).is_dir() else runs_root / t for t in targets] or sorted(
        p.parent for p in runs_root.glob("*/ctx.json")
    )
    vanished = [d for d in dirs if not (d / "ctx.json").exists()]
    for d in vanished:
        if not abandoned or not _RUN_KEY.fullmatch(d.name):
            raise click.BadParameter(
                f"{d}: not a ddlbench run directory (no ctx.json); the MLflow runs of a run whose "
                "directory vanished: `ddlbench sync --abandoned RUN_KEY`", param_hint="TARGETS")
    console = Console()
    pending = 0
    for d in (d for d in dirs if d not in vanished):
        res = steps.sync(d, tracking_uri, abandoned)
        pending += res["pending"]
        note = f", orphans marked FAILED: {', '.join(res['orphans_failed'])}" if res["orphans_failed"] else ""
        err = f" [red]({res['error']})[/]" if res["error"] else ""
        console.print(f"{res['run_key']}: uploaded {res['uploaded']}, pending {res['pending']}{note}{err}")
    if abandoned:  # named run keys without a directory, or every run in the store
        keys = [d.name for d in vanished] if targets else [None]
        _sync_vanished(console, keys, tracking_uri or steps.default_tracking_uri(home))
    if pending:
        sys.exit(1)


def _sync_vanished(console: Any, keys: list[str | None], tracking_uri: str) -> None:
    """End FAILED the RUNNING MLflow runs of these run keys (None: of any) whose run directory is
    gone and whose owner is dead or the pipeline run (pipelines/tracking/stranded.py); say which, by run key."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    for key in keys:
        swept = end_stranded(client, run_key=key)
        by_key: dict[str, list[str]] = {k: [] for k in [key] if k}
        for run in swept.ended:
            by_key.setdefault(run.data.tags[TAG_RUN_KEY], []).append(run.info.run_name)
        for run, why in swept.kept:
            console.print(f"{run.data.tags[TAG_RUN_KEY]}: run directory gone, {run.info.run_name} left RUNNING: {why}",
                          soft_wrap=True)
        for k, names in by_key.items():
            ended = f"MLflow runs marked FAILED: {', '.join(names)}" if names else "no MLflow run of it left to end"
            console.print(f"{k}: run directory gone, {ended}", soft_wrap=True)


sync = click.Command(
    "sync",
    callback=_sync,
    help="Upload to MLflow what run journals hold and MLflow lacks; mark runs left RUNNING by killed "
    "processes FAILED. TARGETS: run dirs or run keys (default: every run under home).",
    params=[
        click.Argument(["targets"], nargs=-1),
        click.Option(["--home"], type=click.Path(path_type=Path), default=None),
        click.Option(["--tracking-uri"], default=None, help="Upload here instead of the run's own store."),
        click.Option(
            ["--abandoned"],
            is_flag=True,
            help="The pipeline runs will not go on (their Airflow DAG runs ended without `finish`, or their "
            "run directories vanished): end their parent runs FAILED too, and the MLflow runs left RUNNING "
            "by runs whose directory is gone (those TARGETS, else every run in the store) whose process "
            "is dead.",
        ),
    ],
)


COMMANDS: list[click.Command] = [run, sync, compare]
