"""Predicted memory (issue 50, modelling/memory.py): against the breakdown worked by hand for
every algorithm, and against what real jobs count on each rank, for a family of models, batches,
algorithms, workers and shards."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelling.measure.profiler import profile_memory
from modelling.memory import predict_memory
from modelling.scenario import Scenario
from tests.trainjobs import run_job

P, B, N, A0, A1 = 4000, 96, 1000, 64, 700  # bytes: parameters, buffers; numel; saved: fixed, per sample
MEMORY = {"parameter_bytes": P, "gradient_bytes": P, "trainable_numel": N, "buffer_bytes": B,
          "activations": {"fixed_bytes": A0, "per_sample_bytes": A1}}


@given(algorithm=st.sampled_from(["ssgd-allreduce", "ssgd-ps", "asgd", "odsgd"]), workers=st.integers(1, 1024),
       servers=st.integers(1, 64), batch=st.integers(1, 4096), momentum=st.sampled_from([0.0, 0.9]),
       overlap=st.booleans())
def test_each_ranks_breakdown_is_the_hand_worked_one(algorithm: str, workers: int, servers: int, batch: int,
                                                      momentum: float, overlap: bool) -> None:
    name, _, comm = algorithm.partition("-")
    s = Scenario.of("scenario", algorithm=name, comm=comm or "ps", workers=workers, servers=servers,
                    overlap=overlap, batch_size=batch, momentum=momentum)
    got = predict_memory({"batch_size": 32, "memory": MEMORY}, s)
    act = A0 + A1 * batch
    m = P if momentum else 0
    shard = 4 * math.ceil(N / servers)
    if algorithm == "ssgd-allreduce":
        worker = {"parameters": P, "gradients": P, "optimizer": m, "activations": act,
                  "buffers": B + (P if overlap and workers > 1 else 0)}
        server = None
    else:
        slots = 2 if name == "odsgd" else 1
        worker = {"parameters": P, "gradients": P, "optimizer": m if name == "odsgd" else 0,
                  "activations": act, "buffers": B + 2 * slots * 4 * N}
        server = {"parameters": shard, "gradients": shard, "optimizer": shard if momentum else 0,
                  "activations": 0, "buffers": 0 if name == "asgd" else (workers - 1) * shard}
    expected = [("worker", worker)] + ([("server", server)] if server else [])
    assert [(r["role"], r["breakdown"]) for r in got["memory_ranks"]] == expected
    peaks = {role: sum(b.values()) for role, b in expected}
    assert got["memory_bytes"] == max(peaks.values())
    assert got["memory_breakdown"] == dict(expected)[max(peaks, key=peaks.get)]


def test_the_predicted_categories_are_the_measured_ones() -> None:
    from modelling import memory as predicted
    from training.measure import memory as measured

    assert predicted.CATEGORIES == measured.CATEGORIES


def test_a_profile_from_before_memory_was_measured_predicts_none() -> None:
    got = predict_memory({"batch_size": 8}, Scenario.of("scenario"))
    assert got == {"memory_bytes": None, "memory_breakdown": None, "memory_ranks": None}


def test_a_node_holds_the_sum_of_its_ranks_and_a_gpu_one_workers() -> None:
    from modelling.memory import node_bytes

    ranks = [{"role": "worker", "peak_bytes": 10}, {"role": "server", "peak_bytes": 7}]
    s = Scenario.of("scenario", algorithm="ssgd", comm="ps", workers=3, servers=2, node_of_rank=(0, 0, 1, 1, 1))
    assert node_bytes(ranks, s, "cpu") == max(10 + 10, 10 + 7 + 7)
    assert node_bytes(ranks, s, "cuda") == 10
    assert node_bytes(ranks, s.model_copy(update={"node_of_rank": None}), "cpu") == 10  # one like it, large enough


@given(capacity=st.integers(1, 10**8), workers=st.integers(1, 8),
       algorithm=st.sampled_from(["ssgd-allreduce", "ssgd-ps", "asgd", "odsgd"]))
def test_the_largest_batch_fits_and_one_more_does_not(capacity: int, workers: int, algorithm: str) -> None:
    from modelling.memory import largest_batch, node_bytes

    name, _, comm = algorithm.partition("-")
    servers = 0 if comm == "allreduce" else 1
    s = Scenario.of("scenario", algorithm=name, comm=comm or "ps", workers=workers, servers=servers,
                    node_of_rank=(0,) * (workers + servers))
    layers = {"batch_size": 32, "memory": MEMORY}

    def need(batch: int) -> int:
        return node_bytes(predict_memory(layers, s.model_copy(update={"batch_size": batch}))["memory_ranks"], s, "cpu")

    most = 10**6
    got = largest_batch(layers, s, "cpu", capacity, most)
    assert got is not None and 0 <= got <= most
    if got == 0:
        assert need(1) > capacity
    else:
        assert need(got) <= capacity and (got == most or need(got + 1) > capacity)
    assert largest_batch({"batch_size": 32}, s, "cpu", capacity, most) is None


JOBS = st.one_of(
    st.builds(dict, model=st.just("lenet5"), dataset=st.just("digits")),
    st.builds(dict, model=st.just("resnet20"), dataset=st.just("synthetic"), synthetic_samples=st.just(64)),
    st.builds(lambda depth, width: {"model": "mlp", "dataset": "digits", "n_layer": depth, "d_model": width},
              st.integers(1, 4), st.integers(1, 300)),
    st.builds(lambda n, h, w, q: {"model": "gpt-tiny", "dataset": "markov", "n_layer": n, "n_head": h,
                                  "d_model": h * w, "seq_len": q},
              st.integers(1, 3), st.integers(1, 4), st.integers(4, 24), st.integers(4, 48)),
)
ALGORITHMS = st.sampled_from([("ssgd", "allreduce"), ("ssgd", "ps"), ("asgd", "ps"), ("odsgd", "ps")])


def _own_memory(job: dict[str, Any]) -> dict[str, Any]:
    """The profile's `memory` section of a job's model, measured in this process."""
    from training.config import build_config
    from training.shape import resolve_input_shape

    cfg = build_config(job | {"steps": 1, "workers": 1, "servers": 0, "comm": "allreduce", "algorithm": "ssgd"}, "t")
    return profile_memory(cfg.model, cfg.batch_size, resolve_input_shape(cfg), cfg.dataset, 10, cfg.model_options)


@pytest.mark.slow
@settings(max_examples=8, suppress_health_check=[HealthCheck.too_slow])
@given(job=JOBS, algorithm=ALGORITHMS, workers=st.integers(1, 2), servers=st.integers(1, 2),
       batch=st.integers(1, 24), momentum=st.sampled_from([0.0, 0.9]))
def test_predicted_peaks_are_within_5pct_of_each_ranks_measured(job: dict[str, Any], algorithm: tuple[str, str],
                                                                 workers: int, servers: int, batch: int,
                                                                 momentum: float) -> None:
    name, comm = algorithm
    job = job | {"algorithm": name, "comm": comm, "workers": workers, "batch_size": batch, "momentum": momentum,
                 "steps": 6, "threads": 1} | ({"servers": servers} if comm == "ps" else {})
    with tempfile.TemporaryDirectory() as tmp:
        summary, _ = run_job(Path(tmp) / "run", **job)
    predicted = predict_memory({"batch_size": batch, "memory": _own_memory(job)}, Scenario.from_summary(summary))
    by_role = {r["role"]: r for r in predicted["memory_ranks"]}
    for rank in summary["memory"]["ranks"]:
        want = by_role[rank["role"]]
        assert want["peak_bytes"] == pytest.approx(rank["peak_bytes"], rel=0.05), (rank, want)
        for category, measured in rank["breakdown"].items():
            assert want["breakdown"][category] == pytest.approx(measured, rel=0.05, abs=0.01 * rank["peak_bytes"]), \
                (category, rank, want)


def _gpt2_small_on_a_gpu() -> dict[str, Any]:
    """A layer table of made-up times with gpt2-small's memory, sized on the meta device."""
    from tests.test_modelling_predict import TOY
    from training.measure.memory import fake_memory

    memory = fake_memory("gpt2-small", (1, 1, 1024), 50257, 4)
    assert memory is not None
    return TOY | {"device": "cuda", "batch_size": 4, "memory": memory}


