"""Readable console output of results (rich tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def fmt(v: Any, digits: int = 4) -> str:
    """A figure for a table cell: `digits` significant digits, "-" for none."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)




def print_summary(summary: dict[str, Any], out: Path | None = None) -> None:
    """One training run: configuration, speed, iteration breakdown, accuracy."""
    t = Table(title=f"{summary['algorithm']}/{summary['comm']} {summary['model']} on {summary['dataset']}",
              show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("workers x batch", f"{summary['workers']} x {summary['batch_size']}"
              + (f" (+{summary['servers']} servers)" if summary["servers"] else ""))
    t.add_row("steps", fmt(summary["steps"]))
    t.add_row("throughput_samples_per_s", fmt(summary["throughput_samples_per_s"]))
    it = summary["iter_time_s"]
    t.add_row("iter_time_s p50 / p95", f"{fmt(it['p50'])} / {fmt(it['p95'])}")
    for phase, v in summary["breakdown_s"].items():
        t.add_row(f"  {phase}_s", fmt(v))
    t.add_row("final_loss", fmt(summary["final_loss"]))
    t.add_row("final_accuracy", fmt(summary["final_accuracy"]))
    if summary.get("time_to_accuracy_s") is not None:
        t.add_row("time_to_accuracy_s", fmt(summary["time_to_accuracy_s"]))
    if summary.get("staleness"):
        t.add_row("staleness mean / max", f"{fmt(summary['staleness']['mean'])} / {summary['staleness']['max']}")
    console = Console()
    console.print(t)
    if out is not None:
        console.print(f"outputs in {out}")
