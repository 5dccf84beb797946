"""Real measurements on this machine: profile, microbench, fit, train, predict, validate."""

from __future__ import annotations

import json

import pytest

from infra.hostload import QUIET
from infra.local import LocalProvider
from modelling.measure.layers import load_layers, write_layers
from modelling.measure.microbench import run_microbench
from modelling.measure.profiler import profile_layers
from modelling.network.fit import fit_comm
from modelling.validate import ValidationInputError, validate_runs
from pipelines.launch import launch, prepare

# The model's own error on one host, fed with the run's in-situ compute: what is left is the
# communication model and the DAG's overlap and straggler terms. The bar is 5%; the
# test allows 10%, twice it, for a CI host whose other jobs share the 2 cores during the
# microbenchmark and not during the run (or the other way): a wrong unit or a lost compute term
# moves the prediction by far more. It is held on gpt-mini (80 ms iterations), inside the
# model's stated domain: lenet5 at batch 16 is 2 ms of compute a step, where the two ranks'
# wake-ups for each allreduce on 2 shared cores take a share of the iteration that no
# microbenchmark taken at another moment sees (docs/model-accuracy.md, known limits).
MODEL_TOLERANCE = 0.10
GPT = {"model": "gpt-mini", "dataset": "stdlib-text", "seq_len": 32, "eval_every": 0}


def test_microbench_refuses_bad_input_before_launching(tmp_path) -> None:
    with pytest.raises(ValueError, match="at least 2 ranks"):
        run_microbench(1, 0, tmp_path)
    with pytest.raises(ValueError, match="sizes"):
        run_microbench(2, 0, tmp_path, sizes=[1024])
    assert not (tmp_path / "microbench.json").exists()


def test_profile_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="processes"):
        profile_layers("mlp", 8, processes=0)
    with pytest.raises(ValueError, match="model: unknown model"):
        profile_layers("nosuchnet", 8)


