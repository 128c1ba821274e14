#!/usr/bin/env bash
# The ExGRPO services on this machine: PostgreSQL databases and roles, an MLflow tracking server
# (PostgreSQL backend, local artifact root), a Prefect server (its own PostgreSQL database), the
# process work pool and a worker.
#
#   infra/services.sh up        start everything that is not running (idempotent)
#   infra/services.sh down      stop worker, Prefect and MLflow (PostgreSQL stays up)
#   infra/services.sh status    one line per service; exit 1 if any is not running
#   infra/services.sh env       the exports a user sources: eval "$(infra/services.sh env)"
#   infra/services.sh drop --yes   drop this prefix's three databases (after `down`)
#   infra/services.sh db        only the PostgreSQL part of `up` (databases, roles, migrations)
#   infra/services.sh serve mlflow|prefect|worker   one service in the foreground (containers)
#
# Settings (ports, paths, names, optional passwords): infra/config.sh, all from env vars.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/config.sh"
source "$HERE/postgres.sh"
source "$HERE/procs.sh"

check_settings() {
  local v
  [[ "$EXGRPO_DB_PREFIX" =~ ^[a-z_][a-z0-9_]{0,40}$ ]] \
    || { echo "EXGRPO_DB_PREFIX must be lower-case letters, digits, _ (got '$EXGRPO_DB_PREFIX')" >&2; exit 2; }
  for v in EXGRPO_PG_PORT EXGRPO_MLFLOW_PORT EXGRPO_PREFECT_PORT; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "$v must be a port number (got '${!v}')" >&2; exit 2; }
  done
  [[ -x "$EXGRPO_PYTHON" ]] \
    || { echo "EXGRPO_PYTHON=$EXGRPO_PYTHON is not executable (run scripts/setup.sh first)" >&2; exit 2; }
}

service_env() {  # `env` arguments of every service process and Prefect CLI call
  ENV=(env -u PREFECT_PROFILE -u PGPASSWORD -u EXGRPO_MLFLOW_ADMIN_PASSWORD -u EXGRPO_PREFECT_AUTH_STRING
       -u EXGRPO_TRAIN_PASSWORD -u EXGRPO_DASHBOARD_PASSWORD -u EXGRPO_SERVICES_PASSWORD
       -u EXGRPO_MLFLOW_READER_PASSWORD
       PREFECT_HOME="$EXGRPO_STATE_DIR/prefect-home"
       PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_API_URL="$EXGRPO_PREFECT_API_URL")
  [[ -f "$EXGRPO_PGPASSFILE" ]] && ENV+=(PGPASSFILE="$EXGRPO_PGPASSFILE")
  return 0
}

with_secrets() {  # with_secrets VAR=SOURCE...: CMD runs with VAR set to the value of $SOURCE (those set),
  # through the environment (a `bash -c` that names the variables only), never on a command line
  local pair src script=""
  for pair in "$@"; do
    src="${pair#*=}"
    [[ -n "${!src:-}" ]] && script+="export ${pair%%=*}=\"\$$src\"; "
  done
  [[ -z "$script" ]] || CMD=(bash -c "$script"'exec "$@"' _ "${CMD[@]}")
  return 0
}

