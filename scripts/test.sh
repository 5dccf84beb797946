#!/usr/bin/env bash
# Set up, then run the whole test suite (slow real-cluster tests included); arguments go to
# pytest (`-m "not slow"`: the tier for a change). Prints the tests' wall time at the end.
#
# A selection without slow tests runs on every CPU (pytest-xdist, `-n auto`; tests/conftest.py
# decides from `-m`); slow tests time real jobs on this host, so they run one at a time. With no
# arguments the suite runs in two parts: the tier for a change spread over the CPUs, then the slow
# tests in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
start=$(date +%s)
rc=0
if [ $# -eq 0 ]; then
  .venv/bin/python -m pytest -n auto -m "not slow" || rc=$?
  echo "scripts/test.sh: the tests not marked slow took $(( $(date +%s) - start )) s wall, exit $rc"
  slow=0
  .venv/bin/python -m pytest -m slow || slow=$?
  [ "$rc" -ne 0 ] || rc=$slow
else
  .venv/bin/python -m pytest -n auto "$@" || rc=$?
fi
echo "scripts/test.sh: pytest ${*:-(the whole suite)} took $(( $(date +%s) - start )) s wall, exit $rc"
exit $rc
