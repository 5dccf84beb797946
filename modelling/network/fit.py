"""Fit alpha-beta(-gamma) communication models to microbenchmarks (DESIGN §3).

Per primitive and world size, a weighted least-squares line t = a + b*M over
the log-spaced sizes (weights 1/t: every size counts by its relative error,
so the few largest do not decide alpha alone), then the cost model's
constants from a and b:

- p2p (one way):                 t = alpha + M beta
- allreduce (ring, N ranks):     t = 2(N-1) alpha + (N-1)/N M (2 beta + gamma)
- ps (N workers, S shards, one push and pull round, each of M/S bytes per
  worker and shard): t = 2L (alpha + M/S beta), L the transfers that queue on
  the busiest link one way (modelling/measure/links.py): N on one host, where they queue
  on the shard's link, copies of the CPUs, latency and all; over full-duplex node
  links, the most one node's uplink or downlink carries (2 workers to a dedicated
  shard node: 2; a shard beside one of them: 1, the other's transfers stay on its
  node), and there the transfers' latencies overlap while their bytes queue:
  t = 2 (alpha + L M/S beta)

Allreduce's beta comes from the p2p fit of the same file, gamma from the rest
of the slope. Predicting for a measured world size within the measured sizes,
`CommCosts` follows the measurements themselves, locally smoothed (real transports are not
quite linear in M: the residuals show by how much); elsewhere, and for
bandwidth what-ifs, it uses the fitted constants. A fit that beats physics (its
sustained beta, from the largest sizes, below the link's byte time; negative alpha)
is flagged; a flagged beta is marked unusable and the predictor refuses it unless a
bandwidth is given. The link bounds the sustained rate, not the line's slope over
all sizes: a token bucket (tc tbf, a NIC's burst allowance) passes a message's first
bytes at once, which tilts the line below the link's byte time though every large
message pays it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelling.measure.files import read_json
from modelling.measure.links import multi_node, ps_link_queue
from modelling.measure.records import COMM_KIND, CommModelError, migrate_comm

# Sustained rate: the slope over the sizes within this factor of the largest.
SUSTAINED_RANGE = 16
# A sustained beta this far below the link's byte time is measurement noise, not physics broken.
PHYSICS_TOLERANCE = 0.02
MODEL_KIND = "ddlbench-comm-model"


def _line(sizes: np.ndarray, times: np.ndarray, through_origin: bool = False) -> tuple[float, float]:
    w = 1.0 / np.maximum(times, 1e-12)
    cols = [sizes] if through_origin else [np.ones_like(sizes), sizes]
    coef, *_ = np.linalg.lstsq(np.stack(cols, axis=1) * w[:, None], times * w, rcond=None)
    return (0.0, float(coef[0])) if through_origin else (float(coef[0]), float(coef[1]))


def fit_line(sizes: list[float], times: list[float]) -> dict[str, Any]:
    """t = a + b*M with R^2 and residuals; a negative intercept is flagged and refitted at 0."""
    m, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if len(m) < 2 or np.ptp(m) == 0:
        raise ValueError("need measurements at two or more message sizes to fit a line")
    a, b = _line(m, t)
    flags = []
    if a < 0:
        flags.append(f"negative alpha ({a:.3g} s); refitted with alpha = 0")
        a, b = _line(m, t, through_origin=True)
    pred = a + b * m
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    return {
        "intercept_s": a,
        "slope_s_per_byte": b,
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        "residuals_s": [float(x) for x in t - pred],
        "flags": flags,
    }


def sustained_slope(sizes: list[float], times: list[float]) -> float:
    """Seconds per byte of the largest messages: an unweighted least-squares slope over the
    sizes within SUSTAINED_RANGE of the largest (at least the two largest)."""
    m, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    order = np.argsort(m)
    m, t = m[order], t[order]
    top = max(int(np.sum(m * SUSTAINED_RANGE >= m[-1])), 2)
    m, t = m[-top:], t[-top:]
    return float(np.polyfit(m, t, 1)[0]) if np.ptp(m) > 0 else 0.0


def _cost(row: dict[str, Any]) -> float:
    """A row's expected cost: its trimmed mean over repeats (modelling/measure/records.py)."""
    return row["mean_s"]