mlflow_auth() {  # EXGRPO_MLFLOW_ADMIN_PASSWORD set: MLflow's basic-auth app (config file, Flask secret key)
  [[ -n "${EXGRPO_MLFLOW_ADMIN_PASSWORD:-}" ]] || return 0
  local ini="$EXGRPO_STATE_DIR/mlflow-auth.ini" key="$EXGRPO_STATE_DIR/mlflow-secret-key"
  [[ -s "$key" ]] || (umask 077; "$EXGRPO_PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$key")
  local users="${EXGRPO_MLFLOW_AUTH_DB_URL#sqlite:///}"  # a SQLite users file holds password hashes: owner only
  if [[ "$users" != "$EXGRPO_MLFLOW_AUTH_DB_URL" ]]; then (umask 077; touch "$users"); chmod 600 "$users"; fi
  # one worker (--workers 1), so its login cache sees every password change: one PBKDF2 check a minute per user
  printf '[mlflow]\ndefault_permission = READ\ndatabase_uri = %s\nadmin_username = %s\n%s\n%s\n' \
    "$EXGRPO_MLFLOW_AUTH_DB_URL" "$EXGRPO_MLFLOW_ADMIN_USER" "auth_cache_ttl_seconds = 60" \
    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth" > "$ini"
  # the admin's password and the key reach MLflow through its environment, read from ours and the key file
  CMD=(bash -c 'export MLFLOW_AUTH_ADMIN_PASSWORD="$EXGRPO_MLFLOW_ADMIN_PASSWORD"
export MLFLOW_FLASK_SERVER_SECRET_KEY="$(cat "$1")"; exec "${@:2}"' _ "$key"
       "${CMD[@]:0:${#ENV[@]}}" MLFLOW_AUTH_CONFIG_PATH="$ini" "${CMD[@]:${#ENV[@]}}" --app-name basic-auth)
}

# One command line per service, used both by `up` (background, pid file) and by `serve NAME`
# (foreground: docker-compose runs exactly these).
mlflow_cmd() {
  mkdir -p "$EXGRPO_MLFLOW_ARTIFACTS"
  service_env
  CMD=("${ENV[@]}" "$EXGRPO_PYTHON" -m mlflow server --backend-store-uri "$EXGRPO_MLFLOW_DB_URL"
       --artifacts-destination "$EXGRPO_MLFLOW_ARTIFACTS" --serve-artifacts
       --host "$EXGRPO_MLFLOW_HOST" --port "$EXGRPO_MLFLOW_PORT" --workers 1)
  [[ -n "${EXGRPO_MLFLOW_ALLOWED_HOSTS:-}" ]] && CMD+=(--allowed-hosts "$EXGRPO_MLFLOW_ALLOWED_HOSTS")
  mlflow_auth
}

prefect_cmd() {
  mkdir -p "$EXGRPO_STATE_DIR/prefect-home"
  service_env
  CMD=("${ENV[@]}" PREFECT_API_DATABASE_CONNECTION_URL="$EXGRPO_PREFECT_DB_URL"
       "$EXGRPO_PYTHON" -m prefect server start --host "$EXGRPO_PREFECT_HOST" --port "$EXGRPO_PREFECT_PORT")
  with_secrets PREFECT_SERVER_API_AUTH_STRING=EXGRPO_PREFECT_AUTH_STRING
}

worker_cmd() {  # the worker creates the process pool when it does not exist yet
  # Flow runs are children of the worker and inherit these: where the code, the experience DB
  # (training role) and MLflow are.
  service_env
  CMD=("${ENV[@]}" EXGRPO_REPO_DIR="$EXGRPO_REPO_DIR" EXGRPO_DB_URL="$EXGRPO_EXPERIENCE_URL"
       MLFLOW_TRACKING_URI="$EXGRPO_MLFLOW_URL"
       "$EXGRPO_PYTHON" -m prefect worker start --pool "$EXGRPO_WORK_POOL" --type process --name "$WORKER_NAME")
  [[ -z "${EXGRPO_MLFLOW_ADMIN_PASSWORD:-}" ]] || CMD=("${CMD[@]:0:${#ENV[@]}}" \
    MLFLOW_TRACKING_USERNAME="$EXGRPO_MLFLOW_ADMIN_USER" "${CMD[@]:${#ENV[@]}}")
  with_secrets PREFECT_API_AUTH_STRING=EXGRPO_PREFECT_AUTH_STRING MLFLOW_TRACKING_PASSWORD=EXGRPO_MLFLOW_ADMIN_PASSWORD
}

