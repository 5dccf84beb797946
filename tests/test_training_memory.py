"""Memory counting on one process (training/measure/memory.py): the state tensors and the activations
saved for backward, against figures worked out by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from training.measure.memory import HeldState, MemoryMeter, optimizer_tensors, summarise

IN, H1, H2, OUT, BATCH = 12, 32, 16, 5, 8
F32, I64 = 4, 8


def test_an_mlps_state_and_saved_activations_are_the_hand_worked_bytes() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(IN, H1), nn.ReLU(), nn.Linear(H1, H2), nn.ReLU(), nn.Linear(H2, OUT))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def held() -> HeldState:
        return HeldState(parameters=list(net.parameters()), gradients=[p.grad for p in net.parameters()],
                         optimizer=optimizer_tensors(opt), buffers=list(net.buffers()))

    meter = MemoryMeter(torch.device("cpu"), held, every=1, warmup=0)
    x, y = torch.randn(BATCH, IN), torch.randint(0, OUT, (BATCH,))
    with meter.forward(0, 1):
        loss = F.cross_entropy(net(x), y)
    loss.backward()
    meter.collect()
    opt.step()  # the momentum buffers: made by the first step, seen by result()'s last look
    figures = meter.result(0, "worker")

    weights = (IN * H1 + H1) + (H1 * H2 + H2) + (H2 * OUT + OUT)
    # Saved for backward: the first Linear's input x (its weight's gradient; x needs none, so its
    # weight is not saved); each ReLU's output, which the next Linear saves too (one storage);
    # the later Linears' weights (views of parameters: not activations); log_softmax's output,
    # saved by itself and by nll_loss; nll_loss's int64 target and its scalar total weight.
    saved = F32 * BATCH * (IN + H1 + H2 + OUT) + I64 * BATCH + F32
    assert figures["breakdown"] == {"parameters": F32 * weights, "gradients": F32 * weights,
                                    "optimizer": F32 * weights, "activations": saved, "buffers": 0}
    assert figures["peak_bytes"] == 3 * F32 * weights + saved
    assert figures["reserved_bytes"] is None
    assert figures["peak_rss_bytes"] >= figures["peak_bytes"]


def test_a_storage_counts_once_in_the_first_category_naming_it() -> None:
    flat = torch.zeros(100)
    other = torch.zeros(10)
    held = HeldState(parameters=[flat[:60].view(6, 10)], gradients=[None, flat[60:]],
                     buffers=[flat, other, other[5:]], opaque_buffer_bytes=7)
    counts, storages = held.count()
    assert counts == {"parameters": 400, "gradients": 0, "optimizer": 0, "buffers": 40 + 7}
    assert len(storages) == 2


def test_the_summary_takes_the_largest_ranks_figures_and_lists_every_rank() -> None:
    def rank(k: int, role: str, peak: int) -> dict:
        return {"rank": k, "role": role, "peak_bytes": peak, "peak_rss_bytes": 10 * peak, "reserved_bytes": None,
                "breakdown": {"parameters": peak}}

    memory = summarise([rank(2, "server", 30), rank(0, "worker", 50), rank(1, "worker", 40)])
    assert (memory["peak_bytes"], memory["peak_rss_bytes"], memory["breakdown"]) == (50, 500, {"parameters": 50})
    assert memory["reserved_bytes"] is None
    assert [(r["rank"], r["role"]) for r in memory["ranks"]] == [(0, "worker"), (1, "worker"), (2, "server")]
    assert set(memory["ranks"][0]) == {"rank", "role", "peak_bytes", "peak_rss_bytes", "breakdown"}


def test_a_models_own_memory_is_its_state_and_saved_bytes_fixed_plus_per_sample() -> None:
    """The profile's `memory` section (modelling/memory.py predicts from it), on the same MLP."""
    from training.measure.memory import model_memory

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(IN, H1), nn.ReLU(), nn.Linear(H1, H2), nn.BatchNorm1d(H2), nn.Linear(H2, OUT))
    weights = (IN * H1 + H1) + (H1 * H2 + H2) + 2 * H2 + (H2 * OUT + OUT)

    def batch_of(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, IN), torch.randint(0, OUT, (n,))

    mem = model_memory(net, batch_of, BATCH)
    assert mem["parameter_bytes"] == mem["gradient_bytes"] == F32 * weights
    assert mem["trainable_numel"] == weights
    # BatchNorm's running mean and variance (float32) and its int64 count of batches.
    assert mem["buffer_bytes"] == F32 * 2 * H2 + I64
    act = mem["activations"]
    assert act["batches"] == [BATCH // 2, BATCH]
    # A sample's saved bytes: the first Linear's input, the ReLU's output (the next Linear's
    # input), the second Linear's output (BatchNorm's input), BatchNorm's output (the last
    # Linear's input), log_softmax's output and the int64 target; BatchNorm's saved batch mean
    # and inverse deviation and nll_loss's total weight do not grow with the batch.
    assert act["per_sample_bytes"] == F32 * (IN + H1 + H2 + H2 + OUT) + I64
    assert act["fixed_bytes"] == F32 * 2 * H2 + F32
    assert act["saved_bytes"] == [act["fixed_bytes"] + act["per_sample_bytes"] * n for n in act["batches"]]


SIZED = [("lenet5", (1, 28, 28), None), ("mlp", (1, 8, 8), None), ("resnet20", (3, 32, 32), None),
         ("shufflenet_v2_x0_5", (3, 32, 32), None),
         ("gpt-tiny", (1, 1, 16), {"n_layer": 2, "d_model": 24, "n_head": 2, "seq_len": 16})]


def _saved_at(memory: dict, batch: int) -> float:
    return memory["activations"]["fixed_bytes"] + memory["activations"]["per_sample_bytes"] * batch


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(SIZED), batch=st.integers(4, 40))  # half of it: batch norm needs 2
def test_a_model_sized_before_it_runs_is_sized_as_its_real_forward_at_the_batch(model, batch: int) -> None:
    """The preflight's figures, from a few real samples (small models) and from fake tensors (no
    memory, no time), are the ones a real forward at the run's batch counts."""
    from training.measure.memory import fake_memory, model_memory, size_memory
    from training.models import build_model, example_input

    name, shape, options = model
    torch.manual_seed(0)
    net = build_model(name, shape, 10, options)
    real = model_memory(net, lambda n: (example_input(name, shape, n), None), batch)
    for sized in (size_memory(name, shape, 10, batch, options), fake_memory(name, shape, 10, batch, options)):
        assert {k: v for k, v in sized.items() if k != "activations"} == \
            {k: v for k, v in real.items() if k != "activations"}
        assert _saved_at(sized, batch) == pytest.approx(real["activations"]["saved_bytes"][-1], rel=1e-12)
