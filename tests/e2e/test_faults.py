"""Faults injected for real: the job keeps working, says what happened, and loses nothing.

Each test breaks something the way it breaks on shared GPU runners (a test that eats the
memory, a container killed mid-step, a full disk, a stopped engine, a missing NVIDIA
runtime, a hostile target string) and checks what a user sees: the verdict, the summary's
words, the reports written before the fault, no container left, no foreign file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlci.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--budget", "pr", "--hardware", "cpu", "--install", "none", "--no-doctest"]


def workspace(tmp_path: Path, tests: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    (ws / "tests").mkdir(parents=True)
    for name, text in tests.items():
        (ws / "tests" / name).write_text(text)
    return ws


def run_json(ws: Path) -> dict:
    return json.loads((ws / "dlci-artifacts" / "run.json").read_text())


def summary_of(ws: Path, tmp_path: Path) -> tuple[int, str]:
    md = tmp_path / "summary.md"
    code = main(["summary", "--artifacts", str(ws / "dlci-artifacts"), "--markdown", str(md)])
    return code, md.read_text()


def leftovers(job: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=dlci.job={job}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_a_test_that_runs_out_of_memory_is_named(kit_image: str, tmp_path: Path) -> None:
    ws = workspace(
        tmp_path,
        {
            "test_ok.py": "def test_ok():\n    assert True\n",
            "test_zz_hog.py": "def test_hog():\n    blocks = [b'x' * (64 << 20) for _ in range(64)]\n"
            "    assert blocks\n",
        },
    )
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "f-oom"]
    argv += ["--memory", "512m", "--", "--out", "/workspace/dlci-artifacts", *BASE]
    argv += ["--no-memorize", "--no-doctor", "--no-profile", "--no-coverage"]
    assert main(argv) == 1
    tests = next(s for s in run_json(ws)["steps"] if s["name"] == "tests")
    assert tests["status"] == "interrupted"
    assert "killed by signal 9" in tests["reason"] and "out of memory" in tests["reason"]
    assert tests["test"] == "tests/test_zz_hog.py::test_hog"
    code, text = summary_of(ws, tmp_path)
    assert code == 1
    assert "- step tests was interrupted (killed by signal 9 (most likely out of memory" in text
    assert "tests/test_zz_hog.py::test_hog" in text
    assert leftovers("f-oom") == []


def test_a_container_killed_mid_step(kit_image: str, tmp_path: Path) -> None:
    ws = workspace(
        tmp_path, {"test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(120)\n"}
    )
    argv = [sys.executable, "-m", "dlci", "container", "run", "--image", kit_image]
    argv += ["--workspace", str(ws), "--job", "f-kill", "--", "--out", "/workspace/dlci-artifacts"]
    argv += [*BASE, "--no-doctor", "--no-profile"]
    temp = tmp_path / "runner-temp"  # the tests run on the host's copy of the checkout there
    temp.mkdir()
    env = {**os.environ, "RUNNER_TEMP": str(temp)}
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        copies = list(temp.glob("dlci-view-*/workspace-tests"))
        if (
            copies
            and (copies[0] / "dlci-artifacts" / "run.json").exists()
            and any(
                s["name"] == "tests" and s["status"] == "running"
                for s in run_json(copies[0])["steps"]
            )
        ):
            break
        time.sleep(0.3)
    else:
        child.kill()
        pytest.fail("the tests step never started")
    subprocess.run(["docker", "kill", "dlci-f-kill"], capture_output=True, check=True)
    assert child.wait(timeout=60) == 1
    # what was written before the kill is there, and says where it stopped
    record = run_json(ws)
    assert [s["status"] for s in record["steps"]][:2] == ["skipped", "running"]
    out = tmp_path / "cleanup"
    assert (
        main(["container", "cleanup", "--job", "f-kill", "--workspace", str(ws), "--out", str(out)])
        == 0
    )
    assert leftovers("f-kill") == []
    code, text = summary_of(ws, tmp_path)
    assert code == 1
    assert "- step tests was interrupted" in text
    assert "| tests | ⛔ interrupted |" in text


def test_a_full_artifacts_disk(root: None, tmp_path: Path) -> None:
    """A full disk: a clear error, the earlier report intact, nothing half-written."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tracegen import training_trace

    trace = training_trace(steps=3, kernels=4).write(tmp_path / "t.json")
    art = tmp_path / "art"
    art.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(art)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs: {mounted.stderr.decode()}", pytrace=False)
    try:
        assert (
            main(["analyze", str(trace), "--json", str(art / "utilization.json"), "--quiet"]) == 0
        )
        before = (art / "utilization.json").read_bytes()
        (art / "filler").write_bytes(b"\0" * (256 * 1024 - len(before) - 8192))
        code = main(["analyze", str(trace), "--out", str(art), "--quiet"])
        assert code == 1
        assert (art / "utilization.json").read_bytes() == before  # the earlier report, intact
        assert [p.name for p in art.iterdir() if p.name.endswith(".tmp")] == []
    finally:
        subprocess.run(["umount", str(art)], check=False)


