"""What `ddlbench run` prints when its stages are done (rich tables: loaded by the command)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.table import Table

from pipelines.report.console import comparison_tables, fmt, validation_table


def print_run_summary(
    console: Any,
    ctx: Any,
    trained: list[dict[str, Any]],
    validation: dict[str, Any],
    result: dict[str, Any],
    done: dict[str, Any],
) -> None:
    """What `ddlbench run` prints at its end: the training runs, the validation, the algorithms
    compared, the regression check, where the report and the MLflow run are."""
    t = Table(title=f"{ctx.run_key}: {done['status']}")
    t.add_column("run", no_wrap=True, min_width=max([len(e["key"]) for e in trained] + [3]))
    t.add_column("status")
    for col in ("throughput samples/s", "iter p50 s", "final accuracy"):
        t.add_column(col, justify="right")
    for e in trained:
        s = json.loads(Path(e["run_dir"], "summary.json").read_text()) if e.get("run_dir") else {}
        t.add_row(
            e["key"],
            e["status"],
            fmt(s.get("throughput_samples_per_s")),
            fmt((s.get("iter_time_s") or {}).get("p50")),
            fmt(s.get("final_accuracy")),
        )
    console.print(t)
    if validation.get("median_abs_error") is not None:
        console.print(validation_table(validation))
    report_json = Path(result["report_md"]).with_name("report.json") if result.get("report_md") else None
    if report_json is not None and report_json.exists():
        doc = json.loads(report_json.read_text())
        for table in comparison_tables(doc["comparison"], doc["best"], title="Algorithms compared"):
            console.print(table)
    if result:
        console.print(
            f"regression check: {result['status']}"
            + (f", {result['detail']}" if result.get("detail") else "")
            + (f" (latest {result['baseline_run_key']})" if result.get("baseline_run_key") else "")
        )
        console.print(f"report: {result['report_md']}")
    console.print(f"MLflow parent run: {done['parent_run_id'] or '(not yet uploaded)'}")