@pytest.mark.slow
@pytest.mark.alone  # predicted against measured iterations
@pytest.mark.timeout(600)
def test_real_profile_microbench_and_validation_on_two_ranks(tmp_path) -> None:
    import torch

    from training.models import build_model

    sizes = [4096, 1 << 20, 4 << 20]  # lenet5's 246 KB lie within them
    comm = run_microbench(2, 0, tmp_path / "mb", sizes=sizes, repeats=5)
    for _ in range(2):  # a microbenchmark timed while other work held the cores is timed again
        if comm["environment"]["host_other_cpu_share"] <= QUIET:
            break
        comm = run_microbench(2, 0, tmp_path / "mb", sizes=sizes, repeats=5)
    prims = {(m["primitive"], m["bytes"]) for m in comm["measurements"]}
    assert prims == {(p, b) for p in ("allreduce", "p2p") for b in sizes}
    assert all(m["median_s"] > 0 and len(m["times_s"]) == 5 for m in comm["measurements"])
    model = fit_comm(comm)
    assert {f["primitive"] for f in model["fits"]} == {"allreduce", "p2p"}
    comm_load = comm["environment"]["host_other_cpu_share"]
    assert 0.0 <= comm_load <= 1.0

    layers = profile_layers("lenet5", 16, dataset="digits", processes=2, warmup=2, repeats=4)
    net = build_model("lenet5", (1, 28, 28), 10)
    expected = [m for m in net.modules() if list(m.parameters(recurse=False))]
    assert [r["type"] for r in layers["layers"]] == [type(m).__name__ for m in expected]
    assert [r["param_bytes"] for r in layers["layers"]] == [
        sum(p.numel() * 4 for p in m.parameters(recurse=False)) for m in expected
    ]
    assert all(r["fwd_s"] > 0 and r["bwd_s"] > 0 for r in layers["layers"])
    assert layers["layers"][0]["output_bytes"] == 16 * 6 * 28 * 28 * 4
    assert len(layers["iteration_samples_s"]) == 4 and layers["layer_time_scale"] > 0
    assert layers["processes"] == 2 and layers["update_s"] > 0 and torch.get_num_threads() >= 1

    run = tmp_path / "run"
    cfg = prepare({"model": "lenet5", "dataset": "digits", "workers": 2, "batch_size": 16, "steps": 30}, "test")
    summary = launch(cfg, run, LocalProvider(), timeout_s=300, echo=False)
    assert 0.0 <= summary["environment"]["host_other_cpu_share"] <= 1.0  # measured: the ranks are ours
    with pytest.raises(ValidationInputError, match="no layers.json"):
        validate_runs([run])
    write_layers(layers, run)
    assert load_layers(run / "layers.json")["model"] == "lenet5"
    (tmp_path / "model.json").write_text(json.dumps(model))  # beside the run dir
    result = validate_runs([run])
    [r] = result["runs"]
    assert r["measured_iter_s"] == summary["iter_time_s"]["p50"]
    assert r["algorithm"] == "ssgd" and r["comm"] == "allreduce" and r["workers"] == 2
    assert r["placement"] == "one host" and result["configs"][0]["placement"] == "one host"
    # The end-to-end error carries the drift between the profile and the run (other work on the
    # host moves a separate profile by tens of percent); the model's error, the DAG fed with the
    # run's own in-situ layer compute, does not, and is what this test holds the model to.
    assert r["model_error"] is not None and r["repeat_spread"] == 0.0
    insitu = load_layers(run / "layers_insitu.json")
    assert [x["name"] for x in insitu["layers"]] == [x["name"] for x in layers["layers"]]
    assert result["median_abs_error"] == abs(r["error"])
    # 30 steps sample 3 iterations in situ, fewer than a model error is reported on
    assert r["model_error_samples"] == insitu["sampled_iterations"] == 3 and r["model_error_note"]
    assert result["median_abs_model_error"] is None

    # The model's accuracy, on a workload whose compute is long against the host's scheduling:
    # gpt-mini, profiled by block, two runs (a second repeat gives the configuration's noise
    # floor: an error below twice the repeats' spread cannot be told from the host's drift).
    gpt = tmp_path / "gpt"
    gpt.mkdir()
    (gpt / "model.json").write_text(json.dumps(model))
    table = profile_layers("gpt-mini", 32, dataset="stdlib-text", input_shape=(1, 1, 32), processes=2,
                           warmup=2, repeats=8)
    gcfg = prepare({**GPT, "workers": 2, "batch_size": 32, "steps": 30}, "test")
    runs = []
    for name in ("r0", "r1"):
        gsummary = launch(gcfg, gpt / name, LocalProvider(), timeout_s=300, echo=False)
        write_layers(table, gpt / name)
        runs.append(gpt / name)
        share = gsummary["environment"]["host_other_cpu_share"]
        if share > QUIET:
            # Other work took the CPU the two ranks need to meet in each allreduce: the iteration
            # then measures the host's scheduling, which no model of this job predicts.
            pytest.skip(f"the host was loaded during the run (other work used {share:.0%} of its CPU, over the "
                        f"{QUIET:.0%} of a quiet host): the model's error not held to {MODEL_TOLERANCE:.0%}")
    if comm_load > QUIET:
        # The communication costs were timed while other work held the cores: the model's
        # allreduce is then the host's scheduling, and the error no test of the model.
        pytest.skip(f"the host was loaded during the microbenchmark (other work used {comm_load:.0%} of its CPU)")
    (c,) = validate_runs(runs)["configs"]
    assert c["model"] == "gpt-mini" and c["repeats"] == 2 and c["model_error"] is not None
    assert abs(c["model_error"]) <= max(MODEL_TOLERANCE, 2 * c["repeat_spread"]), json.dumps(c, default=str)


