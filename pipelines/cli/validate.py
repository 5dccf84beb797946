"""`ddlbench validate`: the model's predictions against training runs' measurements."""

from __future__ import annotations

import json
from pathlib import Path

import click

from modelling.measure.layers import load_layers
from pipelines.cli.common import PATH, fail, print_rows
from pipelines.report.validation import model_error_cell, ms, pct


@click.command("validate")
@click.option("--run", "runs", type=PATH, multiple=True, required=True, help="A training run directory.")
@click.option(
    "--layers", "layers_path", type=PATH, default=None, help="layers.json; default: the one in or beside each run dir."
)
@click.option(
    "--comm-model",
    "comm_path",
    type=PATH,
    default=None,
    help="model.json; default: the one in or beside each run dir.",
)
@click.option("--out", type=PATH, default=None, help="Also write the result as JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def validate(
    runs: tuple[Path, ...], layers_path: Path | None, comm_path: Path | None, out: Path | None, as_json: bool
) -> None:
    """Predicted vs measured iteration time for training runs."""
    from modelling.network.fit import load_comm_model
    from modelling.validate import validate_runs

    try:
        layers = load_layers(layers_path) if layers_path else None
        model = load_comm_model(comm_path) if comm_path else None
        result = validate_runs(list(runs), layers=layers, comm_model=model)
    except ValueError as err:
        fail(err)
    if out:
        out.write_text(json.dumps(result, indent=2))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    print_rows(
        ["run", "algorithm", "comm", "N", "S", "model", "predicted ms", "measured ms", "error", "model error"],
        [
            [
                r["run"],
                r["algorithm"],
                r["comm"],
                r["workers"],
                r["servers"],
                r["model"],
                ms(r["predicted_iter_s"]),
                ms(r["measured_iter_s"]),
                pct(r["error"]),
                model_error_cell(r),
            ]
            for r in result["runs"]
        ],
        "validation",
    )
    repeated = [c for c in result["configs"] if c["repeats"] > 1]
    if repeated:
        print_rows(
            ["model", "algorithm", "comm", "N", "S", "repeats", "predicted ms", "measured ms (median)", "error"],
            [
                [
                    c["model"],
                    c["algorithm"],
                    c["comm"],
                    c["workers"],
                    c["servers"],
                    c["repeats"],
                    ms(c["predicted_iter_s"]),
                    ms(c["measured_iter_s"]),
                    pct(c["error"]),
                ]
                for c in result["configs"]
            ],
            "per configuration (repeats as their median)",
        )
    click.echo(
        f"median |error| {result['median_abs_error']:.1%}, worst {result['worst_abs_error']:.1%} "
        f"over {len(result['configs'])} configurations"
    )
    if result["median_abs_model_error"] is not None:
        # The DAG fed with the runs' own in-situ layer compute (layers_insitu.json): the model's own error.
        click.echo(
            f"model (in-situ compute): median |error| {result['median_abs_model_error']:.1%}, "
            f"worst {result['worst_abs_model_error']:.1%}; repeat spread median {result['median_repeat_spread']:.1%}"
        )
