"""The benchmark pipeline as plain steps (DESIGN §1), for Airflow and the CLI alike.

Each step takes and returns small JSON-able dicts, writes its outputs to the run
directory `<home>/runs/<run_key>/` first and logs the same to MLflow through the
journal (pipelines/tracking.py). A step is idempotent under the run key: once it
has finished, calling it again returns the recorded result (`steps/<name>.json`);
after a failure or a kill it runs again and reopens its own MLflow run.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipelines.journal import now_ms
from pipelines.spec import BenchSpec, SpecError, Workload, flatten, grid, load_spec, validate_spec
from pipelines.tracking import PARENT, STATUS, Tracker, mask_uri, tracker_for

REPO = Path(__file__).resolve().parent.parent
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

# Summary figures logged as MLflow metrics under the same names (units in the names).
_SUMMARY_METRICS = (
    "throughput_samples_per_s",
    "train_time_s",
    "final_loss",
    "final_test_loss",
    "final_accuracy",
    "time_to_accuracy_s",
    "parameters",
    "parameter_bytes",
    "bytes_sent",
    "bytes_received",
)
_TRAIN_ARTIFACTS = ("config.json", "summary.json", "metrics.jsonl", "timeline.jsonl", "trace.json", "launcher.log")


# -- helpers ---------------------------------------------------------------------------------
def default_home() -> Path:
    return Path(os.environ.get("DDLBENCH_HOME") or REPO / ".ddlbench")


def default_tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"


def load_ctx_spec(ctx: dict[str, Any]) -> BenchSpec:
    """The run's resolved spec, as `start` validated it."""
    return validate_spec(json.loads((Path(ctx["run_dir"]) / "spec.json").read_text()), "spec.json")


def _write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)
    return path


def _recorded(ctx: dict[str, Any], name: str) -> Path:
    return Path(ctx["run_dir"]) / "steps" / f"{name}.json"


def _step(
    ctx: dict[str, Any], name: str, body: Any, *, node: str | None = None, tags: dict[str, Any] | None = None
) -> Any:
    """Run `body(tracker, node)` once in its own child run; later calls return its result."""
    done = _recorded(ctx, name)
    if done.exists():
        return json.loads(done.read_text())
    t = tracker_for(ctx)
    t.end_orphans()
    node = node or name
    tags = {**run_tags(ctx), "ddlbench.step": name.split("/")[0], **(tags or {})}
    with t.run(node, node.split("/")[-1], tags=tags):
        result = body(t, node)
    _write_json(done, result)
    return result


def run_tags(ctx: dict[str, Any]) -> dict[str, str]:
    """What identifies every run of this pipeline run (DESIGN §6); a retry finds its runs by them."""
    tags = {
        "ddlbench.hardware": ctx["hardware"],
        "ddlbench.spec_hash": ctx["spec_hash"],
        "ddlbench.suite": ctx["suite"],
        "ddlbench.git_commit": ctx.get("git_commit") or "unknown",
    }
    airflow = ctx.get("airflow") or {}
    tags |= {f"airflow.{k}": str(airflow[k]) for k in ("dag_id", "run_id") if airflow.get(k)}
    return tags


def _provider(spec: BenchSpec) -> Any:
    from infra import get_provider

    options = dict(spec.provider.options)
    if spec.provider.name == "local":
        options.setdefault("threads_per_process", spec.train.get("threads", 1))
    return get_provider(spec.provider.name, **options)


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _workload_dir(wl: Workload, batch: int) -> str:
    return f"{wl.label}-b{batch}"


