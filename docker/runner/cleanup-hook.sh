#!/usr/bin/env bash
# The runner's job hooks for dl-ci (setup.sh installs them through the runner's .env):
#
#   cleanup-hook.sh started     ACTIONS_RUNNER_HOOK_JOB_STARTED: refuse the job on a sick GPU
#                               (a non-zero exit fails the job before any step runs)
#   cleanup-hook.sh completed   ACTIONS_RUNNER_HOOK_JOB_COMPLETED: stale containers removed,
#                               dl-ci's cache volumes pruned by age and size (untrusted first),
#                               old images pruned when the disk is fuller than the threshold,
#                               GPU health reported
#   cleanup-hook.sh disk        just the disk check and prune
#   cleanup-hook.sh caches      just the cache volumes' prune
#   cleanup-hook.sh containers  just the removal of this runner's job containers left behind
# The runner runs a hook by its path, with no arguments: with none, the mode comes from the
# script's name (setup.sh installs it as dlci-job-started.sh and dlci-job-completed.sh).
#
# Environment:
#   DLCI_DISK_THRESHOLD    percent used of Docker's data root that triggers the prune (default 80)
#   DLCI_PRUNE_UNTIL       prune only images created more than this long ago (default 72h;
#                          Docker's `until` filter is an image's age, not the time since last
#                          use: label an image you always want kept with dlci.keep)
#   DLCI_STALE_AFTER       remove stopped containers older than this (default 1h)
#   DLCI_GPU_TIMEOUT       seconds nvidia-smi may take before the GPU counts as hung (default 30)
#   DLCI_KEEP_LABEL        images with this label are kept (default dlci.keep)
#   DLCI_RUNNER            this runner's name (setup.sh writes it; default RUNNER_NAME): the
#                          containers removed are those the action labelled dlci.runner=NAME,
#                          never a neighbour runner's on the same machine
#   DLCI_RUNNER_GPUS       this runner's GPUs by UUID, comma-separated (setup.sh writes it when
#                          a machine has several runners): the GPU checks look at these only
# dl-ci's cache volumes (labels dlci.cache=trusted|untrusted and dlci.cache.created=<epoch
# seconds>, set by `dlci container run`) that no container uses are removed when older than
# the age or larger than the size below; untrusted ones (pull requests) first, with tighter
# limits, and all of them when the disk is over the threshold:
#   DLCI_CACHE_MAX_AGE_DAYS            trusted caches: days since creation (default 7)
#   DLCI_CACHE_MAX_GB                  trusted caches: size in GB, decimals allowed (default 50)
#   DLCI_UNTRUSTED_CACHE_MAX_AGE_DAYS  untrusted caches: days since creation (default 1)
#   DLCI_UNTRUSTED_CACHE_MAX_GB        untrusted caches: size in GB (default 10)
#   DLCI_CACHE_SELECT      one more `docker volume ls --filter` the volumes must match
#                          (default: none, every dl-ci cache volume; the tests use a label)
set -euo pipefail

threshold=${DLCI_DISK_THRESHOLD:-80}
prune_until=${DLCI_PRUNE_UNTIL:-72h}
stale_after=${DLCI_STALE_AFTER:-1h}
gpu_timeout=${DLCI_GPU_TIMEOUT:-30}
keep_label=${DLCI_KEEP_LABEL:-dlci.keep}
runner=${DLCI_RUNNER:-${RUNNER_NAME:-}}
runner_gpus=${DLCI_RUNNER_GPUS:-}
cache_select=${DLCI_CACHE_SELECT:-}
declare -A cache_max_age=([trusted]=${DLCI_CACHE_MAX_AGE_DAYS:-7} [untrusted]=${DLCI_UNTRUSTED_CACHE_MAX_AGE_DAYS:-1})
declare -A cache_max_gb=([trusted]=${DLCI_CACHE_MAX_GB:-50} [untrusted]=${DLCI_UNTRUSTED_CACHE_MAX_GB:-10})

say() { echo "dl-ci hook: $*"; }
warn() { echo "::warning::dl-ci hook: $*"; }

