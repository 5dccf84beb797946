#!/usr/bin/env bash
# Set up, then run the main job on the embedded defaults: a small OD-SGD vs
# SSGD vs ASGD benchmark of lenet5 on scikit-learn's digits, 2 workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=${DDLBENCH_HOME:-$PWD/.ddlbench}/runs/main
for algo in ssgd odsgd asgd; do
  servers=1; [ "$algo" = ssgd ] && servers=0
  .venv/bin/ddlbench train --algorithm "$algo" --servers "$servers" --workers 2 \
    --model lenet5 --dataset digits --batch-size 32 --steps 120 --quiet --out "$out/$algo"
done
