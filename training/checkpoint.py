"""Atomic, per-rank checkpoints of a training job.

Layout: `OUT/checkpoints/step-<done>/rank<r>.pt` (one file per rank, workers and
parameter-server shards alike) and `step-<done>/COMPLETE`, written by rank 0
once every rank has written its file. Only complete checkpoints are resumed
from. Files are written to a temporary name and renamed, so a crash mid-write
never leaves a half-written checkpoint under the final name, and they are read
with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from training.config import TrainConfig

_STEP_DIR = re.compile(r"^step-(\d+)$")
# Options that may change between a run and its resumption without changing its maths.
_RESUMABLE = {"steps", "epochs", "timeout_s", "eval_every", "target_accuracy", "checkpoint_every",
              "keep_checkpoints", "max_restarts", "save_params", "link_bandwidth", "measure_warmup"}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupted or belongs to another job."""


def fingerprint(cfg: TrainConfig) -> str:
    """A hash of every option that changes a job's trajectory."""
    data = cfg.model_dump(mode="json", exclude=_RESUMABLE)
    return hashlib.sha256(repr(sorted(data.items())).encode()).hexdigest()[:16]


class CheckpointStore:
    def __init__(self, out: Path, cfg: TrainConfig) -> None:
        self.root = out / "checkpoints"
        self.cfg = cfg
        self.fingerprint = fingerprint(cfg)

    def _dir(self, done: int) -> Path:
        return self.root / f"step-{done}"

    def latest(self) -> int:
        """Steps done at the newest complete checkpoint (0: none)."""
        if not self.root.is_dir():
            return 0
        steps = [int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name))
                 and (p / "COMPLETE").exists()]
        return max(steps, default=0)

    def save(self, done: int, rank: int, state: dict[str, Any]) -> None:
        d = self._dir(done)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".rank{rank}.pt.tmp"
        torch.save({"fingerprint": self.fingerprint, "done": done, "rank": rank, "state": state}, tmp)
        os.replace(tmp, d / f"rank{rank}.pt")

    def mark_complete(self, done: int, keep: int) -> None:
        (self._dir(done) / "COMPLETE").write_text(str(done))
        complete = sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_DIR.match(p.name))
                          and (p / "COMPLETE").exists())
        for old in complete[:-keep]:
            shutil.rmtree(self._dir(old), ignore_errors=True)

    def load(self, done: int, rank: int) -> dict[str, Any]:
        path = self._dir(done) / f"rank{rank}.pt"
        try:
            blob = torch.load(path, weights_only=True)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: missing (the checkpoint of step {done} is incomplete)") from None
        except Exception as err:  # unpickling errors have many types
            raise CheckpointError(f"{path}: not a readable ddlbench checkpoint ({type(err).__name__}: {err})") from None
        if not isinstance(blob, dict) or {"fingerprint", "done", "rank", "state"} - blob.keys():
            raise CheckpointError(f"{path}: not a ddlbench checkpoint (unexpected contents)")
        if blob["fingerprint"] != self.fingerprint:
            raise CheckpointError(
                f"{path}: written by a job with other options (fingerprint {blob['fingerprint']}, "
                f"this job {self.fingerprint}); use a fresh --out or delete {self.root}"
            )
        if blob["done"] != done or blob["rank"] != rank:
            raise CheckpointError(f"{path}: holds step {blob['done']} of rank {blob['rank']}, expected {done}/{rank}")
        return blob["state"]
