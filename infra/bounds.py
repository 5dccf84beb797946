"""Every size a spec, an override, the onboarding form or a command line sets, bounded: one
table, each bound with its reason (docs/security.md lists it).

A bound is checked where the value is parsed (the pydantic field of the spec, the training
config, the provider's options, the profile's and the microbenchmark's settings), before any
validation or planning step allocates in proportion to it. Ceilings that follow from this
machine (memory, cores) are derived from it, lazily, so that importing this module costs
nothing; the rest are stated ceilings well above any run this project knows of.

Only the standard library and psutil here: every floor (infra, training, modelling,
pipelines) imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import psutil


@dataclass(frozen=True)
class Bound:
    """The largest value a size may take, and why."""

    limit: int | float
    reason: str


MIB = 1 << 20

# Cluster and job shape.
NODES = Bound(4096, "nodes of one cluster: a placement lists every node and every rank")
NETNS_NODES = Bound(64, "emulated nodes: each is a namespace, a veth pair, a tc qdisc and an agent process on "
                        "this one host")
WORKERS = Bound(4096, "workers of one training job: gloo and the placement list every rank")
SERVERS = Bound(256, "parameter-server shards of one job: each holds a slice of the flat parameters")
DEVICES_PER_NODE = Bound(1024, "workers per node")
GPUS_PER_NODE = Bound(64, "GPUs per node")
CPUS_PER_NODE = Bound(1 << 16, "CPUs per node")
PREDICTED_WORKERS = Bound(1 << 16, "what-if world size: the model is independent of N, a placement lists every rank")
WHAT_IF_ENTRIES = Bound(64, "what-if sizes or rates: each multiplies the predictions of every configuration")

# Work of one job.
BATCH_SIZE = Bound(1 << 16, "samples per worker and step")
STEPS = Bound(10**9, "iterations per job (a plan's time is checked against the timeouts at start)")
EPOCHS = Bound(10**6, "epochs per job (a plan's time is checked against the timeouts at start)")
SAMPLES = Bound(10**8, "samples of a generated data set (its bytes are bounded by memory too)")
INPUT_DIM = Bound(1 << 15, "each of C, H and W (or a sequence's length)")
SAMPLE_ELEMENTS = Bound(1 << 28, "values in one input sample (1 GiB of float32)")
NUM_CLASSES = Bound(1 << 20, "classes of a classifier's output layer")
THREADS = Bound(256, "torch threads per process")
BUCKET_MB = Bound(1 << 16, "DDP bucket size in MB")
DEVICE_MEMORY_BYTES = Bound(1 << 50, "the stated memory of one device or node (1 PiB): a capacity compared, "
                            "never allocated")
CHECKPOINTS_KEPT = Bound(100, "complete checkpoints kept on disk")
SEED = Bound(2**63 - 1, "torch's generator seed")

# Measuring.
REPEATS = Bound(10_000, "timed iterations or operations of a profile or microbenchmark, and warm-up iterations")
MESSAGE_BYTES = Bound(1 << 30, "one microbenchmark message (every rank holds a few of them)")
MESSAGE_SIZES = Bound(64, "message sizes of one microbenchmark")
SIZE_FACTOR = Bound(1024, "the largest message against the largest model's parameter bytes")

# Time.
OP_TIMEOUT_S = Bound(86_400.0, "one blocking operation, or one profile or microbenchmark job: a day")
JOB_TIMEOUT_S = Bound(7 * 86_400.0, "one training job, or a SLURM allocation's wait in the queue: a week")
LEASE_S = Bound(30 * 86_400.0, "an emulated cluster's lease: a month")
POLL_S = Bound(60.0, "seconds between a provider's polls of a job")
BUDGET_S = Bound(86_400.0, "a microbenchmark's wire-time budget")

# One rank on the host that launches it: a Python process with torch and gloo.
RANK_RESIDENT_BYTES = 256 * MIB


@cache
def memory_bytes() -> int:
    """This host's memory: what the bounds derived from the machine rest on."""
    return psutil.virtual_memory().total


@cache
def cores() -> int:
    return os.cpu_count() or 1


def ranks_per_host() -> Bound:
    """Ranks one host may run at once (the local provider's job, an emulated cluster's)."""
    return Bound(max(2, memory_bytes() // RANK_RESIDENT_BYTES),
                 f"ranks on one host: each is a process of about {RANK_RESIDENT_BYTES // MIB} MiB, "
                 f"and this host has {memory_bytes() / 2**30:.0f} GiB")


def data_bytes() -> Bound:
    """Bytes a generated data set may take in one process (every rank of a host holds its own copy)."""
    return Bound(memory_bytes() // 8, f"a generated data set: an eighth of this host's "
                                      f"{memory_bytes() / 2**30:.0f} GiB")


def at_most(value: int | float, bound: Bound, field: str) -> str | None:
    """Why `value` exceeds `bound`, as the end of an error line naming `field`; None within it."""
    if value > bound.limit:
        return f"{field}: {value:,} is above the bound of {bound.limit:,} ({bound.reason})"
    return None
