"""The benchmark spec: shipped specs load, malformed ones fail naming the field and value."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pipelines.spec import SpecError, flatten, grid, load_spec, parse_rate, validate_spec

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
NIGHTLY = REPO / "specs" / "nightly-cpu.yaml"


def _smoke() -> dict:
    return yaml.safe_load(SMOKE.read_text())


def test_shipped_specs_load_and_expand_to_their_grids() -> None:
    smoke = load_spec(SMOKE)
    keys = [e["key"] for e in grid(smoke)]
    assert keys == ["lenet5-ssgd-allreduce-w2-b32-r0", "lenet5-odsgd-ps-w2-b32-r0", "lenet5-asgd-ps-w2-b32-r0"]
    first = grid(smoke)[0]["config"]
    assert (first["workers"], first["servers"], first["comm"], first["steps"]) == (2, 0, "allreduce", smoke.steps)
    assert grid(smoke)[1]["config"]["servers"] == 1
    nightly = load_spec(NIGHTLY)
    entries = grid(nightly)
    # 3 workloads x 5 algorithms x 2 world sizes x 3 repeats, and a 1-worker SSGD baseline per
    # workload x 3 repeats (workers lists two sizes: the spec asks for scaling); keys unique
    assert len(entries) == 99 == len({e["key"] for e in entries})
    baseline = [e for e in entries if e["config"]["workers"] == 1]
    assert [e["key"] for e in baseline] == [
        f"{m}-ssgd-allreduce-w1-b32-r{i}" for m in ("mlp", "resnet20", "gpt-mini-T32")
        for i in range(3)
    ]
    assert {(e["config"]["comm"], e["config"]["servers"], e["config"]["overlap"]) for e in baseline} == {
        ("allreduce", 0, True)
    }
    assert "resnet20-odsgd-ps-v1-w4-b32-r2" in {e["key"] for e in entries}
    assert {e["config"]["seed"] for e in entries} == {0, 1, 2}
    assert nightly.experiment == "ddlbench-nightly"


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "specs").rglob("*.yaml")))
def test_every_checked_in_spec_loads(path: str) -> None:
    assert grid(load_spec(REPO / path))


def test_the_demo_runs_every_algorithm_on_the_gpt_to_a_target_loss() -> None:
    """What scripts/main.sh runs by default: every update algorithm, judged by a loss it reaches
    (the spec's comment gives the seeds behind the target)."""
    assert 'specs/demo.yaml' in (REPO / "scripts" / "main.sh").read_text()
    demo = load_spec(REPO / "specs" / "demo.yaml")
    configs = [e["config"] for e in grid(demo)]
    assert {(c["algorithm"], c["comm"]) for c in configs} == {
        ("ssgd", "allreduce"), ("ssgd", "ps"), ("odsgd", "ps"), ("asgd", "ps")
    }
    assert {(c["model"], c["target_loss"], c["target_accuracy"]) for c in configs} == {("gpt-mini", 2.7, None)}


def test_the_one_worker_baseline_is_added_when_the_spec_asks_for_scaling() -> None:
    smoke = load_spec(SMOKE)  # one world size and no `scaling`: no baseline
    assert all(e["config"]["workers"] == 2 for e in grid(smoke))
    keys = [e["key"] for e in grid(load_spec(SMOKE, {"scaling": True, "repeats": 2}))]
    assert keys[-2:] == ["lenet5-ssgd-allreduce-w1-b32-r0", "lenet5-ssgd-allreduce-w1-b32-r1"]
    # no SSGD over allreduce in the grid: a plain one is the baseline
    asgd = grid(load_spec(SMOKE, {"scaling": True, "algorithms": [{"name": "asgd"}]}))
    assert [(e["key"], e["config"]["algorithm"]) for e in asgd] == [
        ("lenet5-asgd-ps-w2-b32-r0", "asgd"),
        ("lenet5-ssgd-allreduce-w1-b32-r0", "ssgd"),
    ]
    # 1 worker already in the grid, or scaling turned off: nothing added
    assert len(grid(load_spec(SMOKE, {"workers": [1, 2]}))) == 6
    assert len(grid(load_spec(SMOKE, {"workers": [2, 3], "scaling": False}))) == 6


def test_spec_hash_is_stable_and_follows_content() -> None:
    a, b = load_spec(SMOKE), load_spec(SMOKE)
    assert a.spec_hash() == b.spec_hash()
    assert load_spec(SMOKE, {"repeats": 2}).spec_hash() != a.spec_hash()


def test_overrides_merge_dotted_keys_and_sections() -> None:
    spec = load_spec(SMOKE, {"regression.min_effect": 0.3, "train": {"lr": 0.2}, "workers": [2, 3]})
    assert spec.regression.min_effect == 0.3
    assert spec.regression.prediction_error_rise == _smoke()["regression"]["prediction_error_rise"]
    assert spec.train["lr"] == 0.2 and spec.train["eval_every"] == _smoke()["train"]["eval_every"]
    assert spec.workers == [2, 3]


def test_rates_and_flatten() -> None:
    assert parse_rate("1gbit") == 1e9 / 8
    assert parse_rate("125mb") == 125e6
    flat = flatten({"a": {"b": [1, 2]}, "c": [{"d": 1}]}, "spec.")
    assert flat == {"spec.a.b": "[1, 2]", "spec.c.0.d": "1"}


def _set(values: dict, dotted: str, value: object) -> dict:
    out = copy.deepcopy(values)
    node = out
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(leaf)] = value
    elif value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return out


