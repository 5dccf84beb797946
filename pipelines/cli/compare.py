"""`ddlbench compare`: the algorithms side by side over the pipeline runs MLflow holds."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click


def _day(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"expected a date such as 2026-11-29, got {value!r}") from None


def _as_run(child: Any) -> dict[str, Any]:
    """A training child run of MLflow in the shape report.comparison takes."""
    from pipelines.metrics import summary_from_metrics
    from pipelines.report.tables import config_label, config_of

    t = child.data.tags
    algo = f"{t.get('ddlbench.algorithm')}-{t.get('ddlbench.comm')}"
    workers, batch = int(t.get("ddlbench.workers", 0)), int(t.get("ddlbench.batch_size", 0))
    return {
        "key": t.get("ddlbench.config_key"),
        "algorithm": algo,
        "model": t.get("ddlbench.model"),
        "dataset": t.get("ddlbench.dataset"),
        "workers": workers,
        "batch_size": batch,
        "config": t.get("ddlbench.config")
        or (config_of(t["ddlbench.config_key"]) if t.get("ddlbench.config_key") else None)
        or config_label(t.get("ddlbench.model"), algo, workers, batch),
        "summary": summary_from_metrics(child.data.metrics),
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
    from rich.text import Text

    from pipelines.context import default_home, default_tracking_uri
    from pipelines.report.console import comparison_tables

    uri = tracking_uri or default_tracking_uri((home or default_home()).resolve())
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(f"ddlbench-{suite}")
    if exp is None:
        raise click.UsageError(f"--suite: no experiment ddlbench-{suite} in {uri}")
    found = compare_runs(client, exp.experiment_id, hardware, _day(since), _day(until))
    console = Console()
    if not found:
        console.print("no runs found")
        return
    for run in found:
        title = (
            f"{run['run_key']}  {run['date']:%Y-%m-%d %H:%M}  {run['hardware']}  {run['status']}  "
            f"regression: {run['regression']}"
        )
        if run["table"]:
            for table in comparison_tables(run["table"], run["best"], title=title):
                console.print(table)
        else:
            console.print(Text(f"{title}\n  no finished training runs in MLflow\n"))


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
