"""What a fitted comm model (model.json, modelling/network/fit.py) says a transfer costs: per
primitive and world size, bytes -> seconds, the measurements themselves where they were
taken for this very world, the fitted constants elsewhere, a what-if or the stated link rate
for the wire time where given (DESIGN §3). Fitting lives in modelling/network/fit.py."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from modelling.measure.records import CommModelError, migrate_model
from modelling.network.fit import PHYSICS_TOLERANCE, sustained_slope

# The two largest point-to-point messages pay the link's byte time between them, to what noise
# leaves (fit.PHYSICS_TOLERANCE), where the link is their path past its bucket; a faster slope is
# another path, or a link faster than stated, and no bucket.
LINK_SLOPE = 1.0 - PHYSICS_TOLERANCE


class CommCosts:
    """Time of each primitive from a fitted model, with optional bandwidth what-if."""

    def __init__(self, model: dict[str, Any], bandwidth_bytes_per_s: float | None = None) -> None:
        try:
            model = migrate_model(model)
        except ValueError as err:
            raise CommModelError(str(err)) from None
        self.fits = model["fits"]
        self.link = model["link_bytes_per_s"]  # the stated link rate the fit was checked against
        # A what-if is another rate than the links the microbenchmark measured: the measured rate
        # stated again (a spec's network.link_bandwidth) is those links, with what they measured.
        same = self.link is not None and bandwidth_bytes_per_s is not None and \
            math.isclose(bandwidth_bytes_per_s, self.link, rel_tol=1e-9)
        self.bw = None if same else bandwidth_bytes_per_s
        self.environment = model["environment"]
        self.notes: list[str] = []  # what the costs handed out so far assumed in place of a fit

    def _nearest(self, prim: str, workers: int, servers: int = 0) -> dict[str, Any] | None:
        cands = [f for f in self.fits if f["primitive"] == prim]
        if not cands:
            return None

        def dist(f: dict[str, Any]) -> tuple[float, float]:
            return (abs(math.log(f["workers"] / workers)), abs(f["servers"] - servers))

        return min(cands, key=dist)

    def _usable(self, f: dict[str, Any]) -> dict[str, Any]:
        """The fit itself, unless it is flagged and no bandwidth replaces its beta (`_rate`)."""
        if not f["usable"] and self._rate(f) is None:
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
        if f["usable"] or not self.link:
            return None
        note = (f"the {f['primitive']} fit for {f['workers']} workers is flagged ({'; '.join(f['flags'])}); "
                f"wire time at the stated link rate ({self.link * 8 / 1e9:.3g} Gbit/s)")
        self.notes.append(note)  # every time: each prediction's note is its own (`note`)
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
        if f is None or not f["post_s"]:
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
        microbenchmark timed one, and at most the one-way latency that the ping-pong measured
        across a link (the p2p fit's alpha), as a loopback copy crosses no link and is no
        slower than one that does. Not the PS round's cost at 0 bytes:
        that round is timed to its remote worker, and at small sizes it holds the host's
        scheduling delays, not a copy's latency. None without a p2p fit."""
        fits = [f for f in (self._nearest("loopback", 2), self._nearest("p2p", 2)) if f is not None]
        return min((max(float(f["alpha_s"]), 0.0) for f in fits), default=None)

    def _measured_here(self, primitive: str, workers: int, servers: int, field: str) -> dict[str, Any] | None:
        """The fit of exactly this world that recorded `field`, unless a what-if bandwidth puts
        other links (other hosts) in its place: what is only used as measured."""
        f = self._nearest(primitive, workers, servers)
        if f is None or self.bw is not None or (f["workers"], f["servers"]) != (workers, servers):
            return None
        return f if f[field] else None

    def host_cpu(self, primitive: str, workers: int, servers: int = 0):
        """bytes -> the host's CPU-seconds of one allreduce (or ps round) of this world, where
        the microbenchmark measured it with every rank on one host: loopback, or the nodes
        of an emulated cluster. None elsewhere, for a world it did not measure, and for a
        bandwidth what-if (other links, other hosts). One line a + b M over the sizes, least
        squares in absolute terms (the kernel counts CPU time in ticks, which add the same
        absolute error to every size): a the round's fixed cost (threads
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
        """Per worker, bytes of the model -> seconds that the link still carries a shard's reply
        after the shard has returned from sending it, from what the microbenchmark timed in
        ASGD's pattern for this very world; None for another world, a what-if bandwidth or an
        older file. A blocking send returns once the kernel holds the rest of the message (the
        socket's send buffer, the qdisc's queue, TCP's window): the link then carries what those
        hold, which does not shrink as the message grows, or the whole reply where it is
        smaller. So a reply's tail is the one measured for the smallest size at least as large
        (past the largest, the largest's); Fabric.reply_on_link caps it at the reply's own time
        on the link. Not a line through the sizes: the tail rises and then flattens, and a line
        across the bend falls short of it."""
        f = self._measured_here("asgd", workers, servers, "reply_tail_s")
        if f is None:
            return None
        sizes = np.asarray(f["sizes"], dtype=float)
        order = np.argsort(sizes)
        sizes = sizes[order]

        def tail(series: list[float]) -> Callable[[float], float]:
            ts = np.maximum(np.asarray(series, dtype=float)[order], 0.0)
            return lambda m: float(ts[min(int(np.searchsorted(sizes, m)), len(ts) - 1)])

        return [tail(series) for series in f["reply_tail_s"]]

    def transfer(self, workers: int, servers: int):
        """bytes -> seconds of one push or pull between a worker and a shard."""
        f = self._nearest("ps", workers, servers) or self._nearest("p2p", 2)
        if f is None:
            raise CommModelError("comm model: no ps or p2p fits; run `ddlbench microbench --servers 1`")
        if (
            (f["primitive"], f["workers"], f["servers"]) == ("ps", workers, servers)
            and self.bw is None
            and _noisy_only(f)
        ):
            # A measured round is 2L transfers of M/S bytes queued on the busiest link; over
            # node links their latencies overlap (the round's intercept, two of them) and
            # only what the bytes add queues.
            round_s, queue = _measured(f), f["link_queue"] or workers
            if f["latency_overlaps"]:
                latency = max(f["intercept_s"], 0.0)
                return lambda m: latency / 2 + max(round_s(m * servers) - latency, 0.0) / (2 * queue)
            return lambda m: round_s(m * servers) / (2 * queue)
        self._usable(f)
        alpha, rate = f["alpha_s"], self._rate(f)
        beta = 1.0 / rate if rate is not None else f["beta_s_per_byte"]
        return lambda m: alpha + m * beta

    def link_burst(self, workers: int, servers: int) -> float:
        """Seconds of the link's rate that one direction of a node link passes at once after a
        worker's computation, where `transfer` charges this world's pushes and pulls the link's
        rate (no measured round of this world to follow: its fit flagged faster than the link);
        0 elsewhere (a measured round holds its bursts already; a what-if rate is other links).
        A shaped link is a token bucket (tc tbf; a cloud NIC's burst credits): idle, it gathers
        tokens at its rate up to its bucket, and a message's first bytes up to the tokens pass at
        the line's speed, so a message of m bytes after a pause takes latency + max(0, m -
        tokens) / rate. The microbenchmark's point-to-point sends cross the link after the same
        pause as training's (its gap is the model's compute iteration), so the tokens are the
        largest send's byte time less what it took past the smallest (which the bucket passes
        whole): the bucket as training meets it, short by the smallest send's bytes. Only where
        the two largest sends pay the link's byte time between them (past the bucket, to
        LINK_SLOPE) is that a bucket: sends faster than that crossed another path, or a link
        faster than stated, whose line no bucket explains; a bucket past the second largest send
        is not read (no line past it), and the sends are charged the rate as before."""
        ps = self._nearest("ps", workers, servers)
        if ps is not None and (ps["workers"], ps["servers"]) == (workers, servers) and _noisy_only(ps):
            return 0.0
        return self.bucket_s()

    def bucket_s(self) -> float:
        """The node links' token bucket as the microbenchmark's sends met it, in seconds of the
        link's rate (`link_burst`); 0 where none is read: one node, no stated rate, a what-if rate."""
        rate = self.link
        if not rate or self.bw is not None or self.environment.get("nodes", 1) < 2:
            return 0.0
        p2p = self._nearest("p2p", 2)
        if p2p is None or p2p["measured_s"] is None or len(p2p["sizes"]) < 2:
            return 0.0
        order = np.argsort(p2p["sizes"])
        sizes = np.asarray(p2p["sizes"], dtype=float)[order]
        times = np.asarray(p2p["measured_s"], dtype=float)[order]
        if (times[-1] - times[-2]) < LINK_SLOPE * (sizes[-1] - sizes[-2]) / rate:
            return 0.0
        return float(max((sizes[-1] - sizes[0]) / rate - (times[-1] - times[0]), 0.0))

    def note(self, mark: int = 0) -> str:
        """What the costs handed out since `mark` (a length of `notes`) assumed in place of a fit,
        each once."""
        return "; ".join(dict.fromkeys(self.notes[mark:]))


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
    return f["measured_s"] is not None and (f["usable"] or f["beta_s_per_byte"] <= 0)


