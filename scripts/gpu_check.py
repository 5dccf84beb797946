"""The GPU check's driver (scripts/gpu_check.sh runs it): the CUDA paths, one check each.

    python scripts/gpu_check.py --out gpu-check [--budget-s 450]

Each check runs the installed `ddlbench` (or Python) in a process of its own with a timeout,
then reads what it wrote. OUT/summary.json maps each check to passed/failed, its seconds and
a one-line detail; the exit status is 0 only when every check passed. Without a CUDA device
every check fails at once, naming the missing GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRANSFORMER = "gpt-mini"  # the transformer workload (training/gpt.py)
DEVICE = "cuda"  # --device cpu rehearses the checks' plumbing on a machine without a GPU

Check = Callable[[Path, float], str]  # (its output dir, seconds it may take) -> detail; raises Failed


class Failed(Exception):
    """A check failed; the message is its one-line detail."""


def ddlbench(args: list[str], timeout_s: float, log: Path) -> str:
    """Run `ddlbench ARGS`, its output to `log`; Failed naming the last line of output on a failure."""
    exe = Path(sys.executable).with_name("ddlbench")
    argv = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "pipelines.cli"]), *args]
    return run(argv, timeout_s, log)


def run(argv: list[str], timeout_s: float, log: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MLFLOW_TRACKING_URI", None)  # the pipeline check's store is its own home's
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired as err:
        log.write_text(_text(err.stdout) + _text(err.stderr))
        raise Failed(f"timed out after {timeout_s:.0f} s (log: {log})") from None
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise Failed(f"exit {done.returncode}: {lines[-1][:300] if lines else 'no output'} (log: {log})")
    return done.stdout


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


# -- the checks -------------------------------------------------------------------------------
def gpu(out: Path, timeout_s: float) -> str:
    code = ("import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'cuda': ok, "
            "'torch': torch.__version__, 'cuda_version': torch.version.cuda, "
            "'devices': torch.cuda.device_count() if ok else 0, "
            "'name': torch.cuda.get_device_name(0) if ok else None}))")
    info = json.loads(run([sys.executable, "-c", code], timeout_s, out / "gpu.log").strip().splitlines()[-1])
    if not info["cuda"]:
        raise Failed(f"no CUDA device: torch {info['torch']} (CUDA build: {info['cuda_version'] or 'no'}) "
                     "sees no GPU")
    return f"{info['name']} x{info['devices']}, torch {info['torch']}, CUDA {info['cuda_version']}"


def _profile(model: str, batch: int, extra: list[str], out: Path, timeout_s: float) -> str:
    ddlbench(["profile", "--model", model, "--batch-size", str(batch), "--device", DEVICE, "--warmup", "2",
              "--repeats", "5", "--out", str(out), *extra], timeout_s, out / "profile.log")
    doc = json.loads((out / "layers.json").read_text())
    layers = doc.get("layers") or []
    if not layers:
        raise Failed(f"{out / 'layers.json'} has no layers")
    times = [(layer.get("fwd_s") or 0) + (layer.get("bwd_s") or 0) for layer in layers]
    if not all(t > 0 for t in times):
        raise Failed(f"{sum(t <= 0 for t in times)} of {len(layers)} layers have no positive time")
    gpu_model = (doc.get("environment") or {}).get("gpu_model") or doc.get("gpu_model")
    return f"{len(layers)} layers, {sum(times) * 1e3:.1f} ms forward+backward at batch {batch} on {gpu_model}"


def profile_resnet50(out: Path, timeout_s: float) -> str:
    return _profile("resnet50", 32, ["--dataset", "synthetic", "--input-shape", "3,224,224"], out, timeout_s)


def profile_transformer(out: Path, timeout_s: float) -> str:
    code = f"from training.models import check_model_name; check_model_name({TRANSFORMER!r})"
    try:
        run([sys.executable, "-c", code], 60, out / "model.log")
    except Failed as err:
        raise Failed(f"model {TRANSFORMER} is not in this checkout (training/gpt.py): {err}") from None
    return _profile(TRANSFORMER, 8, [], out, timeout_s)


def _train(out: Path, timeout_s: float, *options: str) -> dict[str, Any]:
    model = "resnet20" if DEVICE == "cuda" else "lenet5"  # a CPU rehearsal checks the plumbing only
    ddlbench(["train", "--out", str(out), "--device", DEVICE, "--model", model, "--dataset", "synthetic",
              "--batch-size", "64", "--steps", "30", "--timeout-s", "60", "--timeout", str(int(timeout_s)),
              "--quiet", *options],
             timeout_s, out / "train.log")
    summary = json.loads((out / "summary.json").read_text())
    if summary.get("status") != "completed" or summary.get("steps") != 30:
        raise Failed(f"summary status {summary.get('status')}, steps {summary.get('steps')}")
    return summary


def _train_detail(s: dict[str, Any]) -> str:
    env = s.get("environment") or {}
    return (f"{s['steps']} steps, {s.get('throughput_samples_per_s') or 0:.0f} samples/s, "
            f"device {env.get('device') or s['config'].get('device')}, gpu {env.get('gpu_model')}")


def ps_pinned(out: Path, timeout_s: float) -> str:
    return _train_detail(_train(out, timeout_s, "--algorithm", "ssgd", "--comm", "ps", "--workers", "1",
                                "--servers", "1"))


def asgd_shared(out: Path, timeout_s: float) -> str:
    return _train_detail(_train(out, timeout_s, "--algorithm", "asgd", "--workers", "2", "--servers", "1"))


def odsgd_shared(out: Path, timeout_s: float) -> str:
    return _train_detail(_train(out, timeout_s, "--algorithm", "odsgd", "--workers", "2", "--servers", "1"))


def memory_cuda(out: Path, timeout_s: float) -> str:
    """The model's memory prediction (modelling/memory.py, from a profile's `memory` section)
    against a training run's measured peak: on CUDA the allocator's peak of allocated bytes, which
    also holds what no tensor count names (cuBLAS workspaces, the optimizer's temporaries): the
    error is reported, in memory.json too, not judged."""
    from modelling.memory import human_bytes, predict_memory
    from modelling.scenario import Scenario

    model = "resnet20" if DEVICE == "cuda" else "lenet5"
    ddlbench(["profile", "--model", model, "--dataset", "synthetic", "--batch-size", "64", "--device", DEVICE,
              "--warmup", "1", "--repeats", "2", "--out", str(out / "profile")], timeout_s / 2, out / "profile.log")
    layers = json.loads((out / "profile" / "layers.json").read_text())
    if not layers.get("memory"):
        raise Failed(f"{out / 'profile' / 'layers.json'} has no memory section")
    snapshot = ["--memory-snapshot"] if DEVICE == "cuda" else []  # the allocator's history: CUDA's alone
    summary = _train(out / "train", timeout_s / 2, "--algorithm", "ssgd", "--workers", "1", *snapshot)
    dump = out / "train" / "memory_snapshot.rank0.pickle"
    if snapshot and not (dump.is_file() and dump.stat().st_size):
        raise Failed(f"{dump} is missing or empty")
    predicted = predict_memory(layers, Scenario.from_summary(summary))["memory_bytes"]
    measured = (summary.get("memory") or {}).get("peak_bytes")
    if not predicted or not measured:
        raise Failed(f"no memory figure: predicted {predicted}, measured {measured}")
    error = predicted / measured - 1
    figures = {"model": model, "device": DEVICE, "predicted_bytes": predicted, "measured_bytes": measured,
               "reserved_bytes": summary["memory"].get("reserved_bytes"), "error": error}
    (out / "memory.json").write_text(json.dumps(figures, indent=2))
    return (f"{model} at batch 64: predicted {human_bytes(predicted)}, measured peak {human_bytes(measured)} "
            f"({error:+.1%})")


def microbench_cuda(out: Path, timeout_s: float) -> str:
    if "--device" not in ddlbench(["microbench", "--help"], 60, out / "help.log"):
        raise Failed("`ddlbench microbench` has no --device option: it has no CUDA path to check")
    ddlbench(["microbench", "--device", DEVICE, "--workers", "2", "--servers", "1", "--repeats", "3",
              "--out", str(out)], timeout_s, out / "microbench.log")
    doc = json.loads((out / "comm.json").read_text())
    env = doc.get("environment") or {}
    device = env.get("device", "cpu")  # a cpu comm.json has no device entry
    if device != DEVICE:
        raise Failed(f"{out / 'comm.json'} was measured on {device}, not {DEVICE}")
    rows = doc.get("measurements") or []
    if not any(r.get("primitive") == "allreduce" for r in rows):
        raise Failed(f"{out / 'comm.json'} has no allreduce")
    where = f"{env.get('allreduce_backend', 'gloo')} on {env.get('gpu_model') or device}"
    return f"{len(rows)} measurements, allreduce over {where}, in {out / 'comm.json'}"


def pipeline_run(out: Path, timeout_s: float) -> str:
    home = out / "home"
    ddlbench(["run", str(REPO / "specs" / "gpu-check.yaml"), "--home", str(home), "--set", f"train.device={DEVICE}"],
             timeout_s, out / "run.log")
    (run_dir,) = [p.parent for p in (home / "runs").glob("*/ctx.json")]
    status = json.loads((run_dir / "status.json").read_text())["status"]
    if status != "FINISHED":
        raise Failed(f"run ended {status} ({run_dir})")
    predictions = run_dir / "predict" / "predictions.json"
    if not predictions.exists() or not json.loads(predictions.read_text()):
        raise Failed(f"no predictions in {predictions}")
    return f"FINISHED with predictions ({run_dir})"


# Each check with the seconds it may take; the sum stays within the 8 minutes the check has.
CHECKS: list[tuple[str, Check, float]] = [
    ("gpu", gpu, 60),
    ("profile_resnet50", profile_resnet50, 75),
    ("profile_transformer", profile_transformer, 60),
    ("ps_1w1s_pinned", ps_pinned, 50),
    ("asgd_2w_shared_gpu", asgd_shared, 50),
    ("odsgd_2w_shared_gpu", odsgd_shared, 50),
    ("memory_cuda", memory_cuda, 40),
    ("microbench_cuda", microbench_cuda, 40),
    ("pipeline_run", pipeline_run, 120),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--budget-s", type=float, default=450.0, help="Seconds for all checks together.")
    parser.add_argument("--only", default=None, help="Comma-separated check names (default: all).")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: rehearse the checks' commands without a GPU (the gpu check is left out).")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    names = [n for n, _, _ in CHECKS]
    only = args.only.split(",") if args.only else names
    if unknown := sorted(set(only) - set(names)):
        parser.error(f"--only: no check named {', '.join(unknown)} (checks: {', '.join(names)})")
    if DEVICE == "cpu":
        only = [n for n in only if n != "gpu"]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_s
    results: dict[str, dict[str, Any]] = {}
    no_gpu: str | None = None
    for name, check, limit in (c for c in CHECKS if c[0] in only):
        started = time.monotonic()
        left = deadline - started
        if no_gpu is not None:
            status, detail = "failed", f"not run: {no_gpu}"
        elif left < 5:
            status, detail = "failed", "not run: the check's time budget was spent"
        else:
            try:
                status, detail = "passed", check(out / name, min(limit * (1 if DEVICE == "cuda" else 4), left))
            except Failed as err:
                status, detail = "failed", str(err)
            except Exception as err:  # noqa: BLE001 - a broken check is a failed check, with its reason
                status, detail = "failed", f"{type(err).__name__}: {err}"[:400]
            if name == "gpu" and status == "failed":
                no_gpu = detail
        results[name] = {"status": status, "seconds": round(time.monotonic() - started, 1), "detail": detail}
        print(f"{status.upper():6} {name:22} {results[name]['seconds']:6.1f} s  {detail}", flush=True)
    passed = all(r["status"] == "passed" for r in results.values())
    summary = {"passed": passed, "device": DEVICE, "checks": results, "python": sys.executable}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"gpu check {'passed' if passed else 'FAILED'}: {out / 'summary.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
