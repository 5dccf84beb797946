"""The Airflow DAGs (dags/): they parse fast and thin, have the promised shape, reject bad
Params, and run end to end through `dag.test()` on the smoke spec, checked in MLflow.

Airflow reads its configuration when first imported, so the session fixture sets a temp
AIRFLOW_HOME (SQLite) before any test imports airflow, migrates it once and loads the
committed pools file; tests import airflow inside their bodies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.airflow_services import all_succeeded
from tests.conftest import needs_root, warm_servers

REPO = Path(__file__).resolve().parent.parent
DAGS = REPO / "dags"
SMOKE = REPO / "specs" / "smoke.yaml"
POOLS = REPO / "infra" / "deploy" / "airflow" / "pools.json"
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
PIPELINE_TASKS = {"start", "provision", "microbench", "profile", "fit", "predict", "train_configs",
                  "train", "validate", "suspects", "confirm", "confirm_results", "report", "teardown", "finish"}


def airflow_env(home: Path) -> dict[str, str]:
    """A self-contained Airflow: its home, our DAGs, no examples, quiet logs."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


@pytest.fixture(scope="session")
def airflow_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Airflow's configuration, its database not yet made: what parsing the DAGs needs (the
    tier for a change runs no Airflow database)."""
    if "airflow" in sys.modules:
        pytest.fail("airflow was imported before the test Airflow home was configured")
    home = tmp_path_factory.mktemp("airflow")
    patch = pytest.MonkeyPatch()
    for key, value in airflow_env(home).items():
        patch.setenv(key, value)
    yield home
    patch.undo()


@pytest.fixture(scope="session")
def airflow_home(airflow_config: Path) -> Path:
    """The same home with its database migrated and the pools imported, for DAG runs."""
    for argv in ([AIRFLOW, "db", "migrate"], [AIRFLOW, "pools", "import", str(POOLS)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return airflow_config


@pytest.fixture()
def dagbag(airflow_config: Path) -> Any:
    """A fresh parse of dags/ (tests may change a task of their own copy)."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_every_dag_imports_without_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"ddlbench_nightly", "ddlbench_hardware_onboarding"}
    # The shared helper module is ignored (.airflowignore), not parsed as a DAG file.
    assert sorted(Path(s.file).name for s in dagbag.dagbag_stats) == [
        "ddlbench_hardware_onboarding.py", "ddlbench_nightly.py"]


