"""The device's peak matmul rate, measured: the denominator of MFU.

A square GEMM of n x n matrices in the training dtype costs 2 n^3 FLOPs; the peak is the
best of `repeats` timed products after a warm-up. The best, not the median: the peak is
what the device can do, and on a shared host a slower repeat is someone else's load. The
measurement runs at the threads the training processes use, since MFU compares a worker's
model FLOPs with what that worker's share of the device can do.
"""

from __future__ import annotations

import time
from typing import Any

# n large enough that the product is compute-bound, small enough for a second or two on one
# CPU core (512: 0.27 GFLOP per product); a GPU needs a larger one to fill its SMs.
_N = {"cpu": 512, "cuda": 8192}


def measure_peak_flops(device: str = "cpu", threads: int | None = None, n: int | None = None,
                       repeats: int = 5) -> dict[str, Any]:
    """{"flops_per_s", "n", "dtype", "device", "threads", "source": "gemm"} of one GEMM benchmark."""
    import torch

    dev = torch.device(device)
    n = n or _N[dev.type]
    if threads is not None:
        torch.set_num_threads(threads)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    out = torch.empty(n, n, device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    torch.mm(a, b, out=out)  # warm-up: allocation, kernel choice
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        best = min(best, time.perf_counter() - t0)
    return {"flops_per_s": 2 * n**3 / best, "n": n, "dtype": str(a.dtype).removeprefix("torch."),
            "device": dev.type, "threads": torch.get_num_threads(), "source": "gemm"}


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops_per_s: float, devices: int) -> float:
    """Model FLOPs utilisation: the model's FLOPs per second over the peak of every device
    the workers use (one each)."""
    return flops_per_token * tokens_per_s / (peak_flops_per_s * devices)
