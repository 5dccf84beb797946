"""The ranks' launcher (infra/zygote.py): ranks forked warm, torchrun's environment and failure
summary, every rank stopped at the first failure, every rank gone with the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.base import base_env, failed_ranks_from_log, launch_argv
from infra.zygote import STOP_GRACE_S, World
from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent


@given(st.lists(st.integers(1, 6), min_size=1, max_size=6))
def test_every_agents_ranks_are_its_slice_of_the_world_in_agent_order(nprocs: list[int]) -> None:
    envs = [World(tuple(nprocs), a).env(local, "a", 1) for a, n in enumerate(nprocs) for local in range(n)]
    assert [int(e["RANK"]) for e in envs] == list(range(sum(nprocs)))
    assert {e["WORLD_SIZE"] for e in envs} == {str(sum(nprocs))}
    at = 0
    for a, n in enumerate(nprocs):
        mine = envs[at:at + n]
        assert [int(e["LOCAL_RANK"]) for e in mine] == list(range(n))
        assert {(e["GROUP_RANK"], e["LOCAL_WORLD_SIZE"]) for e in mine} == {(str(a), str(n))}
        at += n


def test_a_job_with_restarts_is_left_to_torchrun_and_one_without_is_forked() -> None:
    assert launch_argv([2, 1], 1, "10.0.0.1", 29500)[1:] == [
        "-m", "infra.zygote", "--nprocs=2,1", "--agent=1", "--master-addr=10.0.0.1", "--master-port=29500"]
    restarting = launch_argv([2, 1], 1, "10.0.0.1", 29500, max_restarts=2)
    assert restarting[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=1" in restarting
    assert "--node-rank=1" in restarting and "--nnodes=2" in restarting


def _job(out: Path, actions: list[str], nprocs: list[int] | None = None, agent: int = 0,
         port: int | None = None) -> subprocess.Popen:
    nprocs = nprocs or [len(actions)]
    argv = launch_argv(nprocs, agent, "127.0.0.1" if port else None, port) + ["-m", "tests.zygote_probe", str(out),
                                                                              *actions]
    return subprocess.Popen(argv, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=REPO)


def _seen(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


@pytest.mark.slow  # launchers that import torch
def test_two_agents_start_one_world_that_meets_in_agent_zeros_store(tmp_path: Path) -> None:
    port = free_port()
    jobs = [_job(tmp_path, ["ok", "ok", "ok", "--ok"], [2, 1], a, port) for a in (1, 0)]  # agent 1 first: it waits
    outputs = [j.communicate(timeout=120)[0] for j in jobs]
    assert [j.returncode for j in jobs] == [0, 0], outputs
    seen = [_seen(tmp_path, r) for r in range(3)]
    assert [(s["RANK"], s["LOCAL_RANK"], s["GROUP_RANK"]) for s in seen] == [("0", "0", "0"), ("1", "1", "0"),
                                                                             ("2", "0", "1")]
    assert {s["MASTER_PORT"] for s in seen} == {str(port)} and all(s["warm"] for s in seen)
    assert all(s["argv"] == [str(tmp_path), "ok", "ok", "ok", "--ok"] for s in seen)  # an option is the module's
    pids = [s["pid"] for s in seen]  # each agent's log names its ranks and their processes
    assert f"agent 0: ranks 0 (pid {pids[0]}), 1 (pid {pids[1]}) of 3 started" in outputs[1]
    assert f"agent 1: ranks 2 (pid {pids[2]}) of 3 started" in outputs[0]


@pytest.mark.slow
@pytest.mark.parametrize("actions, failed", [
    (["sleep", "exit:7", "sleep"], [(1, 7), (0, -15), (2, -15)]),
    (["sleep", "raise"], [(1, 1), (0, -15)]),
    (["exit:3", "stop"], [(0, 3), (1, -9)]),  # a stopped rank never acts on SIGTERM
    (["ignore-term", "exit:4"], [(1, 4), (0, -9)]),
])
def test_a_failed_rank_stops_the_others_and_the_summary_names_every_rank(
        tmp_path: Path, actions: list[str], failed: list[tuple[int, int]]) -> None:
    job = _job(tmp_path, actions)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 1, out
    assert [(f["rank"], f["exitcode"]) for f in failed_ranks_from_log(out)] == failed, out
    before_summary = out[:out.index("Failures:")]  # a job ended before the summary: the agent's lines
    assert [(f["rank"], f["exitcode"]) for f in failed_ranks_from_log(before_summary)] == failed, out
    assert "closing signal SIGTERM" in out  # infra/base.py's cue that the job is failing
    assert all(not psutil.pid_exists(_seen(tmp_path, r)["pid"]) for r in range(len(actions)))


@pytest.mark.slow
@pytest.mark.alone  # a bound of a second past the grace
def test_a_rank_that_fails_with_the_others_stopped_within_the_grace(tmp_path: Path) -> None:
    job = _job(tmp_path, ["sleep", "sleep", "exit:2"])
    while not all((tmp_path / f"rank{r}.json").exists() for r in range(3)):
        assert job.poll() is None
        time.sleep(0.05)
    started = time.monotonic()
    job.communicate(timeout=120)
    assert job.returncode == 1 and time.monotonic() - started < 0.3 + STOP_GRACE_S + 1.0


@pytest.mark.slow
def test_every_rank_dies_with_its_launcher(tmp_path: Path) -> None:
    job = _job(tmp_path, ["sleep", "ignore-term"])
    while not all((tmp_path / f"rank{r}.json").exists() for r in range(2)):
        assert job.poll() is None
        time.sleep(0.05)
    pids = [_seen(tmp_path, r)["pid"] for r in range(2)]
    assert {p.pid for p in psutil.Process(job.pid).children()} == set(pids)
    os.kill(job.pid, signal.SIGKILL)
    job.wait(10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_bad_world_is_refused_by_name() -> None:
    for args, field in ((["--nprocs=2,0"], "--nprocs"), (["--nprocs=2", "--agent=1"], "--agent"),
                        (["--nprocs=2,1"], "--master-port")):
        out = subprocess.run([sys.executable, "-m", "infra.zygote", *args, "-m", "x"], capture_output=True, text=True,
                             env=base_env(), cwd=REPO)
        assert out.returncode == 2 and field in out.stderr, out.stderr