# -- the steps -------------------------------------------------------------------------------
def start(
    spec_path: str,
    *,
    run_key: str | None = None,
    home: str | None = None,
    overrides: dict | None = None,
    airflow: dict | None = None,
) -> dict:
    """Validate the spec (+ overrides), make the run dir, open or find the parent MLflow run."""
    spec = load_spec(spec_path, overrides)
    home_dir = Path(home).expanduser().resolve() if home else default_home().resolve()
    spec_hash = spec.spec_hash()
    if run_key is not None and not _UNSAFE.sub("", run_key):
        raise SpecError(f"run_key: {run_key!r} has no usable characters")
    run_key = (
        _UNSAFE.sub("-", run_key).strip("-")
        if run_key
        else f"{spec.name}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{spec_hash[:6]}"
    )
    run_dir = home_dir / "runs" / run_key
    ctx_path = run_dir / "ctx.json"
    if ctx_path.exists():
        ctx = json.loads(ctx_path.read_text())
        if ctx["spec_hash"] != spec_hash:
            raise SpecError(
                f"run_key: {run_key!r} already ran a different spec (hash {ctx['spec_hash']}, "
                f"now {spec_hash}); choose another run key"
            )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(run_dir / "spec.json", spec.model_dump(mode="json"))
        (run_dir / "spec.yaml").write_text(Path(spec_path).read_text())
        ctx = {
            "run_key": run_key,
            "run_dir": str(run_dir),
            "home": str(home_dir),
            "tracking_uri": mask_uri(default_tracking_uri(home_dir)),  # no password in ctx/XCom
            "experiment": spec.experiment,
            "parent_run_id": None,
            "spec_path": str(Path(spec_path).resolve()),
            "spec_hash": spec_hash,
            "hardware": spec.hardware,
            "suite": spec.suite.value,
            "git_commit": _git_commit(),
            "airflow": {k: v for k, v in (airflow or {}).items() if k in ("dag_id", "run_id")},
        }
        _write_json(ctx_path, ctx)
    t = tracker_for(ctx)
    t.end_orphans()
    tags = {
        **run_tags(ctx),
        "ddlbench.spec_name": spec.name,
        "mlflow.source.git.commit": ctx["git_commit"] or "",
        **{f"airflow.{k}": v for k, v in (airflow or {}).items() if v is not None},
    }
    # Under Airflow the parent belongs to the DAG run, not to this task's short-lived process.
    t.start_run(PARENT, run_key, parent=None, tags=tags, owned_by_pipeline=bool(ctx["airflow"]))
    if not _recorded(ctx, "start").exists():
        t.log_params(PARENT, flatten(spec.model_dump(mode="json"), "spec."))
        t.log_artifact(PARENT, run_dir / "spec.yaml", "spec")
        t.log_artifact(PARENT, run_dir / "spec.json", "spec")
        _write_json(_recorded(ctx, "start"), {"started_ms": now_ms()})
    ctx["parent_run_id"] = t.run_id(PARENT)
    _write_json(ctx_path, ctx)
    return ctx


def provision(ctx: dict) -> dict:
    """Check the cluster can be provisioned; record its nodes."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        with _provider(spec) as p:
            nodes = [{"name": n.name, "address": n.address} for n in p.provision()]
        t.log_params(
            node,
            {
                "provider": spec.provider.name,
                "nodes": len(nodes),
                **flatten(spec.provider.options, "provider.options."),
            },
        )
        t.set_tags(PARENT, {"ddlbench.provider": spec.provider.name})
        return {"provider": spec.provider.name, "nodes": nodes}

    return _step(ctx, "provision", body)


def microbench(ctx: dict) -> dict:
    """Communication microbenchmarks at each world size of the grid (comm.json per size)."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        if not spec.microbench.enabled:
            return {"comm": [], "skipped": True}
        from modelling.microbench import run_microbench

        paths = []
        for n in sorted(spec.workers):
            out = Path(ctx["run_dir"]) / "microbench" / f"w{n}"
            with _provider(spec) as p:
                run_microbench(
                    n,
                    spec.servers,
                    out,
                    provider=p,
                    sizes=spec.microbench.sizes,
                    repeats=spec.microbench.repeats,
                    timeout_s=spec.microbench.timeout_s,
                    link_bytes_per_s=spec.network.bytes_per_s,
                )
            t.log_artifact(node, out / "comm.json", f"w{n}")
            paths.append(str(out / "comm.json"))
        t.log_params(
            node,
            {"workers": json.dumps(sorted(spec.workers)), "servers": spec.servers, "repeats": spec.microbench.repeats},
        )
        return {"comm": paths, "skipped": False}

    return _step(ctx, "microbench", body)


