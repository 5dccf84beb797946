"""Cluster providers: where ranks run and how torchrun starts them."""

from __future__ import annotations

from infra.base import Job, JobResult, Node, Provider, ProviderError

__all__ = ["Job", "JobResult", "Node", "Provider", "ProviderError", "get_provider"]


def get_provider(name: str, **options: object) -> Provider:
    """A provider by name; unknown names and options are clear errors."""
    if name == "local":
        from infra.local import LocalProvider

        cls = LocalProvider
    else:
        raise ProviderError(f"provider: unknown provider {name!r}; available: local")
    try:
        return cls(**options)
    except TypeError as err:
        raise ProviderError(f"provider.options: {err}") from None
