"""The comparison: medians over repeats, scaling efficiency, the best algorithm per config (the
regression check is in test_pipeline_regression.py)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from pipelines.report.console import (
    comparison_table,
    comparison_tables,
    fmt,
    fmt_scaling,
    fmt_spread,
    fmt_time_to_target,
    language_model_table,
)
from pipelines.report.plots import figures, plot_names
from pipelines.report.tables import best_per_config, comparison

REPO = Path(__file__).resolve().parent.parent
PHASES = {"data": 0.001, "forward": 0.002, "backward": 0.004, "comm_exposed": 0.003, "update": 0.001}


def _run(
    algo: str,
    workers: int,
    thr: float,
    repeat: int,
    tta: float | None = None,
    acc: float = 0.9,
    model: str = "m",
    variant: str = "",
    curve: list[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """A finished run as collect_runs gives it; a target of 0.5 reached when `tta` is given."""
    summary = {
        "throughput_samples_per_s": thr,
        "iter_time_s": {"p50": 64 / thr},
        "final_accuracy": acc,
        "time_to_accuracy_s": tta,
        "steps_to_accuracy": None if tta is None else int(tta * 10),
        "target_reached": tta is not None,
        "target_accuracy": 0.5,
        "steps": 60,
        "train_time_s": 10.0,
        "breakdown_s": PHASES,
    }
    return {
        "key": f"{model}-{algo}{variant}-w{workers}-b32-r{repeat}",
        "algorithm": algo,
        "model": model,
        "dataset": "digits",
        "workers": workers,
        "batch_size": 32,
        "config": f"{model}-{algo}{variant}-w{workers}-b32",
        "summary": summary,
        "loss_curve": [],
        "accuracy_curve": curve or [],
    }


def _table(values: dict[tuple[str, int], list[float]]) -> list[dict[str, Any]]:
    return comparison([_run(a, w, t, i) for (a, w), ts in values.items() for i, t in enumerate(ts)])


def test_comparison_takes_medians_and_scales_against_the_measured_one_worker_run() -> None:
    table = {
        r["config"]: r
        for r in _table(
            {
                ("ssgd-allreduce", 1): [60, 55, 70],
                ("ssgd-allreduce", 2): [100, 90, 300],
                ("ssgd-allreduce", 4): [150, 160, 140],
                ("asgd-ps", 4): [180, 200, 170],
            }
        )
    }
    one, two, four = (table[f"m-ssgd-allreduce-w{n}-b32"] for n in (1, 2, 4))
    assert (two["throughput_median"], two["throughput_min"], two["throughput_max"]) == (100, 90, 300)
    assert {r["scaling_baseline"] for r in table.values()} == {"m-ssgd-allreduce-w1-b32"}
    assert one["scaling_efficiency"] == 1.0
    assert two["scaling_efficiency"] == pytest.approx(100 / (2 * 60))
    assert four["scaling_efficiency"] == pytest.approx(150 / (4 * 60))
    # ASGD has no 1-worker run of its own: it scales against the SSGD one
    assert table["m-asgd-ps-w4-b32"]["scaling_efficiency"] == pytest.approx(180 / (4 * 60))


def test_without_a_one_worker_run_there_is_no_scaling_efficiency() -> None:
    table = _table({("ssgd-allreduce", 2): [100], ("ssgd-allreduce", 4): [150]})
    assert [(r["scaling_efficiency"], r["scaling_baseline"]) for r in table] == [(None, None), (None, None)]
    assert [fmt_scaling(r) for r in table] == ["no 1-worker baseline"] * 2
    # a 1-worker run of another model or batch is not a baseline
    table = comparison([_run("ssgd-allreduce", 2, 100, 0), _run("ssgd-allreduce", 1, 60, 0, model="other")])
    assert {r["config"]: r["scaling_efficiency"] for r in table} == {
        "m-ssgd-allreduce-w2-b32": None,
        "other-ssgd-allreduce-w1-b32": 1.0,
    }


def test_accuracy_and_time_to_target_are_medians_with_spread_over_repeats() -> None:
    runs = [
        _run("odsgd-ps", 2, 100, 0, tta=4.0, acc=0.61),
        _run("odsgd-ps", 2, 110, 1, tta=6.0, acc=0.55),
        _run("odsgd-ps", 2, 105, 2, tta=None, acc=0.42),
        _run("asgd-ps", 2, 120, 0, tta=None, acc=0.31),
        _run("asgd-ps", 2, 120, 1, tta=None, acc=0.35),
        _run("asgd-ps", 2, 120, 2, tta=9.0, acc=0.52),
    ]
    table = {r["algorithm"]: r for r in comparison(runs)}
    od, asgd = table["odsgd-ps"], table["asgd-ps"]
    assert (od["final_accuracy_median"], od["final_accuracy_min"], od["final_accuracy_max"]) == (0.55, 0.42, 0.61)
    # the repeat that never reached the target counts as infinitely late
    assert (od["time_to_accuracy_median_s"], od["time_to_accuracy_min_s"], od["time_to_accuracy_max_s"]) == (
        6.0,
        4.0,
        None,
    )
    assert (od["steps_to_accuracy_median"], od["target_reached_repeats"], od["steps_median"]) == (60, 2, 60)
    assert fmt_time_to_target(od) == "6 s [4, not reached], 60 steps"
    assert asgd["time_to_accuracy_median_s"] is None and asgd["target_reached_repeats"] == 1
    assert fmt_time_to_target(asgd) == "not reached in 60 steps (1 of 3 repeats did)"
    never = comparison([_run("asgd-ps", 2, 120, 0)])[0]
    assert fmt_time_to_target(never) == "not reached in 60 steps"
    assert fmt_spread(od["final_accuracy_median"], od["final_accuracy_min"], od["final_accuracy_max"], 3) == (
        "0.55 [0.42, 0.61]"
    )


def test_old_summaries_without_the_new_keys_still_render() -> None:
    run = _run("ssgd-allreduce", 2, 100, 0, tta=3.0)
    for key in ("steps_to_accuracy", "target_reached", "steps"):
        del run["summary"][key]
    row = comparison([run])[0]
    assert (row["time_to_accuracy_median_s"], row["target_reached_repeats"], row["steps_to_accuracy_median"]) == (
        3.0,
        1,
        None,
    )
    assert fmt_time_to_target(row) == "3 s"


def test_best_algorithm_per_config_and_first_to_target() -> None:
    runs = [
        _run("ssgd-allreduce", 2, 100, 0, tta=5.0),
        _run("odsgd-ps", 2, 120, 0, tta=6.0),
        _run("asgd-ps", 2, 130, 0, tta=None),
    ]
    best = best_per_config(comparison(runs))
    assert best == {
        "m-w2-b32": {
            "fastest": "asgd-ps",
            "throughput_samples_per_s": 130,
            "first_to_target": "ssgd-allreduce",
            "fastest_config": "m-asgd-ps-w2-b32",
            "first_to_target_config": "m-ssgd-allreduce-w2-b32",
        }
    }


def _nightly_table() -> list[dict[str, Any]]:
    """Every config of specs/nightly-cpu.yaml (three repeats, plus its 1-worker baselines), with
    fixed figures: OD-SGD with delay compensation the fastest of each group, SSGD over allreduce
    the first to the target."""
    from pipelines.spec import grid, load_spec

    runs = []
    for i, e in enumerate(grid(load_spec(REPO / "specs" / "nightly-cpu.yaml"))):
        c = e["config"]
        algo = f"{c['algorithm']}-{c['comm']}"
        fast = c.get("compensation") == "dc"
        tta = 12.5 + e["repeat"] if algo == "ssgd-allreduce" else (None if algo == "asgd-ps" else 20.0 + e["repeat"])
        run = _run(algo, c["workers"], (2000.0 if fast else 1000.0) + 10 * e["repeat"] + i, e["repeat"], tta=tta)
        runs.append(run | {"key": e["key"], "config": e["key"].rsplit("-r", 1)[0], "model": c["model"]})
    return comparison(runs)


def test_the_terminal_comparison_fits_100_columns_and_marks_the_best() -> None:
    table = _nightly_table()
    best = best_per_config(table)
    console = Console(width=100, record=True)
    console.print(comparison_table(table, best, title="nightly-cpu"))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in "".join(lines)
    for row in table:  # every config name whole, at the start of its row
        assert sum(line.split()[:1] == [row["config"]] for line in lines) == 1, row["config"]
    configs = {r["config"] for r in table}
    first_lines = {line.split()[0]: line for line in lines if line.split()[:1] and line.split()[0] in configs}
    for group, b in best.items():
        assert "*" in first_lines[b["fastest_config"]], group
        if b["first_to_target_config"]:
            assert "+" in first_lines[b["first_to_target_config"]], group
    marked = [line for line in first_lines.values() if "*" in line]
    assert len(marked) == len(best)
    assert all("-v" in line.split()[0] or "-w1-" in line.split()[0] for line in marked)
    text = "\n".join(lines)
    assert "samples/s" in text and "not reached" in text and " s" in text


@given(st.lists(st.tuples(st.floats(1e3, 1e6), st.floats(0.01, 0.9), st.floats(1.0, 5.0), st.floats(1.0, 99.0)),
                min_size=1, max_size=3))
def test_a_language_models_figures_reach_the_terminal(repeats: list[tuple[float, float, float, float]]) -> None:
    """tokens/s, MFU, the evaluation loss and the time to the target loss: medians over the
    repeats, in a table of their own that fits 100 columns; a CNN's table has none."""
    runs = []
    for i, (tokens, mfu, loss, ttl) in enumerate(repeats):
        run = _run("ssgd-allreduce", 2, tokens / 32, i, model="gpt-mini-T32")
        run["summary"] |= {"throughput_tokens_per_s": tokens, "mfu": mfu, "final_test_loss": loss,
                           "target_loss": 3.0, "time_to_loss_s": ttl if loss <= 3.0 else None,
                           "target_reached": loss <= 3.0}
        runs.append(run)
    [row] = comparison(runs)
    console = Console(width=100, record=True)
    console.print(language_model_table([row]))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    [line] = [ln for ln in text.splitlines() if ln.split()[:1] == [row["config"]]]
    assert line.split()[1].removesuffix("*") == fmt(statistics.median(t for t, *_ in repeats), 5)  # alone: the most
    assert line.split()[2] == fmt(100 * statistics.median(m for _, m, *_ in repeats), 3)  # MFU in %
    assert line.split()[3] == fmt(statistics.median(loss for *_, loss, _ in repeats))
    assert language_model_table(comparison([_run("ssgd-allreduce", 2, 100.0, 0)])) is None