def profile(ctx: dict) -> dict:
    """Layer tables of every workload and batch size, profiled under training's process count."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        if not spec.profile.enabled:
            return {"layers": {}, "skipped": True}
        from modelling.profiler import profile_layers, write_layers

        out: dict[str, str] = {}
        for wl in spec.workloads:
            for batch in spec.batch_sizes:
                name = _workload_dir(wl, batch)
                job_dir = Path(ctx["run_dir"]) / "profile" / name / "job"
                with _provider(spec) as p:
                    layers = profile_layers(
                        wl.model,
                        batch,
                        input_shape=wl.input_shape,
                        dataset=wl.dataset,
                        num_classes=wl.num_classes or 10,
                        device=spec.train.get("device", "cpu"),
                        warmup=spec.profile.warmup,
                        repeats=spec.profile.repeats,
                        processes=max(spec.workers),
                        provider=p,
                        out_dir=job_dir,
                        timeout_s=spec.profile.timeout_s,
                    )
                path = write_layers(layers, Path(ctx["run_dir"]) / "profile" / name)
                t.log_artifact(node, path, name)
                t.log_artifact(node, path.with_name("layers.txt"), name)
                t.log_table(
                    node,
                    {
                        k: [r.get(k) for r in layers["layers"]]
                        for k in ("name", "type", "fwd_s", "bwd_s", "param_bytes")
                    },
                    f"{name}/layers_table.json",
                )
                fwd = sum(r["fwd_s"] for r in layers["layers"])
                bwd = sum(r["bwd_s"] for r in layers["layers"])
                t.log_metrics(
                    node,
                    {
                        f"{name}.forward_s": fwd,
                        f"{name}.backward_s": bwd,
                        f"{name}.update_s": layers["update_s"],
                        f"{name}.data_s": layers["data_s"],
                    },
                )
                out[name] = str(path)
        return {"layers": out, "skipped": False}

    return _step(ctx, "profile", body)


def _comm_paths(ctx: dict) -> list[Path]:
    return sorted((Path(ctx["run_dir"]) / "microbench").glob("w*/comm.json"))


def fit(ctx: dict) -> dict:
    """Fit alpha/beta/gamma per primitive and world size from the microbenchmarks (model.json)."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        paths = _comm_paths(ctx)
        if not paths:
            return {"model": None, "skipped": True}
        from modelling.fit import fit_comm

        comms = [json.loads(p.read_text()) for p in paths]
        comm = {**comms[0], "measurements": [m for c in comms for m in c["measurements"]]}
        model = fit_comm(comm, link_bytes_per_s=spec.network.bytes_per_s)
        path = _write_json(Path(ctx["run_dir"]) / "fit" / "model.json", model)
        t.log_artifact(node, path)
        rows = [
            {
                k: f.get(k)
                for k in (
                    "primitive",
                    "workers",
                    "servers",
                    "alpha_s",
                    "beta_s_per_byte",
                    "gamma_s_per_byte",
                    "r2",
                    "usable",
                )
            }
            | {"flags": "; ".join(f["flags"])}
            for f in model["fits"]
        ]
        t.log_table(node, {k: [r[k] for r in rows] for k in rows[0]} if rows else {}, "comm_fits.json")
        t.log_metrics(
            node,
            {
                f"{f['primitive']}.w{f['workers']}.{k}": f.get(k)
                for f in model["fits"]
                for k in ("alpha_s", "beta_s_per_byte", "gamma_s_per_byte", "r2")
            },
        )
        flagged = [f"{f['primitive']} w{f['workers']}: {'; '.join(f['flags'])}" for f in model["fits"] if f["flags"]]
        if flagged:
            t.set_tags(node, {"ddlbench.fit_flags": " | ".join(flagged)[:5000]})
        return {"model": str(path), "skipped": False, "flagged": flagged}

    return _step(ctx, "fit", body)


def _load_inputs(ctx: dict) -> tuple[dict[str, dict] | None, dict | None]:
    """(layers per workload dir, comm model) from profile and fit, None where skipped."""
    run_dir = Path(ctx["run_dir"])
    layers = {p.parent.name: json.loads(p.read_text()) for p in sorted((run_dir / "profile").glob("*/layers.json"))}
    model_path = run_dir / "fit" / "model.json"
    model = json.loads(model_path.read_text()) if model_path.exists() else None
    return layers or None, model


