"""Injected slowdowns per component class (training/inject.py, `train.inject_where`): the injected
time shows in the phase or layer it names and nowhere else, in one process and in a real job; a
layer the model does not have is refused before any process starts; a delay of 0 installs nothing.

Timings are compared as medians of an injected run against an uninjected run of the same
config: the slowed component rises by at least half the delay, every other by less, which
holds on a loaded 2-core host where tighter bounds would not."""

from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipelines.launch import prepare
from pipelines.spec import INJECTED_OPTIONS
from training import inject
from training.config import INJECT_CLASSES, ConfigError, build_config
from training.measure.layer_timing import EVERY_ENV, INSITU_FILE
from training.measure.timeline import Timeline, read_jsonl
from training.models import build_model
from training.trainer import Trainer

from .trainjobs import run_job

# A small MLP at 1x16x16: a few milliseconds an iteration on one thread.
SMALL = {"model": "mlp", "dataset": "synthetic", "input_shape": [1, 16, 16], "synthetic_samples": 256,
         "batch_size": 16, "workers": 1, "measure_warmup": 2, "threads": 1}
SMALL_LAYERS = ("1", "3", "5", "7")  # its Linear layers
PHASES = ("data", "forward", "backward", "update")


def _span(rec: dict[str, Any], phase: str) -> float:
    s = rec["phases"].get(phase)
    return s[1] - s[0] if s else 0.0


def _train_in_process(out: Path, steps: int, **options: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One worker trained in this process, as a rank does (one worker needs no process group):
    its timeline's measured records and its in-situ layer table."""
    cfg = build_config({**SMALL, "steps": steps, **options})
    torch.set_num_threads(1)
    tl = Timeline(0, "worker", time.monotonic())
    Trainer(cfg, 0, tl, torch.device("cpu"), None, None, out).run(steps, 0, lambda _t: None)
    return tl.records[cfg.measure_warmup:], json.loads((out / INSITU_FILE).read_text())


def _rise_by_phase(slow: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, float]:
    return {p: statistics.median(_span(r, p) for r in slow) - statistics.median(_span(r, p) for r in base)
            for p in PHASES}


def _layer_seconds(table: dict[str, Any]) -> dict[str, float]:
    return {r["name"]: r["fwd_s"] + r["bwd_s"] for r in table["layers"]}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(kind="data", layer="1", delay_ms=16.0, busy=False)
@example(kind="compute", layer="1", delay_ms=16.0, busy=False)
@example(kind="update", layer="1", delay_ms=16.0, busy=False)
@example(kind="layer", layer="5", delay_ms=16.0, busy=False)
@given(kind=st.sampled_from(["data", "compute", "update", "layer"]), layer=st.sampled_from(SMALL_LAYERS),
       delay_ms=st.floats(12.0, 24.0), busy=st.booleans())
def test_the_injected_time_shows_in_the_component_it_names_and_nowhere_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, layer: str, delay_ms: float, busy: bool) -> None:
    """Against an uninjected run of the same config: the slowed phase (forward and backward
    together for compute and a layer) rises by at least half the delay, each other phase by less;
    compute slows both passes; a layer's injection shows in that layer's row of the in-situ table
    and in no other."""
    monkeypatch.setenv(EVERY_ENV, "1")
    where = f"layer:{layer}" if kind == "layer" else kind
    (tmp_path / "base").mkdir(exist_ok=True)
    (tmp_path / "slow").mkdir(exist_ok=True)
    base, base_table = _train_in_process(tmp_path / "base", 10, inject_where=where)
    slow, slow_table = _train_in_process(tmp_path / "slow", 10, inject_where=where, inject_delay_ms=delay_ms,
                                         inject_busy=busy)
    rise = _rise_by_phase(slow, base)
    half = delay_ms / 2e3
    slowed = {"data": ("data",), "update": ("update",)}.get(kind, ("forward", "backward"))
    assert sum(rise[p] for p in slowed) >= half, (where, rise)
    assert all(rise[p] < half for p in PHASES if p not in slowed), (where, rise)
    if kind == "compute":  # spread as the passes' times are: both rise
        assert rise["forward"] >= 0.1 * delay_ms / 1e3 and rise["backward"] >= 0.1 * delay_ms / 1e3, rise
    layers = {n: s - _layer_seconds(base_table)[n] for n, s in _layer_seconds(slow_table).items()}
    if kind == "layer":
        assert layers[layer] >= half, layers
        assert all(r < half for n, r in layers.items() if n != layer), layers
    elif kind != "compute":
        assert all(r < half for r in layers.values()), (where, layers)


