"""Plans specs in a process whose address space is limited, as a refusing Airflow worker's
would be: reads cases as JSON from stdin, prints one JSON result per case.

A case: {"spec": path, "overrides": {...}, "home": str | None, "trigger": bool}, or "nest":
{"field", "depth"} for overrides nested deeper than JSON is written; "timed" where the test
times the refusal (the probe then warms torch's meta device first, as a worker that has planned). A result:
{"accepted": true, "configs": N} or {"refused": text, "s": seconds}, or {"raised": repr}
for anything else (a MemoryError, a traceback's exception): the tests fail on those.
"""

from __future__ import annotations

import json
import resource
import sys
import time

LIMIT_BYTES = 4 << 30
AIRFLOW = {"dag_id": "ddlbench_nightly", "run_id": "manual__1", "task_id": "start", "try_number": 1}


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
    import torch

    from pipelines.spec import SpecError
    from pipelines.stages.lifecycle import plan

    cases = json.load(sys.stdin)
    if any(case.get("timed") for case in cases):
        # Warm, as a worker that has planned before: the first forward on the meta device imports
        # torch's reference kernels (seconds), which a timed refusal is not about.
        with torch.device("meta"):
            torch.nn.Linear(2, 2)(torch.zeros(1, 2)).relu()

    for case in cases:
        overrides = case.get("overrides")
        if "nest" in case:  # {"field": ..., "depth": ...}: deeper than JSON is written here
            overrides = {case["nest"]["field"]: _nested(case["nest"]["depth"])}
        start = time.monotonic()
        try:
            _, entries, _ = plan(case["spec"], home=case.get("home"), overrides=overrides,
                                 airflow=AIRFLOW if case.get("trigger") else None)
            result = {"accepted": True, "configs": len(entries)}
        except SpecError as err:
            result = {"refused": str(err), "s": time.monotonic() - start}
        except BaseException as err:  # noqa: BLE001 - reported to the test, which fails on it
            result = {"raised": f"{type(err).__name__}: {str(err)[:300]}"}
        print(json.dumps(result), flush=True)


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"x": value}
    return value


if __name__ == "__main__":
    main()