def predict(ctx: dict) -> dict:
    """Predict every algorithm at the grid's and the what-if world sizes and link rates."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        layers_by, model = _load_inputs(ctx)
        if not layers_by or model is None:
            return {"predictions": None, "skipped": True}
        from modelling.fit import CommModelError
        from modelling.predict import predict as predict_model

        sizes = sorted(set(spec.workers) | set(spec.what_if.workers))
        rates = [(spec.network.link_bandwidth, spec.network.bytes_per_s)]
        rates += [(r, _rate(r)) for r in spec.what_if.link_bandwidths]
        rows: list[dict[str, Any]] = []
        try:
            for wl in spec.workloads:
                for batch in spec.batch_sizes:
                    layers = layers_by[_workload_dir(wl, batch)]
                    for algo in spec.algorithms:
                        for label, rate in rates:
                            for p in predict_model(
                                layers,
                                model,
                                algorithm=algo.name.value,
                                comm_mode=algo.comm_mode.value,
                                workers=sizes,
                                servers=spec.servers,
                                bandwidth_bytes_per_s=rate,
                                bucket_mb=algo.options.get("bucket_mb", 25.0),
                                overlap=algo.options.get("overlap", True),
                                batch_size=batch,
                            ):
                                rows.append(
                                    {
                                        "workload": wl.label,
                                        "batch_size": batch,
                                        "algorithm": algo.label,
                                        "workers": p["workers"],
                                        "link_bandwidth": label or "measured",
                                        "iter_time_s": p["iter_time_s"],
                                        "throughput_samples_per_s": p["throughput_samples_per_s"],
                                        "compute_s": p.get("compute_s"),
                                        "comm_s": p.get("comm_s"),
                                        "what_if": p["workers"] not in spec.workers or rate != rates[0][1],
                                    }
                                )
        except CommModelError as err:
            # A fit that beats physics is flagged, not used: say so and go on.
            t.set_tags(node, {"prediction_skipped": str(err)[:250]})
            return {"predictions": None, "skipped": True, "reason": str(err)}
        path = _write_json(Path(ctx["run_dir"]) / "predict" / "predictions.json", rows)
        t.log_artifact(node, path)
        t.log_table(node, {k: [r[k] for r in rows] for k in rows[0]}, "predictions_table.json")
        from pipelines.report import plot_predicted_scaling

        t.log_figure(node, plot_predicted_scaling(rows), "predicted_throughput.png")
        return {"predictions": str(path), "skipped": False, "count": len(rows)}

    return _step(ctx, "predict", body)


def _rate(rate: str) -> float:
    from pipelines.spec import parse_rate

    return parse_rate(rate)


def train_configs(ctx: dict) -> list[dict]:
    """The grid: [{"key", "config", "repeat"}], one entry per config and repeat."""
    return grid(load_ctx_spec(ctx))


def _metric_rows(metrics_path: Path, t0_ms: int) -> list[dict[str, Any]]:
    """Per-step curves from metrics.jsonl, stamped at the time each step happened."""
    from training.timeline import read_jsonl

    rows = []
    names = {
        "loss": "train/loss",
        "throughput_samples_per_s": "train/throughput_samples_per_s",
        "accuracy": "eval/accuracy",
        "test_loss": "eval/test_loss",
    }
    for r in read_jsonl(metrics_path) if metrics_path.exists() else []:
        ts = t0_ms + int(1000 * (r.get("time_s") or 0.0))
        rows += [
            {"key": names[k], "value": float(r[k]), "step": int(r["step"]), "ts": ts}
            for k in names
            if r.get(k) is not None
        ]
    return rows


def summary_metrics(summary: dict[str, Any]) -> dict[str, float | None]:
    """The figures of summary.json as flat metric names with units."""
    out: dict[str, float | None] = {k: summary.get(k) for k in _SUMMARY_METRICS}
    for q, v in (summary.get("iter_time_s") or {}).items():
        out[f"iter_time_{q}_s"] = v
    for phase, v in (summary.get("breakdown_s") or {}).items():
        out[f"{phase}_s"] = v
    if summary.get("staleness"):
        out["staleness_mean_steps"] = summary["staleness"]["mean"]
        out["staleness_max_steps"] = summary["staleness"]["max"]
    return {k: v for k, v in out.items() if isinstance(v, int | float)}


def train(ctx: dict, entry: dict) -> dict:
    """One config and repeat of the grid, in fresh torchrun processes through the provider."""
    key = entry["key"]
    out = Path(ctx["run_dir"]) / "train" / key
    tags = {
        "ddlbench.config_key": key,
        "ddlbench.repeat": entry["repeat"],
        **{
            f"ddlbench.{k}": entry["config"][k]
            for k in ("model", "dataset", "algorithm", "comm", "workers", "batch_size")
        },
    }

    def body(t: Tracker, node: str) -> dict:
        from pipelines.launch import JobFailed, prepare

        spec = load_ctx_spec(ctx)
        cfg = prepare(entry["config"], source=f"train[{key}]")
        t.log_params(node, flatten(cfg.model_dump(mode="json")))
        t0 = now_ms()
        try:
            with _system_metrics(t, node, spec):
                summary = _launch(spec, cfg, out)
        except JobFailed:
            t.log_artifact(node, out / "launcher.log", "training")  # why it failed, next to the run
            raise
        t.log_metric_rows(node, _metric_rows(out / "metrics.jsonl", t0))
        t.log_metrics(node, summary_metrics(summary), step=summary.get("steps") or 0)
        for name in _TRAIN_ARTIFACTS:
            if (out / name).exists():
                t.log_artifact(node, out / name, "training")
        return {"key": key, "run_dir": str(out), "mlflow_run_id": t.run_id(node), "status": "FINISHED"}

    result = _step(ctx, f"train/{key}", body, node=f"train/{key}", tags=tags)
    if result.get("mlflow_run_id") is None:  # recorded while MLflow was down: it may be known now
        result["mlflow_run_id"] = tracker_for(ctx).run_id(f"train/{key}")
    return result


def _launch(spec: BenchSpec, cfg: Any, out: Path) -> dict[str, Any]:
    from pipelines.launch import launch

    with _provider(spec) as p:
        return launch(cfg, out, p, timeout_s=spec.train_timeout_s, echo=False)


@contextmanager
def _system_metrics(t: Tracker, node: str, spec: BenchSpec) -> Iterator[None]:
    """CPU/memory/network sampled into the run while it trains, when MLflow is reachable.

    Sampled live, not journaled: when MLflow is down there is nothing to replay.
    """
    run_id = t.run_id(node)
    if not (spec.tracking.system_metrics and t.online and run_id):
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=2, tracking_uri=t.tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        with suppress(Exception):  # samples are a nicety; never fail a run on them
            monitor.finish()


def _trained_dirs(trained: list[dict]) -> list[dict]:
    return [e for e in trained if e and e.get("status") == "FINISHED" and Path(e["run_dir"], "summary.json").exists()]


def validate(ctx: dict, trained: list[dict]) -> dict:
    """Predicted vs measured for every trained run; errors per config, median and worst."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        layers_by, model = _load_inputs(ctx)
        done = _trained_dirs(trained)
        if not layers_by or model is None or not done:
            return {"validation": None, "skipped": True, "median_abs_error": None, "worst_abs_error": None}
        from modelling.fit import CommModelError
        from modelling.validate import summarise, validate_runs

        configs = {e["run_dir"]: json.loads(Path(e["run_dir"], "config.json").read_text()) for e in done}
        runs: list[dict[str, Any]] = []
        for wl in spec.workloads:
            for batch in spec.batch_sizes:
                dirs = [
                    Path(d)
                    for d, c in configs.items()
                    if (c["model"], c["dataset"], c["batch_size"]) == (wl.model, wl.dataset, batch)
                ]
                if dirs:
                    try:
                        res = validate_runs(dirs, layers=layers_by[_workload_dir(wl, batch)], comm_model=model)
                    except CommModelError as err:
                        # A fit that beats the stated link is flagged, not used: say so and go on.
                        t.set_tags(node, {"validation_skipped": str(err)[:250]})
                        return {"validation": None, "skipped": True, "reason": str(err),
                                "median_abs_error": None, "worst_abs_error": None}
                    runs += [{**r, "run": Path(str(r["run"])).name} for r in res["runs"]]
        result = summarise(runs)  # repeats of a configuration count once, as their median (DESIGN §4)
        path = _write_json(Path(ctx["run_dir"]) / "validate" / "validation.json", result)
        t.log_artifact(node, path)
        cols = ("run", "predicted_iter_s", "measured_iter_s", "error")
        t.log_table(node, {c: [r.get(c) for r in runs] for c in cols}, "predicted_vs_measured.json")
        from pipelines.report import plot_predicted_vs_measured

        t.log_figure(node, plot_predicted_vs_measured(runs), "predicted_vs_measured.png")
        t.log_metrics(
            node, {"median_abs_error": result["median_abs_error"], "worst_abs_error": result["worst_abs_error"]}
        )
        t.log_metrics(
            PARENT,
            {
                "prediction_median_abs_error": result["median_abs_error"],
                "prediction_worst_abs_error": result["worst_abs_error"],
            },
        )
        return {
            "validation": str(path),
            "skipped": False,
            "median_abs_error": result["median_abs_error"],
            "worst_abs_error": result["worst_abs_error"],
        }

    return _step(ctx, "validate", body)