case $threshold in
'' | *[!0-9]*) echo "dl-ci hook: DLCI_DISK_THRESHOLD must be a whole percent, not '$threshold'" >&2 && exit 2 ;;
esac
for trust in trusted untrusted; do
  case ${cache_max_age[$trust]} in
  '' | *[!0-9]*) echo "dl-ci hook: the $trust cache's maximum age must be a whole number of days, not '${cache_max_age[$trust]}'" >&2 && exit 2 ;;
  esac
  [[ ${cache_max_gb[$trust]} =~ ^[0-9]+([.][0-9]+)?$ ]] \
    || { echo "dl-ci hook: the $trust cache's maximum size must be a number of GB, not '${cache_max_gb[$trust]}'" >&2 && exit 2; }
done

# Percent used of the file system holding DIR, from POSIX df output.
percent_used() {
  df -P "$1" | awk 'NR == 2 { sub(/%/, "", $5); print $5 }'
}

disk() {
  local root used
  root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null) || root=/var/lib/docker
  [ -d "$root" ] || root=/
  used=$(percent_used "$root")
  case $used in
  '' | *[!0-9]*)
    warn "could not read the disk usage of $root (df said '$used')"
    return 0
    ;;
  esac
  if [ "$used" -ge "$threshold" ]; then
    say "disk: $root is ${used}% full (threshold ${threshold}%): removing every unused untrusted cache volume"
    prune_caches untrusted 0 0
    say "disk: $root is ${used}% full (threshold ${threshold}%): pruning unused images created more than $prune_until ago (not labelled $keep_label)"
    docker image prune --all --force --filter "until=$prune_until" --filter "label!=$keep_label" || warn "image prune failed"
    docker builder prune --force --filter "until=$prune_until" >/dev/null 2>&1 || true
    used=$(percent_used "$root")
    if [ "$used" -ge "$threshold" ]; then
      warn "disk: $root is still ${used}% full after the prune"
    fi
  else
    say "disk: $root is ${used}% full (threshold ${threshold}%): nothing to prune"
  fi
}

# Bytes from Docker's human-readable size (decimal units: 0B, 12.3kB, 1.05MB, 4.2GB).
to_bytes() {
  awk -v s="$1" 'BEGIN {
    split("B kB KB MB GB TB PB", u, " "); split("1 1e3 1e3 1e6 1e9 1e12 1e15", f, " ")
    n = s + 0; unit = s; sub(/^[0-9.]+/, "", unit)
    for (i in u) if (u[i] == unit) { printf "%.0f\n", n * f[i]; exit 0 }
    exit 1
  }'
}

# Remove TRUST's cache volumes that no container uses and are older than MAX_AGE days or
# larger than MAX_GB (0 0: every unused one).
prune_caches() {
  local trust=$1 max_age=$2 max_gb=$3 now limit sizes names name created size bytes why
  now=$(date +%s)
  limit=$(awk -v g="$max_gb" 'BEGIN { printf "%.0f\n", g * 1e9 }')
  local filters=(--filter "label=dlci.cache=$trust" --filter dangling=true)
  [ -z "$cache_select" ] || filters+=(--filter "$cache_select")
  names=$(docker volume ls --quiet "${filters[@]}") || {
    warn "caches: could not list the $trust cache volumes"
    return 0
  }
  [ -n "$names" ] || return 0
  sizes=$(docker system df -v --format '{{range .Volumes}}{{.Name}} {{.Size}}\n{{end}}' 2>/dev/null) || sizes=""
  for name in $names; do
    created=$(docker volume inspect --format '{{index .Labels "dlci.cache.created"}}' "$name" 2>/dev/null) || created=""
    case $created in
    '' | *[!0-9]*) created=$(date -d "$(docker volume inspect --format '{{.CreatedAt}}' "$name")" +%s 2>/dev/null) || created=$now ;;
    esac
    size=$(awk -v n="$name" '$1 == n { print $2 }' <<<"$sizes")
    bytes=$(to_bytes "${size:-0B}") || bytes=0
    why=""
    if [ $((now - created)) -ge $((max_age * 86400)) ]; then
      why="created $(((now - created) / 86400)) day(s) ago, limit $max_age"
    elif [ "$bytes" -gt "$limit" ]; then
      why="${size} used, limit ${max_gb}GB"
    fi
    [ -n "$why" ] || continue
    if docker volume rm "$name" >/dev/null 2>&1; then
      say "caches: removed the $trust cache volume $name ($why)"
    else
      warn "caches: could not remove the $trust cache volume $name ($why)"
    fi
  done
}

