# Source this (`. infra/deploy/airflow/env.sh`) to point Airflow and ddlbench at one home.
# Defaults: everything local under ${DDLBENCH_HOME:-<repo>/.ddlbench} with SQLite.
# A team deployment sets DDLBENCH_AIRFLOW_DB and MLFLOW_TRACKING_URI first (see README.md).
_ddlbench_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
export DDLBENCH_HOME=${DDLBENCH_HOME:-$_ddlbench_repo/.ddlbench}
export AIRFLOW_HOME=${AIRFLOW_HOME:-$DDLBENCH_HOME/airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$_ddlbench_repo/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=${DDLBENCH_AIRFLOW_DB:-sqlite:///$AIRFLOW_HOME/airflow.db}
# The API server (UI) and the task workers' Execution API only on this host.
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=${AIRFLOW__API__PORT:-8080}
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$AIRFLOW__API__PORT/execution/
# Airflow's local settings (config/airflow_local_settings.py): the scheduler imports once
# what every task imports.
export PYTHONPATH=$_ddlbench_repo/infra/deploy/airflow/config${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$AIRFLOW_HOME"
unset _ddlbench_repo
