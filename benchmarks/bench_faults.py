"""Time to notice each injected fault (issue 7), run by hand:
`python -m benchmarks.bench_faults`. Prints, per fault, what ddlbench did and
how long after the injection the job had ended (the README's fault table).
"""

from __future__ import annotations

import signal
import tempfile
import time
from pathlib import Path

from infra.local import LocalProvider
from pipelines.launch import JobFailed, launch, prepare
from tests.test_faults_training import inject

BASE = {"dataset": "synthetic", "workers": 2, "batch_size": 16, "steps": 100_000}


def _fault(out: Path, options: dict, rank: int, sig: int) -> tuple[str, float]:
    cfg = prepare(BASE | options, "bench")
    at: list[float] = []
    inject(out, rank, sig, 3, at)
    try:
        launch(cfg, out, LocalProvider(), timeout_s=600, echo=False)
        return "completed (unexpected)", float("nan")
    except JobFailed as err:
        return str(err).split(" (log:")[0][:110], time.monotonic() - at[0]


def main() -> None:
    cases = [
        ("SIGKILL worker 1 (ssgd allreduce)", {"model": "lenet5"}, 1, signal.SIGKILL),
        ("SIGKILL PS shard (odsgd)", {"model": "lenet5", "algorithm": "odsgd", "servers": 1}, 2, signal.SIGKILL),
        ("SIGSTOP worker 1, default timeout_s (ssgd ps)",
         {"model": "lenet5", "algorithm": "ssgd", "comm": "ps", "servers": 1}, 1, signal.SIGSTOP),
        ("SIGSTOP worker 1, default timeout_s (asgd)", {"model": "mlp", "algorithm": "asgd", "servers": 1}, 1,
         signal.SIGSTOP),
    ]
    with tempfile.TemporaryDirectory() as d:
        for i, (name, opts, rank, sig) in enumerate(cases):
            what, seconds = _fault(Path(d) / str(i), opts, rank, sig)
            print(f"{name:45s} noticed and torn down in {seconds:5.1f} s: {what}")


if __name__ == "__main__":
    main()
