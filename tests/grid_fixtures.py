"""Recorded grids (tests/fixtures/grids/<grid>/): the measurements of a small `ddlbench run`
(comm.json, layers.json, each trained configuration's summary.json) and the predictions the
model made of them when they were recorded (expected.json). `python -m tests.grid_fixtures
DIR...` (re)records expected.json with the code on the path: run it with the code whose
predictions are to be pinned."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

GRIDS = Path(__file__).resolve().parent / "fixtures" / "grids"
WHAT_IF_WORKERS = (4, 8)
WHAT_IF_RATE = 100e6 / 8  # a what-if link of 100 Mbit/s


def link_rate(grid: Path) -> float | None:
    """The spec's stated link rate (network.link_bandwidth), bytes/s; None where it gives none."""
    from pipelines.spec import parse_rate

    spec = yaml.safe_load((grid / "spec.yaml").read_text())
    rate = (spec.get("network") or {}).get("link_bandwidth")
    return parse_rate(rate) if rate else None


def scenarios(grid: Path) -> dict[str, dict[str, Any]]:
    """Per name, a scenario (as Scenario's fields) the grid pins: each trained configuration as
    its summary describes it, that configuration on one host at the what-if world sizes, and
    as trained over a what-if link rate."""
    from modelling.scenario import Scenario

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(grid.glob("runs/*/summary.json")):
        summary = json.loads(path.read_text())
        s = Scenario.from_summary(summary)
        out[path.parent.name] = s.model_dump(mode="json")
        for n in WHAT_IF_WORKERS:
            what_if = s.model_copy(update={"node_of_rank": None}).with_workers(n)
            out[f"{path.parent.name}@w{n}"] = what_if.model_dump(mode="json")
        slower = s.model_copy(update={"bandwidth_bytes_per_s": WHAT_IF_RATE})
        out[f"{path.parent.name}@100mbit"] = slower.model_dump(mode="json")
    return out


def measured(grid: Path) -> dict[str, float]:
    """Per trained configuration, its measured iteration as validation compares it."""
    out = {}
    for path in sorted(grid.glob("runs/*/summary.json")):
        summary = json.loads(path.read_text())
        it = summary["iter_time_s"]
        stat = "worker_mean" if summary["algorithm"] == "asgd" and it.get("worker_mean") else "p50"
        out[path.parent.name] = it[stat]
    return out


def predictions(grid: Path) -> dict[str, dict[str, Any]]:
    """Per pinned scenario: the model's iteration, compute and comm, from the grid's own files."""
    from modelling.measure.layers import load_layers
    from modelling.measure.records import load_comm
    from modelling.network.fit import fit_comm
    from modelling.predict import predict
    from modelling.scenario import Scenario

    layers = load_layers(grid / "layers.json")
    model = fit_comm(load_comm(grid / "comm.json"), link_bytes_per_s=link_rate(grid))
    out = {}
    for name, fields in scenarios(grid).items():
        [p] = predict(layers, model, Scenario(**fields))
        out[name] = {k: p.get(k) for k in ("iter_time_s", "compute_s", "comm_s", "no_prediction", "note", "domain")}
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        grid = Path(arg)
        (grid / "expected.json").write_text(json.dumps(
            {"predicted": predictions(grid), "measured": measured(grid)}, indent=1, sort_keys=True) + "\n")
        print(f"recorded {grid / 'expected.json'}")