def test_plots_with_one_point_are_not_drawn() -> None:
    curve = [(1.0, 0.2), (2.0, 0.5), (3.0, 0.7)]
    runs = [_run("ssgd-allreduce", 2, 100, 0)]
    table = comparison(runs)
    assert plot_names(runs, table, None) == ["iteration_breakdown.png"]
    assert set(figures(runs, table, None)) == {"iteration_breakdown.png"}
    runs = [
        _run("ssgd-allreduce", w, thr, i, curve=[(t * w + i, a + 0.01 * i) for t, a in curve])
        for w, thr in ((1, 60), (2, 100))
        for i in range(3)
    ]
    table = comparison(runs)
    figs = figures(runs, table, None)
    assert set(figs) == {"throughput_scaling.png", "accuracy_vs_time.png", "iteration_breakdown.png"}
    one, two = figs["accuracy_vs_time.png"].axes  # a panel per world size, a line per algorithm
    assert [line.get_label() for line in one.get_lines()] == ["m-ssgd-allreduce b32 (n=3)", "target 0.5"]
    ax = two
    w2 = ax.get_lines()[0]
    # median over the three repeats at each evaluation: time 2t+1, accuracy a+0.01
    assert list(w2.get_xdata()) == [3.0, 5.0, 7.0]
    assert list(w2.get_ydata()) == pytest.approx([0.21, 0.51, 0.71])
    assert len(ax.collections) == 1  # the min-max band
    ideal = [line for line in figs["throughput_scaling.png"].axes[0].get_lines() if "ideal" in line.get_label()]
    assert [list(line.get_ydata()) for line in ideal] == [[60, 120]]


