"""`ddlbench fit | predict`, with `profile`, `microbench` (cli/measure.py) and `validate`
(cli/validate.py): the performance model's commands. numpy's model loads inside the commands
(tests/function_imports.toml), so `ddlbench --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from infra.credentials import mask_secrets
from modelling.measure.layers import check_layers, load_layers
from modelling.measure.records import load_comm
from modelling.memory import human_bytes
from modelling.scenario import Scenario
from pipelines.cli.common import PATH, bandwidth, fail, int_list, print_rows
from pipelines.cli.measure import microbench, profile
from pipelines.cli.validate import validate
from pipelines.context import default_tracking_uri
from pipelines.rundir import default_home


@click.command("fit")
@click.option("--comm", "comm_path", type=PATH, required=True, help="comm.json from `ddlbench microbench`.")
@click.option(
    "--link-bandwidth",
    default=None,
    callback=bandwidth,
    help="The link's known rate; a beta faster than it is flagged and not used.",
)
@click.option("--out", type=PATH, required=True, help="Where to write model.json.")
def fit(comm_path: Path, link_bandwidth: float | None, out: Path) -> None:
    """Fit alpha, beta (and gamma) per primitive and world size."""
    from modelling.network.fit import fit_comm

    try:
        model = fit_comm(load_comm(comm_path), link_bytes_per_s=link_bandwidth)
    except ValueError as err:
        fail(err)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(model, indent=2))
    print_rows(
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


def hardware_profile(label: str, tracking_uri: str) -> dict[str, Any]:
    """The newest hardware profile MLflow holds for `label` (an onboarding run's artifact: its
    comm model and layer tables), with the run it came from; UsageError naming --hardware where
    there is none."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiments = [e.experiment_id for e in client.search_experiments() if e.name.startswith("ddlbench-")]
    # MLflow's filter string has no escape for a quote: a label holding one is searched for never.
    found = client.search_runs(experiments, f"tags.`ddlbench.hardware` = '{label}' AND "
                               "tags.`ddlbench.hardware_profile` != ''", order_by=["attributes.start_time DESC"],
                               max_results=1) if experiments and "'" not in label else []
    if not found:
        raise click.UsageError(f"--hardware: no hardware profile of {label!r} in {mask_secrets(tracking_uri)} "
                               "(the onboarding DAG records one)")
    run = found[0]
    local = client.download_artifacts(run.info.run_id, run.data.tags["ddlbench.hardware_profile"])
    return json.loads(Path(local).read_text()) | {"run_id": run.info.run_id,
                                                  "run_key": run.data.tags.get("ddlbench.run_key")}


