"""Cluster providers: where ranks run and how torchrun starts them."""

from __future__ import annotations

from importlib import import_module

from infra.base import Job, JobResult, Node, Provider, ProviderError

__all__ = ["Job", "JobResult", "Node", "Provider", "ProviderError", "get_provider"]

_PROVIDERS = {
    "local": ("infra.local", "LocalProvider"),
    "netns": ("infra.netns", "NetnsProvider"),
    "slurm": ("infra.slurm", "SlurmProvider"),
    "kubernetes": ("infra.kubernetes", "KubernetesProvider"),
}


def get_provider(name: str, **options: object) -> Provider:
    """A provider by name; unknown names and options are clear errors."""
    if name not in _PROVIDERS:
        raise ProviderError(
            f"provider: unknown provider {name!r}; available: {', '.join(_PROVIDERS)}"
        )
    module_name, class_name = _PROVIDERS[name]
    # Imported on use: the kubernetes client is an optional dependency.
    cls = getattr(import_module(module_name), class_name)
    try:
        return cls(**options)
    except TypeError as err:
        raise ProviderError(f"provider.options: {err}") from None
