#!/usr/bin/env bash
# Install dl-ci and run the main job on the embedded default, on whatever machine this is:
# the bundled digits example, its hardware class and tier, and the memorization test.
#   scripts/demo.sh
# The last line is the verdict, whatever happens ("dl-ci demo: PASS: ..." or "dl-ci demo:
# FAIL: ..."), and the exit code is the memorization gate's (or the failed step's).
# Environment: see scripts/_venv.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

step="setting up the virtual environment"
gate=""
py="" # the venv's python, once there: it reads the report for the verdict
report="$PWD/examples/digits/dlci-artifacts/memorization.json"
verdict() {
  local rc=$? reason=""
  stop_heartbeat 2>/dev/null || true
  if [ -n "$gate" ] && [ -n "$py" ] && [ -s "$report" ]; then
    reason=$("$py" -c \
      'import json, sys; print(json.load(open(sys.argv[1]))["reason"])' "$report" 2>/dev/null ||
      echo "see $report")
  fi
  if [ "$rc" = 0 ]; then
    echo "dl-ci demo: PASS: memorization ${reason:-passed}"
  elif [ "$gate" = failed ]; then
    echo "dl-ci demo: FAIL: memorization ${reason:-failed} (exit $rc)"
  else
    echo "dl-ci demo: FAIL: $step failed (exit $rc)${reason:+; memorization $reason}"
  fi
  exit "$rc"
}
trap verdict EXIT

# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh

step="installing dl-ci[train] and the digits example"
echo "==> $step"
with_heartbeat "$step" pip_install -e ".[train]" -e examples/digits

dlci="$PWD/$venv/bin/dlci"
py="$PWD/$venv/bin/python"
cd examples/digits
rm -f "$report" # a verdict never quotes an earlier run's report
step="dlci hardware"
echo "==> $step"
"$dlci" hardware
echo
step="dlci tier"
echo "==> $step"
"$dlci" tier
echo
step="dlci memorize"
echo "==> $step (target from examples/digits/pyproject.toml)"
gate=failed
"$dlci" memorize
gate=passed
echo
step="dlci profile"
echo "==> $step (a torch.profiler trace of real steps, then its utilization report)"
"$dlci" profile
