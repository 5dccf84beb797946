#!/usr/bin/env bash
# Set up, then run the whole test suite (slow real-cluster tests included); arguments go to
# pytest (`-m "not slow"`: the tier for a change). Prints the tests' wall time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYTHONUNBUFFERED=1
start=$(date +%s)
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
echo "scripts/test.sh: pytest ${*:-(the whole suite)} took $(( $(date +%s) - start )) s wall, exit $rc"
exit $rc
