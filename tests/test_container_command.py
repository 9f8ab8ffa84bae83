"""``dlci container``: the docker run command line, the inputs, the build hash, cleanup.

What needs a real engine (building, running, cleanup of real containers) is in tests/e2e/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlci.action.container import ENV_ALLOWLIST, inputs_to_argv, run_command
from dlci.action.image import input_hash
from dlci.cli import main
from dlci.errors import DlciError


def command(tmp_path: Path, **overrides) -> list[str]:
    kwargs = {
        "image": "dl-ci:e2e",
        "name": "dlci-1",
        "job": "1",
        "workspace": tmp_path,
        "workdir": "examples/digits",
        "gpus": "none",
        "shm_size": "",
        "env_names": [],
        "environ": {"CI": "true", "MY_TOKEN": "hunter2", "GITHUB_SHA": "abc", "AWS_SECRET": "x"},
        "inner": ["dlci", "run", "--out", "/workspace/dlci-artifacts"],
        "uid": 1001,
        "gid": 1002,
    }
    kwargs.update(overrides)
    return run_command(**kwargs)


def test_the_run_command_line(tmp_path: Path) -> None:
    cmd = command(tmp_path)
    text = " ".join(cmd)
    assert "--user 1001:1002" in text  # no root-owned files in the workspace
    assert "--ipc=host" in text  # DataLoader workers need more than Docker's 64 MB /dev/shm
    assert f"-v {tmp_path.resolve()}:/workspace" in text
    assert "-w /workspace/examples/digits" in text
    assert "-v dlci-cache:/home/dlci/.cache" in text
    assert "--label dlci.job=1" in text
    assert "--gpus" not in cmd
    # only names from the allowlist, and values never on the command line
    passed = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-e"]
    assert "CI" in passed and "GITHUB_SHA" in passed
    assert "MY_TOKEN" not in passed and "AWS_SECRET" not in passed
    assert "hunter2" not in text
    assert set(passed) - {"DLCI_IN_CONTAINER=1"} <= set(ENV_ALLOWLIST)
    assert cmd[-4:] == ["dlci", "run", "--out", "/workspace/dlci-artifacts"]


def test_gpus_and_shm(tmp_path: Path) -> None:
    cmd = command(tmp_path, gpus="device=1", shm_size="8g")
    text = " ".join(cmd)
    assert "--gpus device=1" in text and "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in text
    assert "--shm-size 8g" in text and "--ipc=host" not in text


@pytest.mark.parametrize("workdir", ["../other", "/etc"])
def test_a_workdir_outside_the_workspace_is_refused(tmp_path: Path, workdir: str) -> None:
    with pytest.raises(DlciError, match="outside the workspace"):
        command(tmp_path, workdir=workdir)


def test_inputs_become_arguments_not_shell() -> None:
    argv = inputs_to_argv(
        {
            "DLCI_INPUT_TARGET": "pkg.m:f; rm -rf /",
            "DLCI_INPUT_PYTEST_ARGS": "-m 'not slow'",
            "DLCI_INPUT_DOCTEST": "false",
            "DLCI_INPUT_PROFILE": "true",
            "DLCI_INPUT_LADDER": "ci/ladder.yaml",
            "DLCI_INPUT_MIN_GPU_UTIL": "",
        }
    )
    assert argv == [
        "--target",
        "pkg.m:f; rm -rf /",  # one argument: the target loader will refuse it, no shell runs it
        "--pytest-args",
        "-m 'not slow'",
        "--ladder",
        "/workspace/ci/ladder.yaml",
        "--no-doctest",
    ]
    with pytest.raises(DlciError, match="input coverage: expected true or false"):
        inputs_to_argv({"DLCI_INPUT_COVERAGE": "maybe"})
    with pytest.raises(DlciError, match="outside the repository"):
        inputs_to_argv({"DLCI_INPUT_LADDER": "../../etc/ladder.yaml"})


def test_the_build_hash_follows_the_inputs(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    (tmp_path / ".dockerignore").write_text("*.log\nbuild/\n")
    first = input_hash(tmp_path / "Dockerfile", tmp_path, {})
    assert first == input_hash(tmp_path / "Dockerfile", tmp_path, {})
    (tmp_path / "debug.log").write_text("ignored")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "x").write_text("ignored")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ignored")
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {}) == first
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {"BASE_IMAGE": "x"}) != first
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert input_hash(tmp_path / "Dockerfile", tmp_path, {}) != first


def test_secret_looking_env_names_are_refused(tmp_path: Path, capsys) -> None:
    code = main(
        ["container", "run", "--image", "x", "--env", "GH_TOKEN", "--workspace", str(tmp_path)]
    )
    assert code == 1
    assert "looks like a secret" in capsys.readouterr().err


def test_a_missing_or_unknown_subcommand_is_a_malformed_command_line(capsys) -> None:
    assert main(["container", "launch"]) == 2
    assert "unknown subcommand 'launch'" in capsys.readouterr().err
    assert main(["container"]) == 2
    assert "usage: dlci container {build,run,cleanup}" in capsys.readouterr().err


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch):
    """A stand-in `docker` first on PATH that runs the given Python body."""
    import os
    import stat
    import sys

    def install(body: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        script = bin_dir / "docker"
        script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return install


def test_the_run_shows_its_command_and_passes_the_exit_code(
    tmp_path: Path, fake_docker, capsys
) -> None:
    fake_docker("sys.stderr.write('inside: ' + sys.argv[-1] + '\\n'); sys.exit(0)")
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--job", "7"]
    assert main([*args, "--", "--tests", "tests/a b.py"]) == 0
    err = capsys.readouterr().err
    assert "container: docker run --rm --init --name dlci-7 --label dlci.job=7" in err
    assert "img:1 dlci run --tests 'tests/a b.py'" in err  # quoted: the line can be pasted
    assert "inside: tests/a b.py" in err  # the container's stderr comes through
    fake_docker("sys.exit(3)")
    assert main([*args]) == 1


def test_a_container_that_cannot_start_is_explained(tmp_path: Path, fake_docker, capsys) -> None:
    fake_docker(
        "sys.stderr.write('docker: Error response from daemon: could not select device driver "
        '"" with capabilities: [[gpu]].\\n\'); sys.exit(125)'
    )
    args = ["container", "run", "--image", "img:1", "--workspace", str(tmp_path), "--gpus", "all"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "the NVIDIA container runtime is missing" in err
    assert "NVIDIA Container Toolkit" in err
