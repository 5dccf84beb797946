"""`ddlbench microbench --device` (modelling/measure/microbench_device.py): cuda refused at once
without a GPU; cpu writes comm.json as it did before the option; cuda, where there is a GPU,
times the allreduce on it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from modelling.measure.configs import MicrobenchConfig
from modelling.measure.microbench import run_config, run_microbench
from modelling.measure.microbench_device import pin_device, rank_device

REPO = Path(__file__).resolve().parent.parent
NO_CUDA = not torch.cuda.is_available()

# comm.json's fields before --device: a cpu run writes these and no others.
COMM_KEYS = {"kind", "schema_version", "workers", "servers", "sizes", "repeats", "link_bytes_per_s", "gap_s",
             "measurements", "environment"}
# host_other_cpu_share: the launcher's load probe, on the providers that can read it (local, netns).
ENV_KEYS = {"torch", "backend", "hostname", "cpu_count", "world_size", "python", "tcp_wmem_max", "tcp_rmem_max",
            "hosts", "nodes", "host_other_cpu_share"}
SPEC_KEYS = {"sizes", "repeats", "timeout_s", "workers", "servers", "link_bytes_per_s", "gap_s"}


def _ranks_of(out: Path) -> list[psutil.Process]:
    """Processes still running with `out` on their command line (a rank's argument)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if str(out) in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_cuda_without_a_gpu_is_refused_in_one_line_before_any_rank(tmp_path: Path) -> None:
    out = tmp_path / "mb"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    # CPU seconds of the command and whatever it started (waited for), not the wall clock: a
    # loaded host stretches the wall time of the same work past any fixed figure.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "microbench", "--device", "cuda", "--workers", "2",
                           "--out", str(out)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    took = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlbench microbench: --device cuda: "), done.stderr
    assert "sees no CUDA device" in lines[0]
    assert took < 20, f"{took:.1f} s of CPU: importing torch is the most it may take"
    assert not (out / "microbench.json").exists() and not (out / "comm.json").exists()
    assert _ranks_of(out) == []


@pytest.mark.skipif(not NO_CUDA, reason="the library's refusal needs a host without a GPU")
def test_run_config_refuses_cuda_without_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^microbench\.device: cuda, but torch .* sees no CUDA device"):
        run_config(MicrobenchConfig(workers=2, device="cuda"), tmp_path)
    assert not (tmp_path / "microbench.json").exists()


def test_a_cpu_rank_device_is_the_host_with_nothing_to_record() -> None:
    dev = rank_device("cpu", pin_device("cpu", 2), 0, 2, None, None)
    assert (dev.device.type, dev.pin, dev.environment()) == ("cpu", False, {})
    buf = torch.ones(4)
    dev.allreduce_op(buf, active=False)()  # a shard's allreduce: nothing to do, no group needed
    assert buf.tolist() == [1.0] * 4


@pytest.mark.slow
def test_cpu_writes_the_same_comm_fields_as_before_the_option(tmp_path: Path) -> None:
    run_microbench(2, 1, tmp_path, sizes=[4096, 16384], repeats=2, gap_s=0.0, device="cpu")
    comm = json.loads((tmp_path / "comm.json").read_text())
    assert set(comm) == COMM_KEYS
    assert set(comm["environment"]) == ENV_KEYS and comm["environment"]["backend"] == "gloo"
    assert set(json.loads((tmp_path / "microbench.json").read_text())) == SPEC_KEYS
    primitives = {m["primitive"] for m in comm["measurements"]}
    assert {"allreduce", "ps", "asgd"} <= primitives, primitives
    assert all(m["median_s"] > 0 for m in comm["measurements"])


@pytest.mark.slow
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_cuda_times_the_allreduce_on_the_gpu(tmp_path: Path) -> None:
    comm = run_microbench(2, 1, tmp_path, sizes=[4096, 65536], repeats=3, device="cuda")
    env = comm["environment"]
    assert env["device"] == "cuda" and env["gpu_model"] == torch.cuda.get_device_name(0)
    # NCCL takes one rank per GPU: two workers on one GPU reduce their GPU tensors over gloo.
    assert env["allreduce_backend"] == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
    allreduce = [m for m in comm["measurements"] if m["primitive"] == "allreduce"]
    assert len(allreduce) == 2 and all(m["median_s"] > 0 for m in allreduce)
