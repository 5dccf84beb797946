"""Per-rank heartbeats, so that a stopped rank ends its job, and the job's error names it.

Every rank keeps `OUT/heartbeat/rankR.json` up to date: its role, the step it is in and
what it is doing (the timeline's `current`), with the wall-clock time. The file is a
memory map of a fixed size, so a beat costs a few microseconds and no system call: the
rank beats at the start of every step (the step named is exact) and a daemon thread beats
every `INTERVAL_S` (and flushes the map, for a launcher on another host). A rank that waits
on a peer keeps beating (gloo waits release the GIL); a rank that is stopped (SIGSTOP, a
hung host, a frozen VM) or spins holding the GIL does not.

While a job runs, the launcher watches the beats (`Watch`): a rank whose beat stops
changing while another's goes on ends the job, whether or not a peer waits for it (under
ASGD none does). When a job fails, the launcher compares the last beats: a rank whose beat
ended long before the others' had stopped, and the ranks that raised were waiting for it.
Both compare when the launcher saw each beat change, by its own clock, so the hosts'
clocks need not agree.

Only the standard library here: the launcher reads beats without importing torch.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

INTERVAL_S = 0.5
DIR = "heartbeat"
SIZE = 512  # bytes of a beat: JSON padded with spaces
# A beat this many intervals older than the newest is a stop, whatever the timeout: a
# thread that sleeps for INTERVAL_S is not held back that long by a busy host.
MIN_GAP_INTERVALS = 8
POLL_S = 1.0  # how often a launcher reads a running job's beats


def path(out: Path, rank: int) -> Path:
    return out / DIR / f"rank{rank}.json"


class Heartbeat:
    """Beats between `start()` and `stop()` (or inside a `with` block); the timeline calls
    `beat` at the start of every step and of every pause (its `on_begin`)."""

    def __init__(self, out: Path, rank: int, role: str, timeline: Any, interval_s: float = INTERVAL_S) -> None:
        self.file = path(out, rank)
        self.rank, self.role, self.tl, self.interval_s = rank, role, timeline, interval_s
        self.host, self.pid = socket.gethostname(), os.getpid()
        # torchrun's restart of the job this rank belongs to: beats of earlier ones are stale
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()  # one beat at a time: a late thread beat never hides a step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank{rank}", daemon=True)

    def beat(self, *_: object, ended: bool = False) -> None:
        if self._map is None:
            return
        tl = self.tl
        with self._lock:
            state = {"rank": self.rank, "role": self.role, "pid": self.pid, "host": self.host, "time": time.time(),
                     "step": tl.step, "doing": str(tl.current)[:200], "ended": ended, "paused": tl.paused,
                     "attempt": self.attempt}
            self._map[:] = json.dumps(state).encode().ljust(SIZE)[:SIZE]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()
            self._map.flush()

    def start(self) -> Heartbeat:
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                # Blocks allocated now: a write to a map of a file the disk cannot hold is SIGBUS.
                try:
                    os.posix_fallocate(fd, 0, SIZE)
                except OSError as err:
                    if err.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    os.write(fd, b" " * SIZE)  # a filesystem without fallocate (NFS): written out
                self._map = mmap.mmap(fd, SIZE)
            finally:
                os.close(fd)
        except OSError:  # a full disk: the job's own writes report it; without beats, no rank is named
            return self
        self.tl.on_begin = self.beat
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """The last beat says the rank left on its own (returned or raised): not a stop."""
        if self._map is None:
            return
        self._stop.set()
        self._thread.join()
        self.tl.on_begin = None
        self.beat(ended=True)
        self._map.close()
        self._map = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Beat:
    rank: int
    role: str
    time: float
    step: int | None
    doing: str
    ended: bool = False
    paused: bool = False  # in a pause of training its trainer marked (an evaluation)
    attempt: int = 0  # torchrun's restart of the job


def read(out: Path) -> dict[int, Beat]:
    """The last beat of every rank that beat at all."""
    beats = {}
    for f in (out / DIR).glob("rank*.json"):
        try:
            d = json.loads(f.read_text())
            beats[int(d["rank"])] = Beat(int(d["rank"]), str(d["role"]), float(d["time"]), d.get("step"),
                                         str(d.get("doing", "")), bool(d.get("ended")), bool(d.get("paused")),
                                         int(d.get("attempt", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a rank stopped mid-beat, or one that never beat: no evidence either way
    return beats


def clear(out: Path) -> None:
    for f in (out / DIR).glob("rank*"):
        f.unlink(missing_ok=True)


def stalled(beats: dict[int, Beat], timeout_s: float, interval_s: float = INTERVAL_S,
            running: bool = False) -> list[Beat]:
    """The ranks whose beats ended well before the newest: ranks that stopped while the rest
    went on. A beat's `time` may be by any one clock: the ranks' own, or when a launcher saw
    it change (`Watch`).

    After a job failed: a peer waits `timeout_s` for a stopped rank before it raises, so the
    stopped rank's last beat is about that much older than the rest; half of it (and at least
    MIN_GAP_INTERVALS beats) separates a stop from a slow beat. While the job runs
    (`running`): the timeout and MIN_GAP_INTERVALS beats more, so that a peer that waits for
    the rank times out first and says so; a rank in a pause its trainer marked (an
    evaluation) is not listed then, whatever holds its beat up.

    Never listed: a rank that left on its own (returned, raised: its last beat says so), a
    rank that never beat (start-up, bounded by the ranks' start-up timeout), and a rank of an
    earlier torchrun attempt (its new beat is yet to come; between attempts every rank is
    silent, none behind a newer beat). A rank killed outright ends the job within a beat or
    two, so it is not behind either."""
    latest = max((b.attempt for b in beats.values()), default=0)
    current = [b for b in beats.values() if b.attempt == latest]
    if len(current) < 2:
        return []
    newest = max(b.time for b in current)
    floor = MIN_GAP_INTERVALS * interval_s
    gap = timeout_s + floor if running else max(0.5 * timeout_s, floor)
    return sorted((b for b in current if not b.ended and not (running and b.paused) and newest - b.time > gap),
                  key=lambda b: b.rank)


class Watch:
    """A launcher's watch over a running job's beats, inside a `with` block: a daemon thread
    reads them every `poll_s` and notes when, by the launcher's monotonic clock, each rank's
    beat last changed. Once `stalled` (running) names ranks, they are kept in `stopped` and
    `on_stall` is called (it ends the job); the watch then ends."""

    def __init__(self, out: Path, timeout_s: float, on_stall: Callable[[], None], poll_s: float = POLL_S) -> None:
        self.out, self.timeout_s, self.on_stall, self.poll_s = out, timeout_s, on_stall, poll_s
        self.stopped: list[Beat] = []
        self._seen: dict[int, tuple[Beat, float]] = {}  # rank: its last beat, when it was first seen
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat-watch", daemon=True)

    def see(self, beats: dict[int, Beat], now: float) -> None:
        """Note the beats read at `now` (the launcher's monotonic clock)."""
        for rank, beat in beats.items():
            if rank not in self._seen or self._seen[rank][0] != beat:
                self._seen[rank] = (beat, now)

    def beats(self) -> dict[int, Beat]:
        """Every rank's last beat, its `time` when the launcher saw it change."""
        return {rank: replace(beat, time=seen) for rank, (beat, seen) in self._seen.items()}

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            self.see(read(self.out), time.monotonic())
            if stopped := stalled(self.beats(), self.timeout_s, running=True):
                self.stopped = stopped
                self.on_stall()
                return

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.see(read(self.out), time.monotonic())  # the last beats: which ranks said they ended


def describe_stall(stopped: list[Beat], raised: dict[int, str]) -> str:
    """'rank 2 (server) stopped answering at step 167; rank 0 timed out waiting for it':
    `raised` is what each rank that raised said (its failure-rankR.txt). A rank that raised
    on something else (a connection a timed-out peer closed) 'failed in turn'."""
    said = "; ".join(f"rank {b.rank} ({b.role}) stopped answering "
                     + (f"at step {b.step}" if b.step is not None else f"during {b.doing}") for b in stopped)
    quiet = {b.rank for b in stopped}
    parts = [said]
    for what, timed_out in ((f"timed out waiting for {'it' if len(stopped) == 1 else 'them'}", True),
                            ("failed in turn", False)):
        ranks = sorted(r for r, cause in raised.items() if r not in quiet and _timed_out(cause) == timed_out)
        if ranks:
            parts.append(("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) + " " + what)
    return "; ".join(parts)


def _timed_out(cause: str) -> bool:
    return "timed out" in cause.lower() or "timeout" in cause.lower()
