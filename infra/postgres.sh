# PostgreSQL part of services.sh: the cluster is up, the three databases and the roles exist.
# Sourced after config.sh. Every statement is idempotent; names are quoted with format('%I').

_psql() {  # _psql DB: run SQL from stdin as the admin role, stop at the first error
  psql -X -q -h "$EXGRPO_PG_HOST" -p "$EXGRPO_PG_PORT" -U "$EXGRPO_PG_ADMIN" -d "$1" \
    -v ON_ERROR_STOP=1 -v train="$EXGRPO_TRAIN_ROLE" -v dash="$EXGRPO_DASHBOARD_ROLE" \
    -v svc="$EXGRPO_SERVICES_ROLE" -v admin="$EXGRPO_PG_ADMIN"
}

pg_ensure_running() {
  if pg_isready -q -h "$EXGRPO_PG_HOST" -p "$EXGRPO_PG_PORT"; then return 0; fi
  if [[ "$EXGRPO_PG_HOST" =~ ^(127\.0\.0\.1|localhost)$ ]] && command -v pg_ctlcluster >/dev/null \
     && [[ -d /etc/postgresql ]]; then
    local version; version="$(ls /etc/postgresql | sort -V | tail -1)"
    echo "postgres: starting local cluster $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h "$EXGRPO_PG_HOST" -p "$EXGRPO_PG_PORT" && return 0; sleep 1; done
  fi
  echo "postgres: no server accepting connections at $EXGRPO_PG_HOST:$EXGRPO_PG_PORT" \
       "(start it, or set EXGRPO_PG_HOST/EXGRPO_PG_PORT)" >&2
  return 1
}

_sql_literal() { printf "'%s'" "${1//\'/\'\'}"; }

pg_setup() {  # roles, databases, grants; passwords from env go through stdin, never argv
  local role var pw
  {
    for role in train dash svc; do
      echo "SELECT format('CREATE ROLE %I LOGIN', :'$role')"
      echo "  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'$role') \\gexec"
    done
    for var in TRAIN DASHBOARD SERVICES; do
      pw="EXGRPO_${var}_PASSWORD"; pw="${!pw:-}"
      role="EXGRPO_${var}_ROLE"; role="${!role}"
      [[ -n "$pw" ]] && echo "ALTER ROLE \"${role//\"/\"\"}\" PASSWORD $(_sql_literal "$pw");"
    done
    echo "ALTER ROLE :\"dash\" SET default_transaction_read_only = on;"
    local db owner
    for pair in "$EXGRPO_DB_EXPERIENCE:train" "$EXGRPO_DB_MLFLOW:svc" "$EXGRPO_DB_PREFECT:svc"; do
      db="${pair%:*}"; owner="${pair##*:}"
      echo "SELECT format('CREATE DATABASE %I OWNER %I', $(_sql_literal "$db"), :'$owner')"
      echo "  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = $(_sql_literal "$db")) \\gexec"
      echo "SELECT format('REVOKE ALL ON DATABASE %I FROM PUBLIC', $(_sql_literal "$db")) \\gexec"
    done
    echo "SELECT format('GRANT CONNECT ON DATABASE %I TO %I, %I', $(_sql_literal "$EXGRPO_DB_EXPERIENCE"), :'train', :'dash') \\gexec"
  } | _psql postgres || return 1
  # Inside the experience DB: the training role owns the schema (it runs the migrations); the
  # dashboard role reads every table, present and future, and can write none.
  _psql "$EXGRPO_DB_EXPERIENCE" <<'SQL' || return 1
ALTER SCHEMA public OWNER TO :"train";
GRANT USAGE ON SCHEMA public TO :"dash";
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"train";
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO :"train";
GRANT SELECT ON ALL TABLES IN SCHEMA public TO :"dash";
ALTER DEFAULT PRIVILEGES FOR ROLE :"train" IN SCHEMA public GRANT SELECT ON TABLES TO :"dash";
ALTER DEFAULT PRIVILEGES FOR ROLE :"admin" IN SCHEMA public GRANT SELECT ON TABLES TO :"dash";
-- advisory locks (one process per run, one migrator) for the training role only: a reader could block runs
SELECT format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', p.oid::regprocedure) FROM pg_proc p
  WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ '^pg_(try_)?advisory_(xact_)?lock' \gexec
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', p.oid::regprocedure, :'train') FROM pg_proc p
  WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ '^pg_(try_)?advisory_(xact_)?lock' \gexec
SQL
  _psql "$EXGRPO_DB_MLFLOW" <<<'ALTER SCHEMA public OWNER TO :"svc";' || return 1
  _psql "$EXGRPO_DB_PREFECT" <<<'ALTER SCHEMA public OWNER TO :"svc";' || return 1
  _write_pgpass
  echo "postgres: databases $EXGRPO_DB_EXPERIENCE, $EXGRPO_DB_MLFLOW, $EXGRPO_DB_PREFECT;" \
       "roles $EXGRPO_TRAIN_ROLE (read/write), $EXGRPO_DASHBOARD_ROLE (read-only), $EXGRPO_SERVICES_ROLE"
}

