"""Command-line options generated from pydantic fields: one definition feeds validation,
`--help` and YAML (TrainConfig for `ddlbench train`, ProfileConfig and MicrobenchConfig for
`ddlbench profile` and `microbench`)."""

from __future__ import annotations

import enum
import types
import typing
from pathlib import Path
from typing import Any

import click
from pydantic.fields import FieldInfo


def unwrap(annotation: Any) -> Any:
    """`X | None` -> X."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0]
    return annotation


def parse_shape(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.replace("x", ",").split(","))
    except ValueError:
        raise click.BadParameter(f"expected C,H,W such as 3,32,32, got {value!r}") from None


def option_for(name: str, field: FieldInfo) -> click.Option:
    """The click option of one pydantic field: its name, type, choices, default and help."""
    flag = "--" + name.replace("_", "-")
    typ = unwrap(field.annotation)
    default = field.default if not isinstance(field.default, enum.Enum) else field.default.value
    help_text = f"{field.description} [default: {default}]"
    if typ is bool:
        return click.Option([f"{flag}/--no-{flag[2:]}", name], default=None, help=help_text)
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        return click.Option([flag, name], type=click.Choice([e.value for e in typ]), default=None,
                            help=help_text)
    if typing.get_origin(typ) is tuple:
        return click.Option([flag, name], type=str, default=None, help=help_text + " (C,H,W)",
                            callback=lambda _c, _p, v: parse_shape(v))
    click_type = {int: int, float: float, str: str, Path: click.Path(path_type=Path)}.get(typ, str)
    return click.Option([flag, name], type=click_type, default=None, help=help_text)
