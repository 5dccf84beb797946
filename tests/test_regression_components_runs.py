"""The component alarm on real runs (issue 47): training jobs of a GPT shape no other test uses,
a history of unslowed runs, then one run per component class slowed through
`train.inject_where` so that the iteration is about a fifth slower: each is flagged and the
slowed component is named first; a host slowed by other work is not flagged."""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines.report import regression_components as rc
from pipelines.report.regression_stats import repeat_figures, run_level
from tests.trainjobs import run_job

pytestmark = [pytest.mark.slow, pytest.mark.alone]  # real runs' timings, and a host loaded on purpose

# A GPT of a shape no other test trains, on the Markov chain: 2 workers, SSGD over allreduce.
JOB = {"model": "gpt-tiny", "dataset": "markov", "n_layer": 2, "d_model": 40, "n_head": 2, "seq_len": 24,
       "algorithm": "ssgd", "comm": "allreduce", "workers": 2, "batch_size": 8, "steps": 80, "threads": 1}
HISTORY = 8
SLOWDOWN = 0.3  # of the history's median iteration: the top of the 15-30% the issue names


def _figures(out: Path, **options: Any) -> dict[str, Any]:
    summary, _ = run_job(out, **(JOB | options))
    figure = repeat_figures(out)
    assert figure is not None and figure["parts"], summary
    return run_level([figure]) | {"iter_s": summary["iter_time_s"]["p50"]}


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("history")
    return [_figures(root / f"h{i}") for i in range(HISTORY)]


def _brief(check: dict[str, Any], now: dict[str, Any] | None = None) -> str:
    """Every tested component on a line (the assertion's message: pytest cuts a long repr in its
    middle), and tonight's parts where given."""
    rows = [f"{r['component']} [{r['basis']}] change {r['change']:+.3f} p {r['p_value']:.2e} "
            f"adj {r['p_adjusted']:.2e} explains {r['explains']:+.3f}" for r in check["tests"]]
    extra = [f"work {check['work']}, explained {check['explained']:+.3f}, host moved {check['host_moved']}"]
    if now is not None:
        extra.append(f"tonight: {now['parts']} canary {now.get('canary_gemm_log')}")
    return "\n".join(rows + extra)


def _layer(history: list[dict[str, Any]]) -> str:
    """A leaf layer chosen at random (seeded) among those of the in-situ table."""
    names = sorted({k.split(" ", 1)[1] for k in history[0]["parts"]["seconds"] if k.startswith("forward ")})
    return random.Random(47).choice(names)


# `compute` is not among them: a uniform compute slowdown is told from a slower host only by the
# canary, and on this 2-core host the canary's own run-to-run noise and the history's spread of the
# raw compute (both about the iteration's 0.10-0.14 in logs) leave a 30% one missed in some runs
# (one of two CI runs): the noise floor, measured by benchmarks/bench_regression.py, not a test.
# tests/test_regression_components.py holds the method for it on simulated runs.
@pytest.mark.parametrize("where", ["layer", "update", "data"])
def test_a_slowed_component_is_flagged_and_named_first(history: list[dict[str, Any]], tmp_path: Path,
                                                       where: str) -> None:
    iteration_ms = statistics.median(h["iter_s"] for h in history) * 1e3
    layer = _layer(history)
    inject = f"layer:{layer}" if where == "layer" else where
    now = _figures(tmp_path / where, inject_delay_ms=SLOWDOWN * iteration_ms, inject_where=inject, inject_busy=True)
    check = rc.check_components(now, history, alpha=0.01, min_effect=0.05)
    assert check is not None and check["flagged"], _brief(check, now)
    if where == "layer":
        # The slowed layer is caught and is the first layer named. Whether the whole compute, which
        # the same delay moves, is named before it is not held here: on a real run it was in 2 of
        # 3 CI runs (the embedding's forward and backward each explain about half the compute's
        # change by the model, and the other layers' noise adds to the compute's): open in issue 47.
        shares = [c for c in check["flagged"] if c.endswith(" share")]
        assert shares and shares[0] in {f"forward {layer} share", f"backward {layer} share"}, \
            (check["flagged"], _brief(check))
        return
    assert check["flagged"][0] == where, (check["flagged"], _brief(check))


def test_a_host_slowed_by_other_work_is_no_workload_regression(history: list[dict[str, Any]],
                                                               tmp_path: Path) -> None:
    """CPU burners, each in a session of its own (as another tenant's jobs are), slow every part
    and the canary alike."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
               for _ in range(2 * (os.cpu_count() or 1))]
    try:
        now = _figures(tmp_path / "loaded")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    check = rc.check_components(now, history, alpha=0.01, min_effect=0.05)
    assert check is not None and check["flagged"] == [], _brief(check, now)