@pytest.mark.slow
@pytest.mark.alone  # predicted against measured iterations
@pytest.mark.timeout(1500)
def test_a_reduced_validation_spec_end_to_end_through_ddlbench_run(tmp_path) -> None:
    """specs/validation/onehost-lenet5.yaml, reduced (2 algorithms, 2 repeats, 2 pooled rounds),
    through the command a user types: both errors per configuration, the repeat spread, the
    intervals and their summary keys in validation.json, report.json and MLflow."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from mlflow import MlflowClient

    repo = Path(__file__).resolve().parent.parent
    sets = ["steps=30", "repeats=2", "algorithms=[{name: ssgd, comm: allreduce}, {name: odsgd, comm: ps}]",
            "profile.pooled=2", "profile.repeats=5", "microbench.pooled=2", "microbench.repeats=3"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ddlbench"), "run", str(repo / "specs/validation/onehost-lenet5.yaml"),
         "--home", str(tmp_path), "--run-key", "val", *(a for s in sets for a in ("--set", s))],
        cwd=repo, env=env | {"COLUMNS": "200"}, capture_output=True, text=True, timeout=1400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "val"
    val = json.loads((run_dir / "validate" / "validation.json").read_text())
    assert len(val["configs"]) == 2 and len(val["runs"]) == 4
    for c in val["configs"]:
        mine = [r for r in val["runs"] if r["run"] in c["runs"]]
        assert c["repeats"] == len(mine) == 2
        for r in mine:
            # Each repeat's measured iteration is its own training run's, and its model figure
            # rests on that run's in-situ table. (The spread and error arithmetic on these rows
            # is held to hand-written numbers in the test below, not recomputed here.)
            summary = json.loads((run_dir / "train" / r["run"] / "summary.json").read_text())
            assert r["measured_iter_s"] == summary["iter_time_s"]["p50"] > 0
            insitu = json.loads((run_dir / "train" / r["run"] / "layers_insitu.json").read_text())
            assert r["model_predicted_iter_s"] > 0 and r["model_error_samples"] == insitu["sampled_iterations"]
            assert r["repeat_spread"] == c["repeat_spread"]
        assert c["model_error_note"] is None  # two repeats' in-situ samples suffice
        assert c["predicted_p10_s"] <= c["predicted_p90_s"]
    assert val["interval_inputs"] == {"profile_rounds": 2, "microbench_rounds": 2}
    assert len(list((run_dir / "profile").glob("*/r*/layers.json"))) == 2
    assert len(list((run_dir / "microbench").glob("w2/r*/comm.json"))) == 2
    # every prediction, the what-if sizes too, with its interval around it
    assert val["predictions"] and all(
        p["iter_time_p10_s"] <= p["iter_time_p90_s"] for p in val["predictions"])
    report = json.loads((run_dir / "report" / "report.json").read_text())["validation"]
    # The report carries validation.json's summary, over both configurations.
    assert val["median_abs_model_error"] is not None and val["configs_model_error_too_few_samples"] == 0
    for key in ("median_abs_model_error", "worst_abs_model_error", "median_abs_error", "worst_abs_error"):
        assert report[key] == val[key], key
    assert "model error" in (run_dir / "report" / "report.md").read_text()
    assert "end to end" in proc.stdout and "model" in proc.stdout
    # the MLflow validate run carries both errors per configuration as metrics
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-adhoc")
    [validate] = client.search_runs([exp.experiment_id], "tags.`ddlbench.node` = 'validate'")
    metrics = validate.data.metrics
    for c in val["configs"]:
        label = f"lenet5-{c['algorithm']}-{c['comm']}-w2-b32"
        assert metrics[f"{label}.error"] == pytest.approx(c["error"])
        assert metrics[f"{label}.model_error"] == pytest.approx(c["model_error"])
        assert metrics[f"{label}.repeat_spread"] == pytest.approx(c["repeat_spread"])
    assert metrics["median_abs_model_error"] == pytest.approx(report["median_abs_model_error"])


def test_repeat_spread_and_errors_of_hand_written_rows() -> None:
    """validate's per-configuration arithmetic on rows written out by hand, each expected figure
    worked out by hand: the median measured and predicted iteration over a configuration's
    repeats, the errors against them, the spread of the repeats, and the summary over the
    configurations, with a model error on too few in-situ samples left out of it."""
    from modelling.validate import summarise

    def row(run, algorithm, comm, measured, predicted, model, samples):
        return {"run": run, "model": "m", "algorithm": algorithm, "comm": comm, "workers": 2,
                "servers": 0 if comm == "allreduce" else 1, "batch_size": 32, "measured_iter_s": measured,
                "predicted_iter_s": predicted, "model_predicted_iter_s": model, "model_error_samples": samples,
                "no_prediction": None}

    result = summarise([
        row("a", "ssgd", "allreduce", 0.100, 0.090, 0.121, 2),
        row("b", "ssgd", "allreduce", 0.125, 0.090, 0.121, 2),  # the slowest repeat, 25% over the fastest
        row("c", "ssgd", "allreduce", 0.110, 0.099, 0.110, 2),
        row("d", "odsgd", "ps", 0.200, 0.260, 0.140, 5),
        row("e", "asgd", "ps", 0.050, 0.050, 0.500, 3),  # 3 samples: its model error is no figure
    ])
    ssgd, odsgd, asgd = result["configs"]
    # ssgd: measured median 0.110 s, predicted median 0.090 s, model median 0.121 s.
    assert (ssgd["repeats"], ssgd["measured_iter_s"], ssgd["model_predicted_iter_s"]) == (3, 0.110, 0.121)
    assert ssgd["repeat_spread"] == pytest.approx(0.25)  # 0.125 / 0.100 - 1
    assert ssgd["error"] == pytest.approx(-2 / 11)  # (0.090 - 0.110) / 0.110
    assert ssgd["model_error"] == pytest.approx(0.1)  # (0.121 - 0.110) / 0.110
    assert (ssgd["model_error_samples"], ssgd["model_error_note"]) == (6, None)
    # odsgd, one repeat: no spread; 30% over and under its 0.200 s.
    assert odsgd["repeat_spread"] == 0.0
    assert (odsgd["error"], odsgd["model_error"]) == (pytest.approx(0.3), pytest.approx(-0.3))
    assert asgd["model_error"] == pytest.approx(9.0) and asgd["model_error_note"] == (
        "rests on 3 in-situ samples, fewer than 5")
    assert [r["repeat_spread"] for r in result["runs"]] == pytest.approx([0.25, 0.25, 0.25, 0.0, 0.0])
    # Over configurations: |errors| 2/11, 0.3, 0.0; model errors 0.1 and 0.3 (asgd's left out).
    assert result["median_abs_error"] == pytest.approx(2 / 11) and result["worst_abs_error"] == pytest.approx(0.3)
    assert result["median_abs_model_error"] == pytest.approx(0.2)
    assert result["worst_abs_model_error"] == pytest.approx(0.3)
    assert result["configs_model_error_too_few_samples"] == 1
    assert (result["median_repeat_spread"], result["worst_repeat_spread"]) == (0.0, pytest.approx(0.25))


def test_the_insitu_table_replaces_the_profiles_compute_and_nothing_else() -> None:
    from modelling.measure.layers import LayersError
    from modelling.validate import insitu_layers

    def table(fwd: float, names=("conv", "fc"), **extra) -> dict:
        rows = [{"name": n, "type": "Linear", "fwd_s": fwd, "bwd_s": 2 * fwd, "param_bytes": 64} for n in names]
        return {"model": "m", "batch_size": 32, "layers": rows, "update_s": 0.5, "data_s": 0.1, **extra}

    profile = table(1.0, pack_s=0.3, iteration_samples_s=[4.0, 5.0])
    own = insitu_layers(profile, table(2.0, update_s=9.0, data_s=0.2, iteration_samples_s=[6.0]))
    assert [(r["fwd_s"], r["bwd_s"]) for r in own["layers"]] == [(2.0, 4.0), (2.0, 4.0)]
    assert (own["data_s"], own["iteration_samples_s"]) == (0.2, [6.0])
    # what training does not time per layer stays the profile's
    assert (own["update_s"], own["pack_s"]) == (0.5, 0.3)
    with pytest.raises(LayersError, match="layers_insitu.json: its layers"):
        insitu_layers(profile, table(2.0, names=("conv", "other")))
