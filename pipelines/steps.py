"""The pipeline's stages as Airflow tasks and tests call them: small JSON dicts in and out.

`call(name, ctx, *results)` turns the ctx dict (XCom, ctx.json) into a `RunContext` and runs the
stage of that name (`pipelines.stages.STAGES`); the first stage takes a spec path instead and
returns the ctx as a dict. A test may set `_launch` to run the mapped stage's jobs its own way
(it is looked up at call time).
"""

from __future__ import annotations

from typing import Any

from pipelines.context import as_context, default_tracking_uri
from pipelines.rundir import default_home
from pipelines.stages import STAGES, stage
from pipelines.stages.lifecycle import sync

_launch: Any = None  # the mapped stage's job launcher; None: the stage's own

__all__ = ["STAGES", "call", "default_home", "default_tracking_uri", "sync"]


def call(name: str, ctx: Any, *results: Any, **options: Any) -> Any:
    """Run one stage on a ctx dict (the first stage: on a spec path) and return its JSON result."""
    s = stage(name)
    if s is STAGES[0]:
        return s.run(ctx, **options).as_dict()
    if s.mapped and _launch is not None:
        options["launch"] = _launch
    return s.run(as_context(ctx), *results, **options)
