"""How much of this host's CPU other work used while a job ran (DESIGN §4: a figure from a
loaded machine says so).

All busy CPU time of the host (/proc/stat) less the CPU time of this process and of the
descendants that did its jobs, over the host's capacity (cores x wall time). A descendant's time
is in this process's getrusage once waited for (a job's launcher and, through it, its ranks); a
warm server (infra/warm.py) lives on and reaps the agents it forked, so its own and its reaped
children's time come from /proc. Other live descendants are other work (a test's CPU burners).
Meaningful where a job's processes are this process's descendants (the local and netns
providers); a SLURM or Kubernetes job's ranks are another daemon's children, so those providers
record nothing.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from infra.warm import server_pids

QUIET = 0.10  # other work under 10% of the host's CPU: a quiet measurement


def _busy_s() -> float | None:
    """The host's busy CPU seconds since boot: every /proc/stat time but idle and iowait (guest
    time is counted inside user); None where there is no /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _own_s() -> float:
    reaped = sum(
        getattr(resource.getrusage(who), part)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for part in ("ru_utime", "ru_stime")
    )
    serving = 0.0
    for pid in server_pids():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue  # gone since: reaped by this process, its time is in getrusage's
        serving += t.user + t.system + t.children_user + t.children_system
    return reaped + serving


@dataclass
class CpuProbe:
    """Started before the work; `other_share()` after it (0..1, None without /proc/stat)."""

    wall: float = field(default_factory=time.monotonic)
    busy: float | None = field(default_factory=_busy_s)
    own: float = field(default_factory=_own_s)

    def seconds(self) -> tuple[float, float | None, float]:
        """(wall seconds, CPU seconds of other work or None, CPU seconds of this process and its
        reaped descendants) since the probe started."""
        busy, own, wall = _busy_s(), _own_s() - self.own, time.monotonic() - self.wall
        other = None if busy is None or self.busy is None else max((busy - self.busy) - own, 0.0)
        return wall, other, own

    def other_share(self) -> float | None:
        wall, other, _ = self.seconds()
        if other is None or wall <= 0:
            return None
        return min(other / (wall * (os.cpu_count() or 1)), 1.0)
