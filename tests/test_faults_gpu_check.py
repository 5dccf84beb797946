"""scripts/gpu_check.sh without a GPU: it fails at once, naming the missing GPU in its JSON
summary, and a CPU rehearsal (`--device cpu`) runs the checks' real commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parent.parent
CHECKS = ["gpu", "profile_resnet50", "profile_transformer", "ps_1w1s_pinned", "asgd_2w_shared_gpu",
          "odsgd_2w_shared_gpu", "memory_cuda", "microbench_cuda", "pipeline_run"]


def gpu_check(out: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, DDLBENCH_PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--out", str(out), *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def test_without_a_gpu_every_check_fails_fast_naming_it(tmp_path: Path) -> None:
    started = time.monotonic()
    done = gpu_check(tmp_path, timeout_s=150)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] is False and list(summary["checks"]) == CHECKS
    gpu = summary["checks"]["gpu"]
    assert gpu["status"] == "failed" and gpu["detail"].startswith("no CUDA device: torch "), gpu
    for name in CHECKS[1:]:
        check = summary["checks"][name]
        assert check == {"status": "failed", "seconds": 0.0, "detail": f"not run: {gpu['detail']}"}, check
    assert "gpu check FAILED" in done.stdout
    print(f"gpu_check.sh without a GPU: exit 1 after {took:.1f} s (torch's import is most of it)")


@pytest.mark.slow
def test_a_cpu_rehearsal_runs_the_checks_commands(tmp_path: Path) -> None:
    from training.models import check_model_name

    done = gpu_check(tmp_path, "--device", "cpu", "--only",
                     "ps_1w1s_pinned,memory_cuda,microbench_cuda,profile_transformer", timeout_s=600)
    checks = json.loads((tmp_path / "summary.json").read_text())["checks"]
    assert list(checks) == ["profile_transformer", "ps_1w1s_pinned", "memory_cuda", "microbench_cuda"], checks
    # On CPU the measured peak is the tensors counted, which the prediction reproduces.
    memory = json.loads((tmp_path / "memory_cuda" / "memory.json").read_text())
    assert checks["memory_cuda"]["status"] == "passed" and memory["error"] == pytest.approx(0, abs=0.05), memory
    ps = checks["ps_1w1s_pinned"]
    assert ps["status"] == "passed" and ps["detail"].startswith("30 steps, "), ps
    summary = json.loads((tmp_path / "ps_1w1s_pinned" / "summary.json").read_text())
    assert (summary["workers"], summary["servers"], summary["comm"]) == (1, 1, "ps")
    microbench = checks["microbench_cuda"]
    assert microbench["status"] == "passed", microbench
    assert microbench["detail"].split(", ")[1] == "allreduce over gloo on cpu", microbench
    try:
        check_model_name("gpt-mini")
    except ValueError:
        transformer = checks["profile_transformer"]
        assert transformer["status"] == "failed", transformer
        assert transformer["detail"].startswith("model gpt-mini is not in this checkout (training/gpt.py)")
    assert done.returncode == (0 if all(c["status"] == "passed" for c in checks.values()) else 1)
