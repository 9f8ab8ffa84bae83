"""``dlci container build / run / cleanup`` and ``dlci preflight`` against the real Docker engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from dlci.action.cleanup import foreign_files
from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# The build arguments scripts/e2e_setup.sh builds the kit image with: same inputs, same layers.
E2E_BUILD = [
    "--base-image",
    "dlci-e2e-base:bookworm",
    "--build-arg",
    "PIP_OFFLINE=1",
    "--build-arg",
    "TORCH_SPEC=torch==2.13.0",
    "--build-arg",
    "EXTRA_PIP=scikit-learn",
]


def test_preflight_sees_the_real_engine(docker_engine: str, tmp_path: Path) -> None:
    assert main(["preflight", "--budget", "pr", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["docker"]["server_version"]
    assert "runc" in report["docker"]["runtimes"]
    assert report["gpu"] is False  # no GPU here: the CPU path, allowed by the PR budget


def test_build_by_input_hash_then_cached(kit_image: str, tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "out"
    start = time.perf_counter()
    assert main(["container", "build", "--kit", str(ROOT), *E2E_BUILD]) == 0
    first = time.perf_counter() - start
    tag = capsys.readouterr().out.strip().splitlines()[-1]
    assert tag.startswith("dlci-local:")
    start = time.perf_counter()
    assert main(["container", "build", "--kit", str(ROOT), *E2E_BUILD]) == 0
    second = time.perf_counter() - start
    captured = capsys.readouterr()
    assert captured.out.strip() == tag
    assert "is up to date" in captured.err
    print(f"kit image by input hash: first {first:.1f} s (layers cached), then {second:.2f} s")
    del out_file
    subprocess.run(["docker", "rmi", tag], capture_output=True, check=False)


def test_a_prebuilt_image_that_does_not_exist(docker_engine: str, capsys) -> None:
    assert main(["container", "build", "--image", "dlci-e2e-missing:0"]) == 1
    err = capsys.readouterr().err
    assert "dlci-e2e-missing:0" in err and "Traceback" not in err


def test_run_in_the_container_and_cleanup(kit_image: str, tmp_path: Path, capsys) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(ROOT / "examples" / "digits", ws / "project")
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-memorize", "--no-doctor", "--no-profile", "--no-doctest"]
    inner += ["--pytest-args", "-k 'not memoriz and not doctor'"]
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws)]
    argv += ["--workdir", "project", "--job", "e2e-run", "--", *inner]
    assert main(argv) == 0
    record = json.loads((ws / "dlci-artifacts" / "run.json").read_text())
    assert record["verdict"] == "pass"
    assert record["cwd"] == "/workspace/project"

    # a container left running by a killed job: cleanup removes it by its label
    subprocess.run(
        ["docker", "run", "-d", "--label", "dlci.job=e2e-stale", kit_image, "sleep", "300"],
        capture_output=True,
        check=True,
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "container",
                "cleanup",
                "--job",
                "e2e-stale",
                "--workspace",
                str(ws),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads((out / "cleanup.json").read_text())
    assert report["containers_removed"] == 1
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=dlci.job=e2e-stale"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert left.stdout.strip() == ""


def test_a_failing_job_in_the_container_is_exit_1(kit_image: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "tests" / "test_bad.py").write_text("def test_bad():\n    assert False\n")
    inner = ["--out", "/workspace/dlci-artifacts", "--budget", "pr", "--hardware", "cpu"]
    inner += ["--install", "none", "--no-memorize", "--no-doctor", "--no-profile"]
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "e2e-bad"]
    assert main([*argv, "--", *inner]) == 1
    record = json.loads((ws / "dlci-artifacts" / "run.json").read_text())
    assert record["failed_steps"] == ["tests"]


def test_foreign_files_are_found_and_given_back(root: None, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ok.txt").write_text("x")
    (tmp_path / "root.txt").write_text("x")
    os.chown(tmp_path / "root.txt", 4321, 4321)
    assert foreign_files(tmp_path, 0) == [str(tmp_path / "root.txt")]
    monkeypatch.setenv("DLCI_JOB_ID", "")
    assert (
        main(["container", "cleanup", "--workspace", str(tmp_path), "--out", str(tmp_path / "o")])
        == 0
    )
    assert (tmp_path / "root.txt").stat().st_uid == 0
    assert foreign_files(tmp_path, 0) == []
