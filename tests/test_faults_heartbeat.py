"""The per-rank heartbeat and the launcher's reading of it (training/heartbeat.py); the real
jobs with a stopped rank are in tests/test_faults_training.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from training import heartbeat
from training.heartbeat import Beat, Heartbeat, describe_stall, stalled
from training.measure.timeline import Timeline

REPO = Path(__file__).resolve().parent.parent


def test_the_issue_s_message_word_for_word() -> None:
    stopped = [Beat(2, "server", 100.0, 167, "comm_exposed of step 167")]
    cause = "rank 0 (worker) failed during comm_exposed of step 167: RuntimeError: Timed out waiting 8000ms"
    assert describe_stall(stopped, {0: cause}) == "rank 2 (server) stopped answering at step 167; " \
                                                  "rank 0 timed out waiting for it"
    closed = "rank 1 (worker) failed during comm_exposed of step 168: RuntimeError: Connection closed by peer"
    assert describe_stall(stopped, {0: cause, 1: closed, 2: "x"}) == (
        "rank 2 (server) stopped answering at step 167; rank 0 timed out waiting for it; rank 1 failed in turn")
    early = [Beat(1, "worker", 100.0, None, "start-up")]
    assert describe_stall(early, {}) == "rank 1 (worker) stopped answering during start-up"


def test_beats_name_the_exact_step_and_a_clean_end(tmp_path: Path) -> None:
    tl = Timeline(3, "server", time.monotonic())
    with Heartbeat(tmp_path, 3, "server", tl, interval_s=60):  # no thread beat inside: the step beats it
        assert heartbeat.read(tmp_path)[3].step is None
        for t in range(5):
            tl.begin(t)
            assert heartbeat.read(tmp_path)[3].step == t
            tl.end()
        beat = heartbeat.read(tmp_path)[3]
        assert (beat.role, beat.step, beat.ended) == ("server", 4, False)
    assert heartbeat.read(tmp_path)[3].ended and tl.on_begin is None
    heartbeat.clear(tmp_path)
    assert heartbeat.read(tmp_path) == {}


def test_a_stopped_process_s_beat_ages_while_a_waiting_one_s_does_not(tmp_path: Path) -> None:
    """Real processes: one stopped (SIGSTOP) and one blocked in a wait that releases the GIL;
    only the stopped one is named."""
    code = ("import sys, time, threading; from pathlib import Path; from training.heartbeat import Heartbeat; "
            "from training.measure.timeline import Timeline; r = int(sys.argv[1]); tl = Timeline(r, 'worker', 0.0); "
            "h = Heartbeat(Path(sys.argv[2]), r, 'worker', tl, interval_s=0.1).start(); tl.begin(7); "
            "print('up', flush=True); threading.Event().wait(60)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r), str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              text=True) for r in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "up"
        procs[1].send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        beats = heartbeat.read(tmp_path)
        assert beats[0].time - beats[1].time > 1.5, beats
        named = stalled(beats, timeout_s=2.0, interval_s=0.1)
        assert [(b.rank, b.step) for b in named] == [(1, 7)]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    running=st.lists(st.floats(0, 3.9), min_size=1, max_size=8),
    stopped=st.lists(st.floats(4.01, 1000), max_size=4),
    ended=st.lists(st.floats(0, 1000), max_size=3),
    timeout_s=st.floats(0.1, 8.0),
)
def test_only_ranks_silent_for_over_half_the_timeout_are_named(running, stopped, ended, timeout_s) -> None:
    """Ranks that beat within 8 intervals of the newest (4 s at 0.5 s) are never named; ranks silent
    longer than half the timeout and 8 intervals are, unless their last beat said they ended."""
    now = 10_000.0
    ages = [("run", a) for a in running] + [("stop", a) for a in stopped] + [("end", a) for a in ended]
    beats = {r: Beat(r, "worker", now - age, r, "", kind == "end") for r, (kind, age) in enumerate(ages)}
    newest = max(b.time for b in beats.values())
    gap = max(0.5 * timeout_s, 4.0)
    expected = [r for r, (kind, age) in enumerate(ages) if kind != "end" and newest - (now - age) > gap]
    assert [b.rank for b in stalled(beats, timeout_s)] == expected
    assert not set(expected) & {r for r, (kind, a) in enumerate(ages) if kind == "run"}
