# Background processes of services.sh: start in their own process group, pid and log files under
# $EXGRPO_STATE_DIR, wait for a health URL, stop the whole group. Sourced after config.sh.

LAUNCHED=()  # what this invocation started
_pidfile() { echo "$EXGRPO_STATE_DIR/$1.pid"; }
_logfile() { echo "$EXGRPO_STATE_DIR/$1.log"; }

proc_alive() {  # proc_alive NAME: the recorded process is running
  local pid; pid="$(cat "$(_pidfile "$1")" 2>/dev/null)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null
}

_healthy() { "$EXGRPO_PYTHON" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}

proc_launch() {  # proc_launch NAME HEALTH_URL|- COMMAND...: start in the background unless running
  local name="$1" health="$2"; shift 2
  if proc_alive "$name"; then
    echo "$name: already running (pid $(cat "$(_pidfile "$name")"))"; return 0
  fi
  if [[ "$health" != - ]] && _healthy "$health"; then
    echo "$name: something else already answers $health; stop it or pick another port" >&2; return 1
  fi
  setsid "$@" >"$(_logfile "$name")" 2>&1 < /dev/null &
  echo "$!" > "$(_pidfile "$name")"
  LAUNCHED+=("$name")
}

stop_launched_on_failure() {  # EXIT trap of `up`: a failed start leaves no half-started set behind
  local rc=$? name
  if (( rc != 0 )); then
    for name in "${LAUNCHED[@]}"; do proc_stop "$name" >&2; done
  fi
  return $rc
}

proc_wait() {  # proc_wait NAME HEALTH_URL|-: until healthy; on failure show the log and stop it
  local name="$1" health="$2" log pid deadline=$((SECONDS + EXGRPO_START_TIMEOUT))
  log="$(_logfile "$name")"; pid="$(cat "$(_pidfile "$name")" 2>/dev/null || true)"
  while (( SECONDS < deadline )); do
    if ! proc_alive "$name"; then
      echo "$name: exited during start; last lines of $log:" >&2; tail -n 25 "$log" >&2
      rm -f "$(_pidfile "$name")"; return 1
    fi
    if [[ "$health" == - ]] || _healthy "$health"; then
      echo "$name: up (pid $pid, log $log)"; return 0
    fi
    sleep 1
  done
  echo "$name: not healthy at $health after ${EXGRPO_START_TIMEOUT}s; last lines of $log:" >&2
  tail -n 25 "$log" >&2
  proc_stop "$name" >/dev/null
  return 1
}

proc_stop() {  # proc_stop NAME: SIGTERM the process group, SIGKILL after 20 s
  local pidfile pid; pidfile="$(_pidfile "$1")"
  if ! proc_alive "$1"; then rm -f "$pidfile"; echo "$1: not running"; return 0; fi
  pid="$(cat "$pidfile")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
  rm -f "$pidfile"
  echo "$1: stopped (pid $pid)"
}

proc_status() {  # proc_status NAME URL HEALTH_URL|-
  local state=down
  if proc_alive "$1"; then
    state=running
    [[ "$3" == - ]] || _healthy "$3" || state=unhealthy
  fi
  printf '%-10s %-8s %s\n' "$1" "$state" "$2"
  [[ "$state" == running ]]
}