def _grouped(
    comm: dict[str, Any], value: Callable[[dict[str, Any]], float | None] = _cost,
    only: tuple[str, int, int] | None = None,
) -> dict[tuple[str, int, int], tuple[list[float], list[float]]]:
    """Per (primitive, workers, servers), or for the one key `only`: sizes ascending and each
    size's `value` (by default its trimmed mean over repeats: the expected cost, which
    throughput pays), rows without one left out. A size measured more than once (comm.json
    files merged from several world sizes) counts once, as the median of its values. `value`
    sees only the rows of its key: a per-worker field has as many entries as that world."""
    raw: dict[tuple[str, int, int], dict[float, list[float]]] = {}
    for row in comm["measurements"]:
        key = (row["primitive"], int(row["workers"]), int(row["servers"]))
        if only is not None and key != only:
            continue
        v = value(row)
        if v is not None:
            raw.setdefault(key, {}).setdefault(float(row["bytes"]), []).append(float(v))
    return {
        key: (sorted(by_size), [statistics.median(by_size[m]) for m in sorted(by_size)]) for key, by_size in raw.items()
    }


def fit_comm(comm: dict[str, Any], *, link_bytes_per_s: float | None = None) -> dict[str, Any]:
    """model.json content: one fit per primitive and world size."""
    if comm.get("kind") != COMM_KIND or not isinstance(comm.get("measurements"), list):
        raise CommModelError("comm: not a ddlbench comm.json (no 'measurements' of kind ddlbench-comm)")
    comm = migrate_comm(comm, "comm")
    link = link_bytes_per_s or comm.get("link_bytes_per_s")
    groups = _grouped(comm)
    placed = _placements(comm)
    p2p_beta = p2p_sustained = None
    fits = []
    for prim, n, s in sorted(groups, key=lambda k: (k[0] != "p2p", k)):
        if prim == "allreduce" and n < 2:  # one rank reduces nothing: no cost to fit
            continue
        sizes, times = groups[(prim, n, s)]
        line = fit_line(sizes, times)
        a, b = line["intercept_s"], line["slope_s_per_byte"]
        top = sustained_slope(sizes, times)
        gamma, queue, extra = None, None, {}
        if prim == "p2p":
            alpha, beta, sustained = a, b, top
            p2p_beta, p2p_sustained = beta, sustained
        elif prim == "loopback":  # a pair on one node of a cluster: no link to check against
            alpha, beta, sustained = a, b, top
        elif prim == "allreduce":
            alpha = a / (2 * (n - 1))
            per_byte = b * n / (n - 1)  # 2 beta + gamma
            beta = p2p_beta if p2p_beta is not None and 2 * p2p_beta <= per_byte else per_byte / 2
            gamma = per_byte - 2 * beta
            sustained_per_byte = top * n / (n - 1)
            sustained = (
                p2p_sustained
                if p2p_sustained is not None and 2 * p2p_sustained <= sustained_per_byte
                else sustained_per_byte / 2
            )
        elif prim == "ps":
            node_of_rank = placed.get((n, s))
            queue = ps_link_queue(n, s, node_of_rank)
            # Over node links the transfers' latencies overlap and only their bytes queue.
            overlap = multi_node(node_of_rank)
            alpha, beta, sustained = a / (2 if overlap else 2 * queue), b * s / (2 * queue), top * s / (2 * queue)
            extra = {"link_queue": queue, "node_of_rank": node_of_rank, "latency_overlaps": overlap,
                     "post_s": _per_size(comm, lambda row: row["post_s"], (prim, n, s), sizes),
                     "pull_lead_s": _per_size(comm, lambda row: row["pull_lead_s"], (prim, n, s), sizes)}
        elif prim == "asgd":
            # One pass: a push and a pull of M/S bytes to each shard, timed as ASGD runs it and
            # used as measured (CommCosts.asgd_pass), per worker: a colocated shard's own
            # workers pass within their node. Its line is only a summary, per transfer.
            node_of_rank = placed.get((n, s))
            alpha, beta, sustained = a / 2, b * s / 2, top * s / 2
            extra = {"node_of_rank": node_of_rank, "worker_mean_s": _per_worker(comm, n, s, sizes),
                     "reply_tail_s": _per_worker(comm, n, s, sizes, "reply_tail_s")}
        else:
            raise CommModelError(f"comm: unknown primitive {prim!r} in the measurements")
        if prim in ("allreduce", "ps"):
            extra["host_cpu_s"] = _per_size(comm, lambda row: row["host_cpu_s"], (prim, n, s), sizes)
        flags = list(line["flags"])
        usable = True
        if beta <= 0:  # time that does not grow with size: noise swamped the sizes measured
            flags.append(f"beta {beta:.3g} s/B is not positive; measure larger messages. Not used")
            usable = False
        elif link and prim not in ("asgd", "loopback") and sustained < (1.0 - PHYSICS_TOLERANCE) / link:
            flags.append(
                f"sustained beta {sustained:.3g} s/B (over the largest sizes) is faster than the link's "
                f"{1.0 / link:.3g} s/B ({link * 8 / 1e9:.3g} Gbit/s); not used"
            )
            usable = False
        fits.append(
            {
                "primitive": prim,
                "workers": n,
                "servers": s,
                "alpha_s": alpha,
                "beta_s_per_byte": beta,
                "gamma_s_per_byte": gamma,
                "sustained_beta_s_per_byte": sustained,
                "sustained_slope_s_per_byte": top,
                **extra,
                **line,
                "sizes": sizes,
                "measured_s": times,
                "usable": usable,
            }
        )
        fits[-1]["flags"] = flags
    return {"kind": MODEL_KIND, "link_bytes_per_s": link, "environment": comm.get("environment", {}), "fits": fits}


