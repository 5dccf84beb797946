"""Predicted against measured iteration time for training runs (DESIGN §3).

Each run directory's summary.json names its configuration; the prediction uses
the layer table and comm model given, or else layers.json / model.json found
in the run directory or beside it (its parent).

Two errors per run and configuration: `error`, end to end (the DAG fed with the profile,
as for a configuration not run), and `model_error`, the DAG fed with the run's own
per-layer compute measured in situ (layers_insitu.json, training/measure/layer_timing.py), which
leaves what the model itself gets wrong. Beside them `repeat_spread`, max/min - 1 of the
configuration's repeats' measured iteration: the noise floor under which an error means
nothing.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from modelling.measure.files import read_json
from modelling.measure.layers import LayersError, check_layers, load_layers
from modelling.measure.records import load_comm
from modelling.network.fit import fit_comm, load_comm_model
from modelling.predict import predict
from modelling.scenario import Scenario


class ValidationInputError(ValueError):
    """A run directory, layer table or comm model is missing or does not match."""


INSITU_FILE = "layers_insitu.json"  # training.measure.layer_timing.INSITU_FILE, without importing torch

# The fewest sampled iterations (over a configuration's repeats) a model error is reported on.
# The in-situ table takes each layer's median share of the sampled passes: a median of 5 still
# stands when 2 of them were cut into by other work on the host, while with 1-3 samples one such
# pass sets the shares, and the model error would measure that pass rather than the model.
MIN_INSITU_SAMPLES = 5


def insitu_layers(profile: dict[str, Any], insitu: dict[str, Any]) -> dict[str, Any]:
    """The profile's table with the run's own compute: each layer's forward and backward, the
    batch load and the whole-iteration jitter measured in situ. What training does not time
    per layer (the optimizer step, packing, the shards' work) stays the profile's."""
    by_name = {r["name"]: r for r in insitu["layers"]}
    if set(by_name) != {r["name"] for r in profile["layers"]}:
        raise LayersError(
            f"{INSITU_FILE}: its layers ({', '.join(by_name)}) are not the profile's "
            f"({', '.join(r['name'] for r in profile['layers'])})"
        )
    scale = profile["batch_size"] / insitu["batch_size"]  # the profile's batch, as the scenario scales it
    table = {
        **profile,
        "layers": [r | {"fwd_s": by_name[r["name"]]["fwd_s"] * scale, "bwd_s": by_name[r["name"]]["bwd_s"] * scale}
                   for r in profile["layers"]],
        "data_s": insitu["data_s"] * scale,
        "source": "in situ",
    }
    if insitu.get("iteration_samples_s"):
        table["iteration_samples_s"] = [x * scale for x in insitu["iteration_samples_s"]]
    return table


def _insitu(run: Path, profile: dict[str, Any]) -> dict[str, Any] | None:
    path = run / INSITU_FILE
    if not path.is_file():
        return None
    try:
        return insitu_layers(profile, check_layers(read_json(path, INSITU_FILE, LayersError), str(path)))
    except LayersError as err:
        raise ValidationInputError(str(err)) from None


def insitu_samples(run: Path) -> int | None:
    """How many sampled iterations the run's in-situ table rests on; None where it has no table,
    or one that does not say."""
    path = run / INSITU_FILE
    if not path.is_file():
        return None
    n = read_json(path, INSITU_FILE, ValidationInputError).get("sampled_iterations")
    return None if n is None else int(n)


def too_few_samples(samples: int | None) -> str | None:
    """Why a model error is not a figure, or None where its in-situ samples suffice."""
    if samples is None or samples >= MIN_INSITU_SAMPLES:
        return None
    return f"rests on {samples} in-situ samples, fewer than {MIN_INSITU_SAMPLES}"


def _find(run: Path, name: str) -> Path | None:
    return next((p for p in (run / name, run.parent / name) if p.is_file()), None)


def _comm_model_for(run: Path) -> dict[str, Any]:
    path = _find(run, "model.json")
    if path:
        return load_comm_model(path)
    comm = _find(run, "comm.json")
    if comm:  # measured but not yet fitted: fit now
        return fit_comm(load_comm(comm))
    raise ValidationInputError(
        f"{run}: no comm model (model.json, or comm.json to fit) in the run dir or beside it; "
        "pass --comm-model or run `ddlbench microbench` and `ddlbench fit`"
    )


def _summary(run: Path) -> dict[str, Any]:
    path = run / "summary.json"
    if not path.is_file():
        raise ValidationInputError(f"{run}: no summary.json; is it a training run directory?")
    summary = read_json(path, "summary.json", ValidationInputError)
    if summary.get("status") != "completed" or not summary.get("iter_time_s"):
        raise ValidationInputError(f"{path}: the run did not complete (status {summary.get('status')!r})")
    return summary


def validate_run(
    run: Path, layers: dict[str, Any] | None = None, comm_model: dict[str, Any] | None = None
) -> dict[str, Any]:
    summary = _summary(run)
    if layers is None:
        path = _find(run, "layers.json")
        if path is None:
            raise ValidationInputError(
                f"{run}: no layers.json in the run dir or beside it; pass --layers or run "
                f"`ddlbench profile --model {summary['model']}`"
            )
        layers = load_layers(path)
    if layers["model"] != summary["model"]:
        raise ValidationInputError(
            f"{run}: the run trained {summary['model']} but the layer table profiles {layers['model']}"
        )
    comm_model = comm_model if comm_model is not None else _comm_model_for(run)
    scenario = Scenario.from_summary(summary)
    # A configuration the model cannot predict still has its measured row, with the reason in
    # place of the figures: one run the model misses does not hide the others' validation.
    [pred] = predict(layers, comm_model, scenario, strict=False)
    own = _insitu(run, layers)
    [pred_own] = predict(own, comm_model, scenario, strict=False) if own else [None]
    # The median iteration time, as every measured figure (DESIGN §4); the mean, which
    # throughput pays and which one slow iteration moves, is reported beside it. ASGD has no
    # barrier: its workers keep their own paces (beside a colocated shard, one may step twice
    # per step of a remote one), the model predicts the mean of their periods, and each
    # worker's mean period over the window they all run in is what compares with it.
    it = summary["iter_time_s"]
    statistic = "worker_mean" if summary["algorithm"] == "asgd" and it.get("worker_mean") else "p50"
    measured = it[statistic]
    mean = it.get("mean") or measured
    memory = (summary.get("memory") or {}).get("peak_bytes")
    return {
        "run": str(run),
        "algorithm": summary["algorithm"],
        "comm": summary["comm"],
        "workers": summary["workers"],
        "servers": summary.get("servers", 0),
        "model": summary["model"],
        "batch_size": summary["batch_size"],
        "placement": placement_label(summary),
        "predicted_iter_s": pred["iter_time_s"],
        "measured_iter_s": measured,
        "measured_statistic": statistic,
        "error": _error(pred["iter_time_s"], measured),
        "model_predicted_iter_s": pred_own["iter_time_s"] if pred_own else None,
        "model_error": _error(pred_own["iter_time_s"], measured) if pred_own else None,
        "model_error_samples": insitu_samples(run) if pred_own else None,
        "measured_iter_mean_s": mean,
        "error_vs_mean": _error(pred["iter_time_s"], mean),
        "predicted_compute_s": pred["compute_s"],
        "predicted_comm_s": pred["comm_s"],
        "measured_breakdown_s": summary.get("breakdown_s"),
        "no_prediction": pred["no_prediction"],
        # Whether the model is validated where this run lies, or why not (modelling/calibration.py).
        "domain": pred.get("domain", "validated"),
        # The largest rank's tensor bytes, predicted (modelling/memory.py) and counted by the run.
        "memory_predicted_bytes": pred.get("memory_bytes"),
        "memory_measured_bytes": memory,
        "memory_error": _error(pred.get("memory_bytes"), memory) if memory else None,
    }


def _error(predicted: float | None, measured: float) -> float | None:
    return None if predicted is None else (predicted - measured) / measured


def validate_runs(
    run_dirs: list[Path], *, layers: dict[str, Any] | None = None, comm_model: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per run, then per configuration: repeats of one configuration count once, as the
    median of their measured (and predicted) iteration times (DESIGN §4), and the median
    and worst absolute error are over configurations."""
    if not run_dirs:
        raise ValidationInputError("run: give at least one training run directory")
    return summarise([validate_run(Path(r), layers, comm_model) for r in run_dirs])


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """validate_run rows (from one call or several) with their configurations and errors."""
    configs = group_repeats(runs)
    spread = {r: c["repeat_spread"] for c in configs for r in c["runs"]}
    runs = [r | {"repeat_spread": spread[r["run"]], "model_error_note": too_few_samples(r.get("model_error_samples"))}
            for r in runs]
    errors = [abs(c["error"]) for c in configs if c["error"] is not None]
    # A model error on too few in-situ samples stays on its row, marked, out of the figures.
    model = [abs(c["model_error"]) for c in configs if c["model_error"] is not None and not c["model_error_note"]]
    memory = [abs(c["memory_error"]) for c in configs if c["memory_error"] is not None]
    return {
        "runs": runs,
        "configs": configs,
        "median_abs_error": statistics.median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
        # Over the configurations whose runs timed their layers in situ, on enough samples.
        "median_abs_model_error": statistics.median(model) if model else None,
        "worst_abs_model_error": max(model) if model else None,
        "median_abs_memory_error": statistics.median(memory) if memory else None,
        "worst_abs_memory_error": max(memory) if memory else None,
        # Configurations with a measured row and no prediction (`no_prediction` says why).
        "configs_without_prediction": sum(c["error"] is None for c in configs),
        # Configurations whose model error rests on fewer than MIN_INSITU_SAMPLES samples.
        "configs_model_error_too_few_samples": sum(bool(c["model_error_note"]) for c in configs),
        "median_repeat_spread": statistics.median(c["repeat_spread"] for c in configs) if configs else None,
        "worst_repeat_spread": max(c["repeat_spread"] for c in configs) if configs else None,
    }


CONFIG_KEYS = ("model", "algorithm", "comm", "workers", "servers", "batch_size", "placement")


def placement_label(summary: dict[str, Any]) -> str:
    """'one host', or '2 nodes colocated': runs of one configuration on other placements are other
    configurations (another cluster, other links), not repeats."""
    p = summary.get("placement") or {}
    nodes = p.get("nodes") or 1
    return "one host" if nodes == 1 else f"{nodes} nodes {p.get('policy')}"


def group_repeats(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: the median over its repeats."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        key = tuple(r.get(k, "one host" if k == "placement" else None) for k in CONFIG_KEYS)
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        predicted = _median_of_every(rs, "predicted_iter_s")
        measured = statistics.median(r["measured_iter_s"] for r in rs)
        model = _median_of_every(rs, "model_predicted_iter_s")
        times = [r["measured_iter_s"] for r in rs]
        samples = _sum_of_every(rs, "model_error_samples") if model is not None else None
        memory = {k: _median_of_every(rs, f"memory_{k}_bytes") for k in ("predicted", "measured")}
        out.append(
            {
                **dict(zip(CONFIG_KEYS, key, strict=True)),
                "repeats": len(rs),
                "runs": [r["run"] for r in rs],
                "predicted_iter_s": predicted,
                "measured_iter_s": measured,
                "error": _error(predicted, measured),
                "no_prediction": next((r["no_prediction"] for r in rs if r.get("no_prediction")), None),
                "domain": next((r["domain"] for r in rs if r.get("domain", "validated") != "validated"), "validated"),
                "model_predicted_iter_s": model,
                "model_error": _error(model, measured),
                "model_error_samples": samples,
                "model_error_note": too_few_samples(samples),
                "repeat_spread": max(times) / min(times) - 1,
                "memory_predicted_bytes": memory["predicted"],
                "memory_measured_bytes": memory["measured"],
                "memory_error": _error(memory["predicted"], memory["measured"]) if memory["measured"] else None,
            }
        )
    return out


def _median_of_every(rs: list[dict[str, Any]], key: str) -> float | None:
    """The median of every repeat's figure, or None where one has none: an error from part of
    the repeats would compare against the median of all their measurements."""
    values = [r.get(key) for r in rs]
    return statistics.median(values) if None not in values else None


def _sum_of_every(rs: list[dict[str, Any]], key: str) -> int | None:
    values = [r.get(key) for r in rs]
    return sum(values) if None not in values else None
