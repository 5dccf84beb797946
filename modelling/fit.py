"""Fit alpha-beta(-gamma) communication models to microbenchmarks (DESIGN §3).

Per primitive and world size, a weighted least-squares line t = a + b*M over
the log-spaced sizes (weights 1/t: every size counts by its relative error,
so the few largest do not decide alpha alone), then the cost model's
constants from a and b:

- p2p (one way):                 t = alpha + M beta
- allreduce (ring, N ranks):     t = 2(N-1) alpha + (N-1)/N M (2 beta + gamma)
- ps (N workers, S shards, one push and pull round, each of M/S bytes per
  worker and shard): t = 2L (alpha + M/S beta), L the transfers that queue on
  the busiest link one way (modelling/links.py): N on one host, where they queue
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

import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelling.files import read_json
from modelling.links import multi_node, ps_link_queue

COMM_KIND = "ddlbench-comm"
# Sustained rate: the slope over the sizes within this factor of the largest.
SUSTAINED_RANGE = 16
# A sustained beta this far below the link's byte time is measurement noise, not physics broken.
PHYSICS_TOLERANCE = 0.02
MODEL_KIND = "ddlbench-comm-model"


class CommModelError(ValueError):
    """A comm.json or model.json is missing, truncated or not ours; the message names the file."""


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
    """A row's expected cost: the trimmed mean where measured (newer comm.json), else the median."""
    return row.get("mean_s", row["median_s"])


def _grouped(
    comm: dict[str, Any], value: Callable[[dict[str, Any]], float | None] = _cost
) -> dict[tuple[str, int, int], tuple[list[float], list[float]]]:
    """Per (primitive, workers, servers): sizes ascending and each size's `value` (by default
    its trimmed mean over repeats: the expected cost, which throughput pays), rows without
    one left out. A size measured more than once (comm.json files merged from several world
    sizes) counts once, as the median of its values."""
    raw: dict[tuple[str, int, int], dict[float, list[float]]] = {}
    for row in comm["measurements"]:
        key = (row["primitive"], int(row["workers"]), int(row.get("servers", 0)))
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
    link = link_bytes_per_s or comm.get("link_bytes_per_s")
    groups = _grouped(comm)
    placed = _placements(comm)
    p2p_beta = p2p_sustained = None
    fits = []
    for prim, n, s in sorted(groups, key=lambda k: (k[0] != "p2p", k)):
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
                     "post_s": _per_size(comm, lambda row: row.get("post_s"), (prim, n, s), sizes),
                     "pull_lead_s": _per_size(comm, lambda row: row.get("pull_lead_s"), (prim, n, s), sizes)}
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
            extra["host_cpu_s"] = _per_size(comm, lambda row: row.get("host_cpu_s"), (prim, n, s), sizes)
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
    measured, values = _grouped(comm, value).get(key, ([], []))
    return values if measured == sizes else None


def _per_worker(comm: dict[str, Any], n: int, s: int, sizes: list[float],
                field: str = "worker_mean_s") -> list[list[float]] | None:
    """ASGD passes, per worker and size (the median over merged files): `worker_mean_s` its
    trimmed-mean pass, `reply_tail_s` its reply's median time on the link after the shard
    went on. None where a file lacks it (older comm.json files)."""
    series = [
        _per_size(comm, lambda row, w=w: (row.get(field) or [None] * n)[w], ("asgd", n, s), sizes)
        for w in range(n)
    ]
    return None if None in series else series


def _placements(comm: dict[str, Any]) -> dict[tuple[int, int], list[int]]:
    """(workers, servers) -> the node of every rank of that microbenchmark, where recorded."""
    out: dict[tuple[int, int], list[int]] = {}
    for row in comm["measurements"]:
        if row.get("node_of_rank") is not None:
            out.setdefault((int(row["workers"]), int(row.get("servers", 0))), list(row["node_of_rank"]))
    return out


def load_comm(path: Path) -> dict[str, Any]:
    data = read_json(path, "comm.json file", CommModelError)
    if data.get("kind") != COMM_KIND or not isinstance(data.get("measurements"), list):
        raise CommModelError(
            f"{path}: not a ddlbench comm.json (kind {data.get('kind')!r}); write one with `ddlbench microbench`"
        )
    return data


