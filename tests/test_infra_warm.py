"""Warm agents (infra/warm.py): inside `agents()`, a job's agent is forked by one warm server per
node and runs as a cold launcher's would: the same environment, log, failure report, statuses,
lifetimes and CPU accounting; cold wherever the server cannot serve."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil
import pytest

from infra import warm
from infra.base import Job, JobResult, base_env, failed_ranks_from_log
from infra.hostload import CpuProbe
from infra.local import LocalProvider
from tests.conftest import cmdline, warm_servers

pytestmark = pytest.mark.slow  # jobs, and servers that import torch


def _run(p: LocalProvider, out: Path, actions: list[str], **job: object) -> JobResult:
    out.mkdir(parents=True, exist_ok=True)
    return p.run(Job(module="tests.zygote_probe", args=[str(out), *actions], world_size=len(actions),
                     log_path=out / "launcher.log", **job), echo=False)


def _seen(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_jobs_fork_their_agents_from_one_server_and_see_what_a_cold_agents_ranks_see(tmp_path: Path) -> None:
    with LocalProvider() as p:
        cold = _run(p, tmp_path / "cold", ["ok", "ok"])
        with warm.agents() as pool:
            jobs = [_run(p, tmp_path / f"warm{i}", ["ok", "ok", "ok"][: 2 + i % 2]) for i in range(3)]
            servers = warm_servers()
            sockets = list(pool.dir.iterdir())
        assert warm_servers() == [] and not pool.dir.exists()  # leaving the block stops them
    assert cold.ok and all(j.ok for j in jobs), [j.describe_failure() for j in jobs]
    assert len(servers) == 1 and len([s for s in sockets if s.suffix == ".sock"]) == 1
    assert _seen(tmp_path / "cold", 0)["DDLBENCH_LAUNCHER"] == "forked"
    cold_agent = _seen(tmp_path / "cold", 0)["agent"]
    assert not _alive(cold_agent)  # a cold agent is the launcher's own child: already reaped
    agents = set()
    for i in range(3):
        out = tmp_path / f"warm{i}"
        seen = [_seen(out, r) for r in range(2 + i % 2)]
        agent = seen[0]["agent"]
        assert {s["agent"] for s in seen} == {agent} and agent not in agents
        agents.add(agent)
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "warm", "argv")
        like_cold = {k: v for k, v in _seen(tmp_path / "cold", 0).items() if k in keys}
        assert {k: v for k, v in seen[0].items() if k in keys} == like_cold | {
            "WORLD_SIZE": str(len(seen)), "LOCAL_WORLD_SIZE": str(len(seen)), "argv": [str(out), *["ok"] * len(seen)]}
        assert {s["DDLBENCH_LAUNCHER"] for s in seen} == {"warm"}  # what the job's summary records
        log = (out / "launcher.log").read_text()
        ranks = ", ".join(f"{r} (pid {s['pid']})" for r, s in enumerate(seen))
        assert f"agent 0: ranks {ranks} of {len(seen)} started" in log, log


@pytest.mark.parametrize("actions, failed", [
    (["sleep", "exit:7", "sleep"], [(1, 7), (0, -15), (2, -15)]),
    (["exit:3", "stop"], [(0, 3), (1, -9)]),  # a stopped rank never acts on SIGTERM
])
def test_a_failed_rank_is_reported_as_a_cold_agent_reports_it(
        tmp_path: Path, actions: list[str], failed: list[tuple[int, int]]) -> None:
    with warm.agents(), LocalProvider() as p:
        assert _run(p, tmp_path / "first", ["ok"]).ok
        result = _run(p, tmp_path / "job", actions)
    log = (tmp_path / "job" / "launcher.log").read_text()
    assert result.returncode == 1 and [(f["rank"], f["exitcode"]) for f in result.failed_ranks] == failed, log
    assert failed_ranks_from_log(log) == result.failed_ranks
    assert _gone([_seen(tmp_path / "job", r)["pid"] for r in range(len(actions))], 0.0)


def test_a_cancelled_job_is_gone_when_its_run_returns(tmp_path: Path) -> None:
    """The launcher's SIGTERM reaches the agent's group through the client, as a cold one's."""
    with warm.agents(), LocalProvider() as p:
        job = Job(module="tests.zygote_probe", args=[str(tmp_path), "sleep", "sleep"], world_size=2,
                  log_path=tmp_path / "launcher.log")
        threading.Thread(target=lambda: _wait_for_ranks(tmp_path, 2) or job.cancel.set(), daemon=True).start()
        result = p.run(job, echo=False)
        assert result.cancelled and not result.ok
        seen = [_seen(tmp_path, r) for r in range(2)]
        assert _gone([seen[0]["agent"], *(s["pid"] for s in seen)], 5.0)


