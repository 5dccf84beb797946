#!/usr/bin/env bash
# The GPU check: run from a fresh checkout on a machine with a GPU; exit 0 only when every
# check passed. Under 8 minutes on one H200 (the checks share a 450 s budget; setting up the
# virtualenv, when there is none, comes before it).
#
#   bash scripts/gpu_check.sh [--out DIR] [--budget-s SECONDS]
#
# Checks (scripts/gpu_check.py): layer profiles of resnet50 and the transformer workload
# (gpt-mini) on CUDA, timed with CUDA events; a PS job with 1 worker and 1 shard on CUDA
# (pinned host buffers); ASGD and OD-SGD with 2 workers sharing the GPU over gloo; the
# model's memory prediction against a training run's CUDA peak of allocated bytes (reported, in
# memory.json); the microbenchmark with --device cuda (the allreduce on GPU tensors: NCCL, or gloo where the
# workers share one GPU); a `ddlbench run` of specs/gpu-check.yaml ending FINISHED with
# predictions. It writes
# DIR/summary.json (default gpu-check/): each check's status, seconds and detail.
# DDLBENCH_PYTHON: an interpreter that has ddlbench installed (skips scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${DDLBENCH_PYTHON:-}" ]; then
  py=$DDLBENCH_PYTHON
else
  bash scripts/setup.sh
  py=.venv/bin/python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" scripts/gpu_check.py "$@"