def test_the_engine_is_not_running(tmp_path: Path, monkeypatch, capsys) -> None:
    if shutil.which("docker") is None:
        pytest.fail("no docker client", pytrace=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    assert main(["preflight", "--budget", "pr", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "the Docker engine is not reachable" in err and "Traceback" not in err
    report = json.loads((tmp_path / "preflight.json").read_text())
    assert report["passed"] is False and "not reachable" in report["error"]["message"]


def test_a_gpu_runner_without_the_nvidia_runtime(kit_image: str, tmp_path: Path, capsys) -> None:
    # the real engine here has no NVIDIA runtime: a GPU class must be refused with the fix
    assert main(["preflight", "--hardware", "a100", "--budget", "pr", "--out", str(tmp_path)]) == 1
    assert 'could not select device driver "" with capabilities: [[gpu]]' in capsys.readouterr().err
    # and if a job asks docker for GPUs anyway, docker's own error is explained
    ws = workspace(tmp_path, {"test_ok.py": "def test_ok():\n    pass\n"})
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--gpus", "all"]
    argv += ["--job", "f-gpu", "--", "--out", "/workspace/dlci-artifacts", *BASE]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "docker run --gpus failed" in err and "NVIDIA Container Toolkit" in err
    assert leftovers("f-gpu") == []


def test_a_target_with_shell_metacharacters(kit_image: str, tmp_path: Path) -> None:
    ws = workspace(tmp_path, {"test_ok.py": "def test_ok():\n    pass\n"})
    evil = "x:y; touch /workspace/pwned; echo $(id)"
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", "f-evil"]
    argv += ["--", "--out", "/workspace/dlci-artifacts", *BASE, "--target", evil]
    argv += ["--no-doctor", "--no-profile"]
    assert main(argv) == 1
    assert not (ws / "pwned").exists()
    memorize = next(s for s in run_json(ws)["steps"] if s["name"] == "memorize")
    assert memorize["status"] == "failed"
    assert any("x:y; touch" in line for line in memorize["log_tail"])  # named, not run


def test_two_jobs_on_one_host_keep_their_gpus_and_artifacts_apart(
    kit_image: str, tmp_path: Path
) -> None:
    """Two jobs at once, each given a different GPU by the runner (NVIDIA_VISIBLE_DEVICES):
    each container sees only its own, and each job's reports stay in its own workspace."""
    probe = (
        "import os, pathlib\n\ndef test_gpu():\n"
        "    pathlib.Path('dlci-artifacts/seen.txt').write_text(os.environ.get('NVIDIA_VISIBLE_DEVICES', ''))\n"
    )
    children = []
    spaces = []
    for index in (0, 1):
        ws = workspace(tmp_path / f"job{index}", {"test_gpu.py": probe})
        spaces.append(ws)
        argv = [sys.executable, "-m", "dlci", "container", "run", "--image", kit_image]
        argv += ["--workspace", str(ws), "--job", f"f-share-{index}", "--"]
        argv += ["--out", "/workspace/dlci-artifacts", *BASE, "--no-memorize", "--no-doctor"]
        argv += ["--no-profile", "--no-coverage"]
        env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": str(index)}
        children.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err.decode()[-2000:]
    for index, ws in enumerate(spaces):
        assert (ws / "dlci-artifacts" / "seen.txt").read_text() == str(index)
        record = run_json(ws)
        assert record["cwd"] == "/workspace" and record["verdict"] == "pass"
        junit = (ws / "dlci-artifacts" / "junit.xml").read_text()
        assert 'tests="1"' in junit
        assert leftovers(f"f-share-{index}") == []


@pytest.mark.parametrize("hostile", ["train_step:os_exit0", ""])
def test_a_target_that_exits_0_in_train_step_fails_its_gate(
    kit_image: str, tmp_path: Path, monkeypatch, hostile: str
) -> None:
    """``os._exit(0)`` in the target's train_step: the memorize gate's container exits with
    the step failed and saying why, not passed on exit code 0. Control (no misbehaviour):
    the same flow passes."""
    ws = workspace(tmp_path, {"test_ok.py": "def test_ok():\n    pass\n"})
    shutil.copyfile(ROOT / "tests" / "hostile_targets.py", ws / "hostile_targets.py")
    monkeypatch.setenv("DLCI_HOSTILE", hostile)
    job = "f-exit0" if hostile else "f-exit0-control"
    argv = ["container", "run", "--image", kit_image, "--workspace", str(ws), "--job", job]
    argv += ["--env", "DLCI_HOSTILE", "--", "--out", "/workspace/dlci-artifacts", *BASE]
    argv += ["--target", "hostile_targets:make_target", "--no-doctor", "--no-profile"]
    argv += ["--no-coverage"]
    assert main(argv) == (1 if hostile else 0)
    memorize = next(s for s in run_json(ws)["steps"] if s["name"] == "memorize")
    assert leftovers(job) == []
    if not hostile:
        assert memorize["status"] == "passed" and memorize["container_exit_code"] == 0
        assert (
            json.loads((ws / "dlci-artifacts" / "memorization.json").read_text())["verdict"]
            == "pass"
        )
        return
    assert memorize["status"] == "failed" and memorize["exit_code"] == 0
    assert memorize["reason"].startswith(
        "the target exited before a verdict: memorize exited 0 with a partial "
        "memorization.json (exited): the run ended before a verdict"
    )
    report = json.loads((ws / "dlci-artifacts" / "memorization.json").read_text())
    assert report["verdict"] == "fail" and report["stopped_by"] == "exited"
    code, text = summary_of(ws, tmp_path)
    assert code == 1
    assert "- step memorize failed (the target exited before a verdict: memorize exited 0" in text
