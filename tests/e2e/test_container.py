"""The kit image, run for real by the e2e helper (``--network none``): as an arbitrary uid,
with a bind mount. The job's own ``docker run`` is tested in test_container_commands.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import dlci

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def test_dlci_runs_as_an_arbitrary_uid(kit) -> None:
    proc = kit.run("dlci", "--version")
    assert proc.stdout.strip() == f"dlci {dlci.__version__}"


def test_torch_imports_as_an_arbitrary_uid_and_matches_torch_spec(kit) -> None:
    proc = kit.run("python", "-c", "import torch; print(torch.__version__)")
    version = Version(proc.stdout.strip())
    spec = Requirement(os.environ.get("TORCH_SPEC", "torch==2.13.0")).specifier
    assert spec.contains(version, prereleases=True), (version, spec)


def test_the_image_runs_as_dlci_uid_1000_by_default(kit) -> None:
    proc = kit.run("id", "-u", user=None)
    assert proc.stdout.strip() == "1000"


def test_home_caches_and_venv_are_writable_by_an_arbitrary_uid(kit) -> None:
    # A uid in no passwd file: HOME, XDG_CACHE_HOME and MPLCONFIGDIR come from the image,
    # getpass works through USER, and pip can add a package to the venv.
    script = r"""
set -eu
id -u; id -g
touch "$HOME/probe" "$XDG_CACHE_HOME/probe" "$MPLCONFIGDIR/probe" /workspace/probe
python -c 'import getpass, matplotlib; print(getpass.getuser()); print(matplotlib.get_configdir())'
mkdir -p /tmp/pkg/e2e_probe
printf '[project]\nname = "e2e-probe"\nversion = "1"\n' > /tmp/pkg/pyproject.toml
touch /tmp/pkg/e2e_probe/__init__.py
pip install --quiet --no-index --no-build-isolation /tmp/pkg
python -c 'import e2e_probe; print(e2e_probe.__file__)'
"""
    proc = kit.run("bash", "-c", script)
    lines = proc.stdout.split()
    assert lines[:3] == ["12345", "12345", "dlci"], proc.stdout
    assert lines[3] == "/home/dlci/.config/matplotlib"
    assert lines[4].startswith("/opt/dlci/"), lines[4]
    assert "not writable" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "user", ["12345:12345", f"{os.getuid()}:{os.getgid()}"], ids=["arbitrary", "host"]
)
def test_a_file_written_into_a_bind_mount_belongs_to_the_given_uid(
    kit, tmp_path: Path, user: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    kit.run(
        "sh", "-c", "echo made in the container > /out/file.txt", user=user, volumes=[(out, "/out")]
    )
    made = out / "file.txt"
    assert made.read_text() == "made in the container\n"
    uid, gid = (int(part) for part in user.split(":"))
    assert (made.stat().st_uid, made.stat().st_gid) == (uid, gid)


def test_the_e2e_helper_runs_the_image_with_no_network(kit) -> None:
    # the helper's own containers; the job's network is the action's network input:
    # test_container_commands.py::test_the_job_s_docker_run_gives_the_network_the_input_asks_for
    proc = kit.run("python", "-c", "import socket; print([n for _, n in socket.if_nameindex()])")
    assert proc.stdout.strip() == "['lo']", proc.stdout


def test_no_container_is_left_behind(kit) -> None:
    kit.run("true")
    failed = kit.run("sh", "-c", "exit 3", check=False)
    assert failed.returncode == 3
    assert kit.leftovers() == []


def test_dockerfile_installs_torch_before_copying_the_source() -> None:
    # torch's layer must come before dl-ci's source, so that a source change keeps it cached
    text = DOCKERFILE.read_text("utf-8")
    # the torch layer: the base's torch is reused there, or "$spec" (TORCH_SPEC, or the index
    # for the base's CUDA) is installed
    torch_install = re.search(r'pip install [^\n]*"\$spec"', text)
    copy_source = text.index("COPY src/")
    assert torch_install is not None
    assert torch_install.start() < copy_source
    assert text.index("COPY docker/wheelhouse/") < torch_install.start()


def test_the_wheelhouse_is_in_git_even_when_empty() -> None:
    wheelhouse = ROOT / "docker" / "wheelhouse"
    assert (wheelhouse / ".gitkeep").is_file()
    assert "*.whl" in (wheelhouse / ".gitignore").read_text("utf-8").split()
