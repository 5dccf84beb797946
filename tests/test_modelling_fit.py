"""Fitting alpha-beta(-gamma) to microbenchmarks, and reading model files."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.units import parse_bandwidth
from modelling.measure.records import CommModelError
from modelling.network.costs import CommCosts
from modelling.network.fit import fit_comm, load_comm_model

SIZES = [4096 * 4**i for i in range(7)]


def synthetic_comm(
    alpha: float, beta: float, gamma: float, *, workers: int = 4, servers: int = 1, noise: float = 0.0, seed: int = 0
) -> dict:
    """comm.json as the cost model says it should be measured, with relative noise."""
    rnd = random.Random(seed)
    n = workers
    truth = {
        ("p2p", 2, 0): lambda m: alpha + m * beta,
        ("allreduce", n, 0): lambda m: 2 * (n - 1) * alpha + (n - 1) / n * m * (2 * beta + gamma),
        ("ps", n, servers): lambda m: 2 * n * (alpha + m / servers * beta),
    }
    rows = []
    for (prim, w, s), f in truth.items():
        for m in SIZES:
            t = f(m) * (1 + rnd.gauss(0, noise))
            rows.append(
                {
                    "primitive": prim,
                    "workers": w,
                    "servers": s,
                    "bytes": m,
                    "median_s": t,
                    "spread_s": 0.0,
                    "times_s": [t],
                }
            )
    return {"kind": "ddlbench-comm", "workers": n, "servers": servers, "measurements": rows}


def _fit(model: dict, prim: str) -> dict:
    return next(f for f in model["fits"] if f["primitive"] == prim)


def test_fit_recovers_known_alpha_beta_gamma_from_noisy_measurements() -> None:
    alpha, beta, gamma = 30e-6, 0.8e-9, 0.3e-9
    model = fit_comm(synthetic_comm(alpha, beta, gamma, noise=0.01, seed=3))
    p2p, ar, ps = _fit(model, "p2p"), _fit(model, "allreduce"), _fit(model, "ps")
    assert p2p["beta_s_per_byte"] == pytest.approx(beta, rel=0.03)
    assert ar["beta_s_per_byte"] == pytest.approx(beta, rel=0.03)
    # gamma is what is left of the slope after 2 beta: the noise of both lands on it.
    per_byte = 2 * ar["beta_s_per_byte"] + ar["gamma_s_per_byte"]
    assert per_byte == pytest.approx(2 * beta + gamma, rel=0.03)
    assert ar["gamma_s_per_byte"] == pytest.approx(gamma, rel=0.3)
    assert ps["beta_s_per_byte"] == pytest.approx(beta, rel=0.03)
    # alpha is a small part of large messages: recovered where the noise allows.
    assert ar["alpha_s"] == pytest.approx(alpha, rel=0.5)
    assert ps["alpha_s"] == pytest.approx(alpha, rel=0.5)
    for f in model["fits"]:
        assert f["r2"] > 0.99 and f["usable"] and not f["flags"]
        assert len(f["residuals_s"]) == len(SIZES)


def test_exact_measurements_are_recovered_exactly() -> None:
    model = fit_comm(synthetic_comm(50e-6, 1e-9, 0.5e-9))
    ar = _fit(model, "allreduce")
    assert ar["alpha_s"] == pytest.approx(50e-6, rel=1e-6)
    assert ar["gamma_s_per_byte"] == pytest.approx(0.5e-9, rel=1e-6)
    costs = CommCosts(model)
    assert costs.allreduce(4)(1_000_000) == pytest.approx(6 * 50e-6 + 0.75 * 1e6 * 2.5e-9, rel=1e-6)
    assert costs.allreduce(64)(1_000_000) == pytest.approx(126 * 50e-6 + 63 / 64 * 1e6 * 2.5e-9, rel=1e-6)
    assert costs.transfer(4, 1)(1_000_000) == pytest.approx(50e-6 + 1e6 * 1e-9, rel=1e-6)


def test_a_fit_faster_than_the_link_is_flagged_and_not_used() -> None:
    # 0.1 ns/byte is 80 Gbit/s: impossible on a 10 Gbit/s link.
    model = fit_comm(synthetic_comm(20e-6, 0.1e-9, 0.0), link_bytes_per_s=parse_bandwidth("10gbit"))
    p2p = _fit(model, "p2p")
    assert not p2p["usable"] and "faster than the link" in p2p["flags"][0]
    # The stated link rate is never ignored: it sets the wire time in the fit's place, and says so.
    costs = CommCosts(model)
    assert costs.transfer(4, 1)(1.25e9) == pytest.approx(1.0 + 20e-6, rel=1e-3)
    assert costs.allreduce(4)(1.25e9) == pytest.approx(2 * 3 / 4 * 1.0, rel=1e-2)
    assert "flagged" in costs.note() and "stated link rate (10 Gbit/s)" in costs.note()
    # Each prediction's note is its own: a later world size that uses the same fit says so too.
    for _ in range(2):
        mark = len(costs.notes)
        costs.transfer(2, 1)
        assert "stated link rate (10 Gbit/s)" in costs.note(mark)
        assert costs.note(mark).count("stated link rate") == len({n for n in costs.notes[mark:]})
    # Without a stated rate, nothing replaces the impossible beta: refused.
    with pytest.raises(CommModelError, match="flagged"):
        CommCosts({**model, "link_bytes_per_s": None}).transfer(4, 1)
    # A what-if bandwidth replaces the impossible beta.
    assert CommCosts(model, 1.25e9).transfer(4, 1)(1.25e9) == pytest.approx(1.0, rel=1e-3)


def test_a_flat_noisy_fit_is_flagged_but_its_measurements_still_interpolate() -> None:
    # Small sizes on a noisy host: allreduce time that falls with size fits a negative beta.
    comm = synthetic_comm(20e-6, 1e-9, 0.0)
    comm["measurements"] = [r for r in comm["measurements"] if r["primitive"] == "allreduce"][:2]
    comm["measurements"][0]["median_s"], comm["measurements"][1]["median_s"] = 3e-4, 2e-4
    ar = _fit(fit_comm(comm), "allreduce")
    assert not ar["usable"] and "not positive" in ar["flags"][-1]
    cost = CommCosts(fit_comm(comm)).allreduce(4)
    # Within the sizes measured, the measurements themselves (interpolated) ...
    assert cost(SIZES[0]) == pytest.approx(3e-4) and cost((SIZES[0] + SIZES[1]) / 2) == pytest.approx(2.5e-4)
    # ... past them, no line to extrapolate along: a clear error, not a silent guess.
    with pytest.raises(CommModelError, match="past the largest allreduce size"):
        cost(SIZES[1] * 2)
    # Another world size needs the fitted constants: refused.
    with pytest.raises(CommModelError, match="flagged"):
        CommCosts(fit_comm(comm)).allreduce(8)


def test_a_negative_alpha_is_flagged_and_refitted_at_zero() -> None:
    comm = synthetic_comm(0.0, 1e-9, 0.0)
    for row in comm["measurements"]:
        row["median_s"] -= 2e-6 if row["primitive"] == "p2p" else 0.0
    p2p = _fit(fit_comm(comm), "p2p")
    assert p2p["alpha_s"] == 0.0 and "negative alpha" in p2p["flags"][0]
    assert p2p["beta_s_per_byte"] > 0


def test_unreadable_model_files_name_the_file(tmp_path) -> None:
    good = tmp_path / "model.json"
    good.write_text(json.dumps(fit_comm(synthetic_comm(1e-5, 1e-9, 0.0))))
    assert load_comm_model(good)["fits"]
    truncated = tmp_path / "truncated.json"
    truncated.write_text(good.read_text()[:200])
    with pytest.raises(CommModelError, match="truncated.json: not valid JSON"):
        load_comm_model(truncated)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"layers": []}))
    with pytest.raises(CommModelError, match="foreign.json: not a ddlbench comm model"):
        load_comm_model(foreign)
    with pytest.raises(CommModelError, match="missing.json: no such"):
        load_comm_model(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("text", "expected"), [("10gbit", 1.25e9), ("100 Mbit", 12.5e6), ("1.25GB/s", 1.25e9), ("1000", 1000.0)]
)
def test_bandwidths_read_as_people_write_them(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected)


def test_a_bad_bandwidth_is_refused() -> None:
    with pytest.raises(ValueError, match="bandwidth: cannot read"):
        parse_bandwidth("fast")


def test_merged_comm_files_count_each_size_once() -> None:
    """The pipeline merges the comm.json of several world sizes: p2p repeats in each."""
    one = synthetic_comm(30e-6, 1e-9, 0.2e-9, noise=0.02, seed=1)
    merged = {**one, "measurements": one["measurements"] * 2}
    for a, b in zip(fit_comm(one)["fits"], fit_comm(merged)["fits"], strict=True):
        assert a["sizes"] == b["sizes"] == SIZES
        assert a["beta_s_per_byte"] == pytest.approx(b["beta_s_per_byte"])


def test_an_older_comm_json_and_layer_table_are_migrated_in_one_place() -> None:
    """Version 1 files (no schema_version; comm rows without mean_s or servers; layer rows
    without param_tensor_bytes, no PS copy times) read as the current schema
    (modelling/measure/records.py): the same fits, the same predictions as the files written today;
    a malformed field is named."""
    from modelling.measure.records import SCHEMA_VERSION, migrate_comm, migrate_layers
    from modelling.predict import predict
    from tests.test_modelling_predict import TOY

    new = synthetic_comm(20e-6, 1e-9, 0.2e-9, workers=2)
    old = {**new, "measurements": [{k: v for k, v in row.items() if k not in ("servers",)}
                                   for row in new["measurements"] if row["primitive"] != "ps"]}
    assert "schema_version" not in old and all("mean_s" not in r for r in old["measurements"])
    migrated = migrate_comm(old)
    assert migrated["schema_version"] == SCHEMA_VERSION
    assert all(r["servers"] == 0 and r["mean_s"] == r["median_s"] for r in migrated["measurements"])
    assert fit_comm(old)["fits"] == fit_comm({**new, "measurements": [r for r in new["measurements"]
                                                                      if r["primitive"] != "ps"]})["fits"]
    old_table = {**TOY, "layers": [{k: v for k, v in r.items() if k != "param_tensor_bytes"} for r in TOY["layers"]]}
    for key in ("pack_s", "unpack_s", "server_update_s", "server_add_s"):
        old_table.pop(key)
    table = migrate_layers(old_table)
    assert [r["param_tensor_bytes"] for r in table["layers"]] == [[r["param_bytes"]] for r in TOY["layers"]]
    assert table["pack_s"] == 0.0 and table["iteration_samples_s"] == []
    model = fit_comm(new)
    explicit = {**table, "layers": [{**r} for r in table["layers"]]}
    assert predict(old_table, model, algorithm="ssgd", comm_mode="allreduce", workers=[2])[0]["iter_time_s"] == \
        predict(explicit, model, algorithm="ssgd", comm_mode="allreduce", workers=[2])[0]["iter_time_s"]
    bad = {**new, "measurements": [{**new["measurements"][0], "workers": 0}]}
    with pytest.raises(CommModelError, match=r"measurements\.0\.workers"):
        fit_comm(bad)
    # A version 1 model.json (fits without servers, usable or their measurements): its lines.
    fitted = fit_comm(synthetic_comm(20e-6, 1e-9, 0.0, workers=2, servers=1))
    dropped = ("servers", "usable", "measured_s", "sizes", "sustained_slope_s_per_byte", "link_queue",
               "latency_overlaps", "post_s", "pull_lead_s", "host_cpu_s")
    old_model = {"kind": fitted["kind"], "fits": [{k: v for k, v in f.items() if k not in dropped}
                                                  for f in fitted["fits"]]}
    ps = next(f for f in fitted["fits"] if f["primitive"] == "ps")
    assert CommCosts(old_model).transfer(2, 1)(1e6) == pytest.approx(ps["alpha_s"] + 1e6 * ps["beta_s_per_byte"])
    with pytest.raises(CommModelError, match=r"fits\.0\.alpha_s"):
        CommCosts({**old_model, "fits": [{**old_model["fits"][0], "alpha_s": "x"}]})


def _world_rows(n: int, servers: int, rnd: random.Random) -> list[dict]:
    """One world's comm.json rows as microbench_rank writes them: allreduce and p2p, a ps
    round with its post and host-CPU figures, and ASGD passes with a figure per worker."""
    rows = []
    for m in SIZES[:4]:
        def row(prim: str, w: int, s: int, t: float, m: int = m, **extra: object) -> dict:
            return {"primitive": prim, "workers": w, "servers": s, "bytes": m, "median_s": t, "mean_s": t,
                    "spread_s": 0.0, "times_s": [t], **extra}

        rows.append(row("p2p", 2, 0, 20e-6 + m * 1e-9))  # alike in every file: the allreduce's beta reads it
        if n > 1:
            rows.append(row("allreduce", n, 0, 40e-6 + m * 2e-9 * rnd.uniform(0.9, 1.1), host_cpu_s=m * 1e-9))
        rows.append(row("ps", n, servers, 50e-6 + m * n * 1e-9 * rnd.uniform(0.9, 1.1), post_s=1e-6,
                        pull_lead_s=None, host_cpu_s=m * 2e-9))
        passes = [60e-6 + m * 1e-9 * rnd.uniform(0.9, 1.1) for _ in range(n)]
        rows.append(row("asgd", n, servers, statistics.median(passes), worker_mean_s=passes,
                        reply_tail_s=[p / 10 for p in passes]))
    return rows


@settings(max_examples=30, deadline=None)
@given(worlds=st.lists(st.integers(1, 6), min_size=2, max_size=3, unique=True), servers=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_comm_files_of_several_world_sizes_fit_as_each_alone(worlds: list[int], servers: int, seed: int) -> None:
    """A grid of several world sizes merges their comm.json files (the pipeline's fit stage):
    each world's fits, its per-worker ASGD figures too, are what that world's file alone gives."""
    rnd = random.Random(seed)
    files = {n: {"kind": "ddlbench-comm", "workers": n, "servers": servers,
                 "measurements": _world_rows(n, servers, rnd)} for n in worlds}
    merged = fit_comm({**files[worlds[0]], "measurements": [r for f in files.values() for r in f["measurements"]]})
    for n, f in files.items():
        alone = {(x["primitive"], x["workers"]): x for x in fit_comm(f)["fits"] if x["primitive"] != "p2p"}
        together = {(x["primitive"], x["workers"]): x for x in merged["fits"] if x["workers"] == n
                    and x["primitive"] != "p2p"}
        assert together.keys() == alone.keys() and ("asgd", n) in alone
        for key, x in alone.items():
            for field in ("alpha_s", "beta_s_per_byte", "worker_mean_s", "reply_tail_s", "host_cpu_s", "post_s"):
                assert together[key].get(field) == x.get(field), (key, field)
        assert len(together[("asgd", n)]["worker_mean_s"]) == n