def _from_profile(profile: dict[str, Any], workload: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The layer table and comm model a prediction takes from a hardware profile: the one
    workload it holds, or the one `workload` names (its key, or its model)."""
    from modelling.network.fit import check_comm_model
    source = f"hardware profile {profile.get('hardware')!r} (run {profile.get('run_key')})"
    tables = profile.get("layers") or {}
    matching = [k for k in tables if workload in (None, k, tables[k].get("model"))]
    if len(matching) != 1:
        raise click.UsageError(f"--workload: {source} holds {', '.join(sorted(tables)) or 'no layer table'}; "
                               + ("name one" if matching else f"none is {workload!r}"))
    return (check_layers(tables[matching[0]], f"{source}.layers.{matching[0]}"),
            check_comm_model(profile.get("comm_model"), f"{source}.comm_model"))


@click.command("predict")
@click.option("--layers", "layers_path", type=PATH, default=None, help="layers.json from `ddlbench profile`.")
@click.option("--comm", "comm_path", type=PATH, default=None, help="model.json from `ddlbench fit`.")
@click.option("--hardware", default=None,
              help="Instead of --layers and --comm: the newest hardware profile MLflow holds for this label.")
@click.option("--workload", default=None, help="With --hardware: which of the profile's workloads (key or model).")
@click.option("--home", type=PATH, default=None, help="With --hardware: the pipeline home whose MLflow store to read.")
@click.option("--tracking-uri", default=None, help="With --hardware: the MLflow store (default: the home's).")
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
    callback=int_list,
    help="World sizes N, comma separated.",
)
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True, help="PS shards S.")
@click.option(
    "--bandwidth", default=None, callback=bandwidth, help="What-if link rate (e.g. 10gbit) instead of the fitted beta."
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
    type=PATH,
    default=None,
    help="Also write a Gantt PNG and Chrome trace per world size into this directory.",
)
@click.option(
    "--memory",
    "memory_device",
    default=None,
    metavar="SIZE",
    help="The memory of one device (8gb, 16GiB; on CPU one node's): a world that needs more is a row "
    "'does not fit', never a time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def predict_cmd(
    layers_path: Path | None,
    comm_path: Path | None,
    hardware: str | None,
    workload: str | None,
    home: Path | None,
    tracking_uri: str | None,
    algorithm: str,
    comm_mode: str | None,
    workers: list[int],
    servers: int,
    bandwidth: float | None,
    bucket_mb: float,
    overlap: bool,
    batch_size: int | None,
    timeline: Path | None,
    memory_device: str | None,
    as_json: bool,
) -> None:
    """Predict iteration time, throughput and memory per world size from the DAG model."""
    from modelling.network.fit import load_comm_model
    from modelling.predict import predict
    from modelling.trace import predicted_timeline, write_chrome_trace, write_gantt

    try:
        scenario = Scenario.of(
            "predict",
            algorithm=algorithm,
            comm=comm_mode,
            workers=workers[0],
            servers=servers,
            bandwidth_bytes_per_s=bandwidth,
            bucket_mb=bucket_mb,
            overlap=overlap,
            batch_size=batch_size,
        )
        if hardware is not None:
            if layers_path or comm_path:
                raise click.UsageError("--hardware: takes the layers and the comm model from MLflow; "
                                       "give it without --layers and --comm")
            uri = tracking_uri or default_tracking_uri((home or default_home()).resolve())
            layers, model = _from_profile(hardware_profile(hardware, uri), workload)
        elif layers_path is None or comm_path is None:
            raise click.UsageError("--layers and --comm: both needed (or --hardware LABEL)")
        else:
            layers, model = load_layers(layers_path), load_comm_model(comm_path)
        capacity = _bytes("--memory", memory_device)
        results = predict(layers, model, scenario, workers=workers, strict=capacity is None, capacity_bytes=capacity)
    except ValueError as err:
        fail(err)
    algorithm, comm_mode = scenario.algorithm, scenario.comm
    if timeline:
        timeline.mkdir(parents=True, exist_ok=True)
        for n in workers:
            recs = predicted_timeline(layers, model, scenario.with_workers(n))
            title = f"{layers['model']} {algorithm}-{comm_mode} N={n}"
            write_gantt(recs, timeline / f"predicted_{algorithm}_{comm_mode}_{n}.png", title)
            write_chrome_trace(recs, timeline / f"predicted_{algorithm}_{comm_mode}_{n}.trace.json")
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    timed = [r for r in results if r["iter_time_s"] is not None]
    if timed:
        print_rows(
            ["workers", "servers", "iter ms", "samples/s", "compute ms", "comm ms", "busiest", "memory"],
            [
                [
                    r["workers"],
                    r["servers"],
                    f"{r['iter_time_s'] * 1e3:.2f}",
                    f"{r['throughput_samples_per_s']:.1f}",
                    f"{r['compute_s'] * 1e3:.2f}",
                    f"{r['comm_s'] * 1e3:.2f}",
                    _busiest(r["utilisation"]),
                    human_bytes(r["memory_bytes"]) if r.get("memory_bytes") is not None else "-",
                ]
                for r in timed
            ],
            f"{layers['model']}: {algorithm} over {comm_mode}",
        )
    for r in results:  # a world with no time says why: it does not fit, or the model cannot say
        if r["iter_time_s"] is None:
            click.echo(f"{layers['model']}: {algorithm} over {comm_mode}, {r['workers']} workers: "
                       f"{r['no_prediction']}")


def _busiest(util: dict[str, float]) -> str:
    name = max(util, key=util.get)
    return f"{name} {util[name]:.0%}"


def _bytes(option: str, text: str | None) -> int | None:
    """A size as the spec's memory.device takes it (pydantic's ByteSize: 8gb, 16GiB, 512MiB)."""
    if text is None:
        return None
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        size = int(TypeAdapter(ByteSize).validate_python(text))
    except ValidationError:
        raise ValueError(f"{option}: not a size, got {text!r} (write 8gb, 16GiB or 512MiB)") from None
    if size <= 0:
        raise ValueError(f"{option}: must be more than 0 bytes, got {text!r}")
    return size


COMMANDS: list[click.Command] = [profile, microbench, fit, predict_cmd, validate]
