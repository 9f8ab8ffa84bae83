#!/usr/bin/env bash
# Makes the kit's virtual environment ($VIRTUAL_ENV, /opt/dlci in the image) over the base
# image's torch, when one of the base's pythons has it. Run by docker/Dockerfile before any pip
# install; tests/e2e/test_base_shapes.py runs it on each shape of base.
#
# Which python: BASE_PYTHON when set (a path or a name on PATH; it must import torch), else
# the first python on PATH that imports torch, PATH's folders in order and in each python3,
# python, then python3.N from the newest (a base with two pythons, one of them with torch),
# else /opt/conda/bin/python (pytorch/pytorch's, if a derived image dropped it from PATH).
#
# How the venv sees that python's torch:
# - a python that is not a virtual environment's (the system python of NVIDIA's images,
#   conda's /opt/conda): a venv made by it with --system-site-packages;
# - a virtual environment's (python3 -m venv /opt/venv, uv venv; first on PATH): a venv made
#   from it would see only its base interpreter's packages, so the venv is made from that base
#   interpreter and a .pth file adds the environment's site folders with site.addsitedir, which
#   also reads the .pth files inside them (editable installs, uv's).
# The venv must then import the very torch that python imports (same file), or this fails.
# No python with torch: a plain venv from python3, and exit 0; the Dockerfile installs torch.
# TORCH_SPEC set: a venv that does not see the chosen torch is no error (TORCH_SPEC goes in).
#
# Exit 0: the venv is made (over the base's torch, or plain); 1: a located error on stderr.
set -euo pipefail

venv=${VIRTUAL_ENV:?VIRTUAL_ENV must name the venv to make}
say() { echo "kit-venv: $*"; }
die() {
  echo "kit-venv: error: $*" >&2
  exit 1
}

# torch's file as the python $1 sees it ("" when it has none), within 120 s; what else the
# python prints (a wrapper's banner, a warning) is not read: the answer carries a marker. A
# python that does not answer in time stops the build (a slow import is not "no torch", which
# would install a second one).
torch_file() {
  local out rc=0
  out=$(timeout 120 "$1" -W ignore -c 'import os, torch
print("dlci-torch:" + os.path.realpath(torch.__file__))' </dev/null 2>/dev/null) || rc=$?
  if [ "$rc" = 124 ]; then
    die "$1 did not finish importing torch within 120 s: name the python with the base's" \
      "torch with BASE_PYTHON, or set TORCH_SPEC to install one"
  fi
  sed -n 's/^dlci-torch://p' <<<"$out" | tail -n 1
}

# why the python $1 cannot import torch: the last lines of its error
import_error() {
  timeout 120 "$1" -c 'import torch' </dev/null 2>&1 | tail -n 3 | tr '\n' ' ' || true
}

# every python3, python and python3.N in PATH's folders, in PATH order, newest python3.N first
pythons_on_path() {
  local dir name
  local -a dirs
  IFS=: read -r -a dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [ -n "$dir" ] && [ -d "$dir" ] || continue
    [ "$(realpath -m "$dir")" = "$(realpath -m "$venv/bin")" ] && continue
    for name in python3 python; do
      [ -x "$dir/$name" ] && echo "$dir/$name"
    done
    find "$dir" -maxdepth 1 -regex '.*/python3\.[0-9]+' -perm -u+x 2>/dev/null |
      while read -r path; do echo "${path##*python3.} $path"; done | sort -k1,1nr |
      while read -r _ path; do echo "$path"; done
  done
}

chosen='' chosen_torch=''
if [ -n "${BASE_PYTHON:-}" ]; then
  chosen=$(command -v "$BASE_PYTHON" || true)
  [ -n "$chosen" ] || die "BASE_PYTHON=$BASE_PYTHON: no such python in the base image"
  chosen_torch=$(torch_file "$chosen")
  [ -n "$chosen_torch" ] || die "BASE_PYTHON=$BASE_PYTHON ($chosen) does not import torch:" \
    "name the python that has the base's torch, or leave BASE_PYTHON empty to install one"
else
  declare -A seen=()
  while read -r candidate; do
    # one python per real file, but a venv's python (a link to its base interpreter) is its
    # own: its environment may hold torch where the base interpreter has none
    real=$(realpath -m "$candidate")
    env_dir=$(dirname "$candidate")/..
    [ -f "$env_dir/pyvenv.cfg" ] && real="$real in $(realpath -m "$env_dir")"
    [ -z "${seen[$real]:-}" ] || continue
    seen[$real]=1
    file=$(torch_file "$candidate")
    if [ -n "$file" ]; then
      chosen=$candidate chosen_torch=$file
      break
    fi
    say "$candidate: no torch"
  done < <(
    pythons_on_path
    [ -x /opt/conda/bin/python ] && echo /opt/conda/bin/python
  )
fi

if [ -z "$chosen" ]; then
  say "no python of the base imports torch: a plain venv from python3 (torch is installed;" \
    "if the base has a python with torch that was not found, name it with BASE_PYTHON)"
  python3 -m venv "$venv" || die "python3 -m venv $venv failed: the base needs python3's venv" \
    "module (Debian and Ubuntu: python3-venv)"
  exit 0
fi

# The interpreters by their real files: a venv made through a link in another folder
# (/opt/alt/bin/python3.11 -> /opt/python/bin/python3.11) would look for its standard library
# beside the link, and fall back to another python's.
# dl-ci needs Python 3.10 or newer (a Python 2 or 3.8 with torch would fail later, in pip)
version=$("$chosen" -c 'import sys; print("dlci-version:%d.%d" % sys.version_info[:2])' \
  </dev/null 2>/dev/null | sed -n 's/^dlci-version://p' | tail -n 1)
case $version in
3.1[0-9] | 3.[2-9][0-9]) ;;
*) die "$chosen has torch but is Python ${version:-of an unknown version}; dl-ci needs 3.10 or" \
  "newer: name another python with BASE_PYTHON, or set TORCH_SPEC to install torch" ;;
