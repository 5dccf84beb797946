"""The communication component of the regression alarm (docs/regression.md, "Components: the
link"): the pipeline run's microbenchmark of each primitive a configuration uses, tested against
its history and swapped into the model's re-prediction of the baseline.

A run's iteration time on a shaped link scatters with the host's state; the microbenchmark of
the same link does not, or far less: it times each primitive alone, its largest messages at the
link's byte rate. So each primitive the configuration's algorithm uses is tested by two figures
of the run's fit (modelling/network/fit.py): its **latency** (the time of the smallest message measured,
what a latency probe reads; a fitted intercept can be negative) and its **per-byte** cost (the
sustained slope over the largest messages, the link's byte time where the link is the path).

The baseline's network is the history's median microbenchmark: each numeric field of a
primitive's fit (the times per size, the slopes, the per-worker times) is the median of the
history's, so the model re-predicts the baseline iteration on the network the history measured,
and with tonight's fit of one primitive swapped in, the part of the change that primitive explains.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from modelling.scenario import Scenario

# The primitive each algorithm and comm times its transfers with (modelling/network/costs.py).
PRIMITIVES = {("ssgd", "allreduce"): "allreduce", ("ssgd", "ps"): "ps", ("odsgd", "ps"): "ps",
              ("asgd", "ps"): "asgd"}
LATENCY, PER_BYTE = " latency", " per-byte"


def record(model: dict[str, Any] | None, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The fit (model.json's) of the primitive a run's configuration uses, at its world size
    and shard count (the nearest fitted, as CommCosts picks): {primitive: fit}; None where the
    pipeline fitted none or the configuration has no transfers (one worker)."""
    if not model:
        return None
    scenario = Scenario.from_summary(summary)
    prim = PRIMITIVES.get((scenario.algorithm, scenario.comm))
    fits = [f for f in model.get("fits", []) if f.get("primitive") == prim]
    if not fits or scenario.workers < 2:
        return None
    servers = 0 if prim == "allreduce" else scenario.servers
    fit = min(fits, key=lambda f: (abs(math.log(f["workers"] / scenario.workers)), abs(f["servers"] - servers)))
    return {prim: fit}


def figures(comm: dict[str, Any] | None) -> dict[str, float]:
    """The tested figures of a run's communication, in logs: each primitive's latency and
    per-byte cost, where positive."""
    out: dict[str, float] = {}
    for prim, fit in (comm or {}).items():
        measured = fit.get("measured_s") or []
        if measured and measured[0] > 0:
            out[prim + LATENCY] = math.log(measured[0])
        slope = fit.get("sustained_slope_s_per_byte") or 0.0
        if slope > 0:
            out[prim + PER_BYTE] = math.log(slope)
    return out


def primitive_of(component: str) -> str | None:
    """The primitive a tested comm figure belongs to: "allreduce per-byte" -> "allreduce"."""
    for suffix in (LATENCY, PER_BYTE):
        if component.endswith(suffix) and component.removesuffix(suffix) in PRIMITIVES.values():
            return component.removesuffix(suffix)
    return None


def baseline(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The history's median fit of each primitive every history run recorded with one shape
    (the same sizes): each numeric field, scalar or per size, the median of the history's; the
    rest as the newest run had it (the attribution prices fits as measured, `as_measured`)."""
    prims = set.intersection(*(set(c) for c in history)) if history else set()
    return {p: _median_fit([c[p] for c in history]) for p in sorted(prims)
            if len({len(c[p].get("measured_s") or []) for c in history}) == 1}


def _median_fit(fits: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: _median([f.get(k) for f in fits]) if all(k in f for f in fits) and _numbers(v) else v
            for k, v in fits[0].items()}


def _numbers(v: Any) -> bool:
    """A number, or a (nested) list of them: what a fit measured."""
    if isinstance(v, list):
        return all(_numbers(x) for x in v)
    return isinstance(v, int | float) and not isinstance(v, bool)


def _median(values: list[Any]) -> Any:
    """The elementwise median of numbers or equally shaped lists of them; the first value else."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return statistics.median(values)
    if all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1:
        return [_median(list(column)) for column in zip(*values, strict=True)]
    return values[0]


def as_measured(fit: dict[str, Any]) -> dict[str, Any]:
    """A fit the model prices by its measurements (modelling/network/costs.py: the measured times for the
    world they were taken in), whatever its flags. A flag says whether the fitted line may stand
    for the link (a slope faster than the link, a line that noise made flat) and sends the model
    to the stated rate instead; the attribution asks what tonight's measured costs did against
    the history's, on the cluster the training ran on, so both take the same path and a flag
    that one night's noise raised moves nothing."""
    return fit | {"usable": True, "flags": []}


def swapped(model: dict[str, Any], fits: dict[str, Any]) -> dict[str, Any]:
    """A comm model with the given primitives' fits in place of its own of the same world."""
    def same(f: dict[str, Any], g: dict[str, Any]) -> bool:
        return (f["primitive"], f["workers"], f["servers"]) == (g["primitive"], g["workers"], g["servers"])

    return model | {"fits": [next((g for g in fits.values() if same(f, g)), f) for f in model["fits"]]}
