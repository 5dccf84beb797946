#!/usr/bin/env bash
# PostgreSQL for Airflow's metadata and MLflow's store (CI and a team machine):
# Debian's postgresql, its default cluster started on 127.0.0.1:5432, a role
# `ddlbench` (password `ddlbench`, CREATEDB so tests can make throwaway
# databases) and the databases `ddlbench_airflow` and `ddlbench_mlflow`.
# Run as root. Idempotent: when the server already answers and the role and
# databases exist it only checks them (about a second).
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_common.sh"
close_inherited_fds

PG_ROLE=${DDLBENCH_PG_ROLE:-ddlbench}
PG_PASSWORD=${DDLBENCH_PG_PASSWORD:-ddlbench}
PG_DATABASES=(ddlbench_airflow ddlbench_mlflow)

if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi

# Debian's package creates the cluster when the package is installed; create it
# if an image dropped it.
if [ -z "$(pg_lsclusters -h)" ]; then
  pg_createcluster "$(ls /usr/lib/postgresql | sort -V | tail -1)" main >/dev/null
fi
read -r version cluster port status _ < <(pg_lsclusters -h | head -1)
if [ "$status" != online ]; then
  pg_ctlcluster "$version" "$cluster" start
fi
for _ in $(seq 1 50); do
  pg_isready -q -h 127.0.0.1 -p "$port" && break
  sleep 0.2
done
pg_isready -q -h 127.0.0.1 -p "$port" || { echo "postgres.sh: PostgreSQL did not start on port $port" >&2; exit 1; }

psql_admin() { su postgres -c "psql -v ON_ERROR_STOP=1 -qtA -p $port $*"; }

if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE'\"")" != 1 ]; then
  psql_admin "-c \"CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD'\""
elif [ "$(psql_admin "-c \"SELECT rolcanlogin AND rolcreatedb FROM pg_roles WHERE rolname = '$PG_ROLE'\"")" != t ]; then
  psql_admin "-c \"ALTER ROLE $PG_ROLE LOGIN CREATEDB\""
fi
for db in "${PG_DATABASES[@]}"; do
  if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = '$db'\"")" != 1 ]; then
    psql_admin "-c \"CREATE DATABASE $db OWNER $PG_ROLE\""
  fi
done
echo "postgres.sh: PostgreSQL $version on 127.0.0.1:$port; role $PG_ROLE; databases ${PG_DATABASES[*]}"
