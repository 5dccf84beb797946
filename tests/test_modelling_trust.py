"""How far to trust a prediction (docs/model-accuracy.md): a model error says how many in-situ
samples it rests on, and is no figure below the minimum."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from modelling.fit import fit_comm, load_comm
from modelling.validate import MIN_INSITU_SAMPLES, validate_runs
from pipelines.report_validation import validation_markdown
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
