"""Rank placement (infra/placement.py): hand-computed layouts, the torchrun agents that keep
the trainer's rank roles, and placements that cannot be satisfied."""

from __future__ import annotations

import pytest

from infra import ProviderError, get_provider
from infra.placement import Placement, PlacementError, place


def layout(p: Placement) -> list[tuple[int, str, int, int]]:
    return [(a.node, a.role, a.nproc, a.first_rank) for a in p.agents()]


@pytest.mark.parametrize(
    ("workers", "servers", "nodes", "policy", "node_of_rank", "agents"),
    [
        # colocated: workers spread evenly, shards round-robin over the worker nodes
        (2, 1, 2, "colocated", [0, 1, 0], [(0, "worker", 1, 0), (1, "worker", 1, 1), (0, "server", 1, 2)]),
        (2, 2, 2, "colocated", [0, 1, 0, 1],
         [(0, "worker", 1, 0), (1, "worker", 1, 1), (0, "server", 1, 2), (1, "server", 1, 3)]),
        (4, 1, 2, "colocated", [0, 0, 1, 1, 0], [(0, "worker", 2, 0), (1, "worker", 2, 2), (0, "server", 1, 4)]),
        (4, 2, 3, "colocated", [0, 0, 1, 2, 0, 1],
         [(0, "worker", 2, 0), (1, "worker", 1, 2), (2, "worker", 1, 3), (0, "server", 1, 4), (1, "server", 1, 5)]),
        # fewer workers than nodes: the spare node runs nothing
        (2, 1, 3, "colocated", [0, 1, 0], [(0, "worker", 1, 0), (1, "worker", 1, 1), (0, "server", 1, 2)]),
        # dedicated: the last node holds the shards, the others the workers
        (2, 1, 2, "dedicated", [0, 0, 1], [(0, "worker", 2, 0), (1, "server", 1, 2)]),
        (2, 2, 3, "dedicated", [0, 1, 2, 2], [(0, "worker", 1, 0), (1, "worker", 1, 1), (2, "server", 2, 2)]),
        # allreduce: no shards, the policy does not matter
        (2, 0, 2, "dedicated", [0, 1], [(0, "worker", 1, 0), (1, "worker", 1, 1)]),
    ],
)
def test_placement_by_hand(workers, servers, nodes, policy, node_of_rank, agents):
    p = place(workers, servers, nodes, policy)
    assert list(p.node_of_rank) == node_of_rank
    assert layout(p) == agents
    # the agents in order number every rank once, workers 0..N-1 then shards N..N+S-1
    assert [r for a in p.agents() for r in a.ranks] == list(range(workers + servers))
    assert all((a.role == "worker") == (a.first_rank < workers) for a in p.agents())
    assert p.nprocs() == [n for _, _, n, _ in agents]  # the launchers' --nprocs
    assert Placement.from_dict(p.as_dict()) == p


def test_devices_per_node_fill_nodes_in_order():
    p = place(3, 1, 2, "colocated", devices_per_node=2)
    assert list(p.node_of_rank) == [0, 0, 1, 0]
    assert p.as_dict() == {"policy": "colocated", "nodes": 2, "workers_per_node": [2, 1],
                           "servers_per_node": [1, 0], "node_of_rank": [0, 0, 1, 0]}
    assert p.describe() == "2 nodes, colocated: node0 w0 w1 s3, node1 w2"


def test_uniform_is_one_equal_agent_per_node():
    assert place(4, 0, 2).uniform
    assert not place(3, 0, 2).uniform
    assert not place(2, 2, 2).uniform  # two agents per node (workers, then shards)
    assert place(2, 2, 2, "dedicated").uniform  # node0 w0 w1, node1 s2 s3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 2, "servers": 1, "nodes": 1, "policy": "dedicated"},
         "provider.options.server_nodes: dedicated shards need 1 to 0 of the 1 nodes"),
        ({"workers": 2, "servers": 1, "nodes": 3, "policy": "dedicated", "server_nodes": 2},
         "provider.options.server_nodes: 2 dedicated server nodes for 1 shard(s) would leave a server node empty"),
        ({"workers": 5, "servers": 0, "nodes": 2, "devices_per_node": 2},
         "provider.options.devices_per_node: 5 workers exceed the 4 worker slots of 2 node(s) x 2 devices"),
        ({"workers": 2, "servers": 1, "nodes": 2, "policy": "spread"},
         "provider.options.placement: expected colocated or dedicated, got 'spread'"),
    ],
)
def test_impossible_placements_name_the_option(kwargs, message):
    workers, servers, nodes = kwargs.pop("workers"), kwargs.pop("servers"), kwargs.pop("nodes")
    with pytest.raises(PlacementError) as err:
        place(workers, servers, nodes, kwargs.pop("policy", "colocated"), **kwargs)
    assert message in str(err.value)


def test_a_provider_places_by_its_options():
    p = get_provider("netns", nodes=3, placement="dedicated", devices_per_node=1)
    assert list(p.place(2, 1).node_of_rank) == [0, 1, 2]
    with pytest.raises(ProviderError, match="devices_per_node: 3 workers exceed the 2 worker slots"):
        p.place(3, 1)
    assert list(get_provider("slurm", nodes=2, gpus_per_node=2).place(3, 0).node_of_rank) == [0, 0, 1]
    assert list(get_provider("local").place(2, 1).node_of_rank) == [0, 0, 0]