def _measured(f: dict[str, Any]):
    """bytes -> seconds: the measurements, locally smoothed; past the largest, the slope of
    the largest sizes (the sustained rate; older fits: the fitted slope), or for a flagged
    fit the slope from the smallest to the largest size."""
    a, b = f["intercept_s"], f["slope_s_per_byte"]
    if f["measured_s"] is None:
        return lambda m: a + b * m
    sizes, times = np.asarray(f["sizes"], dtype=float), np.asarray(f["measured_s"], dtype=float)
    order = np.argsort(sizes)
    sizes, times = sizes[order], times[order]
    b = f["sustained_slope_s_per_byte"] or b
    if not f["usable"] or b <= 0:
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
    # A prediction asks the same few sizes of the same fit thousands of times (every transfer
    # of every DAG it builds): each answer is a least-squares solve, so it is kept.
    return _local_linear_at(tuple(sizes.tolist()), tuple(times.tolist()), float(m), octaves)


@functools.lru_cache(maxsize=65536)
def _local_linear_at(sizes_t: tuple[float, ...], times_t: tuple[float, ...], m: float, octaves: float) -> float:
    sizes, times = np.asarray(sizes_t), np.asarray(times_t)
    dist = (np.log2(sizes) - np.log2(max(m, 1.0))) / octaves
    w = np.exp(-0.25 * dist**2) / np.maximum(times, 1e-12)  # sqrt of the Gaussian weight
    coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(sizes), sizes], axis=1) * w[:, None], times * w, rcond=None)
    return float(max(coef[0] + coef[1] * m, 0.0))