mlflow_reader() {  # the dashboard's read-only MLflow login (EXGRPO_MLFLOW_READER_PASSWORD): created or its
  # password set, through the admin's login; MLflow's default permission (READ) is all it gets
  [[ -n "${EXGRPO_MLFLOW_ADMIN_PASSWORD:-}" && -n "${EXGRPO_MLFLOW_READER_PASSWORD:-}" ]] || return 0
  EXGRPO_MLFLOW_READER_USER="$EXGRPO_MLFLOW_READER_USER" EXGRPO_MLFLOW_ADMIN_USER="$EXGRPO_MLFLOW_ADMIN_USER" \
  "$EXGRPO_PYTHON" - "$EXGRPO_MLFLOW_URL" <<'PY' \
    || { echo "mlflow: could not set up the read-only login" >&2; return 1; }
import base64, json, os, sys, urllib.error, urllib.request
admin = f"{os.environ['EXGRPO_MLFLOW_ADMIN_USER']}:{os.environ['EXGRPO_MLFLOW_ADMIN_PASSWORD']}"
user, password = os.environ["EXGRPO_MLFLOW_READER_USER"], os.environ["EXGRPO_MLFLOW_READER_PASSWORD"]
def call(method, path, body):
    req = urllib.request.Request(sys.argv[1] + path, data=json.dumps(body).encode(), method=method, headers={
        "Content-Type": "application/json", "Authorization": "Basic " + base64.b64encode(admin.encode()).decode()})
    with urllib.request.urlopen(req, timeout=90) as r:
        return r.status
try:
    call("POST", "/api/2.0/mlflow/users/create", {"username": user, "password": password})
except urllib.error.HTTPError:  # it exists: its password is the one given now
    call("PATCH", "/api/2.0/mlflow/users/update-password", {"username": user, "password": password})
PY
  echo "mlflow: read-only login $EXGRPO_MLFLOW_READER_USER (the dashboard's)"
}