def report(ctx: dict, trained: list[dict], validation: dict) -> dict:
    """Comparison of the algorithms, plots, regression check against the last good baseline."""
    spec = load_ctx_spec(ctx)

    def body(t: Tracker, node: str) -> dict:
        from pipelines import report as rep

        out = Path(ctx["run_dir"]) / "report"
        runs = rep.collect_runs(_trained_dirs(trained))
        val_path = validation.get("validation") if validation else None
        val = json.loads(Path(val_path).read_text()) if val_path else None
        table = rep.comparison(runs)
        baseline = rep.find_baseline(t, ctx)
        regressions = rep.regressions(table, val, baseline, spec.regression)
        md = rep.write_report(out, ctx, spec, runs, table, val, baseline, regressions)
        for name, fig in rep.figures(runs, table, val).items():
            t.log_figure(node, fig, name)
        t.log_table(node, rep.columns(table), "comparison.json")
        t.log_artifact(node, md)
        t.log_artifact(node, out / "report.json")
        t.log_artifact(PARENT, md, "report")
        t.log_artifact(PARENT, out / "report.json", "report")
        status = "regressed" if regressions else ("passed" if baseline else "no-baseline")
        regression_tags = {
            "ddlbench.regression": status,
            "ddlbench.baseline_run_key": baseline["run_key"] if baseline else "",
        }
        t.set_tags(PARENT, regression_tags)
        t.set_tags(node, regression_tags)
        for row in table:
            t.log_metrics(PARENT, {f"{row['config']}.throughput_samples_per_s": row["throughput_median"]})
        return {
            "report_md": str(md),
            "regressions": regressions,
            "status": status,
            "baseline_run_key": baseline["run_key"] if baseline else None,
            "best": rep.best_per_config(table),
        }

    return _step(ctx, "report", body)


