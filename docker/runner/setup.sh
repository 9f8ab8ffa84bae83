#!/usr/bin/env bash
# Turn a bare-metal or VM GPU machine into an ephemeral GitHub Actions runner for dl-ci.
# docs/runner.md walks through it; every step can be run again (it checks before it changes).
#
#   docker/runner/setup.sh --url https://github.com/OWNER/REPO --token-file FILE [options]
#   docker/runner/setup.sh --dry-run --url URL      # print what it would do, change nothing
#   docker/runner/setup.sh labels                   # print the labels this machine gets (one
#                                                   # line per runner with --gpus-per-runner)
#   docker/runner/setup.sh check                    # driver, toolkit and `docker run --gpus all`
#   docker/runner/setup.sh download --dir DIR       # just step 4's download, verified, unpacked
#
# Steps:
#   1. the NVIDIA driver: `nvidia-smi -L` lists a GPU, then /dev/nvidia* exist
#   2. the NVIDIA Container Toolkit: verified (nvidia-ctk), else installed from NVIDIA's apt
#      repository, Docker configured for it; then `docker run --rm --gpus all IMAGE nvidia-smi -L`
#   3. labels from `dlci hardware`: self-hosted, gpu, the hardware class (e.g. a100) and gpus-N
#      (the runner's GPU count); with --gpus-per-runner N, one runner per group of N GPUs, each
#      pinned to its GPUs by UUID (DLCI_RUNNER_GPUS in its .env), with its own folder
#      (DIR/runner-K), name (NAME-K), labels and service (dlci-runner-K)
#   4. the runner: downloaded, its SHA-256 verified before it is unpacked (a pinned table for
#      the pinned version, else the release notes' published checksum, or DLCI_RUNNER_SHA256;
#      with none known it is refused), registered with --ephemeral (one job, then it deregisters),
#      with the job hooks (job-started: GPU health; job-completed: cleanup-hook.sh), and a
#      systemd service that registers it again after every job (a fresh token from
#      --token-command each time)
#
# Options:
#   --url URL              the repository or organization the runner serves
#   --token-file FILE      a registration token (a file, so it stays out of `ps` and history)
#   --token-command CMD    prints a fresh registration token; the service runs it before each
#                          job, e.g. gh api -X POST repos/OWNER/REPO/actions/runners/registration-token --jq .token
#   --name NAME            runner name (default: the host name; NAME-1, NAME-2, ... with
#                          --gpus-per-runner)
#   --gpus-per-runner N    register one runner per N GPUs of this machine (8 GPUs, N=1: eight
#                          runners; N=4: two), each job seeing only its runner's GPUs; default:
#                          one runner with every GPU
#   --labels LIST          more labels, comma-separated, added to the derived ones
#   --group GROUP          the runner group (organization runners)
#   --dir DIR              where the runner lives (default /opt/actions-runner; with
#                          --gpus-per-runner, DIR/runner-1, DIR/runner-2, ...)
#   --user USER            the user that runs jobs (default: actions; in the docker group)
#   --runner-version V     actions/runner release (default: the pinned 2.329.0; `latest` looks
#                          it up; the runner updates itself after registering)
#   --check-image IMAGE    the image for the `docker run --gpus all` check
#                          (default: nvidia/cuda:12.4.1-base-ubuntu22.04)
#   --skip-toolkit         do not install the toolkit (verify only)
#   --dry-run              print every change instead of making it; checks still run
# Environment: DLCI (the dlci command; default: dlci on PATH, else a venv under --dir with
#   this checkout of dl-ci installed), DLCI_PROBES (default nvml,nvidia-smi),
#   DLCI_NVIDIA_DEV_DIR (where to look for nvidia* device nodes; default /dev),
#   DLCI_RUNNER_SHA256 (the runner tarball's SHA-256, from its release page: overrides the
#   pinned table and the release notes; needed where neither knows the version).
set -euo pipefail
shopt -s inherit_errexit # a failure inside $(...) stops the script too

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kit_root=$(cd "$here/../.." && pwd)

runner_version=2.329.0 # pinned: its checksums are in pinned_sha256; it updates itself
url=""
token_file=""
token_command=""
name=$(hostname)
extra_labels=""
group=""
runner_dir=/opt/actions-runner
runner_user=actions
check_image=nvidia/cuda:12.4.1-base-ubuntu22.04
skip_toolkit=0
gpus_per_runner=0
dry_run=0
mode=setup
dev_dir=${DLCI_NVIDIA_DEV_DIR:-/dev}
export DLCI_PROBES=${DLCI_PROBES:-nvml,nvidia-smi}

