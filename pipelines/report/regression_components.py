"""The regression alarm at the component level, and the model's attribution of a change to its
components (docs/regression.md, "Components").

A run's iteration is made of parts the trainer times in situ (training/measure/layer_timing.py): each
layer's forward and backward, the batch load (`data`) and the worker's `update`. A slowdown of one
part is a small change of the whole and a large change of that part, so each part is tested
against its history on its own:
- a layer's **share** of the run's compute (forward and backward of every layer): a host slower
  tonight slows every layer alike and leaves the shares where they were, so a slower layer stands
  out against its siblings whatever the host did;
- the whole **compute** and the **update** (CPU work): relative to the host-speed canary (their
  time times the canary's GEMM rate: the work, in the canary's units) where the runs have one,
  raw without. Their time moves with the host's speed, and only its ratio to the canary's is the
  workload's alone: a raw test would read a host slower by less than the canary's spread can
  show (a test of the canary would not call it moved) as a regression of the workload. The
  canary's own noise joins theirs, the price of a test that holds whatever the host did;
- **data**, raw;
- the **link**: the pipeline's microbenchmark of the primitive the configuration transfers with,
  its latency and per-byte cost (regression_comm.py).

CPU work (the layers, the update) is in CPU seconds where tonight and every history run have them
(a CPU rank, training/measure/layer_timing.py): other work on the cores takes a rank off its core in
slices as long as a small model's layers, which lengthen the wall time of whichever part was
running, and the host-speed canary, a few milliseconds long, mostly escapes them; CPU seconds
leave those slices out and, times the canary's rate, are the work done. The attribution moves
the baseline's wall time of each CPU part as its CPU seconds moved tonight.

The statistic is robust to the heavy tails of a shared host's runs: the history's median and its
biweight spread, a prediction test against Student's t with the degrees of freedom the biweight's
efficiency leaves (0.87 of the SD's). The components of one configuration are tested by closed
testing: Holm's step-down among the parts of the iteration (compute, update, data, the link) and one test
that some layer's share moved; the layers' shares, with Holm among them, only where that one
rejects. Together they keep the chance of any false component alarm at alpha. A component is flagged
where its adjusted p-value is below alpha and the model says it explains more than min_effect of
the iteration (a layer's share, with its other pass: one layer is one component to a reader);
the confirmation rerun stays.

Attribution: the model (modelling.predict fed with in-situ compute, as validation's model error
is) re-predicts the baseline's iteration (the history's median of every component) with tonight's
value of one component swapped in, one at a time and all together; each component's `explains`
is the iteration's change it alone makes, in points of the baseline iteration. Tonight's CPU work
enters at the history's host speed (scaled by the canary's change), so a host faster or slower
tonight is not attributed to the workload; the canary's change is reported beside. A part the
model does not take from the run (the worker's update) explains its own time's change.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

from modelling.validate import INSITU_FILE, MIN_INSITU_SAMPLES
from pipelines.report import regression_comm as rcomm
from pipelines.report.attribution import ALL, Predictor, attribute, baseline_parts

MAD_SD = 1.4826  # the MAD of a normal sample times this is its SD
BIWEIGHT_EFFICIENCY = 0.87  # the biweight's variance is the SD's from this fraction of the values
# Fewer history runs than this carry a component: it is not tested (its spread is unknown).
MIN_RUNS = 3

SHARES = "layer shares"  # the test that some layer's share of the compute moved
CPU = "cpu "  # a repeat's part in its CPU seconds (a layer's phase, the update)


def repeat_parts(run_dir: Path) -> dict[str, float] | None:
    """One repeat's in-situ parts in seconds (`forward <layer>`, `backward <layer>`, `data`,
    `update`), or None where the run sampled none."""
    path = Path(run_dir) / INSITU_FILE
    if not path.is_file():
        return None
    table = json.loads(path.read_text())
    parts = {"data": float(table.get("data_s") or 0.0), "update": float(table.get("update_s") or 0.0)}
    for row in table.get("layers", []):
        parts[f"forward {row['name']}"] = float(row["fwd_s"])
        parts[f"backward {row['name']}"] = float(row["bwd_s"])
        if "fwd_cpu_s" in row:  # the layer's CPU seconds, where the rank read its thread's clock
            parts[f"{CPU}forward {row['name']}"] = float(row["fwd_cpu_s"])
            parts[f"{CPU}backward {row['name']}"] = float(row["bwd_cpu_s"])
    if "update_cpu_s" in table:
        parts[f"{CPU}update"] = float(table["update_cpu_s"])
    parts["samples"] = float(table.get("sampled_iterations") or 0)
    return parts


def run_parts(repeats: list[dict[str, float]]) -> dict[str, Any]:
    """A run's parts over its repeats: each part's median seconds (wall in `seconds`, the layers'
    CPU seconds in `cpu_seconds` where every repeat has them), and the in-situ samples they rest on."""
    keys = set.intersection(*(set(r) for r in repeats)) - {"samples"}
    median = {k: statistics.median(r[k] for r in repeats) for k in sorted(keys)}
    out = {"seconds": {k: v for k, v in median.items() if not k.startswith(CPU)},
           "samples": int(sum(r.get("samples", 0) for r in repeats))}
    cpu = {k.removeprefix(CPU): v for k, v in median.items() if k.startswith(CPU)}
    return out | ({"cpu_seconds": cpu} if cpu else {})


def figures(parts: dict[str, Any], canary_gemm_log: float | None, cpu: bool = False) -> dict[str, float]:
    """The tested figure of each component, in logs: layer shares of the compute; the compute and
    the update relative to the canary (raw without one); data raw. With `cpu` the CPU work (the
    layers, the update) is in its CPU seconds, the data phase (a wait on memory or a loader) in wall."""
    sec = parts["seconds"]
    work = parts["cpu_seconds"] if cpu else sec
    layers = {k: v for k, v in work.items() if k.startswith(("forward ", "backward "))}
    total = sum(layers.values())
    out: dict[str, float] = {}
    if total > 0:
        out["compute"] = math.log(total) + (canary_gemm_log or 0.0)
        out |= {f"{k} share": math.log(v / total) for k, v in layers.items() if v > 0}
    if work.get("update", 0) > 0:
        out["update"] = math.log(work["update"]) + (canary_gemm_log or 0.0)
    if sec.get("data", 0) > 0:
        out["data"] = math.log(sec["data"])
    return out


def biweight_sd(xs: list[float]) -> float:
    """Tukey's biweight midvariance (c = 9), as a standard deviation: robust to the heavy tails of a
    shared host's runs (half the values may be wild), and 87% as efficient as the SD on normal ones.
    Written here: scipy has none, and astropy's or statsmodels' would be a dependency for ten lines."""
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    if mad == 0:
        return statistics.pstdev(xs)
    u = [(x - med) / (9 * mad) for x in xs]
    inside = [(x, ui) for x, ui in zip(xs, u, strict=True) if abs(ui) < 1]
    num = len(xs) * sum((x - med) ** 2 * (1 - ui**2) ** 4 for x, ui in inside)
    den = sum((1 - ui**2) * (1 - 5 * ui**2) for _, ui in inside) ** 2
    return math.sqrt(num / den) if den > 0 else mad * MAD_SD


def robust_test(now: float, history: list[float]) -> dict[str, float]:
    """One-sided test that `now` (a log figure) lies above the history's: p-value and the relative
    change against the history's median."""
    k = len(history)
    med = statistics.median(history)
    spread = biweight_sd(history)
    d = now - med
    if spread <= 0:
        return {"p_value": 0.0 if d > 0 else 1.0, "change": math.expm1(d)}
    # The median's own error (pi/2 of a mean's variance) beside the new run's; the spread's degrees
    # of freedom are the SD's times the biweight's efficiency.
    se = spread * math.sqrt(1 + math.pi / (2 * k))
    df = max(1.0, BIWEIGHT_EFFICIENCY * (k - 1))
    return {"p_value": float(stats.t.sf(d / se, df)), "change": math.expm1(d)}


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values: the family's chance of any false alarm stays at alpha."""
    order = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * p_values[name]))
        adjusted[name] = running
    return adjusted


