"""Look at a ddlbench run in the MLflow UI with a real (headless) browser, by hand (issue 13).

    apt-get install chromium && .venv/bin/pip install playwright   # once; no browser download
    .venv/bin/ddlbench run specs/smoke.yaml --home /tmp/ui --set repeats=2 --set steps=150
    .venv/bin/python scripts/check_mlflow_ui.py /tmp/ui/mlflow.db /tmp/ui-shots

Starts `mlflow ui` on the store, opens the experiment's runs table in Chromium (through
Playwright, with the system's chromium), and checks what a user sees, each check printed
PASS or FAIL, with a screenshot of each view under OUT:

1. runs.png: the runs table lists the pipeline's parent run and its training runs nested
   under it, and the Dataset column names the data set (each run's MLflow dataset input);
2. grouped.png: grouped by the `ddlbench.config` tag, each configuration is one group
   row holding its repeats (the runs table's "Group by"; MLflow shows min/mean/max of
   the group's metrics in its charts);
3. compare.png: the compare view of two training runs shows their params and metrics;
4. system.png: a training run's system metrics tab charts each node's own series where the
   run has them (a multi-node netns run: `system/node-<i>/...`, pipelines/tracking/node_metrics.py).

Exit status 1 when a check fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient
from playwright.sync_api import Page, sync_playwright

PORT = int(os.environ.get("DDLBENCH_UI_PORT", "5057"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def serve(db: Path) -> subprocess.Popen:
    ui = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
         "--port", str(PORT)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2)
            return ui
        except OSError:
            if ui.poll() is not None:
                raise SystemExit(f"mlflow ui exited with {ui.returncode}") from None
            time.sleep(1)
    ui.kill()
    raise SystemExit("mlflow ui did not answer /health within 120 s")


def check(name: str, ok: bool, detail: str, failures: list[str]) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def settle(page: Page, text: str) -> None:
    page.wait_for_load_state("load")  # not "networkidle": the UI polls the server
    page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)


def main() -> None:
    db, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    training = [r for r in runs if r.data.tags.get("ddlbench.config")]
    if not training:
        raise SystemExit(f"{db}: no training runs with a ddlbench.config tag")
    exp = training[0].info.experiment_id
    parent = client.get_run(training[0].data.tags["mlflow.parentRunId"])
    configs = sorted({r.data.tags["ddlbench.config"] for r in training})
    datasets = {i.dataset.name for r in training for i in (r.inputs.dataset_inputs if r.inputs else [])}
    print(f"{len(training)} training runs of {len(configs)} configurations under {parent.info.run_name!r}; "
          f"datasets {sorted(datasets)}")
    failures: list[str] = []
    ui = serve(db)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            base = f"http://127.0.0.1:{PORT}/#"

            # The runs table (MLflow 3's UI opens an experiment on the GenAI overview, whose
            # mode is a browser preference; the /runs page is the model-training table).
            page.goto(f"{base}/experiments/{exp}/runs")
            settle(page, "matching runs")
            page.screenshot(path=out / "runs.png", full_page=True)
            text = page.inner_text("body")
            listed = re.search(r"(\d+) matching runs", text)
            check("runs table", parent.info.run_name in text and listed is not None,
                  f"the parent {parent.info.run_name!r} listed; MLflow counts "
                  f"{listed.group(1) if listed else '?'} runs ({len(runs)} in the store)", failures)
            # The parent's row holds its children: the "+" button of its run-name cell shows them.
            expander = page.locator("[role=gridcell]", has_text=parent.info.run_name).locator(
                "button[data-component-id*=runnamecellrenderer]")
            if expander.count():
                expander.first.click()
                page.wait_for_timeout(1500)
                page.screenshot(path=out / "nested.png", full_page=True)
                text = page.inner_text("body")
            shown = [r.info.run_name for r in training if r.info.run_name in text]
            check("nested runs", len(shown) == len(training),
                  f"{len(shown)} of {len(training)} training runs shown under the expanded parent", failures)
            seen = sorted(d for d in datasets if d in text)
            check("dataset column", seen == sorted(datasets), f"data sets named in the table: {seen or 'none'}",
                  failures)

            group = page.get_by_role("button", name=re.compile("group", re.I))
            if group.count():
                group.first.click()
                page.wait_for_timeout(1000)
                page.get_by_text("ddlbench.config", exact=True).last.click()
                page.keyboard.press("Escape")
                page.wait_for_timeout(2500)
                page.screenshot(path=out / "grouped.png", full_page=True)
                text = page.inner_text("body")
                grouped = [c for c in configs if c in text]
                check("group by ddlbench.config", len(grouped) == len(configs),
                      f"{len(grouped)} of {len(configs)} configurations shown as groups", failures)
            else:
                check("group by ddlbench.config", False, "no Group by control found", failures)

            pair = [r.info.run_id for r in training[:2]]
            ids = ",".join(f'"{i}"' for i in pair)
            page.goto(f'{base}/compare-runs?runs=[{ids}]&experiments=["{exp}"]')
            settle(page, training[0].info.run_name)
            page.screenshot(path=out / "compare.png", full_page=True)
            text = page.inner_text("body")
            metric = next(iter(sorted(training[0].data.metrics)), "")
            check("compare view", all(client.get_run(i).info.run_name in text for i in pair) and metric in text,
                  f"both runs and the metric {metric!r} shown", failures)

            nodes = sorted({k.split("/")[1] for r in training for k in r.data.metrics
                            if k.startswith("system/node-")})
            if nodes:
                run = next(r for r in training if any(k.startswith("system/node-") for k in r.data.metrics))
                page.goto(f"{base}/experiments/{exp}/runs/{run.info.run_id}/system-metrics")
                settle(page, "cpu_utilization_percentage")
                page.wait_for_timeout(2000)
                page.screenshot(path=out / "system.png", full_page=True)
                # The tab renders its chart sections (one per prefix: `system/node-0`, ...) as
                # they scroll into view: read each one's text on the way down.
                text = ""
                for _ in range(12):
                    text += page.inner_text("body")
                    page.mouse.move(600, 500)
                    page.mouse.wheel(0, 700)
                    page.wait_for_timeout(700)
                page.screenshot(path=out / "system-end.png", full_page=True)
                sections = set(re.findall(r"system/(node-\d+)\s*\(\d+\)", text))  # "system/node-0 (4)"
                charted = [n for n in nodes if n in sections]
                check("per-node system metrics", charted == nodes,
                      f"{len(charted)} of {len(nodes)} nodes charted on their own ({', '.join(charted) or 'none'})",
                      failures)
            browser.close()
    finally:
        os.killpg(ui.pid, 15)
    print(f"screenshots in {out}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
