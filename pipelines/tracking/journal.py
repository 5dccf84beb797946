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

A run directory removed mid-run: a journal writes only into the directory it first saw (made
by `start`, or by its own first write), so one removed (or made again by a later write: another
inode, or no journal file where there was one) raises `RunDirGone` instead of starting an empty
journal, whose entries name runs its upload state has lost. The tracker then ends its runs in
MLflow directly.
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

import psutil

from pipelines.disk import DiskFull, is_full

JOURNAL = "journal.jsonl"
STATE = "journal.state.json"
RESERVE = "journal.reserve"
RESERVE_BYTES = 256 << 10  # the ends of a run's MLflow runs and the upload state, many times over
_LOCK = "journal.lock"


def now_ms() -> int:
    return int(time.time() * 1000)


def owner() -> dict[str, Any]:
    """This process: host, pid and start time (a pid reused by a later process is not this one)."""
    return {"host": platform.node(), "pid": os.getpid(), "started": _started(os.getpid())}


def _started(pid: int) -> float:
    return round(psutil.Process(pid).create_time(), 2)


class RunDirGone(RuntimeError):
    """The run directory, and the journal in it, was removed while the run went on."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.ended: list[str] | None = None  # the MLflow runs the tracker ended for it; None: it could not
        super().__init__(f"run directory {run_dir} vanished mid-run")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Journal:
    def __init__(self, run_dir: Path, *, made: bool = False) -> None:
        """`made`: the run directory was made before (by `start`), so missing it means it vanished."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / JOURNAL
        self.state_path = self.run_dir / STATE
        self._identity = _identity(self.run_dir)
        self._made = made or self._identity is not None
        # Once seen, the journal file must stay: a directory made again may reuse the inode number.
        self._written = self.path.exists()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes: one writer or uploader at a time; RunDirGone once the run
        directory this journal saw is gone."""
        if not self._made:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._identity, self._made = _identity(self.run_dir), True
        self.check()
        try:
            with open(self.run_dir / _LOCK, "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
        except FileNotFoundError:  # removed while held
            self.check()
            raise

    def check(self) -> None:
        """RunDirGone when the run directory this journal saw is gone, or another is in its place."""
        if not self._made:
            return
        if self._identity is None or _identity(self.run_dir) != self._identity or (
            self._written and not self.path.exists()
        ):
            raise RunDirGone(self.run_dir)

    def append(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, default=str) + "\n").encode()
        with self.locked():
            if not self.path.exists():  # a new run: set its reserve aside first
                self.reserve()
            self._full_retried(self.path, len(line), lambda: self._append(line))
            self._written = True

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
    """Whether the process that opened a run still lives (only knowable on its own host): its pid
    runs, and, where its start time is recorded, is the same process."""
    if own.get("host") != platform.node():
        return True
    try:
        os.kill(int(own["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if own.get("started") is None:
        return True
    try:
        return _started(int(own["pid"])) == float(own["started"])
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
