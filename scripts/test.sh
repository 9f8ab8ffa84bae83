#!/usr/bin/env bash
# Install what the test suite needs into .venv, then run the quality gates and the tests.
#   scripts/test.sh [PYTEST ARGS...]
# Environment: PYTHON (default python3), VENV (default .venv), TORCH_SPEC (default
# torch==2.13.0; any torch 2.x from 2.4 on works), SKIP_PRE_COMMIT=1 to run the tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}
torch_spec=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "$python" -m venv "$venv"
fi
echo "==> installing $torch_spec and dl-ci[dev]"
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build on CPU machines
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_spec"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[dev]"

export PATH="$PWD/$venv/bin:$PATH"
if [ "${SKIP_PRE_COMMIT:-0}" != 1 ]; then
  echo "==> quality gates (pre-commit on the whole tree)"
  pre-commit run --all-files --show-diff-on-failure --color never
fi
echo "==> tests (doctests, unit, e2e) with coverage"
python -m pytest --cov --cov-report=term --cov-report=xml --junitxml=junit.xml "$@"