def test_report_of_a_multi_repeat_run_shows_spreads(tmp_path: Path) -> None:
    from pipelines.report.document import write_report
    from pipelines.report.regression import regression_check
    from pipelines.spec import load_spec

    runs = [
        _run("ssgd-allreduce", 1, 60, 0, tta=3.0, acc=0.7),
        _run("ssgd-allreduce", 1, 64, 1, tta=2.0, acc=0.8),
        _run("odsgd-ps", 2, 100, 0, tta=None, acc=0.45),
        _run("odsgd-ps", 2, 90, 1, tta=None, acc=0.40),
        _run("odsgd-ps", 2, 96, 2, tta=None, acc=0.48),
    ]
    table = comparison(runs)
    ctx = {"run_key": "k", "spec_hash": "h", "hardware": "cpu-local", "suite": "adhoc"}
    spec = load_spec(REPO / "specs" / "smoke.yaml")
    check = regression_check(table, None, None, spec.regression)
    md = write_report(tmp_path, ctx, spec, runs, table, None, check)
    text = md.read_text()
    assert "| m-odsgd-ps-w2-b32 | 3 | 96\\* [90, 100] | 0.774 | " in text  # 96 / (2 x 62)
    assert "| 0.45 [0.4, 0.48] | not reached in 60 steps |" in text
    assert "| m-ssgd-allreduce-w1-b32 | 2 | 62\\* [60, 64] | 1-worker baseline |" in text
    assert "2.5 s+ [2, 3], 25 steps |" in text
    assert "Plots: iteration_breakdown.png (" in text  # one point per line, one evaluation per run
    doc = json.loads((tmp_path / "report.json").read_text())
    od = next(r for r in doc["comparison"] if r["config"] == "m-odsgd-ps-w2-b32")
    assert (od["final_accuracy_min"], od["final_accuracy_max"], od["scaling_baseline"]) == (
        0.4,
        0.48,
        "m-ssgd-allreduce-w1-b32",
    )
    assert od["time_to_accuracy_median_s"] is None and od["target_reached_repeats"] == 0


