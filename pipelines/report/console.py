"""Readable console output of results (rich tables)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipelines.report.tables import NO_BASELINE
from pipelines.report.validation import ms, ms_interval, pct

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
        # As many digits as the value's whole part has, past `digits` (no exponent: 123456, not 1.235e+05).
        return f"{v:.0f}" if abs(v) >= 10**digits else f"{v:.{digits}g}"
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
        # In a table (a newline `sep`) each line stays short, so the figures keep their width.
        gap = sep if sep == "\n" else " "
        steps = f"{gap}in {fmt(row.get('steps_median'))} steps" if row.get("steps_median") is not None else ""
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


def _figures_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]], title: str | None,
                   caption: str) -> Table:
    """A table of `rows`: a config column that folds, then `columns` of (header, kind, cell). A
    `figure` column is as wide as its widest line and never wraps; a `words` column wraps at spaces,
    never inside a word; a `same` column (the repeats, the target) goes to the caption where every
    row has one value. A column that holds nothing for any row is left out. Whatever the width (a
    terminal, a log of 80 columns), the long configuration names fold and no figure or header is cut."""
    cells = [[cell(r) for _, _, cell in columns] for r in rows]
    nothing = ("-", "", NO_BASELINE.replace(" baseline", "\nbaseline"))
    keep = [i for i in range(len(columns)) if any(c[i] not in nothing for c in cells)]
    said = []
    for i in [i for i in keep if columns[i][1] == "same" and len({c[i] for c in cells}) == 1]:
        keep.remove(i)
        said.append(f"{columns[i][0]}: {cells[0][i]}")
    # Text, not markup: "[min, max]" would read as a rich style tag
    t = Table(title=Text(title) if title else None, caption=Text("; ".join([*said, caption])),
              caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    t.add_column("config", overflow="fold", min_width=8)
    for i in keep:
        header, kind, _ = columns[i]
        lines = [ln for c in cells for ln in c[i].split("\n")]
        if kind != "figure":  # a word, and the header's, never folds
            widest = max(len(w) for text in [*lines, header] for w in text.split() or [""])
            # no wider than its cells, so a long header wraps instead of taking the width the
            # figures need (rich cuts a table whose columns want more than the terminal has)
            most = max(widest, *(len(ln) for ln in lines))
        else:
            widest = most = max(len(text) for text in [*lines, header])
        # A column that cannot narrow is no_wrap, its header folded at spaces to its width: rich narrows
        # the widest wrapping columns first and then grows each back to its min_width, past the
        # terminal's width.
        t.add_column(textwrap.fill(header, most) if most == widest else header, justify="right",
                     no_wrap=most == widest, overflow="fold", min_width=widest, max_width=most)
    for r, c in zip(rows, cells, strict=True):
        t.add_row(Text(r["config"]), *(Text(c[i]) for i in keep))
    return t


def comparison_table(table: list[dict[str, Any]], best: dict[str, dict[str, Any]],
                     title: str | None = None) -> Table | None:
    """The image models side by side (a language model's rows are `language_model_table`'s):
    samples/s, scaling, accuracy and the time to the target accuracy, the fastest and the first
    to the target marked; None without an image model."""
    rows = [r for r in table if r.get("tokens_per_s_median") is None]
    if not rows:
        return None
    columns = [
        ("repeats", "same", lambda r: str(r["repeats"])),
        ("samples/s", "figure", lambda r: fmt_spread(r["throughput_median"], r["throughput_min"], r["throughput_max"],
                                                 4, "", "\n", marks(r, best)[0])),
        ("scaling eff.", "words", lambda r: fmt_scaling(r).replace(" baseline", "\nbaseline")),
        ("accuracy", "figure", lambda r: fmt_spread(r["final_accuracy_median"], r.get("final_accuracy_min"),
                                                r.get("final_accuracy_max"), 3, sep="\n")),
        ("to target", "words", lambda r: fmt_time_to_target(r, sep="\n", with_steps=False, mark=marks(r, best)[1])),
    ]
    return _figures_table(rows, columns, title, LEGEND)


def language_model_table(table: list[dict[str, Any]], title: str | None = None) -> Table | None:
    """The language models' figures (tokens/s, MFU, evaluation loss and the time to its target
    loss), which token accuracy does not tell; None without a language model."""
    rows = [r for r in table if r.get("tokens_per_s_median") is not None]
    if not rows:
        return None
    mark = _loss_marks(rows)
    columns = [
        ("tokens/s", "figure", lambda r: fmt_spread(r["tokens_per_s_median"], r["tokens_per_s_min"],
                                                r["tokens_per_s_max"], 5, "", "\n", mark[r["config"]][0])),
        ("MFU %", "figure", lambda r: fmt_spread(*(_pct(r[f"mfu_{k}"]) for k in ("median", "min", "max")), 3, "",
                                                 "\n")),
        ("test loss", "figure", lambda r: fmt(r["final_test_loss_median"])),
        ("target test loss", "same", lambda r: fmt(r["target_loss"])),
        ("to target s", "figure", lambda r: fmt_spread(r["time_to_loss_median_s"], r["time_to_loss_min_s"],
                                                   r["time_to_loss_max_s"], 4, "", "\n", mark[r["config"]][1])),
        ("repeats", "same", lambda r: str(r["repeats"])),
        ("scaling eff.", "words", lambda r: fmt_scaling(r).replace(" baseline", "\nbaseline")),
    ]
    return _figures_table(rows, columns, f"{title}: language models" if title else "language models",
                          f"median [min, max] over the repeats; {FASTEST} most tokens/s, {FIRST} first to the "
                          "target test loss among the algorithms of one model, workers and batch")


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _loss_marks(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per language-model config: the most tokens/s and the first to the target loss among the
    algorithms of its model, workers and batch."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"{r['model']}-w{r['workers']}-b{r['batch_size']}", []).append(r)
    out = {}
    for group in groups.values():
        fastest = max(group, key=lambda r: r["tokens_per_s_median"] or 0.0)
        reached = [r for r in group if r.get("time_to_loss_median_s") is not None]
        first = min(reached, key=lambda r: r["time_to_loss_median_s"]) if reached else None
        out |= {r["config"]: (FASTEST if r is fastest else "", FIRST if r is first else "") for r in group}
    return out


def comparison_tables(table: list[dict[str, Any]], best: dict[str, dict[str, Any]],
                      title: str | None = None) -> list[Table]:
    """The comparison by kind of workload: the image models' table and the language models'."""
    return [t for t in (comparison_table(table, best, title), language_model_table(table, title)) if t is not None]


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


OUTSIDE = "\u2020"  # marks a prediction outside the domain the model is validated in


def validation_table(validation: dict[str, Any]) -> Table:
    """The validate stage's figures for the terminal: per configuration the prediction with its
    80% interval (calibrated or the inputs'; marked where the configuration lies outside the
    model's validated domain), the measurement, the end-to-end error, the model's error (in-situ
    compute) and the repeats' spread, with their median and worst; whole at 80 columns."""
    rows = [c | {"config": f"{c['model']}-{c['algorithm']}-{c['comm']}-w{c['workers']}"}
            for c in validation.get("configs") or []]

    def interval(c: dict[str, Any]) -> str:
        text = ms_interval(c.get("interval_low_s"), c.get("interval_high_s"))
        return text + (OUTSIDE if c.get("domain") not in (None, "validated") else "")

    columns: list[tuple[str, str, Any]] = [
        ("repeats", "same", lambda c: str(c["repeats"])),
        ("predicted", "words", lambda c: ms(c["predicted_iter_s"])),
        ("80% interval", "words", interval),
        ("measured", "words", lambda c: ms(c["measured_iter_s"])),
        ("end to end", "words", lambda c: pct(c["error"])),
        ("model", "words", lambda c: "n/a" if c.get("model_error_note") else pct(c.get("model_error"))),
        ("spread", "words", lambda c: pct(c.get("repeat_spread"))),
    ]

    def ab(k: str) -> str:
        v = validation.get(k)
        return "-" if v is None else f"{v:.1%}"

    kinds = {c.get("interval_kind") for c in rows} - {None}
    runs = max((c.get("calibration_runs") or 0 for c in rows), default=0)
    how = (f"calibrated on {runs} earlier configurations of this hardware" if kinds == {"calibrated"}
           else "the inputs' spread widened by the model's stated accuracy (too short a history to calibrate)"
           if kinds == {"inputs"} else "calibrated where this hardware's history allows, else the inputs'")
    outside = sorted({c["domain"] for c in rows if c.get("domain") not in (None, "validated")})
    few = sorted({c.get("model_error_samples") for c in rows if c.get("model_error_note")}, key=str)
    caption = (f"80% interval: {how}"
               + "".join(f"; {OUTSIDE} outside the validated domain ({d}): calibrated apart, or a factor of 2"
                         for d in outside)
               + ". end to end: the DAG fed with the profile; model: fed with the run's in-situ compute"
               + (f" (n/a: {', '.join(map(str, few))} in-situ samples, too few to judge)" if few else "") + "; "
               "spread: max/min - 1 of the repeats' measured iteration. "
               f"|end to end| median {ab('median_abs_error')}, worst {ab('worst_abs_error')}; |model| median "
               f"{ab('median_abs_model_error')}, worst {ab('worst_abs_model_error')}; repeat spread median "
               f"{ab('median_repeat_spread')}, worst {ab('worst_repeat_spread')}")
    return _figures_table(rows, columns, "Predicted vs measured iteration (ms)", caption)
