#!/usr/bin/env bash
# dl-ci's GPU path on a real GPU, in one run of under 8 minutes (docs/gpu.md).
#
#   scripts/gpu_acceptance.sh --prepare DIR [--exclude NAME,...]
#       on a machine with PyPI: dl-ci and the digits example built as wheels, and their
#       dependencies except torch, downloaded as binary wheels for CPython 3.12 into DIR
#   scripts/gpu_acceptance.sh [--wheels DIR] [--out DIR] [--quick]
#       on the GPU machine (PyTorch installed, no network): a venv with the system's site
#       packages (its torch), dl-ci installed from DIR, then every step, timed and capped
#   scripts/gpu_acceptance.sh --no-install [--out DIR] [--quick]
#       the same steps with the python on PATH (it must have dl-ci, torch, scikit-learn)
#
# The steps: dlci hardware (NVML), memorize, doctor and profile (with its memory figures) on
# the digits example, a real run at the batch size it estimated to fit, a profile of three
# known loops (scripts/gpu_loops.py) and dlci analyze of each with the
# --min-gpu-util gate. OUT gets each step's reports and log, the traces (gzipped) and
# acceptance.json with every figure; the exit status is 0 when every step and check held.
# Without a GPU it runs the CPU path and says so. Each step has a time budget (below); their
# sum stays under 8 minutes.
#
# Environment: PYTHON (default python3), DLCI_WHEEL_PYTHON (default 3.12),
# DLCI_WHEEL_PLATFORM (a pip --platform; default this machine's), DLCI_MIN_GPU_UTIL
# (default 50), DLCI_ACCEPTANCE_MAX_STEP_S (caps every step's budget; for tests).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
python=${PYTHON:-python3}
mode=run
wheels=$root/build/gpu-wheels
out=$root/build/gpu-acceptance
quick=0
install=1
exclude=

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() {
  echo "gpu_acceptance: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case $1 in
  --prepare)
    mode=prepare
    wheels=${2:?--prepare needs a directory}
    shift 2
    ;;
  --exclude)
    exclude=${2:?--exclude needs a list}
    shift 2
    ;;
  --wheels)
    wheels=${2:?--wheels needs a directory}
    shift 2
    ;;
  --out)
    out=${2:?--out needs a directory}
    shift 2
    ;;
  --quick) quick=1 && shift ;;
  --no-install) install=0 && shift ;;
  -h | --help) usage && exit 0 ;;
  *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# a requirement as pyproject.toml writes it, e.g. "matplotlib>=3.7"
requirement() { grep -o "\"$1[<>=~!][^\"]*\"" "$2" | head -n 1 | tr -d '"'; }

prepare() {
  local dest=$1 pyver=${DLCI_WHEEL_PYTHON:-3.12} name
  local -a platform=()
  [ -n "${DLCI_WHEEL_PLATFORM:-}" ] && platform=(--platform "$DLCI_WHEEL_PLATFORM")
  mkdir -p "$dest"
  dest=$(cd "$dest" && pwd)
  echo "gpu_acceptance: building dl-ci and the digits example as wheels into $dest"
  "$python" -m pip wheel --quiet --no-deps --wheel-dir "$dest" "$root" "$root/examples/digits"
  echo "gpu_acceptance: downloading their dependencies (not torch) for CPython $pyver"
  "$python" -m pip download --quiet --only-binary=:all: --python-version "$pyver" \
    "${platform[@]}" --dest "$dest" "$(ls "$dest"/dl_ci-*.whl)" \
    "$(requirement matplotlib "$root/pyproject.toml")" \
    "$(requirement scikit-learn "$root/examples/digits/pyproject.toml")"
  for name in ${exclude//,/ }; do # what the GPU machine has already
    rm -f "$dest/${name//-/_}"-[0-9]*.whl "$dest/$name"-[0-9]*.whl
  done
  ls "$dest"
  echo "gpu_acceptance: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1)"
}

if [ "$mode" = prepare ]; then
  prepare "$wheels"
  exit 0
fi

start=$EPOCHREALTIME
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/steps.tsv" "$out/acceptance.json"
mkdir -p "$out/logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$install" = 1 ]; then
  [ -d "$wheels" ] || die "no wheels in $wheels: run --prepare DIR on a machine with PyPI first"
  echo "gpu_acceptance: a venv on $("$python" --version 2>&1) with its site packages, from $wheels"
  "$python" -m venv --system-site-packages "$work/venv"
  # where $python is itself a venv (the machine's torch in it), the line above sees only the
  # base interpreter's packages: a .pth file adds $python's own site-packages after the venv's
  "$python" -c 'import site; [print(f"import site; site.addsitedir({d!r})") for d in site.getsitepackages()]' \
    >"$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_dlci_parent.pth"
  # only from DIR: no pip configuration or PIP_* setting adds an index or another folder
  pip=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null
    "$work/venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels")
  # dl-ci and the example from DIR even where the machine has a copy; then what they need
  # and the machine lacks (torch is the machine's). 2 x 40 s of the 480.
  timeout 40 "${pip[@]}" --no-deps --force-reinstall dl-ci digits-example \
    >"$out/logs/install.log" 2>&1 || die "install failed: $(tail -n 5 "$out/logs/install.log")"
  timeout 40 "${pip[@]}" dl-ci matplotlib scikit-learn >>"$out/logs/install.log" 2>&1 ||
    die "install of the dependencies failed: $(tail -n 5 "$out/logs/install.log")"
  python=$work/venv/bin/python
