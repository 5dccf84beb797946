"""The microbenchmark's timing on real torchrun ranks: one clock for every rank, and an
operation timed from its last rank's arrival (modelling/measure/microbench_rank.py)."""

from __future__ import annotations

import json
import statistics

import pytest

from infra import Job
from infra.local import LocalProvider
from modelling.measure.microbench import run_microbench
from tests.clock_probe import LATE_S


@pytest.mark.slow  # a torchrun job
@pytest.mark.alone  # the ranks' clock stamps
def test_an_operation_is_timed_from_its_last_ranks_arrival_on_one_clock(tmp_path):
    job = Job("tests.clock_probe", [str(tmp_path)], world_size=3, log_path=tmp_path / "log", timeout_s=120)
    result = LocalProvider().run(job)
    assert result.ok, (tmp_path / "log").read_text()
    clock = json.loads((tmp_path / "clock.json").read_text())
    # One kernel, one CLOCK_MONOTONIC: the ping-pong estimates find no offset beyond their
    # half round trip on loopback.
    assert clock["offsets"][0] == 0.0
    assert all(abs(o) < 2e-3 for o in clock["offsets"]), clock["offsets"]
    # Rank 1 arrived late by LATE_S give or take the barrier's release skew (a scheduler's
    # slice or two on a busy host), and rank 0 waited for it in every repeat; from rank 1's
    # arrival the allreduce of 4 KiB on loopback takes a fraction of what rank 0's own clock counts.
    assert min(clock["late"]) > LATE_S / 2, clock["late"]
    assert all(own >= late for own, late in zip(clock["own"], clock["late"], strict=True)), clock
    assert statistics.median(clock["aligned"]) < LATE_S / 2, clock["aligned"]
    assert all(0 <= a < own for a, own in zip(clock["aligned"], clock["own"], strict=True))


@pytest.mark.slow  # two microbenchmark jobs
@pytest.mark.alone  # the host's CPU time per round
def test_the_hosts_cpu_per_round_is_read_only_where_the_model_uses_it(tmp_path):
    """On loopback the model holds a transfer's copying on the ranks' CPUs and never reads the
    host's CPU per round, so the microbenchmark does not spend its half-second loops on it;
    with a link of stated rate between the ranks of one host it does, and the fit has it."""
    from modelling.network.costs import CommCosts
    from modelling.network.fit import fit_comm
    from modelling.predict import loopback

    sizes = [4096, 65536]
    looped = run_microbench(2, 1, tmp_path / "loopback", sizes=sizes, repeats=3)
    linked = run_microbench(2, 1, tmp_path / "linked", sizes=sizes, repeats=3, link_bytes_per_s=1.25e8)
    rounds = ("allreduce", "ps")
    assert [m["host_cpu_s"] for m in looped["measurements"] if m["primitive"] in rounds] == [None] * 4
    assert all(m["host_cpu_s"] > 0 and m["host_cpu_wall_s"] > 0
               for m in linked["measurements"] if m["primitive"] in rounds)
    assert loopback(looped) and not loopback(linked)
    assert CommCosts(fit_comm(looped)).host_cpu("ps", 2, 1) is None
    assert CommCosts(fit_comm(linked)).host_cpu("ps", 2, 1)(65536) > 0