say() { echo "==> $*"; }
die() {
  echo "runner setup: error: $*" >&2
  exit 1
}
# Run a command that changes the machine, or only print it with --dry-run.
change() {
  if [ "$dry_run" = 1 ]; then
    printf 'would run:'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

while [ "$#" -gt 0 ]; do
  case $1 in
  labels | check | setup | download) mode=$1 ;;
  --url) url=${2:?--url needs a value} && shift ;;
  --token-file) token_file=${2:?--token-file needs a value} && shift ;;
  --token-command) token_command=${2:?--token-command needs a value} && shift ;;
  --name) name=${2:?--name needs a value} && shift ;;
  --labels) extra_labels=${2:?--labels needs a value} && shift ;;
  --group) group=${2:?--group needs a value} && shift ;;
  --dir) runner_dir=${2:?--dir needs a value} && shift ;;
  --gpus-per-runner) gpus_per_runner=${2:?--gpus-per-runner needs a value} && shift ;;
  --user) runner_user=${2:?--user needs a value} && shift ;;
  --runner-version) runner_version=${2:?--runner-version needs a value} && shift ;;
  --check-image) check_image=${2:?--check-image needs a value} && shift ;;
  --skip-toolkit) skip_toolkit=1 ;;
  --dry-run) dry_run=1 ;;
  -h | --help)
    usage
    exit 0
    ;;
  *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
case $gpus_per_runner in
'' | *[!0-9]* | 0*[0-9]*) die "--gpus-per-runner must be a whole number of GPUs, not '$gpus_per_runner'" ;;
esac
base_dir=$runner_dir # the kit's venv (find_dlci) lives here, shared by the runners
base_name=$name
service="dlci-runner"
gpu_uuids="" gpu_count=0 # from nvidia-smi -L (check_driver)
runner_gpus="" # the GPUs (UUIDs, comma-separated) of the runner being set up; '': every GPU

# 1. The driver: nvidia-smi lists at least one GPU, and the device nodes exist.
check_driver() {
  command -v nvidia-smi >/dev/null \
    || die "nvidia-smi is not installed: install the NVIDIA driver first (docs/runner.md, step 1)"
  local listed status=0
  listed=$(nvidia-smi -L 2>&1) || status=$?
  if [ "$status" != 0 ] && ! grep -q 'No devices were found' <<<"$listed"; then
    die "nvidia-smi -L failed (exit $status): ${listed:-no output} (is the driver loaded? try 'sudo modprobe nvidia' or a reboot)"
  fi
  if ! grep -q '^GPU [0-9]' <<<"$listed"; then
    die "nvidia-smi -L lists no GPU: ${listed:-no output}"
  fi
  say "driver: $(grep -c '^GPU [0-9]' <<<"$listed") GPU(s)"
  grep '^GPU [0-9]' <<<"$listed" | sed 's/^/    /'
  gpu_count=$(grep -c '^GPU [0-9]' <<<"$listed")
  gpu_uuids=$(sed -n 's/^GPU [0-9][0-9]*: .*(UUID: \([^)]*\))$/\1/p' <<<"$listed")
  local nodes=("$dev_dir"/nvidia[0-9]*)
  [ -e "${nodes[0]}" ] && [ -e "$dev_dir/nvidiactl" ] \
    || die "no $dev_dir/nvidia[0-9]* or $dev_dir/nvidiactl device nodes although nvidia-smi answers (a container or a broken install?)"
  say "driver: device nodes ${nodes[*]} $dev_dir/nvidiactl"
}

# 2. The NVIDIA Container Toolkit and `docker run --gpus all`.
install_toolkit() {
  local keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
  local list=/etc/apt/sources.list.d/nvidia-container-toolkit.list
  local repo=https://nvidia.github.io/libnvidia-container
  say "toolkit: installing nvidia-container-toolkit from NVIDIA's apt repository"
  if [ "$dry_run" = 1 ]; then
    echo "would run: curl -fsSL $repo/gpgkey | gpg --dearmor -o $keyring"
    echo "would run: curl -fsSL $repo/stable/deb/nvidia-container-toolkit.list (signed-by $keyring) > $list"
  else
    curl -fsSL "$repo/gpgkey" | gpg --dearmor --yes -o "$keyring"
    curl -fsSL "$repo/stable/deb/nvidia-container-toolkit.list" \
      | sed "s#deb https://#deb [signed-by=$keyring] https://#g" >"$list"
  fi
  change apt-get update
  change apt-get install -y nvidia-container-toolkit
}