_MODELS = st.sampled_from(["lenet5", "resnet20", "mnasnet0_5-imagefolder-3x224x224", "gpt-mini-L3-d192-h3-T96-markov",
                           "gpt-tiny-L2-d40-h2-T24-stdlib-text", "mlp-w512x512x256-digits"])
_ALGOS = st.sampled_from(["ssgd-allreduce", "ssgd-ps", "asgd-ps", "odsgd-ps", "odsgd-ps-v4", "ssgd-allreduce-v2"])


@settings(max_examples=40, deadline=None)
@given(lm=st.booleans(), model=_MODELS, configs=st.lists(st.tuples(_ALGOS, st.sampled_from([1, 2, 4, 16])),
                                                         min_size=1, max_size=6, unique=True),
       repeats=st.integers(1, 3), thr=st.floats(1.0, 9e4), reached=st.sampled_from([0, 1, 2]))
def test_a_comparison_reads_whole_in_an_80_column_log(lm: bool, model: str, configs: list[tuple[str, int]],
                                                      repeats: int, thr: float, reached: int) -> None:
    """Written to a log (no terminal) of 80 columns, the comparison of an image or a language
    model's spec cuts no header and no figure: the long configuration names fold instead. Each
    kind of workload has its own table, with its own figures."""
    import io

    runs = []
    for k, (algo, workers) in enumerate(configs):
        for i in range(repeats):
            run = _run(algo, workers, thr * (1 + 0.07 * i + 0.013 * k), i, model=model,
                       tta=12.5 + i if i < reached else None, acc=0.9 - 0.01 * i)
            if lm:
                run["summary"] |= {"throughput_tokens_per_s": 96 * run["summary"]["throughput_samples_per_s"],
                                   "mfu": 0.0123 * (1 + 0.1 * i), "final_test_loss": 2.7 + 0.01 * i,
                                   "target_loss": 2.7, "time_to_loss_s": 40.12 + i if i < reached else None}
            runs.append(run)
    table = comparison(runs)
    tables = comparison_tables(table, best_per_config(table), title="nightly")
    out = io.StringIO()
    console = Console(file=out, width=80)
    assert not console.is_terminal
    for t in tables:
        console.print(t)
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    headers = [c.header for t in tables for c in t.columns]
    assert ("tokens/s" in headers) == lm and ("samples/s" in headers) != lm and "accuracy" not in headers[:0]
    if lm:
        assert "accuracy" not in headers  # token accuracy is no figure of a language model
    for t in tables:
        for column in t.columns[1:]:  # every figure and every word of the other cells, whole
            for cell in column._cells:
                for word in str(cell).split():
                    assert word in text, (column.header, word, text)


