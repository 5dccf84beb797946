"""Token datasets for language models, nothing downloaded.

- `stdlib-text`: the Python standard library's own .py source files (those of the
  interpreter that runs the job; its test suites and site-packages left out), as bytes:
  256 token ids. A file goes to the test split when the SHA-256 of its path relative to
  the library, read as a number, is divisible by 10: a fixed split by file, the same for
  every seed. `corpus_fingerprint` gives its size and hash (recorded as the MLflow
  dataset input), since the library differs between Python versions.
- `markov`: a seeded order-2 Markov chain over 16 tokens. Its entropy rate (the loss of
  the best possible predictor, in nats) and its unigram entropy (the loss of one that
  ignores the context) are computed exactly from the chain: `markov_chain()`.

A sample is a window of `seq_len + 1` tokens: the first `seq_len` are the input, the
last `seq_len` the targets (the next token at every position).
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

TEXT_DATASETS = ("stdlib-text", "markov")
# Evaluation runs on at most this many windows of the test split, evenly spaced (fixed):
# the whole test split of stdlib-text would cost minutes of a CPU run at every evaluation.
EVAL_WINDOWS = 256


class TokenSource:
    """Non-overlapping windows of a token stream, or a set of independent sequences."""

    def __init__(self, windows: torch.Tensor, vocab: int) -> None:
        self.windows = windows  # (n, seq_len + 1), int64
        self.num_classes = vocab

    @classmethod
    def of_stream(cls, tokens: torch.Tensor, seq_len: int, vocab: int, limit: int | None = None) -> TokenSource:
        n = (len(tokens) - 1) // seq_len
        if n < 1:
            raise ValueError(f"seq_len: {seq_len} is longer than the {len(tokens)} tokens of the split")
        starts = torch.arange(n) * seq_len
        if limit is not None and n > limit:
            starts = starts[torch.linspace(0, n - 1, limit).long()]
        return cls(tokens[starts.unsqueeze(1) + torch.arange(seq_len + 1)], vocab)

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def tokens(self) -> int:
        """Target tokens in the split."""
        return self.windows.shape[0] * (self.windows.shape[1] - 1)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.windows[indices]
        return w[:, :-1], w[:, 1:]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    root = stdlib_root()
    skip = {"site-packages", "dist-packages", "test", "tests", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


@cache
def stdlib_corpus() -> tuple[bytes, bytes, str]:
    """(train bytes, test bytes, SHA-256 of both): files joined in path order."""
    root = stdlib_root()
    train, test, digest = [], [], hashlib.sha256()
    for path in _stdlib_files():
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        digest.update(rel.encode() + b"\0" + data + b"\0")
        in_test = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 10 == 0
        (test if in_test else train).append(data)
    return b"".join(train), b"".join(test), digest.hexdigest()


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


@dataclass(frozen=True)
class MarkovChain:
    """An order-k chain over `vocab` tokens; the state is the last k tokens."""

    vocab: int
    order: int
    probs: torch.Tensor  # (vocab**order, vocab): next-token distribution per state
    stationary: torch.Tensor  # (vocab**order,): the states' stationary distribution

    @property
    def entropy_rate(self) -> float:
        """The lowest expected next-token loss (nats) any model can reach."""
        p = self.probs.double()
        h = -(p * p.clamp_min(1e-300).log()).sum(1)
        return float((self.stationary.double() * h).sum())

    @property
    def unigram_entropy(self) -> float:
        """The loss (nats) of the best predictor that ignores the context."""
        marginal = (self.stationary.double().unsqueeze(1) * self.probs.double()).sum(0)
        return float(-(marginal * marginal.clamp_min(1e-300).log()).sum())

    def sample(self, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """n independent stretches of `length` tokens, each started in the stationary state."""
        k, v = self.order, self.vocab
        state = torch.multinomial(self.stationary, n, replacement=True, generator=generator)
        first = [(state // v ** (k - 1 - i)) % v for i in range(k)]
        out = torch.empty(n, length, dtype=torch.long)
        out[:, :k] = torch.stack(first, 1)[:, :length]
        for t in range(k, length):
            nxt = torch.multinomial(self.probs[state], 1, generator=generator).squeeze(1)
            out[:, t] = nxt
            state = (state * v + nxt) % v**k
        return out


MARKOV_VOCAB, MARKOV_ORDER, MARKOV_SEED = 16, 2, 31337
# Dirichlet concentration of each state's next-token distribution: low, so the context
# matters (entropy rate well below the unigram entropy).
_MARKOV_ALPHA = 0.2
_MARKOV_TEST_SEQUENCES = 256


@cache
def markov_chain() -> MarkovChain:
    g = torch.Generator().manual_seed(MARKOV_SEED)
    states = MARKOV_VOCAB**MARKOV_ORDER
    gamma = torch._standard_gamma(torch.full((states, MARKOV_VOCAB), _MARKOV_ALPHA, dtype=torch.float64),
                                  generator=g)
    probs = (gamma / gamma.sum(1, keepdim=True)).clamp_min(1e-12)
    probs = probs / probs.sum(1, keepdim=True)
    # States move to (s * V + x) mod V^k; the stationary distribution by power iteration.
    nxt = (torch.arange(states).unsqueeze(1) * MARKOV_VOCAB + torch.arange(MARKOV_VOCAB)) % states
    pi = torch.full((states,), 1.0 / states, dtype=torch.float64)
    for _ in range(10_000):
        new = torch.zeros_like(pi).index_add_(0, nxt.flatten(), (pi.unsqueeze(1) * probs).flatten())
        if (new - pi).abs().max() < 1e-14:
            break
        pi = new
    return MarkovChain(MARKOV_VOCAB, MARKOV_ORDER, probs.float(), pi.float())


def corpus_vocab(name: str) -> int:
    return MARKOV_VOCAB if name == "markov" else 256


def load_text(cfg, seq_len: int) -> tuple[TokenSource, TokenSource]:
    """(train, test) windows of `cfg.dataset` at `seq_len`."""
    if cfg.dataset == "markov":
        chain = markov_chain()
        # The task is fixed (the job's seed orders the data, as for synthetic-learnable).
        g = torch.Generator().manual_seed(MARKOV_SEED + 1)
        test = chain.sample(_MARKOV_TEST_SEQUENCES, seq_len + 1, g)
        train = chain.sample(cfg.synthetic_samples, seq_len + 1, g)
        return TokenSource(train, MARKOV_VOCAB), TokenSource(test, MARKOV_VOCAB)
    train, test, _ = stdlib_corpus()
    return (TokenSource.of_stream(_bytes_tensor(train), seq_len, 256),
            TokenSource.of_stream(_bytes_tensor(test), seq_len, 256, limit=EVAL_WINDOWS))


def corpus_fingerprint(name: str) -> dict[str, object]:
    """What identifies a text dataset's content: size and hash (the MLflow dataset input)."""
    if name == "markov":
        chain = markov_chain()
        return {"vocab": chain.vocab, "order": chain.order, "seed": MARKOV_SEED,
                "entropy_rate_nats": chain.entropy_rate, "unigram_entropy_nats": chain.unigram_entropy}
    train, test, digest = stdlib_corpus()
    return {"sha256": digest, "bytes": len(train) + len(test), "train_bytes": len(train), "test_bytes": len(test),
            "files": len(_stdlib_files()), "python": sysconfig.get_python_version()}
