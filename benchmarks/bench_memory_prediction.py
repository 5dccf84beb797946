"""The memory prediction against measurement (issue 50): for models no test uses, every algorithm,
real jobs (2 workers, 2 shards under a parameter server, 1 thread a rank) and the model's
prediction from the profile's `memory` section, measured in this process.

Prints, per model and algorithm, each role's predicted and measured peak tensor bytes and the
error, then the median and worst absolute error over them all (targets: 2% and 5%), and each
model's RSS above its tensor bytes (the interpreter, torch, the data set: what no tensor count
sees). Tensor bytes are counted, not timed: the load of the host does not move them.

    python benchmarks/bench_memory_prediction.py [--steps 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ as a package, from anywhere

# Models and shapes no test trains.
MODELS = [
    {"model": "resnet20", "dataset": "synthetic", "batch_size": 12, "synthetic_samples": 256},
    {"model": "gpt-tiny", "dataset": "markov", "n_layer": 4, "d_model": 64, "n_head": 4, "seq_len": 40,
     "batch_size": 6},
    {"model": "squeezenet1_1", "dataset": "synthetic", "input_shape": [3, 64, 64], "batch_size": 4,
     "synthetic_samples": 64},
]
ALGORITHMS = [("ssgd", "allreduce"), ("ssgd", "ps"), ("asgd", "ps"), ("odsgd", "ps")]


def one(job: dict, steps: int) -> list[dict]:
    """Each role's predicted and measured peak of one real job."""
    from infra.local import LocalProvider
    from modelling.measure.profiler import profile_memory
    from modelling.memory import predict_memory
    from modelling.scenario import Scenario
    from pipelines.launch import launch, prepare
    from training.shape import resolve_input_shape

    cfg = prepare(job | {"steps": steps, "workers": 2, "threads": 1, "timeout_s": 120}, "bench")
    with tempfile.TemporaryDirectory() as tmp:
        summary = launch(cfg, Path(tmp) / "run", LocalProvider(), timeout_s=300, echo=False)
    memory = profile_memory(cfg.model, cfg.batch_size, resolve_input_shape(cfg), cfg.dataset,
                            cfg.num_classes or 10, cfg.model_options)
    predicted = {r["role"]: r for r in predict_memory({"batch_size": cfg.batch_size, "memory": memory},
                                                      Scenario.from_summary(summary))["memory_ranks"]}
    out = []
    for rank in summary["memory"]["ranks"]:
        want = predicted[rank["role"]]["peak_bytes"]
        out.append({"role": rank["role"], "rank": rank["rank"], "predicted": want, "measured": rank["peak_bytes"],
                    "error": want / rank["peak_bytes"] - 1, "rss_over": rank["peak_rss_bytes"] - rank["peak_bytes"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from modelling.memory import human_bytes

    errors = []
    for base in MODELS:
        rss = []
        for name, comm in ALGORITHMS:
            job = base | {"algorithm": name, "comm": comm} | ({"servers": 2} if comm == "ps" else {})
            for r in one(job, args.steps):
                errors.append(abs(r["error"]))
                if r["role"] == "worker":
                    rss.append(r["rss_over"])
                print(f"{base['model']:>14} {name}-{comm:<9} {r['role']:>6} {r['rank']}: predicted "
                      f"{human_bytes(r['predicted']):>9}, measured {human_bytes(r['measured']):>9}, "
                      f"error {r['error']:+.2%}", flush=True)
        print(f"{base['model']:>14} a worker's RSS above its tensor bytes: median "
              f"{human_bytes(statistics.median(rss))} [{human_bytes(min(rss))}-{human_bytes(max(rss))}]", flush=True)
    print(f"|error| over {len(errors)} ranks: median {statistics.median(errors):.2%} (target 2%), "
          f"worst {max(errors):.2%} (target 5%)")


if __name__ == "__main__":
    main()
