"""The prediction scenario, the rate parser and the measurement configs: one source each."""

from __future__ import annotations

import pytest

from infra.units import parse_rate
from modelling.measure.configs import MicrobenchConfig, ProfileConfig
from modelling.scenario import Scenario
from pipelines.spec.sections import MicrobenchSpec, ProfileSpec
from training.config import TrainConfig, build_config, default_comm


def test_scenario_defaults_are_the_trainers() -> None:
    s = Scenario()
    cfg = TrainConfig(steps=1)
    assert (s.bucket_mb, s.overlap, s.algorithm) == (cfg.bucket_mb, cfg.overlap, cfg.algorithm.value)
    assert [default_comm(a) for a in ("ssgd", "asgd", "odsgd")] == ["allreduce", "ps", "ps"]
    assert Scenario(algorithm="odsgd").comm == "ps" and Scenario(comm="allreduce", servers=3).servers == 0


def test_a_scenario_from_a_train_config_and_from_its_summary_agree() -> None:
    cfg = build_config({"algorithm": "odsgd", "workers": 3, "servers": 2, "batch_size": 16, "steps": 1})
    summary = {"algorithm": "odsgd", "comm": "ps", "workers": 3, "servers": 2, "batch_size": 16,
               "overlap": True, "config": {"bucket_mb": cfg.bucket_mb}}
    assert Scenario.from_train_config(cfg) == Scenario.from_summary(summary)
    with pytest.raises(ValueError, match="scenario.comm: asgd runs on a parameter server"):
        Scenario.of("scenario", algorithm="asgd", comm="allreduce")


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [("1gbit", 1.25e8), ("2.5Gbit", 3.125e8), ("100 Mbit", 12.5e6), ("1tbit", 1.25e11), ("10gbps", 1.25e9),
     ("125mb", 125e6), ("1.25GB/s", 1.25e9), ("1000", 1000.0), ("1e3 kb/s", 1e6)],
)
def test_one_rate_parser_reads_every_unit(text: str, bytes_per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text", ["fast", "0gbit", "-1mb", "1 furlong"])
def test_a_rate_that_cannot_be_read_names_it(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read .*expected a positive rate"):
        parse_rate(text)


def test_the_spec_sections_extend_the_measurement_settings() -> None:
    assert ProfileSpec().warmup == ProfileConfig(model="mlp", batch_size=1).warmup
    assert MicrobenchSpec().repeats == MicrobenchConfig(workers=2).repeats
    assert MicrobenchConfig(workers=2, sizes="4096,1024").measured_sizes == [1024, 4096]
    with pytest.raises(ValueError, match="at least 2 ranks"):
        MicrobenchConfig.of("microbench", workers=1)
