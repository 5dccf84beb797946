"""What the model's commands share: option callbacks, errors, tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from infra import bounds
from infra.units import parse_bandwidth

PATH = click.Path(path_type=Path)


def bandwidth(_ctx, param, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_bandwidth(value)
    except ValueError as err:
        raise click.BadParameter(str(err).removeprefix("bandwidth: "), param=param) from None


def int_list(_ctx, param, value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected a comma list of integers such as 1,2,4, got {value!r}", param=param
        ) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"every value must be a positive integer, got {value!r}", param=param)
    # World sizes to predict: each within the what-if bound, a bounded number of them (infra/bounds.py).
    if len(out) > bounds.WHAT_IF_ENTRIES.limit or max(out) > bounds.PREDICTED_WORKERS.limit:
        raise click.BadParameter(f"at most {bounds.WHAT_IF_ENTRIES.limit} sizes of at most "
                                 f"{bounds.PREDICTED_WORKERS.limit:,} ({bounds.PREDICTED_WORKERS.reason})", param=param)
    return out


def out_dir(_ctx, param, value: Path | None) -> Path | None:
    if value is not None and value.exists() and not value.is_dir():
        raise click.BadParameter(f"{value} exists and is not a directory", param=param)
    return value


def fail(err: Exception) -> None:
    raise click.UsageError(str(err)) from None


def print_rows(header: list[str], rows: list[list[Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(
            h,
            justify="left" if h in ("primitive", "run", "algorithm", "comm", "model", "flags", "busiest") else "right",
        )
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console().print(table)

