"""A disk that fills while `ddlbench run` trains: one line naming the path and the space left,
exit 1, no traceback; the journal keeps what was recorded and `ddlbench sync` finishes the job
once space returns. The home is a small tmpfs (root only), filled by a ballast file as soon as
the training job writes its first metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipelines.tracking.journal import RESERVE, Journal
from tests.conftest import needs_root

pytestmark = [pytest.mark.faults, needs_root]

REPO = Path(__file__).resolve().parent.parent
DDLBENCH = str(Path(sys.executable).with_name("ddlbench"))


@pytest.fixture
def small_home(tmp_path: Path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_when_training(home: Path, filled: list[float]) -> threading.Thread:
    """Fill the disk with a ballast file once a training job has logged a step."""

    def go() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for m in home.glob("runs/*/train/*/metrics.jsonl"):
                if m.stat().st_size:
                    with open(home / "ballast", "wb", buffering=0) as f:
                        try:
                            while True:
                                f.write(b"\0" * (64 << 10))
                        except OSError:
                            pass
                    filled.append(time.monotonic())
                    return
            time.sleep(0.1)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def statuses(tracking_uri: str, experiment: str) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


@pytest.mark.slow
@pytest.mark.parametrize("store", ["home", "elsewhere"])
def test_a_disk_that_fills_while_training_fails_in_one_line_and_sync_finishes(small_home, tmp_path, store):
    home = small_home / "home"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    argv = [DDLBENCH, "run", str(REPO / "specs" / "smoke.yaml"), "--home", str(home),
            "--set", 'algorithms=[{"name": "ssgd"}]', "--set", "steps=1000000", "--set", "epochs=null",
            "--set", "train_timeout_s=600", "--set", "microbench.enabled=false", "--set", "profile.enabled=false"]
    if store == "elsewhere":  # the MLflow store on a disk with room: the runs end FAILED at once
        argv += ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    filled: list[float] = []
    fill_when_training(home, filled)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    output = done.stdout + done.stderr
    print("\n".join(line for line in output.splitlines() if "space" in line or "journal" in line))
    assert filled, output
    assert done.returncode == 1, output
    assert "Traceback" not in output, output
    named = re.findall(rf"no space left on device: {re.escape(str(home))}/\S+ \((?:[\d.]+ \w+ needed, )?"
                       r"[\d.]+ (?:bytes|KiB|MiB) left on its filesystem\)", output)
    assert named, output
    (run_dir,) = [p for p in (home / "runs").iterdir() if p.is_dir()]
    ctx = json.loads((run_dir / "ctx.json").read_text())
    journal = Journal(run_dir)
    raw = journal.path.read_bytes()
    assert raw.endswith(b"\n") and all(json.loads(line) for line in raw.splitlines())  # no torn entry
    assert not (run_dir / RESERVE).exists()  # spent on the run's last records
    pending = journal.pending()
    if pending:
        assert f"the journal keeps {pending} entries MLflow lacks" in output and "ddlbench sync" in output, output
    if store == "elsewhere" or not pending:  # the store could be written: the runs are over
        ended = statuses(ctx["tracking_uri"], ctx["experiment"])
        assert ended[ctx["run_key"]] == "FAILED" and "RUNNING" not in ended.values(), ended

    # Space returns: the ballast goes, the tmpfs grows.
    (home / "ballast").unlink()
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_home)], check=True)
    synced = subprocess.run([DDLBENCH, "sync", str(run_dir)], capture_output=True, text=True, env=env,
                            timeout=300, cwd=REPO)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert journal.pending() == 0
    ended = statuses(ctx["tracking_uri"], ctx["experiment"])
    assert ended[ctx["run_key"]] == "FAILED" and "RUNNING" not in ended.values(), ended
    trained = [name for name in ended if name.startswith("lenet5-ssgd")]
    assert trained and {ended[n] for n in trained} == {"FAILED"}, ended


def test_the_journal_on_a_full_disk_keeps_whole_entries_and_spends_its_reserve_once(small_home):
    """Journal writes on a filled tmpfs: the first that finds no space frees the reserve and is
    kept (and still raises, naming the file); once the reserve is spent, a write that does not
    fit raises and leaves the journal as it was, with no torn line."""
    from pipelines.disk import DiskFull

    journal = Journal(small_home / "run")
    journal.append({"op": "start_run", "node": "pipeline"})
    assert (small_home / "run" / RESERVE).stat().st_blocks * 512 >= 256 << 10
    with open(small_home / "ballast", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    big = {"op": "metrics", "node": "pipeline", "metrics": [{"key": "x" * 100, "value": 1.0}] * 100}
    with pytest.raises(DiskFull, match=rf"no space left on device: {re.escape(str(journal.path))} \("):
        journal.append(big)
    assert not (small_home / "run" / RESERVE).exists()
    kept = journal.path.read_bytes()
    assert [json.loads(line)["op"] for line in kept.splitlines()] == ["start_run", "metrics"]
    with pytest.raises(DiskFull):  # the freed space is used up: this one cannot fit
        for _ in range(1000):
            journal.append(big)
    raw = journal.path.read_bytes()
    assert raw.endswith(b"\n") and all(json.loads(line) for line in raw.splitlines())
    journal.write_state({"offset": 0, "runs": {}})  # small: fits in what is left, or raises DiskFull