def record_hardware_profile(ctx: dict) -> dict:
    """One artifact of the parent run with the comm fits and layer tables other runs predict from."""
    spec = load_ctx_spec(ctx)
    done = _recorded(ctx, "hardware_profile")
    if done.exists():
        return json.loads(done.read_text())
    layers_by, model = _load_inputs(ctx)
    profile_doc = {
        "hardware": spec.hardware,
        "spec_hash": ctx["spec_hash"],
        "comm_model": model,
        "layers": layers_by or {},
    }
    path = _write_json(Path(ctx["run_dir"]) / "hardware_profile.json", profile_doc)
    t = tracker_for(ctx)
    t.log_artifact(PARENT, path, "hardware_profile")
    t.set_tags(PARENT, {"ddlbench.hardware_profile": "hardware_profile/hardware_profile.json"})
    result = {"hardware_profile": str(path)}
    _write_json(done, result)
    return result


def teardown(ctx: dict) -> dict:
    """Release the cluster; always runs, also after failures, and may run twice."""
    spec = load_ctx_spec(ctx)
    _provider(spec).teardown()
    t = tracker_for(ctx)
    t.set_tags(PARENT, {"ddlbench.teardown": datetime.now(UTC).isoformat(timespec="seconds")})
    return {"provider": spec.provider.name, "torn_down": True}


def finish(ctx: dict, failed: bool = False) -> dict:
    """Close the parent run FINISHED or FAILED; child runs still open are orphans: FAILED."""
    t = tracker_for(ctx)
    orphans = t.end_orphans(everyone=True, keep=(PARENT,))
    status = "FAILED" if failed else "FINISHED"
    t.end_run(PARENT, status)
    synced = t.flush(force=True)
    _write_json(Path(ctx["run_dir"]) / STATUS, {"status": status, "finished_ms": now_ms()})
    return {
        "run_key": ctx["run_key"],
        "status": status,
        "orphans_failed": orphans,
        "synced": synced,
        "pending": t.journal.pending(),
        "parent_run_id": t.run_id(PARENT),
    }


def sync(run_dir: str | Path, tracking_uri: str | None = None, abandoned: bool = False) -> dict:
    """Upload what the run's journal holds and MLflow lacks; end orphaned runs FAILED.

    `abandoned`: the pipeline run will not go on (its Airflow DAG run ended without `finish`),
    so its parent run, which no process owns, is an orphan too.
    """
    run_dir = Path(run_dir)
    ctx = json.loads((run_dir / "ctx.json").read_text())
    if tracking_uri:
        os.environ["MLFLOW_TRACKING_URI"] = tracking_uri  # where a masked URI finds its credentials
        ctx["tracking_uri"] = mask_uri(tracking_uri)
    t = tracker_for(ctx)
    before = t.journal.pending()
    orphans = t.end_orphans(abandoned=abandoned)
    t.flush(force=True)
    pending = t.journal.pending()
    return {
        "run_key": ctx["run_key"],
        "uploaded": before + len(orphans) - pending,
        "pending": pending,
        "orphans_failed": orphans,
        "error": t.last_error,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