# Untrusted caches first and more eagerly (tighter defaults), then trusted ones.
caches() {
  prune_caches untrusted "${cache_max_age[untrusted]}" "${cache_max_gb[untrusted]}"
  prune_caches trusted "${cache_max_age[trusted]}" "${cache_max_gb[trusted]}"
}

containers() {
  local ids filters=(--filter label=dlci.job)
  # the action's own containers (label dlci.job) that a cancelled job of this runner left
  # running; with several runners on one machine, a neighbour's are its own (dlci.runner)
  [ -z "$runner" ] || filters+=(--filter "label=dlci.runner=$runner")
  ids=$(docker ps --all --quiet "${filters[@]}")
  if [ -n "$ids" ]; then
    say "containers: removing dl-ci job containers left behind: $(echo "$ids" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one id per word
    docker rm --force $ids >/dev/null || warn "could not remove $ids"
  fi
  docker container prune --force --filter "until=$stale_after" >/dev/null || warn "container prune failed"
}

# Lines of CSV on stdin whose first field is one of this runner's GPUs (every line when the
# runner has every GPU: no DLCI_RUNNER_GPUS).
own_gpus() {
  if [ -z "$runner_gpus" ]; then
    cat
    return 0
  fi
  awk -F', *' -v pinned="$runner_gpus" 'BEGIN { n = split(tolower(pinned), p, " *, *"); for (i = 1; i <= n; i++) own[p[i]] = 1 }
    own[tolower($1)]'
}

# 0: healthy (or no GPU tool here); 1: hung, erroring, one of this runner's GPUs missing, or
# memory held by a process on one of them (a neighbour runner's GPUs are not looked at).
gpu_health() {
  if ! command -v nvidia-smi >/dev/null; then
    say "gpu: no nvidia-smi on this machine"
    return 0
  fi
  local out apps mine uuid
  if ! out=$(timeout "$gpu_timeout" nvidia-smi --query-gpu=uuid,index,name,memory.used,temperature.gpu --format=csv,noheader,nounits 2>&1); then
    warn "gpu: nvidia-smi failed or hung for ${gpu_timeout}s: $out (drain this machine and reset the GPU)"
    return 1
  fi
  mine=$(own_gpus <<<"$out")
  if [ -n "$runner_gpus" ]; then
    for uuid in ${runner_gpus//,/ }; do
      if ! awk -F', *' -v u="$uuid" 'tolower($1) == tolower(u) { f = 1 } END { exit !f }' <<<"$mine"; then
        warn "gpu: this runner's GPU $uuid (DLCI_RUNNER_GPUS) is not listed by nvidia-smi (drain this machine, or run setup.sh again)"
        return 1
      fi
    done
  fi
  say "gpu: $(echo "$mine" | tr '\n' ';')"
  apps=$(timeout "$gpu_timeout" nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader 2>/dev/null || true)
  apps=$(own_gpus <<<"$apps")
  if [ -n "$apps" ]; then
    warn "gpu: processes still hold memory on this runner's GPUs between jobs: $(echo "$apps" | tr '\n' ';')"
    return 1
  fi
}

if [ "$#" -gt 0 ]; then
  mode=$1
else
  case $(basename "$0") in
  *started*) mode=started ;;
  *) mode=completed ;;
  esac
fi
case $mode in
started)
  gpu_health || {
    echo "dl-ci hook: the GPU is not healthy; refusing the job (see the warning above)" >&2
    exit 1
  }
  ;;
completed)
  containers
  caches
  disk
  gpu_health || true # reported; the next job's started hook refuses to run if it persists
  ;;
disk) disk ;;
caches) caches ;;
containers) containers ;;
*)
  echo "usage: $0 started|completed|disk|caches|containers" >&2
  exit 2
  ;;
esac