class _Deleted:
    """The field removed from the spec (a stable repr keeps the test ids the same in every process)."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETE = _Deleted()

# (change to the smoke spec, text the error must contain: the field and the bad value)
MALFORMED = [
    ("workers", [0], ["workers", "[0]"]),
    ("workers", [], ["workers"]),
    ("workers", [2, 2], ["workers", "distinct"]),
    ("batch_sizes", [-1], ["batch_sizes", "-1"]),
    ("repeats", 0, ["repeats", "0"]),
    ("servers", 0, ["servers", "0"]),
    ("steps", -5, ["steps", "-5"]),
    ("steps", _DELETE, ["steps/epochs"]),
    ("suite", "weekly", ["suite", "weekly"]),
    ("hardware", "gpu cluster/1", ["hardware", "gpu cluster/1"]),
    ("name", "", ["name"]),
    ("version", 2, ["version", "2"]),
    ("algorithms.0.name", "hogwild", ["algorithms.0.name", "hogwild"]),
    ("algorithms.1.comm", "allreduce", ["algorithms.1", "comm", "allreduce"]),
    ("algorithms.0.options", {"lr_locall": 0.1}, ["spec.algorithms[0]", "lr_locall"]),
    ("algorithms.0.options", {"workers": 4}, ["algorithms.0", "options", "workers"]),
    ("train", {"momentum": 1.5}, ["spec.train", "momentum", "1.5"]),
    ("train", {"batch_size": 8}, ["train", "batch_size"]),
    ("target_accuracy", 1.5, ["target_accuracy", "1.5"]),
    ("network", {"link_bandwidth": "fast"}, ["network.link_bandwidth", "fast"]),
    ("what_if", {"workers": [0, 4]}, ["what_if.workers", "[0, 4]"]),
    ("regression", {"min_effect": 2}, ["regression.min_effect", "2"]),
    ("regression", {"throughput_drop": 0.1}, ["regression", "throughput_drop: renamed min_effect"]),
    ("microbench", {"sizes": [0, 4096]}, ["microbench.sizes", "[0, 4096]"]),
    ("workloads", [{"model": "lenet5"}], ["workloads.0.dataset", "required"]),
    ("workloads", [{"model": "lenet5", "dataset": "digits", "colour": True}], ["workloads.0.colour"]),
    ("provider", {"name": "local", "flavour": "x"}, ["provider.flavour"]),
    ("unknown_field", 1, ["unknown_field"]),
    ("train_timeout_s", "soon", ["train_timeout_s", "soon"]),
]


@pytest.mark.parametrize(("path", "value", "expected"), MALFORMED, ids=[f"{p}={v!r}"[:40] for p, v, _ in MALFORMED])
def test_malformed_spec_is_rejected_naming_field_and_value(path: str, value: object, expected: list[str]) -> None:
    bad = _set(_smoke(), path, value) if "." in path or path in _smoke() else {**_smoke(), path: value}
    with pytest.raises(SpecError) as err:
        validate_spec(bad, "smoke.yaml")
    for text in expected:
        assert text in str(err.value), f"{text!r} not in: {err.value}"


def test_spec_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("workers: [2\n")
    with pytest.raises(SpecError, match="broken.yaml: not valid YAML"):
        load_spec(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="list.yaml: not a ddlbench spec: expected a YAML mapping of spec fields"):
        load_spec(listing)


def test_override_into_a_non_section_is_an_error() -> None:
    with pytest.raises(SpecError, match=r"overrides\.repeats\.x"):
        load_spec(SMOKE, {"repeats.x": 1})