EIGHT_GB = 8 * 10**9


@pytest.mark.parametrize("algorithm, comm", [("ssgd", "allreduce"), ("ssgd", "ps"), ("asgd", "ps"), ("odsgd", "ps")])
def test_gpt2_small_to_1024_workers_on_8gb_gpus_fits_where_its_worker_does(algorithm: str, comm: str) -> None:
    """Each worker on a GPU of its own: a world fits where one worker's bytes do, whatever its
    size, and a row that does not fit has no time."""
    from modelling.predict import predict
    from tests.test_modelling_predict import COMM

    layers = _gpt2_small_on_a_gpu()
    sizes = [1, 2, 64, 1024]
    for batch in (1, 2, 8):
        rows = predict(layers, COMM, algorithm=algorithm, comm_mode=comm, batch_size=batch, workers=sizes,
                       strict=False, capacity_bytes=EIGHT_GB)
        for row in rows:
            worker = row["memory_ranks"][0]
            assert worker["role"] == "worker"
            if worker["peak_bytes"] > EIGHT_GB:
                assert row["iter_time_s"] is None and row["throughput_samples_per_s"] is None, row
                assert row["no_prediction"].startswith("does not fit: ") and row["no_prediction"].endswith("> 8 GB")
            else:
                assert row["iter_time_s"] > 0 and row["no_prediction"] is None, row
    # gpt2-small's 124M parameters and its activations at a sequence of 1024: one sample a worker
    # fits in 8 GB, eight do not.
    fits = predict(layers, COMM, algorithm=algorithm, comm_mode=comm, batch_size=1, workers=[1024], strict=False,
                   capacity_bytes=EIGHT_GB)
    assert fits[0]["iter_time_s"] is not None
    too_big = predict(layers, COMM, algorithm=algorithm, comm_mode=comm, batch_size=8, workers=[1024], strict=False,
                      capacity_bytes=EIGHT_GB)
    assert too_big[0]["iter_time_s"] is None


def test_ddlbench_predict_says_does_not_fit_under_memory(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from pipelines.cli import cli
    from tests.test_modelling_predict import COMM

    (tmp_path / "layers.json").write_text(json.dumps(_gpt2_small_on_a_gpu() | {"model": "gpt2-small"}))
    (tmp_path / "comm.json").write_text(json.dumps(COMM))
    args = ["predict", "--layers", str(tmp_path / "layers.json"), "--comm", str(tmp_path / "comm.json"),
            "--algorithm", "ssgd", "--workers", "1024", "--batch-size", "8", "--memory", "8gb"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "gpt2-small: ssgd over allreduce, 1024 workers: does not fit: " in out.output, out.output
    assert out.output.rstrip().endswith(" > 8 GB"), out.output
    wrong = CliRunner().invoke(cli, [*args[:-1], "plenty"])
    assert wrong.exit_code != 0 and "--memory: not a size, got 'plenty'" in wrong.output
