#!/usr/bin/env bash
# The real scheduler on this machine: `airflow standalone` (scheduler, DAG processor,
# triggerer, API server + UI on 127.0.0.1:8080) and the MLflow UI on 127.0.0.1:5000,
# both against the project's home (infra/deploy/airflow/env.sh). Pools come from the
# committed pools.json. Stop with Ctrl-C (it stops the MLflow UI too).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bash "$repo/scripts/setup.sh"
. "$here/env.sh"
venv=$repo/.venv/bin

"$venv/airflow" db migrate >/dev/null
"$venv/airflow" pools import "$here/pools.json"

mlflow_uri=${MLFLOW_TRACKING_URI:-sqlite:///$DDLBENCH_HOME/mlflow.db}
if [[ $mlflow_uri == http* ]]; then
  echo "MLflow: runs go to the tracking server at $mlflow_uri"
else
  "$venv/mlflow" ui --backend-store-uri "$mlflow_uri" --host 127.0.0.1 --port "${MLFLOW_PORT:-5000}" \
    >"$DDLBENCH_HOME/mlflow-ui.log" 2>&1 &
  mlflow_pid=$!
  trap 'kill "$mlflow_pid" 2>/dev/null || true' EXIT
  echo "MLflow UI: http://127.0.0.1:${MLFLOW_PORT:-5000} (log: $DDLBENCH_HOME/mlflow-ui.log)"
fi
echo "Airflow UI: http://127.0.0.1:$AIRFLOW__API__PORT (admin password: $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated)"
"$venv/airflow" standalone
