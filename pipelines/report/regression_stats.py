"""The statistics of the regression alarm (docs/regression.md): run-level figures with a within-run
variance, the test of this run against its history (raw and relative to the host-speed canary),
the alarm's power, and the change points of a configuration's history.

Model, per configuration, on log throughput: run j measures x_j = mu + u_j + e_j, where u_j is the
run's share of the host's state (between-run spread, variance tau^2) and e_j the noise of its finite
number of steps (within-run, variance w_j). w_j comes from the run's own steps: batch means of the
per-step iteration times (batches of about sqrt(n) steps, long enough that the autocorrelation of
neighbouring steps stays inside a batch), through the delta method to the log of the mean. The
history's sample variance s^2 estimates tau^2 + mean(w), so tau^2 = max(s^2 - mean(w_hist), 0) and
under no change
    d = x_now - mean(x_hist),   Var(d) = tau^2 (1 + 1/k) + w_now + mean(w_hist) / k,
tested against Student's t with Welch-Satterthwaite degrees of freedom. Without within-run figures
(w = 0) this is the prediction-interval t test of one run against k (k - 1 degrees of freedom).

Two figures of a run's repeats are tested, each at alpha / 2 (Bonferroni), the alarm where
either fires: their mean, and the fastest repeat (`best`). Other work on a shared host only slows
a repeat, so the host's noise is one-sided and heavy-tailed: the fastest of a run's repeats is the
least disturbed, where a slower workload slows every repeat; on a host loaded throughout, the mean
has the power.

Relative to the canary: the same test on z_j = x_j - c_j, c_j the run's mean log GEMM rate of
the canary (training/measure/canary.py: `gemm_log`; the copy's rate is a diagnostic). A host that is
slower for every workload lowers x and c together; a slower workload lowers x alone.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from pipelines.report.regression_components import repeat_parts, run_parts
from pipelines.spec import config_of

CI_LEVEL = 0.95
POWER = 0.95  # the detection probability `detectable_slowdown` is stated at
QUAD_NODES = 48  # nodes of the expectation over the estimated variance
LAGUERRE_MAX_DF = 300.0  # above it, Gamma(df/2) and the Laguerre weights leave a double's range
CHANGE_P = 0.01  # significance of a change point (E-divisive's permutation test)
CHANGE_PERMUTATIONS = 999
CHANGE_MIN_SIZE = 3  # runs on each side of a change point at least


def batch_means_var(xs: list[float]) -> tuple[float, int] | None:
    """Variance of the mean of a series with autocorrelated terms, by non-overlapping batch means
    (about sqrt(n) batches of about sqrt(n) terms): (variance, degrees of freedom), None if too short."""
    n = len(xs)
    b = math.isqrt(n)
    if b < 2:
        return None
    m = n // b
    means = np.asarray(xs[n - b * m :], dtype=float).reshape(b, m).mean(axis=1)  # the warm-up end goes first
    return float(means.var(ddof=1) / b), b - 1


def repeat_figures(run_dir: Path) -> dict[str, Any] | None:
    """One training run (one repeat): log throughput, its within-run variance and degrees of freedom
    (batch means over the measured steps of metrics.jsonl), and the canary's log GEMM rate."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return None
    s = json.loads(path.read_text())
    thr = s.get("throughput_samples_per_s")
    if not thr:
        return None
    out: dict[str, Any] = {"log_thr": math.log(thr), "within_var": None, "within_df": None}
    out["canary_gemm_log"] = (s.get("canary") or {}).get("gemm_log")
    out["parts"] = repeat_parts(Path(run_dir))  # the components, timed in situ (regression_components.py)
    skip = s.get("warmup_steps_excluded") or 0
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        dts = [1.0 / r["throughput_samples_per_s"] for r in rows if r.get("throughput_samples_per_s")
               and r["step"] > skip]  # per sample: the batch's size is the same at every step
        bm = batch_means_var(dts)
        if bm:
            out["within_var"], out["within_df"] = bm[0] / statistics.fmean(dts) ** 2, bm[1]
    return out


