"""Every size bounded (issue 48): what a trigger or a spec asks for is planned within its bound
or refused at start in one line naming the field, with no traceback, no run directory and no
MLflow run, in a process whose address space is limited to 4 GB (tests/plan_probe.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import bounds, provider_options_model
from pipelines.spec import BenchSpec
from pipelines.spec.alarm import RegressionSpec
from pipelines.spec.sections import MicrobenchSpec, ProfileSpec, WhatIfSpec
from pipelines.spec.trigger import HOME_ROOT_ENV, SPEC_DIRS_ENV
from training.config import TrainConfig

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"


def probe(cases: list[dict[str, Any]], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, str(REPO / "tests" / "plan_probe.py")], input=json.dumps(cases),
                         capture_output=True, text=True, cwd=REPO, timeout=1200, check=False,
                         env={**_env(), **(env or {}), "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), out.stderr[-3000:]
    return results


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in (SPEC_DIRS_ENV, HOME_ROOT_ENV, "MLFLOW_TRACKING_URI")}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A deployment with a spec directory holding a netns and a slurm variant of the smoke spec."""
    tmp_path = tmp_path_factory.mktemp("deployment")
    specs = tmp_path / "specs"
    specs.mkdir()
    smoke = yaml.safe_load(SMOKE.read_text())
    for name, provider in (("netns", {"name": "netns", "options": {"nodes": 2}}), ("slurm", {"name": "slurm"})):
        (specs / f"{name}.yaml").write_text(yaml.safe_dump({**smoke, "provider": provider}))
    home = tmp_path / "homes" / "nightly"
    return {"specs": specs, "home": home,
            "env": {SPEC_DIRS_ENV: str(specs), HOME_ROOT_ENV: str(tmp_path / "homes"), "DDLBENCH_HOME": str(home)}}


SYNTHETIC = [{"model": "lenet5", "dataset": "synthetic"}]
# The issue's cases, as a trigger's overrides: (spec, overrides, the field the refusal names).
TRIGGERED = [
    ("slurm", {"provider.options.nodes": 10**9}, "provider.options.nodes"),
    ("smoke", {"provider.name": "slurm", "provider.options.nodes": 10**9}, "provider.name"),
    ("smoke", {"provider": {"name": "kubernetes"}}, "provider.name"),
    ("smoke", {"what_if.workers": [10**12]}, "what_if.workers"),
    ("netns", {"provider.options.nodes": 100000}, "provider.options.nodes"),
    ("smoke", {"workloads": SYNTHETIC, "train.synthetic_samples": 10**7}, "synthetic_samples"),
    ("smoke", {"workloads": [{**SYNTHETIC[0], "input_shape": [3, 20000, 20000]}]}, "input_shape"),
    ("smoke", {"steps": 10**12}, "steps"),
    ("smoke", {"steps": 10**8}, "steps"),  # within the bound, but no device finishes it in the timeout
    ("smoke", {"workers": [4096], "workloads": SYNTHETIC, "train.synthetic_samples": 4096 * 32}, "workers"),
]


