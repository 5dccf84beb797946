"""The house's plan, kept by the suite (issue 52): the floors infra < training < modelling <
pipelines < dags, each importing only the floors below it, as import-linter contracts in
pyproject.toml."""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _floors() -> list[str]:
    """The floors, top first, as the layers contract lists them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c["layers"] for c in config["contracts"] if c["type"] == "layers" and "containers" not in c]
    return layers


def _lint(root: Path, config: Path = REPO / "pyproject.toml") -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(config), "--no-cache"], cwd=root, env=env,
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
    # The floors' contract alone: the packages' own contracts name sub-packages this tree lacks.
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    floors_only = [c for c in config["contracts"] if "containers" not in c]
    (tmp_path / "floors.toml").write_text(
        f"[tool.importlinter]\nroot_packages = {json.dumps(config['root_packages'])}\n\n"
        "[[tool.importlinter.contracts]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in floors_only[0].items()))
    done = _lint(tmp_path, tmp_path / "floors.toml")
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


PROJECT = ("infra", "training", "modelling", "pipelines", "dags")


def _function_imports(root: Path = REPO) -> dict[str, set[str]]:
    """Per file, the project modules it imports inside a function (`from pipelines import steps`
    names `pipelines`)."""
    found: dict[str, set[str]] = {}
    for floor in PROJECT:
        for path in sorted((root / floor).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        names = [node.module]
                    elif isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    else:
                        continue
                    for name in names:
                        if name.split(".")[0] in PROJECT:
                            found.setdefault(str(path.relative_to(root)), set()).add(name)
    return found


def test_a_function_imports_a_project_module_only_where_the_list_says_why() -> None:
    """Imports sit at a module's top, except the few tests/function_imports.toml lists with the
    start-up each keeps a heavy module out of: a new one fails here, and so does an entry gone."""
    listed = tomllib.loads((REPO / "tests" / "function_imports.toml").read_text())
    allowed = {f: set(mods) for f, mods in listed.items()}
    found = _function_imports()
    new = {f: sorted(m - allowed.get(f, set())) for f, m in found.items() if m - allowed.get(f, set())}
    gone = {f: sorted(m - found.get(f, set())) for f, m in allowed.items() if m - found.get(f, set())}
    assert new == {}, f"imports inside functions: move them to the module's top, or list them with why: {new}"
    assert gone == {}, f"listed in tests/function_imports.toml but no longer imported in a function: {gone}"


def test_the_function_import_check_sees_every_form(tmp_path: Path) -> None:
    """The check itself: imports of project modules in functions, methods and nested functions, in
    both forms, are found; a module-level one, a relative one and a library's are not."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "late.py").write_text(
        "import json\nfrom infra import bounds\n\n"
        "def a():\n    from training import gpt_shape\n    import json\n\n"
        "class B:\n    async def c(self):\n        def d():\n            import modelling.network.fit\n"
        "        from . import sibling\n")
    assert _function_imports(tmp_path) == {"pipelines/late.py": {"training", "modelling.network.fit"}}


