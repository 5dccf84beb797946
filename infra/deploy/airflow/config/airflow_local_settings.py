"""Airflow's local settings for a ddlbench deployment: Airflow imports `airflow_local_settings`
in every process it starts, from $AIRFLOW_HOME/config or the Python path (env.sh puts this
folder on it).

The scheduler forks every task process (the LocalExecutor's workers are forked from it, and
each forks a task), so what the scheduler has imported, every task starts with. It imports
the project and what its stages import when they run (pipelines.stages.preload: torch, MLflow
and its store, matplotlib, SciPy), once, instead of each task importing them again. Other
Airflow processes (the API server, the DAG processor, a CLI command) fork no task and import
nothing more. A preload that fails leaves the tasks to import on their own, where the error
shows in the task that needs the module.
"""

from __future__ import annotations

import logging
import sys

if sys.argv[1:2] == ["scheduler"]:
    try:
        from pipelines.stages import preload

        preload()
    except Exception:  # noqa: BLE001 - the scheduler runs on; a task meets the error itself
        logging.getLogger(__name__).warning("ddlbench: the scheduler's preload failed", exc_info=True)
