"""The per-iteration timeline: one record per rank and iteration.

Record format (one JSON object per line of `timeline.jsonl`), seconds since a
common epoch taken right after a barrier of all ranks:

    {"rank": 0, "role": "worker", "step": 3, "start": 1.20, "end": 1.31,
     "phases": {"data": [1.20, 1.21], "forward": [...], "backward": [...],
                "comm_exposed": [...], "update": [...]}}

Worker phases are `WORKER_PHASES`; server shards record `SERVER_PHASES`. The
predicted timelines of `modelling/` use the same format, so a measured and a
predicted trace open side by side in chrome://tracing or Perfetto.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WORKER_PHASES = ("data", "forward", "backward", "comm_exposed", "update")
SERVER_PHASES = ("comm_exposed", "update", "send")


class Timeline:
    """Records phases of each iteration with the monotonic clock."""

    def __init__(self, rank: int, role: str, epoch: float) -> None:
        self.rank, self.role, self.epoch = rank, role, epoch
        self.records: list[dict[str, Any]] = []
        self._current: dict[str, Any] | None = None
        self.current = "start-up"  # what the rank is doing, for failure messages
        self.paused = False  # in a pause of training (an evaluation): see `pause`
        self.on_begin: Callable[[int], None] | None = None  # the rank's heartbeat (training/heartbeat.py)
        # Work added at the end of a phase, inside it: a slowdown injected to test the regression
        # alarm (training/inject.py).
        self.slowdowns: dict[str, Callable[[], None]] = {}
        # Phases whose CPU seconds of the calling thread a record also carries (`cpu_s`): set where
        # that thread does all of the phase's work (training/measure/layer_timing.py says when).
        self.cpu_phases: tuple[str, ...] = ()

    @property
    def step(self) -> int | None:
        """The step in progress, else the last one finished (None before the first)."""
        current, records = self._current, self.records  # read from a heartbeat thread: one look each
        if current is not None:
            return current["step"]
        return records[-1]["step"] if records else None

    def now(self) -> float:
        return time.monotonic() - self.epoch

    def begin(self, step: int) -> None:
        self._current = {"rank": self.rank, "role": self.role, "step": step, "start": self.now(), "phases": {}}
        self.current = f"step {step}"
        if self.on_begin is not None:
            self.on_begin(step)

    def mark(self, phase: str, start: float, end: float) -> None:
        assert self._current is not None, "mark() outside an iteration"
        self._current["phases"][phase] = [start, end]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.current = f"{name} of step {self._current['step'] if self._current else '?'}"
        start = self.now()
        cpu = time.thread_time() if name in self.cpu_phases else None
        yield
        if (slowdown := self.slowdowns.get(name)) is not None:
            slowdown()
        if cpu is not None and self._current is not None:
            self._current.setdefault("cpu_s", {})[name] = time.thread_time() - cpu
        self.mark(name, start, self.now())

    @contextmanager
    def pause(self, what: str) -> Iterator[None]:
        """Time out of training between steps (an evaluation): the heartbeat says so as it
        begins, so that a launcher does not take a rank whose beats it holds up for stopped."""
        self.current, self.paused = what, True
        if self.on_begin is not None:
            self.on_begin(self.step)
        try:
            yield
        finally:
            self.paused = False

    def end(self) -> dict[str, Any]:
        assert self._current is not None, "end() outside an iteration"
        rec, self._current = self._current, None
        rec["end"] = self.now()
        self.records.append(rec)
        return rec


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{n}: not a JSON line ({err.msg})") from None
    return rows


def to_chrome_trace(records: Iterable[dict[str, Any]], label: str = "measured") -> dict[str, Any]:
    """Chrome-trace JSON: a process per rank, a complete event per phase."""
    events: list[dict[str, Any]] = []
    seen: set[int] = set()
    for rec in records:
        rank = rec["rank"]
        if rank not in seen:
            seen.add(rank)
            name = f"{rec.get('role', 'rank')} {rank}"
            events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": name}})
        for phase, (start, end) in rec["phases"].items():
            events.append({
                "ph": "X", "name": phase, "cat": rec.get("role", "worker"), "pid": rank,
                "tid": 0, "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6,
                "args": {"step": rec["step"]},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"source": label}}