def _per_size(comm: dict[str, Any], value: Callable[[dict[str, Any]], float | None], key: tuple[str, int, int],
              sizes: list[float]) -> list[float] | None:
    """Per size, the median of the rows' `value` (newer comm.json files; None where a size
    lacks it): a ps round's post_s, the time a worker took to post its sends and receives;
    an allreduce's or ps round's host_cpu_s, the host's CPU time for one (microbench_rank);
    one worker's ASGD pass."""
    measured, values = _grouped(comm, value, only=key).get(key, ([], []))
    return values if measured == sizes else None


def _per_worker(comm: dict[str, Any], n: int, s: int, sizes: list[float],
                field: str = "worker_mean_s") -> list[list[float]] | None:
    """ASGD passes, per worker and size (the median over merged files): `worker_mean_s` its
    trimmed-mean pass, `reply_tail_s` its reply's median time on the link after the shard
    went on. None where a file lacks it (older comm.json files)."""
    series = [
        _per_size(comm, lambda row, w=w: (row[field] or [None] * n)[w], ("asgd", n, s), sizes)
        for w in range(n)
    ]
    return None if None in series else series


def _placements(comm: dict[str, Any]) -> dict[tuple[int, int], list[int]]:
    """(workers, servers) -> the node of every rank of that microbenchmark, where recorded."""
    out: dict[tuple[int, int], list[int]] = {}
    for row in comm["measurements"]:
        if row["node_of_rank"] is not None:
            out.setdefault((int(row["workers"]), int(row["servers"])), list(row["node_of_rank"]))
    return out


def load_comm_model(path: Path) -> dict[str, Any]:
    return check_comm_model(read_json(path, "comm model file", CommModelError), str(path))


def check_comm_model(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` if it is a fitted comm model (model.json, or a hardware profile's `comm_model`);
    CommModelError naming `source` otherwise."""
    if not isinstance(data, dict) or data.get("kind") != MODEL_KIND or not isinstance(data.get("fits"), list):
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise CommModelError(f"{source}: not a ddlbench comm model (kind {kind!r}); write one with `ddlbench fit`")
    for i, f in enumerate(data["fits"]):
        missing = {"primitive", "workers", "alpha_s", "beta_s_per_byte", "intercept_s", "slope_s_per_byte"} - set(f)
        if missing:
            raise CommModelError(f"{source}: fits[{i}] lacks {', '.join(sorted(missing))}")
    return data
