# shellcheck shell=bash
# Sourced by _venv.sh (demo.sh, test.sh) and e2e_setup.sh: elapsed times, and a heartbeat for
# long silent steps. Environment: DLCI_HEARTBEAT_S (default 30).

# "75s" or "12m05s"
elapsed() {
  local s=$1
  if [ "$s" -ge 60 ]; then
    printf '%dm%02ds\n' $((s / 60)) $((s % 60))
  else
    echo "${s}s"
  fi
}

# Run a command; while it runs, say every DLCI_HEARTBEAT_S seconds that it still does, so a CI
# log never looks hung during minutes of silence (pip, pre-commit environments). The heartbeat
# goes to fd 9, the output the user reads, even where the command's own output goes to a file:
#   with_heartbeat "building the image" docker build . >"$log" 2>&1
exec 9>&1
heartbeat_pid=
with_heartbeat() {
  local what=$1 start=$SECONDS rc=0
  shift
  # sleep's output goes nowhere, so a pipe reading this script's output is not held open by it
  (while sleep "${DLCI_HEARTBEAT_S:-30}" >/dev/null 2>&1; do
    echo "    ... still $what ($(elapsed $((SECONDS - start))))" >&9
  done) &
  heartbeat_pid=$!
  "$@" || rc=$?
  stop_heartbeat
  return "$rc"
}
stop_heartbeat() {
  if [ -n "$heartbeat_pid" ]; then
    kill "$heartbeat_pid" 2>/dev/null || true
    wait "$heartbeat_pid" 2>/dev/null || true
    heartbeat_pid=
  fi
}
