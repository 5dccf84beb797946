"""A job for the launcher's tests (`python -m tests.zygote_probe DIR ACTION...`): rank r does
ACTION r (`ok`, `exit:N`, `raise`, `sleep`, `stop`, `ignore-term`, `burn`: 0.5 s of CPU), after
writing what it saw."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    out, actions = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT", "DDLBENCH_LAUNCHER")
    seen = {k: os.environ.get(k) for k in keys} | {"warm": "torch._dynamo" in sys.modules, "pid": os.getpid(),
                                                    "agent": os.getppid(), "argv": sys.argv[1:]}
    action = actions[rank]
    if action == "burn":
        while time.process_time() < 0.5:
            pass
        seen["cpu_s"] = time.process_time()
    # Written aside and renamed (the tests wait for the file to exist, then read it); by hand, not
    # pipelines' write_json: the probe imports nothing of the project, as `warm` reports what is loaded.
    part = out / f".rank{rank}.json.part"
    part.write_text(json.dumps(seen))
    part.replace(out / f"rank{rank}.json")
    if action.startswith("exit:"):
        time.sleep(0.3)  # the others are running when this one fails
        sys.exit(int(action[5:]))
    if action == "raise":
        raise RuntimeError(f"rank {rank} raised")
    if action == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if action not in ("ok", "burn"):
        time.sleep(600)
