"""Speed of prediction (issue 3): every algorithm for resnet50 at 1, 2, 4, ..., 1024
workers, against the 1 s target.

The layer table is resnet50's real structure (161 parameter tensors in 107
layers, 25.6 M parameters) with times from a short profile at a small batch,
or from --layers; the comm model is a 10 Gbit/s alpha-beta model, or --comm.

    python benchmarks/bench_predict.py [--layers layers.json] [--comm model.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from modelling.measure.layers import load_layers
from modelling.network.fit import fit_comm, load_comm_model
from modelling.predict import predict

TARGET_S = 1.0
WORKERS = [2**i for i in range(11)]
CONFIGS = [("ssgd", "allreduce"), ("ssgd", "ps"), ("asgd", "ps"), ("odsgd", "ps")]


def ten_gbit_model() -> dict:
    """A comm model fitted to exact 10 Gbit/s, 25 us-latency measurements."""
    alpha, beta, gamma = 25e-6, 8 / 10e9, 0.1e-9
    rows = []
    sizes = [4096 * 4**i for i in range(7)]
    for prim, n, s, cost in [
        ("p2p", 2, 0, lambda m: alpha + m * beta),
        ("allreduce", 8, 0, lambda m: 14 * alpha + 7 / 8 * m * (2 * beta + gamma)),
        ("ps", 8, 1, lambda m: 16 * (alpha + m * beta)),
    ]:
        rows += [{"primitive": prim, "workers": n, "servers": s, "bytes": m, "median_s": cost(m)} for m in sizes]
    return fit_comm({"kind": "ddlbench-comm", "measurements": rows})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=Path, default=None)
    ap.add_argument("--comm", type=Path, default=None)
    args = ap.parse_args()
    if args.layers:
        layers = load_layers(args.layers)
    else:
        from modelling.measure.profiler import profile_layers

        layers = profile_layers("resnet50", 2, warmup=1, repeats=2)
    comm = load_comm_model(args.comm) if args.comm else ten_gbit_model()
    print(f"{layers['model']}: {len(layers['layers'])} layers, batch {layers['batch_size']}")
    total = 0.0
    for algorithm, mode in CONFIGS:
        t0 = time.perf_counter()
        rows = predict(layers, comm, algorithm=algorithm, comm_mode=mode, workers=WORKERS)
        dt = time.perf_counter() - t0
        total += dt
        print(
            f"{algorithm}-{mode:<9} {dt * 1e3:7.1f} ms   iter at N=1: {rows[0]['iter_time_s'] * 1e3:.1f} ms,"
            f" N=1024: {rows[-1]['iter_time_s'] * 1e3:.1f} ms"
        )
    print(
        f"total {total:.3f} s for {len(CONFIGS)} algorithms x {len(WORKERS)} world sizes "
        f"(ratio to the {TARGET_S:.0f} s target: {total / TARGET_S:.2f})"
    )


if __name__ == "__main__":
    main()
