"""The host-load probe on real processes: other work's CPU counts, the job's own does not."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from infra.hostload import QUIET, CpuProbe
from pipelines.report.tables import describe_load, host_load

BURN = "import time\nt = time.process_time() + {s}\nwhile time.process_time() < t: pass\n"


def _burn_as_child(seconds: float) -> None:
    """A child of this process that burns `seconds` of CPU, waited for: the job's own work."""
    subprocess.run([sys.executable, "-c", BURN.format(s=seconds)], check=True)


def _burn_as_stranger(seconds: float) -> None:
    """A process this one never waits for (its parent shell exits at once): other work."""
    shell = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "$0" >/dev/null 2>&1 & echo $!', BURN.format(s=seconds)],
        capture_output=True, text=True, check=True,
    )
    psutil.Process(int(shell.stdout)).wait(timeout=60)


def test_other_work_counts_and_the_jobs_own_does_not():
    """Exact whatever else runs: another process's CPU seconds are in `other`, a reaped child's in
    `own` (and so out of `other`, which is the host's busy time less `own`)."""
    mine = CpuProbe()
    _burn_as_child(0.5)
    _, _, own = mine.seconds()
    assert own >= 0.45  # the child's 0.5 s (the clock ticks at 10 ms)
    stranger = CpuProbe()
    _burn_as_stranger(0.5)
    wall, other, own = stranger.seconds()
    assert other is not None and other >= 0.45 and own < 0.2, (wall, other, own)  # own: the shell's
    share = stranger.other_share()  # the same seconds over the host's capacity since the probe began
    assert share is not None and 0.45 / (2 * wall * psutil.cpu_count()) < share <= 1.0


def _run(share: float | None) -> dict:
    return {"summary": {"environment": {"host_other_cpu_share": share}}}


def test_the_report_says_whether_the_host_was_loaded():
    assert host_load([_run(None)]) is None
    assert "not measured" in describe_load(None)
    quiet = host_load([_run(0.01), _run(0.03), _run(None)])
    assert quiet == {"median": 0.02, "min": 0.01, "max": 0.03, "runs": 2, "loaded": False}
    assert describe_load(quiet).endswith(f"a quiet host (below {QUIET:.0%}).")
    loaded = host_load([_run(0.02), _run(0.40), _run(0.05)])
    assert loaded["median"] == pytest.approx(0.05) and loaded["loaded"]
    assert "**a loaded host**" in describe_load(loaded) and "[2%, 40%]" in describe_load(loaded)


def test_a_live_child_that_no_job_started_is_other_work():
    """Only a warm server's reaped agents (infra/warm.py) count while their parent lives on; any
    other live descendant (a test's CPU burner, another tenant's session) is other work."""
    probe = CpuProbe()
    child = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.5) + "import time\ntime.sleep(60)\n"],
                             start_new_session=True)
    try:
        burner = psutil.Process(child.pid)
        while sum(burner.cpu_times()[:2]) < 0.5:
            assert child.poll() is None
            psutil.wait_procs([burner], timeout=0.05)
        _, _, own = probe.seconds()
        assert own < 0.3  # this process's polling, not the child's 0.5 s
    finally:
        child.kill()
        child.wait()
