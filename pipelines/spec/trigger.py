"""What a DAG trigger may choose, and what only the deployment sets (docs/security.md).

Whoever may trigger a DAG chooses its Params: the spec path, the home and the overrides (the
nightly's, or those the onboarding form makes). Such a trigger picks *what* is measured:
workloads, algorithms, sizes (workers, batch sizes, steps, nodes), links, repeats, the
regression thresholds. The deployment decides *where and as whom* it runs: the spec
directories, the home root, the provider's partition, account, image, namespace, service
account and cluster files, data paths, tracking stores. `check_trigger` enforces that for
runs started from Airflow, before any file is read; the CLI, run by the machine's owner,
reads any path and sets any field.

The deployment names its places in the environment of the Airflow workers:
- DDLBENCH_SPEC_DIRS: spec directories (os.pathsep-separated) besides the repository's specs/;
- DDLBENCH_HOME_ROOT: directories (os.pathsep-separated) a trigger's `home` must lie in;
  default: the default home ($DDLBENCH_HOME or <repo>/.ddlbench).
"""

from __future__ import annotations

import os
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from infra.options import excerpt, one_line
from pipelines.rundir import REPO, default_home
from pipelines.spec.load import SpecError, check_overrides, field_name, one_error

SPEC_DIRS_ENV = "DDLBENCH_SPEC_DIRS"
HOME_ROOT_ENV = "DDLBENCH_HOME_ROOT"

# Dotted spec fields a trigger may set (list entries by index: workloads.0.model); a value
# that is a mapping is checked key by key. Everything else is the deployment's.
TRIGGER_FIELDS = (
    "name", "hardware", "suite",
    "workloads", "workloads.*.model", "workloads.*.dataset", "workloads.*.input_shape", "workloads.*.num_classes",
    "algorithms", "algorithms.*.name", "algorithms.*.comm", "algorithms.*.options.*",
    "workers", "servers", "batch_sizes", "steps", "epochs", "repeats", "target_accuracy", "scaling",
    "train.*", "train_timeout_s", "network.*", "microbench.*", "profile.*", "what_if.*", "memory.*", "regression.*",
    "tracking.system_metrics",
    # The spec's own provider named again (the onboarding form names it; another is refused at
    # start by check_trigger_provider), and its sizes and links; where and as whom is the spec's.
    "provider.name", "provider.options.nodes", "provider.options.devices_per_node", "provider.options.gpus_per_node",
    "provider.options.bandwidth", "provider.options.placement", "provider.options.server_nodes",
)
# Training options that reach files or the network of the workers: the deployment's, wherever given.
DEPLOYMENT_OPTIONS = ("data_root", "download")


def spec_dirs() -> list[Path]:
    """The deployment's spec directories: the repository's specs/ and those of DDLBENCH_SPEC_DIRS."""
    extra = [Path(p) for p in os.environ.get(SPEC_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    return [(REPO / "specs").resolve(), *(p.expanduser().resolve() for p in extra)]


def home_roots() -> list[Path]:
    """The directories a trigger's home must lie in: DDLBENCH_HOME_ROOT, else the default home."""
    roots = [Path(p) for p in os.environ.get(HOME_ROOT_ENV, "").split(os.pathsep) if p.strip()]
    return [p.expanduser().resolve() for p in roots or [default_home()]]


def _inside(path: Path | None, roots: list[Path]) -> bool:
    return path is not None and any(path == root or path.is_relative_to(root) for root in roots)


def _leaves(value: Any, path: str) -> list[str]:
    """The dotted fields a value sets: a mapping per key (an empty one merges into its section
    and sets nothing), a list of mappings per entry."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}")]
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [path] + [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}.{i}")]
    return [path]


def _refusal(field: str) -> str | None:
    """Why a trigger may not set `field`, or None when it may."""
    parts = field.split(".")
    if any(p in DEPLOYMENT_OPTIONS for p in parts):
        return "a path or download on the workers is the deployment's"
    if not any(fnmatchcase(field, pattern) for pattern in TRIGGER_FIELDS):
        return "only the deployment sets it (a trigger chooses workloads, algorithms, sizes, links and repeats)"
    return None


def check_trigger_overrides(overrides: dict[str, Any] | None, source: str = "overrides") -> None:
    """SpecError naming every deployment-only field the overrides set, one line each; overrides
    that are no mapping, or nest past a spec's limits, are refused in one line first."""
    lines = []
    for key, value in check_overrides(overrides or {}, source).items():
        for field in _leaves(value, str(key).replace("-", "_")):
            if (why := _refusal(field)) is not None:
                shown = ".".join(field_name(p) if not p.isdigit() else p for p in field.split("."))
                lines.append(f"{source}.{shown}: {why}")
    if lines:
        raise SpecError(one_error(sorted(lines)))


def check_trigger(spec_path: str, home: str | None, overrides: dict[str, Any] | None) -> None:
    """A DAG run's Params within what a trigger may choose, or SpecError naming the Param; reads
    no file (a path outside the spec directories is refused unread)."""
    if not isinstance(spec_path, str) or not spec_path.strip():
        raise SpecError(f"spec_path: expected the path of a spec, got {excerpt(spec_path)}")
    _one_line("spec_path", spec_path)
    # Refusals name the Param, never the deployment's directories: a trigger learns no layout.
    if not _inside(_resolved(spec_file(spec_path)), spec_dirs()):
        raise SpecError(f"spec_path: {excerpt(spec_path)} is outside the deployment's spec directories "
                        f"(the operator adds directories with {SPEC_DIRS_ENV})")
    if home is not None:
        if not isinstance(home, str):
            raise SpecError(f"home: expected a path, got {excerpt(home)}")
        _one_line("home", home)
        if (used := home_dir(home)) is not None and not _inside(used, home_roots()):
            raise SpecError(f"home: {excerpt(home)} is outside the deployment's home root "
                            f"(the operator sets it with {HOME_ROOT_ENV})")
    check_trigger_overrides(overrides)


def check_trigger_provider(spec_values: dict[str, Any], overrides: dict[str, Any] | None) -> None:
    """SpecError when the overrides name another provider than the spec's own: the spec, which the
    deployment keeps, says where and as whom a run goes. `spec_values`: the spec file as read."""
    own = spec_values.get("provider") or {}
    own_name = own.get("name", "local") if isinstance(own, dict) else "local"
    for key, value in (overrides or {}).items():
        asked = value if key == "provider.name" else None
        if key == "provider" and isinstance(value, dict):
            asked = value.get("name")
        if asked is not None and asked != own_name:
            raise SpecError(f"overrides.provider.name: {excerpt(asked)} is not the spec's provider ({own_name}); the "
                            f"spec says where a run goes: trigger a spec of the deployment that runs on it")


def spec_file(spec_path: str) -> Path:
    """The spec file a path names, as `start` reads it: relative to the working directory, `~`
    not expanded (a trigger's text is not a shell's)."""
    return Path(spec_path)


def home_dir(home: str | None) -> Path | None:
    """The home a `home` Param names, as `start` uses it; None (and "") for the default home."""
    return _resolved(Path(home).expanduser()) if home else None


def _one_line(param: str, value: str) -> None:
    try:
        one_line(value)
    except ValueError as err:
        raise SpecError(f"{param}: {err}") from None


def _resolved(path: Path) -> Path | None:
    """The path with symlinks and '..' resolved (no way out of a directory through them); None
    for what is no path (a NUL byte, a loop of links)."""
    try:
        return path.resolve()
    except (OSError, ValueError, RuntimeError):
        return None
