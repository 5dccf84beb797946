"""`ddlbench profile | microbench | fit | predict | validate` (the performance model).

Heavy modules (torch, matplotlib) are imported inside the commands, so
`ddlbench --help` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

_PATH = click.Path(path_type=Path)


def _bandwidth(_ctx, param, value: str | None) -> float | None:
    from modelling.units import parse_bandwidth

    if value is None:
        return None
    try:
        return parse_bandwidth(value)
    except ValueError as err:
        raise click.BadParameter(str(err).removeprefix("bandwidth: "), param=param) from None


def _int_list(_ctx, param, value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected a comma list of integers such as 1,2,4, got {value!r}", param=param
        ) from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"every value must be a positive integer, got {value!r}", param=param)
    return out


def _out_dir(_ctx, param, value: Path | None) -> Path | None:
    if value is not None and value.exists() and not value.is_dir():
        raise click.BadParameter(f"{value} exists and is not a directory", param=param)
    return value


def _fail(err: Exception) -> None:
    raise click.UsageError(str(err)) from None


@click.command("profile")
@click.option("--model", required=True, help="Model name (as for `ddlbench train`).")
@click.option("--batch-size", type=click.IntRange(min=1), required=True, help="Per-process batch size.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Concurrent profiling processes: the training run's process count on this host.",
)
@click.option("--dataset", default="synthetic", show_default=True, help="Where input batches come from.")
@click.option("--input-shape", default=None, help="C,H,W; default: the model's natural shape.")
@click.option("--num-classes", type=click.IntRange(min=2), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--out", type=_PATH, required=True, callback=_out_dir, help="Directory for layers.json and layers.txt.")
def profile(
    model: str,
    batch_size: int,
    device: str,
    processes: int,
    dataset: str,
    input_shape: str | None,
    num_classes: int,
    warmup: int,
    repeats: int,
    out: Path,
) -> None:
    """Time every parameter-owning layer's forward and backward."""
    from modelling.layers import format_table, write_layers
    from modelling.profiler import ProfileFailed, profile_layers

    shape = None
    if input_shape:
        try:
            shape = tuple(int(v) for v in input_shape.replace("x", ",").split(","))
        except ValueError:
            raise click.BadParameter(
                f"expected C,H,W such as 3,32,32, got {input_shape!r}", param_hint="--input-shape"
            ) from None
        if len(shape) != 3:
            raise click.BadParameter(f"expected 3 values C,H,W, got {input_shape!r}", param_hint="--input-shape")
    try:
        table = profile_layers(
            model,
            batch_size,
            input_shape=shape,
            dataset=dataset,
            num_classes=num_classes,
            device=device,
            warmup=warmup,
            repeats=repeats,
            processes=processes,
        )
    except ValueError as err:
        _fail(err)
    except ProfileFailed as err:
        raise click.ClickException(str(err)) from None
    path = write_layers(table, out)
    click.echo(format_table(table) + f"wrote {path}")


@click.command("microbench")
@click.option("--workers", type=click.IntRange(min=1), required=True, help="Worker ranks N.")
@click.option(
    "--servers",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Parameter-server shards S (push/pull is measured when S >= 1).",
)
@click.option(
    "--sizes",
    default=None,
    callback=lambda c, p, v: _int_list(c, p, v) if v else None,
    help="Message sizes in bytes, comma separated; default 4 KiB .. 16 MiB.",
)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--timeout", type=float, default=600, show_default=True, help="Kill the job after this many s.")
@click.option(
    "--link-bandwidth",
    default=None,
    callback=_bandwidth,
    help="The link's known rate (e.g. 10gbit), recorded so `fit` can flag impossible fits.",
)
@click.option("--out", type=_PATH, required=True, callback=_out_dir, help="Directory for comm.json.")
def microbench(
    workers: int,
    servers: int,
    sizes: list[int] | None,
    repeats: int,
    timeout: float,
    link_bandwidth: float | None,
    out: Path,
) -> None:
    """Measure allreduce, point-to-point and PS push/pull on the local provider."""
    from modelling.microbench import MicrobenchFailed, run_microbench

    try:
        comm = run_microbench(
            workers, servers, out, sizes=sizes, repeats=repeats, timeout_s=timeout, link_bytes_per_s=link_bandwidth
        )
    except ValueError as err:
        _fail(err)
    except MicrobenchFailed as err:
        click.echo(f"ddlbench microbench: failed: {err}", err=True)
        sys.exit(1)
    _print_rows(
        ["primitive", "workers", "servers", "bytes", "median ms", "spread ms"],
        [
            [
                m["primitive"],
                m["workers"],
                m["servers"],
                m["bytes"],
                f"{m['median_s'] * 1e3:.3f}",
                f"{m['spread_s'] * 1e3:.3f}",
            ]
            for m in comm["measurements"]
        ],
        "comm.json",
    )
    click.echo(f"wrote {out / 'comm.json'}")


