"""Readable console output of results (rich tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _fmt(v: Any, digits: int = 4) -> str:
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
    t.add_row("steps", _fmt(summary["steps"]))
    t.add_row("throughput_samples_per_s", _fmt(summary["throughput_samples_per_s"]))
    it = summary["iter_time_s"]
    t.add_row("iter_time_s p50 / p95", f"{_fmt(it['p50'])} / {_fmt(it['p95'])}")
    for phase, v in summary["breakdown_s"].items():
        t.add_row(f"  {phase}_s", _fmt(v))
    t.add_row("final_loss", _fmt(summary["final_loss"]))
    t.add_row("final_accuracy", _fmt(summary["final_accuracy"]))
    if summary.get("time_to_accuracy_s") is not None:
        t.add_row("time_to_accuracy_s", _fmt(summary["time_to_accuracy_s"]))
    if summary.get("staleness"):
        t.add_row("staleness mean / max", f"{_fmt(summary['staleness']['mean'])} / {summary['staleness']['max']}")
    console = Console()
    console.print(t)
    if out is not None:
        console.print(f"outputs in {out}")