def _wait_for_ranks(out: Path, n: int, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not all((out / f"rank{r}.json").exists() for r in range(n)):
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.05)


def test_a_job_whose_launcher_is_killed_dies_and_the_server_serves_on(tmp_path: Path) -> None:
    with warm.agents(), LocalProvider() as p:
        runner = threading.Thread(target=_run, args=(p, tmp_path / "killed", ["sleep", "ignore-term"]), daemon=True)
        runner.start()
        _wait_for_ranks(tmp_path / "killed", 2)
        seen = [_seen(tmp_path / "killed", r) for r in range(2)]
        client = next(c for c in psutil.Process().children() if any(a.startswith("--warm=") for a in cmdline(c)))
        client.kill()
        runner.join(30)
        assert _gone([seen[0]["agent"], *(s["pid"] for s in seen)])
        assert _run(p, tmp_path / "after", ["ok"]).ok
        assert _seen(tmp_path / "after", 0)["agent"] not in {s["agent"] for s in seen}
        assert len(warm_servers()) == 1


def test_every_agent_dies_with_its_server(tmp_path: Path) -> None:
    """And the job reads as one whose launcher was killed: SIGKILL's status, as a cold one's."""
    results: list[JobResult] = []
    with warm.agents(), LocalProvider() as p:
        runner = threading.Thread(target=lambda: results.append(_run(p, tmp_path, ["sleep", "stop"])), daemon=True)
        runner.start()
        _wait_for_ranks(tmp_path, 2)
        [server] = warm_servers()
        server.kill()
        runner.join(30)
        seen = [_seen(tmp_path, r) for r in range(2)]
        assert _gone([seen[0]["agent"], *(s["pid"] for s in seen)])
    assert [r.returncode for r in results] == [-9]


def test_a_server_serves_only_its_own_environment_and_none_is_cold(tmp_path: Path) -> None:
    env = base_env() | {"DDLBENCH_PROBE": "a"}
    with warm.agents() as pool:
        path = pool.socket_for("n", env)
        assert path is not None
        # This process's environment is not the server's: refused, and nothing started.
        assert warm.run_warm(path, ["--nprocs=1", "-m", "tests.zygote_probe", str(tmp_path), "ok"]) is None
        assert warm.run_warm(str(tmp_path / "none.sock"), ["--nprocs=1"]) is None
        assert len(warm_servers()) == 1 and not (tmp_path / "rank0.json").exists()
        first = warm_servers()[0].pid
        assert pool.socket_for("n", env | {"DDLBENCH_PROBE": "b"}) not in (None, path)  # another env: another server
        assert [s.pid for s in warm_servers()] != [first] and len(warm_servers()) == 1


def test_a_warm_jobs_cpu_is_this_processs_own_not_other_work(tmp_path: Path) -> None:
    """The host-load probe counts the ranks' CPU as the launcher's, though the server reaps them."""
    with warm.agents(), LocalProvider() as p:
        assert _run(p, tmp_path / "first", ["ok"]).ok
        probe = CpuProbe()
        assert _run(p, tmp_path / "job", ["burn", "burn"]).ok
        _, _, own = probe.seconds()
    burned = sum(_seen(tmp_path / "job", r)["cpu_s"] for r in range(2))
    assert burned >= 1.0 and own >= burned, (own, burned)


def test_a_job_with_restarts_runs_under_torchrun_even_inside_the_block(tmp_path: Path) -> None:
    with warm.agents(), LocalProvider() as p:
        result = _run(p, tmp_path, ["ok"], max_restarts=1)
        assert result.ok and warm_servers() == []
    # A fresh interpreter's rank: torchrun's, not a fork.
    assert _seen(tmp_path, 0)["warm"] is False and _seen(tmp_path, 0)["DDLBENCH_LAUNCHER"] is None


def test_kept_agents_last_until_released_and_a_block_inside_shares_them() -> None:
    """`keep()` (an Airflow task) opens the process's pool once; a block inside it neither makes
    its own nor stops it; `release()` (the run's teardown and finish) stops it, and leaves a
    block's pool alone."""
    warm.keep()
    kept = warm._active
    try:
        warm.keep()
        assert warm._active is kept
        with warm.agents() as pool:
            assert pool is kept
        assert warm._active is kept and kept.dir.exists()
    finally:
        warm.release()
    assert warm._active is None and not kept.dir.exists()
    with warm.agents() as pool:
        warm.release()
        assert warm._active is pool and pool.dir.exists()
    assert warm._active is None