def gatekept(p_values: dict[str, float]) -> dict[str, float]:
    """Adjusted p-values of a configuration's components by closed testing, which keeps the chance
    of any false alarm at alpha: Holm among the parts of the iteration (compute, update, data), one
    test that some layer's share moved (the smallest share p-value times their number) and one per
    primitive of the link (its figures alike); a member's adjusted p-value is at least its
    group's test's, and Holm's within the group."""
    groups: dict[str, dict[str, float]] = {}
    top: dict[str, float] = {}
    for c, p in p_values.items():
        group = SHARES if c.endswith(" share") else rcomm.primitive_of(c)
        if group:
            groups.setdefault(group, {})[c] = p
        else:
            top[c] = p
    top |= {g: min(1.0, min(ps.values()) * len(ps)) for g, ps in groups.items()}
    first = holm(top)
    out = {c: p for c, p in first.items() if c not in groups}
    for g, ps in groups.items():
        out |= {c: max(first[g], p) for c, p in holm(ps).items()}
    return out


def check_components(now: dict[str, Any] | None, history: list[dict[str, Any]], alpha: float, min_effect: float,
                     predict: Predictor | None = None, host_alpha: float = 0.05) -> dict[str, Any] | None:
    """The component checks of one configuration: `now` and `history` are run-level figures
    (regression_stats.run_level) carrying `parts`; None where tonight has none or fewer than
    MIN_RUNS history runs do. Tests every component (Holm over them), flags those that moved and
    explain more than min_effect, and attributes the iteration's change to the components."""
    # Parts that rest on too few in-situ samples (one interrupted pass sets a layer's share) are
    # no figure to test, as validation leaves such a model error out.
    past = [h for h in history if h.get("parts") and h["parts"].get("samples", 0) >= MIN_INSITU_SAMPLES]
    if not now or not now.get("parts") or now["parts"].get("samples", 0) < MIN_INSITU_SAMPLES \
            or len(past) < MIN_RUNS:
        return None
    has_canary = now.get("canary_gemm_log") is not None and all(h.get("canary_gemm_log") is not None for h in past)
    # CPU seconds only where every run has them: a history in wall seconds is no baseline for them.
    cpu = all(_has_cpu_seconds(r["parts"]) for r in [now, *past])
    raw_now, raw_hist = figures(now["parts"], None, cpu), [figures(h["parts"], None, cpu) for h in past]
    tests = {c: robust_test(v, [f[c] for f in raw_hist]) | {"basis": "raw"} for c, v in raw_now.items()
             if all(c in f for f in raw_hist)}
    # The link, as the pipeline's microbenchmark measured each primitive the configuration uses.
    comm_hist = [rcomm.figures(h.get("comm")) for h in past]
    tests |= {c: robust_test(v, [f[c] for f in comm_hist]) | {"basis": "microbenchmark"}
              for c, v in rcomm.figures(now.get("comm")).items() if all(c in f for f in comm_hist)}
    tested = {rcomm.primitive_of(c) for c in tests} - {None}
    base_fits = rcomm.baseline([h["comm"] for h in past]) if tested else {}
    comm = ({p: rcomm.as_measured(f) for p, f in base_fits.items() if p in tested},
            {p: rcomm.as_measured(now["comm"][p]) for p in tested & set(base_fits)})
    components = [c for c in tests if rcomm.primitive_of(c) is None] + sorted(comm[1])
    moved = False
    if has_canary:
        host = robust_test(now["canary_gemm_log"], [h["canary_gemm_log"] for h in past])
        moved = 2 * min(host["p_value"], 1 - host["p_value"]) < host_alpha
        rel_now = figures(now["parts"], now["canary_gemm_log"], cpu)
        rel_hist = [figures(h["parts"], h["canary_gemm_log"], cpu) for h in past]
        for c in ("compute", "update"):
            if c in tests:
                tests[c] = robust_test(rel_now[c], [f[c] for f in rel_hist]) | {"basis": "canary"}
    adjusted = gatekept({c: t["p_value"] for c, t in tests.items()})
    base = baseline_parts([h["parts"] for h in past])
    seconds = now["parts"]["seconds"]
    # CPU work in the history's host speed, as the canary says it: what the workload did, not
    # what the host did.
    speed = 1.0
    if has_canary:
        speed = math.exp(now["canary_gemm_log"] - statistics.median(h["canary_gemm_log"] for h in past))
    if cpu:  # the baseline's wall time of each CPU part, moved as its CPU seconds moved tonight
        base_cpu = baseline_parts([{"seconds": h["parts"]["cpu_seconds"]} for h in past])
        now_cpu = now["parts"]["cpu_seconds"]
        seconds = {k: base[k] * now_cpu[k] * speed / base_cpu[k] if k in now_cpu and base_cpu.get(k, 0) > 0
                   and k in base else v for k, v in seconds.items()}
    else:
        seconds = {k: v if k == "data" else v * speed for k, v in seconds.items()}
    try:
        attribution = attribute(seconds, base, predict, components, comm)
    except (KeyError, ValueError):  # the model cannot take these parts: they explain what they add up to
        predict = None
        attribution = attribute(seconds, base, None, components, comm)
    explains = {r["component"]: r["explains"] for r in attribution}
    rows = [{"component": c, "basis": t["basis"], "change": t["change"], "p_value": t["p_value"],
             "p_adjusted": adjusted[c],
             "explains": explains.get(rcomm.primitive_of(c) or c, 0.0),
             "flagged": adjusted[c] < alpha and _effect(c, explains) > min_effect}
            for c, t in tests.items()]
    rows.sort(key=lambda r: r["p_adjusted"])
    return {"tests": rows, "flagged": _named_first(rows),
            "attribution": [r for r in attribution if r["component"] != ALL],
            "explained": explains.get(ALL, 0.0), "model": predict is not None,
            "host_moved": moved, "work": "cpu" if cpu else "wall",
            "samples": now["parts"].get("samples"), "history_runs": len(past), "method": "closed testing, Holm"}


