"""Each node's own use of the host, for the per-node system metrics of a run on an emulated
cluster (pipelines/tracking/node_metrics.py): the CPU seconds and resident memory of the
processes in the node's network namespace, and the bytes through its link.

A host's own metrics (MLflow's system metrics monitor) are the whole host's; on an emulated
cluster every node is this host, so a node's figures are those of what runs in its namespace.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class NodeUsage:
    """One reading of a node: cumulative CPU seconds of its live processes, their resident
    memory, the bytes its link sent and received since it was made, and how many processes
    it runs."""

    cpu_s: float
    rss_bytes: int
    sent_bytes: int
    received_bytes: int
    processes: int = 1


def namespace_pids(ns: str) -> list[int]:
    """The processes in a network namespace (`ip netns pids`); none where it is gone."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split() if p.isdigit()]


def processes(pids: list[int]) -> tuple[float, int, int]:
    """CPU seconds (user and system), resident bytes and number of the live processes among `pids`."""
    cpu, rss, alive = 0.0, 0, 0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                cpu += t.user + t.system
                rss += p.memory_info().rss
            alive += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # it ended between the listing and the reading
    return cpu, rss, alive


def link_bytes(ifname: str) -> tuple[int, int]:
    """(transmitted, received) bytes of an interface of this namespace; zeros where it is gone."""
    stats = Path("/sys/class/net") / ifname / "statistics"
    try:
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())
    except (OSError, ValueError):
        return 0, 0