def load_comm_model(path: Path) -> dict[str, Any]:
    data = read_json(path, "comm model file", CommModelError)
    if data.get("kind") != MODEL_KIND or not isinstance(data.get("fits"), list):
        raise CommModelError(
            f"{path}: not a ddlbench comm model (kind {data.get('kind')!r}); write one with `ddlbench fit`"
        )
    for i, f in enumerate(data["fits"]):
        missing = {"primitive", "workers", "alpha_s", "beta_s_per_byte", "intercept_s", "slope_s_per_byte"} - set(f)
        if missing:
            raise CommModelError(f"{path}: fits[{i}] lacks {', '.join(sorted(missing))}")
    return data


class CommCosts:
    """Time of each primitive from a fitted model, with optional bandwidth what-if."""

    def __init__(self, model: dict[str, Any], bandwidth_bytes_per_s: float | None = None) -> None:
        self.fits = model["fits"]
        self.bw = bandwidth_bytes_per_s
        self.link = model.get("link_bytes_per_s")  # the stated link rate the fit was checked against
        self.environment = model.get("environment") or {}
        self.notes: list[str] = []  # what the costs handed out so far assumed in place of a fit

    def _nearest(self, prim: str, workers: int, servers: int = 0) -> dict[str, Any] | None:
        cands = [f for f in self.fits if f["primitive"] == prim]
        if not cands:
            return None

        def dist(f: dict[str, Any]) -> tuple[float, float]:
            return (abs(math.log(f["workers"] / workers)), abs(f.get("servers", 0) - servers))

        return min(cands, key=dist)

    def _usable(self, f: dict[str, Any]) -> dict[str, Any]:
        """The fit itself, unless it is flagged and no bandwidth replaces its beta (`_rate`)."""
        if not f.get("usable", True) and self._rate(f) is None:
            raise CommModelError(
                f"comm model: the {f['primitive']} fit for {f['workers']} workers is flagged "
                f"({'; '.join(f['flags'])}); give a bandwidth to predict with"
            )
        return f

    def _rate(self, f: dict[str, Any]) -> float | None:
        """The bytes/s that sets a transfer's wire time in place of the fit's beta: a what-if
        bandwidth; else, for a flagged fit, the stated link rate (a fit faster than its link
        measured another path, e.g. loopback, and says nothing about the link), with a note;
        None: the fit's own beta."""
        if self.bw is not None:
            return self.bw
        if f.get("usable", True) or not self.link:
            return None
        note = (f"the {f['primitive']} fit for {f['workers']} workers is flagged ({'; '.join(f['flags'])}); "
                f"wire time at the stated link rate ({self.link * 8 / 1e9:.3g} Gbit/s)")
        if note not in self.notes:
            self.notes.append(note)
        return self.link

    def allreduce(self, workers: int):
        """bytes -> seconds of a ring allreduce over `workers` ranks."""
        if workers <= 1:
            return lambda _m: 0.0
        f = self._nearest("allreduce", workers)
        if f is None:
            p = self._nearest("p2p", 2)
            if p is None:
                raise CommModelError("comm model: no allreduce or p2p fits; run `ddlbench microbench`")
            self._usable(p)
            alpha, beta, gamma = p["alpha_s"], p["beta_s_per_byte"], 0.0
        elif f["workers"] == workers and self.bw is None and (_noisy_only(f) or self._rate(f) is None):
            # The measurements themselves: usable where only noise spoiled the fitted line.
            return _measured(f if _noisy_only(f) else self._usable(f))
        else:
            self._usable(f)
            alpha, beta, gamma = f["alpha_s"], f["beta_s_per_byte"], max(f["gamma_s_per_byte"] or 0.0, 0.0)
        rate = self._rate(f if f is not None else p)
        if rate is not None:
            beta = 1.0 / rate
        n = workers
        return lambda m: 2 * (n - 1) * alpha + (n - 1) / n * m * (2 * beta + gamma)

    def post(self, workers: int, servers: int):
        """bytes of the model -> seconds a worker takes to post a round's sends and receives to
        every shard (measured, interpolated over sizes); 0 where the microbenchmark did not
        time it (older comm.json files)."""
        f = self._nearest("ps", workers, servers)
        if f is None or not f.get("post_s"):
            return lambda _m: 0.0
        sizes, posts = np.asarray(f["sizes"], dtype=float), np.asarray(f["post_s"], dtype=float)
        # Outside the sizes measured, the nearest end's: posting does not grow with the size
        # the way a transfer does (gloo writes what the socket takes and queues the rest).
        return lambda m: max(_local_linear(sizes, posts, float(np.clip(m, sizes[0], sizes[-1]))), 0.0)

    def pull_lead(self, workers: int, servers: int) -> Callable[[float], float] | None:
        """bytes of a shard -> how much sooner the shard's first remote worker has its pull back
        than its last (microbench_rank._pull_lead), as measured for this very world: its links'
        queues at their rate. Each size's at least 0 (the order flips now and then: a negative
        median is no lead), interpolated linearly between sizes, the nearest end's outside
        them; not `_local_linear`, whose weights (1/t) do not hold for values at or near 0.
        None for another world, a what-if bandwidth or an older file."""
        f = self._measured_here("ps", workers, servers, "pull_lead_s")
        if f is None:
            return None
        sizes = np.asarray(f["sizes"], dtype=float)
        leads = np.maximum(np.asarray(f["pull_lead_s"], dtype=float), 0.0)
        return lambda m: float(np.interp(m * servers, sizes, leads))  # a round's size: the whole model

    def loopback_latency(self) -> float | None:
        """Placed, a transfer within a node (a worker and its colocated shard): the one-way
        latency of the ping-pong within a node (the loopback fit's alpha), where the
        microbenchmark timed one; else at most the one-way latency that the ping-pong measured
        across a link (the p2p fit's alpha), as a loopback copy crosses no link and no slower
        one. Not the PS round's cost at 0 bytes:
        that round is timed to its remote worker, and at small sizes it holds the host's
        scheduling delays (the microbenchmark's 4 KiB round took 2-4 ms over a 1 Gbit/s
        link whose one-way latency was 0.2 ms). None without a p2p fit."""
        p = self._nearest("loopback", 2) or self._nearest("p2p", 2)
        return None if p is None else max(float(p["alpha_s"]), 0.0)

    def _measured_here(self, primitive: str, workers: int, servers: int, field: str) -> dict[str, Any] | None:
        """The fit of exactly this world that recorded `field`, unless a what-if bandwidth puts
        other links (other hosts) in its place: what is only used as measured."""
        f = self._nearest(primitive, workers, servers)
        if f is None or self.bw is not None or (f["workers"], f.get("servers", 0)) != (workers, servers):
            return None
        return f if f.get(field) else None

    def host_cpu(self, primitive: str, workers: int, servers: int = 0):
        """bytes -> the host's CPU-seconds of one allreduce (or ps round) of this world, where
        the microbenchmark measured it with every rank on one host: loopback, or the nodes
        of an emulated cluster. None elsewhere, for a world it did not measure, and for a
        bandwidth what-if (other links, other hosts). One line a + b M over the sizes, least
        squares in absolute terms (the kernel's ticks add the same error to every size, up
        to 20 ms over a loop of at least 0.5 s on 2 cores): a the round's fixed cost (threads
        woken, gloo's bookkeeping, the kernel's per-message work), b its cost per byte; both
        at least 0."""
        f = self._measured_here(primitive, workers, servers, "host_cpu_s")
        if f is None or self.environment.get("hosts") != 1:
            return None
        a, b = _nonnegative_line(np.asarray(f["sizes"], dtype=float), np.asarray(f["host_cpu_s"], dtype=float))
        return lambda m: a + b * m

    def asgd_pass(self, workers: int, servers: int) -> list[Callable[[float], float]] | None:
        """Per worker, bytes of the model -> seconds of one ASGD pass (its push to every shard
        and their replies, the shards' apply not included), as the microbenchmark timed it
        for this very world; None for another world, a what-if bandwidth or an older file."""
        f = self._measured_here("asgd", workers, servers, "worker_mean_s")
        if f is None:
            return None
        return [
            _measured({**f, "measured_s": series, "sustained_slope_s_per_byte": sustained_slope(f["sizes"], series)})
            for series in f["worker_mean_s"]
        ]

    def asgd_reply_tail(self, workers: int, servers: int) -> list[Callable[[float], float]] | None:
        """Per worker, bytes of the model -> seconds that the link still carried a shard's reply
        after the shard had returned from sending it, as the microbenchmark timed it in ASGD's
        pattern for this very world; None for another world, a what-if bandwidth or an older
        file. Interpolated over the sizes; outside them, the nearest end's: past the largest,
        the bytes still in flight when a send returns (the socket's buffer, the qdisc's queue,
        TCP's window) no longer grow with the message (and a reply smaller than the smallest
        is buffered whole, which ASGDPlan caps at its transfer)."""
        f = self._measured_here("asgd", workers, servers, "reply_tail_s")
        if f is None:
            return None
        sizes = np.asarray(f["sizes"], dtype=float)

        def tail(series: list[float]) -> Callable[[float], float]:
            ts = np.asarray(series, dtype=float)
            return lambda m: max(_local_linear(sizes, ts, float(np.clip(m, sizes[0], sizes[-1]))), 0.0)

        return [tail(series) for series in f["reply_tail_s"]]

    def transfer(self, workers: int, servers: int):
        """bytes -> seconds of one push or pull between a worker and a shard."""
        f = self._nearest("ps", workers, servers) or self._nearest("p2p", 2)
        if f is None:
            raise CommModelError("comm model: no ps or p2p fits; run `ddlbench microbench --servers 1`")
        if (
            (f["primitive"], f["workers"], f.get("servers", 0)) == ("ps", workers, servers)
            and self.bw is None
            and _noisy_only(f)
        ):
            # A measured round is 2L transfers of M/S bytes queued on the busiest link; over
            # node links their latencies overlap (the round's intercept, two of them) and
            # only what the bytes add queues.
            round_s, queue = _measured(f), f.get("link_queue") or workers
            if f.get("latency_overlaps"):
                latency = max(f["intercept_s"], 0.0)
                return lambda m: latency / 2 + max(round_s(m * servers) - latency, 0.0) / (2 * queue)
            return lambda m: round_s(m * servers) / (2 * queue)
        self._usable(f)
        alpha, rate = f["alpha_s"], self._rate(f)
        beta = 1.0 / rate if rate is not None else f["beta_s_per_byte"]
        return lambda m: alpha + m * beta

    def note(self, mark: int = 0) -> str:
        """What the costs handed out since `mark` (a length of `notes`) assumed in place of a fit."""
        return "; ".join(self.notes[mark:])


