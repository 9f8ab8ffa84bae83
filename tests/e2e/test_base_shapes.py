"""The kit's venv on each common shape of base with torch: it sees the base's torch, one torch.

``scripts/e2e_setup.sh shapes`` builds three shapes, offline, on one image's layers (torch
from the wheelhouse):

- ``uv``: a uv environment first on PATH (``uv venv``, which has no pip, torch installed by
  ``uv pip``);
- ``conda``: a prefix install at ``/opt/conda`` first on PATH, its own interpreter and site
  folder, not a virtual environment (a stand-in for pytorch/pytorch's conda: no conda channel
  is reached here);
- ``two-python``: the system ``python3`` first on PATH without torch, and a second python
  with torch, reachable only as ``python3.11`` in ``/opt/alt/bin`` later on PATH (as
  ``make altinstall`` or deadsnakes lay one out; a link to the stand-in's interpreter).

The shapes differ only in how the torch layer of docker/Dockerfile finds the base's torch and
makes the venv over it, so each test runs that step, ``docker/kit-venv.sh``, in its shape (no
network), and checks that the venv imports the base's torch from its own file, and has pip.
The full build through the Dockerfile is tested on the system-python and venv bases
(test_torch_base.py). Each test also shows its shape's premise, the control: what the naive
route (a venv from the first python3, or a search of python3 and python only) would lose.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import RUN_LABEL, missing, run_setup

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "kit-venv.sh"
SHAPES = os.environ.get("DLCI_E2E_SHAPES", "dlci-e2e-shape")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the kit's venv as the Dockerfile makes it, then what it imports, as one JSON line
KIT = (
    "VIRTUAL_ENV=/tmp/kit bash /kit-venv.sh"
    " && /tmp/kit/bin/python -c 'import json, os, sys, torch;"
    ' print(json.dumps({"torch": os.path.realpath(torch.__file__), "prefix": sys.prefix}))\''
    " && /tmp/kit/bin/python -m pip --version >/dev/null && echo pip-ok"
)


def _run(
    image: str, script: str, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``bash -c SCRIPT`` in ``image`` with no network and the kit's script mounted read-only."""
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", f"{RUN_LABEL}=shapes-{uuid.uuid4().hex[:8]}"]
    argv += ["--volume", f"{SCRIPT}:/kit-venv.sh:ro"]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    return subprocess.run(
        [*argv, image, "bash", "-c", script], capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def shapes(docker_engine: str) -> str:
    if os.environ.get("DLCI_E2E_SKIP_BUILD") != "1":
        proc = run_setup("shapes")
        if proc.returncode != 0:
            missing(f"scripts/e2e_setup.sh shapes failed:\n{proc.stdout}{proc.stderr}")
    for tag in ("uv", "conda", "two-python"):
        found = subprocess.run(
            ["docker", "image", "inspect", f"{SHAPES}:{tag}"], capture_output=True, timeout=60
        )
        if found.returncode != 0:
            missing(f"no image {SHAPES}:{tag}")
    return SHAPES


def _kit(image: str, **env: str) -> tuple[dict[str, str], str]:
    proc = _run(image, KIT, env=env)
    assert proc.returncode == 0, f"kit-venv.sh in {image}:\n{proc.stdout}{proc.stderr}"
    lines = proc.stdout.splitlines()
    assert lines[-1] == "pip-ok", proc.stdout  # the venv has pip, even where the base has none
    return json.loads(lines[-2]), proc.stdout


def test_uv_environment_first_on_path(shapes: str) -> None:
    image = f"{shapes}:uv"
    # the premise: uv's venv has no pip, and a venv made from its python loses torch
    premise = _run(
        image,
        "python3 -m pip --version; echo pip=$?;"
        " python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/python -c 'import torch'",
    )
    assert "pip=1" in premise.stdout, premise.stdout + premise.stderr
    assert premise.returncode != 0 and "No module named 'torch'" in premise.stderr
    kit, out = _kit(image)
    assert kit["torch"].startswith("/opt/uv-env/lib/"), kit  # the environment's torch
    assert kit["prefix"] == "/tmp/kit"
    assert "in the virtual environment /opt/uv-env" in out


def test_conda_prefix_first_on_path(shapes: str) -> None:
    image = f"{shapes}:conda"
    premise = _run(image, "python -c 'import sys; print(sys.prefix, sys.base_prefix)'")
    assert premise.stdout.split() == ["/opt/conda", "/opt/conda"]  # not a virtual environment
    kit, out = _kit(image)
    assert kit["torch"].startswith("/opt/conda/"), kit
    assert "/opt/conda/bin/python3 has torch" in out and "virtual environment" not in out
    # a derived image that dropped /opt/conda/bin from PATH: conda's python is still found
    kit, out = _kit(image, PATH=SYSTEM_PATH)
    assert kit["torch"].startswith("/opt/conda/"), kit
    assert "/usr/bin/python3: no torch" in out and "/opt/conda/bin/python has torch" in out


def test_two_pythons_the_second_has_torch(shapes: str) -> None:
    image = f"{shapes}:two-python"
    # the premise: python3 and python, the names a search of those alone would try, have none
    # and a venv made through the python3.11 link looks for its library beside the link
    premise = _run(
        image,
        "python3 -c 'import torch'; echo $?; command -v python || echo none;"
        " /opt/alt/bin/python3.11 -m venv --system-site-packages /tmp/v"
        " && /tmp/v/bin/python -c 'import torch'; echo $?",
    )
    assert premise.stdout.split() == ["1", "none", "1"], premise.stdout + premise.stderr
    kit, out = _kit(image)
    assert kit["torch"].startswith("/opt/conda/"), kit  # python3.11's, through its link
    assert "/usr/bin/python3: no torch" in out and "/opt/alt/bin/python3.11 has torch" in out
    # BASE_PYTHON names one with no torch: a located error, not a second torch
    named = _run(image, KIT, env={"BASE_PYTHON": "python3"})
    assert named.returncode == 1
    assert "BASE_PYTHON=python3 (/usr/bin/python3) does not import torch" in named.stderr
