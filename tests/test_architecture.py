"""The house's plan, kept by the suite (issue 52): the floors infra < training < modelling <
pipelines < dags, each importing only the floors below it, as import-linter contracts in
pyproject.toml."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _floors() -> list[str]:
    """The floors, top first, as the layers contract lists them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    return layers


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(REPO / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_floors_are_the_projects_packages_bottom_to_top() -> None:
    assert _floors() == ["dags", "pipelines", "modelling", "training", "infra"]


def test_every_import_of_the_project_keeps_to_its_floor() -> None:
    done = _lint(REPO)
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_an_import_up_a_floor_breaks_the_contract(tmp_path: Path) -> None:
    """A tree of the five packages where each floor imports every floor above it, inside a
    function as well as at the top: the contract names every one of them."""
    floors = _floors()
    for name in floors:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
        (tmp_path / name / "leaf.py").write_text("")
    pairs = [(low, high) for high, low in itertools.combinations(floors, 2)]  # low below high
    for i, (low, high) in enumerate(pairs):
        body = f"import {high}.leaf\n" if i % 2 else f"def late():\n    from {high} import leaf\n"
        (tmp_path / low / f"up_{i}.py").write_text(body)
    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout
    for low, high in pairs:
        assert f"{low} is not allowed to import {high}" in done.stdout, (low, high, done.stdout[-3000:])


# What issue 52 has yet to take apart: the suite fails on any new one, and on one of these gone
# (so the list shrinks as the house does).
KNOWN_CIRCLES: list[set[str]] = []
CROWDED: set[str] = set()  # folders of more than 15 modules and no sub-package yet
MOST_MODULES = 15


def _circles() -> list[set[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan's). An
    import for the type checker alone runs never, so it closes no circle."""
    import grimp

    graph = grimp.build_graph("infra", "training", "modelling", "pipelines", "dags", cache_dir=None,
                              exclude_type_checking_imports=True)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while (w := stack.pop()) != v:
                part.add(w)
            if part:
                out.append(part | {v})

    for m in sorted(edges):
        if m not in index:
            visit(m)
    return out


def test_no_new_import_circle_between_files() -> None:
    found = _circles()
    assert [c for c in found if c not in KNOWN_CIRCLES] == [], "a new import circle"
    assert [c for c in KNOWN_CIRCLES if c not in found] == [], "a known circle is gone: take it off the list"


def test_no_folder_is_crowded_without_sub_packages() -> None:
    crowded = set()
    for floor in ("infra", "training", "modelling", "pipelines", "dags"):
        for folder in [REPO / floor, *(p.parent for p in (REPO / floor).rglob("__init__.py"))]:
            if len(list(folder.glob("*.py"))) - 1 > MOST_MODULES:  # the __init__ is no module of its own
                crowded.add(str(folder.relative_to(REPO)))
    assert crowded == CROWDED, "a folder of more than 15 modules, or one of CROWDED split: update the list"
