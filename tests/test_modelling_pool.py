"""Pooling repeated layer profiles, and repeats of a configuration counted once."""

from __future__ import annotations

import statistics

import pytest

from modelling.measure.layers import LayersError, pool_layers
from modelling.validate import group_repeats


def _table(scale: float, samples: list[float], model: str = "m") -> dict:
    return {
        "model": model,
        "batch_size": 32,
        "layers": [
            {"name": "conv", "type": "Conv2d", "fwd_s": 1e-3 * scale, "bwd_s": 2e-3 * scale, "param_bytes": 400},
            {"name": "fc", "type": "Linear", "fwd_s": 3e-3 * scale, "bwd_s": 5e-3 * scale, "param_bytes": 800},
        ],
        "update_s": 4e-4 * scale,
        "data_s": 1e-4 * scale,
        "pack_s": 5e-5 * scale,
        "iteration_samples_s": samples,
    }


def test_pooled_profile_takes_each_time_as_the_median_over_profiles() -> None:
    # The second profile ran while the host was slow (1.6x): the median ignores it.
    tables = [_table(1.0, [0.011, 0.012, 0.013]), _table(1.6, [0.019, 0.020, 0.021]), _table(1.1, [0.012, 0.013])]
    pooled = pool_layers(tables)
    assert [r["fwd_s"] for r in pooled["layers"]] == pytest.approx([1.1e-3, 3.3e-3])
    assert [r["bwd_s"] for r in pooled["layers"]] == pytest.approx([2.2e-3, 5.5e-3])
    assert pooled["update_s"] == pytest.approx(4.4e-4) and pooled["pack_s"] == pytest.approx(5.5e-5)
    assert pooled["pooled_profiles"] == 3
    # Samples keep each profile's spread around its own median, re-centred on the median
    # of the medians (0.0125): the 1.6x drift between profiles is gone.
    samples = pooled["iteration_samples_s"]
    assert len(samples) == 8
    assert statistics.median(samples) == pytest.approx(0.0125)
    # Each sample over its own profile's median, times 0.0125: the slow profile's 0.021
    # (its median 0.020 * 1.05) becomes 0.0125 * 1.05, not 0.021.
    assert sorted(samples) == pytest.approx(
        sorted(
            x / m * 0.0125
            for xs, m in [([0.011, 0.012, 0.013], 0.012), ([0.019, 0.020, 0.021], 0.020), ([0.012, 0.013], 0.0125)]
            for x in xs
        )
    )
    assert max(samples) == pytest.approx(0.013 / 0.012 * 0.0125)


def test_only_like_tables_pool() -> None:
    with pytest.raises(LayersError, match=r"layers\[1\]: profiles other at batch 32"):
        pool_layers([_table(1.0, [0.01]), _table(1.0, [0.01], model="other")])
    with pytest.raises(LayersError, match="nothing to pool"):
        pool_layers([])


def test_repeats_of_a_configuration_count_once_as_their_median() -> None:
    base = {"model": "m", "algorithm": "ssgd", "comm": "ps", "workers": 2, "servers": 1, "batch_size": 32}
    runs = [
        {**base, "run": "a", "predicted_iter_s": 0.010, "measured_iter_s": 0.010},
        {**base, "run": "b", "predicted_iter_s": 0.010, "measured_iter_s": 0.014},  # a slow repeat
        {**base, "run": "c", "predicted_iter_s": 0.010, "measured_iter_s": 0.011},
        {**base, "algorithm": "asgd", "run": "d", "predicted_iter_s": 0.009, "measured_iter_s": 0.012},
    ]
    ssgd, asgd = group_repeats(runs)
    assert (ssgd["repeats"], ssgd["runs"], ssgd["measured_iter_s"]) == (3, ["a", "b", "c"], 0.011)
    assert ssgd["error"] == pytest.approx(-1 / 11)
    assert (asgd["algorithm"], asgd["repeats"], asgd["error"]) == ("asgd", 1, pytest.approx(-0.25))


def test_runs_on_other_placements_are_other_configurations_not_repeats() -> None:
    base = {"model": "m", "algorithm": "ssgd", "comm": "ps", "workers": 2, "servers": 1, "batch_size": 32}
    runs = [
        {**base, "run": "a", "placement": "2 nodes colocated", "predicted_iter_s": 0.010, "measured_iter_s": 0.010},
        {**base, "run": "b", "placement": "3 nodes dedicated", "predicted_iter_s": 0.020, "measured_iter_s": 0.016},
        {**base, "run": "c", "placement": "2 nodes colocated", "predicted_iter_s": 0.010, "measured_iter_s": 0.012},
        {**base, "run": "d", "predicted_iter_s": 0.005, "measured_iter_s": 0.005},  # no label: one host
    ]
    colocated, dedicated, local = group_repeats(runs)
    assert (colocated["placement"], colocated["runs"], colocated["measured_iter_s"]) == (
        "2 nodes colocated", ["a", "c"], 0.011)
    assert (dedicated["placement"], dedicated["repeats"], dedicated["error"]) == (
        "3 nodes dedicated", 1, pytest.approx(0.25))
    assert (local["placement"], local["runs"]) == ("one host", ["d"])
