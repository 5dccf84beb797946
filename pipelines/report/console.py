"""Readable console output of results (rich tables)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipelines.report.tables import NO_BASELINE
from pipelines.report.validation import model_error_cell, ms, ms_interval, pct

FASTEST, FIRST = "*", "+"
LEGEND = (
    f"median [min, max] over the repeats; {FASTEST} fastest, {FIRST} first to the target "
    "among the algorithms of one model, workers and batch"
)


def fmt(v: Any, digits: int = 4) -> str:
    """A figure for a table cell: `digits` significant digits, "-" for none."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def fmt_spread(
    median: float | None,
    lo: float | None,
    hi: float | None,
    digits: int = 4,
    unit: str = "",
    sep: str = " ",
    mark: str = "",
) -> str:
    """`median unit [min, max]` ("-" when nothing was measured; no brackets for one value);
    `mark` follows the median, `sep` goes before the brackets (a newline in the terminal table)."""
    if median is None and lo is None:
        return "-"
    head = f"{fmt(median, digits)}{f' {unit}' if unit else ''}{mark}"
    if lo == hi == median:
        return head
    return f"{head}{sep}[{fmt(lo, digits)}, {fmt(hi, digits)}]"


def fmt_scaling(row: dict[str, Any]) -> str:
    """Scaling efficiency against the 1-worker baseline, or why there is none."""
    if row.get("scaling_baseline") is None:
        return NO_BASELINE
    if row["scaling_baseline"] == row["config"]:
        return "1-worker baseline"
    return fmt(row["scaling_efficiency"], 3)


def fmt_time_to_target(row: dict[str, Any], sep: str = " ", with_steps: bool = True, mark: str = "") -> str:
    """`12.3 s [10.1, 14.2]` (and the steps it took), `not reached in K steps`, or "-" without a target."""
    med = row.get("time_to_accuracy_median_s")
    if row.get("target_accuracy") is None and med is None:
        return "-"
    if med is None:
        steps = f" in {fmt(row.get('steps_median'))} steps" if row.get("steps_median") is not None else ""
        reached = row.get("target_reached_repeats") or 0
        return f"not reached{steps}" + (f"{sep}({reached} of {row['repeats']} repeats did)" if reached else "")
    lo, hi = row.get("time_to_accuracy_min_s"), row.get("time_to_accuracy_max_s")
    if hi is None:
        text = f"{fmt(med, 3)} s{mark}{sep}[{fmt(lo, 3)}, not reached]"
    else:
        text = fmt_spread(med, lo, hi, 3, "s", sep, mark)
    if with_steps and row.get("steps_to_accuracy_median") is not None:
        text += f", {fmt(row['steps_to_accuracy_median'])} steps"
    return text


def marks(row: dict[str, Any], best: dict[str, dict[str, Any]]) -> tuple[str, str]:
    """The fastest and first-to-target marks of a row among its model, workers and batch."""
    b = best.get(f"{row['model']}-w{row['workers']}-b{row['batch_size']}") or {}
    return (
        FASTEST if b.get("fastest_config") == row["config"] else "",
        FIRST if b.get("first_to_target_config") == row["config"] else "",
    )


def comparison_table(table: list[dict[str, Any]], best: dict[str, dict[str, Any]], title: str | None = None) -> Table:
    """The algorithms side by side, for a terminal of 100 columns: whole config names, units,
    the fastest and the first to the target marked."""
    # Text, not markup: "[min, max]" would read as a rich style tag
    t = Table(
        title=Text(title) if title else None,
        caption=Text(LEGEND),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    width = max([len(r["config"]) for r in table] + [6])
    t.add_column("config", no_wrap=True, min_width=width)
    t.add_column("n", justify="right")
    t.add_column("throughput samples/s", justify="right")
    t.add_column("scaling eff.", justify="right")
    t.add_column("final accuracy", justify="right")
    t.add_column("time to target", justify="right")
    for row in table:
        fastest, first = marks(row, best)
        cells = (
            row["config"],
            str(row["repeats"]),
            fmt_spread(row["throughput_median"], row["throughput_min"], row["throughput_max"], 4, "", "\n", fastest),
            fmt_scaling(row),
            fmt_spread(
                row["final_accuracy_median"], row.get("final_accuracy_min"), row.get("final_accuracy_max"), 3, sep="\n"
            ),
            fmt_time_to_target(row, sep="\n", with_steps=False, mark=first),
        )
        t.add_row(*(Text(c) for c in cells))
    return t


def language_model_table(table: list[dict[str, Any]]) -> Table | None:
    """The language models' figures (tokens/s, MFU, evaluation loss and the time to its target),
    which their token accuracy in the comparison does not tell; None without a language model."""
    rows = [r for r in table if r.get("tokens_per_s_median") is not None]
    if not rows:
        return None
    t = Table(title=Text("language models"), box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("config", no_wrap=True, min_width=max(len(r["config"]) for r in rows))
    for name in ("tokens/s", "MFU", "final test loss", "target loss", "time to target loss s"):
        t.add_column(name, justify="right")
    for r in rows:
        cells = (
            r["config"],
            fmt_spread(r["tokens_per_s_median"], r["tokens_per_s_min"], r["tokens_per_s_max"], 5, "", "\n"),
            fmt_spread(r["mfu_median"], r["mfu_min"], r["mfu_max"], 3, "", "\n"),
            fmt(r["final_test_loss_median"]),
            fmt(r["target_loss"]),
            fmt_spread(r["time_to_loss_median_s"], r["time_to_loss_min_s"], r["time_to_loss_max_s"], 4, "", "\n"),
        )
        t.add_row(*(Text(c) for c in cells))
    return t


def print_summary(summary: dict[str, Any], out: Path | None = None) -> None:
    """One training run: configuration, speed, iteration breakdown, accuracy."""
    t = Table(
        title=f"{summary['algorithm']}/{summary['comm']} {summary['model']} on {summary['dataset']}", show_header=False
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row(
        "workers x batch",
        f"{summary['workers']} x {summary['batch_size']}"
        + (f" (+{summary['servers']} servers)" if summary["servers"] else ""),
    )
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


def validation_table(validation: dict[str, Any]) -> Table:
    """The validate stage's figures for the terminal: per configuration the end-to-end error, the
    model's error (in-situ compute) and the repeats' spread, with their median and worst."""
    t = Table(title="Predicted vs measured iteration (ms): end to end (the profile) and model (in-situ compute)",
              box=box.SIMPLE_HEAD)
    t.add_column("config", no_wrap=True)
    for col in ("n", "predicted", "p10-p90", "measured", "end to end", "model", "spread"):
        t.add_column(col, justify="right", no_wrap=True)

    for c in validation.get("configs") or []:
        lo, hi = c.get("predicted_p10_s"), c.get("predicted_p90_s")
        t.add_row(f"{c['model']}-{c['algorithm']}-{c['comm']}-w{c['workers']}", str(c["repeats"]),
                  ms(c["predicted_iter_s"]), ms_interval(lo, hi), ms(c["measured_iter_s"]),
                  pct(c["error"]), model_error_cell(c), pct(c.get("repeat_spread")))

    def ab(k: str) -> str:
        v = validation.get(k)
        return "-" if v is None else f"{v:.1%}"

    t.caption = ("spread: max/min - 1 of the repeats' measured iteration. "
                 f"|end to end| median {ab('median_abs_error')}, worst {ab('worst_abs_error')}; |model| median "
                 f"{ab('median_abs_model_error')}, worst {ab('worst_abs_model_error')}; repeat spread median "
                 f"{ab('median_repeat_spread')}, worst {ab('worst_repeat_spread')}")
    return t
