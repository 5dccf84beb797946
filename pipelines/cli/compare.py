"""`ddlbench compare`: the algorithms side by side over the pipeline runs MLflow holds."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from pipelines.context import default_tracking_uri
from pipelines.report.hardware import compare_runs, compared_runs, hardware_ratios
from pipelines.rundir import default_home


def _day(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"expected a date such as 2026-11-29, got {value!r}") from None


def _hardware_table(rows: list[dict[str, Any]], label_a: str, label_b: str) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from pipelines.report.console import fmt_spread

    t = Table(title=Text(f"{label_b} against {label_a}: samples/s"), box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, collapse_padding=True, caption_justify="left",
              caption=Text("median [min, max] over the repeats; the ratio's interval pairs the repeats' extremes"))
    t.add_column("config", overflow="fold", min_width=8)
    cells = []
    for r in rows:
        ratio = (fmt_spread(r["ratio"], r["ratio_low"], r["ratio_high"], 3, "", "\n") if r["ratio"] is not None
                 else f"only {label_a if r['only'] == 'A' else label_b}\nran it")
        cells.append([fmt_spread(r["a_median"], r["a_min"], r["a_max"], 4, "", "\n"),
                      fmt_spread(r["b_median"], r["b_min"], r["b_max"], 4, "", "\n"), ratio])
    for i, header in enumerate((label_a, label_b, f"{label_b} / {label_a}")):
        widest = max(len(line) for text in [header, *(c[i] for c in cells)] for line in text.split("\n"))
        t.add_column(header, justify="right", no_wrap=True, min_width=widest)
    for r, c in zip(rows, cells, strict=True):
        t.add_row(Text(r["config"]), *(Text(x) for x in c))
    return t


def _compare(
    suite: str, hardware: tuple[str, ...], since: str | None, until: str | None, home: Path | None,
    tracking_uri: str | None
) -> None:
    from mlflow import MlflowClient
    from rich.console import Console
    from rich.text import Text

    from pipelines.report.console import comparison_tables

    uri = tracking_uri or default_tracking_uri((home or default_home()).resolve())
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(f"ddlbench-{suite}")
    if exp is None:
        raise click.UsageError(f"--suite: no experiment ddlbench-{suite} in {uri}")
    if len(hardware) > 2:
        raise click.UsageError("--hardware: at most two labels (one hardware against another)")
    console = Console()
    if len(hardware) == 2:
        latest = []
        for label in hardware:
            # Its newest pipeline run with finished training runs: the older ones are not searched.
            newest = next((r for r in compared_runs(client, exp.experiment_id, label, _day(since), _day(until))
                           if r["table"]), None)
            if newest is None:
                raise click.UsageError(f"--hardware: no finished training runs of {label!r} in ddlbench-{suite}")
            latest.append(newest)
        a, b = latest
        console.print(Text(f"{hardware[0]}: {a['run_key']} ({a['date']:%Y-%m-%d %H:%M}); "
                           f"{hardware[1]}: {b['run_key']} ({b['date']:%Y-%m-%d %H:%M})"))
        console.print(_hardware_table(hardware_ratios(a["table"], b["table"]), *hardware))
        return
    found = compare_runs(client, exp.experiment_id, hardware[0] if hardware else None, _day(since), _day(until))
    if not found:
        console.print("no runs found")
        return
    for run in found:
        title = (
            f"{run['run_key']}  {run['date']:%Y-%m-%d %H:%M}  {run['hardware']}  {run['status']}  "
            f"regression: {run['regression']}"
        )
        if run["table"]:
            console.print(Text(title))  # a line of its own: a table's title would wrap at the table's width
            for table in comparison_tables(run["table"], run["best"]):
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
        click.Option(["--hardware"], multiple=True, help="Only this hardware label; given twice, the "
                     "newest run of each side by side, per configuration, with the second's samples/s over "
                     "the first's."),
        click.Option(["--since"], default=None, help="From this date (UTC, e.g. 2026-11-01)."),
        click.Option(["--until"], default=None, help="Before this date (UTC)."),
        click.Option(["--home"], type=click.Path(path_type=Path), default=None),
        click.Option(["--tracking-uri"], default=None),
    ],
)
