"""Predicted memory of a configuration's ranks (issue 50), in the categories training measures
(training/measure/memory.py, summary.json's `memory`): what each rank holds from one iteration to
the next, and the activations a worker's forward saves for backward.

The profile's `memory` section (modelling/measure/profiler.py) gives the model's own figures: its
parameters, their gradients, its module buffers, and the bytes its forward and loss save for
backward at two batches, fixed plus per sample (a saved input grows with the batch, a causal mask
does not). The algorithm decides the rest, as training/algorithms.py and training/ps.py allocate it:

- a worker holds the parameters and their gradients (after its backward, before its update);
- SGD keeps one momentum buffer per parameter where its momentum is not 0: an allreduce worker's
  global optimizer, an OD-SGD worker's local one; a parameter-server worker keeps none;
- communication: DDP's gradient buckets (allreduce with overlap, more than one worker), a
  parameter-server worker's flat push and pull buffers (one slot each, two for OD-SGD, whose
  global copy is one of its pull slots);
- a shard holds its slice of the weights, its push buffers (one per worker when synchronous, the
  first also its gradient; one when asynchronous) and its optimizer's momentum.
"""

from __future__ import annotations

import math
from typing import Any

from modelling.scenario import Scenario
from training.config import Algorithm, Comm

# training/measure/memory.py's categories, in its order; named here so that predicting imports no torch.
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "buffers")
FLAT_ELEMENT_BYTES = 4  # a parameter server's flat buffers are float32 (training/ps.py)
MEMORY_FIGURES = ("memory_bytes", "memory_breakdown", "memory_ranks")  # a prediction row's


def activation_bytes(memory: dict[str, Any], batch: int) -> int:
    """The bytes a worker's forward and loss save for backward at per-worker `batch`."""
    act = memory["activations"]
    return max(0, round(act["fixed_bytes"] + act["per_sample_bytes"] * batch))


def worker_breakdown(memory: dict[str, Any], s: Scenario, batch: int) -> dict[str, int]:
    """One worker's bytes by category."""
    grads = memory["gradient_bytes"]
    flat = memory["trainable_numel"] * FLAT_ELEMENT_BYTES
    momentum = s.effective_momentum_local if s.algorithm == Algorithm.odsgd.value else s.momentum
    if s.comm == Comm.allreduce.value:
        optimizer = grads if momentum else 0
        comm = grads if s.overlap and s.workers > 1 else 0
    else:
        slots = 2 if s.algorithm == Algorithm.odsgd.value else 1
        optimizer = grads if s.algorithm == Algorithm.odsgd.value and momentum else 0
        comm = 2 * slots * flat
    return {"parameters": memory["parameter_bytes"], "gradients": grads, "optimizer": optimizer,
            "activations": activation_bytes(memory, batch), "buffers": memory["buffer_bytes"] + comm}


def shard_breakdown(memory: dict[str, Any], s: Scenario) -> dict[str, int]:
    """The largest shard's bytes by category: shards split the flat parameters evenly."""
    shard = math.ceil(memory["trainable_numel"] / s.servers) * FLAT_ELEMENT_BYTES
    sync = s.algorithm != Algorithm.asgd.value
    momentum = s.momentum if sync else s.effective_momentum_async
    return {"parameters": shard, "gradients": shard, "optimizer": shard if momentum else 0,
            "activations": 0, "buffers": (s.workers - 1) * shard if sync else 0}


def predict_memory(layers: dict[str, Any], s: Scenario) -> dict[str, Any]:
    """predictions.json's memory figures of scenario `s`: `memory_bytes` (the peak of the rank
    with the largest), its `memory_breakdown`, and `memory_ranks` (a worker's and a shard's);
    None each where the profile has no `memory` section (one from before it was measured)."""
    memory = layers.get("memory")
    if not memory:
        return dict.fromkeys(MEMORY_FIGURES)
    ranks = [{"role": "worker", "breakdown": worker_breakdown(memory, s, s.batch_size or layers["batch_size"])}]
    if s.comm == Comm.ps.value:
        ranks.append({"role": "server", "breakdown": shard_breakdown(memory, s)})
    for r in ranks:
        r["breakdown"] = {c: r["breakdown"][c] for c in CATEGORIES}
        r["peak_bytes"] = sum(r["breakdown"].values())
    top = max(ranks, key=lambda r: r["peak_bytes"])
    return {"memory_bytes": top["peak_bytes"], "memory_breakdown": top["breakdown"], "memory_ranks": ranks}


def node_bytes(ranks: list[dict[str, Any]], s: Scenario, device: str) -> int:
    """The bytes the fullest device holds: a worker's own on a GPU (each worker its device), the
    sum of the ranks one node holds on CPU (workers then shards, as `s.node_of_rank` places
    them). Without a placement (a what-if no cluster of the spec's places: one like it, large
    enough) the largest rank's alone."""
    peak = {r["role"]: r["peak_bytes"] for r in ranks}
    if device == "cuda":
        return peak["worker"]
    if s.node_of_rank is None:
        return max(peak.values())
    held: dict[int, int] = {}
    for rank, node in enumerate(s.node_of_rank):
        held[node] = held.get(node, 0) + peak["worker" if rank < s.workers else "server"]
    return max(held.values())


def human_bytes(n: float) -> str:
    """Bytes in decimal units, as the spec's memory.device takes them: 31.2 GB, 24 GB, 640 kB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def does_not_fit(row: dict[str, Any], s: Scenario, device: str, capacity_bytes: int | None) -> str | None:
    """"does not fit: 31.2 GB > 24 GB" where the prediction's fullest device needs more than
    `capacity_bytes`; None where it fits, or where either is unknown."""
    if capacity_bytes is None or not row.get("memory_ranks"):
        return None
    need = node_bytes(row["memory_ranks"], s, device)
    return f"does not fit: {human_bytes(need)} > {human_bytes(capacity_bytes)}" if need > capacity_bytes else None


def largest_batch(layers: dict[str, Any], s: Scenario, device: str, capacity_bytes: int, most: int) -> int | None:
    """The largest per-worker batch, up to `most`, at which scenario `s`'s fullest device needs no
    more than `capacity_bytes`: 0 where not even one sample fits; None where the table has no
    `memory` section. The bytes grow with the batch by a constant step (the activations' per
    sample), so two batches give every other."""
    if not layers.get("memory"):
        return None

    def need(batch: int) -> int:
        return node_bytes(predict_memory(layers, s.model_copy(update={"batch_size": batch}))["memory_ranks"], s,
                          device)

    one = need(1)
    step = need(2) - one
    if one > capacity_bytes:
        return 0
    batch = most if step <= 0 else min(most, 1 + (capacity_bytes - one) // step)
    while batch > 1 and need(batch) > capacity_bytes:  # the step's rounding
        batch -= 1
    return int(batch)
