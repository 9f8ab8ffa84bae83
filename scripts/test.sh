#!/usr/bin/env bash
# Install what the test suite needs into .venv, then run the quality gates and the tests.
#   scripts/test.sh [PYTEST ARGS...]
# Environment: see scripts/_venv.sh; SKIP_PRE_COMMIT=1 runs the tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh

echo "==> installing dl-ci[dev]"
pip_install -e ".[dev]"

export PATH="$PWD/$venv/bin:$PATH"
if [ "${SKIP_PRE_COMMIT:-0}" != 1 ]; then
  echo "==> quality gates (pre-commit on the whole tree)"
  pre-commit run --all-files --show-diff-on-failure --color never
fi
echo "==> tests (doctests, unit, e2e) with coverage"
python -m pytest --cov --cov-report=term --cov-report=xml --junitxml=junit.xml "$@"