check_toolkit() {
  command -v docker >/dev/null || die "docker is not installed: install Docker Engine first (docs/runner.md, step 2)"
  if ! command -v nvidia-ctk >/dev/null; then
    [ "$skip_toolkit" = 0 ] || die "nvidia-ctk is not installed and --skip-toolkit was given"
    [ "$mode" = setup ] || die "nvidia-ctk is not installed: run this script without 'check' to install it"
    install_toolkit
  else
    say "toolkit: $(nvidia-ctk --version 2>&1 | head -n 1)"
  fi
  if [ "$dry_run" = 0 ] && docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then
    say "toolkit: Docker has the nvidia runtime"
  else
    change nvidia-ctk runtime configure --runtime=docker
    change systemctl restart docker
  fi
  say "toolkit: docker run --rm --gpus all $check_image nvidia-smi -L"
  if [ "$dry_run" = 1 ]; then
    echo "would run: docker run --rm --gpus all $check_image nvidia-smi -L"
    return 0
  fi
  local out
  out=$(docker run --rm --gpus all "$check_image" nvidia-smi -L 2>&1) \
    || die "docker run --gpus all failed: $out"
  grep -q '^GPU [0-9]' <<<"$out" || die "docker run --gpus all: the container sees no GPU: $out"
  say "toolkit: the container sees $(grep -c '^GPU [0-9]' <<<"$out") GPU(s)"
}

# 3. Labels, from dl-ci's own hardware detection (the class the action will select a tier for).
find_dlci() {
  if [ -n "${DLCI:-}" ]; then
    echo "$DLCI"
  elif command -v dlci >/dev/null; then
    command -v dlci
  else
    local venv=$base_dir/dl-ci-venv
    if [ ! -x "$venv/bin/dlci" ]; then
      say "dlci: installing dl-ci from $kit_root into $venv" >&2
      if ! python3 -c 'import ensurepip' 2>/dev/null; then
        change apt-get install -y python3-venv >&2 # not on a stock Ubuntu server
      fi
      change python3 -m venv "$venv" >&2
      change "$venv/bin/pip" install --quiet "$kit_root" >&2
    fi
    echo "$venv/bin/dlci"
  fi
}

hardware_class() {
  local dlci report class
  dlci=$(find_dlci) || exit 1
  if [ "$dry_run" = 1 ] && [ ! -x "$dlci" ] && ! command -v "$dlci" >/dev/null; then
    echo "unknown-until-installed"
    return 0
  fi
  # the runner's own GPUs only (DLCI_RUNNER_GPUS): its class is theirs, not the machine's
  report=$(DLCI_RUNNER_GPUS=$runner_gpus "$dlci" hardware --json) || die "dlci hardware failed"
  class=$(python3 -c 'import json, sys; print(json.load(sys.stdin)["hardware_class"])' <<<"$report") \
    || die "could not read the class from dlci hardware's report"
  [ "$class" != cpu ] \
    || die "dlci hardware found no GPU (class cpu): $(python3 -c 'import json, sys; print(json.load(sys.stdin)["class_reason"])' <<<"$report")"
  echo "$class"
}

# The labels config.sh gets (GitHub adds self-hosted, the OS and the architecture itself):
# gpu, the class and gpus-N of the runner's own GPUs (runner_gpus; '': every GPU).
custom_labels() {
  local class count
  class=$(hardware_class) || exit 1
  if [ -n "$runner_gpus" ]; then
    count=$(tr ',' '\n' <<<"$runner_gpus" | grep -c .)
  else
    count=$gpu_count
  fi
  echo "gpu,$class,gpus-$count${extra_labels:+,$extra_labels}"
}

