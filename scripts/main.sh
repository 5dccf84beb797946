#!/usr/bin/env bash
# Set up, then run the main job on the embedded defaults: the nightly benchmark
# DAG `ddlbench_nightly` once, through Airflow (`airflow dags test`, no scheduler)
# against a SQLite Airflow home inside the project's home, on the demo spec
# (specs/demo.yaml: the small GPT, SSGD vs ASGD vs OD-SGD, local provider, SQLite MLflow)
# or the spec given as the one argument (`bash scripts/main.sh specs/smoke.yaml`); then
# print the comparison and how to open the MLflow UI. Everything lands in
# ${DDLBENCH_HOME:-<repo>/.ddlbench}: airflow/, runs/<run key>/, mlflow.db, mlartifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

repo=$PWD
export DDLBENCH_HOME=${DDLBENCH_HOME:-$repo/.ddlbench}
export AIRFLOW_HOME=$DDLBENCH_HOME/airflow
export AIRFLOW__CORE__DAGS_FOLDER=$repo/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=sqlite:///$AIRFLOW_HOME/airflow.db
unset MLFLOW_TRACKING_URI  # the embedded default: sqlite:///$DDLBENCH_HOME/mlflow.db
mkdir -p "$AIRFLOW_HOME"
airflow=$repo/.venv/bin/airflow
log=$DDLBENCH_HOME/main-airflow.log

echo "== Airflow home $AIRFLOW_HOME (log: $log)"
# Both are idempotent; the migration takes a few seconds the first time only.
"$airflow" db migrate >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
"$airflow" pools import infra/deploy/airflow/pools.json >>"$log" 2>&1 || { tail -40 "$log"; exit 1; }

spec=$(realpath -m "${1:-$repo/specs/demo.yaml}")
[ -f "$spec" ] || { echo "main.sh: spec: no file $spec" >&2; exit 2; }
echo "== airflow dags test ddlbench_nightly (spec: ${spec#"$repo"/})"
conf=$(.venv/bin/python -c 'import json, sys; print(json.dumps({"spec_path": sys.argv[1], "home": sys.argv[2]}))' \
       "$spec" "$DDLBENCH_HOME")
runs=$DDLBENCH_HOME/runs
mkdir -p "$runs"
before=$(ls -1 "$runs")
"$airflow" dags test ddlbench_nightly -c "$conf" >>"$log" 2>&1 || true

# The run this command made: the nightly run directory that was not there before.
run_dir=$(comm -13 <(echo "$before") <(ls -1 "$runs") | grep '^ddlbench_nightly-' | tail -1 || true)
if [ -z "$run_dir" ]; then
  tail -60 "$log"
  echo "main.sh: the DAG run did not start (see $log)" >&2
  exit 1
fi
run_dir=$runs/$run_dir
status=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' \
         "$run_dir/status.json" 2>/dev/null || echo UNKNOWN)
echo "== run $(basename "$run_dir"): $status  (run directory: $run_dir)"
experiment=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["experiment"])' \
             "$run_dir/ctx.json" 2>/dev/null || echo ddlbench-adhoc)
experiment_id=$(.venv/bin/python -c 'import sys
from mlflow import MlflowClient
e = MlflowClient(sys.argv[1]).get_experiment_by_name(sys.argv[2])
print(e.experiment_id if e else "")' "sqlite:///$DDLBENCH_HOME/mlflow.db" "$experiment" 2>/dev/null || true)
if [ -f "$run_dir/report/report.md" ]; then
  echo "== Comparison (report: $run_dir/report/report.md)"
  [ -t 1 ] || export COLUMNS=${COLUMNS:-100}  # rich tables are 80 wide when not on a terminal
  .venv/bin/ddlbench compare --suite "${experiment#ddlbench-}" --home "$DDLBENCH_HOME" || cat "$run_dir/report/report.md"
  # The model's predictions against this run's measured iterations (the report's section, to
  # its interval table).
  sed -n '/^## Predicted vs measured/,/^### /{/^### /!p}' "$run_dir/report/report.md"
fi
cat <<MSG

== Open the MLflow UI to compare runs side by side (experiment $experiment):
   $repo/.venv/bin/mlflow ui --backend-store-uri sqlite:///$DDLBENCH_HOME/mlflow.db --host 127.0.0.1 --port 5000
   then browse http://127.0.0.1:5000/#/experiments/${experiment_id:-0}/runs
   (the runs table: expand the pipeline's run for its training runs; Group by: ddlbench.config
   gathers each configuration's repeats; select runs and Compare for the compare view)
   The scheduler itself, with this home: bash infra/deploy/airflow/standalone.sh
MSG
if [ "$status" != FINISHED ]; then
  grep -E "ERROR|Error|Traceback" "$log" | tail -20 || true
  echo "main.sh: the DAG run ended $status (Airflow log: $log)" >&2
  exit 1
fi