def _issue_cases(deployment: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """The issue's cases as the probe's, each with the field its refusal names."""
    specs = {"smoke": str(SMOKE), "netns": str(deployment["specs"] / "netns.yaml"),
             "slurm": str(deployment["specs"] / "slurm.yaml")}
    cases = [(specs[s], o, f) for s, o, f in TRIGGERED]
    cases += [(str(SMOKE), None, "overrides.regression: nests deeper"),
              (str(SMOKE), [{"steps": 1}], "overrides: expected a mapping"),
              ("~/specs/smoke.yaml", {}, "spec_path: "),
              (str(SMOKE), {"repeats": 1}, "home: must not hold control characters")]
    homes = [str(deployment["home"])] * (len(cases) - 1) + [f"{deployment['home']}\u2028x"]
    return [({"spec": s, "overrides": o, "home": h, "trigger": True, "timed": True}
             | ({} if o is not None else {"nest": {"field": "regression", "depth": 990}}), field)
            for (s, o, field), h in zip(cases, homes, strict=True)]


def _power_cases(deployment: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """Every numeric field at 10^0 .. 10^18, as (field, k, the probe's case)."""
    specs = {"smoke": str(SMOKE), "netns": str(deployment["specs"] / "netns.yaml")}
    return [(f, k, {"spec": specs[spec], "overrides": o, "home": str(deployment["home"])})
            for f in numeric_fields() for k in range(19) for spec, o in [_overrides(f, 10**k)]]


EMPTY_HOME = [{"spec": str(SMOKE), "overrides": {"repeats": 1}, "home": "", "trigger": True}]


@pytest.fixture(scope="module")
def probed(deployment: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The module's planning cases in one probe process (each process imports torch and the
    pipeline, seconds), its results by the test they are for."""
    groups = {"issue": [c for c, _ in _issue_cases(deployment)], "empty home": EMPTY_HOME,
              "powers": [c for _, _, c in _power_cases(deployment)]}
    results = iter(probe([c for cases in groups.values() for c in cases], deployment["env"]))
    return {name: [next(results) for _ in cases] for name, cases in groups.items()}


def test_each_case_of_the_issue_is_refused_in_one_line_naming_its_field(
        deployment: dict[str, Any], probed: dict[str, list[dict[str, Any]]]) -> None:
    for (case, field), result in zip(_issue_cases(deployment), probed["issue"], strict=True):
        assert "refused" in result, (case, result)
        text = result["refused"]
        assert "\n" not in text and field in text and "Traceback" not in text, (case["overrides"], text)
        assert result["s"] < 2, (case["overrides"], result["s"])  # a check, not a run: milliseconds, torch warmed
    assert not deployment["home"].exists()  # no run directory, no MLflow store


def test_an_empty_home_is_the_default_home_as_start_uses_it(probed: dict[str, list[dict[str, Any]]]) -> None:
    assert probed["empty home"] == [{"accepted": True, "configs": 3}]


def test_ddlbench_run_refuses_in_one_line_without_a_traceback(tmp_path: Path) -> None:
    for args, field in ((["--set", "steps=1000000000000"], "steps"),
                        (["--set", "what_if.workers=[1000000000000]"], "what_if.workers"),
                        (["--set", "train.synthetic_samples=100000000", "--set",
                          'workloads=[{"model": "lenet5", "dataset": "synthetic"}]'], "synthetic_samples")):
        out = subprocess.run(["bash", "-c", 'ulimit -v 4194304 && exec "$@"', "-", sys.executable, "-m",
                              "pipelines.cli", "run", str(SMOKE), "--home", str(tmp_path / "home"), *args],
                             capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and field in lines[0], out.stderr
    assert not (tmp_path / "home").exists()


# --- every numeric field at 10^k --------------------------------------------------------------

def _numeric(model: type, prefix: str) -> list[str]:
    """The dotted names of a pydantic model's int and float fields (and lists of them)."""
    names = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = {a for a in typing.get_args(ann)} | {ann}
        inner = {typing.get_args(a)[0] for a in args if typing.get_origin(a) is list and typing.get_args(a)}
        plain = {typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in inner}
        if args & {int, float} - {bool} and bool not in args:
            names.append(f"{prefix}{name}")
        elif plain & {int, float}:
            names.append(f"{prefix}{name}[]")
    return names


def numeric_fields() -> list[str]:
    fields = _numeric(BenchSpec, "")
    for section, model in (("microbench", MicrobenchSpec), ("profile", ProfileSpec), ("what_if", WhatIfSpec),
                           ("regression", RegressionSpec)):
        fields += _numeric(model, f"{section}.")
    grid_set = {"workers", "servers", "batch_size", "steps", "epochs", "target_accuracy", "num_classes", "seed",
                "target_loss", "n_layer", "d_model", "n_head", "seq_len", "vocab_size"}
    fields += [f for f in _numeric(TrainConfig, "train.") if f.removeprefix("train.") not in grid_set]
    fields += _numeric(provider_options_model("netns"), "provider.options.")
    fields += ["workloads.num_classes", "workloads.input_shape"]
    return fields


def _overrides(field: str, value: int) -> tuple[str, dict[str, Any]]:
    """The spec and overrides that set `field` to `value` (netns options on the netns variant)."""
    if field.startswith("provider.options."):
        return "netns", {field: value}
    if field.startswith("workloads."):
        key = field.removeprefix("workloads.")
        return "smoke", {"workloads": [{**SYNTHETIC[0], key: [1, value, value] if key == "input_shape" else value}]}
    if field.endswith("[]"):
        return "smoke", {field[:-2]: [value]}
    if field == "epochs":
        return "smoke", {"epochs": value, "steps": None}
    return "smoke", {field: value}


def test_every_numeric_field_at_every_power_of_ten_plans_within_its_bound_or_is_refused(
        deployment: dict[str, Any], probed: dict[str, list[dict[str, Any]]]) -> None:
    fields = numeric_fields()
    assert {"steps", "workers[]", "what_if.workers[]", "train.synthetic_samples", "provider.options.nodes",
            "microbench.sizes[]", "profile.repeats", "train.keep_checkpoints", "train.threads",
            "train_timeout_s"} <= set(fields)
    accepted, wrong = 0, []
    for (field, k, _), result in zip(_power_cases(deployment), probed["powers"], strict=True):
        if "refused" in result:
            text, leaf = result["refused"], field.removesuffix("[]").rsplit(".", 1)[-1]
            if "\n" in text or leaf.removesuffix("s") not in text:
                wrong.append((field, k, text))
        elif "raised" in result:
            wrong.append((field, k, result["raised"]))
        else:
            accepted += 1
            assert result["configs"] <= 1024 * 100  # the grid's bound times repeats
    assert not wrong, "\n".join(map(str, wrong))
    assert accepted > len(fields)  # most fields take 10^0 .. 10^2: the test plans, it does not only refuse
    assert not deployment["home"].exists()


def test_the_bounds_follow_the_machine_where_they_can() -> None:
    assert bounds.ranks_per_host().limit == max(2, bounds.memory_bytes() // bounds.RANK_RESIDENT_BYTES)
    assert bounds.data_bytes().limit == bounds.memory_bytes() // 8


def test_the_docs_bounds_table_is_the_codes() -> None:
    doc = (REPO / "docs" / "security.md").read_text()
    table = doc.split("<!-- bounds -->")[1].split("<!-- /bounds -->")[0]
    rows = {cells[0].strip("` "): (cells[1].strip(), cells[2].strip())
            for line in table.splitlines() if line.startswith("| `") and (cells := line.strip("|").split("|"))}
    code = {name: b for name in dir(bounds) if isinstance(b := getattr(bounds, name), bounds.Bound)}
    assert set(rows) == set(code)
    for name, b in code.items():
        assert rows[name] == (f"{b.limit:,}" if isinstance(b.limit, int) else f"{b.limit:,.0f}", b.reason), name


def test_ddlbench_predict_bounds_its_world_sizes() -> None:
    from click.testing import CliRunner

    from pipelines.cli import cli

    grid = REPO / "tests" / "fixtures" / "grids" / "onehost"
    for sizes in ("1000000000000", ",".join(["2"] * 65)):
        result = CliRunner().invoke(cli, ["predict", "--layers", str(grid / "layers.json"), "--comm",
                                          str(grid / "comm.json"), "--algorithm", "ssgd", "--workers", sizes])
        assert result.exit_code == 2 and "'--workers': at most 64 sizes of at most 65,536" in result.output