# The runners this machine gets, one line each: NAME DIR SERVICE GPUS (GPUS: UUIDs,
# comma-separated; '-' for one runner with every GPU).
plan_runners() {
  if [ "$gpus_per_runner" = 0 ]; then
    echo "$base_name $base_dir dlci-runner -"
    return 0
  fi
  local uuids total k=0 group
  mapfile -t uuids <<<"$gpu_uuids"
  total=${#uuids[@]}
  [ -n "${uuids[0]:-}" ] || die "nvidia-smi -L gives no GPU UUID to pin the runners to"
  [ "$gpus_per_runner" -le "$total" ] \
    || die "--gpus-per-runner $gpus_per_runner: this machine has $total GPU(s)"
  [ $((total % gpus_per_runner)) = 0 ] \
    || say "runners: $((total % gpus_per_runner)) GPU(s) left over get no runner ($total GPUs, $gpus_per_runner per runner)" >&2
  while [ $(((k + 1) * gpus_per_runner)) -le "$total" ]; do
    group=$(IFS=, && echo "${uuids[*]:$((k * gpus_per_runner)):$gpus_per_runner}")
    k=$((k + 1))
    echo "$base_name-$k $base_dir/runner-$k dlci-runner-$k $group"
  done
}

# 4. The runner, verified, registered as ephemeral, with the hooks and a service that
# re-registers it.

# The SHA-256 of actions/runner's tarballs, as its release notes publish them
# (<!-- BEGIN SHA linux-x64 -->...<!-- END SHA linux-x64 -->), for the versions pinned here.
pinned_sha256() {
  case $1 in
  2.329.0-linux-x64) echo 194f1e1e4bd02f80b7e9633fc546084d8d4e19f3928a324d512ea53430102e1d ;;
  2.329.0-linux-arm64) echo 56768348b3d643a6a29d4ad71e9bdae0dc0ef1eb01afe0f7a8ee097b039bfaaf ;;
  2.320.0-linux-x64) echo 93ac1b7ce743ee85b5d386f5c1787385ef07b3d7c728ff66ce0d3813d5f46900 ;;
  2.320.0-linux-arm64) echo bec1832fe6d2ed75acf4b7d8f2ce1169239a913b84ab1ded028076c9fa5091b8 ;;
  *) return 1 ;;
  esac
}

runner_platform() {
  case $(uname -m) in
  x86_64) echo linux-x64 ;;
  aarch64) echo linux-arm64 ;;
  *) die "no actions/runner build for $(uname -m)" ;;
  esac
}

# An actions/runner release's JSON from GitHub's API: `latest` or a version.
release_json() {
  local which=tags/v$1
  [ "$1" != latest ] || which=latest
  curl -fsSL "https://api.github.com/repos/actions/runner/releases/$which"
}

# KEY of a release's JSON on stdin: `version` (tag_name without v) or a platform's checksum
# between the release notes' markers (nothing when the markers are missing).
release_field() {
  python3 -c '
import json, re, sys
release, key = json.load(sys.stdin), sys.argv[1]
if key == "version":
    print(str(release["tag_name"]).lstrip("v"))
else:
    marks = re.escape(f"<!-- BEGIN SHA {key} -->"), re.escape(f"<!-- END SHA {key} -->")
    found = re.search(marks[0] + r"\s*([0-9a-fA-F]{64})\s*" + marks[1], release.get("body") or "")
    print(found.group(1).lower() if found else "")
' "$1"
}

