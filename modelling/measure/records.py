"""Typed records of the model's inputs (comm.json, layers.json) with a schema version, and
the one place where an older file is brought up to date (`migrate_comm`, `migrate_layers`):
code that reads a record finds every field, not a `.get(..., default)` at its point of use.

Version 1 (no `schema_version`): comm.json rows without `mean_s` (their median is the cost),
without `servers` (0: not a PS primitive), without the PS round's and ASGD's extra timings;
layer tables without `param_tensor_bytes` (one tensor per layer) or the PS copies' times.
Version 2: every field written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modelling.measure.files import read_json

SCHEMA_VERSION = 2


COMM_KIND = "ddlbench-comm"


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")  # keys this model does not read travel along


class CommRow(_Record):
    """One primitive at one size, as the microbenchmark timed it (modelling/measure/microbench_rank.py)."""

    primitive: Literal["p2p", "loopback", "allreduce", "ps", "asgd"]
    workers: int = Field(ge=1)
    servers: int = Field(0, ge=0)
    bytes: int = Field(gt=0)
    median_s: float
    mean_s: float  # the trimmed mean over repeats: the expected cost, which throughput pays
    times_s: list[float] = []
    node_of_rank: list[int] | None = None  # the placement of a PS or ASGD round's ranks
    pair: list[int] | None = None  # the ranks of a ping-pong
    post_s: float | None = None  # a PS round: the workers' time to post it
    pull_lead_s: float | None = None  # a PS round: the first remote pull back before the last
    host_cpu_s: float | None = None  # the host's CPU time of one round (every rank on one host)
    host_cpu_wall_s: float | None = None  # the wall time per round of the loop it was read over
    worker_mean_s: list[float] | None = None  # ASGD: each worker's pass
    reply_tail_s: list[float] | None = None  # ASGD: each reply's time on the link after its send


class CommFile(_Record):
    kind: Literal["ddlbench-comm"]
    schema_version: int = SCHEMA_VERSION
    measurements: list[CommRow]
    link_bytes_per_s: float | None = None
    environment: dict[str, Any] = {}


class LayerRow(_Record):
    name: str
    type: str
    fwd_s: float = Field(ge=0)
    bwd_s: float = Field(ge=0)
    param_bytes: int = Field(ge=0)
    param_tensor_bytes: list[int]  # its parameter tensors in registration order
    output_bytes: int = 0


class LayerTable(_Record):
    schema_version: int = SCHEMA_VERSION
    model: str
    batch_size: int = Field(ge=1)
    layers: list[LayerRow] = Field(min_length=1)
    update_s: float
    data_s: float
    pack_s: float = 0.0
    unpack_s: float = 0.0
    server_update_s: float = 0.0
    server_add_s: float = 0.0
    iteration_samples_s: list[float] = []


class Fit(_Record):
    """One primitive and world size of model.json (modelling/network/fit.py). Version 1 fits lack what
    later microbenchmarks measured: those fields are None (or their neutral value)."""

    primitive: str
    workers: int
    servers: int = 0
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float | None = None
    intercept_s: float
    slope_s_per_byte: float
    sustained_slope_s_per_byte: float | None = None  # None: the fitted slope stands for it
    usable: bool = True
    flags: list[str] = []
    sizes: list[float] | None = None  # None with measured_s: no measurements to follow
    measured_s: list[float] | None = None
    link_queue: int | None = None  # a PS round: transfers on its busiest link one way
    latency_overlaps: bool = False  # a PS round over node links
    node_of_rank: list[int] | None = None
    post_s: list[float] | None = None
    pull_lead_s: list[float] | None = None
    host_cpu_s: list[float | None] | None = None
    worker_mean_s: list[list[float]] | None = None
    reply_tail_s: list[list[float]] | None = None


class CommModel(_Record):
    kind: Literal["ddlbench-comm-model"]
    schema_version: int = SCHEMA_VERSION
    link_bytes_per_s: float | None = None
    environment: dict[str, Any] = {}
    fits: list[Fit]


def migrate_model(data: dict[str, Any], source: str = "comm model") -> dict[str, Any]:
    """model.json of any version as the current one (a plain dict; ValueError naming the field)."""
    try:
        record = CommModel.model_validate({**data, "schema_version": SCHEMA_VERSION,
                                           "environment": data.get("environment") or {}})
    except ValidationError as err:
        raise ValueError(f"{source}: {_first_error(err)}") from None
    return record.model_dump()


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    return f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"


def migrate_comm(data: dict[str, Any], source: str = "comm") -> dict[str, Any]:
    """comm.json of any version as the current one (a plain dict; CommModelError naming the field)."""
    rows = []
    for row in data.get("measurements") or []:
        row = dict(row)
        if "mean_s" not in row and "median_s" in row:
            row["mean_s"] = row["median_s"]  # version 1: the median was the cost
        rows.append(row)
    try:
        record = CommFile.model_validate({**data, "measurements": rows, "schema_version": SCHEMA_VERSION})
    except ValidationError as err:
        raise CommModelError(f"{source}: {_first_error(err)}") from None
    return record.model_dump()


def migrate_layers(data: dict[str, Any], source: str = "layers") -> dict[str, Any]:
    """A layer table of any version as the current one (a plain dict; ValueError naming the field)."""
    rows = []
    for row in data.get("layers") or []:
        row = dict(row)
        if not row.get("param_tensor_bytes") and "param_bytes" in row:
            row["param_tensor_bytes"] = [int(row["param_bytes"])]  # version 1: one tensor a layer
        rows.append(row)
    samples = data.get("iteration_samples_s") or []
    try:
        record = LayerTable.model_validate({**data, "layers": rows, "iteration_samples_s": samples,
                                            "schema_version": SCHEMA_VERSION})
    except ValidationError as err:
        raise ValueError(f"{source}: {_first_error(err)}") from None
    return record.model_dump()


class CommModelError(ValueError):
    """A comm.json or model.json is missing, truncated or not ours; the message names the file."""


def load_comm(path: Path) -> dict[str, Any]:
    """comm.json, brought up to the current schema (modelling/measure/records.py)."""
    data = read_json(path, "comm.json file", CommModelError)
    if data.get("kind") != COMM_KIND or not isinstance(data.get("measurements"), list):
        raise CommModelError(
            f"{path}: not a ddlbench comm.json (kind {data.get('kind')!r}); write one with `ddlbench microbench`"
        )
    return migrate_comm(data, str(path))
