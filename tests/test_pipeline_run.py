"""`ddlbench run` of the smoke spec end to end against a real SQLite MLflow store, read back
through MlflowClient; the same run key twice; the regression check against the history.

The module's run is read, never changed: a test that runs more into a home works on its own copy
of it (`own_home`), so its counts are exact and the tests pass in any order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.spec import load_spec
from tests.homes import copy_home

# alone: the regression check abstains when the host was loaded while the runs trained.
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
KEY = "smoke-e2e"
CONFIGS = ["lenet5-ssgd-allreduce-w2-b32-r0", "lenet5-odsgd-ps-w2-b32-r0", "lenet5-asgd-ps-w2-b32-r0"]
SMOKE_STEPS = load_spec(SMOKE).steps
STEPS = ["provision", "microbench", "profile", "fit", "predict", "validate", "suspects", "report"]


def _ddlbench(*args: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """The installed `ddlbench` command, with the default tracking store (sqlite in the home)."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["COLUMNS"] = "250"
    return subprocess.run(
        [str(Path(sys.executable).parent / "ddlbench"), *args, "--home", str(home)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One smoke run shared by the module's tests (default store: sqlite in the home)."""
    from mlflow import MlflowClient

    home = tmp_path_factory.mktemp("ddlbench-home")
    proc = _ddlbench("run", str(SMOKE), "--run-key", KEY, home=home)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ddlbench-adhoc")
    return {
        "home": home,
        "run_dir": home / "runs" / KEY,
        "client": client,
        "exp": exp.experiment_id,
        "stdout": proc.stdout,
    }


@pytest.fixture
def own_home(pipeline: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """A copy of the module run's home (run directory, MLflow store, artifacts) as `pipeline`
    gives it, its paths (ctx.json, the steps' outputs, the store's artifact locations) in the copy."""
    from mlflow import MlflowClient

    home = copy_home(pipeline["home"], tmp_path / "home")
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    return {**pipeline, "home": home, "run_dir": home / "runs" / KEY, "client": client}


def _runs(p: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    runs = p["client"].search_runs([p["exp"]], f"tags.`ddlbench.run_key` = '{key}'", max_results=100)
    by_node: dict[str, Any] = {}
    for r in runs:
        node = r.data.tags["ddlbench.node"]
        assert node not in by_node, f"two MLflow runs for {node}"
        by_node[node] = r
    return by_node


def test_parent_and_child_runs_finished_and_tagged(pipeline: dict[str, Any]) -> None:
    runs = _runs(pipeline)
    assert set(runs) == {"pipeline", *STEPS, *(f"train/{c}" for c in CONFIGS)}
    parent = runs["pipeline"]
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    ctx = json.loads((pipeline["run_dir"] / "ctx.json").read_text())
    assert parent.info.run_id == ctx["parent_run_id"]
    tags = parent.data.tags
    assert tags["ddlbench.hardware"] == "cpu-local"
    assert tags["ddlbench.spec_hash"] == ctx["spec_hash"]
    assert len(tags["ddlbench.git_commit"]) == 40
    assert tags["ddlbench.regression"] == "no-baseline"
    for node, r in runs.items():
        if node != "pipeline":
            assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id, node
    # the flattened spec as params of the parent
    assert parent.data.params["spec.workers"] == "[2]"
    assert parent.data.params["spec.algorithms.1.name"] == "odsgd"
    assert "run smoke-e2e" in pipeline["stdout"] and "FINISHED" in pipeline["stdout"]


def test_training_runs_hold_params_curves_summaries_and_artifacts(pipeline: dict[str, Any]) -> None:
    client, runs = pipeline["client"], _runs(pipeline)
    for config in CONFIGS:
        run = runs[f"train/{config}"]
        out = pipeline["run_dir"] / "train" / config
        summary = json.loads((out / "summary.json").read_text())
        cfg = json.loads((out / "config.json").read_text())
        params = run.data.params
        assert (params["algorithm"], params["comm"], params["workers"]) == (
            cfg["algorithm"],
            cfg["comm"],
            str(cfg["workers"]),
        )
        assert params["lr"] == str(cfg["lr"]) and params["steps"] == str(SMOKE_STEPS)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
        history = client.get_metric_history(run.info.run_id, "train/loss")
        assert len(loss) == SMOKE_STEPS and {m.step: m.value for m in history} == pytest.approx(loss)
        acc = client.get_metric_history(run.info.run_id, "eval/accuracy")
        assert [m.step for m in acc] == [r["step"] for r in rows if "accuracy" in r]
        assert len(client.get_metric_history(run.info.run_id, "train/throughput_samples_per_s")) == SMOKE_STEPS
        m = run.data.metrics
        assert m["throughput_samples_per_s"] == pytest.approx(summary["throughput_samples_per_s"])
        assert m["iter_time_p50_s"] == pytest.approx(summary["iter_time_s"]["p50"])
        assert m["comm_exposed_s"] == pytest.approx(summary["breakdown_s"]["comm_exposed"])
        assert m["final_accuracy"] == pytest.approx(summary["final_accuracy"])
        # The demo runs long enough that every algorithm reaches the smoke target.
        evals = {r["step"]: r for r in rows if "accuracy" in r}
        assert summary["target_reached"] is True, (config, summary["final_accuracy"])
        first = min(s for s, r in evals.items() if r["accuracy"] >= summary["target_accuracy"])
        assert summary["steps_to_accuracy"] == first
        assert summary["time_to_accuracy_s"] == pytest.approx(evals[first]["time_s"])
        assert 0 < summary["time_to_accuracy_s"] <= summary["train_time_s"]
        assert any(k.startswith("system/") for k in m), "system metrics sampled while training"
        arts = {a.path for a in client.list_artifacts(run.info.run_id, "training")}
        assert {"training/summary.json", "training/trace.json", "training/timeline.jsonl"} <= arts


def test_step_runs_hold_model_artifacts_tables_and_plots(
    pipeline: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, runs = pipeline["client"], _runs(pipeline)

    def paths(node: str, sub: str | None = None) -> set[str]:
        return {a.path for a in client.list_artifacts(runs[node].info.run_id, sub)}

    assert "w2/comm.json" in paths("microbench", "w2")
    assert "lenet5-digits-b32/layers.json" in paths("profile", "lenet5-digits-b32")
    assert {"model.json", "comm_fits.json"} <= paths("fit")
    assert runs["fit"].data.metrics["p2p.w2.beta_s_per_byte"] > 0
    assert {"predictions_table.json", "predicted_throughput.png"} <= paths("predict")
    assert {"predicted_vs_measured.json", "predicted_vs_measured.png"} <= paths("validate")
    assert "throughput_scaling.png" not in paths("report")  # one world size: a plot of one point is not drawn
    assert {
        "accuracy_vs_time.png",
        "iteration_breakdown.png",
        "predicted_vs_measured.png",
        "comparison.json",
        "report.md",
    } <= paths("report")
    assert {"spec/spec.yaml", "spec/spec.json"} <= paths("pipeline", "spec")
    # load_table searches through the fluent API, which reads the URI from the environment
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{pipeline['home'] / 'mlflow.db'}")
    table = client.load_table(pipeline["exp"], "predicted_vs_measured.json", run_ids=[runs["validate"].info.run_id])
    assert sorted(table["run"]) == sorted(CONFIGS)
    validation = json.loads((pipeline["run_dir"] / "validate" / "validation.json").read_text())
    assert runs["validate"].data.metrics["median_abs_error"] == pytest.approx(validation["median_abs_error"])
    md = (pipeline["run_dir"] / "report" / "report.md").read_text()
    for algo in ("ssgd-allreduce", "odsgd-ps", "asgd-ps"):
        assert algo in md
    # the first run of this spec here: the regression section says there is no history to test against
    assert "## Regression check" in md and "one-sided t test" in md and "Result: **no-baseline**" in md


def test_same_run_key_again_resumes_without_new_runs(own_home: dict[str, Any]) -> None:
    before = {n: r.info.run_id for n, r in _runs(own_home).items()}
    proc = _ddlbench("run", str(SMOKE), "--run-key", KEY, home=own_home["home"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = _runs(own_home)
    assert {n: r.info.run_id for n, r in after.items()} == before
    assert {r.info.status for r in after.values()} == {"FINISHED"}
    history = own_home["client"].get_metric_history(after[f"train/{CONFIGS[0]}"].info.run_id, "train/loss")
    assert len(history) == SMOKE_STEPS


def test_regression_check_finds_the_baseline_and_flags_a_drop(
    own_home: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second run of the same spec finds the first as its history, too short for a statement;
    slowed copies of the same training runs (every repeat 40% slower) are flagged against the two
    (min_history 2 here; the regression section leaves the spec hash as it is)."""
    from pipelines import steps

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    home = str(own_home["home"])
    first = json.loads((own_home["run_dir"] / "steps" / "validate.json").read_text())
    trained = [json.loads((own_home["run_dir"] / "steps" / "train" / f"{c}.json").read_text()) for c in CONFIGS]
    ctx = steps.call("start", str(SMOKE), run_key="smoke-e2e-same", home=home)
    same = steps.call("report", ctx, trained, first)
    steps.call("finish", ctx)
    assert same["status"] == "short-history" and same["baseline_run_key"] == KEY and same["regressions"] == []
    assert same["detail"] == "history too short (1 of 3 runs)"
    slow = []
    for e in trained:
        copy = tmp_path / e["key"]
        copy.mkdir()
        s = json.loads(Path(e["run_dir"], "summary.json").read_text())
        s["throughput_samples_per_s"] *= 0.6
        (copy / "summary.json").write_text(json.dumps(s))
        slow.append({**e, "run_dir": str(copy)})
    # Against a reference hardware: here the smoke spec's own label, whose newest run with training
    # runs (the report-only run above has none) is the module's.
    hardware = load_spec(SMOKE).hardware
    ctx = steps.call("start", str(SMOKE), run_key="smoke-e2e-slow", home=home,
                      overrides={"regression.min_history": 2, "regression.reference_hardware": hardware})
    slowed = steps.call("report", ctx, slow, first)
    steps.call("finish", ctx)
    reference = json.loads((own_home["home"] / "runs" / "smoke-e2e-slow" / "report" / "report.json").read_text())[
        "reference"]
    assert (reference["hardware"], reference["run_key"]) == (hardware, KEY)
    assert {r["config"]: r["ratio"] for r in reference["rows"]} == pytest.approx(
        {c.removesuffix("-r0"): 0.6 for c in CONFIGS})
    assert f"## Against {hardware}" in Path(slowed["report_md"]).read_text()
    assert slowed["status"] == "regressed" and slowed["history_runs"] == 2
    assert {r["config"] for r in slowed["regressions"]} == {c.removesuffix("-r0") for c in CONFIGS}
    # two identical history runs: no spread, so the drop is certain
    assert all(r["change"] == pytest.approx(-0.4) and r["p_value"] == 0.0 for r in slowed["regressions"])
    parent = _runs(own_home, "smoke-e2e-slow")["pipeline"]
    assert parent.data.tags["ddlbench.regression"] == "regressed"


def test_training_runs_group_by_config_and_log_their_dataset(
    own_home: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `ddlbench.config` tag (the config without its repeat index) groups a config's repeats
    in MLflow's runs table; every training run logs its data set as an MLflow dataset input."""
    from pipelines import steps

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    client = own_home["client"]
    ctx = steps.call("start", str(SMOKE), run_key="smoke-e2e-repeat", home=str(own_home["home"]),
                     overrides={"repeats": 2})
    entry = next(e for e in steps.call("train_configs", ctx) if e["key"] == "lenet5-ssgd-allreduce-w2-b32-r1")
    assert steps.call("train", ctx, entry)["status"] == "FINISHED"
    steps.call("finish", ctx)
    group = client.search_runs([own_home["exp"]], "tags.`ddlbench.config` = 'lenet5-ssgd-allreduce-w2-b32'")
    assert sorted(r.data.tags["ddlbench.repeat"] for r in group) == ["0", "1"]
    assert {r.info.status for r in group} == {"FINISHED"}
    a, b = (r.data.params for r in group)
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == {"seed"}  # repeats differ by seed only
    digests = set()
    for node, run in _runs(own_home).items():
        if not node.startswith("train/"):
            continue
        assert run.data.tags["ddlbench.config"] == node.removeprefix("train/").removesuffix("-r0")
        inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert [(i.dataset.name, i.dataset.source_type) for i in inputs] == [("digits", "code")]
        assert {(t.key, t.value) for t in inputs[0].tags} == {("mlflow.data.context", "training")}
        assert json.loads(inputs[0].dataset.source) == {"tags": {"mlflow.source.name": "sklearn.datasets.load_digits"}}
        digests.add(inputs[0].dataset.digest)
    assert len(digests) == 1  # one data set, whatever the algorithm


def _compare_block(output: str, key: str) -> list[str]:
    """The lines of `ddlbench compare`'s table of one pipeline run (titled by its run key)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(key + "  "))
    end = next((i for i in range(start + 1, len(lines)) if "regression:" in lines[i]), len(lines))
    return lines[start:end]


def test_compare_prints_the_runs_found_by_search(pipeline: dict[str, Any]) -> None:
    from click.testing import CliRunner

    from pipelines.cli import cli

    runner = CliRunner(env={"COLUMNS": "100", "MLFLOW_TRACKING_URI": None})
    home = str(pipeline["home"])
    out = runner.invoke(
        cli, ["compare", "--suite", "adhoc", "--hardware", "cpu-local", "--since", "2020-01-01", "--home", home]
    )
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= 100
    block = _compare_block(out.output, KEY)
    rows = [line for line in block if line.split()[:1] and line.split()[0] in {c.removesuffix("-r0") for c in CONFIGS}]
    assert len(rows) == len(CONFIGS)
    assert sum("*" in row for row in rows) == 1  # the fastest algorithm of the one config group
    # smoke has one world size: no row has a scaling baseline, so the table has no such column
    assert "scaling" not in "\n".join(block) and "no 1-worker" not in "\n".join(block)
    assert "samples/s" in "\n".join(block)
    out = runner.invoke(cli, ["compare", "--suite", "adhoc", "--since", "2999-01-01", "--home", home])
    assert "no runs found" in out.output


def test_the_report_keeps_each_configs_link_as_the_microbenchmark_measured_it(pipeline: dict[str, Any]) -> None:
    """The regression's figures of each config carry the pipeline's fit of the primitive it
    transfers with (regression_comm.py), so the next night tests the link against this one."""
    report = json.loads((pipeline["run_dir"] / "report" / "report.json").read_text())
    runs = report["regression"]["runs"]
    assert {c: list(r["comm"]) for c, r in runs.items()} == {
        "lenet5-ssgd-allreduce-w2-b32": ["allreduce"], "lenet5-odsgd-ps-w2-b32": ["ps"],
        "lenet5-asgd-ps-w2-b32": ["asgd"]}
    model = json.loads((pipeline["run_dir"] / "fit" / "model.json").read_text())
    for r in runs.values():
        [(prim, fit)] = r["comm"].items()
        assert fit in [f for f in model["fits"] if f["primitive"] == prim]
