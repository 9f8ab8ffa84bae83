#!/usr/bin/env bash
# Install dl-ci and run the main job on the embedded default, on whatever machine this is.
#   scripts/demo.sh
# Until the bundled example lands, the job is: detect the hardware, then select the tier.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
venv=${VENV:-.venv}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e .

echo "==> dlci hardware"
"$venv/bin/dlci" hardware --probes nvml,nvidia-smi
echo
echo "==> dlci tier"
"$venv/bin/dlci" tier --probes nvml,nvidia-smi