@click.command("fit")
@click.option("--comm", "comm_path", type=_PATH, required=True, help="comm.json from `ddlbench microbench`.")
@click.option(
    "--link-bandwidth",
    default=None,
    callback=_bandwidth,
    help="The link's known rate; a beta faster than it is flagged and not used.",
)
@click.option("--out", type=_PATH, required=True, help="Where to write model.json.")
def fit(comm_path: Path, link_bandwidth: float | None, out: Path) -> None:
    """Fit alpha, beta (and gamma) per primitive and world size."""
    from modelling.fit import fit_comm, load_comm

    try:
        model = fit_comm(load_comm(comm_path), link_bytes_per_s=link_bandwidth)
    except ValueError as err:
        _fail(err)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(model, indent=2))
    _print_rows(
        ["primitive", "N", "S", "alpha us", "beta ns/B", "gamma ns/B", "R^2", "flags"],
        [
            [
                f["primitive"],
                f["workers"],
                f["servers"],
                f"{f['alpha_s'] * 1e6:.1f}",
                f"{f['beta_s_per_byte'] * 1e9:.4f}",
                "" if f["gamma_s_per_byte"] is None else f"{f['gamma_s_per_byte'] * 1e9:.4f}",
                f"{f['r2']:.3f}",
                "; ".join(f["flags"]),
            ]
            for f in model["fits"]
        ],
        "fit",
    )
    click.echo(f"wrote {out}")


@click.command("predict")
@click.option("--layers", "layers_path", type=_PATH, required=True, help="layers.json from `ddlbench profile`.")
@click.option("--comm", "comm_path", type=_PATH, required=True, help="model.json from `ddlbench fit`.")
@click.option("--algorithm", type=click.Choice(["ssgd", "asgd", "odsgd"]), required=True)
@click.option(
    "--comm-mode",
    type=click.Choice(["allreduce", "ps"]),
    default=None,
    help="Default: allreduce for ssgd, ps otherwise.",
)
@click.option(
    "--workers",
    default="1,2,4,8,16,32,64,128,256,512,1024",
    show_default=True,
    callback=_int_list,
    help="World sizes N, comma separated.",
)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True, help="PS shards S.")
@click.option(
    "--bandwidth", default=None, callback=_bandwidth, help="What-if link rate (e.g. 10gbit) instead of the fitted beta."
)
@click.option(
    "--bucket-mb",
    type=float,
    default=25.0,
    show_default=True,
    help="DDP bucket size; 0 = per-layer wait-free backpropagation.",
)
@click.option(
    "--overlap/--no-overlap",
    default=True,
    show_default=True,
    help="ssgd allreduce: overlap communication with backward.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Per-worker batch; default the profiled one (compute scales linearly).",
)
@click.option(
    "--timeline",
    type=_PATH,
    default=None,
    help="Also write a Gantt PNG and Chrome trace per world size into this directory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def predict_cmd(
    layers_path: Path,
    comm_path: Path,
    algorithm: str,
    comm_mode: str | None,
    workers: list[int],
    servers: int,
    bandwidth: float | None,
    bucket_mb: float,
    overlap: bool,
    batch_size: int | None,
    timeline: Path | None,
    as_json: bool,
) -> None:
    """Predict iteration time and throughput per world size from the DAG model."""
    from modelling.fit import load_comm_model
    from modelling.layers import load_layers
    from modelling.predict import predict, predicted_timeline, write_chrome_trace, write_gantt

    comm_mode = comm_mode or ("allreduce" if algorithm == "ssgd" else "ps")
    opts: dict[str, Any] = {
        "algorithm": algorithm,
        "comm_mode": comm_mode,
        "servers": servers,
        "bandwidth_bytes_per_s": bandwidth,
        "bucket_mb": bucket_mb,
        "overlap": overlap,
        "batch_size": batch_size,
    }
    try:
        layers, model = load_layers(layers_path), load_comm_model(comm_path)
        results = predict(layers, model, workers=workers, **opts)
    except ValueError as err:
        _fail(err)
    if timeline:
        timeline.mkdir(parents=True, exist_ok=True)
        for n in workers:
            recs = predicted_timeline(layers, model, workers=n, **opts)
            title = f"{layers['model']} {algorithm}-{comm_mode} N={n}"
            write_gantt(recs, timeline / f"predicted_{algorithm}_{comm_mode}_{n}.png", title)
            write_chrome_trace(recs, timeline / f"predicted_{algorithm}_{comm_mode}_{n}.trace.json")
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    _print_rows(
        ["workers", "servers", "iter ms", "samples/s", "compute ms", "comm ms", "busiest"],
        [
            [
                r["workers"],
                r["servers"],
                f"{r['iter_time_s'] * 1e3:.2f}",
                f"{r['throughput_samples_per_s']:.1f}",
                f"{r['compute_s'] * 1e3:.2f}",
                f"{r['comm_s'] * 1e3:.2f}",
                _busiest(r["utilisation"]),
            ]
            for r in results
        ],
        f"{layers['model']}: {algorithm} over {comm_mode}",
    )


