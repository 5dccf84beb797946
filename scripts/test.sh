#!/usr/bin/env bash
# Set up, then run the whole test suite (slow real-cluster tests included); arguments go to
# pytest (`-m "not slow"`: the tier for a change). Prints the tests' wall time at the end.
#
# Tests run on every CPU (pytest-xdist, `-n auto`) unless the selection may hold a test marked
# `alone`, which reads the timings of real jobs: then one process runs them all (tests/conftest.py
# decides from `-m`). With no arguments the suite runs in two parts: the tier for a change on
# every CPU, then the slow tests in one process (docs/testing.md says why not yet two at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
start=$(date +%s)
rc=0
pytest() {
  local part=$(date +%s) code=0
  .venv/bin/python -m pytest -n auto "$@" || code=$?
  echo "scripts/test.sh: pytest $* took $(( $(date +%s) - part )) s wall, exit $code"
  [ "$rc" -ne 0 ] || rc=$code
}
if [ $# -eq 0 ]; then
  pytest -m "not slow"
  pytest -m slow
  echo "scripts/test.sh: pytest (the whole suite) took $(( $(date +%s) - start )) s wall, exit $rc"
else
  pytest "$@"
fi
exit $rc
