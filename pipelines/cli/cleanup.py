"""`ddlbench cleanup`: end what the jobs of dead launchers left behind on the clusters.

A launcher killed outright (SIGKILL, an OOM kill, a lost Airflow worker) cannot clean up.
Its local torchrun agents and ranks die with it (infra/lifeline.py) and its SLURM job or
Kubernetes Job is ended by its watchdog; what is left when the watchdog died too, and the
network namespaces of a netns cluster, is removed here (and by the provider's next run).
Only what a dead launcher on this host owns is touched: other runs' clusters are left alone.

MLflow runs left RUNNING are `ddlbench sync`'s (`--abandoned` for their parents): the run
journal, not the cluster, knows them.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import click
import yaml

from infra import ProviderError
from infra.kubernetes import KubernetesProvider
from infra.netns import cleanup_stale
from infra.slurm import cancel_orphans, controller_up


def sweep(kubernetes: dict[str, Any] | None = None, slurm_confs: tuple[str, ...] = ()) -> list[str]:
    """What was removed, one line each: netns namespaces (with their links and bridge), SLURM
    jobs (of the default cluster and of every `slurm_confs` one), and, given provider options,
    Kubernetes Jobs (with their pods and Services)."""
    removed: list[str] = []
    if os.geteuid() == 0 and shutil.which("ip"):
        removed += [f"netns namespace {ns}" for ns in cleanup_stale()]
    for conf in (None, *slurm_confs):
        if controller_up(conf):
            where = f" ({conf})" if conf else ""
            removed += [f"slurm job {job_id}{where}" for job_id in cancel_orphans(conf)]
    if kubernetes is not None:
        provider = KubernetesProvider(**kubernetes)
        removed += [f"kubernetes job {provider.namespace}/{name}" for name in provider.delete_orphans()]
    return removed


def _kubernetes_options(_ctx: Any, param: Any, value: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    options = yaml.safe_load(value)
    if not isinstance(options, dict):
        raise click.BadParameter(f"expected a YAML mapping of provider options, got {value!r}", param=param)
    return options


def _cleanup(kubernetes: dict[str, Any] | None, slurm_confs: tuple[str, ...]) -> None:
    try:
        removed = sweep(kubernetes, slurm_confs)
    except ProviderError as err:
        raise click.UsageError(str(err)) from None
    for line in removed:
        click.echo(f"removed {line}")
    if not removed:
        click.echo("nothing to clean up: no cluster resources of dead launchers")


cleanup = click.Command(
    "cleanup",
    callback=_cleanup,
    help="Remove what jobs of dead launchers on this host left behind: netns namespaces, bridges "
    "and veths, SLURM jobs (also of each --slurm-conf cluster), and (with --kubernetes) Kubernetes Jobs. "
    "Live runs are never touched. "
    "MLflow runs left RUNNING: `ddlbench sync`.",
    params=[
        click.Option(
            ["--kubernetes", "kubernetes"],
            default=None,
            callback=_kubernetes_options,
            metavar="OPTIONS",
            help="Also delete Jobs of dead launchers through this cluster: the provider's options as "
            "YAML, e.g. '{namespace: bench, kubeconfig: ~/.kube/config}'.",
        ),
        click.Option(
            ["--slurm-conf", "slurm_confs"],
            multiple=True,
            type=click.Path(exists=True, dir_okay=False),
            metavar="PATH",
            help="Also cancel orphaned jobs and run allocations of the SLURM cluster of this slurm.conf "
            "(a provider's `slurm_conf` option); repeatable. The default cluster (SLURM_CONF or the "
            "tools' own) is always swept.",
        ),
    ],
)

COMMANDS: list[click.Command] = [cleanup]
