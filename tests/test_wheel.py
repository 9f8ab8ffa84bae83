"""The package as a user installs it: the wheel, built from the repository and installed (not
editable) into a new virtual environment, runs `dlci --help`, `dlci tier` and `dlci memorize`
on the bundled digits example.

Nothing is downloaded: the wheel is built with this environment's setuptools
(``--no-build-isolation --no-index``) and installed with ``--no-deps``; the new environment
reads the dependencies (torch, numpy, ...) from this one's site-packages through a ``.pth``
line, which adds the folder without running that folder's own ``.pth`` files, so the
repository's editable install cannot stand in for the wheel (the test checks where ``dlci``
and the ladder were imported from).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a wheel without its package data would lack: the ladder, the schemas, the report's page
PACKAGE_DATA = (
    "dlci/data/ladder.yaml",
    "dlci/data/ladder.schema.json",
    "dlci/data/ladder-extends.schema.json",
    "dlci/data/config.schema.json",
    "dlci/report/templates/report.html.j2",
    "dlci/py.typed",
)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_installs_into_a_new_environment_and_runs_the_digits_example(
    tmp_path: Path,
) -> None:
    # a copy of what the build reads, so the build's own folders never land in the checkout
    source = tmp_path / "source"
    source.mkdir()
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DLCI_", "COV"))}
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "--no-index", "--quiet", "--wheel-dir", str(dist)],
        tmp_path, env,
    )  # fmt: skip
    (wheel,) = dist.glob("dl_ci-*-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [n for n in PACKAGE_DATA if n not in names] == []
    assert "dlci/cli.py" in names
    assert not [n for n in names if n.startswith(("tests/", "examples/"))]

    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(fresh)  # pip from ensurepip: offline
    python = fresh / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    # the new environment's own pip, before it can see this one: a pip that sees an installed
    # dl-ci (this environment's, editable) would uninstall it first
    _run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
        tmp_path, env,
    )  # fmt: skip
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", "utf-8")
    dlci = fresh / "bin" / "dlci"
    assert dlci.exists()

    where = _run(
        [str(python), "-c", "import dlci, dlci.ladder.versions as v; print(dlci.__file__)"],
        tmp_path, env,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(fresh), where  # the wheel's copy, not the checkout's

    assert "memorize" in _run([str(dlci), "--help"], tmp_path, env).stdout
    digits = tmp_path / "digits"
    shutil.copytree(
        ROOT / "examples" / "digits", digits,
        ignore=shutil.ignore_patterns("__pycache__", "dlci-artifacts", "*.egg-info"),
    )  # fmt: skip
    tier = _run([str(dlci), "tier", "--budget", "pr", "--hardware", "cpu"], digits, env).stdout
    assert "pr" in tier and "cpu" in tier, tier
    memorize = _run([str(dlci), "memorize", "--budget", "pr", "--hardware", "cpu"], digits, env)
    assert (digits / "dlci-artifacts" / "memorization.json").is_file(), memorize.stdout
    assert (digits / "dlci-artifacts" / "report.html").is_file()