def run_level(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's figures from its repeats: mean log throughput, the variance of that mean from the
    repeats' own steps, the mean log canary speed (None unless every repeat has one); with two
    repeats or more, `best`: the fastest repeat's figures and the fastest canary reading."""
    r = len(repeats)
    within = [x["within_var"] for x in repeats]
    canary = [x.get("canary_gemm_log") for x in repeats]
    out = {
        "log_thr": statistics.fmean(x["log_thr"] for x in repeats),
        "within_var": sum(within) / r**2 if None not in within else None,
        "within_df": sum(x["within_df"] for x in repeats) if None not in within else None,
        "canary_gemm_log": statistics.fmean(canary) if None not in canary else None,
        "repeats": r,
    }
    parts = [x.get("parts") for x in repeats]
    if parts and None not in parts:
        out["parts"] = run_parts(parts)
    if r > 1:
        top = max(repeats, key=lambda x: x["log_thr"])
        out["best"] = {"log_thr": top["log_thr"], "within_var": top["within_var"], "within_df": top["within_df"],
                       "canary_gemm_log": max(canary) if None not in canary else None, "repeats": 1}
    return out


def from_throughputs(values: list[float]) -> dict[str, Any]:
    """A run known only by its repeats' throughputs (a report from before within-run figures)."""
    return run_level([{"log_thr": math.log(v), "within_var": None, "within_df": None, "canary_gemm_log": None}
                      for v in values])


def history_change_points(now: dict[str, Any], past: list[tuple[str, dict[str, Any]]], basis: str) -> list[dict]:
    """change_points of a config's history and this run, oldest first, each named by its run key."""
    keys = [k for k, _ in reversed(past)] + ["this run"]
    series = [_figure(r, basis == "canary") for _, r in reversed(past)] + [_figure(now, basis == "canary")]
    return [{**c, "run_key": keys[c["index"]]} for c in change_points(series)]


def prediction_test(now: list[float], history: list[float], log: bool, below: bool | None = True) -> dict[str, Any]:
    """Test that `now` (one run's repeats) lies below (or above; either, two-sided, with `below`
    None) the history's run-level values (one per run): p-value, and the change of now against
    the history with its 95% interval (relative on log scale, absolute otherwise). Needs at
    least two history values."""
    f = math.log if log else float
    x = statistics.fmean(f(v) for v in now)
    ys = [f(v) for v in history]
    k = len(ys)
    d = x - statistics.fmean(ys)
    se = statistics.stdev(ys) * math.sqrt(1 + 1 / k)
    if se > 0:
        if below is None:
            p = float(2 * stats.t.sf(abs(d) / se, k - 1))
        else:
            p = float(stats.t.cdf(d / se, k - 1) if below else stats.t.sf(d / se, k - 1))
        half = float(stats.t.ppf(0.5 + CI_LEVEL / 2, k - 1)) * se
    else:  # a history without spread: any change is certain
        moved = d != 0 if below is None else (d < 0 if below else d > 0)
        p, half = (0.0 if moved else 1.0), 0.0
    back = (lambda v: math.exp(v) - 1) if log else (lambda v: v)
    return {"p_value": p, "effect": back(d), "effect_ci": [back(d - half), back(d + half)]}


def host_moved(now: dict[str, Any], history: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the host's speed (the canary) moved tonight beyond the history's run-to-run spread of
    it: the two-sided prediction test of this run's mean log canary speed against the history
    runs'; p-value and the relative change."""
    test = prediction_test([now["canary_gemm_log"]], [h["canary_gemm_log"] for h in history], log=False, below=None)
    return {"p_value": test["p_value"], "change": math.expm1(test["effect"])}


def _figure(run: dict[str, Any], normalised: bool) -> float:
    return run["log_thr"] - run["canary_gemm_log"] if normalised else run["log_thr"]


def run_test(now: dict[str, Any], history: list[dict[str, Any]], normalised: bool, alpha: float,
             min_effect: float, power: bool = True) -> dict[str, Any]:
    """The one-sided test that `now` is slower than its history (run-level figures, at least two):
    p-value, relative effect with its 95% interval, variance and degrees of freedom, the verdict
    (p < alpha and a slowdown above min_effect) and the smallest slowdown detectable with 95%."""
    xs = [_figure(h, normalised) for h in history]
    k = len(xs)
    d = _figure(now, normalised) - statistics.fmean(xs)
    s2 = statistics.variance(xs)
    known = now["within_var"] is not None and all(h["within_var"] is not None for h in history)
    w0 = now["within_var"] if known else 0.0
    wbar = statistics.fmean(h["within_var"] for h in history) if known else 0.0
    df0 = now["within_df"] if known else math.inf
    dfh = sum(h["within_df"] for h in history) if known else math.inf
    if s2 > wbar:  # a between-run spread beyond the runs' own noise
        var = (1 + 1 / k) * s2 - wbar + w0
        terms = [((1 + 1 / k) * s2, k - 1), (w0, df0), (wbar, dfh)]
    else:  # the history's spread is the noise of its steps alone
        var = w0 + wbar / k
        terms = [(w0, df0), (wbar / k, dfh)]
    # Satterthwaite's df (each term relative to the variance, so tiny variances do not underflow); it
    # can fall below the history's k - 1 when the within-run term is subtracted: one degree of
    # freedom (two runs) is the least the history always gives
    inv = sum((v / var) ** 2 / nu for v, nu in terms) if var > 0 else 0.0
    df = max(1 / inv, 1.0) if inv > 0 else math.inf
    if var > 0:
        p = float(stats.t.cdf(d / math.sqrt(var), df))
        half = float(stats.t.ppf(0.5 + CI_LEVEL / 2, df)) * math.sqrt(var)
    else:  # no spread at all: any change is certain
        p, half = (0.0 if d < 0 else 1.0), 0.0
    effect = math.expm1(d)
    return {
        "basis": "canary" if normalised else "raw",
        "p_value": p,
        "effect": effect,
        "effect_ci": [math.expm1(d - half), math.expm1(min(d + half, 700.0))],
        "variance": var,
        "df": df if math.isfinite(df) else None,  # None: no spread at all
        "regressed": p < alpha and effect < -min_effect,
        "detectable_slowdown": detectable_slowdown(var, df, alpha, min_effect) if power else None,
    }


def detection_probability(slowdown: float, var: float, df: float, alpha: float, min_effect: float) -> float:
    """P(the alarm fires) for a true slowdown: the estimate d ~ N(log(1 - slowdown), var) must lie
    below both -t_crit * (estimated sd) and log(1 - min_effect); the estimated variance is
    var * chi2(df) / df, integrated over."""
    delta, cut = math.log1p(-slowdown), math.log1p(-min_effect)
    sd = math.sqrt(var)
    if sd == 0:
        return 1.0 if delta < cut else 0.0
    tc = float(stats.t.ppf(1 - alpha, df))
    if df > 1e4:  # the variance is known
        q = np.array([1.0])
        w = np.array([1.0])
    elif df > LAGUERRE_MAX_DF:
        # The Gauss-Laguerre weights overflow a double here; chi2(df)/df is narrow (sd
        # sqrt(2/df) < 0.08) and nodes at equal steps of probability integrate it.
        q = stats.chi2.ppf((np.arange(QUAD_NODES) + 0.5) / QUAD_NODES, df) / df
        w = np.full(QUAD_NODES, 1.0 / QUAD_NODES)
    else:  # E over q ~ chi2(df)/df by generalised Gauss-Laguerre: q = 2u/df, u ~ Gamma(df/2)
        u, w = special.roots_genlaguerre(QUAD_NODES, df / 2 - 1)
        q, w = 2 * u / df, w / special.gamma(df / 2)
    bound = np.minimum(-tc * sd * np.sqrt(q), cut)
    return float(np.clip(np.sum(w * stats.norm.cdf((bound - delta) / sd)), 0.0, 1.0))


def detectable_slowdown(var: float, df: float, alpha: float, min_effect: float) -> float:
    """The smallest slowdown (fraction) the alarm catches with probability POWER."""
    if var == 0:
        return min_effect
    top = 1 - 1e-9
    if detection_probability(top, var, df, alpha, min_effect) < POWER:
        return 1.0  # no slowdown short of a standstill is caught that often
    return float(optimize.brentq(
        lambda s: detection_probability(s, var, df, alpha, min_effect) - POWER, min_effect, top, xtol=1e-4
    ))


def _best_gain(x: np.ndarray) -> np.ndarray:
    """Per row of x: the largest least-squares gain of one split, n1 n2 / n (mean1 - mean2)^2, over
    the cuts that leave CHANGE_MIN_SIZE values on each side."""
    n = x.shape[1]
    cuts = np.arange(CHANGE_MIN_SIZE, n - CHANGE_MIN_SIZE + 1)
    head = np.cumsum(x, axis=1)[:, cuts - 1]
    m1, m2 = head / cuts, (x.sum(axis=1, keepdims=True) - head) / (n - cuts)
    return (cuts * (n - cuts) / n * (m1 - m2) ** 2).max(axis=1)


def change_points(series: list[float], max_p: float = CHANGE_P, permutations: int = CHANGE_PERMUTATIONS,
                  seed: int = 0) -> list[dict[str, Any]]:
    """E-divisive-style change points of a series (oldest first): the best split by least squares
    (ruptures' binary segmentation), kept if a permutation test of the best split's gain gives
    p < max_p (the selection of the best cut is in the null distribution), then each side split
    again. Each: index (first value after the step), p-value, relative change (the series is in logs)."""
    import ruptures

    found: list[dict[str, Any]] = []
    rng = np.random.default_rng(seed)

    def split(lo: int, hi: int) -> None:
        seg = np.asarray(series[lo:hi], dtype=float)
        if len(seg) < 2 * CHANGE_MIN_SIZE or np.ptp(seg) == 0:
            return
        (cut, _end) = ruptures.Binseg(model="l2", min_size=CHANGE_MIN_SIZE, jump=1).fit(seg).predict(n_bkps=1)
        gain = _best_gain(seg[None, :])[0]
        null = _best_gain(rng.permuted(np.tile(seg, (permutations, 1)), axis=1))
        p = (1 + int(np.sum(null >= gain * (1 - 1e-12)))) / (permutations + 1)
        if p < max_p:
            found.append({"index": lo + cut, "p_value": p, "change": math.exp(seg[cut:].mean() - seg[:cut].mean()) - 1})
            split(lo, lo + cut)
            split(lo + cut, hi)

    split(0, len(series))
    return sorted(found, key=lambda c: c["index"])


def config_figures(trained: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run-level figures per config of this run's finished training runs (their run dirs)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for e in trained:
        fig = repeat_figures(Path(e["run_dir"])) if e.get("run_dir") else None
        if fig:
            by.setdefault(config_of(e["key"]), []).append(fig)
    return {config: run_level(figs) for config, figs in by.items()}
