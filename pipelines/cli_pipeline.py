"""`ddlbench run | sync | compare` (the benchmark pipeline and MLflow)."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import yaml


def _overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """`--set a.b=VALUE` pairs; VALUE is read as YAML (numbers, lists, booleans)."""
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        out[key.strip()] = yaml.safe_load(raw)
    return out


def _run(spec: Path, run_key: str | None, home: Path | None, tracking_uri: str | None, sets: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pipelines import steps
    from pipelines.launch import JobFailed
    from pipelines.spec import SpecError
    from training.config import ConfigError

    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    console = Console()
    try:
        ctx = steps.start(
            str(spec), run_key=run_key, home=str(home) if home else None, overrides=_overrides(sets) or None
        )
    except (SpecError, ConfigError) as err:
        raise click.UsageError(str(err)) from None
    console.print(
        f"run [bold]{ctx['run_key']}[/] in {ctx['run_dir']}  (MLflow {ctx['tracking_uri']}, "
        f"experiment {ctx['experiment']})"
    )
    failed = False
    trained: list[dict[str, Any]] = []
    validation: dict[str, Any] = {}
    result: dict[str, Any] = {}
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:

        def stage(name: str, fn: Any, *args: Any) -> Any:
            task = progress.add_task(name, total=1)
            out = fn(ctx, *args)
            progress.update(task, completed=1)
            return out

        try:
            stage("provision", steps.provision)
            stage("microbench", steps.microbench)
            stage("profile", steps.profile)
            stage("fit", steps.fit)
            stage("predict", steps.predict)
            entries = steps.train_configs(ctx)
            task = progress.add_task("train", total=len(entries))
            for entry in entries:
                progress.update(task, description=f"train {entry['key']}")
                try:
                    trained.append(steps.train(ctx, entry))
                except JobFailed as err:
                    failed = True
                    console.print(f"[red]train {entry['key']} failed:[/] {err}")
                    trained.append({"key": entry["key"], "status": "FAILED", "run_dir": None, "mlflow_run_id": None})
                progress.advance(task)
            progress.update(task, description="train")
            validation = stage("validate", steps.validate, trained)
            result = stage("report", steps.report, trained, validation)
        except Exception as err:  # noqa: BLE001 - reported, then the run ends FAILED
            failed = True
            console.print(f"[red]{type(err).__name__}: {err}[/]")
        except BaseException:
            failed = True
            raise
        finally:
            steps.teardown(ctx)
            done = steps.finish(ctx, failed=failed)
            if done["pending"]:
                console.print(
                    f"[yellow]MLflow unreachable: {done['pending']} journal entries wait for "
                    f"`ddlbench sync {ctx['run_dir']}`[/]"
                )
    _print_run_summary(console, ctx, trained, validation, result, done)
    if failed:
        sys.exit(1)


def _print_run_summary(
    console: Any,
    ctx: dict[str, Any],
    trained: list[dict[str, Any]],
    validation: dict[str, Any],
    result: dict[str, Any],
    done: dict[str, Any],
) -> None:
    import json

    from rich.table import Table

    from pipelines.report_console import _fmt

    t = Table(title=f"{ctx['run_key']}: {done['status']}")
    for col in ("config", "status", "throughput_samples_per_s", "iter_time_p50_s", "final_accuracy"):
        t.add_column(col, justify="left" if col in ("config", "status") else "right")
    for e in trained:
        s = json.loads(Path(e["run_dir"], "summary.json").read_text()) if e.get("run_dir") else {}
        t.add_row(
            e["key"],
            e["status"],
            _fmt(s.get("throughput_samples_per_s")),
            _fmt((s.get("iter_time_s") or {}).get("p50")),
            _fmt(s.get("final_accuracy")),
        )
    console.print(t)
    if validation.get("median_abs_error") is not None:
        console.print(
            f"prediction error: median {validation['median_abs_error']:.1%}, worst {validation['worst_abs_error']:.1%}"
        )
    for name, best in (result.get("best") or {}).items():
        console.print(f"best for {name}: {best['fastest']} ({_fmt(best['throughput_samples_per_s'])} samples/s)")
    if result:
        console.print(
            f"regression check: {result['status']}"
            + (f" vs {result['baseline_run_key']}" if result.get("baseline_run_key") else "")
            + (f", {len(result['regressions'])} regression(s)" if result["regressions"] else "")
        )
        console.print(f"report: {result['report_md']}")
    console.print(f"MLflow parent run: {done['parent_run_id'] or '(not yet uploaded)'}")


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


def _sync(targets: tuple[str, ...], home: Path | None, tracking_uri: str | None, abandoned: bool) -> None:
    from rich.console import Console

    from pipelines import steps

    runs_root = (home or steps.default_home()) / "runs"
    dirs = [Path(t) if Path(t).is_dir() else runs_root / t for t in targets] or sorted(
        p.parent for p in runs_root.glob("*/ctx.json")
    )
    console = Console()
    pending = 0
    for d in dirs:
        if not (d / "ctx.json").exists():
            raise click.BadParameter(f"{d}: not a ddlbench run directory (no ctx.json)", param_hint="TARGETS")
        res = steps.sync(d, tracking_uri, abandoned)
        pending += res["pending"]
        note = f", orphans marked FAILED: {', '.join(res['orphans_failed'])}" if res["orphans_failed"] else ""
        err = f" [red]({res['error']})[/]" if res["error"] else ""
        console.print(f"{res['run_key']}: uploaded {res['uploaded']}, pending {res['pending']}{note}{err}")
    if pending:
        sys.exit(1)


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
            help="The pipeline runs will not go on (their Airflow DAG runs ended without `finish`): "
            "end their parent runs FAILED too.",
        ),
    ],
)


def _day(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"expected a date such as 2026-11-29, got {value!r}") from None


def _as_run(child: Any) -> dict[str, Any]:
    """A training child run of MLflow in the shape report.comparison takes."""
    from pipelines.report import PHASES

    t, m = child.data.tags, child.data.metrics
    algo = f"{t.get('ddlbench.algorithm')}-{t.get('ddlbench.comm')}"
    workers, batch = int(t.get("ddlbench.workers", 0)), int(t.get("ddlbench.batch_size", 0))
    summary = {
        k: m.get(k) for k in ("throughput_samples_per_s", "final_accuracy", "time_to_accuracy_s", "train_time_s")
    }
    summary |= {"iter_time_s": {"p50": m.get("iter_time_p50_s")}, "breakdown_s": {p: m.get(f"{p}_s") for p in PHASES}}
    return {
        "key": t.get("ddlbench.config_key"),
        "algorithm": algo,
        "model": t.get("ddlbench.model"),
        "dataset": t.get("ddlbench.dataset"),
        "workers": workers,
        "batch_size": batch,
        "config": f"{t.get('ddlbench.model')}-{algo}-w{workers}-b{batch}",
        "summary": summary,
    }


def compare_runs(
    client: Any, experiment_id: str, hardware: str | None, since_ms: int | None, until_ms: int | None
) -> list[dict[str, Any]]:
    """Pipeline runs found with MLflow search, newest first, each with the report's comparison
    table (medians over repeats, scaling efficiency) and best algorithm per config."""
    from pipelines.report import best_per_config, comparison

    filters = ["tags.`ddlbench.node` = 'pipeline'"]
    if hardware:
        filters.append(f"tags.`ddlbench.hardware` = '{hardware}'")
    if since_ms is not None:
        filters.append(f"attributes.start_time >= {since_ms}")
    if until_ms is not None:
        filters.append(f"attributes.start_time < {until_ms}")
    parents = client.search_runs(
        [experiment_id], " AND ".join(filters), order_by=["attributes.start_time DESC"], max_results=200
    )
    found = []
    for p in parents:
        key = p.data.tags.get("ddlbench.run_key")
        children = client.search_runs(
            [experiment_id],
            f"tags.`ddlbench.run_key` = '{key}' AND tags.`ddlbench.step` = 'train' AND attributes.status = 'FINISHED'",
            max_results=5000,
        )
        runs = [_as_run(c) for c in children if c.data.metrics.get("throughput_samples_per_s")]
        table = comparison(runs)
        found.append(
            {
                "run_key": key,
                "date": datetime.fromtimestamp(p.info.start_time / 1000, UTC),
                "hardware": p.data.tags.get("ddlbench.hardware"),
                "status": p.info.status,
                "regression": p.data.tags.get("ddlbench.regression", "-"),
                "table": table,
                "best": best_per_config(table),
            }
        )
    return found


def _compare(
    suite: str, hardware: str | None, since: str | None, until: str | None, home: Path | None, tracking_uri: str | None
) -> None:
    from mlflow import MlflowClient
    from rich.console import Console
    from rich.table import Table

    from pipelines import steps
    from pipelines.report_console import _fmt

    uri = tracking_uri or steps.default_tracking_uri((home or steps.default_home()).resolve())
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(f"ddlbench-{suite}")
    if exp is None:
        raise click.UsageError(f"--suite: no experiment ddlbench-{suite} in {uri}")
    found = compare_runs(client, exp.experiment_id, hardware, _day(since), _day(until))
    console = Console()
    if not found:
        console.print("no runs found")
        return
    t = Table(title=f"ddlbench-{suite}" + (f" on {hardware}" if hardware else "") + "  (* fastest per config)")
    for col in (
        "run",
        "date",
        "hardware",
        "status",
        "regression",
        "config",
        "repeats",
        "throughput_samples_per_s",
        "scaling_eff",
        "final_accuracy",
        "time_to_accuracy_s",
        "best",
    ):
        t.add_column(col)
    for run in found:
        for row in run["table"]:
            group = f"{row['model']}-w{row['workers']}-b{row['batch_size']}"
            t.add_row(
                run["run_key"],
                f"{run['date']:%Y-%m-%d %H:%M}",
                run["hardware"],
                run["status"],
                run["regression"],
                row["config"],
                str(row["repeats"]),
                _fmt(row["throughput_median"]),
                _fmt(row["scaling_efficiency"], 3),
                _fmt(row["final_accuracy_median"], 3),
                _fmt(row["time_to_accuracy_median_s"]),
                "*" if run["best"][group]["fastest"] == row["algorithm"] else "",
            )
    console.print(t)


compare = click.Command(
    "compare",
    callback=_compare,
    help="Compare the algorithms of the runs MLflow holds for a suite (and hardware, date range): "
    "the report's comparison (medians over repeats, scaling efficiency, accuracy, the fastest).",
    params=[
        click.Option(["--suite"], type=click.Choice(["nightly", "onboarding", "adhoc"]), default="nightly"),
        click.Option(["--hardware"], default=None, help="Only this hardware label."),
        click.Option(["--since"], default=None, help="From this date (UTC, e.g. 2026-11-01)."),
        click.Option(["--until"], default=None, help="Before this date (UTC)."),
        click.Option(["--home"], type=click.Path(path_type=Path), default=None),
        click.Option(["--tracking-uri"], default=None),
    ],
)

COMMANDS: list[click.Command] = [run, sync, compare]
