"""`ddlbench run | sync | compare` (the benchmark pipeline and MLflow)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
