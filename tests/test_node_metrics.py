"""Per-node system metrics (issue 53): each node's CPU share of the host over the interval, its
resident memory and the bytes its link moved since the start, under MLflow's node layout."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.node_usage import NodeUsage
from pipelines.tracking.node_metrics import NodeMetrics

readings = st.tuples(st.floats(0, 100), st.integers(0, 2**34), st.integers(0, 2**34), st.integers(0, 2**34),
                     st.integers(1, 64))


@settings(max_examples=50, deadline=None)
@given(first=st.lists(readings, min_size=1, max_size=4), later=st.lists(readings, min_size=4, max_size=4),
       interval=st.floats(0.5, 10))
def test_each_nodes_series_are_its_own_share_memory_and_bytes_since_the_start(first, later, interval) -> None:
    nodes = [f"node-{i}" for i in range(len(first))]
    script = [{n: NodeUsage(*r) for n, r in zip(nodes, rs, strict=False)} for rs in (first, later, later)]
    times = iter([0.0, interval, interval + 1.0])
    logged: list[tuple[dict[str, float], int]] = []
    # An interval the thread never reaches: the samples are the test's own, and stop()'s last one.
    sampler = NodeMetrics(lambda: script.pop(0), lambda m, step: logged.append((m, step)), interval_s=3600,
                          clock=lambda: next(times)).start()
    metrics = sampler.sample()
    sampler.stop()
    assert logged[0] == (metrics, 0) and logged[1][1] == 1 and len(logged) == 2
    for n, (a, b) in zip(nodes, zip(first, later, strict=False), strict=False):
        cpu = max(0.0, b[0] - a[0]) / (interval * os.cpu_count()) * 100
        assert metrics[f"system/{n}/cpu_utilization_percentage"] == pytest.approx(cpu, abs=0.006)
        assert metrics[f"system/{n}/memory_rss_megabytes"] == pytest.approx(b[1] / 1e6, abs=6e-4)
        assert metrics[f"system/{n}/network_transmit_megabytes"] == pytest.approx((b[2] - a[2]) / 1e6, abs=6e-4)
        assert metrics[f"system/{n}/network_receive_megabytes"] == pytest.approx((b[3] - a[3]) / 1e6, abs=6e-4)


def test_a_provider_that_cannot_read_its_nodes_starts_no_sampler() -> None:
    logged: list = []
    sampler = NodeMetrics(lambda: None, lambda m, step: logged.append(m)).start()
    sampler.stop()
    assert logged == [] and sampler.steps == 0


def test_a_node_that_runs_nothing_has_no_cpu_or_memory_figure_but_its_bytes() -> None:
    """After the job ends its node's processes are gone: the last sample says what the link
    moved, and no zero CPU or memory that never was."""
    script = [{"node-0": NodeUsage(1.0, 10**8, 0, 0, 3)}, {"node-0": NodeUsage(0.0, 0, 5 * 10**6, 10**6, 0)}]
    times = iter([0.0, 2.0])
    sampler = NodeMetrics(lambda: script.pop(0), lambda m, step: None, interval_s=3600, clock=lambda: next(times))
    assert sampler.start().sample() == {"system/node-0/network_transmit_megabytes": 5.0,
                                        "system/node-0/network_receive_megabytes": 1.0}
