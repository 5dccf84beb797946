"""Per-rank heartbeats, so that a failed job names the rank that stopped making progress.

Every rank keeps `OUT/heartbeat/rankR.json` up to date: its role, the step it is in and
what it is doing (the timeline's `current`), with the wall-clock time. The file is a
memory map of a fixed size, so a beat costs a few microseconds and no system call: the
rank beats at the start of every step (the step named is exact) and a daemon thread beats
every `INTERVAL_S` (and flushes the map, for a launcher on another host). A rank that waits
on a peer keeps beating (gloo waits release the GIL); a rank that is stopped (SIGSTOP, a
hung host, a frozen VM) or spins holding the GIL does not. When a job fails, the launcher
compares the last beats: a rank whose beat ended long before the others' had stopped, and
the ranks that raised were waiting for it. The comparison is between ranks, so it needs no
clock of the launcher's, only hosts whose clocks agree to well under the job's timeout.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INTERVAL_S = 0.5
DIR = "heartbeat"
SIZE = 512  # bytes of a beat: JSON padded with spaces
# A beat this many intervals older than the newest is a stop, whatever the timeout: a
# thread that sleeps for INTERVAL_S is not held back that long by a busy host.
MIN_GAP_INTERVALS = 8


def path(out: Path, rank: int) -> Path:
    return out / DIR / f"rank{rank}.json"


class Heartbeat:
    """Beats between `start()` and `stop()` (or inside a `with` block); the timeline calls
    `beat` at the start of every step (its `on_begin`)."""

    def __init__(self, out: Path, rank: int, role: str, timeline: Any, interval_s: float = INTERVAL_S) -> None:
        self.file = path(out, rank)
        self.rank, self.role, self.tl, self.interval_s = rank, role, timeline, interval_s
        self.host, self.pid = socket.gethostname(), os.getpid()
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
                     "step": tl.step, "doing": str(tl.current)[:200], "ended": ended}
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


def read(out: Path) -> dict[int, Beat]:
    """The last beat of every rank that beat at all."""
    beats = {}
    for f in (out / DIR).glob("rank*.json"):
        try:
            d = json.loads(f.read_text())
            beats[int(d["rank"])] = Beat(int(d["rank"]), str(d["role"]), float(d["time"]), d.get("step"),
                                         str(d.get("doing", "")), bool(d.get("ended")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a rank stopped mid-beat, or one that never beat: no evidence either way
    return beats


def clear(out: Path) -> None:
    for f in (out / DIR).glob("rank*"):
        f.unlink(missing_ok=True)


def stalled(beats: dict[int, Beat], timeout_s: float, interval_s: float = INTERVAL_S) -> list[Beat]:
    """The ranks whose beats ended well before the others': ranks that stopped while the
    rest went on until the job failed. A peer waits `timeout_s` for a stopped rank before
    it raises, so the stopped rank's last beat is about that much older than the rest;
    half of it (and at least MIN_GAP_INTERVALS beats) separates a stop from a slow beat.
    A rank killed outright ends the job within a beat or two, and a rank that left on its
    own (returned, raised) said so in its last beat: neither is listed."""
    if len(beats) < 2:
        return []
    newest = max(b.time for b in beats.values())
    gap = max(0.5 * timeout_s, MIN_GAP_INTERVALS * interval_s)
    return sorted((b for b in beats.values() if not b.ended and newest - b.time > gap), key=lambda b: b.rank)


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
