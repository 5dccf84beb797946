#!/usr/bin/env bash
# The real scheduler on this machine: `airflow standalone` (scheduler, DAG processor,
# triggerer, API server + UI on 127.0.0.1:8080, the LocalExecutor) and the MLflow UI on
# 127.0.0.1:5000, both against the project's home (infra/deploy/airflow/env.sh). Pools come
# from the committed pools.json; both ddlbench DAGs are parsed and unpaused before it starts.
# It prints how to trigger each DAG on the smoke spec from the UI and the REST API.
# Stop with Ctrl-C (it stops the MLflow UI too).
#
# Unpaused, the nightly runs every night at 02:00 UTC, and, as Airflow does without catch-up,
# it starts the latest missed night as soon as it is unpaused (the nightly spec: several
# minutes on a CPU). DDLBENCH_NIGHTLY_SCHEDULE=none keeps it to runs triggered by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
bash "$repo/scripts/setup.sh"
. "$here/env.sh"
venv=$repo/.venv/bin
export PATH=$venv:$PATH  # `airflow standalone` starts its components as `airflow ...` from PATH

"$venv/airflow" db migrate >/dev/null
"$venv/airflow" pools import "$here/pools.json" >/dev/null
# Parse the DAGs into the metadata DB now, so they can be unpaused before the scheduler starts.
"$venv/airflow" dags reserialize >/dev/null
for dag in ddlbench_nightly ddlbench_hardware_onboarding; do
  "$venv/airflow" dags unpause "$dag" >/dev/null
done

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
api=http://127.0.0.1:$AIRFLOW__API__PORT
passwords=$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated
smoke=$repo/specs/smoke.yaml
cat <<MSG
Airflow UI: $api (user admin; its password is in $passwords once Airflow has started)
Both DAGs are unpaused: ddlbench_nightly (schedule, UTC: ${DDLBENCH_NIGHTLY_SCHEDULE:-0 2 * * *})
and ddlbench_hardware_onboarding (by hand).

Trigger from the UI: open a DAG, press Trigger, and fill in the form:
  ddlbench_nightly              spec_path = $smoke
  ddlbench_hardware_onboarding  hardware_label = my-box (the other fields as they are)

Trigger from the REST API:
  token=\$(curl -s -X POST $api/auth/token -H 'Content-Type: application/json' \\
      -d "{\"username\": \"admin\", \"password\": \"\$(python3 -c 'import json; print(json.load(open("$passwords"))["admin"])')\"}" \\
      | python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])')
  curl -s -X POST $api/api/v2/dags/ddlbench_nightly/dagRuns -H "Authorization: Bearer \$token" \\
      -H 'Content-Type: application/json' -d '{"logical_date": null, "conf": {"spec_path": "$smoke"}}'
  curl -s -X POST $api/api/v2/dags/ddlbench_hardware_onboarding/dagRuns -H "Authorization: Bearer \$token" \\
      -H 'Content-Type: application/json' -d '{"logical_date": null, "conf": {"hardware_label": "my-box"}}'
  curl -s $api/api/v2/dags/ddlbench_nightly/dagRuns -H "Authorization: Bearer \$token"   # their states

MSG
"$venv/airflow" standalone
