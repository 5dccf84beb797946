"""The tracking journal: everything destined to MLflow, appended first to the run dir.

`<run_dir>/journal.jsonl` holds one operation per line, in order:

    {"op": "start_run", "node": "train/lenet5-ssgd-allreduce-w2-b32-r0", "parent": "pipeline",
     "name": ..., "tags": {...}, "ts": 1764430000000, "owner": {"host": ..., "pid": ...}}
    {"op": "params",  "node": ..., "params": {"lr": "0.05", ...}}
    {"op": "metrics", "node": ..., "metrics": [{"key", "value", "step", "ts"}, ...]}
    {"op": "tags",    "node": ..., "tags": {...}}
    {"op": "artifact", "node": ..., "path": "relative/to/run_dir", "artifact_path": "dir" | null}
    {"op": "table",   "node": ..., "data": {"column": [...]}, "artifact_file": "x.json"}
    {"op": "figure",  "node": ..., "path": "relative/to/run_dir.png", "artifact_file": "x.png"}
    {"op": "input",   "node": ..., "dataset": {"name", "digest", "source_type", "source", ...}, "context": "training"}
    {"op": "end_run", "node": ..., "status": "FINISHED" | "FAILED", "ts": ...}

`<run_dir>/journal.state.json` records how far the journal reached MLflow (a
byte offset) and the MLflow run id of each node. Several processes (Airflow
tasks mapped over the grid) share one journal, so appends and uploads hold an
exclusive file lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

JOURNAL = "journal.jsonl"
STATE = "journal.state.json"
_LOCK = "journal.lock"


def now_ms() -> int:
    return int(time.time() * 1000)


def owner() -> dict[str, Any]:
    return {"host": platform.node(), "pid": os.getpid()}


class Journal:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JOURNAL
        self.state_path = self.run_dir / STATE

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes: one writer or uploader at a time."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / _LOCK, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, default=str) + "\n"
        with self.locked(), open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def entries(self, offset: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
        """(offset after the entry, entry) from `offset`; a torn last line (killed writer) is skipped."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(offset)
            for raw in f:
                offset += len(raw)
                if not raw.endswith(b"\n"):
                    return
                try:
                    yield offset, json.loads(raw)
                except json.JSONDecodeError:
                    continue

    def read_state(self) -> dict[str, Any]:
        if self.state_path.exists():
            return json.loads(self.state_path.read_text())
        return {"offset": 0, "runs": {}}

    def write_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_path)

    def pending(self) -> int:
        """Entries not yet in MLflow."""
        return sum(1 for _ in self.entries(self.read_state()["offset"]))

    def open_nodes(self) -> dict[str, dict[str, Any]]:
        """Nodes whose last start has no end yet: node -> its start_run entry."""
        open_: dict[str, dict[str, Any]] = {}
        for _, e in self.entries():
            if e["op"] == "start_run":
                open_[e["node"]] = e
            elif e["op"] == "end_run":
                open_.pop(e["node"], None)
        return open_


def owner_alive(own: dict[str, Any]) -> bool:
    """Whether the process that opened a run still lives (only knowable on its own host)."""
    if own.get("host") != platform.node():
        return True
    try:
        os.kill(int(own["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
