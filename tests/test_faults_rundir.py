"""A run directory removed (`rm -rf`) while `ddlbench run` trains: the journal that names the
MLflow runs goes with it. The pipeline ends its runs in MLflow directly, FAILED, and exits 1 with
one line naming the directory; a pipeline killed before it can is cleaned up by `ddlbench sync
--abandoned`, from the runs' own tags (run key, run directory, owner). A run whose owner lives is
never ended."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainjobs import processes_under

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parent.parent
DDLBENCH = str(Path(sys.executable).with_name("ddlbench"))
# One algorithm, no microbenchmark or profile: the first training job starts seconds in.
QUICK = ['algorithms=[{"name": "ssgd"}]', "epochs=null", "microbench.enabled=false", "profile.enabled=false"]


def statuses(tracking_uri: str) -> dict[str, str]:
    """Every run of the store, of every experiment: run name -> status."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return {r.info.run_name: r.info.status for r in client.search_runs(ids)} if ids else {}


def start_and_remove(home: Path, steps: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    """`ddlbench run` of the smoke spec into `home`; its run directory removed as soon as the first
    training job has logged a step."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    sets = [*QUICK, f"steps={steps}", "train_timeout_s=600", *extra]
    argv = [DDLBENCH, "run", str(REPO / "specs" / "smoke.yaml"), "--home", str(home)]
    launcher = subprocess.Popen([*argv, *(a for s in sets for a in ("--set", s))], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + 300
    while not [m for m in home.glob("runs/*/train/*/metrics.jsonl") if m.stat().st_size]:
        assert launcher.poll() is None, launcher.stdout.read()
        assert time.monotonic() < deadline, "the training job never logged a step"
        time.sleep(0.1)
    (run_dir,) = (home / "runs").iterdir()
    shutil.rmtree(run_dir)
    return launcher, run_dir


@pytest.mark.slow
def test_a_run_directory_removed_mid_run_ends_its_mlflow_runs_failed_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    # 150 steps of 30 ms or more: the job trains on for seconds after its directory is gone
    launcher, run_dir = start_and_remove(home, "150", "train.inject_delay_ms=30")
    try:
        output, _ = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    print(output[-2000:])
    assert launcher.returncode == 1, output
    assert "Traceback" not in output, output
    said = [line for line in output.splitlines() if "vanished" in line]
    assert said == [f"ddlbench run: run directory {run_dir} vanished mid-run; 2 MLflow runs of it ended FAILED"]
    assert not run_dir.exists()  # nothing made it again
    ended = statuses(f"sqlite:///{home / 'mlflow.db'}")
    assert ended[run_dir.name] == "FAILED" and "RUNNING" not in ended.values(), ended
    assert ended["lenet5-ssgd-allreduce-w2-b32-r0"] == "FAILED", ended


@pytest.mark.slow
def test_a_pipeline_killed_after_its_run_directory_went_is_ended_by_sync_abandoned(tmp_path: Path) -> None:
    home = tmp_path / "home"
    launcher, run_dir = start_and_remove(home, "1000000")
    launcher.send_signal(signal.SIGKILL)  # before it can notice: nothing ends its runs
    launcher.communicate(timeout=10)
    deadline = time.monotonic() + 10
    while processes_under(run_dir) and time.monotonic() < deadline:  # its job dies with it
        time.sleep(0.2)
    assert processes_under(run_dir) == []
    uri = f"sqlite:///{home / 'mlflow.db'}"
    running = [name for name, status in statuses(uri).items() if status == "RUNNING"]
    assert sorted(running) == ["lenet5-ssgd-allreduce-w2-b32-r0", run_dir.name]

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    plain = subprocess.run([DDLBENCH, "sync", run_dir.name, "--home", str(home)], capture_output=True,
                           text=True, env=env, timeout=120, cwd=REPO)
    assert plain.returncode == 2 and "ddlbench sync --abandoned RUN_KEY" in plain.stderr, plain.stderr
    done = subprocess.run([DDLBENCH, "sync", "--abandoned", run_dir.name, "--home", str(home)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{run_dir.name}: run directory gone, MLflow runs marked FAILED: " in done.stdout, done.stdout
    ended = statuses(uri)
    assert ended and "RUNNING" not in ended.values(), ended


def test_a_journal_never_makes_its_run_directory_again(tmp_path: Path) -> None:
    """Removed, or removed and made again (another inode), the directory a journal saw is gone:
    RunDirGone, and nothing is written; a run directory `start` made that is missing is gone too."""
    from pipelines.tracking.journal import Journal, RunDirGone

    run_dir = tmp_path / "run"
    journal = Journal(run_dir)  # a journal's first write makes its directory
    journal.append({"op": "start_run", "node": "a"})
    shutil.rmtree(run_dir)
    with pytest.raises(RunDirGone, match=f"run directory {run_dir} vanished mid-run"):
        journal.append({"op": "end_run", "node": "a"})
    assert not run_dir.exists()
    run_dir.mkdir()
    with pytest.raises(RunDirGone):
        journal.append({"op": "end_run", "node": "a"})
    assert list(run_dir.iterdir()) == []
    with pytest.raises(RunDirGone):
        Journal(tmp_path / "started", made=True).append({"op": "end_run", "node": "a"})
    assert not (tmp_path / "started").exists()


OPEN_AND_EXIT = """
import sys
from pipelines.tracking import Tracker
Tracker(sys.argv[1], sys.argv[2], "ddlbench-adhoc", "k").start_run("profile", "profile", parent=None)
"""


def test_sync_abandoned_ends_only_the_runs_whose_owner_is_gone(tmp_path: Path) -> None:
    """Runs of a vanished run directory: a dead process's and the pipeline run's own are ended;
    a live process's is left RUNNING, and so is every run of a run directory that is still there.
    Without a run key, `--abandoned` looks over the whole store."""
    from click.testing import CliRunner
    from mlflow import MlflowClient

    from pipelines.cli.pipeline import sync
    from pipelines.tracking import Tracker
    from pipelines.tracking.journal import owner, owner_alive
    from pipelines.tracking.upload import TAG_FAILURE

    me = owner()
    assert owner_alive(me) and not owner_alive({**me, "started": me["started"] - 60})  # a reused pid

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    home = tmp_path / "home"
    run_dir, kept_dir = home / "runs" / "k", tmp_path / "elsewhere" / "kept"
    subprocess.run([sys.executable, "-c", OPEN_AND_EXIT, str(run_dir), uri], cwd=REPO, check=True, timeout=120)
    live = Tracker(run_dir, uri, "ddlbench-adhoc", "k")
    live.start_run("fit", "fit", parent=None)  # this process's: alive
    live.start_run("pipeline", "k", parent=None, owned_by_pipeline=True)
    (kept_dir / "ctx.json").parent.mkdir(parents=True)
    (kept_dir / "ctx.json").write_text("{}")  # a run directory still there: its journal judges its runs
    Tracker(kept_dir, uri, "ddlbench-adhoc", "kept").start_run("pipeline", "kept", parent=None, owned_by_pipeline=True)
    shutil.rmtree(run_dir)

    done = CliRunner().invoke(sync, ["--abandoned", "--home", str(home), "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    assert f"k: run directory gone, fit left RUNNING: its process {os.getpid()} is alive" in done.output
    (marked,) = [line for line in done.output.splitlines() if "marked FAILED" in line]
    assert marked.startswith("k: run directory gone, MLflow runs marked FAILED: "), done.output
    assert sorted(marked.split(": ")[-1].split(", ")) == ["k", "profile"], done.output
    client = MlflowClient(tracking_uri=uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("ddlbench-adhoc")
                                                             .experiment_id])}
    assert {name: r.info.status for name, r in runs.items()} == {
        "profile": "FAILED", "k": "FAILED", "fit": "RUNNING", "kept": "RUNNING"}
    assert runs["profile"].data.tags[TAG_FAILURE] == f"run directory {run_dir} vanished mid-run"


@pytest.mark.parametrize("stage", ["fit", "predict", None])
def test_a_stage_that_crashes_is_named_in_its_line(stage: str | None) -> None:
    """A stage that raises (a bug, not a refused input) gets one line naming it and the error."""
    from rich.console import Console

    from pipelines.cli.pipeline import _report

    console = Console(record=True, width=60)
    results: dict = {}
    _report(console, IndexError("list index out of range"), results, stage)
    line = console.export_text().strip()
    assert line == (f"{stage} failed: " if stage else "") + "IndexError: list index out of range" and results == {}
