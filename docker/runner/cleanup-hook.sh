#!/usr/bin/env bash
# The runner's job hooks for dl-ci (setup.sh installs them through the runner's .env):
#
#   cleanup-hook.sh started     ACTIONS_RUNNER_HOOK_JOB_STARTED: refuse the job on a sick GPU
#                               (a non-zero exit fails the job before any step runs)
#   cleanup-hook.sh completed   ACTIONS_RUNNER_HOOK_JOB_COMPLETED: stale containers removed,
#                               old images pruned when the disk is fuller than the threshold,
#                               GPU health reported
#   cleanup-hook.sh disk        just the disk check and prune
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
set -euo pipefail

threshold=${DLCI_DISK_THRESHOLD:-80}
prune_until=${DLCI_PRUNE_UNTIL:-72h}
stale_after=${DLCI_STALE_AFTER:-1h}
gpu_timeout=${DLCI_GPU_TIMEOUT:-30}
keep_label=${DLCI_KEEP_LABEL:-dlci.keep}

say() { echo "dl-ci hook: $*"; }
warn() { echo "::warning::dl-ci hook: $*"; }

case $threshold in
'' | *[!0-9]*) echo "dl-ci hook: DLCI_DISK_THRESHOLD must be a whole percent, not '$threshold'" >&2 && exit 2 ;;
esac

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

containers() {
  local ids
  # the action's own containers (label dlci.job) that a cancelled job left running
  ids=$(docker ps --all --quiet --filter label=dlci.job)
  if [ -n "$ids" ]; then
    say "containers: removing dl-ci job containers left behind: $(echo "$ids" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one id per word
    docker rm --force $ids >/dev/null || warn "could not remove $ids"
  fi
  docker container prune --force --filter "until=$stale_after" >/dev/null || warn "container prune failed"
}

# 0: healthy (or no GPU tool here); 1: hung, erroring, or memory held by a process.
gpu_health() {
  if ! command -v nvidia-smi >/dev/null; then
    say "gpu: no nvidia-smi on this machine"
    return 0
  fi
  local out apps
  if ! out=$(timeout "$gpu_timeout" nvidia-smi --query-gpu=index,name,memory.used,temperature.gpu --format=csv,noheader,nounits 2>&1); then
    warn "gpu: nvidia-smi failed or hung for ${gpu_timeout}s: $out (drain this machine and reset the GPU)"
    return 1
  fi
  say "gpu: $(echo "$out" | tr '\n' ';')"
  apps=$(timeout "$gpu_timeout" nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null || true)
  if [ -n "$apps" ]; then
    warn "gpu: processes still hold GPU memory between jobs: $(echo "$apps" | tr '\n' ';')"
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
  disk
  gpu_health || true # reported; the next job's started hook refuses to run if it persists
  ;;
disk) disk ;;
*)
  echo "usage: $0 started|completed|disk" >&2
  exit 2
  ;;
esac