def test_no_delay_installs_nothing(tmp_path: Path) -> None:
    """inject_delay_ms 0 leaves the model without hooks and the timeline without slowdowns, wherever
    inject_where points; a delay of compute hooks every leaf module, of a layer that module."""
    def hooked(**options: Any) -> tuple[Trainer, list[str]]:
        cfg = build_config({**SMALL, "steps": 1, **options})
        trainer = Trainer(cfg, 0, Timeline(0, "worker", time.monotonic()), torch.device("cpu"), None, None, tmp_path)
        return trainer, [n for n, m in trainer.net.named_modules() if m._forward_hooks or m._forward_pre_hooks]

    for where in (*INJECT_CLASSES, "layer:3"):
        trainer, names = hooked(inject_where=where)
        assert names == [] and trainer.timeline.slowdowns == {}, where
    _, names = hooked(inject_where="compute", inject_delay_ms=5)
    assert names == [n for n, m in build_model("mlp", (1, 16, 16), 10).named_modules() if not list(m.children())]
    _, names = hooked(inject_where="layer:3", inject_delay_ms=5)
    assert names == ["3"]
    trainer, names = hooked(inject_where="update", inject_delay_ms=5)
    assert names == [] and list(trainer.timeline.slowdowns) == ["update"]


@pytest.mark.parametrize("where", ["layer", "layer:", "layer:features..3", "Compute", "forward", "layer: 3"])
def test_a_malformed_inject_where_is_refused_naming_it(where: str) -> None:
    with pytest.raises(ConfigError, match=r"config\.inject_where: expected data, compute, update or layer:"):
        build_config({"steps": 1, "inject_where": where})


def test_an_unknown_layer_is_refused_before_any_process_naming_inject_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preflight builds the model on the meta device and names modules that exist; the
    launcher is never reached. A rank whose model is built for real refuses the same way."""
    def no_launch(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr("tests.trainjobs.launch", no_launch)
    with pytest.raises(ConfigError, match=r"test\.inject_where: lenet5 has no module 'features\.3'; its modules "
                                          r"include 0, 1, 2, .*\(a name of model\.named_modules\(\)\)"):
        run_job(tmp_path, steps=2, inject_where="layer:features.3")
    with pytest.raises(ConfigError, match=r"test\.inject_where: resnet20 has no module '4\.conv3'; its modules "
                                          r"include 4\.conv2, 4\.conv1, "):
        run_job(tmp_path, model="resnet20", dataset="synthetic", steps=2, inject_where="layer:4.conv3")
    assert not list(tmp_path.iterdir())
    cfg = build_config({"model": "lenet5", "steps": 1, "inject_where": "layer:12", "inject_delay_ms": 1})
    with pytest.raises(ValueError, match=r"^inject_where: lenet5 has no module '12'"):
        inject.install(cfg, build_model("lenet5", (1, 28, 28), 10), Timeline(0, "worker", 0.0))
    assert prepare({"steps": 1, "inject_where": "layer:3"}).inject_where == "layer:3"


def test_inject_where_is_an_injected_option() -> None:
    """Left out of the spec hash, so an injected run is judged against its spec's history."""
    assert "inject_where" in INJECTED_OPTIONS


@pytest.mark.slow
@pytest.mark.alone  # a layer's measured time
def test_a_layer_injection_in_a_real_job_grows_that_layer_in_the_insitu_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers (DDP) of mobilenet_v3_small at 3x32x32, a parameter-owning layer drawn by a
    seeded RNG slowed by about 20% of the uninjected iteration: in layers_insitu.json that layer's
    time grows by at least half the delay, every other layer's by less."""
    monkeypatch.setenv(EVERY_ENV, "2")
    options = {"model": "mobilenet_v3_small", "dataset": "synthetic", "input_shape": [3, 32, 32],
               "num_classes": 10, "synthetic_samples": 512, "batch_size": 8, "workers": 2, "steps": 24,
               "measure_warmup": 4, "threads": 1}
    net = build_model("mobilenet_v3_small", (3, 32, 32), 10)
    owners = [n for n, m in net.named_modules() if any(True for _ in m.parameters(recurse=False))]
    layer = random.Random(47).choice(owners)
    base_dir, slow_dir = tmp_path / "base", tmp_path / "slow"
    run_job(base_dir, inject_where=f"layer:{layer}", **options)
    mine = [r for r in read_jsonl(base_dir / "timeline.jsonl") if r["rank"] == 0 and r["step"] >= 4]
    delay_ms = 0.2 * 1e3 * statistics.median(r["end"] - r["start"] for r in mine)
    run_job(slow_dir, inject_where=f"layer:{layer}", inject_delay_ms=delay_ms, **options)
    base = _layer_seconds(json.loads((base_dir / INSITU_FILE).read_text()))
    slow = _layer_seconds(json.loads((slow_dir / INSITU_FILE).read_text()))
    rise = {n: slow[n] - base[n] for n in base}
    half = delay_ms / 2e3
    assert rise[layer] >= half, (layer, delay_ms, rise)
    assert all(r < half for n, r in rise.items() if n != layer), (layer, delay_ms, rise)

