#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv. Idempotent:
# a second run with nothing changed takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ddlbench-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch 2.14.1 and torchvision 0.29.1 come from this machine's local wheel store.
  .venv/bin/python -m pip install -q -e ".[tracking,airflow,cluster,dev]"
  touch "$stamp"
fi
