"""Benchmark the `netns` provider: provision/teardown time and shaped-link allreduce bandwidth.

    python -m benchmarks.bench_netns                      # 3 nodes, 5 provision+teardown
    python -m benchmarks.bench_netns --allreduce 200mbit  # also gloo allreduce at 200 Mbit/s

Needs root. The allreduce figure is the ring bus bandwidth: a ring allreduce of S bytes over
N ranks sends 2 (N-1)/N * S bytes per rank, so bus bandwidth = that / time; on a link shaped
to R bits/s it cannot exceed R/8 bytes/s (less the TCP/IP header share, about 4% at a
1500-byte MTU).

`--rank-probe OUT.json` is the per-rank entry point the provider starts through torchrun.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def ring_bus_bytes(size_bytes: int, ranks: int) -> float:
    """Bytes each rank sends in a ring allreduce of `size_bytes`."""
    return 2 * (ranks - 1) / ranks * size_bytes


def rank_probe(out: Path, size_bytes: int, repeats: int) -> None:
    """Time gloo allreduce of `size_bytes` on every rank; rank 0 writes the figures."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.ones(size_bytes // 4)
    dist.all_reduce(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - start)
    if rank == 0:
        median = statistics.median(times)
        out.write_text(
            json.dumps(
                {
                    "world_size": world,
                    "bytes": size_bytes,
                    "times_s": times,
                    "median_s": median,
                    "bus_bytes_per_s": ring_bus_bytes(size_bytes, world) / median,
                }
            )
        )
    dist.destroy_process_group()


def measure_allreduce(
    provider,
    size_bytes: int = 4 << 20,
    repeats: int = 3,
    workdir: Path | None = None,
    procs_per_node: int = 1,
) -> dict:
    """Run the allreduce probe on a provisioned provider; return rank 0's figures."""
    from infra import Job

    workdir = Path(workdir or tempfile.mkdtemp(prefix="ddlb-allreduce-"))
    out = workdir / "allreduce.json"
    job = Job(
        module="benchmarks.bench_netns",
        world_size=provider.nodes * procs_per_node,
        args=["--rank-probe", str(out), "--bytes", str(size_bytes), "--repeats", str(repeats)],
        log_path=workdir / "allreduce.log",
        timeout_s=120,
    )
    result = provider.run(job, echo=False)
    if not result.ok:
        raise RuntimeError(f"allreduce probe failed: {result.describe_failure()}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--bandwidth", default="1gbit", help="link rate for the provision benchmark"
    )
    parser.add_argument(
        "--allreduce", metavar="RATE", help="also measure allreduce bus bandwidth at this link rate"
    )
    parser.add_argument("--rank-probe", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=4 << 20)
    args = parser.parse_args()
    if args.rank_probe:
        rank_probe(args.rank_probe, args.bytes, args.repeats)
        return

    from infra.netns import NetnsProvider, parse_bandwidth

    provision_s, teardown_s = [], []
    for _ in range(args.repeats):
        provider = NetnsProvider(nodes=args.nodes, bandwidth=args.bandwidth)
        start = time.perf_counter()
        provider.provision()
        provision_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        provider.teardown()
        teardown_s.append(time.perf_counter() - start)
    print(f"netns {args.nodes} nodes @ {args.bandwidth}, {args.repeats} repeats:")
    print(
        f"  provision  median {statistics.median(provision_s):.3f} s  max {max(provision_s):.3f} s"
    )
    print(f"  teardown   median {statistics.median(teardown_s):.3f} s  max {max(teardown_s):.3f} s")
    if args.allreduce:
        with NetnsProvider(nodes=args.nodes, bandwidth=args.allreduce) as provider:
            fig = measure_allreduce(provider, args.bytes, repeats=3)
        rate = parse_bandwidth(args.allreduce) / 8
        print(
            f"  allreduce  {fig['bytes'] / 2**20:.1f} MiB over {fig['world_size']} ranks: median "
            f"{fig['median_s']:.3f} s, bus bandwidth {fig['bus_bytes_per_s'] / 1e6:.2f} MB/s = "
            f"{fig['bus_bytes_per_s'] / rate:.3f} x the shaped {rate / 1e6:.2f} MB/s"
        )


if __name__ == "__main__":
    main()