@given(a=st.lists(st.floats(10.0, 1e4), min_size=1, max_size=3),
       b=st.lists(st.floats(10.0, 1e4), min_size=1, max_size=3), only=st.sampled_from([None, "A", "B"]))
def test_hardware_against_hardware_divides_medians_within_the_repeats_extremes(a: list[float], b: list[float],
                                                                               only: str | None) -> None:
    from pipelines.report.hardware import hardware_ratios

    table_a = comparison([_run("ssgd-allreduce", 2, t, i) for i, t in enumerate(a)]
                         + ([_run("asgd-ps", 2, 50.0, 0)] if only == "A" else []))
    table_b = comparison([_run("ssgd-allreduce", 2, t, i) for i, t in enumerate(b)]
                         + ([_run("asgd-ps", 2, 50.0, 0)] if only == "B" else []))
    rows = {r["config"]: r for r in hardware_ratios(table_a, table_b)}
    both = rows["m-ssgd-allreduce-w2-b32"]
    assert both["only"] is None
    assert both["ratio"] == pytest.approx(statistics.median(b) / statistics.median(a))
    assert both["ratio_low"] == pytest.approx(min(b) / max(a)) and both["ratio_high"] == pytest.approx(max(b) / min(a))
    assert both["ratio_low"] <= both["ratio"] * (1 + 1e-12) and both["ratio"] <= both["ratio_high"] * (1 + 1e-12)
    if only:
        assert rows["m-asgd-ps-w2-b32"]["only"] == only and rows["m-asgd-ps-w2-b32"]["ratio"] is None
    else:
        assert len(rows) == 1


@pytest.mark.slow  # an MLflow store
def test_compare_puts_two_hardware_labels_side_by_side(tmp_path: Path) -> None:
    """Two hardware labels' pipeline runs in one MLflow store, laid out as the pipeline logs them
    (a parent run per pipeline run, a finished training child per repeat): `compare --hardware A
    --hardware B` prints each configuration's two medians and the ratio, and names the one only
    one label ran."""
    from click.testing import CliRunner

    from pipelines.cli import cli

    uri, _, _ = _two_labels(tmp_path)
    runner = CliRunner(env={"COLUMNS": "80"})
    out = runner.invoke(cli, ["compare", "--hardware", "cpu-a", "--hardware", "cpu-b", "--tracking-uri", uri])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    [line] = [ln for ln in text.splitlines() if ln.startswith("lenet5-ssgd-allreduce")]
    assert line.split()[1:4] == ["100", "200", "2"], text  # the medians and their ratio
    assert "[1.73, 2.33]" in text, text  # 190/110 and 210/90: the repeats' extremes
    [only] = [ln for ln in text.splitlines() if ln.startswith("lenet5-asgd-ps")]
    assert "only cpu-a" in only, text
    three = runner.invoke(cli, ["compare", "--hardware", "a", "--hardware", "b", "--hardware", "c",
                                "--tracking-uri", uri])
    assert three.exit_code == 2 and "at most two labels" in three.output


