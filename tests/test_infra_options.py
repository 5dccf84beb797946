"""Provider options as pydantic models: what a spec validates when it loads is what the
provider is built from, with the same messages."""

from __future__ import annotations

import pytest

from infra import ProviderError, get_provider, provider_options_model, validate_provider_options
from infra.netns import NetnsOptions


def test_every_provider_has_an_options_model_with_described_fields():
    for name in ("local", "netns", "slurm", "kubernetes"):
        model = provider_options_model(name)
        assert "threads_per_process" in model.model_fields
        assert all(f.description for f in model.model_fields.values()), name
    assert provider_options_model("netns") is NetnsOptions


def test_validation_names_the_option_as_the_provider_does():
    cases = [
        ("netns", {"nodes": 0}, "provider.options.nodes: expected a positive integer, got 0"),
        ("netns", {"bandwidth": "1gb/s"}, "provider.options.bandwidth: expected a positive rate"),
        ("slurm", {"gpus_per_node": -1}, "provider.options.gpus_per_node: expected an integer >= 0, got -1"),
        ("kubernetes", {"tolerations": [{}]}, r"provider.options.tolerations\[0\]: expected a mapping"),
        ("local", {"threads": 2}, "provider.options: unexpected keyword argument 'threads'"),
    ]
    for name, options, message in cases:
        with pytest.raises(ProviderError, match=message):
            validate_provider_options(name, options)
        with pytest.raises(ProviderError, match=message):
            get_provider(name, **options)
    with pytest.raises(ProviderError, match="unknown provider 'mesos'"):
        validate_provider_options("mesos", {})


def test_valid_options_keep_their_values_and_defaults():
    opts = validate_provider_options("netns", {"nodes": 3, "bandwidth": "100mbit"})
    assert (opts.nodes, opts.bandwidth, opts.subnet) == (3, "100mbit", "10.213.0.0/24")
    provider = get_provider("netns", **opts.model_dump())
    assert (provider.nodes, provider.rate_bps) == (3, 100_000_000)
    assert get_provider("slurm", time_limit=30).time_limit == "30"
