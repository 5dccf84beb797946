"""The tracking URI as the run's files may hold it: its password masked, and the real one back
from the environment (docs/security.md)."""

from __future__ import annotations

import os

from infra.credentials import MASK, mask_secrets


def mask_uri(uri: str) -> str:
    """The tracking URI without its password: what ctx.json, XCom and logs may hold."""
    return mask_secrets(uri)


def resolve_uri(stored: str) -> str:
    """The real URI for a masked one: credentials come from the environment only."""
    if MASK not in stored:
        return stored
    real = os.environ.get("MLFLOW_TRACKING_URI", "")
    if mask_uri(real) != stored:
        raise RuntimeError(
            f"tracking_uri: {stored} needs its credentials from MLFLOW_TRACKING_URI in this process's "
            "environment (an Airflow connection or the deployment's env file), and that is not set to it"
        )
    return real