else
  # the source tree's example, for a python that has not installed it
  export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$root/examples/digits
fi
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
dlci=("$python" -m dlci)
"$python" -c 'import dlci, torch' 2>"$out/logs/import.log" ||
  die "$python cannot import dlci and torch: $(tail -n 3 "$out/logs/import.log")"

if "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  gpu=1 device=cuda
  echo "gpu_acceptance: GPU found: running the CUDA path"
else
  gpu=0 device=cpu
  echo "gpu_acceptance: no GPU found: running the CPU path (its figures are not GPU figures)"
fi

# step NAME BUDGET_S EXPECTED_CODES REPORT -- COMMAND...: run it in $work under a time cap,
# its output in logs/NAME.log, one line in steps.tsv
step() {
  local name=$1 budget=$2 expected=$3 report=$4 rc=0 t0=$EPOCHREALTIME seconds
  shift 5
  [ -n "${DLCI_ACCEPTANCE_MAX_STEP_S:-}" ] && [ "$DLCI_ACCEPTANCE_MAX_STEP_S" -lt "$budget" ] &&
    budget=$DLCI_ACCEPTANCE_MAX_STEP_S
  (cd "$work" && timeout --kill-after=5 "$budget" "$@") >"$out/logs/${name//:/-}.log" 2>&1 || rc=$?
  seconds=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$seconds" "$budget" "$expected" "$report" \
    >>"$out/steps.tsv"
  echo "gpu_acceptance: $name: exit $rc in $seconds s (budget $budget s)"
}

# budgets (s): 20 + 75 + 75 + 60 + 30 + 3 * (30 + 15) = 395; with the install's 80, 475 of 480
gate=${DLCI_MIN_GPU_UTIL:-50}
tier=(--budget pr --device "$device")
digits=(--target digits_example.target:make_target "${tier[@]}")
profile=(--wait 1 --warmup 1 --steps 5 --quiet)
checks=()
if [ "$quick" = 1 ]; then
  profile=(--wait 0 --warmup 1 --steps 2 --quiet)
  checks=(--only "optimizer-coverage,initial-loss,grad-flow,memorize")
fi

step hardware 20 0 hardware.json -- "${dlci[@]}" hardware --json "$out/hardware.json"
step memorize 75 0 memorize/memorization.json -- "${dlci[@]}" memorize "${digits[@]}" \
  --out "$out/memorize" --tracker none --quiet
step doctor 75 0 doctor/doctor.json -- "${dlci[@]}" doctor "${digits[@]}" "${checks[@]}" \
  --out "$out/doctor"
step profile:digits 60 0 profile/digits/utilization.json -- "${dlci[@]}" profile "${digits[@]}" \
  "${profile[@]}" --out "$out/profile/digits"
# a real run at the batch size the profile estimated to be the largest that fits
step memory:digits 30 0 memory/batch-check.json -- "$python" "$here/gpu_acceptance.py" \
  --check-batch "$out/profile/digits/utilization.json" --out "$out/memory"
for loop in healthy slow_loader item_every_step; do
  step "profile:$loop" 30 0 "" -- "${dlci[@]}" profile --target "gpu_loops:$loop" "${tier[@]}" \
    "${profile[@]}" --no-analyze --out "$out/profile/$loop"
  # the gate's verdict is a figure: passing (0) and failing (1) are both expected exits
  step "analyze:$loop" 15 0,1 "profile/$loop/utilization.json" -- "${dlci[@]}" analyze \
    "$out/profile/$loop/trace.json.gz" --out "$out/profile/$loop" --min-gpu-util "$gate" --quiet
done

seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
rc=0
"$python" "$here/gpu_acceptance.py" "$out" --gpu "$gpu" --quick "$quick" \
  --seconds "$seconds" --budget 480 || rc=$?
[ "$gpu" = 1 ] || echo "gpu_acceptance: no GPU found: ran the CPU path"
echo "gpu_acceptance: $seconds s in all; figures in $out/acceptance.json"
exit "$rc"
