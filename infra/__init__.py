"""Cluster providers: where ranks run and how torchrun starts them."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

from infra.base import Job, JobResult, Node, Provider, ProviderError
from infra.options import ProviderOptions

__all__ = [
    "Job",
    "JobResult",
    "Node",
    "Provider",
    "ProviderError",
    "PROVIDER_NAMES",
    "ProviderOptions",
    "get_provider",
    "provider_options_model",
    "validate_provider_options",
]

_PROVIDERS = {
    "local": ("infra.local", "LocalProvider"),
    "netns": ("infra.netns", "NetnsProvider"),
    "slurm": ("infra.slurm", "SlurmProvider"),
    "kubernetes": ("infra.kubernetes", "KubernetesProvider"),
}
PROVIDER_NAMES = tuple(_PROVIDERS)


def _provider_class(name: str) -> type[Provider]:
    if name not in _PROVIDERS:
        raise ProviderError(
            f"provider: unknown provider {name!r}; available: {', '.join(_PROVIDERS)}"
        )
    module_name, class_name = _PROVIDERS[name]
    # Imported on use: the kubernetes client is an optional dependency.
    return getattr(import_module(module_name), class_name)


def provider_options_model(name: str) -> type[ProviderOptions]:
    """The pydantic model of a provider's options (names, defaults, descriptions, checks)."""
    return _provider_class(name).options_model


def validate_provider_options(name: str, options: Mapping[str, Any]) -> ProviderOptions:
    """A provider's options checked without building it; ProviderError names the bad option
    ("provider.options.nodes: expected an integer >= 1, got 0")."""
    return provider_options_model(name).parse(options)


def get_provider(name: str, **options: Any) -> Provider:
    """A provider by name; unknown names and options are clear errors."""
    return _provider_class(name)(**options)
