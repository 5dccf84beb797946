"""Trainer benchmarks (issue 2), run by hand: `python benchmarks/bench_trainer.py`.

Prints each figure as a ratio against its anchor, measured in the same run:
1. SSGD-allreduce throughput vs the textbook DDP loop (goal >= 0.98);
2. PS push+pull effective bandwidth vs raw gloo send/recv of the same bytes (goal >= 0.9);
3. OD-SGD iteration time vs max(compute, communication) on a communication-bound
   model (mlp), and OD-SGD, ASGD and SSGD-PS throughput side by side;
4. the GPT (gpt-mini on stdlib-text): SSGD-allreduce against textbook DDP on the same
   model, and its MFU against the GEMM-measured peak (training/measure/peak.py).
Alternates the measured and the anchor runs and reports medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from infra.base import Job
from infra.local import LocalProvider
from pipelines.launch import launch, prepare
from training.gpt_shape import is_gpt


def _train(out: Path, provider=None, **opts) -> dict:
    dataset = "stdlib-text" if is_gpt(opts["model"]) else "synthetic"
    cfg = prepare({"dataset": dataset, "measure_warmup": 5} | opts, "bench")
    return launch(cfg, out, provider or LocalProvider(), timeout_s=900, echo=False)


def _module(module: str, args: list[str], world: int, out: Path) -> dict:
    res = LocalProvider().run(Job(module, args, world, out / f"{module}.log", timeout_s=900), echo=False)
    if not res.ok:
        raise SystemExit(f"{module} failed: {res.describe_failure()}")
    return json.loads((out / "result.json").read_text())


def bench_ddp(tmp: Path, repeats: int, model: str, steps: int, batch: int = 32, row: str = "1") -> list[dict]:
    ours, anchor, summaries = [], [], []
    for r in range(repeats):
        s = _train(tmp / f"ddp{r}", model=model, workers=2, batch_size=batch, steps=steps)
        summaries.append(s)
        ours.append(s["throughput_samples_per_s"])
        anchor.append(_module("benchmarks.textbook_ddp", [model, str(batch), str(steps), "5", str(tmp / "result.json")],
                              2, tmp)["throughput_samples_per_s"])
    o, a = statistics.median(ours), statistics.median(anchor)
    ratios = [x / y for x, y in zip(ours, anchor, strict=True)]
    print(f"[{row}] ssgd-allreduce {model}: {o:.1f} samples/s vs textbook DDP {a:.1f}: ratio {o / a:.3f} "
          f"(per repeat [{min(ratios):.3f}, {max(ratios):.3f}]; goal >= 0.98)"
          f"  runs: ours {[round(x, 1) for x in ours]} anchor {[round(x, 1) for x in anchor]}")
    return summaries


def bench_gpt(tmp: Path, repeats: int, model: str, steps: int) -> None:
    runs = bench_ddp(tmp, repeats, model, steps, batch=8, row="4")
    mfu = [s["mfu"] for s in runs]
    tokens = [s["throughput_tokens_per_s"] for s in runs]
    peak = [s["peak_flops"]["flops_per_s"] for s in runs]
    lm = runs[0]["language_model"]
    print(f"    {model}: {lm['flops_per_token'] / 1e6:.2f} MFLOP/token (6N + 12 L d T), tokens/s "
          f"{statistics.median(tokens):.0f} [{min(tokens):.0f}, {max(tokens):.0f}], GEMM peak per worker "
          f"{statistics.median(peak) / 1e9:.1f} GFLOP/s [{min(peak) / 1e9:.1f}, {max(peak) / 1e9:.1f}]; "
          f"MFU {statistics.median(mfu):.3f} [{min(mfu):.3f}, {max(mfu):.3f}]")


def bench_ps(tmp: Path, repeats: int, mbytes: float) -> None:
    ratios, comm_ratios = [], []
    for _ in range(repeats):
        r = _module("benchmarks.ps_vs_raw", [str(int(mbytes * 2**20)), str(tmp / "result.json")], 2, tmp)
        ratios.append(r["ps_bytes_per_s"] / r["raw_bytes_per_s"])
        comm_ratios.append(r["ps_comm_bytes_per_s"] / r["raw_bytes_per_s"])
        print(f"    PS {r['ps_bytes_per_s'] / 1e6:.0f} MB/s ({r['ps_comm_bytes_per_s'] / 1e6:.0f} MB/s without the "
              f"server's {r['server_update_s'] * 1e3:.1f} ms update) vs raw gloo {r['raw_bytes_per_s'] / 1e6:.0f} MB/s")
    print(f"[2] PS push+pull bandwidth / raw send+recv, {mbytes} MB: ratio {statistics.median(ratios):.3f} "
          f"with the server update, {statistics.median(comm_ratios):.3f} without it (goal >= 0.9)")


def bench_odsgd(tmp: Path, steps: int, model: str, bandwidth: str | None) -> None:
    """On loopback, communication is CPU work competing with compute for the same
    cores; on a shaped link (netns, one node per rank) it is network time."""
    common = dict(model=model, workers=2, servers=1, batch_size=32, steps=steps)
    provider = None
    if bandwidth:
        from infra.netns import NetnsProvider

        provider = NetnsProvider(nodes=3, bandwidth=bandwidth)
        provider.provision()
    try:
        res = {a: _train(tmp / a, provider, algorithm=a, **({"comm": "ps"} if a == "ssgd" else {}), **common)
               for a in ("ssgd", "asgd", "odsgd")}
    finally:
        if provider:
            provider.teardown()
    print(f"[3] {model}, {'netns ' + bandwidth + ' links' if bandwidth else 'loopback'}:")
    b = res["ssgd"]["breakdown_s"]
    compute = b["data"] + b["forward"] + b["backward"] + b["update"]
    comm = b["comm_exposed"]  # SSGD-PS exposes all of push, server update and pull
    od = res["odsgd"]["iter_time_s"]["p50"]
    print(f"    OD-SGD iteration {od * 1e3:.1f} ms vs max(compute {compute * 1e3:.1f}, comm {comm * 1e3:.1f}) ms: "
          f"ratio {od / max(compute, comm):.3f}; vs compute+comm: {od / (compute + comm):.3f}")
    ps = res["ssgd"]["throughput_samples_per_s"]
    for a in ("odsgd", "asgd", "ssgd"):
        t = res[a]["throughput_samples_per_s"]
        print(f"    {a:6s} throughput {t:8.0f} samples/s, ratio to SSGD-PS {t / ps:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--only", choices=["ddp", "ps", "odsgd", "gpt"])
    ap.add_argument("--gpt-model", default="gpt-mini")
    ap.add_argument("--odsgd-model", default="mlp")
    ap.add_argument("--bandwidth", default=None, help="[3] on a netns cluster with links shaped to this rate (root)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only in (None, "ddp"):
            bench_ddp(tmp, args.repeats, args.model, args.steps)
        if args.only in (None, "ps"):
            bench_ps(tmp, args.repeats, 16.0)
        if args.only in (None, "odsgd"):
            bench_odsgd(tmp, args.steps, args.odsgd_model, args.bandwidth)
        if args.only in (None, "gpt"):
            bench_gpt(tmp, args.repeats, args.gpt_model, args.steps)


if __name__ == "__main__":
    main()
