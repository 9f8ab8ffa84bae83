#!/usr/bin/env bash
# Install dl-ci and run the main job on the embedded default, on whatever machine this is:
# the bundled digits example, its hardware class and tier, and the memorization test.
#   scripts/demo.sh
# Environment: see scripts/_venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh

echo "==> installing dl-ci[train] and the digits example"
pip_install -e ".[train]" -e examples/digits

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
echo
echo "==> dlci profile (a torch.profiler trace of real steps, then its utilization report)"
"$dlci" profile
