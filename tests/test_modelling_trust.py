"""How far to trust a prediction (docs/model-accuracy.md): a model error says how many in-situ
samples it rests on, and is no figure below the minimum; an interval is calibrated by the
model's own error on the hardware's earlier validations, and widened outside its domain."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelling.measure.records import load_comm
from modelling.network.fit import fit_comm
from modelling.validate import MIN_INSITU_SAMPLES, validate_runs
from pipelines.report.validation import validation_markdown
from tests.grid_fixtures import GRIDS, link_rate

GRID = GRIDS / "onehost"


def _run(tmp: Path, config: str, repeat: int, sampled: int) -> Path:
    """A run directory of the recorded grid's configuration, with an in-situ table (the profile's
    compute, a tenth slower, so the two errors differ) that rests on `sampled` sampled iterations."""
    run = tmp / f"{config}-r{repeat}"
    run.mkdir()
    summary = json.loads((GRID / "runs" / f"{config}-r0" / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary))
    profile = json.loads((GRID / "layers.json").read_text())
    layers = [r | {"fwd_s": r["fwd_s"] * 1.1, "bwd_s": r["bwd_s"] * 1.1} for r in profile["layers"]]
    insitu = {**profile, "layers": layers, "source": "in situ", "sampled_iterations": sampled, "sampling_every": 10}
    (run / "layers_insitu.json").write_text(json.dumps(insitu))
    return run


def test_a_model_error_on_too_few_insitu_samples_is_marked_and_left_out(tmp_path) -> None:
    shutil.copy(GRID / "layers.json", tmp_path / "layers.json")
    few, enough = "mlp-ssgd-allreduce-w2-b32", "mlp-ssgd-ps-w2-b32"
    # Two repeats of 2 samples (4 in all, under the minimum of 5) and two of 3 (6 in all).
    runs = [_run(tmp_path, few, i, 2) for i in range(2)] + [_run(tmp_path, enough, i, 3) for i in range(2)]
    model = fit_comm(load_comm(GRID / "comm.json"), link_bytes_per_s=link_rate(GRID))
    result = validate_runs(runs, comm_model=model)
    by_algo = {c["comm"]: c for c in result["configs"]}
    marked, kept = by_algo["allreduce"], by_algo["ps"]
    assert MIN_INSITU_SAMPLES == 5
    assert marked["model_error_samples"] == 4 and kept["model_error_samples"] == 6
    assert marked["model_error_note"] == "rests on 4 in-situ samples, fewer than 5"
    assert kept["model_error_note"] is None
    assert marked["model_error"] is not None  # kept on its row, marked: no key lost
    # out of the medians: the summary is the kept configuration's alone
    assert result["median_abs_model_error"] == abs(kept["model_error"])
    assert result["worst_abs_model_error"] == abs(kept["model_error"])
    assert result["configs_model_error_too_few_samples"] == 1
    # every run row, with its own count (3 samples each: too few alone)
    assert {r["model_error_samples"] for r in result["runs"]} == {2, 3}
    assert all(r["model_error_note"] for r in result["runs"])

    (tmp_path / "validation.json").write_text(json.dumps(result))
    written = json.loads((tmp_path / "validation.json").read_text())
    md = "\n".join(validation_markdown(written))
    [row] = [line for line in md.splitlines() if "allreduce" in line and line.startswith("|")]
    assert "n/a (4 samples)" in row and f"{marked['model_error']:+.1%}" not in row
    [ps_row] = [line for line in md.splitlines() if "ssgd-ps" in line and line.startswith("|")]
    assert f"{kept['model_error']:+.1%}" in ps_row
    assert "1 configuration(s) left out of the model error's median" in md


def test_a_run_without_an_insitu_table_has_no_model_error_and_no_note(tmp_path) -> None:
    shutil.copy(GRID / "layers.json", tmp_path / "layers.json")
    run = _run(tmp_path, "mlp-ssgd-allreduce-w2-b32", 0, 2)
    (run / "layers_insitu.json").unlink()
    model = fit_comm(load_comm(GRID / "comm.json"), link_bytes_per_s=link_rate(GRID))
    [c] = validate_runs([run], comm_model=model)["configs"]
    assert c["model_error"] is None and c["model_error_samples"] is None and c["model_error_note"] is None


# --- calibrated intervals (modelling/calibration.py) ---------------------------------------------

def _recorded_pairs() -> list[dict[str, float]]:
    """Every trained configuration of the recorded grids: its end-to-end prediction as recorded
    and its measured iteration (real runs, tests/fixtures/grids/*/expected.json)."""
    pairs = []
    for path in sorted(GRIDS.glob("*/expected.json")):
        expected = json.loads(path.read_text())
        for name, measured in expected["measured"].items():
            pairs.append({"predicted_iter_s": expected["predicted"][name]["iter_time_s"], "measured_iter_s": measured})
    return pairs


HISTORY = Path(__file__).resolve().parent / "fixtures" / "validation_history.json"


def _history() -> list[dict]:
    """A recorded validation history (tests/fixtures/validation_history.json): every validation
    spec, the demo and the ms-scale lenet5 case through `ddlbench run`, in turn on one pipeline
    home: real runs, written by benchmarks/bench_coverage.py."""
    return json.loads(HISTORY.read_text())


def test_a_runs_intervals_rest_on_the_validations_before_it() -> None:
    """Each recorded run's intervals, as the product wrote them after reading the hardware's
    history from MLflow, equal the intervals calibrated on the rows of the runs before it."""
    from modelling.calibration import grouped, interval
    from pipelines.stages.calibration import HISTORY_RUNS

    earlier: list[list[dict]] = []
    kinds = set()
    for run in _history():
        history = grouped(c for r in earlier[-HISTORY_RUNS:] for c in r)
        for c in run["configs"]:
            band = interval(c["predicted_iter_s"], c["predicted_p10_s"], c["predicted_p90_s"], history, c["domain"])
            assert (band["interval_low_s"], band["interval_high_s"]) == pytest.approx(
                (c["interval_low_s"], c["interval_high_s"]), rel=1e-9), (run["run"], c)
            assert (band["interval_kind"], band["calibration_runs"]) == (c["interval_kind"], c["calibration_runs"])
            kinds.add((band["interval_kind"], c["domain"] == "validated"))
        earlier.append(run["configs"])
    assert kinds >= {("inputs", True), ("calibrated", True), ("inputs", False)}


def test_calibrated_intervals_cover_held_out_configurations_of_a_recorded_history() -> None:
    """Hold out each configuration of the recorded history and calibrate on the rest of its side
    of the domain: the 80% intervals cover 70-90% of the held-out ones. With distinct scores,
    leave-one-out coverage of split conformal is about ceil(0.8 n) / n of each side whatever the
    scores are: the test holds the mechanism (the groups, the score, the quantile's index, the
    interval around the point) to it on real pairs."""
    from modelling.calibration import grouped, interval

    rows = [c for run in _history() for c in run["configs"] if c["predicted_iter_s"] is not None]
    assert len(rows) >= 30 and any(c["domain"] != "validated" for c in rows)
    covered = []
    for i, held in enumerate(rows):
        band = interval(held["predicted_iter_s"], None, None, grouped(rows[:i] + rows[i + 1:]), held["domain"])
        assert band["interval_kind"] == "calibrated", held
        covered.append(band["interval_low_s"] <= held["measured_iter_s"] <= band["interval_high_s"])
    assert 0.7 <= sum(covered) / len(covered) <= 0.9, covered


def test_the_conformal_quantile_its_minimum_and_the_stated_default() -> None:
    import math

    from modelling.calibration import MIN_CALIBRATION, STATED_ACCURACY, conformal_quantile, interval

    assert conformal_quantile([0.1, 0.2, 0.3, 0.4]) is None  # under MIN_CALIBRATION
    assert MIN_CALIBRATION == 5 and conformal_quantile([0.5, 0.1, 0.3, 0.2, 0.4]) == 0.5  # ceil(4.8) = 5th
    nine = [i / 10 for i in range(1, 10)]
    assert conformal_quantile(nine) == 0.8  # ceil(10 * 0.8) = 8th of 9
    # calibrated: point * exp(+-q), widened to hold the inputs' interval
    band = interval(1.0, 0.3, 1.1, nine)
    assert band["interval_low_s"] == 0.3 and band["interval_high_s"] == math.exp(0.8)
    assert (band["interval_kind"], band["calibration_runs"], band["domain"]) == ("calibrated", 9, "validated")
    # too short a history: the inputs' interval widened by the stated accuracy
    short = interval(1.0, 0.95, 1.2, [0.3] * 4)
    assert (short["interval_kind"], short["calibration_runs"]) == ("inputs", 0)
    assert short["interval_low_s"] == 1 / (1 + STATED_ACCURACY) and short["interval_high_s"] == 1.2
    # no prediction: no interval, and still which kind it would have been
    none = interval(None, None, None, nine)
    assert none["interval_low_s"] is None and none["interval_kind"] == "calibrated"


def test_the_domain_and_its_reasons() -> None:
    from modelling.calibration import BURST_SHARE_FLOOR, DOMAIN_FLOOR_S, SHORT_AND_CROWDED, WITHIN_BURST, domain

    assert domain(0.01, ranks=3, cores=2) == SHORT_AND_CROWDED
    assert domain(0.01, ranks=2, cores=2) == "validated"  # ranks fit the cores
    assert domain(DOMAIN_FLOOR_S, ranks=3, cores=2) == "validated"
    assert domain(0.01, ranks=3, cores=None) == "validated"  # cores not recorded: nothing to say
    # the links' bucket: the mechanism, named before the crowding it comes with
    assert domain(1.0, ranks=2, cores=2, burst_share=BURST_SHARE_FLOOR) == WITHIN_BURST
    assert domain(0.01, ranks=3, cores=2, burst_share=0.5) == WITHIN_BURST
    assert domain(1.0, ranks=2, cores=2, burst_share=BURST_SHARE_FLOOR * 0.99) == "validated"


@given(point=st.floats(1e-4, 10.0), inside=st.lists(st.floats(0.0, 0.5), max_size=12),
       outside=st.lists(st.floats(0.0, 2.0), max_size=12))
def test_each_side_of_the_domain_calibrates_on_its_own_history(point, inside, outside) -> None:
    """Mondrian split conformal: a row inside the domain rests on the inside scores alone, one
    outside on the outside scores; a side with too short a history takes its stated default
    (+-10% inside, a factor of 2 outside)."""
    import math

    from modelling.calibration import (
        MIN_CALIBRATION,
        OUTSIDE_STATED_FACTOR,
        STATED_ACCURACY,
        WITHIN_BURST,
        conformal_quantile,
        interval,
    )

    history = {"validated": inside, "outside": outside}
    for where, own, stated in (("validated", inside, math.log1p(STATED_ACCURACY)),
                               (WITHIN_BURST, outside, math.log(OUTSIDE_STATED_FACTOR))):
        band = interval(point, None, None, history, where)
        q = conformal_quantile(own)
        assert band["domain"] == where
        assert band["interval_kind"] == ("inputs" if len(own) < MIN_CALIBRATION else "calibrated")
        assert band["calibration_runs"] == (0 if q is None else len(own))
        half = stated if q is None else q
        assert band["interval_low_s"] == pytest.approx(point * math.exp(-half))
        assert band["interval_high_s"] == pytest.approx(point * math.exp(half))


def test_a_row_without_a_domain_was_inside_it() -> None:
    from modelling.calibration import WITHIN_BURST, grouped

    rows = [{"predicted_iter_s": 1.0, "measured_iter_s": 2.0},
            {"predicted_iter_s": 1.0, "measured_iter_s": 1.5, "domain": "validated"},
            {"predicted_iter_s": 1.0, "measured_iter_s": 3.0, "domain": WITHIN_BURST},
            {"predicted_iter_s": None, "measured_iter_s": 3.0, "domain": WITHIN_BURST}]
    got = grouped(rows)
    assert got["validated"] == pytest.approx([0.6931471805599453, 0.4054651081081644])
    assert got["outside"] == pytest.approx([1.0986122886681098])


def test_the_validation_history_is_read_from_earlier_validate_runs() -> None:
    from types import SimpleNamespace

    from pipelines.stages.calibration import history_scores, validation_history

    configs = {"a": _recorded_pairs()[:4], "b": _recorded_pairs()[4:], "injected": _recorded_pairs()}
    parents = {"a": "0", "b": None, "injected": "20"}

    class Client:
        def search_runs(self, _exp, filter_string, order_by, max_results):
            assert "'cpu-local'" in filter_string and "'validate'" in filter_string and "FINISHED" in filter_string
            return [SimpleNamespace(info=SimpleNamespace(run_id=k), data=SimpleNamespace(
                tags={"mlflow.parentRunId": f"p-{k}"})) for k in configs]

        def get_run(self, run_id):
            delay = parents[run_id.removeprefix("p-")]
            tags = {} if delay is None else {"ddlbench.inject_delay_ms": delay}
            return SimpleNamespace(data=SimpleNamespace(tags=tags))

        def download_artifacts(self, run_id, path, dst):
            out = Path(dst) / run_id / path
            out.parent.mkdir(parents=True)
            out.write_text(json.dumps({"configs": configs[run_id]}))
            return str(out)

    tracker = SimpleNamespace(online=True, client=Client(), experiment_id=lambda: "1")
    rows = validation_history(tracker, "cpu-local")
    assert rows == configs["a"] + configs["b"]  # the injected run is no measurement of the hardware
    assert sum(map(len, history_scores(tracker, "cpu-local").values())) == 12
    assert validation_history(SimpleNamespace(online=False), "cpu-local") == []


def test_the_report_says_which_interval_a_row_has() -> None:
    from pipelines.report.validation import calibrated_cell

    row = {"interval_low_s": 0.01, "interval_high_s": 0.02, "interval_kind": "calibrated", "calibration_runs": 12,
           "domain": "validated"}
    assert calibrated_cell(row) == "10.00-20.00 (calibrated on 12)"
    assert calibrated_cell(row | {"interval_kind": "inputs", "calibration_runs": 0}) == "10.00-20.00 (inputs)"
    assert calibrated_cell(row | {"domain": "ms-scale iteration with more ranks than cores"}).endswith(
        "widened: ms-scale iteration with more ranks than cores")
    assert calibrated_cell({}) == "-"
