"""`ddlbench profile | microbench`: their options come from modelling's configs.

As `ddlbench train`'s come from TrainConfig, through the same generator
(pipelines.cli), so one definition feeds validation, help and defaults. An
option left out is the config's default.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from modelling.measure.configs import MicrobenchConfig, ProfileConfig
from modelling.measure.layers import format_table, write_layers
from modelling.measure.profiler import ProfileFailed, run_profile
from pipelines.cli.common import PATH, bandwidth, fail, out_dir, print_rows
from pipelines.options import option_for


class ConfigCommand(click.Command):
    """A command with an option per field of `config` (less `skip`) after its own `params`.
    `older_names` keeps an option's earlier spelling working (timeout_s: --timeout)."""

    def __init__(
        self,
        name: str,
        config: type[BaseModel],
        *,
        skip: tuple[str, ...] = (),
        older_names: dict[str, str] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(name, **kw)
        self.config, self.skip, self.older_names = config, skip, older_names or {}
        self.params += self.config_options()

    def config_options(self) -> list[click.Option]:
        fields = [(n, f) for n, f in self.config.model_fields.items() if n not in self.skip]
        options = []
        for name, field in sorted(fields, key=lambda nf: not nf[1].is_required()):
            option = option_for(name, field)
            if field.is_required():  # the generator is written for fields with defaults
                option.required, option.help = True, field.description
            if name in self.older_names:
                option.opts.insert(0, self.older_names[name])
            options.append(option)
        return options


def _given(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def _profile(out: Path, **options: Any) -> None:
    try:
        table = run_profile(ProfileConfig.of("profile", **_given(options)))
    except ValueError as err:
        fail(err)
    except ProfileFailed as err:
        raise click.ClickException(str(err)) from None
    path = write_layers(table, out)
    click.echo(format_table(table) + f"wrote {path}")


profile = ConfigCommand(
    "profile",
    ProfileConfig,
    callback=_profile,
    help="Time every parameter-owning layer's forward and backward.",
    params=[
        click.Option(["--out", "out"], type=PATH, required=True, callback=out_dir,
                     help="Directory for layers.json and layers.txt."),
    ],
)


def _microbench(out: Path, link_bandwidth: float | None, **options: Any) -> None:
    from modelling.measure.microbench import MicrobenchFailed, cuda_missing, run_config

    try:
        config = MicrobenchConfig.of("microbench", link_bytes_per_s=link_bandwidth, **_given(options))
    except ValueError as err:
        fail(err)
    if why := cuda_missing(config):  # one line, before any rank starts to find no GPU on its own
        click.echo(f"ddlbench microbench: --device cuda: {why}", err=True)
        sys.exit(2)
    try:
        comm = run_config(config, out)
    except ValueError as err:
        fail(err)
    except MicrobenchFailed as err:
        click.echo(f"ddlbench microbench: failed: {err}", err=True)
        sys.exit(1)
    print_rows(
        ["primitive", "workers", "servers", "bytes", "median ms", "spread ms"],
        [
            [m["primitive"], m["workers"], m["servers"], m["bytes"], f"{m['median_s'] * 1e3:.3f}",
             f"{m['spread_s'] * 1e3:.3f}"]
            for m in comm["measurements"]
        ],
        "comm.json",
    )
    click.echo(f"wrote {out / 'comm.json'}")


microbench = ConfigCommand(
    "microbench",
    MicrobenchConfig,
    skip=("link_bytes_per_s",),
    older_names={"timeout_s": "--timeout"},
    callback=_microbench,
    help="Measure allreduce, point-to-point and PS push/pull on the local provider.",
    params=[
        click.Option(["--link-bandwidth", "link_bandwidth"], default=None, callback=bandwidth,
                     help="The link's known rate (e.g. 10gbit), recorded so `fit` can flag impossible fits."),
        click.Option(["--out", "out"], type=PATH, required=True, callback=out_dir, help="Directory for comm.json."),
    ],
)
