"""The checks before launch (`pipelines.launch.prepare`): a model is built on the meta device
and run forward at the run's per-worker batch, so what trains is accepted and what cannot
train is refused with one line naming the field; a GPT's options are checked the same way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.launch import prepare
from training.config import ConfigError


def _refusal(values: dict) -> str:
    with pytest.raises(ConfigError) as err:
        prepare({"steps": 1, "workers": 1} | values, "test")
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# torchvision classifiers with batch norm after global pooling: they train at 2 samples and up.
@pytest.mark.parametrize("model", ["mobilenet_v3_small", "shufflenet_v2_x0_5"])
@settings(max_examples=4, deadline=None)
@given(batch=st.integers(2, 64))
def test_a_model_with_batch_norm_after_pooling_is_accepted_at_cifar_shape(model: str, batch: int) -> None:
    import torch

    from training.models import build_model

    prepare({"model": model, "dataset": "synthetic", "input_shape": (3, 32, 32), "batch_size": batch,
             "steps": 1, "workers": 2}, "test")
    # Accepted on the meta device; what acceptance promises, checked apart from it: a real
    # training step at that batch gives a finite loss and a gradient in every trainable tensor.
    torch.manual_seed(batch)
    net = build_model(model, (3, 32, 32), 10).train()
    loss = torch.nn.functional.cross_entropy(net(torch.randn(batch, 3, 32, 32)), torch.randint(0, 10, (batch,)))
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def test_one_sample_per_worker_is_refused_naming_the_batch() -> None:
    message = _refusal({"model": "mobilenet_v3_small", "dataset": "synthetic", "input_shape": (3, 32, 32),
                        "batch_size": 1})
    assert message.startswith("test.batch_size: mobilenet_v3_small cannot train on 1 sample per worker")


def test_an_input_no_batch_makes_trainable_is_refused_naming_the_shape() -> None:
    """alexnet's pooling leaves nothing of a 16x16 input, at any batch."""
    for batch in (1, 64):
        message = _refusal({"model": "alexnet", "dataset": "synthetic", "input_shape": (3, 16, 16),
                            "batch_size": batch})
        assert message.startswith("test.input_shape: alexnet cannot take inputs of shape (3, 16, 16)")


BAD_GPT = [
    ({"d_model": 30, "n_head": 4}, "test.d_model: 30 is not divisible by n_head=4"),
    ({"seq_len": 65}, "test.seq_len: 65 is over gpt-tiny's context of 64 positions"),
    ({"vocab_size": 100}, "test.vocab_size: 100 is smaller than the corpus's 256 token ids"),
    ({"n_layer": 0}, "test.n_layer: Input should be greater than or equal to 1 (got 0)"),
    ({"input_shape": (3, 32, 32)}, "test.input_shape: a GPT takes token sequences (1, 1, seq_len)"),
    ({"dataset": "digits"}, "test.dataset: gpt-tiny is a language model; train it on stdlib-text, markov"),
]


@pytest.mark.parametrize(("options", "message"), BAD_GPT, ids=[m.split(":")[0] for _, m in BAD_GPT])
def test_bad_gpt_options_fail_at_load_naming_the_field(options: dict, message: str) -> None:
    assert _refusal({"model": "gpt-tiny", "dataset": "stdlib-text"} | options).startswith(message)


def test_gpt_options_on_a_classifier_and_a_classifier_on_text_are_refused() -> None:
    assert _refusal({"model": "mlp", "dataset": "digits", "n_head": 2}).startswith(
        "test.n_head: only a GPT model (gpt-tiny, gpt-mini, gpt2-small) takes it, not mlp")
    assert _refusal({"model": "mlp", "dataset": "markov"}).startswith("test.dataset: markov holds token sequences")


def test_markov_vocabulary_is_the_corpus_of_the_check() -> None:
    """markov has 16 token ids: 16 is enough there, 8 is not."""
    assert prepare({"model": "gpt-tiny", "dataset": "markov", "vocab_size": 16, "steps": 1}, "test").vocab_size == 16
    assert _refusal({"model": "gpt-tiny", "dataset": "markov", "vocab_size": 8}).startswith(
        "test.vocab_size: 8 is smaller than the corpus's 16 token ids")


SPEC_WRONG = [
    ('[{"model": "gpt-tiny", "dataset": "stdlib-text"}, '
     '{"model": "gpt-tiny", "dataset": "stdlib-text", "d_model": 30, "n_head": 4}]',
     "grid[gpt-tiny-d30-h4-ssgd-allreduce-w2-b32-r0].d_model: 30 is not divisible by n_head=4"),
    ('[{"model": "gpt-tiny", "dataset": "stdlib-text", "seq_len": 100}]',
     "grid[gpt-tiny-T100-ssgd-allreduce-w2-b32-r0].seq_len: 100 is over gpt-tiny's context of 64"),
]


@pytest.mark.parametrize(("workloads", "message"), SPEC_WRONG, ids=["d_model", "seq_len"])
def test_a_spec_with_bad_gpt_options_fails_before_anything_starts(tmp_path, workloads: str, message: str) -> None:
    """Every workload's options are checked, also a second workload of the same model."""
    from pathlib import Path

    from click.testing import CliRunner

    from pipelines.cli import cli

    home = tmp_path / "home"
    home.mkdir()
    smoke = Path(__file__).resolve().parent.parent / "specs" / "smoke.yaml"
    out = CliRunner(env={"MLFLOW_TRACKING_URI": None}).invoke(
        cli, ["run", str(smoke), "--home", str(home), "--set", f"workloads={workloads}"])
    assert out.exit_code == 2, out.output
    assert message in out.output and "Traceback" not in out.output
    assert list(home.iterdir()) == []


@settings(max_examples=10, deadline=None)
@given(depth=st.integers(1, 5), width=st.integers(1, 64), shape=st.sampled_from([(1, 8, 8), (3, 5, 7)]))
def test_the_mlp_takes_its_depth_and_width(depth: int, width: int, shape: tuple[int, int, int]) -> None:
    from training.models import build_model

    cfg = prepare({"model": "mlp", "dataset": "synthetic", "input_shape": shape, "n_layer": depth, "d_model": width,
                   "steps": 1, "workers": 1}, "test")
    net = build_model(cfg.model, shape, 10, cfg.model_options)
    n_in = shape[0] * shape[1] * shape[2]
    # weights and biases: input to width, depth - 1 of width to width, width to the classes
    assert sum(p.numel() for p in net.parameters()) == \
        (n_in + 1) * width + (depth - 1) * (width + 1) * width + (width + 1) * 10
