"""The unrolled DAG of one scenario: the allreduce builder (modelling/dag.py) or the
parameter-server builders (modelling/dag_ps.py, which build on dag.py's), by its comm mode."""

from __future__ import annotations

from collections.abc import Sequence

from modelling.dag import Costs, Plan, build_allreduce
from modelling.dag_ps import build_ps
from modelling.scenario import Scenario
from training.config import Algorithm, Comm

# Unrolled iterations: enough for the asynchronous pipelines to settle; the
# second half is the steady state that is measured.
ITERATIONS = {(Algorithm.ssgd, Comm.allreduce): 3, (Algorithm.ssgd, Comm.ps): 4, (Algorithm.odsgd, Comm.ps): 6,
              (Algorithm.asgd, Comm.ps): 8}


def build_plan(c: Costs, s: Scenario, iterations: int | None = None, counts: Sequence[int] | None = None) -> Plan:
    """The unrolled DAG of scenario `s` (its world size; costs for that world size), over
    `iterations` (default: enough for the algorithm's usual pipeline to settle), or per
    worker class `counts` (ASGD only: its classes need not keep step)."""
    iterations = iterations or ITERATIONS[(s.algorithm, s.comm)]
    if s.comm == Comm.allreduce:
        return build_allreduce(c, s.workers, iterations, overlap=s.overlap, bucket_bytes=s.bucket_bytes)
    asgd = s.algorithm == Algorithm.asgd
    return build_ps(c, s.algorithm, s.workers, s.servers, iterations, counts=counts if asgd else None)