def _shims_and_private_imports(root: Path = REPO) -> list[str]:
    """A module `__getattr__` (a shim that keeps an old name alive) and a private name imported
    from another project module, as `path: what`."""
    found = []
    for floor in PROJECT:
        for path in sorted((root / floor).rglob("*.py")):
            tree = ast.parse(path.read_text())
            where = str(path.relative_to(root))
            found += [f"{where}: module __getattr__" for node in tree.body
                      if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"]
            for node in ast.walk(tree):
                project = isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PROJECT
                if project and node.level == 0:
                    found += [f"{where}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_shim_and_no_private_name_crosses_a_module() -> None:
    assert _shims_and_private_imports() == []


def test_the_shim_check_sees_a_shim_and_a_private_import(tmp_path: Path) -> None:
    (tmp_path / "modelling").mkdir()
    (tmp_path / "modelling" / "old.py").write_text(
        "from modelling.predict import _decided, public\nfrom json import _default_decoder\n\n"
        "def __getattr__(name):\n    raise AttributeError(name)\n\n"
        "def f():\n    from pipelines.stages import _private\n")
    assert _shims_and_private_imports(tmp_path) == [
        "modelling/old.py: module __getattr__", "modelling/old.py: modelling.predict._decided",
        "modelling/old.py: pipelines.stages._private"]


def test_a_package_importing_up_its_packages_layers_breaks_their_contract(tmp_path: Path) -> None:
    """For each package's own contract (modelling: network over measure; pipelines: cli over
    stages over report and tracking over spec): a tree where every layer imports every layer
    above it, and report and tracking each other, is refused by name."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    packages = [c for c in config["contracts"] if "containers" in c]
    assert {c["containers"][0] for c in packages} == {"modelling", "pipelines"}
    expected = []
    for contract in packages:
        [container] = contract["containers"]
        layers = [[m.strip() for m in layer.split("|")] for layer in contract["layers"]]
        (tmp_path / container).mkdir()
        (tmp_path / container / "__init__.py").write_text("")
        for modules in layers:
            for m in modules:
                (tmp_path / container / m).mkdir()
                (tmp_path / container / m / "__init__.py").write_text("")
        for i, low in enumerate(layers):
            above = [m for layer in layers[:i] for m in layer] + [m for m in low if len(low) > 1]
            for m in low:
                ups = [u for u in above if u != m]
                (tmp_path / container / m / "up.py").write_text("".join(f"import {container}.{u}\n" for u in ups))
                expected += [f"{container}.{m} is not allowed to import {container}.{u}" for u in ups]
    floors = [c for c in config["contracts"] if "containers" not in c][0]["layers"]
    for name in set(floors) - {c["containers"][0] for c in packages}:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    done = _lint(tmp_path)
    assert done.returncode != 0, done.stdout
    assert len(expected) == 12  # measure 1; stages 1, report 3 (tracking beside it), tracking 3, spec 4
    missing = [line for line in expected if line not in done.stdout]
    assert missing == [], done.stdout[-3000:]


# Declared, and used without an import statement of the project's: why.
DECLARED_NOT_IMPORTED = {
    "scikit-learn": "the digits data set's files, found with find_spec (training/datasets.py)",
    "sqlalchemy": "pins the version MLflow and Airflow install together",
    "asyncpg": "Airflow 3's driver for PostgreSQL, which it opens itself",
    "psycopg2-binary": "the PostgreSQL driver of Airflow's and MLflow's stores",
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _third_party_imports() -> set[str]:
    """The top-level names of what the project's packages import from outside the standard
    library and the project, at the top or in a function."""
    floors = set(_floors())
    used = set()
    for floor in floors:
        for path in (REPO / floor).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                used |= {n.split(".")[0] for n in names} - floors - set(sys.stdlib_module_names) - {"__future__"}
    return used


def test_every_package_imported_is_declared_and_every_declared_one_used() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = {k: v for k, v in project["optional-dependencies"].items() if k != "dev"}
    declared = {_normal(re.split(r"[<>=!~\\[; ]", d)[0]) for d in
                [*project["dependencies"], *(d for ds in extras.values() for d in ds)]}
    providers = packages_distributions()
    # A meta-distribution (apache-airflow) installs no module of its own: it stands for what it
    # requires, and is used where one of those is.
    own = {_normal(d) for ds in providers.values() for d in ds}
    stands_for = {meta: {_normal(re.split(r"[<>=!~\\[; (]", r)[0]) for r in requires(meta) or []
                         if "extra ==" not in r} for meta in declared - own}
    covered = declared.union(*stands_for.values())
    used = _third_party_imports()
    undeclared = {top: providers.get(top) for top in used
                  if not {_normal(d) for d in providers.get(top, [])} & covered}
    assert undeclared == {}, "imported, not declared in pyproject.toml"
    imported = {_normal(d) for top in used for d in providers.get(top, [])}
    imported |= {meta for meta, reqs in stands_for.items() if reqs & imported}
    assert declared - imported - set(DECLARED_NOT_IMPORTED) == set(), "declared, imported nowhere"
