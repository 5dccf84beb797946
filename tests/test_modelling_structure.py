"""The model core's structure (docs/model-core.md): a placement or a link rate the model has
never seen goes through the same code as the tested ones, because only the fabric knows where
a transfer runs and what it costs. These checks read the source, so a builder that grows an
`if` on the placement fails here, not on the first cluster nobody tested."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from modelling.dag import Costs
from modelling.fabric import Wire

MODELLING = Path(__file__).resolve().parents[1] / "modelling"
BUILDERS = ("dag.py", "dag_ps.py")
# What tells where ranks run or how their bytes move: the fabric's to ask, never a builder's.
PLACEMENT_NAMES = {"placed", "node_of_rank", "link_class", "class_node", "shard_node", "multi_node", "on_cpu",
                   "comm_on_cpu", "wire", "w"}


def _names(node: ast.AST) -> set[str]:
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _tests(tree: ast.AST) -> list[ast.AST]:
    """Every condition in a module: if, while, conditional expressions, comprehension filters,
    match subjects."""
    out: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            out.append(node.test)
        elif isinstance(node, ast.comprehension):
            out.extend(node.ifs)
        elif isinstance(node, ast.Match):
            out.append(node.subject)
    return out


@pytest.mark.parametrize("module", sorted(str(p.relative_to(MODELLING)) for p in MODELLING.rglob("*.py")))
def test_no_module_of_the_model_is_over_400_lines(module: str) -> None:
    assert len((MODELLING / module).read_text().splitlines()) <= 400


@pytest.mark.parametrize("module", BUILDERS)
def test_a_dag_builder_never_branches_on_the_placement_or_the_regime(module: str) -> None:
    tree = ast.parse((MODELLING / module).read_text())
    branching = [(ast.unparse(t), t.lineno) for t in _tests(tree) if _names(t) & PLACEMENT_NAMES]
    assert branching == []


@pytest.mark.parametrize("module", BUILDERS)
def test_a_dag_builder_reads_no_transfer_cost_but_the_fabrics(module: str) -> None:
    """The wire's look-ups (a transfer's seconds, the measured regimes) are read in
    modelling/fabric.py alone: one place computes a transfer's cost."""
    tree = ast.parse((MODELLING / module).read_text())
    wire_fields = {f.name for f in dataclasses.fields(Wire)}
    read = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & (wire_fields | {"wire"}))
    assert read == []


def test_only_the_fabric_reads_the_wire() -> None:
    readers = sorted(
        str(p.relative_to(MODELLING))
        for p in MODELLING.rglob("*.py")
        if any(isinstance(n, ast.Attribute) and n.attr == "wire" for n in ast.walk(ast.parse(p.read_text())))
    )
    assert readers == ["fabric.py"]


def test_a_worlds_costs_are_its_computation_and_its_wire() -> None:
    """Costs holds the tasks' compute times and the model's bytes; everything about where the
    bytes go and what moving them costs is the Wire's, so a new regime is a Wire field and a
    Fabric method, not a branch in a builder."""
    assert [f.name for f in dataclasses.fields(Costs)] == [
        "fwd", "bwd", "layer_bytes", "param_tensor_bytes", "data_s", "update_s", "pack_s", "unpack_s",
        "server_update_s", "server_apply_s", "straggle_s", "wire",
    ]
