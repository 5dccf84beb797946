"""`ddlbench profile | microbench | fit | predict | validate` (the performance model)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
