"""Liveness under every algorithm: while a job runs, the launcher watches the ranks' beats
(training/heartbeat.py `Watch`) and a rank that stops beating ends the job, even where no
peer waits for it (ASGD)."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.base import run_processes
from infra.local import LocalProvider
from pipelines.launch import JobFailed, launch, prepare
from tests.test_faults_training import no_ranks_left
from tests.trainjobs import rank_process
from training import heartbeat
from training.heartbeat import Beat, Heartbeat, Watch, stalled
from training.measure.timeline import Timeline

FLOOR_S = heartbeat.MIN_GAP_INTERVALS * heartbeat.INTERVAL_S  # beats more than the timeout a stop must last
POLLS = 40

rank_kinds = st.tuples(st.sampled_from(["run", "stop", "end", "pause", "never"]), st.integers(0, POLLS))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(others=st.lists(rank_kinds, max_size=6), timeout_s=st.floats(0.5, 30.0),
       skew=st.lists(st.floats(-1e4, 1e4), min_size=7, max_size=7))
def test_only_a_rank_silent_past_the_timeout_while_another_beats_is_stalled(others, timeout_s, skew) -> None:
    """The launcher reads every rank's beat once a second. Rank 0 beats throughout; the
    others beat until their poll `k`, then stop (silent), say they ended, pause (an
    evaluation), or never beat. Only the silent ones are stalled, once the launcher has seen
    nothing new from them for over the timeout and 8 beats; the ranks' own clocks (skewed by
    hours) play no part."""
    ranks = [("run", POLLS), *others]
    watch = Watch(Path("unused"), timeout_s, on_stall=lambda: None)
    for now in range(POLLS + 1):
        beats = {}
        for rank, (kind, k) in enumerate(ranks):
            if kind == "never":
                continue
            last = min(now, k) if kind != "run" else now  # a beat that stopped changing at poll k
            beats[rank] = Beat(rank, "worker", skew[rank] + 0.5 * last, last, "", ended=kind == "end" and last == k,
                               paused=kind == "pause" and last == k)
        watch.see(beats, float(now))
    expected = [r for r, (kind, k) in enumerate(ranks) if kind == "stop" and POLLS - k > timeout_s + FLOOR_S]
    assert [b.rank for b in stalled(watch.beats(), timeout_s, running=True)] == expected


@pytest.mark.parametrize("silent_for", [60, 600])
def test_no_rank_is_stalled_while_torchrun_restarts_the_job(silent_for) -> None:
    """Between attempts every rank is silent (none is behind a newer beat); as the next
    attempt starts, a rank not yet beating again is starting up, not stopped."""
    watch = Watch(Path("unused"), 8.0, on_stall=lambda: None)
    watch.see({r: Beat(r, "worker", 0.0, 30, "") for r in range(3)}, 0.0)
    last = {r: Beat(r, "worker", 0.5, 31, "") for r in range(3)}  # then the attempt fails
    watch.see(last, 1.0)
    watch.see(last, float(silent_for))
    assert stalled(watch.beats(), 8.0, running=True) == []
    restarted = {0: Beat(0, "worker", 99.0, None, "start-up", attempt=1)}
    watch.see(last | restarted, silent_for + 1.0)
    assert stalled(watch.beats(), 8.0, running=True) == []
    # The new attempt under way, a rank of it that stops is stalled again.
    watch.see({r: Beat(r, "worker", 100.0, 0, "step 0", attempt=1) for r in range(3)}, silent_for + 2.0)
    watch.see({r: Beat(r, "worker", 200.0, 9, "step 9", attempt=1) for r in (0, 2)}, silent_for + 30.0)
    assert [b.rank for b in stalled(watch.beats(), 8.0, running=True)] == [1]


def test_a_pause_is_in_the_beat_as_it_begins(tmp_path: Path) -> None:
    tl = Timeline(0, "worker", time.monotonic())
    with Heartbeat(tmp_path, 0, "worker", tl, interval_s=60):  # no thread beat inside: the pause beats it
        tl.begin(4)
        tl.end()
        with tl.pause("evaluation after step 4"):
            beat = heartbeat.read(tmp_path)[0]
            assert (beat.paused, beat.step, beat.doing) == (True, 4, "evaluation after step 4")
        tl.begin(5)
        assert not heartbeat.read(tmp_path)[0].paused


def test_a_cancel_ends_a_running_job(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    t0 = time.monotonic()
    result = run_processes([[sys.executable, "-c", "import time; time.sleep(120)"]], [dict(os.environ)],
                           tmp_path / "log", timeout_s=60, echo=False, cancel=cancel)
    assert time.monotonic() - t0 < 10
    assert result.cancelled and not result.ok and not result.timed_out
    assert result.describe_failure().startswith("the launcher ended the job (log: ")


@pytest.mark.slow
@pytest.mark.alone  # the time to notice the stop
@pytest.mark.faults
def test_a_stopped_asgd_worker_ends_the_job_though_no_peer_waits_for_it(tmp_path):
    """ASGD: the other worker trains on against the shard and no step waits for the stopped
    worker; its beat stops, and the launcher ends the job, naming it. Where the stop fell between
    the worker's push and its pull, the shard's reply waits for it and times out first (gloo's
    send of the weights needs its receiver), and the other worker, whose next push waits on that
    shard, may time out as well: the job then ends on those timeouts, the stopped rank still named
    first and the others' timeouts, or their failures in turn, after it."""
    out = tmp_path.resolve()
    timeout = 8
    cfg = prepare({"model": "mlp", "dataset": "synthetic", "algorithm": "asgd", "comm": "ps", "workers": 2,
                   "servers": 1, "batch_size": 16, "steps": 100_000, "timeout_s": timeout})
    stopped: list[float] = []
    pids: list[int] = []

    def stop_rank_1_at_step_20() -> None:
        proc = rank_process(out, 1)
        pids.append(proc.pid)
        while (beat := heartbeat.read(out).get(1)) is None or (beat.step or 0) < 20:
            time.sleep(0.05)
        stopped.append(time.monotonic())
        proc.send_signal(signal.SIGSTOP)

    threading.Thread(target=stop_rank_1_at_step_20, daemon=True).start()
    try:
        with pytest.raises(JobFailed) as err:
            launch(cfg, out, LocalProvider(), timeout_s=240, echo=False)
        assert stopped, f"the job failed before the fault was injected: {err.value}"
        detected = time.monotonic() - stopped[0]
        print(f"noticed and torn down {detected:.1f} s after the stop")
        assert detected < timeout + 15, detected
        first = str(err.value).splitlines()[0]
        named = re.fullmatch(r"rank 1 \(worker\) stopped answering at step (\d+)"
                             r"((?:; ranks? [02](?:, [02])? (?:timed out waiting for it|failed in turn))*)", first)
        assert named, first
        assert int(named[1]) >= 20
        assert named[2] or "the launcher ended the job" in str(err.value), str(err.value)
        assert no_ranks_left(out)
    finally:
        for pid in pids:  # a stopped rank the launcher failed to end
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