@pytest.mark.slow  # an MLflow store
def test_predict_from_a_hardware_label_is_predict_from_its_profiles_files(tmp_path: Path) -> None:
    """`ddlbench predict --hardware LABEL` reads the newest hardware profile MLflow holds for the
    label, as the onboarding run records it, and predicts what the same layer table and comm
    model given as files predict."""
    from click.testing import CliRunner
    from mlflow import MlflowClient

    from modelling.measure.layers import load_layers
    from modelling.measure.records import load_comm
    from modelling.network.fit import fit_comm
    from pipelines.cli import cli

    grid = REPO / "tests" / "fixtures" / "grids" / "onehost"
    layers, model = load_layers(grid / "layers.json"), fit_comm(load_comm(grid / "comm.json"))
    (tmp_path / "layers.json").write_text(json.dumps(layers))
    (tmp_path / "model.json").write_text(json.dumps(model))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("ddlbench-onboarding")
    for label, doc in (("old-card", {"comm_model": {"kind": "nothing"}}),  # an older label's: never read
                       ("new-card", {"comm_model": model, "layers": {"mlp-digits-b32": layers}})):
        run = client.create_run(exp, tags={"ddlbench.node": "pipeline", "ddlbench.hardware": label,
                                           "ddlbench.run_key": f"onboarding-{label}",
                                           "ddlbench.hardware_profile": "hardware_profile/hardware_profile.json"})
        (tmp_path / "hardware_profile.json").write_text(json.dumps({"hardware": label, **doc}))
        client.log_artifact(run.info.run_id, str(tmp_path / "hardware_profile.json"), "hardware_profile")
        client.set_terminated(run.info.run_id)
    runner = CliRunner()
    args = ["predict", "--algorithm", "odsgd", "--workers", "2,8,64", "--json"]
    files = ["--layers", str(tmp_path / "layers.json"), "--comm", str(tmp_path / "model.json")]
    by_files = runner.invoke(cli, [*args, *files])
    by_label = runner.invoke(cli, [*args, "--hardware", "new-card", "--tracking-uri", uri])
    assert by_files.exit_code == 0 and by_label.exit_code == 0, by_files.output + by_label.output
    assert json.loads(by_label.output) == json.loads(by_files.output)
    none = runner.invoke(cli, [*args, "--hardware", "no-such-card", "--tracking-uri", uri])
    assert none.exit_code == 2 and "no hardware profile of 'no-such-card'" in none.output
    other = runner.invoke(cli, [*args, "--hardware", "new-card", "--workload", "resnet20", "--tracking-uri", uri])
    assert other.exit_code == 2 and "mlp-digits-b32" in other.output and "none is 'resnet20'" in other.output


_DOMAINS = st.sampled_from(["validated", "ms-scale iteration with more ranks than cores"])


@settings(max_examples=40, deadline=None)
@given(model=_MODELS, algos=st.lists(_ALGOS, min_size=1, max_size=6, unique=True), workers=st.sampled_from([1, 2, 16]),
       seconds=st.floats(1e-4, 30.0), kind=st.sampled_from(["inputs", "calibrated"]), domains=st.lists(_DOMAINS,
                                                                                                       min_size=6,
                                                                                                       max_size=6),
       few=st.booleans())
def test_a_validation_reads_whole_in_an_80_column_log_with_its_interval_and_domain(
        model: str, algos: list[str], workers: int, seconds: float, kind: str, domains: list[str], few: bool) -> None:
    """The terminal's "Predicted vs measured" holds the 80% interval, marks a row outside the
    validated domain and says why in its caption, and cuts nothing at 80 columns."""
    import io

    from pipelines.report.console import OUTSIDE, validation_table

    configs = []
    for k, algo in enumerate(algos):
        name, comm = (algo.split("-") + ["ps"])[:2]
        p, m = seconds * (1 + 0.05 * k), seconds * (1.3 - 0.1 * k)
        configs.append({"model": model, "algorithm": name, "comm": comm, "workers": workers, "repeats": 3,
                        "predicted_iter_s": p, "measured_iter_s": m, "error": p / m - 1,
                        "model_error": None if few else p / m - 1.02, "model_error_note": "too few" if few else None,
                        "model_error_samples": 2, "repeat_spread": 0.031, "interval_kind": kind,
                        "calibration_runs": 12 if kind == "calibrated" else 0, "interval_low_s": p * 0.8,
                        "interval_high_s": p * 1.25, "domain": domains[k]})
    out = io.StringIO()
    Console(file=out, width=80).print(validation_table({"configs": configs, "median_abs_error": 0.1}))
    text = out.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    outside = [c for c in configs if c["domain"] != "validated"]
    assert text.count(OUTSIDE) == len(outside) + (1 if outside else 0)  # each row, and the caption's key
    assert ("calibrated on 12 earlier" in text) == (kind == "calibrated")
    for c in configs:
        for cell in (f"{c['interval_low_s'] * 1e3:.2f}-{c['interval_high_s'] * 1e3:.2f}", f"{c['error']:+.1%}"):
            assert cell in text, (cell, text)
    # rich folds a long caption at spaces and after hyphens ("in-" / "situ")
    assert ("n/a: 2 in-situ samples, too few" in re.sub(r"-\s+", "-", " ".join(text.split()))) == few


