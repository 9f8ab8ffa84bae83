#!/usr/bin/env bash
# CI as a new machine sees it: remove what dl-ci builds and caches, then run .ci/run (the
# README's test command) in a new clone of this repository's HEAD, with empty caches. Run it
# before a submission that touches the setup or the e2e tests: it catches what a warm machine
# hides (an image an earlier run left, a cached wheel, a hook environment).
#   scripts/fresh_ci.sh [--dry-run] [--keep-images] [--dir DIR]
#     --dry-run      print what would be removed and what would run; remove and run nothing
#     --keep-images  leave the Docker images, volumes, build cache and e2e cache alone (for
#                    a machine where others use them): only the clone and the caches of the
#                    run are new, and the image builds are then cached, so the time is not a
#                    new machine's
#     --dir DIR      where the clone, its caches and the log go (default: a new temporary
#                    folder, kept afterwards); DIR must not exist or be empty
# What goes, on the Docker engine (which itself stays, and is started if it is not running):
#   containers labelled dlci.job (the action's jobs) or dlci.e2e.run (the e2e tests);
#   images labelled dlci.e2e (the offline base, the kit images, the torch base) and the tags
#   dl-ci:e2e*, dlci-e2e-*, dlci-local:* (builds by input hash);
#   volumes labelled dlci.cache (the job caches) or named dlci-e2e-*; the build cache.
# On the host: the e2e cache (DLCI_E2E_CACHE, default ~/.cache/dlci-e2e: the debootstrap
# tarball and logs). The run itself gets an empty XDG_CACHE_HOME, PRE_COMMIT_HOME and pip
# cache in DIR, so pip, pre-commit's hook environments and act start from nothing without
# removing the user's own caches (other projects share them); the clone's venv and wheelhouse
# are new. This checkout is left as it is: only committed work is tested (HEAD).
# The log is DIR/fresh-ci.log; junit.xml is in DIR/clone. Exit status: .ci/run's.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

dry_run=0 keep_images=0 dir=
while [ "$#" -gt 0 ]; do
  case $1 in
  --dry-run) dry_run=1 ;;
  --keep-images) keep_images=1 ;;
  --dir)
    dir=${2:?--dir needs a folder}
    shift
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "fresh_ci: unknown option $1 (see --help)" >&2
    exit 2
    ;;
  esac
  shift
done

say() { echo "==> fresh_ci: $*"; }
# run a command, or in a dry run only show it
act_on() {
  if [ "$dry_run" = 1 ]; then
    echo "    would run: $*" >&2
  else
    "$@"
  fi
}

e2e_cache=${DLCI_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlci-e2e}

# the Docker side: what dl-ci's action, its setup script and its tests leave on the engine
remove_docker_parts() {
  if ! command -v docker >/dev/null; then
    say "no Docker client: nothing to remove there (the setup script installs the engine)"
    return 0
  fi
  if ! docker info >/dev/null 2>&1; then
    # a stopped engine still keeps its images on disk: start it, or they would survive
    if [ "$dry_run" = 1 ]; then
      say "no Docker engine answers: a real run starts it (scripts/e2e_setup.sh engine) first"
      return 0
    fi
    say "no Docker engine answers: starting it to remove what it keeps on disk"
    bash scripts/e2e_setup.sh engine
  fi
  local containers=() images=() volumes=()
  mapfile -t containers < <(
    {
      docker ps -aq --filter label=dlci.job
      docker ps -aq --filter label=dlci.e2e.run
    } | sort -u
  )
  mapfile -t images < <(
    {
      # a tag where the image has one, else its ID
      docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' --filter label=dlci.e2e \
        | awk '{ print ($1 == "<none>:<none>" ? $2 : $1) }'
      docker images --format '{{.Repository}}:{{.Tag}}' \
        | grep -E '^(dl-ci:e2e|dlci-e2e-|dlci-local:)' || true
    } | sort -u
  )
  mapfile -t volumes < <(
    {
      docker volume ls -q --filter label=dlci.cache
      docker volume ls -q | grep -E '^dlci-e2e-' || true
    } | sort -u
  )
  say "containers: ${#containers[@]}, images: ${#images[@]}, volumes: ${#volumes[@]}"
  [ "${#containers[@]}" = 0 ] || act_on docker rm --force "${containers[@]}" >/dev/null
  [ "${#images[@]}" = 0 ] || printf '    image %s\n' "${images[@]}"
  [ "${#images[@]}" = 0 ] || act_on docker rmi --force "${images[@]}" >/dev/null
  [ "${#volumes[@]}" = 0 ] || printf '    volume %s\n' "${volumes[@]}"
  [ "${#volumes[@]}" = 0 ] || act_on docker volume rm --force "${volumes[@]}" >/dev/null
  act_on docker builder prune --all --force >/dev/null
}

if [ "$keep_images" = 1 ]; then
  say "--keep-images: the Docker images, volumes, build cache and $e2e_cache stay"
else
  remove_docker_parts
  if [ -e "$e2e_cache" ]; then
    say "the e2e cache: $e2e_cache"
    act_on rm -rf "$e2e_cache"
  fi
fi

if [ -z "$dir" ]; then
  if [ "$dry_run" = 1 ]; then
    dir="(a new temporary folder)"
  else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/dlci-fresh-ci.XXXXXX")
  fi
elif [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
  echo "fresh_ci: $dir is not empty" >&2
  exit 2
fi
say "a new clone of HEAD ($(git rev-parse --short HEAD)) in $dir/clone, caches in $dir/cache"
if [ "$dry_run" = 1 ]; then
  echo "    would run: git clone --no-hardlinks $repo $dir/clone"
  echo "    would run: (in $dir/clone) XDG_CACHE_HOME=$dir/cache PRE_COMMIT_HOME=$dir/cache/pre-commit"
  echo "               PIP_CACHE_DIR=$dir/cache/pip DLCI_E2E_CACHE=$dir/cache/dlci-e2e .ci/run"
  exit 0
fi
mkdir -p "$dir/cache"
git clone --quiet --no-hardlinks "$repo" "$dir/clone"
git -C "$dir/clone" checkout --quiet "$(git rev-parse HEAD)"
say "running .ci/run (log: $dir/fresh-ci.log)"
set +e
(
  cd "$dir/clone"
  env -u VIRTUAL_ENV -u DLCI_E2E_SKIP_BUILD XDG_CACHE_HOME="$dir/cache" \
    PRE_COMMIT_HOME="$dir/cache/pre-commit" PIP_CACHE_DIR="$dir/cache/pip" \
    DLCI_E2E_CACHE="$dir/cache/dlci-e2e" bash .ci/run
) 2>&1 | tee "$dir/fresh-ci.log"
rc=${PIPESTATUS[0]}
set -e
say "exit $rc; log: $dir/fresh-ci.log; junit.xml: $dir/clone/junit.xml"
exit "$rc"