def _effect(component: str, explains: dict[str, float]) -> float:
    """What a component explains, as min_effect judges it: a layer's share by its forward and
    backward together. A slower layer (a kernel, a shape) slows both passes, each tested apart,
    so either pass alone would hold half of the layer's change to the whole threshold."""
    if not component.endswith(" share"):
        return explains.get(rcomm.primitive_of(component) or component, 0.0)
    layer = _layer_of(component)
    return sum(explains.get(f"{phase} {layer} share", 0.0) for phase in ("forward", "backward"))


def _has_cpu_seconds(parts: dict[str, Any]) -> bool:
    """Whether a run's parts carry CPU seconds for each of its CPU parts (the layers' phases, the update)."""
    work = {k for k in parts["seconds"] if k.startswith(("forward ", "backward ")) or k == "update"}
    return any(k != "update" for k in work) and work <= set(parts.get("cpu_seconds") or {})


def _named_first(rows: list[dict[str, Any]]) -> list[str]:
    """The flagged components, the one that explains most first. The whole compute yields to the
    flagged layer shares where their layers (forward and backward, flagged or not: a slower layer
    moves both, each a part of the compute's change) explain at least half of what it does: the
    compute moved because those layers did."""
    order = sorted((r for r in rows if r["flagged"]), key=lambda r: -r["explains"])
    compute = next((r for r in order if r["component"] == "compute"), None)
    layers = [r for r in order if r["component"].endswith(" share")]
    names = {_layer_of(r["component"]) for r in layers}
    theirs = sum(r["explains"] for r in rows
                 if r["component"].endswith(" share") and _layer_of(r["component"]) in names)
    if compute and layers and theirs >= compute["explains"] / 2:
        order.remove(compute)
        order.insert(order.index(layers[-1]) + 1, compute)
    return [r["component"] for r in order]


def _layer_of(share: str) -> str:
    """The layer a share names: "backward blocks.2 share" -> "blocks.2"."""
    return share.removesuffix(" share").split(" ", 1)[1]