def _texts_overlap_nowhere_and_points_lie_inside(fig: Any) -> None:
    """No two visible texts of `fig` overlap (matplotlib's own extents, drawn), and every data
    point of every line and scatter lies inside its axes' limits."""
    import itertools

    import matplotlib.collections
    import matplotlib.text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # An axis keeps the labels of ticks just outside its limits, visible but not drawn.
    undrawn = {id(label) for ax in fig.axes for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim()))
               for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()] for label in (tick.label1, tick.label2)
               if tick.get_loc() is None
               or not min(lo, hi) - 1e-9 * abs(hi - lo) <= tick.get_loc() <= max(lo, hi) + 1e-9 * abs(hi - lo)}
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()
             and t.get_figure() is fig and id(t) not in undrawn]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        assert not ba.overlaps(bb) or ba.contains(*bb.min) and ba.contains(*bb.max) and a == b, (a, b)
    for ax in fig.axes:
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        for line in ax.get_lines():
            if line.get_linestyle() == "--":  # a guide (the target, predicted = measured), not data
                continue
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
                assert x0 <= x <= x1 and y0 <= y <= y1, (ax.get_title(), line.get_label(), x, y)
        for coll in ax.collections:
            if not isinstance(coll, matplotlib.collections.PathCollection):  # a band, error bars
                continue
            for x, y in coll.get_offsets():
                assert x0 <= x <= x1 and y0 <= y <= y1, (ax.get_title(), x, y)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 8), base=st.floats(0.5, 500.0), spread=st.floats(0.0, 0.02),
       lm=st.booleans(), names=st.sampled_from(["m", "gpt-mini-L3-d192-h3-T96-markov"]))
@example(n=1, base=256.5, spread=0.0, lm=False, names="m")  # a tick just outside the limits keeps its label
def test_every_report_figure_reads_its_labels_apart_and_holds_its_points(n: int, base: float, spread: float,
                                                                         lm: bool, names: str) -> None:
    """Predicted vs measured with n configurations whose points nearly coincide, the curves of an
    image or a language model's repeats, and the predicted scaling with what it assumes: no label
    on another, no point outside its axes."""
    import matplotlib.pyplot as plt

    from pipelines.report.plots import plot_predicted_scaling, plot_predicted_vs_measured

    algos = ["ssgd-allreduce", "ssgd-ps", "asgd-ps", "odsgd-ps"]
    rows = [{"run": f"{names}-{algos[i % 4]}-w{2 + i // 4}-b32-r0", "measured_iter_s": base * (1 + spread * i) / 1e3,
             "predicted_iter_s": base * (1 + 1.5 * spread * i) / 1e3, "error": 1.5 * spread,
             "model_predicted_iter_s": base * 1.01 / 1e3, "model_error": 0.01,
             "interval_low_s": base * 0.9 / 1e3, "interval_high_s": base * 1.2 / 1e3} for i in range(n)]
    fig = plot_predicted_vs_measured(rows)
    _texts_overlap_nowhere_and_points_lie_inside(fig)
    key = fig.axes[1].texts[0].get_text()
    assert all(f"{i}  {r['run']}" in key for i, r in enumerate(rows, start=1))
    plt.close(fig)

    runs = []
    for w in (1, 2):
        for i in range(2):
            run = _run("ssgd-allreduce", w, 100.0 * w, i, model=names,
                       curve=[(t * w + i, 0.2 + 0.1 * t) for t in range(1, 5)])
            if lm:
                run["summary"] |= {"language_model": {"seq_len": 96}, "target_loss": 2.7}
                run["test_loss_curve"] = [(t * w + i, 4.0 - 0.3 * t) for t in range(1, 5)]
            runs.append(run)
    table = comparison(runs)
    figs = figures(runs, table, None)
    assert ("loss_vs_time.png" in figs) == lm and ("accuracy_vs_time.png" in figs) != lm
    curve = figs["loss_vs_time.png" if lm else "accuracy_vs_time.png"]
    assert curve.axes[0].get_ylabel().startswith("test loss" if lm else "test accuracy")
    targets = [line.get_ydata()[0] for line in curve.axes[0].get_lines() if line.get_label().startswith("target")]
    assert targets == [2.7 if lm else 0.5]
    _texts_overlap_nowhere_and_points_lie_inside(curve)

    scaling = plot_predicted_scaling(
        [{"workload": names, "algorithm": a, "batch_size": 32, "workers": w, "link_bandwidth": "measured",
          "throughput_samples_per_s": 100.0 * w ** 0.9} for a in algos[:2] for w in (2, 4, 8, 16)],
        "links of 400mbit; 2 netns nodes, shards colocated (a larger world on a cluster like it)")
    assert "links of 400mbit; 2 netns nodes" in scaling.axes[0].get_title()
    _texts_overlap_nowhere_and_points_lie_inside(scaling)
    for f in (curve, scaling, *figs.values()):
        plt.close(f)


