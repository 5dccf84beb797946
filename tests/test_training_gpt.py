"""The GPT workload trained as real torchrun jobs on gloo (1 thread a rank), against
single-process references, on the text datasets; and its block profile.

Tolerance: parameters agree to 1e-5 (absolute); the only differences are float summation
order (allreduce vs one process's batch sum).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

from modelling.measure.profiler import profile_layers
from tests.trainjobs import Reference, max_diff, run_job
from training.gpt_shape import resolve_shape
from training.text import TokenSource, corpus_fingerprint, load_text, markov_chain, stdlib_corpus

pytestmark = pytest.mark.slow

TOL = 1e-5
GPT = {"model": "gpt-tiny", "dataset": "markov", "seq_len": 16, "lr": 0.1}


def reference(workers: int, batch_size: int, steps: int, **opts) -> dict[str, torch.Tensor]:
    """SSGD's update in one process at batch N*b, on the same global batches."""
    ref = Reference(workers=1, batch_size=workers * batch_size, **(GPT | opts))
    model, cfg = ref.model(), ref.cfg
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for t in range(steps):
        for p, g in zip(model.parameters(), ref.grads(model, t, 0), strict=True):
            p.grad = g
        opt.step()
    return model.state_dict()


def test_one_worker_equals_a_single_process_step(tmp_path: Path) -> None:
    summary, params = run_job(tmp_path, workers=1, batch_size=8, steps=3, **GPT)
    assert summary["status"] == "completed"
    assert max_diff(params, reference(1, 8, 3)) < TOL


@pytest.mark.parametrize("comm", ["allreduce", "ps"])
def test_two_workers_at_b_equal_one_process_at_2b(tmp_path: Path, comm: str) -> None:
    servers = 1 if comm == "ps" else 0
    summary, params = run_job(tmp_path, workers=2, servers=servers, comm=comm, batch_size=4, steps=4, **GPT)
    assert summary["global_batch_size"] == 8
    assert max_diff(params, reference(2, 4, 4)) < TOL


ALGORITHMS = [
    {"algorithm": "ssgd", "comm": "ps", "servers": 1},
    {"algorithm": "asgd", "servers": 1},
    {"algorithm": "odsgd", "servers": 1},
    {"algorithm": "odsgd", "servers": 1, "compensation": "dc", "warmup_steps": 1},
]


@pytest.mark.parametrize("opts", ALGORITHMS, ids=lambda o: f"{o['algorithm']}-{o.get('compensation', 'none')}")
def test_every_algorithm_trains_the_gpt(tmp_path: Path, opts: dict) -> None:
    summary, _ = run_job(tmp_path, workers=2, batch_size=4, steps=5, peak_flops=1e10,
                         **(GPT | {"dataset": "stdlib-text"} | opts))
    assert summary["status"] == "completed" and math.isfinite(summary["final_test_loss"])
    lm = summary["language_model"]
    assert (lm["n_layer"], lm["d_model"], lm["n_head"], lm["seq_len"], lm["vocab_size"]) == (2, 32, 2, 16, 256)
    assert summary["throughput_tokens_per_s"] == pytest.approx(summary["throughput_samples_per_s"] * 16)
    expected_mfu = lm["flops_per_token"] * summary["throughput_tokens_per_s"] / (1e10 * 2)
    assert summary["mfu"] == pytest.approx(expected_mfu)
    assert summary["peak_flops"] == {"flops_per_s": 1e10, "source": "option"}
    assert summary["final_perplexity"] == pytest.approx(math.exp(summary["final_test_loss"]))


def test_loss_on_the_markov_source_falls_below_its_unigram_entropy(tmp_path: Path) -> None:
    """Below the unigram entropy only a model that reads the context gets; never below the
    chain's entropy rate (the best any predictor does), within the test split's noise."""
    chain = markov_chain()
    summary, _ = run_job(tmp_path, workers=2, batch_size=16, steps=300, eval_every=100, measure_warmup=5,
                         target_loss=chain.unigram_entropy, **(GPT | {"seq_len": 32, "lr": 0.3}))
    loss = summary["final_test_loss"]
    assert chain.entropy_rate - 0.05 < loss < chain.unigram_entropy - 0.05, (loss, chain)
    assert summary["target_reached"] is True and 0 < summary["steps_to_loss"] <= 300
    assert summary["mfu"] > 0 and summary["peak_flops"]["source"] == "gemm"


def test_the_markov_chain_states_its_optimal_loss() -> None:
    """The chain's own next-token loss on a sample is its entropy rate (within 4 standard
    errors), and the sample's token frequencies give its unigram entropy."""
    chain = markov_chain()
    seq = chain.sample(512, 65, torch.Generator().manual_seed(5))
    state = seq[:, 0] * chain.vocab + seq[:, 1]
    nll = []
    for t in range(2, seq.shape[1]):
        nll.append(-chain.probs[state, seq[:, t]].log())
        state = (state * chain.vocab + seq[:, t]) % chain.vocab**2
    nll = torch.cat(nll).double()
    se = nll.std().item() / math.sqrt(len(nll))
    assert abs(nll.mean().item() - chain.entropy_rate) < 4 * se
    freq = torch.bincount(seq.flatten(), minlength=chain.vocab).double() / seq.numel()
    assert -(freq * freq.log()).sum().item() == pytest.approx(chain.unigram_entropy, abs=0.02)
    assert chain.entropy_rate < chain.unigram_entropy - 1.0


def test_stdlib_text_is_split_by_file_and_fingerprinted() -> None:
    train, test, digest = stdlib_corpus()
    fp = corpus_fingerprint("stdlib-text")
    assert fp["sha256"] == digest and fp["bytes"] == len(train) + len(test) and fp["files"] > 100
    assert 0.03 < len(test) / (len(train) + len(test)) < 0.3
    assert b"def " in train and b"def " in test

    class Cfg:
        dataset, synthetic_samples = "stdlib-text", 16

    tr, te = load_text(Cfg, 64)
    assert isinstance(tr, TokenSource) and len(te) == 256 and tr.tokens == len(tr) * 64
    x, y = tr.batch(torch.tensor([0, 5]))
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (2, 64) and int(x.max()) < 256


def test_the_block_profile_adds_up_to_a_whole_pass() -> None:
    """One row per block (embedding, each transformer block, head) with its parameter bytes;
    the per-block medians, before the profiler scales them, add up to within 10% of the
    median whole forward+backward pass."""
    table = profile_layers("gpt-mini", 4, dataset="stdlib-text", warmup=2, repeats=11)
    rows = table["layers"]
    assert [r["name"] for r in rows] == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    shape = resolve_shape("gpt-mini", {}, 256)
    d = shape.d_model
    assert rows[0]["param_bytes"] == 4 * (shape.vocab_size + shape.context) * d
    assert all(r["param_bytes"] == 4 * (12 * d * d + 13 * d) for r in rows[1:-1])
    assert rows[-1]["param_bytes"] == 4 * 2 * d
    assert sum(r["param_bytes"] for r in rows) == 4 * shape.parameters()
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 for r in rows)
    assert 1 / 1.1 < table["layer_time_scale"] < 1.1, table["layer_time_scale"]
    assert statistics.median(table["iteration_samples_s"]) > sum(r["fwd_s"] + r["bwd_s"] for r in rows)