_write_pgpass() {  # host:port:db:role:password lines for the roles that have a password in env
  local var role pw lines=""
  for var in TRAIN DASHBOARD SERVICES; do
    pw="EXGRPO_${var}_PASSWORD"; pw="${!pw:-}"
    role="EXGRPO_${var}_ROLE"; role="${!role}"
    [[ -n "$pw" ]] && lines+="$EXGRPO_PG_HOST:$EXGRPO_PG_PORT:*:$role:${pw//:/\\:}"$'\n'
  done
  rm -f "$EXGRPO_PGPASSFILE"
  [[ -z "$lines" ]] && return 0
  (umask 077 && printf '%s' "$lines" > "$EXGRPO_PGPASSFILE")
}

pg_migrate() {  # the experience schema, created by the training role (so it owns the tables)
  (cd "$EXGRPO_REPO_DIR" && _pg_env "$EXGRPO_PYTHON" -m flows.cli db upgrade --url "$EXGRPO_EXPERIENCE_URL" >/dev/null) \
    || { echo "postgres: schema migration of $EXGRPO_DB_EXPERIENCE failed" >&2; return 1; }
}

_pg_env() {  # run a command as a service role: PGPASSFILE set when a pgpass file was written, and never
  # the admin's PGPASSWORD (libpq prefers it to the pass file: the role would log in with the wrong password)
  if [[ -f "$EXGRPO_PGPASSFILE" ]]; then env -u PGPASSWORD PGPASSFILE="$EXGRPO_PGPASSFILE" "$@"; else env -u PGPASSWORD "$@"; fi
}

pg_drop() {  # drop the three databases (services must be down); roles stay, they are cluster-wide
  local db
  for db in "$EXGRPO_DB_EXPERIENCE" "$EXGRPO_DB_MLFLOW" "$EXGRPO_DB_PREFECT"; do
    echo "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', $(_sql_literal "$db")) \\gexec"
  done | _psql postgres || return 1
  echo "postgres: dropped $EXGRPO_DB_EXPERIENCE, $EXGRPO_DB_MLFLOW, $EXGRPO_DB_PREFECT"
}

pg_status() {
  if ! pg_isready -q -h "$EXGRPO_PG_HOST" -p "$EXGRPO_PG_PORT"; then
    echo "postgres   down     $EXGRPO_PG_HOST:$EXGRPO_PG_PORT"; return 1
  fi
  local n
  n="$(psql -X -qtA -h "$EXGRPO_PG_HOST" -p "$EXGRPO_PG_PORT" -U "$EXGRPO_PG_ADMIN" -d postgres -c \
    "SELECT count(*) FROM pg_database WHERE datname IN ('$EXGRPO_DB_EXPERIENCE','$EXGRPO_DB_MLFLOW','$EXGRPO_DB_PREFECT')")"
  echo "postgres   up       $EXGRPO_PG_HOST:$EXGRPO_PG_PORT ($n/3 databases with prefix $EXGRPO_DB_PREFIX)"
  [[ "$n" == 3 ]]
}
