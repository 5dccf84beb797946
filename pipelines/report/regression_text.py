"""The regression check in words: its one-line verdict (the report, the CLI, the tags) and the
report's regression section with its table, power and components (docs/regression.md)."""

from __future__ import annotations

from typing import Any

from pipelines.report.regression import INJECTED, STATISTIC


def describe(check: dict[str, Any]) -> str:
    """One line: what the check concluded, for the report, the CLI and the logs."""
    k, m = check["history_runs"], check["min_history"]
    if check["status"] == "no-baseline":
        return "no history: no earlier FINISHED run of this spec hash on this hardware (or MLflow unreachable)"
    if check["status"] == "short-history":
        return f"history too short ({k} of {m} runs)"
    if check["status"] == "inconclusive":
        return f"no verdict against {k} history runs: {check['abstained']}"
    found, gone = len(check["regressions"]), len(check.get("unconfirmed") or [])
    said = f"{found} regression(s) against {k} history runs" if found else f"no regression against {k} history runs"
    return said + (f" ({gone} alarm(s) not confirmed by a rerun)" if gone else "")


def markdown(check: dict[str, Any], spec: Any) -> list[str]:
    """The report's regression section."""
    md = [
        "## Regression check",
        "",
        f"Statistic: {STATISTIC}. alpha {spec.alpha:.3g}, min_effect {spec.min_effect:.0%} slowdown, "
        f"prediction error rise > {spec.prediction_error_rise:.3g}; history up to {spec.history} runs, "
        f"at least {spec.min_history}.",
        "",
    ]
    if check[INJECTED]:
        md += [
            f"**Injected slowdown: {check[INJECTED]:g} ms per iteration** (a test of this alarm, not a "
            "measurement; later runs leave it out of their history).",
            "",
        ]
    md.append(f"Result: **{check['status']}**, {describe(check)}.")
    if check["checks"]:
        md += [
            "",
            "| config | figure | history median | now | change raw [95% CI] | change vs canary [95% CI] | p-value "
            "| detectable | rerun | regressed |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        md += [_row(c) for c in check["checks"]]
        md += ["", *power_lines(check)]
        lines = [f"- {c['config']}: {line(c)}" for c in check["checks"] if c.get("components")]
        if lines:
            md += ["", "Components (each against its history, Holm over a config's components; what each "
                   "explains of the iteration, by the model re-predicting the baseline with tonight's value "
                   "of it alone):", "", *lines]
        steps = [(c["config"], p) for c in check["checks"] for p in c.get("change_points") or []]
        if steps:
            md += ["", "Change points in the history (E-divisive style: least-squares split, permutation "
                   "p < 0.01):", ""]
            md += [f"- {cfg}: a step of {p['change']:+.1%} at {p['run_key']} (p {p['p_value']:.2g})"
                   for cfg, p in steps]
    return md


def _pct(t: dict[str, Any] | None) -> str:
    if not t:
        return "-"
    lo, hi = t["effect_ci"]
    return f"{t['effect']:+.1%} [{lo:+.1%}, {hi:+.1%}]"


def _rerun(c: dict[str, Any]) -> str:
    conf = c.get("confirmation")
    if not conf:
        return "-"
    if conf.get("status") != "FINISHED":
        return "rerun failed"
    return f"{conf['effect']:+.1%}, p {conf['p_value']:.2g}: {'agrees' if conf['confirmed'] else 'does not agree'}"


def _row(c: dict[str, Any]) -> str:
    if c["p_value"] is None:
        short = f"history too short ({c['history_runs']} runs)"
        return f"| {c['config']} | {c['figure']} | - | - | {short} | - | - | - | - | no |"
    regressed = "**yes**" if c["regressed"] else ("no (rerun disagrees)" if c.get("unconfirmed") else "no")
    if c["figure"] != "throughput_samples_per_s":
        lo, hi = c["effect_ci"]
        change, norm, detect = f"{c['change']:+.3g} [{lo:+.3g}, {hi:+.3g}]", "-", "-"
    else:
        change, norm, detect = _pct(c.get("raw")), _pct(c.get("normalised")), f"{c['detectable_slowdown']:.0%}"
    return (f"| {c['config']} | {c['figure']} | {c['baseline']:.4g} | {c['now']:.4g} | {change} | {norm} "
            f"| {c['p_value']:.2g} | {detect} | {_rerun(c)} | {regressed} |")


def power_lines(check: dict[str, Any]) -> list[str]:
    """Per tested config, the alarm's power: the smallest slowdown caught with 95% probability."""
    out = []
    for c in check["checks"]:
        if c.get("detectable_slowdown") is None:
            continue
        basis = "relative to the canary" if c["basis"] == "canary" else "raw"
        host = ""
        if c.get("host_p_value") is not None:
            moved = "moved" if c["basis"] == "canary" else "within its spread"
            host = (f"; the host's canary ran {c['host_change']:+.0%} against the history, "
                    f"p {c['host_p_value']:.2g}: {moved}")
        out.append(f"- {c['config']}: this run would have caught a slowdown of {c['detectable_slowdown']:.0%} or "
                   f"more (95% probability at alpha {c['alpha']:.3g}, {basis}, {c['history_runs']} history runs{host})")
    return out


def line(check: dict[str, Any]) -> str:
    """One line a person reads: "iteration +11.2% [+8.9, +13.5]: backward blocks.2 share +38%
    explains +9.4 points; host canary -0.8%"."""
    parts = []
    effect, ci = check.get("effect"), check.get("effect_ci")
    if effect is not None:
        head = f"iteration {_signed(-effect / (1 + effect))}"  # throughput's change, as the iteration's
        if ci:
            lo, hi = (-c / (1 + c) for c in reversed(ci))
            head += f" [{_signed(lo)}, {_signed(hi)}]"
        parts.append(head)
    comp = check.get("components") or {}
    named = [r for r in comp.get("attribution", []) if r["component"] in comp.get("flagged", [])][:2]
    named = named or comp.get("attribution", [])[:1]
    said = [f"{r['component']} {_signed(r['change'])} explains {r['explains'] * 100:+.1f} points" for r in named]
    if check.get("host_change") is not None:
        said.append(f"host canary {_signed(check['host_change'])}")
    return ": ".join([", ".join(parts) or "components"] + (["; ".join(said)] if said else []))


def _signed(x: float) -> str:
    return f"{x * 100:+.1f}%"