def _busiest(util: dict[str, float]) -> str:
    name = max(util, key=util.get)
    return f"{name} {util[name]:.0%}"


@click.command("validate")
@click.option("--run", "runs", type=_PATH, multiple=True, required=True, help="A training run directory.")
@click.option(
    "--layers", "layers_path", type=_PATH, default=None, help="layers.json; default: the one in or beside each run dir."
)
@click.option(
    "--comm-model",
    "comm_path",
    type=_PATH,
    default=None,
    help="model.json; default: the one in or beside each run dir.",
)
@click.option("--out", type=_PATH, default=None, help="Also write the result as JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def validate(
    runs: tuple[Path, ...], layers_path: Path | None, comm_path: Path | None, out: Path | None, as_json: bool
) -> None:
    """Predicted vs measured iteration time for training runs."""
    from modelling.fit import load_comm_model
    from modelling.layers import load_layers
    from modelling.validate import validate_runs

    try:
        layers = load_layers(layers_path) if layers_path else None
        model = load_comm_model(comm_path) if comm_path else None
        result = validate_runs(list(runs), layers=layers, comm_model=model)
    except ValueError as err:
        _fail(err)
    if out:
        out.write_text(json.dumps(result, indent=2))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _print_rows(
        ["run", "algorithm", "comm", "N", "S", "model", "predicted ms", "measured ms", "error"],
        [
            [
                r["run"],
                r["algorithm"],
                r["comm"],
                r["workers"],
                r["servers"],
                r["model"],
                f"{r['predicted_iter_s'] * 1e3:.2f}",
                f"{r['measured_iter_s'] * 1e3:.2f}",
                f"{r['error']:+.1%}",
            ]
            for r in result["runs"]
        ],
        "validation",
    )
    repeated = [c for c in result["configs"] if c["repeats"] > 1]
    if repeated:
        _print_rows(
            ["model", "algorithm", "comm", "N", "S", "repeats", "predicted ms", "measured ms (median)", "error"],
            [
                [
                    c["model"],
                    c["algorithm"],
                    c["comm"],
                    c["workers"],
                    c["servers"],
                    c["repeats"],
                    f"{c['predicted_iter_s'] * 1e3:.2f}",
                    f"{c['measured_iter_s'] * 1e3:.2f}",
                    f"{c['error']:+.1%}",
                ]
                for c in result["configs"]
            ],
            "per configuration (repeats as their median)",
        )
    click.echo(
        f"median |error| {result['median_abs_error']:.1%}, worst {result['worst_abs_error']:.1%} "
        f"over {len(result['configs'])} configurations"
    )


def _print_rows(header: list[str], rows: list[list[Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in header:
        table.add_column(
            h,
            justify="left" if h in ("primitive", "run", "algorithm", "comm", "model", "flags", "busiest") else "right",
        )
    for row in rows:
        table.add_row(*(str(v) for v in row))
    Console().print(table)


COMMANDS: list[click.Command] = [profile, microbench, fit, predict_cmd, validate]
