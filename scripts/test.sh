#!/usr/bin/env bash
# Install what the test suite needs, then run the quality gates and the tests: the Python
# packages into .venv, and the real parts of the end-to-end tests (a Docker engine, act, the
# offline base image, the wheelhouse, the kit image: scripts/e2e_setup.sh, which needs root or
# sudo). A missing part fails the end-to-end tests; it never skips them.
#   scripts/test.sh [PYTEST ARGS...]      (-m "not e2e" leaves the end-to-end tests out)
# The tests run on DLCI_TEST_WORKERS pytest-xdist workers (default 2; 0 runs them in this
# process), grouped as tests/conftest.py says; at the end come the 25 slowest tests and the
# time per test file against the kept table (benchmarks/test_times.py, test-times.json), and a
# warning (never a failure) when the whole run took more than DLCI_TEST_BUDGET_S seconds
# (default 1200: CI's 20 minutes), naming the files that grew.
# Environment: see scripts/_venv.sh; SKIP_PRE_COMMIT=1 runs the tests alone.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh
# the total time, whatever happens; a heartbeat still running when a step fails is stopped
trap 'rc=$?; stop_heartbeat; echo "==> scripts/test.sh: exit $rc after $(elapsed "$SECONDS")"' EXIT

echo "==> installing dl-ci[dev] (the first time can take a few minutes)"
with_heartbeat "installing dl-ci[dev]" pip_install -e ".[dev]"

echo "==> the real parts of the end-to-end tests (the first time can take 10 to 20 minutes:"
echo "    debootstrap, the wheels, the kit image; later runs take seconds)"
# every image the e2e tests use, torchbase, venvbase and the shapes included, and the browser
# (`all` leaves them out): with DLCI_E2E_SKIP_BUILD=1 below no fixture builds one, so what is
# not built here is missing
bash scripts/e2e_setup.sh all torchbase venvbase shapes browser
# the images were just built from this tree: the tests need not run the (cached) builds again
export DLCI_E2E_SKIP_BUILD=1

export PATH="$PWD/$venv/bin:$PATH"
if [ "${SKIP_PRE_COMMIT:-0}" != 1 ]; then
  echo "==> quality gates (pre-commit on the whole tree; the first time installs each hook's"
  echo "    environment, which can take several minutes)"
  with_heartbeat "running the quality gates" \
    pre-commit run --all-files --show-diff-on-failure --color never
fi
workers=${DLCI_TEST_WORKERS:-2}
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
fi
echo "==> tests (doctests, unit, e2e) with coverage, on ${workers} pytest-xdist worker(s)"
start=$SECONDS
rc=0
python -m pytest "${parallel[@]}" --durations=25 --cov --cov-report=term --cov-report=xml \
  --junitxml=junit.xml "$@" || rc=$?
echo "==> pytest: exit $rc after $(elapsed $((SECONDS - start)))"
echo "==> time per test file (benchmarks/test_times.py: junit.xml against the kept table)"
python benchmarks/test_times.py junit.xml --budget-s "${DLCI_TEST_BUDGET_S:-1200}" \
  --elapsed-s "$SECONDS" || true
echo "==> the shape of the house (benchmarks/code_shape.py: a report, not a rule)"
python benchmarks/code_shape.py || true
exit "$rc"
