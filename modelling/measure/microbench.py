"""Communication microbenchmarks, launched exactly as training is (DESIGN §3).

The ranks (modelling/measure/microbench_rank.py) run through an infra provider's
`run(Job(...))`, so they cross the same network training crosses: allreduce
over the N workers, point-to-point between ranks 0 and 1, and parameter-server
push/pull rounds of N workers to S shards at once, over log-spaced sizes.
With device cuda the allreduce runs on the workers' GPUs (modelling/measure/microbench_device.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra import Job
from infra.hostload import CpuProbe
from infra.local import LocalProvider
from modelling.measure.configs import DEFAULT_SIZES, MicrobenchConfig
from modelling.measure.records import load_comm
from training.config import Device

__all__ = ["DEFAULT_SIZES", "MicrobenchConfig", "MicrobenchFailed", "cuda_missing", "run_config", "run_microbench"]


_DEFAULT = MicrobenchConfig.model_fields


class MicrobenchFailed(RuntimeError):
    """The microbenchmark job failed; the message says which ranks and where the log is."""


def run_microbench(
    workers: int,
    servers: int,
    out_dir: Path,
    *,
    provider=None,
    sizes: list[int] | None = None,
    repeats: int = _DEFAULT["repeats"].default,
    timeout_s: float = _DEFAULT["timeout_s"].default,
    link_bytes_per_s: float | None = None,
    gap_s: float = _DEFAULT["gap_s"].default,
    device: str = _DEFAULT["device"].default.value,
    echo: bool = False,
) -> dict[str, Any]:
    """Measure, write out_dir/comm.json and return its content. Every timed operation
    follows `gap_s` of computation on every rank taking part (the shards sleep through it, as
    they wait in training), as a training step's communication does."""
    config = MicrobenchConfig.of(
        "microbench",
        workers=workers,
        servers=servers,
        sizes=sizes,
        repeats=repeats,
        timeout_s=timeout_s,
        link_bytes_per_s=link_bytes_per_s,
        gap_s=gap_s,
        device=device,
    )
    return run_config(config, Path(out_dir), provider=provider, echo=echo)


def cuda_missing(config: MicrobenchConfig) -> str | None:
    """Why `config`, a cuda microbenchmark, cannot run on this host (None for cpu, or a GPU here)."""
    if config.device is not Device.cuda:
        return None
    from modelling.measure.microbench_device import no_cuda_reason

    return no_cuda_reason()


def run_config(config: MicrobenchConfig, out_dir: Path, *, provider=None, echo: bool = False) -> dict[str, Any]:
    """run_microbench of a MicrobenchConfig; ValueError, before any rank starts, for a cuda
    microbenchmark on a host without a GPU."""
    if why := cuda_missing(config):
        raise ValueError(f"microbench.device: cuda, but {why}")
    if provider is None:
        provider = LocalProvider()
    out_dir.mkdir(parents=True, exist_ok=True)
    # A cpu job's spec without the device, as before there was a choice: the ranks read cpu.
    dump = config.model_dump(mode="json", exclude={"device"} if config.device is Device.cpu else None)
    spec = {**dump, "sizes": config.measured_sizes}
    (out_dir / "microbench.json").write_text(json.dumps(spec, indent=2))
    (out_dir / "comm.json").unlink(missing_ok=True)
    job = Job(
        module="modelling.measure.microbench_rank",
        args=[str(out_dir.resolve())],
        world_size=config.workers + config.servers,
        servers=config.servers,  # placed as the training jobs it models are (DESIGN §5)
        log_path=out_dir / "microbench.log",
        timeout_s=config.timeout_s,
    )
    (out_dir / "placement.json").write_text(json.dumps(provider.place_job(job).as_dict(), indent=2))
    probe = CpuProbe() if provider.measures_host_load else None
    result = provider.run(job, echo=echo)
    if not result.ok or not (out_dir / "comm.json").exists():
        raise MicrobenchFailed(f"microbench: {result.describe_failure()}")
    if probe is not None:
        # A cost timed while other work held the cores is the host's scheduling, not the link's:
        # the file says so, as a training run's summary does (DESIGN §4).
        comm = json.loads((out_dir / "comm.json").read_text())
        comm.setdefault("environment", {})["host_other_cpu_share"] = probe.other_share()
        (out_dir / "comm.json").write_text(json.dumps(comm, indent=2))
    return load_comm(out_dir / "comm.json")
