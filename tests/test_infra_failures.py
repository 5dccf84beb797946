"""Reading torchrun's failure summary: every failed rank, the killed one first."""

from __future__ import annotations

from infra.base import failed_ranks_from_log

# As torchrun printed it in CI when a PS shard was SIGKILLed: the workers raised on the
# closed connection a moment before the agent noticed the kill, so its "root cause" is
# a worker that the agent itself then stopped with SIGTERM.
SUMMARY = """\
E1130 06:27:57.089000 8526 api.py:1002] failed (exitcode: -15) local_rank: 0 (pid: 8532) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
training.run FAILED
------------------------------------------------------------
Failures:
[0]:
  time      : 2026-11-30_06:27:57
  host      : localhost
  rank      : 2 (local_rank: 2)
  exitcode  : -9 (pid: 8534)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 8534
[2]:
  time      : 2026-11-30_06:27:56
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 8533)  (SIGTERM)
  error_file: /tmp/attempt_0/1/error.json
  traceback : RuntimeError: Connection closed by peer
------------------------------------------------------------
Root Cause (first observed failure):
[1]:
  time      : 2026-11-30_06:27:56
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 8532)  (SIGTERM)
  error_file: /tmp/attempt_0/0/error.json
  traceback : RuntimeError: Connection closed by peer
============================================================
"""


def test_every_failed_rank_is_named_the_killed_one_first() -> None:
    assert failed_ranks_from_log(SUMMARY) == [
        {"rank": 2, "exitcode": -9, "signal": "SIGKILL"},
        {"rank": 1, "exitcode": -15, "signal": "SIGTERM"},
        {"rank": 0, "exitcode": -15, "signal": "SIGTERM"},
    ]


def test_without_a_summary_the_agent_lines_name_the_ranks() -> None:
    text = "E1130 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 7) of binary: python\n"
    assert failed_ranks_from_log(text) == [{"rank": 1, "exitcode": 1}]
    assert failed_ranks_from_log("nothing failed here") == []


def test_without_a_summary_a_forked_agents_lines_name_the_global_ranks() -> None:
    """Agent 1 of a job whose agent 0 has 2 ranks, ended before its summary: its rank 3 is local 1."""
    text = ("[infra.zygote] rank 3 failed (exitcode: 7) local_rank: 1 (pid: 9) of module training.run\n"
            "[infra.zygote] closing signal SIGTERM to ranks of pids [8]\n"
            "[infra.zygote] rank 2 failed (exitcode: -15) local_rank: 0 (pid: 8) of module training.run (SIGTERM)\n")
    assert failed_ranks_from_log(text) == [{"rank": 3, "exitcode": 7},
                                           {"rank": 2, "exitcode": -15, "signal": "SIGTERM"}]
