#!/usr/bin/env bash
# Entry point of the GPU dind sidecar: what moby's `dind` script does before dockerd, so that
# containers can start on cgroup v2 nodes (the default on Ubuntu 22.04+, AL2023, COS,
# Bottlerocket): move this container's processes into a child cgroup and enable the
# controllers for the nested containers. Then dockerd, with the pod template's arguments.
set -euo pipefail
export container=docker
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p /sys/fs/cgroup/init
  xargs -rn1 </sys/fs/cgroup/cgroup.procs >/sys/fs/cgroup/init/cgroup.procs 2>/dev/null || :
  sed -e 's/ / +/g' -e 's/^/+/' </sys/fs/cgroup/cgroup.controllers \
    >/sys/fs/cgroup/cgroup.subtree_control
fi
exec dockerd "$@"
