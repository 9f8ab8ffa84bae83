# shellcheck shell=bash
# Sourced by demo.sh and test.sh: create the virtual environment and install torch first.
# Environment: PYTHON (default python3), VENV (default .venv), TORCH_SPEC (default
# torch==2.13.0; any torch 2.x from 2.4 on works), DLCI_HEARTBEAT_S (default 30: how often
# a long, silent step says it is still running).
python=${PYTHON:-python3}
venv=${VENV:-.venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}

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
# (scripts/e2e_setup.sh has the same two functions: it runs before this file can be sourced.)
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

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "$python" -m venv "$venv"
fi

pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}

echo "==> installing $torch_spec (the first time can take several minutes: a large download)"
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU machines
with_heartbeat "installing $torch_spec" pip_install "$torch_spec"
