"""Communication microbenchmarks, launched exactly as training is (DESIGN §3).

The ranks (modelling/microbench_rank.py) run through an infra provider's
`run(Job(...))`, so they cross the same network training crosses: allreduce
over the N workers, point-to-point between ranks 0 and 1, and parameter-server
push/pull rounds of N workers to S shards at once, over log-spaced sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelling.fit import load_comm

# 4 KiB .. 16 MiB, every factor of 4: a few seconds on a laptop.
DEFAULT_SIZES = [4096 * 4**i for i in range(7)]


class MicrobenchFailed(RuntimeError):
    """The microbenchmark job failed; the message says which ranks and where the log is."""


def run_microbench(
    workers: int,
    servers: int,
    out_dir: Path,
    *,
    provider=None,
    sizes: list[int] | None = None,
    repeats: int = 5,
    timeout_s: float = 600,
    link_bytes_per_s: float | None = None,
    gap_s: float = 0.002,
    echo: bool = False,
) -> dict[str, Any]:
    """Measure, write out_dir/comm.json and return its content. Every timed operation
    follows `gap_s` of computation on every rank, as a training step's communication does."""
    from infra import Job

    sizes = sorted(sizes or DEFAULT_SIZES)
    if workers < 1 or servers < 0:
        raise ValueError(f"workers/servers: need workers >= 1 and servers >= 0, got {workers}/{servers}")
    if workers + servers < 2:
        raise ValueError("workers: a microbenchmark needs at least 2 ranks (workers + servers)")
    if len(sizes) < 2 or sizes[0] < 4:
        raise ValueError(f"sizes: need two or more message sizes of at least 4 bytes, got {sizes}")
    if repeats < 1:
        raise ValueError(f"repeats: must be at least 1, got {repeats}")
    if not 0 <= gap_s <= 10:
        raise ValueError(f"gap_s: the computation before each operation must be 0-10 s, got {gap_s}")
    if provider is None:
        from infra.local import LocalProvider

        provider = LocalProvider()
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "workers": workers,
        "servers": servers,
        "sizes": sizes,
        "repeats": repeats,
        "timeout_s": timeout_s,
        "link_bytes_per_s": link_bytes_per_s,
        "gap_s": gap_s,
    }
    (out_dir / "microbench.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "comm.json").unlink(missing_ok=True)
    job = Job(
        module="modelling.microbench_rank",
        args=[str(out_dir.resolve())],
        world_size=workers + servers,
        log_path=out_dir / "microbench.log",
        timeout_s=timeout_s,
    )
    result = provider.run(job, echo=echo)
    if not result.ok or not (out_dir / "comm.json").exists():
        raise MicrobenchFailed(f"microbench: {result.describe_failure()}")
    return load_comm(out_dir / "comm.json")
