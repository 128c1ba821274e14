# Settings shared by the infra scripts: every port, path and name has an env override.
# Sourced, not run. Secrets (role passwords) are read from the environment only and never printed.

EXGRPO_REPO_DIR="${EXGRPO_REPO_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
EXGRPO_PYTHON="${EXGRPO_PYTHON:-$EXGRPO_REPO_DIR/.venv/bin/python}"
EXGRPO_STATE_DIR="${EXGRPO_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/exgrpo}"

# PostgreSQL: an existing cluster; the admin role creates databases and roles.
EXGRPO_PG_HOST="${EXGRPO_PG_HOST:-127.0.0.1}"
EXGRPO_PG_PORT="${EXGRPO_PG_PORT:-5432}"
EXGRPO_PG_ADMIN="${EXGRPO_PG_ADMIN:-postgres}"          # password, if any: PGPASSWORD or ~/.pgpass
EXGRPO_DB_PREFIX="${EXGRPO_DB_PREFIX:-exgrpo}"          # databases <prefix>_experience/_mlflow/_prefect
EXGRPO_TRAIN_ROLE="${EXGRPO_TRAIN_ROLE:-exgrpo_train}"            # read/write, owns the experience schema
EXGRPO_DASHBOARD_ROLE="${EXGRPO_DASHBOARD_ROLE:-exgrpo_dashboard}"  # read-only on the experience DB
EXGRPO_SERVICES_ROLE="${EXGRPO_SERVICES_ROLE:-exgrpo_services}"    # owns the MLflow and Prefect DBs
# Optional passwords: EXGRPO_TRAIN_PASSWORD, EXGRPO_DASHBOARD_PASSWORD, EXGRPO_SERVICES_PASSWORD.
# When set they are applied to the roles and written to $EXGRPO_STATE_DIR/pgpass (mode 600), which
# libpq (psycopg) and asyncpg read through PGPASSFILE, so no URL ever contains a password.

# MLflow tracking server and Prefect server + worker.
EXGRPO_MLFLOW_HOST="${EXGRPO_MLFLOW_HOST:-127.0.0.1}"
EXGRPO_MLFLOW_PORT="${EXGRPO_MLFLOW_PORT:-5000}"
EXGRPO_MLFLOW_ARTIFACTS="${EXGRPO_MLFLOW_ARTIFACTS:-$EXGRPO_STATE_DIR/mlflow-artifacts}"
# EXGRPO_MLFLOW_ALLOWED_HOSTS: Host headers MLflow accepts when bound beyond localhost (e.g. mlflow:5000)
EXGRPO_PREFECT_HOST="${EXGRPO_PREFECT_HOST:-127.0.0.1}"
EXGRPO_PREFECT_PORT="${EXGRPO_PREFECT_PORT:-4200}"
EXGRPO_WORK_POOL="${EXGRPO_WORK_POOL:-exgrpo-process}"
# Logins (infra/README.md, "Logins"), off unless set; read from the environment only, never printed:
# EXGRPO_MLFLOW_ADMIN_PASSWORD: MLflow's basic-auth app (users in $EXGRPO_STATE_DIR/mlflow-auth.db);
#   the worker logs in as EXGRPO_MLFLOW_ADMIN_USER (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD).
# EXGRPO_PREFECT_AUTH_STRING: `user:password` every Prefect API call must carry (server:
#   PREFECT_SERVER_API_AUTH_STRING; worker and `env`: PREFECT_API_AUTH_STRING).
EXGRPO_MLFLOW_ADMIN_USER="${EXGRPO_MLFLOW_ADMIN_USER:-admin}"
# EXGRPO_MLFLOW_READER_PASSWORD: the dashboard's read-only MLflow login, user EXGRPO_MLFLOW_READER_USER
#   (`up` creates it; `env` exports it, and `exgrpo dashboard` reads MLflow with it, never as the admin)
EXGRPO_MLFLOW_READER_USER="${EXGRPO_MLFLOW_READER_USER:-exgrpo_reader}"
EXGRPO_MLFLOW_AUTH_DB_URL="${EXGRPO_MLFLOW_AUTH_DB_URL:-sqlite:///$EXGRPO_STATE_DIR/mlflow-auth.db}"  # its users
EXGRPO_START_TIMEOUT="${EXGRPO_START_TIMEOUT:-180}"      # seconds to wait for a server's health check

EXGRPO_DB_EXPERIENCE="${EXGRPO_DB_PREFIX}_experience"
EXGRPO_DB_MLFLOW="${EXGRPO_DB_PREFIX}_mlflow"
EXGRPO_DB_PREFECT="${EXGRPO_DB_PREFIX}_prefect"
_pg="${EXGRPO_PG_HOST}:${EXGRPO_PG_PORT}"
EXGRPO_EXPERIENCE_URL="postgresql+psycopg://${EXGRPO_TRAIN_ROLE}@${_pg}/${EXGRPO_DB_EXPERIENCE}"
# the dashboard's read-only database URL (EXGRPO_DASHBOARD_URL is its web address, for links)
EXGRPO_DASHBOARD_DB_URL="postgresql+psycopg://${EXGRPO_DASHBOARD_ROLE}@${_pg}/${EXGRPO_DB_EXPERIENCE}"
# The two servers' own databases (the tests point them at SQLite files)
_services_pg="${EXGRPO_SERVICES_ROLE}@${_pg}"
EXGRPO_MLFLOW_DB_URL="${EXGRPO_MLFLOW_DB_URL:-postgresql+psycopg://${_services_pg}/${EXGRPO_DB_MLFLOW}}"
EXGRPO_PREFECT_DB_URL="${EXGRPO_PREFECT_DB_URL:-postgresql+asyncpg://${_services_pg}/${EXGRPO_DB_PREFECT}}"
# Where clients reach the servers (differs from the bind host in containers: http://mlflow:5000).
EXGRPO_MLFLOW_URL="${EXGRPO_MLFLOW_URL:-http://${EXGRPO_MLFLOW_HOST}:${EXGRPO_MLFLOW_PORT}}"
EXGRPO_PREFECT_API_URL="${EXGRPO_PREFECT_API_URL:-http://${EXGRPO_PREFECT_HOST}:${EXGRPO_PREFECT_PORT}/api}"
EXGRPO_PGPASSFILE="$EXGRPO_STATE_DIR/pgpass"
