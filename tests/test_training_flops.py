"""The preflight's least step time (training/flops.py): its operation count on a few real
samples is torch's FlopCounterMode's count on the meta device at the run's batch, and sizing a
small model imports no compiler stack (the reason the count is not FlopCounterMode's own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from training.flops import FlopCount, forward_flops
from training.models import build_model, example_input, sizing_model

REPO = Path(__file__).resolve().parent.parent

MODELS = st.one_of(
    st.sampled_from([("lenet5", (1, 28, 28), None), ("mlp", (1, 28, 28), None), ("resnet20", (3, 32, 32), None),
                     ("mobilenet_v3_small", (3, 32, 32), None), ("shufflenet_v2_x0_5", (3, 32, 32), None),
                     ("squeezenet1_1", (3, 64, 64), None)]),
    st.builds(lambda layers, heads, width, seq: ("gpt-mini", (1, 1, seq), {"n_layer": layers, "n_head": heads,
                                                                          "d_model": heads * width, "seq_len": seq}),
              st.integers(1, 3), st.integers(1, 4), st.sampled_from([8, 16]), st.sampled_from([8, 32, 64])))


def _torch_count(name: str, shape: tuple[int, int, int], options: dict | None, batch: int) -> int:
    with torch.device("meta"):
        model = build_model(name, shape, 10, options)
        x = example_input(name, shape, batch)
        with FlopCounterMode(display=False) as counter:
            model(x)
    return counter.get_total_flops()


@settings(max_examples=15, deadline=None)
@given(model=MODELS, batch=st.integers(1, 64))
def test_the_count_on_a_few_real_samples_is_torchs_count_at_the_batch(model, batch: int) -> None:
    name, shape, options = model
    with sizing_model(name, shape, 10, options) as small:
        assert small is not None  # every model drawn is sized on real samples
    assert forward_flops(name, shape, 10, batch, options) == _torch_count(name, shape, options, batch)


def test_a_large_model_is_counted_on_the_meta_device_as_torch_counts_it() -> None:
    with sizing_model("vit_b_16", (3, 224, 224), 10) as small:
        assert small is None
    assert forward_flops("vit_b_16", (3, 224, 224), 10, 3) == _torch_count("vit_b_16", (3, 224, 224), None, 3)


def test_a_composite_calls_matmuls_the_function_count_does_not_see() -> None:
    """Multi-head attention is one function to a function mode: what `sizing_model` gives never
    holds one (the family above), and a model that does is counted by FlopCounterMode."""
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.zeros(2, 5, 8)
    with FlopCount() as count:
        attention(x, x, x)
    with FlopCounterMode(display=False) as counter:
        attention(x, x, x)
    assert count.total == 0 < counter.get_total_flops()


def test_sizing_a_small_model_before_it_runs_imports_no_compiler_stack() -> None:
    code = ("import sys\nfrom training.flops import forward_flops\nfrom training.measure.memory import size_memory\n"
            "assert forward_flops('lenet5', (1, 28, 28), 10, 32) > 0\n"
            "assert size_memory('gpt-mini', (1, 1, 64), 256, 8)['parameter_bytes'] > 0\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
