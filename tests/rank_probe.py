"""A torchrun job for placement tests: each rank writes where it ran (`python -m tests.rank_probe DIR`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "DDLBENCH_POD")
    (out / f"rank{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
