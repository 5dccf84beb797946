"""MLflow runs left RUNNING whose run directory vanished: found by their tags, ended FAILED.

The journal is a pipeline run's record of its MLflow runs (pipelines/tracking/journal.py); once its
directory is gone only MLflow knows them. Each run carries its run key, its run directory and
its owner (pipelines/tracking/upload.py), so a run is ended only when nothing else will end it:
its run directory is gone from this host, and its owner is a process that died, the process
that found the directory gone (`dying`, about to fail), or the pipeline run itself (over, with
no directory to go on in). A run whose owner lives, or whose directory is on another host, is
left alone.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.rundir import RunDir
from pipelines.tracking.journal import owner_alive
from pipelines.tracking.upload import TAG_FAILURE, TAG_OWNER, TAG_RUN_DIR, TAG_RUN_KEY


@dataclass
class Swept:
    """What `end_stranded` did: the runs it ended, and the runs of a vanished directory it left
    RUNNING, each with why."""

    ended: list[Any] = field(default_factory=list)
    kept: list[tuple[Any, str]] = field(default_factory=list)


def run_owner(tags: dict[str, str]) -> dict[str, Any]:
    """A run's owner as its tags record it (journal.owner's fields), {} when none is recorded."""
    own: dict[str, Any] = {k.removeprefix(TAG_OWNER): v for k, v in tags.items() if k.startswith(TAG_OWNER)}
    if "pid" in own:
        own["pid"] = int(own["pid"])
    if "started" in own:
        own["started"] = float(own["started"])
    return own


def end_stranded(
    client: Any,
    *,
    run_key: str | None = None,
    experiment_ids: list[str] | None = None,
    vanished: Path | None = None,
    dying: dict[str, Any] | None = None,
) -> Swept:
    """End FAILED, with the reason in `ddlbench.failure`, the RUNNING runs (of `run_key`, else of
    every ddlbench run in the store) whose run directory is gone and whose owner will not end them.

    `vanished`: a run directory known gone, also where a stray write has made it again since.
    `dying`: the caller's own owner (journal.owner), whose runs end though it lives. A run with
    no owner recorded (an older ddlbench's) or another host's is listed as kept when `run_key`
    names it, else not looked at.
    """
    gone_dir = vanished.resolve() if vanished is not None else None
    swept = Swept()
    for run in list(_running(client, run_key, experiment_ids)):  # listed first: ending one moves the pages
        tags = run.data.tags
        own, run_dir = run_owner(tags), tags.get(TAG_RUN_DIR)
        if not own.get("host") or not run_dir:
            if run_key:
                swept.kept.append((run, "no owner recorded (opened by an older ddlbench)"))
            continue
        if own["host"] != platform.node():
            if run_key:
                swept.kept.append((run, f"its run directory is on {own['host']}"))
            continue
        if Path(run_dir) != gone_dir and RunDir(run_dir).ctx.exists():
            continue  # its journal is there: `ddlbench sync RUN_DIR` judges it
        mine = dying is not None and (own["host"], own.get("pid")) == (dying["host"], dying["pid"])
        # a process's run, also one the pipeline owned before a process reopened it: kept while that lives
        if own.get("pid") is not None and not mine and owner_alive(own):
            swept.kept.append((run, f"its process {own['pid']} is alive"))
            continue
        client.set_tag(run.info.run_id, TAG_FAILURE, f"run directory {run_dir} vanished mid-run")
        client.set_terminated(run.info.run_id, "FAILED")
        swept.ended.append(run)
    return swept


def _running(client: Any, run_key: str | None, experiment_ids: list[str] | None) -> Any:
    """The RUNNING runs that carry a run key (this one, when given), over every experiment by default."""
    if experiment_ids is None:
        experiment_ids = [e.experiment_id for e in _pages(client.search_experiments)]
    if not experiment_ids:
        return
    where = "attributes.status = 'RUNNING'"
    if run_key is not None:
        where += f" AND tags.`{TAG_RUN_KEY}` = '{run_key}'"
    for run in _pages(client.search_runs, experiment_ids, filter_string=where):
        if TAG_RUN_KEY in run.data.tags:
            yield run


def _pages(search: Any, *args: Any, **kwargs: Any) -> Any:
    token = None
    while True:
        page = search(*args, **kwargs, max_results=1000, page_token=token)
        yield from page
        token = page.token
        if not token:
            return
