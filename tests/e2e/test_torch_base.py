"""The kit image on a base that already has PyTorch: the base's torch is reused, never doubled.

``scripts/e2e_setup.sh torchbase`` builds ``dlci-e2e-torchbase:bookworm``: the offline Debian
base with the wheelhouse's CPU torch installed into its system python, as pytorch/pytorch and
NVIDIA's PyTorch images ship it. The kit image is built on it by ``dlci container build`` from
a copy of the kit whose wheelhouse has no torch wheel, offline (``PIP_OFFLINE=1``): it builds,
and holds one torch, the base's. ``e2e_setup.sh venvbase`` builds a base whose torch lives in a
virtual environment first on PATH (``/opt/venv``): the kit's venv must really see that torch.
The control builds the same torch-less kit on the plain base,
which has no torch: that build fails, so the first one needed no torch wheel only because the
base had torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import RUN_LABEL, missing, run_setup
from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PLAIN_BASE = os.environ.get("DLCI_E2E_BASE_IMAGE", "dlci-e2e-base:bookworm")
TORCH_BASE = os.environ.get("DLCI_E2E_TORCH_BASE", "dlci-e2e-torchbase:bookworm")
VENV_BASE = os.environ.get("DLCI_E2E_VENV_BASE", "dlci-e2e-venvbase:bookworm")
REPOSITORY = "dlci-e2e-torchbase-kit"
# what the test asks of a python in a container: torch's version and file, as JSON
TORCH_INFO = "import json, torch; print(json.dumps([str(torch.__version__), torch.__file__]))"


def _docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _run(image: str, script: str) -> str:
    """``bash -c SCRIPT`` in ``image`` as an arbitrary uid, no network; its stdout."""
    argv = ["run", "--rm", "--network", "none", "--user", "12345:12345"]
    argv += ["--label", f"{RUN_LABEL}=torchbase-{uuid.uuid4().hex[:8]}"]
    proc = _docker(*argv, image, "bash", "-c", script)
    assert proc.returncode == 0, f"{script!r} in {image}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _size_mb(image: str) -> int:
    return int(_docker("image", "inspect", "--format", "{{.Size}}", image).stdout) // 10**6


def _setup(part: str, *images: str) -> None:
    """``scripts/e2e_setup.sh PART`` (quick when its image is there), then the images."""
    if os.environ.get("DLCI_E2E_SKIP_BUILD") != "1":
        proc = run_setup(part)
        if proc.returncode != 0:
            missing(f"scripts/e2e_setup.sh {part} failed:\n{proc.stdout}{proc.stderr}")
    for image in images:
        if _docker("image", "inspect", image, timeout=60).returncode != 0:
            missing(f"no image {image}")


@pytest.fixture(scope="module")
def torch_base(docker_engine: str) -> str:
    """The base with torch, brought up to date by the setup script (skipped when it is there)."""
    _setup("torchbase", TORCH_BASE, PLAIN_BASE)
    return TORCH_BASE


@pytest.fixture(scope="module")
def venv_base(docker_engine: str) -> str:
    """The base whose torch is in /opt/venv, first on PATH (``e2e_setup.sh venvbase``)."""
    _setup("venvbase", VENV_BASE)
    return VENV_BASE


@pytest.fixture(scope="module")
def torchless_kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the kit (what docker/Dockerfile copies) whose wheelhouse has no torch wheel."""
    kit = tmp_path_factory.mktemp("kit")
    for name in ("pyproject.toml", "README.md", ".dockerignore"):
        shutil.copy2(ROOT / name, kit / name)
    shutil.copytree(ROOT / "src", kit / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (kit / "docker" / "wheelhouse").mkdir(parents=True)
    for name in ("Dockerfile", "kit-venv.sh"):  # what the Dockerfile copies from docker/
        shutil.copy2(ROOT / "docker" / name, kit / "docker" / name)
    wheels = sorted((ROOT / "docker" / "wheelhouse").glob("*.whl"))
    assert any(w.name.startswith("torch-") for w in wheels), "the kit's wheelhouse has no torch"
    for wheel in wheels:
        if not wheel.name.lower().startswith("torch-"):
            try:
                os.link(wheel, kit / "docker" / "wheelhouse" / wheel.name)
            except OSError:  # another file system
                shutil.copy2(wheel, kit / "docker" / "wheelhouse" / wheel.name)
    assert not list((kit / "docker" / "wheelhouse").glob("torch-*.whl"))
    return kit


def _build(kit: Path, base: str) -> list[str]:
    return ["container", "build", "--kit", str(kit), "--base-image", base]


@pytest.fixture(scope="module")
def built(torch_base: str, torchless_kit: Path) -> Iterator[tuple[str, float]]:
    """The kit image built on the torch base from the torch-less wheelhouse, and its time."""
    argv = [*_build(torchless_kit, torch_base), "--build-arg", "PIP_OFFLINE=1"]
    start = time.perf_counter()
    code = main([*argv, "--repository", REPOSITORY])
    seconds = time.perf_counter() - start
    assert code == 0, "the kit image did not build on the base with torch"
    tag = _docker("images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY).stdout.split()
    assert len(tag) == 1, tag
    yield tag[0], seconds
    _docker("rmi", tag[0])


def test_the_image_reuses_the_base_torch(torch_base: str, built: tuple[str, float]) -> None:
    image, seconds = built
    base_torch = json.loads(_run(torch_base, f"python3 -c '{TORCH_INFO}'"))
    out = _run(
        image,
        f"python -c '{TORCH_INFO}' && cat /etc/dlci/torch.json && dlci --version"
        " && pip list --format json 2>/dev/null"
        " && (find / -xdev -maxdepth 8 -type d -name torch -path '*-packages/torch' 2>/dev/null"
        " || true)",
    )
    lines = out.splitlines()
    image_torch, record = json.loads(lines[0]), json.loads(lines[1])
    assert image_torch == base_torch  # the same version, from the same file
    assert lines[2].startswith("dlci ")
    listed = [p for p in json.loads(lines[3]) if p["name"].lower() == "torch"]
    assert listed == [{"name": "torch", "version": base_torch[0]}]
    assert lines[4:] == [str(Path(base_torch[1]).parent)]  # exactly one torch in the image
    assert not lines[4].startswith("/opt/dlci")  # and it is not in the venv
    assert record == {"torch": base_torch[0], "cuda": None, "source": "base", "file": base_torch[1]}
    labels = json.loads(
        _docker("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout
    )
    assert labels["dlci.torch.version"] == base_torch[0]
    assert labels["dlci.torch.cuda"] == "none"
    assert labels["dlci.torch.source"] == "base"
    print(
        f"kit image on {torch_base}: built in {seconds:.0f} s with no torch wheel; "
        f"{_size_mb(image)} MB (base {_size_mb(torch_base)} MB)"
    )


def test_the_second_build_is_cached_and_says_where_torch_came_from(
    torch_base: str,
    torchless_kit: Path,
    built: tuple[str, float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    image, _ = built
    capsys.readouterr()
    argv = [*_build(torchless_kit, torch_base), "--build-arg", "PIP_OFFLINE=1"]
    assert main([*argv, "--repository", REPOSITORY]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == image
    assert "is up to date" in captured.err
    assert "torch " in captured.err and "the base image's" in captured.err
    assert "dlci.torch.source=base" in captured.err


def test_control_the_plain_base_needs_the_torch_wheel(
    torch_base: str, torchless_kit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same torch-less kit on the base without torch: no torch to be had, the build fails."""
    argv = [*_build(torchless_kit, PLAIN_BASE), "--build-arg", "PIP_OFFLINE=1"]
    assert main([*argv, "--repository", f"{REPOSITORY}-control"]) == 1
    err = capsys.readouterr().err
    assert "requirement torch" in err  # pip: no version that satisfies the requirement torch
    assert "offline route in docs/container.md" in err  # the failed build's hint
    left = _docker("images", "--quiet", f"{REPOSITORY}-control").stdout.split()
    assert left == []


def test_an_unknown_cuda_without_torch_is_a_build_error_naming_what_to_set(
    torch_base: str, torchless_kit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base with a CUDA that has no PyTorch wheel index (12.2) and no torch: the build stops
    before pip, naming the CUDA and the build arguments to set (no network needed)."""
    cuda_base = "dlci-e2e-cuda-unknown:12.2"
    made = subprocess.run(
        ["docker", "build", "--network", "none", "-t", cuda_base, "-"],
        input=f"FROM {PLAIN_BASE}\nENV CUDA_VERSION=12.2.0\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    try:
        code = main([*_build(torchless_kit, cuda_base), "--repository", f"{REPOSITORY}-cuda"])
    finally:
        _docker("rmi", cuda_base)
    err = capsys.readouterr().err
    assert code == 1
    assert "the base has CUDA 12.2.0 and no torch" in err
    assert "TORCH_INDEX_URL" in err and "TORCH_SPEC" in err


def test_on_a_venv_base_the_kit_sees_the_venv_torch(venv_base: str, torchless_kit: Path) -> None:
    """torch in a virtual environment first on PATH: the kit's venv is made from that
    environment's interpreter with a .pth to its site packages, so it imports the base's torch
    (one torch in the image, offline, no torch wheel)."""
    # the premise: a venv made from the venv's python does not see torch (issue 32's failure)
    made = _docker(
        "run", "--rm", "--network", "none", "--user", "12345:12345", venv_base, "bash", "-c",
        "python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/python -c 'import torch'",
    )  # fmt: skip
    assert made.returncode != 0 and "No module named 'torch'" in made.stderr, made.stderr
    base_torch = json.loads(_run(venv_base, f"python3 -c '{TORCH_INFO}'"))
    assert base_torch[1].startswith("/opt/venv/")
    repository = f"{REPOSITORY}-venv"
    argv = [*_build(torchless_kit, venv_base), "--build-arg", "PIP_OFFLINE=1"]
    start = time.perf_counter()
    assert main([*argv, "--repository", repository]) == 0
    seconds = time.perf_counter() - start
    image = _docker("images", "--format", "{{.Repository}}:{{.Tag}}", repository).stdout.split()
    assert len(image) == 1, image
    try:
        out = _run(
            image[0],
            f"python -c '{TORCH_INFO}' && cat /etc/dlci/torch.json && dlci --version"
            " && (find / -xdev -maxdepth 8 -type d -name torch -path '*-packages/torch'"
            " 2>/dev/null || true)",
        )
        lines = out.splitlines()
        assert json.loads(lines[0]) == base_torch  # the venv's torch, from its file
        assert json.loads(lines[1])["source"] == "base"
        assert lines[2].startswith("dlci ")
        assert lines[3:] == [str(Path(base_torch[1]).parent)]  # exactly one torch
        print(
            f"kit image on {venv_base}: built in {seconds:.0f} s with no torch wheel; "
            f"{_size_mb(image[0])} MB (base {_size_mb(venv_base)} MB)"
        )
    finally:
        _docker("rmi", image[0])
