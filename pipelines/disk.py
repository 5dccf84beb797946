"""A full disk, named: which path could not be written, and how much space was needed or left.

Every place the pipeline writes (the run directory, its journal, a job's outputs, the MLflow
store's directory) turns ENOSPC/EDQUOT into `DiskFull`, whose message is one line. The journal
keeps a small reserve file so that a run that fills its disk can still record how it ended
(pipelines/tracking/journal.py); `ddlbench sync` uploads the rest once space returns.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """No space left where the pipeline writes; the message names the path and the space."""

    def __init__(self, path: Path | str, needed: int | None = None, left: int | None = None) -> None:
        self.path = Path(path)
        self.needed = needed
        self.left = free_bytes(self.path) if left is None else left
        need = f"{_size(needed)} needed, " if needed else ""
        super().__init__(f"no space left on device: {self.path} ({need}{_size(self.left)} left on its filesystem)")


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the filesystem of `path` (or of its nearest existing parent)."""
    for p in (path, *path.parents):
        try:
            return shutil.disk_usage(p).free
        except OSError:
            continue
    return 0


def is_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in FULL


def disk_full(err: BaseException, path: Path | str | None = None, needed: int | None = None) -> DiskFull | None:
    """`err` (or what it was raised from) as a DiskFull naming the file it failed on; None when
    it is not a full disk."""
    seen = err
    while seen is not None:
        if isinstance(seen, DiskFull):
            return seen
        if is_full(seen):
            return DiskFull(seen.filename or path or "?", needed)
        seen = seen.__cause__ or seen.__context__
    return None


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
