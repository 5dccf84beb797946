"""The model's attribution of an iteration's change to its components (docs/regression.md,
"Attribution by the model"): the baseline's iteration re-predicted with tonight's value of one
component swapped in, one at a time and all together (modelling.predict fed with in-situ compute,
as validation's model error is); without a model a part explains its own seconds' change."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from modelling.predict import predict
from modelling.scenario import Scenario
from modelling.validate import insitu_layers
from pipelines.report import regression_comm

Predictor = Callable[..., float]  # (parts in seconds, fits=None) -> iteration seconds
ALL = "all"  # every component swapped in at once


def baseline_parts(history: list[dict[str, Any]]) -> dict[str, float]:
    """The history's median of each part's seconds (the parts every history run has)."""
    keys = set.intersection(*(set(h["seconds"]) for h in history))
    return {k: statistics.median(h["seconds"][k] for h in history) for k in sorted(keys)}


def attribute(now: dict[str, float], base: dict[str, float], predict: Predictor | None,
              components: list[str], comm: tuple[dict[str, Any], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each component's part of the iteration's change: the baseline re-predicted with tonight's
    value of that component alone (`explains`, points of the baseline iteration), and all
    together (`all`). Without a model (`predict` None) a part explains its own seconds' change
    against the baseline's iteration, the parts added up. `comm`: the baseline's and tonight's
    fit of each primitive (regression_comm.py); the baseline is predicted on the baseline's
    fits, and a primitive named among `components` explains what tonight's fit of it alone
    moves (nothing without a model: only the model turns a link's cost into iteration time)."""
    base_fits, now_fits = comm or ({}, {})

    def model(values: dict[str, float], prims: list[str]) -> float:
        assert predict is not None
        if not base_fits:
            return predict(values)
        return predict(values, base_fits | {p: now_fits[p] for p in prims if p in now_fits})

    iteration = model(base, []) if predict else sum(base.values())
    if iteration <= 0:
        return []

    def swapped_in(names: list[str]) -> float:
        value = dict(base)
        for name in names:
            value |= {k: now[k] for k in _parts_of(name, now) if k in base}
        # The model takes no in-situ update: the worker's update adds its own seconds' change.
        own = sum(now[k] - base[k] for n in names for k in _parts_of(n, now)
                  if k in base and (predict is None or k == "update"))
        return iteration + own if predict is None else model(value, [n for n in names if n in now_fits]) + own

    rows = [{"component": c, "change": _change(c, now, base, comm), "explains": swapped_in([c]) / iteration - 1}
            for c in components]
    rows.sort(key=lambda r: -r["explains"])
    everything = swapped_in([*base, *now_fits])
    return rows + [{"component": ALL, "change": everything / iteration - 1, "explains": everything / iteration - 1}]


def _parts_of(component: str, parts: dict[str, float]) -> list[str]:
    """The parts (seconds) a tested component stands for."""
    name = component.removesuffix(" share")
    if name == "compute":
        return [k for k in parts if k.startswith(("forward ", "backward "))]
    return [name] if name in parts else []


def _change(component: str, now: dict[str, float], base: dict[str, float],
            comm: tuple[dict[str, Any], dict[str, Any]] | None = None) -> float:
    """A component's own change: its seconds', or a primitive's time of its largest message."""
    base_fits, now_fits = comm or ({}, {})
    if component in now_fits and component in base_fits:
        before, after = base_fits[component]["measured_s"][-1], now_fits[component]["measured_s"][-1]
        return after / before - 1 if before > 0 else 0.0
    keys = [k for k in _parts_of(component, now) if k in base]
    before = sum(base[k] for k in keys)
    return sum(now[k] for k in keys) / before - 1 if before > 0 else 0.0


def model_predictor(profile: dict[str, Any], comm_model: dict[str, Any], summary: dict[str, Any]) -> Predictor | None:
    """The iteration the DAG model predicts for a run's configuration (its summary.json) from parts
    in seconds (and `fits`, primitives' fits in place of the comm model's own), as validation's
    model error feeds it (modelling.validate.insitu_layers); None where the model gives no
    prediction for it."""
    scenario = Scenario.from_summary(summary)
    names = [r["name"] for r in profile["layers"]]

    def iteration(parts: dict[str, float], fits: dict[str, Any] | None = None) -> float:
        comm = regression_comm.swapped(comm_model, fits) if fits else comm_model
        insitu = {"batch_size": summary["batch_size"], "data_s": parts.get("data", 0.0),
                  "layers": [{"name": n, "fwd_s": parts[f"forward {n}"], "bwd_s": parts[f"backward {n}"]}
                             for n in names]}
        [p] = predict(insitu_layers(profile, insitu), comm, scenario, strict=False)
        if p.get("iter_time_s") is None:
            raise ValueError(p.get("no_prediction") or "no prediction")
        return float(p["iter_time_s"])

    return iteration
