"""A GPT-style decoder-only language model in plain torch (GPT-2's layout).

Token and position embeddings, `n_layer` pre-norm blocks of causal self-attention
(`F.scaled_dot_product_attention`) and a GELU MLP, a final layer norm and an output
head tied to the token embedding. Random init (GPT-2's: N(0, 0.02), residual
projections scaled by 1/sqrt(2 n_layer)); nothing is downloaded.

Each of the three kinds of part (`Embedding`, `Block`, `Head`) holds its parameters
itself rather than in submodules: the layer profiler (modelling/measure/profiler.py) times
every module that owns parameters, so the profile, and the DAG model built on it,
come out by block: the embedding, each transformer block, the head.

Inputs are token ids (B, T); the output is logits in torch's layout for losses over
a sequence, (B, vocab, T), so `F.cross_entropy(logits, targets)` with targets (B, T)
is the next-token loss everywhere a classifier's loss is computed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from training.gpt_shape import GPTShape


def _param(*shape: int, std: float | None = None, fill: float = 0.0) -> nn.Parameter:
    t = torch.empty(*shape)
    if std is None:
        t.fill_(fill)
    else:
        nn.init.normal_(t, 0.0, std)
    return nn.Parameter(t)


class Embedding(nn.Module):
    """Token plus position embedding."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.wte = _param(s.vocab_size, s.d_model, std=0.02)
        self.wpe = _param(s.context, s.d_model, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.wte) + self.wpe[: idx.shape[1]]


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)): one pre-norm transformer block."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        d, self.n_head = s.d_model, s.n_head
        resid_std = 0.02 / math.sqrt(2 * s.n_layer)
        self.ln1_weight, self.ln1_bias = _param(d, fill=1.0), _param(d)
        self.qkv_weight, self.qkv_bias = _param(3 * d, d, std=0.02), _param(3 * d)
        self.proj_weight, self.proj_bias = _param(d, d, std=resid_std), _param(d)
        self.ln2_weight, self.ln2_bias = _param(d, fill=1.0), _param(d)
        self.fc_weight, self.fc_bias = _param(4 * d, d, std=0.02), _param(4 * d)
        self.out_weight, self.out_bias = _param(d, 4 * d, std=resid_std), _param(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = F.layer_norm(x, (d,), self.ln1_weight, self.ln1_bias)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in F.linear(h, self.qkv_weight, self.qkv_bias).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + F.linear(y, self.proj_weight, self.proj_bias)
        h = F.layer_norm(x, (d,), self.ln2_weight, self.ln2_bias)
        return x + F.linear(F.gelu(F.linear(h, self.fc_weight, self.fc_bias)), self.out_weight, self.out_bias)


class Head(nn.Module):
    """Final layer norm and the output projection, tied to the token embedding."""

    def __init__(self, s: GPTShape) -> None:
        super().__init__()
        self.ln_weight, self.ln_bias = _param(s.d_model, fill=1.0), _param(s.d_model)

    def forward(self, x: torch.Tensor, wte: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (x.shape[-1],), self.ln_weight, self.ln_bias)
        return F.linear(h, wte).transpose(1, 2)  # (B, vocab, T)


class GPT(nn.Module):
    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.embed = Embedding(shape)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.n_layer))
        self.head = Head(shape)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x, self.embed.wte)
