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

A full disk: `<run_dir>/journal.reserve` holds `RESERVE_BYTES` set aside when the run starts.
The first journal write that finds no space frees it and is retried, so that entry, and the
ends of the runs that the failing pipeline records next, are kept for `ddlbench sync`; the
write still raises `DiskFull`, so the run stops.
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

from pipelines.disk import DiskFull, is_full

JOURNAL = "journal.jsonl"
STATE = "journal.state.json"
RESERVE = "journal.reserve"
RESERVE_BYTES = 256 << 10  # the ends of a run's MLflow runs and the upload state, many times over
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
        line = (json.dumps(entry, default=str) + "\n").encode()
        with self.locked():
            if not self.path.exists():  # a new run: set its reserve aside first
                self.reserve()
            self._full_retried(self.path, len(line), lambda: self._append(line))

    def _append(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size  # the lock keeps other writers out
            try:
                view = memoryview(line)
                while view:  # a full disk may take part of a write before it refuses the rest
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                os.ftruncate(fd, size)  # no torn line for the next entry to be glued to
                raise
        finally:
            os.close(fd)

    def _full_retried(self, path: Path, needed: int, write: Any) -> None:
        """`write()`; on a full disk, free the reserve and retry once, then raise DiskFull."""
        try:
            write()
            return
        except OSError as err:
            if not is_full(err):
                raise
        full = DiskFull(path, needed)
        if self.release_reserve():
            write()  # kept; a second full disk raises the OSError itself
        raise full

    def reserve(self) -> None:
        """Set RESERVE_BYTES aside for recording how the run ends on a full disk (none if full already)."""
        path = self.run_dir / RESERVE
        if path.exists():
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def release_reserve(self) -> bool:
        """Free the reserve; whether there was one."""
        path = self.run_dir / RESERVE
        if not path.exists():
            return False
        path.unlink(missing_ok=True)
        return True

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
        text = json.dumps(state, indent=1)
        tmp = self.state_path.with_suffix(".tmp")

        def write() -> None:
            try:
                tmp.write_text(text)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise
            tmp.replace(self.state_path)

        self._full_retried(self.state_path, len(text), write)

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
