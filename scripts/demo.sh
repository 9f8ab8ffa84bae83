#!/usr/bin/env bash
# Install dl-ci and run the main job on the embedded default, on whatever machine this is:
# the bundled digits example, its hardware class and tier, and the memorization test.
#   scripts/demo.sh
# Environment: PYTHON (default python3), VENV (default .venv), TORCH_SPEC (default
# torch==2.13.0; any torch 2.x from 2.4 on works).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "$python" -m venv "$venv"
fi
echo "==> installing $torch_spec, dl-ci[train] and the digits example"
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU machines
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_spec"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[train]" -e examples/digits

dlci="$PWD/$venv/bin/dlci"
cd examples/digits
echo "==> dlci hardware"
"$dlci" hardware
echo
echo "==> dlci tier"
"$dlci" tier
echo
echo "==> dlci memorize (target from examples/digits/pyproject.toml)"
"$dlci" memorize