def _two_labels(tmp_path: Path) -> tuple[str, Any, str]:
    """An MLflow store with two hardware labels' nightly pipeline runs, laid out as the pipeline
    logs them: (uri, client, experiment id)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("ddlbench-nightly")
    figures = {"cpu-a": {("ssgd", "allreduce"): [100.0, 110.0, 90.0], ("asgd", "ps"): [80.0]},
               "cpu-b": {("ssgd", "allreduce"): [200.0, 190.0, 210.0]}}
    for label, configs in figures.items():
        key = f"nightly-{label}"
        parent = client.create_run(exp, tags={"ddlbench.node": "pipeline", "ddlbench.hardware": label,
                                              "ddlbench.run_key": key})
        for (algo, comm), thr in configs.items():
            for t in thr:
                child = client.create_run(exp, tags={
                    "ddlbench.run_key": key, "ddlbench.step": "train", "ddlbench.algorithm": algo,
                    "ddlbench.comm": comm, "ddlbench.workers": "2", "ddlbench.batch_size": "32",
                    "ddlbench.model": "lenet5", "ddlbench.config": f"lenet5-{algo}-{comm}-w2-b32",
                    "mlflow.parentRunId": parent.info.run_id})
                client.log_metric(child.info.run_id, "throughput_samples_per_s", t)
                client.log_metric(child.info.run_id, "iter_time_p50_s", 64 / t)
                client.set_terminated(child.info.run_id)
        client.set_terminated(parent.info.run_id)
    return uri, client, exp


@pytest.mark.slow  # an MLflow store
def test_a_report_sets_its_throughput_against_the_reference_hardware(tmp_path: Path) -> None:
    """`regression.reference_hardware` (the onboarding form's reference): the report's section
    holds, per configuration, the reference's newest run and this run's medians and their
    ratio; a label with no runs is said, and a run is never its own reference."""
    from pipelines.report.document import reference_lines
    from pipelines.report.hardware import against

    _, client, exp = _two_labels(tmp_path)
    mine = [{"config": "lenet5-ssgd-allreduce-w2-b32", "throughput_median": 50.0, "throughput_min": 45.0,
             "throughput_max": 60.0, "repeats": 3}]
    ref = against(client, exp, "cpu-a", mine, run_key="onboarding-new")
    assert (ref["hardware"], ref["run_key"]) == ("cpu-a", "nightly-cpu-a")
    rows = {r["config"]: r for r in ref["rows"]}
    assert rows["lenet5-ssgd-allreduce-w2-b32"]["ratio"] == 0.5  # 50 against cpu-a's median 100
    assert rows["lenet5-ssgd-allreduce-w2-b32"]["ratio_low"] == pytest.approx(45 / 110)
    assert rows["lenet5-asgd-ps-w2-b32"]["only"] == "A"
    md = "\n".join(reference_lines(ref, "new-card"))
    assert "## Against cpu-a" in md and "| new-card / cpu-a |" in md and "only cpu-a ran it" in md, md
    assert "| lenet5-ssgd-allreduce-w2-b32 | 100 [90, 110] | 50 [45, 60] | 0.5 [0.409, 0.667] |" in md, md
    none = against(client, exp, "cpu-z", mine, run_key="x")
    assert none["rows"] == [] and "no finished training runs of 'cpu-z'" in none["note"]
    assert against(client, exp, "cpu-a", mine, run_key="nightly-cpu-a")["rows"] == []  # not itself
