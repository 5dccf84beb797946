"""Per-node system metrics in a training run (docs/tracking.md, "System metrics"): on a multi-node
cluster whose nodes the provider can read (infra/base.py `node_usage`; the netns provider), each
node's CPU, memory and network as its own series, named as MLflow names a node's system metrics
(`system/<node>/<metric>`, MLflow's `node_id` layout), beside the host's own series.

Sampled live, as MLflow's monitor is: where MLflow is down there is nothing to replay.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from contextlib import suppress

from infra.node_usage import NodeUsage

MB = 1e6


class NodeMetrics:
    """Samples `usage` every `interval_s` into `log(metrics, step)` on a thread of its own, from
    `start()` to `stop()` (which takes a last sample). CPU is the node's share of the host's
    cores over the interval (0-100, as MLflow's host CPU is); memory the resident megabytes of
    its processes; network the megabytes its link sent and received since `start()`."""

    def __init__(self, usage: Callable[[], dict[str, NodeUsage] | None],
                 log: Callable[[dict[str, float], int], None], interval_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._usage, self._log, self.interval_s, self._clock = usage, log, interval_s, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: dict[str, NodeUsage] = {}
        self._last: tuple[float, dict[str, NodeUsage]] = (0.0, {})
        self.steps = 0

    def start(self) -> NodeMetrics:
        self._first = self._usage() or {}
        self._last = (self._clock(), self._first)
        if self._first:
            self._thread = threading.Thread(target=self._run, name="node-metrics", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> dict[str, float]:
        """One reading of every node, logged at the next step; the metrics logged."""
        now, usage = self._clock(), self._usage() or {}
        then, last = self._last
        capacity = max(now - then, 1e-6) * (os.cpu_count() or 1)
        metrics: dict[str, float] = {}
        for node, u in usage.items():
            first, before = self._first.get(node), last.get(node)
            prefix = f"system/{node}/"
            # A node that runs nothing (the job not yet started, or ended) has no CPU or memory
            # figure, rather than a zero; a process that ended took its CPU seconds with it.
            if before is not None and u.processes:
                metrics[prefix + "cpu_utilization_percentage"] = round(
                    100 * max(0.0, u.cpu_s - before.cpu_s) / capacity, 2)
            if u.processes:
                metrics[prefix + "memory_rss_megabytes"] = round(u.rss_bytes / MB, 3)
            if first is not None:
                metrics[prefix + "network_transmit_megabytes"] = round((u.sent_bytes - first.sent_bytes) / MB, 3)
                metrics[prefix + "network_receive_megabytes"] = round((u.received_bytes - first.received_bytes) / MB, 3)
        self._last = (now, usage)
        if metrics:
            with suppress(Exception):  # samples are a nicety; never fail a run on them
                self._log(metrics, self.steps)
            self.steps += 1
        return metrics