esac
mapfile -t env_of < <("$chosen" -c 'import os, sys, sysconfig
for line in (int(sys.prefix != sys.base_prefix), sys.prefix,
             os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable),
             sysconfig.get_path("purelib"), sysconfig.get_path("platlib"),
             os.path.realpath(sys.executable)):
    print("dlci-env:%s" % line)' </dev/null 2>/dev/null | sed -n 's/^dlci-env://p')
[ "${#env_of[@]}" -eq 6 ] || die "$chosen could not say where its packages are"
if [ "${env_of[0]}" = 1 ]; then
  maker=${env_of[2]}
  say "$chosen has torch ($chosen_torch) in the virtual environment ${env_of[1]}: the venv is" \
    "made from its interpreter $maker and reads that environment's site folders"
else
  maker=${env_of[5]}
  say "$chosen has torch ($chosen_torch): the venv is made by $maker and uses its site packages"
fi
"$maker" -m venv --system-site-packages "$venv" ||
  die "$maker -m venv $venv failed: that python needs its venv module and ensurepip" \
    "(Debian and Ubuntu: python3-venv), or set BASE_PYTHON to another python with torch"
if [ "${env_of[0]}" = 1 ]; then
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  "$venv/bin/python" -c 'import sys
for folder in dict.fromkeys(sys.argv[1:]):
    print(f"import site; site.addsitedir({folder!r})")' "${env_of[3]}" "${env_of[4]}" \
    >"$site/dlci-base-env.pth"
fi

seen_torch=$(torch_file "$venv/bin/python")
if [ "$seen_torch" != "$chosen_torch" ] && [ -n "${TORCH_SPEC:-}" ]; then
  say "the venv does not see $chosen's torch; TORCH_SPEC=$TORCH_SPEC is installed into it"
  exit 0
elif [ "$seen_torch" != "$chosen_torch" ]; then
  why=""
  [ -n "$seen_torch" ] || why=" ($(import_error "$venv/bin/python"))"
  die "$chosen imports torch from $chosen_torch, but the venv made from it" \
    "${seen_torch:+imports $seen_torch}${seen_torch:-does not import torch$why}: set" \
    "BASE_PYTHON to the python with the base's torch, or TORCH_SPEC=torch==<version> to" \
    "install one"
fi
say "the venv $venv imports the base's torch ($seen_torch)"