# Download the runner into $runner_dir, verify its SHA-256, and only then unpack it.
fetch_runner() {
  local platform release="" tarball expected="" source actual part
  platform=$(runner_platform) || exit 1
  if [ "$runner_version" = latest ]; then
    if [ "$dry_run" = 1 ]; then
      say "runner: would look up the latest actions/runner release and its checksum"
      runner_version=LATEST
    else
      if ! release=$(release_json latest) || ! runner_version=$(release_field version <<<"$release"); then
        die "could not look up the latest actions/runner release; give --runner-version"
      fi
    fi
  fi
  tarball=actions-runner-$platform-$runner_version.tar.gz
  if [ -n "${DLCI_RUNNER_SHA256:-}" ]; then
    expected=$DLCI_RUNNER_SHA256 source=DLCI_RUNNER_SHA256
  elif expected=$(pinned_sha256 "$runner_version-$platform"); then
    source="setup.sh's pinned table"
  elif [ "$dry_run" = 1 ]; then
    source="the release notes of v$runner_version (looked up when not a dry run)"
  else
    source="the release notes of v$runner_version"
    [ -n "$release" ] || release=$(release_json "$runner_version") || release=""
    [ -z "$release" ] || expected=$(release_field "$platform" <<<"$release") || expected=""
    [ -n "$expected" ] || die "no SHA-256 is known for $tarball (not pinned in setup.sh, and the release notes of v$runner_version give none or could not be read): refusing to unpack an unverified runner; set DLCI_RUNNER_SHA256 to the checksum on https://github.com/actions/runner/releases/tag/v$runner_version"
  fi
  expected=${expected,,}
  if [ -n "$expected" ] || [ "$dry_run" = 0 ]; then
    [[ $expected =~ ^[0-9a-f]{64}$ ]] || die "the SHA-256 from $source is not 64 hex digits: '$expected'"
  fi
  local url=https://github.com/actions/runner/releases/download/v$runner_version/$tarball
  if [ "$dry_run" = 1 ]; then
    echo "would run: curl -fsSL -o $runner_dir/$tarball $url"
    echo "would verify: the SHA-256 ${expected:+$expected }from $source, then unpack into $runner_dir"
    return 0
  fi
  part=$runner_dir/$tarball.part
  mkdir -p "$runner_dir"
  curl -fsSL -o "$part" "$url" || {
    rm -f "$part"
    die "could not download $url"
  }
  actual=$(sha256sum "$part" | cut -d ' ' -f 1)
  if [ "$actual" != "$expected" ]; then
    rm -f "$part"
    die "the runner tarball $tarball has SHA-256 $actual, but $source gives $expected: refusing to unpack it (deleted; a corrupted or tampered download)"
  fi
  say "runner: $tarball SHA-256 $actual matches $source"
  tar -xzf "$part" -C "$runner_dir"
  rm -f "$part"
}
read_token() {
  if [ -n "$token_command" ]; then
    bash -c "$token_command"
  elif [ -n "$token_file" ]; then
    [ -r "$token_file" ] || die "cannot read the token file $token_file"
    tr -d '[:space:]' <"$token_file"
  else
    die "a registration token is needed: --token-file FILE or --token-command CMD (docs/runner.md, step 4)"
  fi
}

register() {
  local labels=$1
  [ -n "$url" ] || die "--url is needed: https://github.com/OWNER/REPO or https://github.com/ORG"
  if ! id "$runner_user" >/dev/null 2>&1; then
    change useradd --create-home --shell /bin/bash "$runner_user"
  fi
  change usermod -aG docker "$runner_user"
  change mkdir -p "$runner_dir"
  if [ ! -x "$runner_dir/config.sh" ]; then
    fetch_runner
    change "$runner_dir/bin/installdependencies.sh"
  fi
  # the hooks: the runner runs them around every job (ACTIONS_RUNNER_HOOK_JOB_*)
  # (a hook is a script's path, with no arguments: the hook reads its mode from its name)
  change install -m 0755 "$here/cleanup-hook.sh" "$runner_dir/dlci-job-started.sh"
  change install -m 0755 "$here/cleanup-hook.sh" "$runner_dir/dlci-job-completed.sh"
  local env_file=$runner_dir/.env
  # the hooks; the runner's name (the job-completed hook removes its own runner's containers
  # only); its GPUs when the machine has several runners (the jobs see only those)
  local lines=("ACTIONS_RUNNER_HOOK_JOB_STARTED=$runner_dir/dlci-job-started.sh"
    "ACTIONS_RUNNER_HOOK_JOB_COMPLETED=$runner_dir/dlci-job-completed.sh"
    "DLCI_RUNNER=$name")
  [ -z "$runner_gpus" ] || lines+=("DLCI_RUNNER_GPUS=$runner_gpus")
  if [ "$dry_run" = 1 ]; then
    echo "would write to $env_file:"
    printf '    %s\n' "${lines[@]}"
  else
    touch "$env_file"
    grep -v -e '^ACTIONS_RUNNER_HOOK_JOB_' -e '^DLCI_RUNNER=' -e '^DLCI_RUNNER_GPUS=' \
      "$env_file" >"$env_file.new" || true
    printf '%s\n' "${lines[@]}" >>"$env_file.new"
    mv "$env_file.new" "$env_file"
  fi
  change chown -R "$runner_user:" "$runner_dir"
  local config=(./config.sh --unattended --replace --ephemeral --url "$url" --name "$name"
    --labels "$labels" --work _work)
  [ -z "$group" ] || config+=(--runnergroup "$group")
  say "runner: registering $name at $url as ephemeral with labels self-hosted,$labels"
  if [ -f "$runner_dir/.runner" ]; then
    say "runner: already registered in $runner_dir (to register again: sudo -u $runner_user ./config.sh remove --local)"
  elif [ "$dry_run" = 1 ]; then
    printf 'would run (in %s, as %s, the token in ACTIONS_RUNNER_INPUT_TOKEN):' "$runner_dir" "$runner_user"
    printf ' %q' "${config[@]}"
    printf '\n'
  else
    local token
    token=$(read_token) || die "could not get a registration token"
    # the token goes in the environment, not on the command line (ps would show it)
    (cd "$runner_dir" && ACTIONS_RUNNER_INPUT_TOKEN=$token \
      sudo --preserve-env=ACTIONS_RUNNER_INPUT_TOKEN -u "$runner_user" "${config[@]}")
  fi
  install_service "$labels"
}

