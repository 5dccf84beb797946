#!/usr/bin/env bash
# Set up, then run the whole test suite (slow real-cluster tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
exec .venv/bin/python -m pytest "$@"
