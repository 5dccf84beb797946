"""A prediction's interval calibrated by the model's own error (split conformal), and the domain
the model is validated in (docs/model-accuracy.md, "Calibrated intervals").

The inputs' interval (pipelines/stages/interval.py) says how far the prediction moves with its
inputs; it says nothing of what the model gets wrong. The hardware's earlier validations measured
that: each earlier configuration's |log(measured / predicted)| (end to end) is a score, and the
ceil((n + 1) * level)-th smallest of n scores is a bound that a new configuration's score stays
under with probability at least `level`, whatever their distribution, as long as the new one is
drawn like the earlier ones (split conformal prediction). The calibrated interval is the point
times exp(+-q), widened to hold the inputs' interval.

Inside and outside the model's domain the errors are not drawn alike (outside they are several
times larger), so each calibrates on its own group's scores (Mondrian conformal prediction: the
guarantee then holds within each group).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

LEVEL = 0.8  # the interval's coverage: p10-p90's, the inputs' interval's

# The fewest earlier configurations a calibration rests on. ceil((n + 1) * 0.8) <= n, a finite
# quantile, needs n >= 4; 5 leaves one to spare. Up to 8 the quantile is the largest score seen:
# conservative, as a short history should be.
MIN_CALIBRATION = 5

# With no history: the inputs' interval widened by +-10%, the end-to-end bar docs/model-accuracy.md
# states, which on a quiet host the validated grids' worst configurations meet (squeezenet 9.2%,
# gpt-mini 7.6%, the demo 9.9%). A stated figure, not a measured quantile.
STATED_ACCURACY = 0.10

# The domain: an iteration under this floor with more ranks than cores is the host's scheduling as
# much as the job. gpt-mini's 80-188 ms iterations on 2 cores validate within their repeat spread;
# lenet5 (3-8 ms) and the recorded mlp grid (19-72 ms) on the same cores were off by 10-73%.
DOMAIN_FLOOR_S = 0.05
SHORT_AND_CROWDED = "ms-scale iteration with more ranks than cores"
# A shaped link is a token bucket (modelling/network/costs.py, `link_burst`): the bytes its bucket passes
# at once cost the time between transfers to refill, which the DAG holds for a PS push alone, and
# in no case for the ring's steps. Where the bucket holds this share of a gradient or more, what
# a transfer costs moves by more than the accuracy bar with the bucket's refill.
BURST_SHARE_FLOOR = 0.10
WITHIN_BURST = "gradient within the links' token bucket"
# Outside the domain with too short an outside history: the prediction is claimed within a factor
# of two. Before the bucket was modelled, the recorded out-of-domain errors reached +82% (lenet5
# at 400 Mbit/s) and 73% (the mlp grid on 2 cores); a bar the inside one's doubling (+-21%) missed.
OUTSIDE_STATED_FACTOR = 2.0
OUTSIDE = "outside"  # the group of every row whose domain is not "validated"


def group(where: str | None) -> str:
    """The calibration group of a row's domain: 'validated' or OUTSIDE."""
    return "validated" if where in (None, "validated") else OUTSIDE


def log_ratio(predicted: float | None, measured: float | None) -> float | None:
    """|log(measured / predicted)|: the conformal score, symmetric in over and under-prediction."""
    if not predicted or not measured or predicted <= 0 or measured <= 0:
        return None
    return abs(math.log(measured / predicted))


def grouped(configs: Iterable[dict[str, Any]]) -> dict[str, list[float]]:
    """The scores of validation configuration rows (`predicted_iter_s`, `measured_iter_s`) by
    calibration group (a row without `domain` was inside the domain)."""
    out: dict[str, list[float]] = {"validated": [], OUTSIDE: []}
    for c in configs:
        if (s := log_ratio(c.get("predicted_iter_s"), c.get("measured_iter_s"))) is not None:
            out[group(c.get("domain"))].append(s)
    return out


def conformal_quantile(history: list[float], level: float = LEVEL) -> float | None:
    """The ceil((n + 1) * level)-th smallest score; None under MIN_CALIBRATION scores."""
    n = len(history)
    k = math.ceil((n + 1) * level - 1e-9)  # (n + 1) * 0.8 is an integer at n = 4, 9, ... in exact arithmetic
    if n < MIN_CALIBRATION or k > n:
        return None
    return sorted(history)[k - 1]


def domain(iter_time_s: float | None, ranks: int, cores: int | None, burst_share: float = 0.0) -> str:
    """'validated', or why the prediction lies outside the domain the model is validated in.
    `burst_share`: the links' token bucket over a gradient's bytes (0: no bucket read)."""
    if burst_share >= BURST_SHARE_FLOOR:
        return WITHIN_BURST
    if iter_time_s is not None and cores and ranks > cores and iter_time_s < DOMAIN_FLOOR_S:
        return SHORT_AND_CROWDED
    return "validated"


def interval(point: float | None, low: float | None, high: float | None,
             history: list[float] | dict[str, list[float]] | None, where: str = "validated") -> dict[str, Any]:
    """interval_low_s / interval_high_s around `point`: exp(+-q) from the conformal quantile of the
    history's scores in the row's group (`interval_kind` 'calibrated'), else +-STATED_ACCURACY
    inside the domain and a factor OUTSIDE_STATED_FACTOR outside it ('inputs'), widened to hold the
    inputs' interval [low, high]; `calibration_runs` is the earlier configurations it rests on.
    `history`: scores by group (`grouped`), or one group's scores."""
    if isinstance(history, dict):
        history = history.get(group(where))
    history = history or []
    q = conformal_quantile(history)
    out: dict[str, Any] = {"interval_kind": "inputs" if q is None else "calibrated",
                           "calibration_runs": len(history) if q is not None else 0,
                           "domain": where}
    if point is None:
        return out | {"interval_low_s": None, "interval_high_s": None}
    if q is None:
        q = math.log1p(STATED_ACCURACY) if group(where) == "validated" else math.log(OUTSIDE_STATED_FACTOR)
    lo, hi = min(point * math.exp(-q), low or point), max(point * math.exp(q), high or point)
    return out | {"interval_low_s": lo, "interval_high_s": hi}