install_service() {
  local labels=$1 unit=/etc/systemd/system/$service.service
  local loop=$runner_dir/dlci-runner-loop.sh
  local body
  # An ephemeral runner exits after one job: the loop registers it again with a fresh token.
  body=$(
    cat <<LOOP
#!/usr/bin/env bash
set -euo pipefail
cd $(printf '%q' "$runner_dir")
while true; do
  if [ ! -f .runner ]; then
    rm -rf _work # the last job's workspace: the next job starts clean
    token=\$(bash -c $(printf '%q' "${token_command:-false}")) || { echo "no registration token" >&2; exit 1; }
    export ACTIONS_RUNNER_INPUT_TOKEN=\$token
    ./config.sh --unattended --replace --ephemeral --url $(printf '%q' "$url") --name $(printf '%q' "$name") --labels $(printf '%q' "$labels") --work _work${group:+ --runnergroup $(printf '%q' "$group")}
    unset ACTIONS_RUNNER_INPUT_TOKEN
  fi
  ./run.sh || sleep 10
done
LOOP
  )
  if [ "$dry_run" = 1 ]; then
    echo "would write $loop (re-registers after every job) and $unit, then enable it"
    return 0
  fi
  [ -n "$token_command" ] \
    || say "runner: no --token-command: the service runs one job; give one to re-register after each job"
  echo "$body" >"$loop"
  chmod 0755 "$loop"
  chown "$runner_user:" "$loop"
  cat >"$unit" <<UNIT
[Unit]
Description=GitHub Actions runner $name for dl-ci (ephemeral, re-registered after each job)
After=network-online.target docker.service
Wants=network-online.target

[Service]
User=$runner_user
WorkingDirectory=$runner_dir
ExecStart=$loop
Restart=on-failure
RestartSec=30
KillMode=process
TimeoutStopSec=5min

[Install]
WantedBy=multi-user.target
UNIT
  systemctl daemon-reload
  systemctl enable --now "$service.service"
  say "runner: service $service enabled (journalctl -u $service)"
}

# Each runner of the plan in turn: NAME, DIR, SERVICE and GPUS set for the functions above.
for_each_runner() {
  local plan gpus
  plan=$(plan_runners) || exit 1
  # fd 3: the steps' own commands (sudo, config.sh) read stdin
  while read -r name runner_dir service gpus <&3; do
    runner_gpus=${gpus#-}
    "$@"
  done 3<<<"$plan"
}

print_labels() {
  local labels
  labels=$(custom_labels) || exit 1
  if [ "$gpus_per_runner" = 0 ]; then
    echo "self-hosted,$labels"
  else
    echo "$name self-hosted,$labels DLCI_RUNNER_GPUS=$runner_gpus"
  fi
}

setup_runner() {
  local labels
  labels=$(custom_labels) || exit 1
  say "labels: self-hosted,$labels"
  say "runner $name: ${runner_gpus:+GPUs $runner_gpus, }in $runner_dir, service $service"
  register "$labels"
  say "done: $name takes jobs with runs-on: [self-hosted, ${labels//,/, }]"
}

case $mode in
labels)
  check_driver >&2
  for_each_runner print_labels
  ;;
check)
  check_driver
  check_toolkit
  ;;
download) fetch_runner ;;
setup)
  [ "$dry_run" = 1 ] || [ "$(id -u)" = 0 ] || die "run as root (or with --dry-run to see what it would do)"
  check_driver
  check_toolkit
  for_each_runner setup_runner
  ;;
esac