def _nonnegative_line(m: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Unweighted least squares t = a + b m with a, b >= 0 (a clipped one is refitted without it)."""
    if len(m) < 2 or np.ptp(m) == 0:
        return max(float(np.mean(t)), 0.0), 0.0
    b, a = np.polyfit(m, t, 1)
    if b < 0:
        return max(float(np.mean(t)), 0.0), 0.0
    if a < 0:
        return 0.0, max(float(np.dot(m, t) / np.dot(m, m)), 0.0)
    return float(a), float(b)


def _noisy_only(f: dict[str, Any]) -> bool:
    """Measurements to interpolate, and no flag beyond a line that noise made flat
    (a fit faster than the link says the measurements themselves are suspect)."""
    return "measured_s" in f and (f.get("usable", True) or f["beta_s_per_byte"] <= 0)


def _measured(f: dict[str, Any]):
    """bytes -> seconds: the measurements, locally smoothed; past the largest, the slope of
    the largest sizes (the sustained rate; older fits: the fitted slope), or for a flagged
    fit the slope from the smallest to the largest size."""
    a, b = f["intercept_s"], f["slope_s_per_byte"]
    if "measured_s" not in f:
        return lambda m: a + b * m
    sizes, times = np.asarray(f["sizes"], dtype=float), np.asarray(f["measured_s"], dtype=float)
    order = np.argsort(sizes)
    sizes, times = sizes[order], times[order]
    b = f.get("sustained_slope_s_per_byte") or b
    if not f.get("usable", True) or b <= 0:
        b = float((times[-1] - times[0]) / (sizes[-1] - sizes[0])) if len(sizes) > 1 else 0.0

    def cost(m: float) -> float:
        if m > sizes[-1]:
            if b <= 0:
                raise CommModelError(
                    f"comm model: {m:.0f} B is past the largest {f['primitive']} size measured for "
                    f"{f['workers']} workers ({sizes[-1]:.0f} B) and its fit is flagged "
                    f"({'; '.join(f['flags'])}); measure larger messages or give a bandwidth"
                )
            return float(times[-1] + (m - sizes[-1]) * b)
        return _local_linear(sizes, times, m)

    return cost


def _local_linear(sizes: np.ndarray, times: np.ndarray, m: float, octaves: float = 1.0) -> float:
    """The time at m from a line fitted to the measurements near m: each size weighted by a
    Gaussian of its distance from m in octaves (and by 1/t, as in the global fit). It
    follows a transport's bends in M that one line misses, while neighbouring sizes
    average out the noise that a plain interpolation between two medians keeps."""
    if len(sizes) == 1:
        return float(times[0])
    dist = (np.log2(sizes) - np.log2(max(m, 1.0))) / octaves
    w = np.exp(-0.25 * dist**2) / np.maximum(times, 1e-12)  # sqrt of the Gaussian weight
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(sizes), sizes], axis=1) * w[:, None], times * w, rcond=None)
    return float(max(coef[0] + coef[1] * m, 0.0))