worker_online() {  # worker_online [SINCE_EPOCH]: the pool lists our worker ONLINE, heartbeat after SINCE
  "$EXGRPO_PYTHON" - "$EXGRPO_PREFECT_API_URL/work_pools/$EXGRPO_WORK_POOL/workers/filter" \
    "$WORKER_NAME" "${1:-0}" <<'PY' 2>/dev/null
import base64, json, os, sys, urllib.request
from datetime import datetime
auth = os.environ.get("EXGRPO_PREFECT_AUTH_STRING")
req = urllib.request.Request(sys.argv[1], data=b"{}", headers={"Content-Type": "application/json", **(
    {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {})})
with urllib.request.urlopen(req, timeout=5) as r:
    workers = [w for w in json.load(r) if w["name"] == sys.argv[2] and w["status"] == "ONLINE"]
beats = [datetime.fromisoformat(w["last_heartbeat_time"]).timestamp() for w in workers]
sys.exit(0 if any(t >= float(sys.argv[3]) for t in beats) else 1)
PY
}

wait_worker() {
  local deadline=$((SECONDS + 90)) log since; log="$(_logfile worker)"
  since="$(stat -c %Y "$(_pidfile worker)")"  # a heartbeat from this worker process, not an old one
  while (( SECONDS < deadline )); do
    proc_alive worker || { echo "worker: exited; last lines of $log:" >&2; tail -n 25 "$log" >&2; return 1; }
    worker_online "$since" && { echo "worker: online in pool $EXGRPO_WORK_POOL (log $log)"; return 0; }
    sleep 1
  done
  echo "worker: no heartbeat in pool $EXGRPO_WORK_POOL after 90 s; see $log" >&2
  return 1
}

print_env() {
  echo "export EXGRPO_DB_URL='$EXGRPO_EXPERIENCE_URL'"
  echo "export EXGRPO_DASHBOARD_DB_URL='$EXGRPO_DASHBOARD_DB_URL'"
  echo "export MLFLOW_TRACKING_URI='$EXGRPO_MLFLOW_URL'"
  echo "export PREFECT_API_URL='$EXGRPO_PREFECT_API_URL'"
  echo "export EXGRPO_REPO_DIR='$EXGRPO_REPO_DIR'"
  echo "export EXGRPO_WORK_POOL='$EXGRPO_WORK_POOL'"
  [[ -f "$EXGRPO_PGPASSFILE" ]] && echo "export PGPASSFILE='$EXGRPO_PGPASSFILE'; unset PGPASSWORD  # the roles' passwords"
  # logins: the secrets by reference to the variables that hold them, never their values
  [[ -n "${EXGRPO_PREFECT_AUTH_STRING:-}" ]] && echo 'export PREFECT_API_AUTH_STRING="$EXGRPO_PREFECT_AUTH_STRING"'
  [[ -n "${EXGRPO_MLFLOW_ADMIN_PASSWORD:-}" ]] && echo "export MLFLOW_TRACKING_USERNAME='$EXGRPO_MLFLOW_ADMIN_USER'" \
    && echo 'export MLFLOW_TRACKING_PASSWORD="$EXGRPO_MLFLOW_ADMIN_PASSWORD"'
  # the dashboard reads MLflow as the read-only login instead (flows/dashboard_gate.py)
  [[ -n "${EXGRPO_MLFLOW_READER_PASSWORD:-}" ]] \
    && echo "export EXGRPO_MLFLOW_READER_USER='$EXGRPO_MLFLOW_READER_USER'" \
    && echo 'export EXGRPO_MLFLOW_READER_PASSWORD="$EXGRPO_MLFLOW_READER_PASSWORD"'
  return 0
}

WORKER_NAME="exgrpo-worker-$EXGRPO_DB_PREFIX"
cmd="${1:-}"
check_settings
case "$cmd" in
  up)
    mkdir -p "$EXGRPO_STATE_DIR"
    trap stop_launched_on_failure EXIT
    pg_ensure_running
    pg_setup
    pg_migrate
    mlflow_cmd; proc_launch mlflow "$EXGRPO_MLFLOW_URL/health" "${CMD[@]}"
    prefect_cmd; proc_launch prefect "$EXGRPO_PREFECT_API_URL/health" "${CMD[@]}"
    proc_wait mlflow "$EXGRPO_MLFLOW_URL/health"   # the two servers start in parallel (20-60 s each)
    proc_wait prefect "$EXGRPO_PREFECT_API_URL/health"
    mlflow_reader
    worker_cmd; proc_launch worker - "${CMD[@]}"
    wait_worker
    echo "all services up; use them with: eval \"\$($0 env)\""
    ;;
  db)
    mkdir -p "$EXGRPO_STATE_DIR"
    pg_ensure_running && pg_setup && pg_migrate
    ;;
  serve)
    case "${2:-}" in
      mlflow|prefect|worker)
        mkdir -p "$EXGRPO_STATE_DIR"
        # a container given its own role's password writes a pass file with that role only
        pws="${EXGRPO_TRAIN_PASSWORD:-}${EXGRPO_DASHBOARD_PASSWORD:-}${EXGRPO_SERVICES_PASSWORD:-}"
        [[ -z "$pws" ]] || _write_pgpass
        "${2}_cmd"; exec "${CMD[@]}" ;;
      *) echo "usage: $0 serve mlflow|prefect|worker" >&2; exit 2 ;;
    esac
    ;;
  down)
    proc_stop worker & proc_stop prefect & proc_stop mlflow & wait  # each may take up to 20 s
    echo "PostgreSQL stays up (shared cluster); '$0 drop --yes' removes this prefix's databases"
    ;;
  status)
    rc=0
    pg_status || rc=1
    proc_status mlflow "$EXGRPO_MLFLOW_URL" "$EXGRPO_MLFLOW_URL/health" || rc=1
    proc_status prefect "$EXGRPO_PREFECT_API_URL" "$EXGRPO_PREFECT_API_URL/health" || rc=1
    proc_status worker "pool $EXGRPO_WORK_POOL" - && worker_online || rc=1
    exit $rc
    ;;
  env) print_env ;;
  drop)
    [[ "${2:-}" == --yes ]] || { echo "drop deletes $EXGRPO_DB_PREFIX's databases; run: $0 drop --yes" >&2; exit 2; }
    if proc_alive mlflow || proc_alive prefect || proc_alive worker; then
      echo "services are still running; run '$0 down' first" >&2; exit 1
    fi
    pg_ensure_running
    pg_drop
    ;;
  *)
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