def test_dag_files_parse_fast_without_heavy_imports(airflow_config: Path) -> None:
    """In a fresh interpreter: parsing imports no torch, mlflow or pipeline code beyond the stage
    table, and takes well under 1 s of CPU. CPU time, not the wall clock: on a loaded host the
    parse waits for a core, which says nothing about what parsing costs."""
    probe = (
        "import json, sys, time\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "cpu = time.process_time()\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "cpu = time.process_time() - cpu\n"
        "print(json.dumps({'errors': list(bag.import_errors), 'cpu_s': cpu,"
        " 'files': sorted(s.file for s in bag.dagbag_stats),"
        " 'heavy': sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('torch', 'mlflow', 'pipelines', 'training', 'modelling', 'infra'))}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env=os.environ | airflow_env(airflow_config))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The stage table, the onboarding form's choices and the GPT presets it lists: plain data,
    # nothing they import.
    assert result["errors"] == []
    assert result["heavy"] == ["pipelines", "pipelines.onboarding", "pipelines.stages", "training",
                               "training.gpt_shape"]
    assert len(result["files"]) == 2
    assert result["cpu_s"] < 0.5, f"parsing both DAG files took {result['cpu_s']:.2f} s of CPU"


GRAPHS = REPO / "tests" / "fixtures" / "dag_graphs.json"


def dag_graph(dag: Any) -> dict[str, Any]:
    """What a DAG's shape is: per task its edges, pool, trigger rule, mapping, setup/teardown,
    retries, timeout and published Assets (the fixture records the shape the DAGs must keep)."""
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    graph = {}
    for task in sorted(dag.tasks, key=lambda t: t.task_id):
        timeout = task.execution_timeout
        graph[task.task_id] = {
            "upstream": sorted(task.upstream_task_ids),
            "downstream": sorted(task.downstream_task_ids),
            "pool": task.pool,
            "pool_slots": task.pool_slots,
            "trigger_rule": str(task.trigger_rule),
            "mapped": isinstance(task, MappedOperator),
            "map_index_template": task.map_index_template,
            "is_setup": task.is_setup,
            "is_teardown": task.is_teardown,
            "retries": task.retries,
            "execution_timeout_s": timeout.total_seconds() if timeout is not None else None,
            "outlets": sorted(getattr(o, "name", str(o)) for o in task.outlets),
        }
    return graph


def test_both_dags_keep_their_task_graphs(dagbag: Any) -> None:
    """Task ids, edges, pools, trigger rules, mapping and teardown as recorded in the fixture."""
    expected = json.loads(GRAPHS.read_text())
    assert set(expected) == set(dagbag.dag_ids)
    for dag_id, graph in expected.items():
        assert dag_graph(dagbag.dags[dag_id]) == graph, dag_id


def _order(dag: Any) -> list[str]:
    return [t.task_id for t in dag.topological_sort()]


def test_nightly_dag_shape(dagbag: Any) -> None:
    from airflow.sdk import Asset

    dag = dagbag.dags["ddlbench_nightly"]
    assert dag.schedule == "0 2 * * *"
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.params["spec_path"] == str(REPO / "specs" / "nightly-cpu.yaml")
    assert dag.params["overrides"] == {} and dag.params["home"] is None
    assert set(dag.task_dict) == PIPELINE_TASKS
    order = _order(dag)
    steps = ["start", "provision", "microbench", "profile", "fit", "predict", "train_configs",
             "train", "validate", "suspects", "confirm", "confirm_results", "report", "teardown", "finish"]
    assert sorted(order, key=steps.index) == order

    train = dag.get_task("train")
    assert train.pool == "ddlbench_nodes" and train.pool_slots == 1
    assert train.retries == 2 and train.retry_exponential_backoff
    assert train.execution_timeout == timedelta(hours=2)
    assert train.map_index_template == "{{ config_key }}"
    for task in dag.tasks:
        assert task.execution_timeout is not None, task.task_id
        assert task.retries == (0 if task.task_id in ("start", "finish") else 2), task.task_id

    teardown, finish = dag.get_task("teardown"), dag.get_task("finish")
    assert teardown.is_teardown and finish.is_teardown
    assert {"start", "provision"} <= teardown.upstream_task_ids
    assert dag.get_task("start").is_setup and dag.get_task("provision").is_setup
    assert dag.get_task("report").outlets == [Asset(name="ddlbench_nightly_report",
                                                    uri="ddlbench://reports/nightly")]


def test_the_cli_runs_the_stages_in_the_order_the_dags_wire_them(dagbag: Any) -> None:
    """`ddlbench run` iterates pipelines.stages.STAGES: each DAG's main tasks in its one
    topological order, each after the one before it and after the stages it takes results from;
    a suite's own stage only in its suite's DAG, after the stage before it, before the one it joins."""
    from pipelines.stages import STAGES

    for dag_id, suite in (("ddlbench_nightly", "nightly"), ("ddlbench_hardware_onboarding", "onboarding")):
        dag = dagbag.dags[dag_id]
        names = [s.name for s in STAGES if s.suite is None]
        assert [t for t in _order(dag) if t in names] == names, dag_id
        for before, after in zip(names, names[1:], strict=False):
            # a mapped stage that may map over nothing is followed by the task gathering its results
            gathered = {before, f"{before}_results"}
            assert gathered & dag.get_task(after).upstream_task_ids, (dag_id, before, after)
        for i, stage in enumerate(STAGES):
            if stage.suite is not None:
                assert (stage.name in dag.task_dict) == (stage.suite == suite), (dag_id, stage.name)
                if stage.name in dag.task_dict:
                    assert STAGES[i - 1].name in dag.get_task(stage.name).upstream_task_ids
                    assert stage.joins in dag.get_task(stage.name).downstream_task_ids
                continue
            upstream = dag.get_task(stage.name).upstream_task_ids
            for need in stage.needs:
                assert {need, f"{need}_results"} & upstream, (stage.name, need)
        assert [s.name for s in STAGES if s.always] == ["teardown", "finish"]
        assert all(dag.get_task(s.name).is_teardown for s in STAGES if s.always)


def test_a_stage_added_to_stages_appears_in_both_dags(airflow_config: Path) -> None:
    """One more entry in STAGES (before the teardown stages) is a task of both DAGs, in its place."""
    probe = (
        "import json, sys\n"
        "from pipelines import stages\n"
        "at = [s.always for s in stages.STAGES].index(True)\n"
        "stages.STAGES = stages.STAGES[:at] + (stages.Stage('probe', 'nowhere'),) + stages.STAGES[at:]\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "print(json.dumps({d: {'up': sorted(bag.dags[d].get_task('probe').upstream_task_ids),"
        " 'down': sorted(bag.dags[d].get_task('probe').downstream_task_ids)} for d in bag.dag_ids}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env=os.environ | airflow_env(airflow_config))
    assert done.returncode == 0, done.stderr
    tasks = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(tasks) == {"ddlbench_nightly", "ddlbench_hardware_onboarding"}
    for dag_id, edges in tasks.items():
        assert edges == {"up": ["report", "start"], "down": ["teardown"]}, dag_id


# Where the pipeline is wired: the DAGs, the Airflow boundary and `ddlbench run`.
WIRING = [*sorted((REPO / "dags").glob("*.py")), REPO / "pipelines" / "steps.py",
          REPO / "pipelines" / "cli" / "pipeline.py", REPO / "pipelines" / "stages" / "__init__.py"]


def test_each_stage_is_named_in_one_place() -> None:
    """Each stage's name is written once, as the first field of its STAGES entry: no wiring file
    spells it as a string or uses it as a name (its function is found by that one string)."""
    import ast
    import io
    import tokenize

    from pipelines.stages import STAGES

    names = {s.name for s in STAGES}
    seen: dict[str, list[str]] = {n: [] for n in names}
    for path in WIRING:
        # A module's dotted path (`from pipelines.report.console import`) names no stage; what a
        # from-import takes out of it may.
        in_path = False
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.NEWLINE or (tok.type == tokenize.NAME and tok.string == "import" and in_path):
                in_path = False
                continue
            if tok.type == tokenize.NAME and tok.string in ("from", "import") and not tok.line[:tok.start[1]].strip():
                in_path = True
                continue
            if in_path:
                continue
            value = ast.literal_eval(tok.string) if tok.type == tokenize.STRING and not tok.string.startswith(
                ("f", "F")) else tok.string if tok.type == tokenize.NAME else None
            if value in seen:
                seen[value].append(f"{path.relative_to(REPO)}:{tok.start[0]}")
    table = REPO / "pipelines" / "stages" / "__init__.py"
    declared = {
        node.args[0].value: node.lineno
        for node in ast.walk(ast.parse(table.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Stage"
        and node.args and isinstance(node.args[0], ast.Constant)
    }
    assert set(declared) == names
    for name, where in seen.items():
        # Its declaration, and references to it inside the table (`needs`, `joins`) only.
        outside = [w for w in where if not w.startswith("pipelines/stages/__init__.py:")]
        assert outside == [], (name, outside)
        assert f"pipelines/stages/__init__.py:{declared[name]}" in where, name


def test_the_onboarding_form_offers_every_provider(airflow_config: Path) -> None:
    from infra import PROVIDER_NAMES
    from pipelines.onboarding import PROVIDERS

    assert PROVIDERS == PROVIDER_NAMES


def test_training_pool_slots_are_the_nodes_a_job_takes(airflow_config: Path, tmp_path: Path) -> None:
    from dags._common import nodes_per_job

    assert nodes_per_job(REPO / "specs" / "nightly-cpu.yaml") == 1  # local: one host
    spec = tmp_path / "cluster.yaml"
    spec.write_text("name: x\nprovider:\n  name: netns\n  options: {nodes: 3, bandwidth: 1gbit}\n")
    assert nodes_per_job(spec) == 3


def test_onboarding_dag_shape(dagbag: Any) -> None:
    dag = dagbag.dags["ddlbench_hardware_onboarding"]
    assert dag.schedule is None
    assert {"hardware_label", "provider", "nodes", "devices_per_node", "bandwidth_gbps", "models",
            "algorithms", "world_sizes"} <= set(dag.params)
    assert set(dag.task_dict) == PIPELINE_TASKS | {"record_hardware_profile"}
    assert dag.get_task("train").pool == "ddlbench_nodes"
    assert {"fit"} <= dag.get_task("record_hardware_profile").upstream_task_ids
    assert "record_hardware_profile" in dag.get_task("report").upstream_task_ids
    assert dag.get_task("teardown").is_teardown


@pytest.mark.slow  # dag.test() needs the Airflow database
@pytest.mark.parametrize(("conf", "message"), [
    ({"provider": "ftp"},
     "param provider: 'ftp' is not one of ['local', 'netns', 'slurm', 'kubernetes']"),
    ({"nodes": 0}, "param nodes: 0 is less than the minimum of 1"),
    ({"hardware_label": "../../etc"}, "param hardware_label: '../../etc' does not match"),
    ({"hardware_label": "h100; rm -rf ~"}, "param hardware_label: 'h100; rm -rf ~' does not match"),
    ({"world_sizes": [0]}, "param world_sizes: 0 is less than the minimum of 1"),
    ({"reference_hardware": "a' OR '1"}, "param reference_hardware: \"a' OR '1\" does not match"),
])
def test_onboarding_rejects_bad_params_before_anything_runs(airflow_home: Path, dagbag: Any, tmp_path: Path,
                                                            conf: dict, message: str) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["ddlbench_hardware_onboarding"]
    with pytest.raises(ParamValidationError) as err:
        dag.test(run_conf={"home": str(tmp_path)} | conf)
    assert message in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no run directory, no MLflow store: nothing started


def test_onboarding_rejects_fields_that_contradict_each_other(airflow_config: Path) -> None:
    from dags.ddlbench_hardware_onboarding import FORM
    from pipelines.onboarding import OnboardingError
    from pipelines.onboarding import overrides as onboarding_overrides

    form = {name: param.value for name, param in FORM.items()}
    with pytest.raises(OnboardingError,
                       match=r"nodes: the local provider runs on this one host; got 2"):
        onboarding_overrides(form | {"nodes": 2})
    with pytest.raises(OnboardingError, match=r"world_sizes: \[8\] exceed nodes x devices_per_node "
                                              r"= 2 x 2 = 4"):
        onboarding_overrides(form | {"provider": "netns", "nodes": 2, "world_sizes": [2, 8]})
    spec = onboarding_overrides(form | {"world_sizes": [2], "algorithms": ["ssgd", "odsgd"]})
    assert spec["workers"] == [2] and spec["suite"] == "onboarding"
    assert spec["what_if"]["workers"] == [1, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert spec["algorithms"] == [{"name": "ssgd", "comm": "allreduce"},
                                  {"name": "odsgd", "comm": "ps"}]
    netns = onboarding_overrides(form | {"provider": "netns", "nodes": 2, "world_sizes": [2, 4]})
    assert netns["provider"]["options"] == {"nodes": 2, "devices_per_node": 2, "bandwidth": "100gbit"}
    # The reference hardware goes to the report's section on it; against itself it is refused.
    assert "regression" not in spec
    assert onboarding_overrides(form | {"reference_hardware": "gpu-a100"})["regression"] == {
        "reference_hardware": "gpu-a100"}
    with pytest.raises(OnboardingError, match=r"reference_hardware: 'cpu-local' is the hardware being onboarded"):
        onboarding_overrides(form | {"reference_hardware": form["hardware_label"]})


def test_the_onboarding_form_lists_the_gpt_presets_and_trains_them_on_text(airflow_config: Path) -> None:
    """The form suggests every GPT preset; its default dataset (auto) gives a GPT the text corpus
    and an image model synthetic images, and the spec made of them loads."""
    from dags.ddlbench_hardware_onboarding import FORM
    from pipelines.onboarding import overrides as onboarding_overrides
    from pipelines.onboarding import spec_of
    from pipelines.spec import load_spec
    from training.gpt_shape import GPT_PRESETS

    models = FORM["models"].schema
    assert set(GPT_PRESETS) <= set(models["examples"][0]) and all(p in FORM["models"].description for p in GPT_PRESETS)
    form = {name: param.value for name, param in FORM.items()} | {"models": ["lenet5", "gpt-tiny"]}
    assert onboarding_overrides(form)["workloads"] == [{"model": "lenet5", "dataset": "synthetic"},
                                                       {"model": "gpt-tiny", "dataset": "stdlib-text"}]
    spec = load_spec(*spec_of(form))
    assert [(w.model, w.dataset) for w in spec.workloads] == [("lenet5", "synthetic"), ("gpt-tiny", "stdlib-text")]
    chosen = onboarding_overrides(form | {"dataset": "markov"})["workloads"]
    assert {w["dataset"] for w in chosen} == {"markov"}


# -- end to end ------------------------------------------------------------------------------
def _task_instances(dag_id: str, run_id: str) -> list[dict[str, Any]]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == dag_id,
                                                         TaskInstance.run_id == run_id)).all()
        return [{"task_id": ti.task_id, "map_index": ti.map_index, "state": str(ti.state),
                 "name": ti.rendered_map_index, "try_number": ti.try_number} for ti in tis]


def _asset_events(name: str) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.name == name)).all()
        return [dict(e.extra or {}) for e in events]


def _run_dag(airflow_home: Path, dag_id: str, conf: dict[str, Any], *, change: Any = None,
             mark_success_pattern: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """One dag.test() run of a fresh parse (optionally changed); the run and its task instances."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS)).get_dag(dag_id)
    if change is not None:
        change(dag)
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the run's home holds its own store
        dag_run = dag.test(run_conf=conf, mark_success_pattern=mark_success_pattern)
    return dag_run, _task_instances(dag_id, dag_run.run_id)


def _ctx_of(home: Path) -> dict[str, Any]:
    (ctx_path,) = (home / "runs").glob("*/ctx.json")
    return json.loads(ctx_path.read_text())


def _runs(ctx: dict[str, Any]) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    experiment = client.get_experiment_by_name(ctx["experiment"])
    return client.search_runs([experiment.experiment_id], max_results=1000)


@pytest.fixture(scope="module")
def nightly(airflow_home: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`ddlbench_nightly` once on the smoke spec, its jobs 100 steps long; shared by the checks below."""
    home = tmp_path_factory.mktemp("nightly-home")
    dag_run, tis = _run_dag(airflow_home, "ddlbench_nightly",
                            {"spec_path": str(SMOKE), "home": str(home), "overrides": {"steps": 100}})
    return {"dag_run": dag_run, "tis": tis, "home": home, "ctx": _ctx_of(home)}


def _smoke_keys() -> list[str]:
    from pipelines.spec import grid, load_spec

    return [e["key"] for e in grid(load_spec(SMOKE))]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nightly_runs_end_to_end_in_airflow(nightly: dict[str, Any]) -> None:
    assert str(nightly["dag_run"].state) == "success"
    assert all_succeeded({t["task_id"]: t["state"] for t in nightly["tis"]}), nightly["tis"]
    trains = [t for t in nightly["tis"] if t["task_id"] == "train"]
    # One mapped task per config and repeat, named by its key in the UI.
    assert sorted(t["name"] for t in trains) == sorted(_smoke_keys())
    assert {t["task_id"] for t in nightly["tis"]} == PIPELINE_TASKS
    # dag.test() runs every task in one process: its jobs fork their agents from the warm
    # servers the measuring tasks started, and the finish task stops them.
    summaries = [json.loads(p.read_text()) for p in (Path(nightly["ctx"]["run_dir"]) / "train").glob("*/summary.json")]
    assert len(summaries) == len(trains) and {s["startup"]["launcher"] for s in summaries} == {"warm"}
    assert warm_servers() == []
    events = _asset_events("ddlbench_nightly_report")
    ours = [e for e in events if e.get("run_key") == nightly["ctx"]["run_key"]]
    assert len(ours) == 1 and Path(ours[0]["report_md"]).is_file()
    assert ours[0]["parent_run_id"] == nightly["ctx"]["parent_run_id"]


@pytest.mark.slow
def test_nightly_results_are_in_mlflow(nightly: dict[str, Any]) -> None:
    from mlflow import MlflowClient

    ctx = nightly["ctx"]
    runs = {r.info.run_id: r for r in _runs(ctx)}
    parent = runs[ctx["parent_run_id"]]
    assert parent.info.status == "FINISHED"
    # MLflow 3's UI opens the experiment on its runs table, not on the GenAI traces overview.
    experiment = MlflowClient(tracking_uri=ctx["tracking_uri"]).get_experiment_by_name(ctx["experiment"])
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert parent.data.tags["airflow.dag_id"] == "ddlbench_nightly"
    assert parent.data.tags["airflow.run_id"] == nightly["dag_run"].run_id
    children = [r for r in runs.values() if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert {r.info.status for r in children} == {"FINISHED"}
    steps = {r.data.tags.get("ddlbench.step") for r in children}
    assert {"provision", "microbench", "profile", "fit", "predict", "validate", "report"} <= steps

    trained = {r.data.tags["ddlbench.config_key"]: r for r in children if "ddlbench.config_key" in r.data.tags}
    assert sorted(trained) == sorted(_smoke_keys())
    client = MlflowClient(tracking_uri=ctx["tracking_uri"])
    for key, run in trained.items():
        m = run.data.metrics
        assert m["throughput_samples_per_s"] > 0 and 0 < m["iter_time_p50_s"] < 60, key
        assert len(client.get_metric_history(run.info.run_id, "train/loss")) >= 2, key
        names = {a.path for a in client.list_artifacts(run.info.run_id, "training")}
        assert {"training/summary.json", "training/timeline.jsonl", "training/trace.json"} <= names

    reports = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/report.json"} <= reports
    report_md = Path(client.download_artifacts(parent.info.run_id, "report/report.md",
                                               str(nightly["home"] / "download")))
    text = report_md.read_text()
    for algorithm in {r.data.tags["ddlbench.algorithm"] for r in trained.values()}:
        assert algorithm in text
    assert parent.data.tags["ddlbench.regression"] == "no-baseline"


def _training_processes(marker: str) -> list[int]:
    import psutil

    pids = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []):
                pids.append(p.pid)
        except psutil.Error:
            continue
    return pids


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_task_killed_by_airflow_timeout_leaves_nothing_behind(airflow_home: Path,
                                                                        tmp_path: Path) -> None:
    """An execution_timeout kill stops torchrun and every rank, and fails the training's MLflow run."""
    import threading
    import time

    from pipelines.spec import load_spec

    smoke = load_spec(SMOKE)
    overrides = {"workloads": [smoke.workloads[0].model_dump(mode="json", exclude_none=True)],
                 "algorithms": [{"name": "odsgd"}], "workers": [2], "batch_sizes": [smoke.batch_sizes[0]],
                 "repeats": 1, "steps": 10**6, "epochs": None, "train_timeout_s": 3600}

    def short_timeout(dag: Any) -> None:
        train = dag.get_task("train")
        train.execution_timeout = timedelta(seconds=20)  # its ranks run within 5 s
        train.retries = 0

    # Watch the training processes appear while the task runs, so the test knows the kill hit
    # a live job: torchrun and its ranks (2 workers, 1 server), each in its own session.
    marker, seen, stop = str(tmp_path / "runs"), set(), threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(_training_processes(marker))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        dag_run, tis = _run_dag(airflow_home, "ddlbench_nightly",
                                {"spec_path": str(SMOKE), "home": str(tmp_path), "overrides": overrides},
                                change=short_timeout, mark_success_pattern="microbench|profile|fit|predict")
    finally:
        stop.set()
        watcher.join()

    states = {t["task_id"]: t["state"] for t in tis}
    assert states["train"] == "failed" and states["validate"] == "upstream_failed"
    assert states["teardown"] == "success" and states["finish"] == "success"
    assert str(dag_run.state) == "failed"
    assert len(seen) >= 3, f"the kill came before the ranks started: saw only {sorted(seen)}"
    assert _training_processes(marker) == []

    ctx = _ctx_of(tmp_path)
    runs = _runs(ctx)
    (trained,) = [r for r in runs if "ddlbench.config_key" in r.data.tags]
    assert trained.info.status == "FAILED"
    assert all(r.info.status != "RUNNING" for r in runs)
    assert {r.info.run_id: r.info.status for r in runs}[ctx["parent_run_id"]] == "FAILED"


@pytest.mark.faults
@pytest.mark.slow
def test_sigterm_to_a_training_task_kills_its_process_group(airflow_home: Path, tmp_path: Path) -> None:
    """Airflow stops a task (UI kill, supervisor) with SIGTERM: the job's own session goes too."""
    import signal
    import time

    marker = str(tmp_path / "job")
    task = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from dags._common import sigterm_stops_training\n"
        "from infra.base import run_processes\n"
        "with sigterm_stops_training():\n"
        "    run_processes([[sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]]],\n"
        "                  [dict(os.environ)], Path(sys.argv[1] + '.log'), timeout_s=None, echo=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", task, marker], stderr=subprocess.PIPE, text=True)

    def job() -> list[int]:
        return [pid for pid in _training_processes(marker) if pid != proc.pid]

    deadline = time.monotonic() + 120
    while not job() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job(), "the job never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "AirflowTaskTerminated: received signal SIGTERM; stopping the training job" in err
    assert job() == []


# -- on a netns cluster: one cluster per pipeline run ----------------------------------------
NIGHTLY_CPU = REPO / "specs" / "nightly-cpu.yaml"
JOB_KINDS = ("microbench", "profile", "train")


def netns_nightly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nightly-cpu with the netns provider, in a spec directory of the deployment: the provider is
    the spec's, never a trigger's (docs/security.md)."""
    specs = tmp_path / "deployment-specs"
    specs.mkdir()
    spec = specs / "nightly-netns.yaml"
    spec.write_text(NIGHTLY_CPU.read_text().replace("provider:\n  name: local", "provider:\n  name: netns"))
    monkeypatch.setenv("DDLBENCH_SPEC_DIRS", str(specs))
    return spec


def netns_overrides(nodes: int, **more: Any) -> dict[str, Any]:
    """nightly-cpu on a netns cluster, small: mlp at 2 workers, every algorithm, a few steps, one
    repeat, the microbenchmark and the profile at their least."""
    return {
        "provider.options": {"nodes": nodes, "bandwidth": "1gbit"},
        "network.link_bandwidth": "1gbit",
        "workloads": [{"model": "mlp", "dataset": "digits"}],
        "workers": [2], "steps": 12, "repeats": 1, "train.measure_warmup": 2, "train.eval_every": 0,
        "microbench.sizes": [4096, 65536, 1048576], "microbench.repeats": 1,
        "profile.warmup": 1, "profile.repeats": 2, "what_if.workers": [4], "tracking.system_metrics": False,
    } | more


def _netns() -> dict[int, str]:
    """The ddlbench namespaces on this host, by their inode (what /proc/PID/ns/net points to)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = {}
    for name in (line.split()[0] for line in out.splitlines() if line.startswith("ddlb-")):
        try:
            found[os.stat(f"/run/netns/{name}").st_ino] = name
        except OSError:  # removed meanwhile
            continue
    return found


class ClusterWatch:
    """Samples, while a DAG run goes on, the namespaces that exist and the one each job process
    of the run (its run directory in the command line) runs in, by the kind of job."""

    def __init__(self, home: Path) -> None:
        import threading

        self.marker = str(home / "runs")
        self.existed: set[str] = set()
        self.used: dict[str, set[str]] = {k: set() for k in JOB_KINDS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ClusterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        import psutil

        while not self._stop.wait(0.3):
            names = _netns()
            self.existed |= set(names.values())
            for p in psutil.process_iter(["cmdline"]):
                try:
                    cmd = " ".join(p.info["cmdline"] or [])
                    kind = next((k for k in JOB_KINDS if f"{self.marker}/" in cmd and f"/{k}/" in cmd), None)
                    if kind and (name := names.get(os.stat(f"/proc/{p.pid}/ns/net").st_ino)):
                        self.used[kind].add(name)
                except (psutil.Error, OSError):
                    continue


def _assert_released(handle: dict[str, Any]) -> None:
    from infra.lifeline import Launcher

    assert not {n for n in _netns().values() if handle["tag"] in n}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert handle["tag"] not in links
    assert not Launcher.parse(handle["keeper"]).alive()


@pytest.mark.slow
@pytest.mark.netns
@needs_root
@pytest.mark.timeout(900)
def test_nightly_on_a_netns_cluster_provisions_once_and_runs_every_algorithm(
        airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.spec import grid, load_spec

    overrides, spec = netns_overrides(2), netns_nightly(tmp_path, monkeypatch)
    with ClusterWatch(tmp_path) as watch:
        dag_run, tis = _run_dag(airflow_home, "ddlbench_nightly",
                                {"spec_path": str(spec), "home": str(tmp_path), "overrides": overrides})
    states = {(t["task_id"], t["name"]): t["state"] for t in tis}
    assert str(dag_run.state) == "success", states
    ctx = _ctx_of(tmp_path)
    run_dir = Path(ctx["run_dir"])
    handle = json.loads((run_dir / "cluster.json").read_text())["handle"]
    assert json.loads((run_dir / "steps" / "provision.json").read_text())["handle"] == handle
    cluster = {n["name"] for n in handle["nodes"]}
    keeper = handle["keeper"].split(".")[-2]
    assert cluster == {f"ddlb-{keeper}-{handle['tag']}-{i}" for i in range(2)}
    # every job of the run ran on the one cluster: no task provisioned one of its own
    assert watch.used == {k: cluster for k in JOB_KINDS}, watch.used
    assert not {n for n in watch.existed if n.startswith(f"ddlb-{os.getpid()}-")}
    _assert_released(handle)

    keys = [e["key"] for e in grid(load_spec(spec, overrides))]
    assert len(keys) == 5  # ssgd over allreduce and ps, asgd, odsgd with and without compensation
    runs = _runs(ctx)
    trained = {r.data.tags["ddlbench.config_key"]: r for r in runs if "ddlbench.config_key" in r.data.tags}
    assert sorted(trained) == sorted(keys)
    assert {r.info.status for r in runs} == {"FINISHED"}
    for key in keys:
        summary = json.loads((run_dir / "train" / key / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 12, key
        assert summary["placement"]["nodes"] == 2 and summary["placement"]["workers_per_node"] == [1, 1], key


@pytest.mark.slow
@pytest.mark.netns
@needs_root
@pytest.mark.timeout(600)
def test_nightly_on_a_netns_cluster_tears_it_down_after_a_failed_train_task(
        airflow_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training task killed by its execution_timeout fails; teardown still releases the cluster."""
    overrides = netns_overrides(2, algorithms=[{"name": "ssgd", "comm": "allreduce",
                                                "options": {"inject_delay_ms": 60000}}])

    def short_timeout(dag: Any) -> None:
        train = dag.get_task("train")
        train.execution_timeout = timedelta(seconds=20)
        train.retries = 0

    with ClusterWatch(tmp_path) as watch:
        dag_run, tis = _run_dag(airflow_home, "ddlbench_nightly",
                                {"spec_path": str(netns_nightly(tmp_path, monkeypatch)), "home": str(tmp_path),
                                 "overrides": overrides},
                                change=short_timeout, mark_success_pattern="microbench|profile|fit|predict")
    states = {t["task_id"]: t["state"] for t in tis}
    assert states["provision"] == "success" and states["train"] == "failed", states
    assert states["teardown"] == "success" and str(dag_run.state) == "failed"
    handle = json.loads((Path(_ctx_of(tmp_path)["run_dir"]) / "cluster.json").read_text())["handle"]
    assert {n["name"] for n in handle["nodes"]} <= watch.existed  # it was up while train ran
    assert watch.used["train"] <= {n["name"] for n in handle["nodes"]}
    _assert_released(handle)
    assert all(r.info.status != "RUNNING" for r in _runs(_ctx_of(tmp_path)))
