"""Pipeline runs that MLflow holds, compared (`ddlbench compare`, the report's reference
hardware): each run's comparison table from its finished training runs, newest first, and one
hardware label's table against another's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from pipelines.metrics import summary_from_metrics
from pipelines.report.tables import best_per_config, comparison, config_label, config_of


def _as_run(child: Any) -> dict[str, Any]:
    """A training child run of MLflow in the shape report.comparison takes."""
    t = child.data.tags
    algo = f"{t.get('ddlbench.algorithm')}-{t.get('ddlbench.comm')}"
    workers, batch = int(t.get("ddlbench.workers", 0)), int(t.get("ddlbench.batch_size", 0))
    return {
        "key": t.get("ddlbench.config_key"),
        "algorithm": algo,
        "model": t.get("ddlbench.model"),
        "dataset": t.get("ddlbench.dataset"),
        "workers": workers,
        "batch_size": batch,
        "config": t.get("ddlbench.config")
        or (config_of(t["ddlbench.config_key"]) if t.get("ddlbench.config_key") else None)
        or config_label(t.get("ddlbench.model"), algo, workers, batch),
        "summary": summary_from_metrics(child.data.metrics),
    }


def compare_runs(
    client: Any, experiment_id: str, hardware: str | None, since_ms: int | None, until_ms: int | None
) -> list[dict[str, Any]]:
    """Pipeline runs found with MLflow search, newest first, each with the report's comparison
    table (medians over repeats, scaling efficiency) and best algorithm per config."""
    return list(compared_runs(client, experiment_id, hardware, since_ms, until_ms))


def compared_runs(
    client: Any, experiment_id: str, hardware: str | None, since_ms: int | None, until_ms: int | None
) -> Iterator[dict[str, Any]]:
    """compare_runs one run at a time: each run's training children are searched only when asked for."""
    filters = ["tags.`ddlbench.node` = 'pipeline'"]
    if hardware:
        filters.append(f"tags.`ddlbench.hardware` = '{hardware}'")
    if since_ms is not None:
        filters.append(f"attributes.start_time >= {since_ms}")
    if until_ms is not None:
        filters.append(f"attributes.start_time < {until_ms}")
    parents = client.search_runs(
        [experiment_id], " AND ".join(filters), order_by=["attributes.start_time DESC"], max_results=200
    )
    for p in parents:
        key = p.data.tags.get("ddlbench.run_key")
        children = client.search_runs(
            [experiment_id],
            f"tags.`ddlbench.run_key` = '{key}' AND tags.`ddlbench.step` = 'train' AND attributes.status = 'FINISHED'",
            max_results=5000,
        )
        runs = [_as_run(c) for c in children if c.data.metrics.get("throughput_samples_per_s")]
        table = comparison(runs)
        yield {
            "run_key": key,
            "date": datetime.fromtimestamp(p.info.start_time / 1000, UTC),
            "hardware": p.data.tags.get("ddlbench.hardware"),
            "status": p.info.status,
            "regression": p.data.tags.get("ddlbench.regression", "-"),
            "table": table,
            "best": best_per_config(table),
        }


def hardware_ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration of two hardware labels' comparison tables: each one's median samples/s
    over its repeats with their range, and B's over A's. The ratio's interval runs from the
    repeats' least favourable pairing to their most (B's slowest over A's fastest, B's fastest
    over A's slowest): with a few repeats a side, the extremes are what they measured. A
    configuration only one label ran is listed with `only` naming it."""
    by_a, by_b = {r["config"]: r for r in a}, {r["config"]: r for r in b}
    rows = []
    for config in sorted(by_a.keys() | by_b.keys()):
        ra, rb = by_a.get(config), by_b.get(config)
        row: dict[str, Any] = {"config": config}
        for side, r in (("a", ra), ("b", rb)):
            row |= {f"{side}_median": r and r["throughput_median"], f"{side}_min": r and r["throughput_min"],
                    f"{side}_max": r and r["throughput_max"], f"{side}_repeats": r and r["repeats"]}
        row["only"] = None if ra and rb else ("A" if ra else "B")
        if ra and rb and ra["throughput_median"] and rb["throughput_median"]:
            row |= {"ratio": rb["throughput_median"] / ra["throughput_median"],
                    "ratio_low": rb["throughput_min"] / ra["throughput_max"],
                    "ratio_high": rb["throughput_max"] / ra["throughput_min"]}
        else:
            row |= {"ratio": None, "ratio_low": None, "ratio_high": None}
        rows.append(row)
    return rows


def latest(client: Any, experiment_id: str, hardware: str, but: str | None = None) -> dict[str, Any] | None:
    """A hardware label's newest pipeline run with finished training runs (compare_runs' shape),
    other than the run key `but`; None where it has none. The older runs are not searched."""
    return next((r for r in compared_runs(client, experiment_id, hardware, None, None)
                 if r["table"] and r["run_key"] != but), None)


def against(client: Any, experiment_id: str, label: str, table: list[dict[str, Any]],
            run_key: str) -> dict[str, Any]:
    """This run's comparison table against the reference label's newest run (hardware_ratios:
    the reference is A, this run B), or a `note` saying why there is none."""
    ref = latest(client, experiment_id, label, but=run_key)
    if ref is None:
        return {"hardware": label, "rows": [], "note": f"no finished training runs of {label!r} to compare against"}
    return {"hardware": label, "run_key": ref["run_key"], "date": ref["date"].isoformat(),
            "rows": hardware_ratios(ref["table"], table)}
