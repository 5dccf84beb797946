"""The `ddlbench` command line: this module holds the group and `train`; each other group of
commands is a module of this package (`measure`, `model`, `pipeline`, `compare`, `cleanup`,
with `common`'s shared options). The top floor of pipelines/ but for the DAGs: it may import
every other part of pipelines/ and every floor below; nothing in pipelines/ imports it.

`ddlbench train` takes its options straight from `training.config.TrainConfig`:
one definition feeds validation, the help text and the YAML loader.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from infra import PROVIDER_NAMES, ProviderError, validate_provider_options
from pipelines.launch import JobFailed, OutputError, launch, prepare
from pipelines.options import option_for
from pipelines.spec.sections import ProviderSpec
from training.config import ConfigError, TrainConfig, load_yaml


def config_values(config_file: Path | None, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """YAML values overridden by the options given on the command line."""
    values = load_yaml(config_file) if config_file else {}
    values |= {k: v for k, v in options.items() if v is not None}
    return values, str(config_file) if config_file else "option"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """ddlbench: benchmark, profile and predict distributed data-parallel training."""


def provider_options(name: str, nodes: int | None, bandwidth: str | None, placement: str | None,
                     sets: tuple[str, ...]) -> dict[str, Any]:
    """The provider options of `ddlbench train`, as a spec's `provider.options` would give them:
    checked by the provider's options model (click.UsageError naming the option)."""
    import yaml

    options: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--provider-option")
        options[key.strip()] = yaml.safe_load(raw)
    given = {"nodes": nodes, "bandwidth": bandwidth, "placement": placement}
    options |= {k: v for k, v in given.items() if v is not None}
    try:
        validate_provider_options(name, options)
    except ProviderError as err:
        raise click.UsageError(str(err)) from None
    return options


def _train(config: Path | None, out: Path, timeout: float | None, quiet: bool, provider: str, nodes: int | None,
           bandwidth: str | None, placement: str | None, provider_sets: tuple[str, ...], **options: Any) -> None:
    from pipelines.report.console import print_summary
    from training.run import EXIT_DIVERGED

    opts = provider_options(provider, nodes, bandwidth, placement, provider_sets)  # checked before torch loads
    try:
        values, source = config_values(config, options)
        if bandwidth is not None:  # the link's known rate travels with the results
            values.setdefault("link_bandwidth", bandwidth)
        cfg = prepare(values, source)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    try:
        cluster = ProviderSpec(name=provider, options=opts).build(threads=cfg.threads)
        cluster.place(cfg.workers, cfg.servers)  # before anything is provisioned
    except ProviderError as err:
        raise click.UsageError(str(err)) from None
    try:
        with cluster:
            summary = launch(cfg, out, cluster, timeout_s=timeout, echo=not quiet)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    except (JobFailed, OutputError, ProviderError) as err:
        click.echo(f"ddlbench train: failed: {err}", err=True)
        sys.exit(1)
    if summary["status"] == "diverged":
        click.echo(f"ddlbench train: diverged: loss {summary['loss']} at step {summary['step']} "
                   f"(rank {summary['rank']}); recorded in {out / 'summary.json'}", err=True)
        sys.exit(EXIT_DIVERGED)
    print_summary(summary, out)


train = click.Command(
    "train",
    callback=_train,
    help="Run one distributed training job (torchrun) on a cluster provider: this host by default, "
    "or --provider netns|slurm|kubernetes with the options a spec's provider section takes.",
    params=[
        click.Option(["--config", "config"], type=click.Path(path_type=Path), default=None,
                     help="YAML file of options; options given here override it."),
        click.Option(["--out", "out"], type=click.Path(path_type=Path), required=True,
                     help="Output directory: summary.json, metrics.jsonl, timeline.jsonl, trace.json."),
        click.Option(["--timeout", "timeout"], type=float, default=None,
                     help="Kill the whole job after this many seconds."),
        click.Option(["--quiet", "quiet"], is_flag=True, help="Do not echo the ranks' output."),
        click.Option(["--provider", "provider"], type=click.Choice(PROVIDER_NAMES), default="local", show_default=True,
                     help="Cluster provider: provisioned for this job, torn down after it."),
        click.Option(["--nodes", "nodes"], type=int, default=None, help="provider.options.nodes."),
        click.Option(["--bandwidth", "bandwidth"], default=None,
                     help="provider.options.bandwidth (netns: each link's rate, e.g. 200mbit); "
                     "also the job's link_bandwidth unless given."),
        click.Option(["--placement", "placement"], type=click.Choice(["colocated", "dedicated"]), default=None,
                     help="provider.options.placement: PS shards on the worker nodes or on nodes of their own."),
        click.Option(["--provider-option", "provider_sets"], multiple=True, metavar="KEY=VALUE",
                     help="Any other provider option (VALUE read as YAML), e.g. server_nodes=1; repeatable."),
        *(option_for(name, f) for name, f in TrainConfig.model_fields.items()),
    ],
)
cli.add_command(train)


def _register() -> None:
    # Each command family lives in its own module; each module lists its commands.
    from pipelines.cli import cleanup as cli_cleanup
    from pipelines.cli import model as cli_model
    from pipelines.cli import pipeline as cli_pipeline

    for cmd in (*cli_model.COMMANDS, *cli_pipeline.COMMANDS, *cli_cleanup.COMMANDS):
        cli.add_command(cmd)


_register()


def main() -> None:
    cli()

