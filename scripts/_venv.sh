# shellcheck shell=bash
# Sourced by demo.sh and test.sh: create the virtual environment and install torch first.
# Environment: PYTHON (default python3), VENV (default .venv), TORCH_SPEC (default
# torch==2.13.0; any torch 2.x from 2.4 on works), DLCI_HEARTBEAT_S (default 30: how often
# a long, silent step says it is still running).
python=${PYTHON:-python3}
venv=${VENV:-.venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}

# shellcheck source=scripts/_heartbeat.sh
. "$(dirname "${BASH_SOURCE[0]}")/_heartbeat.sh"

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
