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


def _run(image: str, script: str) -> subprocess.CompletedProcess[str]:
    """``bash -c SCRIPT`` in ``image`` with no network and the kit's script mounted read-only."""
    argv = ["docker", "run", "--rm", "--network", "none"]
    argv += ["--label", f"{RUN_LABEL}=shapes-{uuid.uuid4().hex[:8]}"]
    argv += ["--volume", f"{SCRIPT}:/kit-venv.sh:ro"]
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


def _kit(venv: str, env: str = "") -> str:
    """The kit's venv at ``venv`` as the Dockerfile makes it, then what it imports (one JSON
    line) and whether it has pip."""
    return (
        f"{env} VIRTUAL_ENV={venv} bash /kit-venv.sh"
        f" && {venv}/bin/python -c 'import json, os, sys, torch;"
        ' print(json.dumps({"torch": os.path.realpath(torch.__file__), "prefix": sys.prefix}))\''
        f" && {venv}/bin/python -m pip --version >/dev/null && echo pip-ok"
    )


def _session(image: str, *parts: str) -> list[str]:
    """``parts`` in one container of ``image`` (one start, not one a part), each part's
    output, standard error within it, in order."""
    script = "; ".join(f"echo '=== part'; {{ {part}; }} 2>&1" for part in parts)
    proc = _run(image, script)
    assert proc.returncode == 0, f"{image}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout.split("=== part\n")[1:]


def _made(out: str) -> dict[str, str]:
    """The kit's venv's torch, from a ``_kit`` part that must have worked, with its pip."""
    lines = out.splitlines()
    assert lines[-1] == "pip-ok", out  # the venv has pip, even where the base has none
    return json.loads(lines[-2])


def test_uv_environment_first_on_path(shapes: str) -> None:
    # the premise: uv's venv has no pip, and a venv made from its python loses torch
    premise, made = _session(
        f"{shapes}:uv",
        "python3 -m pip --version; echo pip=$?; python3 -m venv --system-site-packages /tmp/v"
        " && /tmp/v/bin/python -c 'import torch'; echo torch=$?",
        _kit("/tmp/kit"),
    )
    assert "pip=1" in premise and "No module named 'torch'" in premise, premise
    assert "torch=1" in premise
    kit = _made(made)
    assert kit["torch"].startswith("/opt/uv-env/lib/"), kit  # the environment's torch
    assert kit["prefix"] == "/tmp/kit"
    assert "in the virtual environment /opt/uv-env" in made


def test_conda_prefix_first_on_path(shapes: str) -> None:
    premise, made, dropped = _session(
        f"{shapes}:conda",
        "python -c 'import sys; print(sys.prefix, sys.base_prefix)'",
        _kit("/tmp/kit"),
        # a derived image that dropped /opt/conda/bin from PATH: conda's python is still found
        _kit("/tmp/kit2", env=f"PATH={SYSTEM_PATH}"),
    )
    assert premise.split() == ["/opt/conda", "/opt/conda"]  # not a virtual environment
    assert _made(made)["torch"].startswith("/opt/conda/"), made
    assert "/opt/conda/bin/python3 has torch" in made and "virtual environment" not in made
    assert _made(dropped)["torch"].startswith("/opt/conda/"), dropped
    assert "/usr/bin/python3: no torch" in dropped
    assert "/opt/conda/bin/python has torch" in dropped


def test_two_pythons_the_second_has_torch(shapes: str) -> None:
    # the premise: python3 and python, the names a search of those alone would try, have none,
    # and a venv made through the python3.11 link looks for its library beside the link
    premise, made, named = _session(
        f"{shapes}:two-python",
        "python3 -c 'import torch' 2>/dev/null; echo $?; command -v python || echo none;"
        " /opt/alt/bin/python3.11 -m venv --system-site-packages /tmp/v"
        " && /tmp/v/bin/python -c 'import torch' 2>/dev/null; echo $?",
        _kit("/tmp/kit"),
        # BASE_PYTHON names one with no torch: a located error, not a second torch
        "BASE_PYTHON=python3 VIRTUAL_ENV=/tmp/kit3 bash /kit-venv.sh; echo rc=$?",
    )
    assert premise.split() == ["1", "none", "1"], premise
    assert _made(made)["torch"].startswith("/opt/conda/"), made  # python3.11's, by its link
    assert "/usr/bin/python3: no torch" in made and "/opt/alt/bin/python3.11 has torch" in made
    assert "rc=1" in named
    assert "BASE_PYTHON=python3 (/usr/bin/python3) does not import torch" in named
