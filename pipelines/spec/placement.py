"""Where every job of a spec runs: each job's ranks placed on the spec's provider's nodes
(infra/placement.py) when the spec loads, so a grid that does not fit fails before anything runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra import ProviderError

if TYPE_CHECKING:
    from pipelines.spec import BenchSpec


def jobs(spec: BenchSpec, entries: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """Every job shape the run launches, (workers, servers) -> what it is: the training grid's,
    the microbenchmark's (the placement of the jobs it models) and the profile's."""
    shapes: dict[tuple[int, int], str] = {}
    for entry in entries:
        c = entry["config"]
        shapes.setdefault((c["workers"], c["servers"]), f"workers={c['workers']} + servers={c['servers']} (training)")
    if spec.microbench.enabled:
        for n in spec.workers:
            shapes.setdefault((n, spec.servers), f"workers={n} + servers={spec.servers} (microbenchmark)")
    if spec.profile.enabled:
        shapes.setdefault((max(spec.workers), 0), f"workers={max(spec.workers)} (profile processes)")
    return shapes


def placement_problems(spec: BenchSpec, entries: list[dict[str, Any]], source: str = "spec") -> list[str]:
    """Every job's ranks on the provider's nodes by its placement policy (infra/placement.py):
    one line per job that cannot be placed, naming the option. Building a provider provisions nothing."""
    provider = spec.provider.build()
    problems = []
    for (workers, servers), what in sorted(jobs(spec, entries).items()):
        try:
            provider.place(workers, servers)
        except ProviderError as err:
            problems.append(f"{source}.{err} (a job of {what})")
    return problems
