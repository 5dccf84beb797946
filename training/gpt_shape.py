"""A GPT's dimensions, presets and option checks: no torch, so the spec, the CLI and the
onboarding form can read them without importing it (training/gpt.py builds the model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPTShape:
    """The dimensions of one GPT."""

    n_layer: int
    d_model: int
    n_head: int
    context: int  # the longest sequence the position embedding covers
    seq_len: int  # the training sequence length, at most `context`
    vocab_size: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def parameters(self) -> int:
        """All parameters (the head is tied to the token embedding)."""
        d = self.d_model
        block = 12 * d * d + 13 * d  # qkv, proj, fc, out weights and biases; two layer norms
        return self.vocab_size * d + self.context * d + self.n_layer * block + 2 * d

    def flops_per_token(self) -> int:
        """Training FLOPs per token, as PaLM's MFU counts them (Chowdhery et al. 2022, app. B):
        6 N for the matmuls of forward and backward, N the parameters without the position
        embedding (a lookup; the tied token embedding is a matmul as the head), plus
        12 n_layer d_model seq_len for the attention scores and their weighted sums
        (QK^T and AV, forward and backward, causal mask not discounted)."""
        n = self.parameters() - self.context * self.d_model
        return 6 * n + 12 * self.n_layer * self.d_model * self.seq_len


# name: (n_layer, d_model, n_head, context)
_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "gpt-tiny": (2, 32, 2, 64),  # tests: a step takes milliseconds
    "gpt-mini": (4, 128, 4, 128),  # trains in minutes on 2 CPU cores
    "gpt2-small": (12, 768, 12, 1024),  # GPT-2 small's shape (Radford et al. 2019)
}
# The presets, in the order the onboarding form lists them.
GPT_PRESETS: tuple[str, ...] = tuple(_PRESETS)
# The options of a GPT workload (TrainConfig fields and spec workload fields).
GPT_OPTIONS: tuple[str, ...] = ("n_layer", "d_model", "n_head", "seq_len", "vocab_size")
# The ones ddlbench's own models take besides (training/models.py): the mlp's depth and width.
OWN_OPTIONS: dict[str, tuple[str, ...]] = {"mlp": ("n_layer", "d_model")}


def is_gpt(name: str) -> bool:
    return name in _PRESETS


def preset_seq_len(name: str) -> int:
    """The sequence length a preset trains on by default: its context."""
    return _PRESETS[name][3]


def resolve_shape(name: str, options: Mapping[str, int | None], corpus_vocab: int | None) -> GPTShape:
    """The preset `name` with `options` (None: the preset's, the vocabulary the corpus's).

    ValueError naming the option: d_model not divisible by n_head, seq_len over the context,
    a vocabulary smaller than the corpus's token ids."""
    n_layer, d_model, n_head, context = _PRESETS[name]
    n_layer = options.get("n_layer") or n_layer
    d_model = options.get("d_model") or d_model
    n_head = options.get("n_head") or n_head
    seq_len = options.get("seq_len") or context
    vocab = options.get("vocab_size") or corpus_vocab or 256
    for field, value in (("n_layer", n_layer), ("d_model", d_model), ("n_head", n_head),
                         ("seq_len", seq_len), ("vocab_size", vocab)):
        if value < 1:
            raise ValueError(f"{field}: must be at least 1, got {value}")
    if d_model % n_head:
        raise ValueError(f"d_model: {d_model} is not divisible by n_head={n_head} (each head takes d_model/n_head)")
    if seq_len > context:
        raise ValueError(f"seq_len: {seq_len} is over {name}'s context of {context} positions")
    if corpus_vocab is not None and vocab < corpus_vocab:
        raise ValueError(f"vocab_size: {vocab} is smaller than the corpus's {corpus_vocab} token ids")
    return GPTShape(n_layer, d_model, n_head, context, seq_len, vocab)
