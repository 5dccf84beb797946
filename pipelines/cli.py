"""The `ddlbench` command line.

`ddlbench train` takes its options straight from `training.config.TrainConfig`:
one definition feeds validation, the help text and the YAML loader.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from pipelines.options import option_for
from training.config import ConfigError, TrainConfig, load_yaml


def config_values(config_file: Path | None, options: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """YAML values overridden by the options given on the command line."""
    values = load_yaml(config_file) if config_file else {}
    values |= {k: v for k, v in options.items() if v is not None}
    return values, str(config_file) if config_file else "option"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """ddlbench: benchmark, profile and predict distributed data-parallel training."""


def _train(config: Path | None, out: Path, timeout: float | None, quiet: bool, **options: Any) -> None:
    from infra import get_provider
    from pipelines.launch import JobFailed, OutputError, launch, prepare
    from pipelines.report_console import print_summary
    from training.run import EXIT_DIVERGED

    try:
        values, source = config_values(config, options)
        cfg = prepare(values, source)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    try:
        summary = launch(cfg, out, get_provider("local", threads_per_process=cfg.threads),
                         timeout_s=timeout, echo=not quiet)
    except ConfigError as err:
        raise click.UsageError(str(err)) from None
    except (JobFailed, OutputError) as err:
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
    help="Run one distributed training job on this host (torchrun, the local provider).",
    params=[
        click.Option(["--config", "config"], type=click.Path(path_type=Path), default=None,
                     help="YAML file of options; options given here override it."),
        click.Option(["--out", "out"], type=click.Path(path_type=Path), required=True,
                     help="Output directory: summary.json, metrics.jsonl, timeline.jsonl, trace.json."),
        click.Option(["--timeout", "timeout"], type=float, default=None,
                     help="Kill the whole job after this many seconds."),
        click.Option(["--quiet", "quiet"], is_flag=True, help="Do not echo the ranks' output."),
        *(option_for(name, f) for name, f in TrainConfig.model_fields.items()),
    ],
)
cli.add_command(train)


def _register() -> None:
    # Each command family lives in its own module; each module lists its commands.
    from pipelines import cli_cleanup, cli_model, cli_pipeline

    for cmd in (*cli_model.COMMANDS, *cli_pipeline.COMMANDS, *cli_cleanup.COMMANDS):
        cli.add_command(cmd)


_register()


def main() -> None:
    cli()
