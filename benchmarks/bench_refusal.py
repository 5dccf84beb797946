"""How long a spec that cannot run takes to be refused (issue 50: under 2 s): `ddlbench run`
from the command to its one-line refusal, for a configuration past its stated memory (lenet5,
the smoke spec; a small GPT of the demo's shape) and for one past its timeout, against the
anchor of a bare `python -c "import torch"` in the same session (what any check that sizes a
model must pay first). Prints each case's median [min-max] over the repeats, and its ratio to
the anchor's median.

    python benchmarks/bench_refusal.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pipelines.cli", "run"]
SMOKE = str(REPO / "specs" / "smoke.yaml")
GPT = ['workloads=[{"model": "gpt-mini", "dataset": "markov"}]', "batch_sizes=[8]"]
CASES = {
    "anchor: import torch": [sys.executable, "-c", "import torch"],
    "lenet5 past memory.device": [*CLI, SMOKE, "--set", 'memory={"device": "1mb"}'],
    "gpt-mini past memory.device": [*CLI, SMOKE, "--set", 'memory={"device": "1mb"}', "--set", GPT[0], "--set", GPT[1]],
    "lenet5 past train_timeout_s": [*CLI, SMOKE, "--set", "steps=100000000"],
}


def timed(cmd: list[str], home: Path) -> float:
    start = time.perf_counter()
    out = subprocess.run([*cmd, *(["--home", str(home)] if cmd[:len(CLI)] == CLI else [])], cwd=REPO,
                         capture_output=True, text=True, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    took = time.perf_counter() - start
    if cmd[:len(CLI)] == CLI and (out.returncode != 2 or "Traceback" in out.stderr + out.stdout):
        raise SystemExit(f"not a one-line refusal ({out.returncode}): {out.stdout}{out.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "bench_refusal_home"
    home.mkdir(exist_ok=True)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved: a slow spell of the host touches every case alike
        for name, cmd in CASES.items():
            times[name].append(timed(cmd, home))
    anchor = statistics.median(times["anchor: import torch"])
    print(f"load average {os.getloadavg()[0]:.2f} over 1 min at the end (2 cores: above 1 is a loaded host)")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:>30}: {med:.2f} s [{min(ts):.2f}-{max(ts):.2f}], {med / anchor:.2f}x the anchor")


if __name__ == "__main__":
    main()
