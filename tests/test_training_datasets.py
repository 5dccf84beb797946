"""The synthetic-learnable task: fixed, seeded, with the Bayes accuracy it states."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.config import build_config
from training.datasets import LEARNABLE_BAYES_ACCURACY, LearnableSource, load_dataset, train_samples


def _splits(shape=(3, 32, 32), **opts):
    cfg = build_config({"dataset": "synthetic-learnable", "steps": 1, "synthetic_samples": 512} | opts)
    return load_dataset(cfg, shape)


def test_the_task_is_fixed_and_the_seed_changes_nothing_in_it():
    train, test = _splits(seed=0)
    other, _ = _splits(seed=5)
    idx = torch.tensor([0, 7, 511])
    x, y = train.batch(idx)
    assert x.shape == (3, 3, 32, 32) and y.tolist() == [0, 7, 1]
    assert torch.equal(x, other.batch(idx)[0])  # repeats differ by data order and init, not data
    assert torch.equal(x, train.batch(idx)[0])  # a sample is a function of its index
    assert not torch.equal(test.batch(idx)[0], x)  # the test split has its own samples
    assert len(test) == 2000 and sorted(set(test.labels.tolist())) == list(range(10))


def test_the_bayes_classifier_reaches_the_stated_accuracy_and_no_more():
    _, test = _splits()
    x, y = test.native(torch.arange(len(test)))
    bayes = (test.bayes_predict(x) == y).float().mean().item()
    # 2000 samples: a standard error of 0.006 around the 20k-sample figure.
    assert bayes == pytest.approx(LEARNABLE_BAYES_ACCURACY, abs=0.02)
    # The signal is real, and it is the class template: the mean of a class is its template.
    c3 = LearnableSource(10, 400, 0, (3, 32, 32))
    x3, y3 = c3.native(torch.arange(3, 400, 10))
    assert (x3.mean(0) - 0.5 - c3.templates[3]).abs().mean() < 0.2
    assert (y3 == 3).all()


def test_adapts_to_the_models_input_shape():
    train, test = _splits(shape=(1, 28, 28))
    x, _ = train.batch(torch.arange(4))
    assert x.shape == (4, 1, 28, 28) and test.batch(torch.arange(2))[0].shape == (2, 1, 28, 28)


@settings(max_examples=10, deadline=None)
@given(c=st.sampled_from([1, 3]), h=st.integers(4, 64), w=st.integers(4, 64))
def test_the_digits_training_split_is_counted_as_loading_it_counts(c: int, h: int, w: int) -> None:
    """The preflight counts the split without resizing it; the count is the loaded split's."""
    cfg = build_config({"dataset": "digits", "steps": 1})
    train, test = load_dataset(cfg, (c, h, w))
    assert train_samples(cfg, (c, h, w)) == len(train) and len(train) + len(test) == 1797
