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
from modelling.network.wire import Wire

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


FABRIC = {"fab", "fabric"}


def _fabric_call(node: ast.AST) -> bool:
    """A call of one of the fabric's methods: `self.fab.ps(k, s, True)`, `fab.allreduce(...)`."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _names(n.func.value) & FABRIC
               for n in ast.walk(node))


def _assigned(target: ast.AST) -> set[str]:
    """The names an assignment binds: a name, an attribute's (`self.x`: x), a subscript's
    container (`self.x[k]`: x), each of a tuple's."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):
        return {target.attr}
    if isinstance(target, ast.Subscript | ast.Starred):
        return _assigned(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        return set().union(*(_assigned(e) for e in target.elts))
    return set()


def _pairs(target: ast.AST, value: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        return [pair for t, v in zip(target.elts, value.elts, strict=True) for pair in _pairs(t, v)]
    return [(target, value)]


def _fabric_answers(tree: ast.AST) -> set[str]:
    """The names that hold what the fabric answered: bound to a call of its methods, or to an
    expression of a name that holds one, to a fixed point."""
    held: set[str] = set()
    bindings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            bindings += [pair for target in node.targets for pair in _pairs(target, node.value)]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
            bindings.append((node.target, node.value))
    while True:
        more = {name for target, value in bindings if _fabric_call(value) or _names(value) & held
                for name in _assigned(target)} - held
        if not more:
            return held
        held |= more


def _branches_on_the_fabric(source: str) -> list[tuple[str, int]]:
    """The conditions of `source` that test the placement, the fabric or what it answered."""
    tree = ast.parse(source)
    answers = _fabric_answers(tree) | FABRIC | PLACEMENT_NAMES
    return [(ast.unparse(t), t.lineno) for t in _tests(tree) if _fabric_call(t) or _names(t) & answers]


@pytest.mark.parametrize("module", sorted(str(p.relative_to(MODELLING)) for p in MODELLING.rglob("*.py")))
def test_no_module_of_the_model_is_over_400_lines(module: str) -> None:
    assert len((MODELLING / module).read_text().splitlines()) <= 400


@pytest.mark.parametrize("module", BUILDERS)
def test_a_dag_builder_never_branches_on_the_placement_or_the_regime(module: str) -> None:
    """A builder asks the fabric and builds what it answers for every placement alike: no
    condition tests the placement, a fabric's answer, or a name that holds one."""
    assert _branches_on_the_fabric((MODELLING / module).read_text()) == []


@pytest.mark.parametrize("branch", [
    # The shapes the builders had before the fabric answered them (dag_ps.py's history).
    "lead = self.fab.pull_lead(s)\nif lead <= 0.0:\n    pass",
    "remote = self.fab.sharing(s)\nif len(remote) < 2:\n    return shard_pulls",
    "if self.fab.push_waits_for_own_pull(s):\n    pass",
    "c, post = self.c, self.fab.post_cpu_s()\nif post:\n    pass",
    "on_link = fab.reply_on_link(k, s)\nhere = on_link\nout = [a for a in b if here is None]",
    "x = 1 if fab.placed else 2",
])
def test_the_check_sees_a_branch_on_what_the_fabric_answered(branch: str) -> None:
    source = "def f(self, fab, s, k, b):\n" + "\n".join("    " + line for line in branch.splitlines())
    assert len(_branches_on_the_fabric(source)) == 1


def test_the_check_lets_a_builder_branch_on_its_own_inputs() -> None:
    source = ("def f(self, fab, c, t, counts):\n    one = fab.ps(0, 0, True)\n    x = one.wire_s\n"
              "    if c.straggle_s:\n        pass\n    return [k for k in range(len(self.mult)) if t < counts[k]]")
    assert _branches_on_the_fabric(source) == []


@pytest.mark.parametrize("module", BUILDERS)
def test_a_dag_builder_reads_no_transfer_cost_but_the_fabrics(module: str) -> None:
    """The wire's look-ups (a transfer's seconds, the measured regimes) are read in
    modelling/network/fabric.py alone: one place computes a transfer's cost."""
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
    assert readers == ["network/fabric.py"]


def test_a_worlds_costs_are_its_computation_and_its_wire() -> None:
    """Costs holds the tasks' compute times and the model's bytes; everything about where the
    bytes go and what moving them costs is the Wire's, so a new regime is a Wire field and a
    Fabric method, not a branch in a builder."""
    assert [f.name for f in dataclasses.fields(Costs)] == [
        "fwd", "bwd", "layer_bytes", "param_tensor_bytes", "data_s", "update_s", "pack_s", "unpack_s",
        "server_update_s", "server_apply_s", "straggle_s", "wire",
    ]
